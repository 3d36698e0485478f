//! `oxgen run [MODEL]`: a chat REPL. On a terminal: line editing, a history file, multi-line
//! input (end a line with `\`, or wrap a block in `"""`), slash commands, Ctrl-C to stop a
//! reply (twice to quit) and a stats line after each reply. With piped stdin: one user turn
//! per line, replies on stdout, nothing else.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use oxgen::{Cancel, Chat, GenerateOptions, Model, Output};
use rustyline::error::ReadlineError;

use crate::options::{BackendArgs, RunArgs, SampleArgs, model_dir, open_model, set_param};
use crate::profile;

#[derive(clap::Args)]
pub struct Args {
    /// A package folder; the default model when absent.
    model: Option<String>,
    /// The system prompt.
    #[arg(long, env = "OXGEN_SYSTEM")]
    system: Option<String>,
    /// Where to keep the input history (default: $XDG_STATE_HOME/oxgen/history, else
    /// ~/.local/state/oxgen/history).
    #[arg(long, env = "OXGEN_HISTORY")]
    history: Option<PathBuf>,
    #[command(flatten)]
    run: RunArgs,
    #[command(flatten)]
    backend: BackendArgs,
    #[command(flatten)]
    sample: SampleArgs,
}

const HELP: &str = "\
/help                 this list
/exit                 quit (also Ctrl-D)
/reset                forget the conversation
/system TEXT          set the system prompt (empty: none)
/set PARAM VALUE      temperature, top_k, top_p, min_p, repetition_penalty,
                      frequency_penalty, presence_penalty, seed, greedy on|off, max_new_tokens,
                      json on|off (answers are JSON objects)
/stats                figures of the last reply
/save NAME            save the conversation with its KV (NAME: a name kept in
                      $XDG_STATE_HOME/oxgen/sessions, or a path)
/load NAME            resume a saved conversation without prefilling it again
End a line with \\ to continue it; wrap a block in \"\"\" to type several lines.
Ctrl-C stops a reply; a second Ctrl-C quits.";

fn history_path(args: &Args) -> Option<PathBuf> {
    if let Some(p) = &args.history {
        return Some(p.clone());
    }
    Some(state_dir()?.join("history"))
}

/// oxgen's state folder: $XDG_STATE_HOME/oxgen, else ~/.local/state/oxgen.
fn state_dir() -> Option<PathBuf> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
    Some(state.join("oxgen"))
}

/// Where `/save NAME` writes: NAME itself when it names a path (it has a `/` or ends in
/// `.session`), else `NAME.session` in the state folder's `sessions`.
fn session_path(name: &str) -> anyhow::Result<PathBuf> {
    if name.is_empty() {
        anyhow::bail!("give the session a name: /save NAME, /load NAME");
    }
    if name.contains('/') || name.ends_with(".session") {
        return Ok(PathBuf::from(name));
    }
    let dir = state_dir()
        .context("no $XDG_STATE_HOME or $HOME to keep sessions in; give a path")?
        .join("sessions");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir.join(format!("{name}.session")))
}

/// The REPL's state between turns.
struct Session {
    model: Model,
    chat: Chat,
    /// The flags, as `/set` has changed them.
    sample: SampleArgs,
    /// Seeds every reply's draw unless a seed is set.
    seed: u64,
    options: GenerateOptions,
    last: Option<Output>,
}

enum Flow {
    Continue,
    Exit,
}

impl Session {
    /// Runs a slash command; prints its result to stderr.
    fn command(&mut self, line: &str) -> Flow {
        let (cmd, rest) = line.split_once(' ').unwrap_or((line, ""));
        let rest = rest.trim();
        match cmd {
            "/exit" | "/quit" | "/bye" => return Flow::Exit,
            "/help" => eprintln!("{HELP}"),
            "/reset" => {
                self.chat.clear();
                self.model.reset();
                eprintln!("conversation cleared");
            }
            "/system" => {
                self.chat
                    .set_system(if rest.is_empty() { None } else { Some(rest) });
                eprintln!("system prompt set");
            }
            "/set" => {
                let (name, value) = rest.split_once(' ').unwrap_or((rest, ""));
                let mut sample = self.sample.clone();
                let set = set_param(&mut sample, name, value.trim()).and_then(|()| {
                    (sample.options(&self.model, self.seed)).map_err(|e| e.to_string())
                });
                match set {
                    Ok(mut options) => {
                        options.adapter = self.options.adapter.take();
                        (self.sample, self.options) = (sample, options);
                        eprintln!("{name} = {}", value.trim());
                    }
                    Err(e) => eprintln!("/set {name}: {e}"),
                }
            }
            "/stats" => match &self.last {
                Some(out) => {
                    eprintln!("{}", profile::summary(out));
                    if let Some(p) = self.model.kv_positions() {
                        eprintln!(
                            "KV cache {} ({p} positions)",
                            crate::options::mib(self.model.kv_bytes(p) as u64)
                        );
                    }
                }
                None => eprintln!("no reply yet"),
            },
            "/save" => {
                let saved = session_path(rest).and_then(|path| {
                    let positions = self.chat.save(&mut self.model, &path)?;
                    Ok((path, positions))
                });
                match saved {
                    Ok((path, 0)) => eprintln!(
                        "saved to {} (the messages alone: this model's KV cannot be saved)",
                        path.display()
                    ),
                    Ok((path, n)) => {
                        eprintln!("saved to {} with {n} positions of KV", path.display())
                    }
                    Err(e) => eprintln!("/save: {e:#}"),
                }
            }
            "/load" => {
                let loaded =
                    session_path(rest).and_then(|path| Ok(Chat::load(&mut self.model, &path)?));
                match loaded {
                    Ok(resumed) => {
                        self.chat = resumed.chat;
                        let turns = self.chat.messages().len();
                        match (resumed.kv_positions, resumed.note) {
                            (n, None) => eprintln!(
                                "resumed {turns} messages with {n} positions of KV (no prefill)"
                            ),
                            (_, Some(note)) => eprintln!("resumed {turns} messages; {note}"),
                        }
                    }
                    Err(e) => eprintln!("/load: {e:#}"),
                }
            }
            _ => eprintln!("unknown command {cmd}; /help lists them"),
        }
        Flow::Continue
    }

    /// Sends a user turn and streams the reply to stdout.
    fn turn(&mut self, text: &str, cancel: &Cancel, stats: bool) -> anyhow::Result<()> {
        cancel.reset();
        self.options.cancel = Some(cancel.clone());
        let mut stdout = std::io::stdout().lock();
        let out = self
            .chat
            .send(&mut self.model, text, &self.options, |piece| {
                // A closed stdout ends the reply at the next token via the error below.
                let _ = stdout
                    .write_all(piece.as_bytes())
                    .and_then(|()| stdout.flush());
            });
        writeln!(stdout).context("writing to stdout")?;
        let out = out?;
        if stats {
            eprintln!("\x1b[2m{}\x1b[0m", profile::summary(&out));
        }
        self.last = Some(out);
        Ok(())
    }
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let dir = model_dir(args.model.as_deref())?;
    let model = open_model(&dir, &args.run, &args.backend, Some(oxgen::CHAT_CTX_SIZE))?;
    let seed = oxgen::fresh_seed();
    let mut options = args.sample.options(&model, seed)?;
    options.adapter = args.run.adapter();
    let mut session = Session {
        model,
        chat: Chat::new(args.system.as_deref()),
        sample: args.sample.clone(),
        seed,
        options,
        last: None,
    };
    // Ctrl-C while a reply is generated stops it; a second one during the same reply quits.
    // (At the prompt the line editor sees Ctrl-C as a key, not a signal.)
    let cancel = Cancel::new();
    let generating = Arc::new(AtomicBool::new(false));
    {
        let (cancel, generating) = (cancel.clone(), generating.clone());
        ctrlc::set_handler(move || {
            if !generating.load(Ordering::Relaxed) || cancel.is_cancelled() {
                std::process::exit(130);
            }
            cancel.cancel();
        })
        .context("installing the Ctrl-C handler")?;
    }
    let turn = |session: &mut Session, text: &str, stats: bool| {
        generating.store(true, Ordering::Relaxed);
        let result = session.turn(text, &cancel, stats);
        generating.store(false, Ordering::Relaxed);
        result
    };
    if !std::io::stdin().is_terminal() {
        for line in std::io::stdin().lock().lines() {
            let line = line.context("reading stdin")?;
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            if line.starts_with('/') {
                if let Flow::Exit = session.command(line) {
                    break;
                }
                continue;
            }
            turn(&mut session, line, false)?;
        }
        return Ok(());
    }

    let mut editor = rustyline::DefaultEditor::new().context("starting the line editor")?;
    let history = history_path(args);
    if let Some(h) = &history {
        // A missing history file is the first run.
        let _ = editor.load_history(h);
    }
    eprintln!(
        "chatting with {} — /help for commands, Ctrl-D to quit",
        dir.display()
    );
    let mut interrupted = false;
    loop {
        let line = match read_message(&mut editor) {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => {
                if interrupted || cancel.is_cancelled() {
                    break;
                }
                interrupted = true;
                eprintln!("(Ctrl-C again or /exit to quit)");
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e).context("reading input"),
        };
        interrupted = false;
        cancel.reset();
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        let _ = editor.add_history_entry(text);
        if text.starts_with('/') {
            if let Flow::Exit = session.command(text) {
                break;
            }
            continue;
        }
        if let Err(e) = turn(&mut session, text, std::io::stderr().is_terminal()) {
            eprintln!("error: {e:#}");
        }
    }
    if let Some(h) = &history {
        if let Some(parent) = h.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        if let Err(e) = editor.save_history(h) {
            eprintln!("note: could not save the history to {}: {e}", h.display());
        }
    }
    Ok(())
}

/// One message: a line, lines joined while they end in `\`, or a `"""` block.
fn read_message(editor: &mut rustyline::DefaultEditor) -> Result<String, ReadlineError> {
    let first = editor.readline(">>> ")?;
    if first.trim_start().starts_with("\"\"\"") {
        let mut text = first.trim_start()[3..].to_string();
        loop {
            let line = editor.readline("... ")?;
            if let Some(end) = line.find("\"\"\"") {
                text.push('\n');
                text.push_str(&line[..end]);
                return Ok(text.trim_start_matches('\n').to_string());
            }
            text.push('\n');
            text.push_str(&line);
        }
    }
    let mut text = first;
    while text.ends_with('\\') {
        text.pop();
        text.push('\n');
        text.push_str(&editor.readline("... ")?);
    }
    Ok(text)
}
