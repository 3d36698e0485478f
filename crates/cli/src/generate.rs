//! `oxgen generate [MODEL] PROMPT`: one generation, streamed to stdout or printed as JSON.

use std::io::{IsTerminal, Read, Write};

use anyhow::Context;
use oxgen::{Output, Prompt};
use serde_json::json;

use crate::options::{BackendArgs, RunArgs, SampleArgs, model_dir, open_model};
use crate::profile;

#[derive(clap::Args)]
pub struct Args {
    /// `[MODEL] PROMPT`: a package folder (onnxruntime-genai or optimum layout), then the user
    /// message (rendered with the package's chat template unless --raw); `-` reads it from
    /// stdin. Without MODEL the default model is used, pulled first if needed.
    #[arg(required = true, num_args = 1..=2, value_names = ["MODEL", "PROMPT"])]
    args: Vec<String>,
    /// Send the prompt as is, without the chat template.
    #[arg(long, env = "OXGEN_RAW", conflicts_with = "system")]
    raw: bool,
    /// A system message before the prompt.
    #[arg(long, env = "OXGEN_SYSTEM")]
    system: Option<String>,
    /// Print text as it is generated (the default unless --json).
    #[arg(long, overrides_with = "no_stream")]
    stream: bool,
    /// Print the text once generation ends.
    #[arg(long, env = "OXGEN_NO_STREAM")]
    no_stream: bool,
    /// Print one JSON object: text, ids, token counts, finish reason, timings.
    #[arg(long, env = "OXGEN_JSON")]
    json: bool,
    /// After generating, print load time, TTFT, throughput, latency percentiles, peak RSS,
    /// KV bytes and time per op type to stderr.
    #[arg(long, env = "OXGEN_PROFILE")]
    profile: bool,
    #[command(flatten)]
    run: RunArgs,
    #[command(flatten)]
    backend: BackendArgs,
    #[command(flatten)]
    sample: SampleArgs,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let (model, prompt) = match args.args.as_slice() {
        [model, prompt] => (Some(model.as_str()), prompt.clone()),
        [prompt] => (None, prompt.clone()),
        _ => unreachable!("clap takes one or two positional arguments"),
    };
    let prompt = if prompt == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the prompt from stdin")?;
        text
    } else {
        prompt
    };
    let dir = model_dir(model)?;
    let mut model = open_model(&dir, &args.run, &args.backend, None)?;
    model.set_profiling(args.profile);
    let prompt = if args.raw {
        Prompt::Text(prompt)
    } else {
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(("system", system.as_str()));
        }
        messages.push(("user", prompt.as_str()));
        Prompt::chat(&messages)
    };
    let mut options = args.sample.options(&model, oxgen::fresh_seed())?;
    options.adapter = args.run.adapter();
    let stream = !args.json && !args.no_stream;
    let mut stdout = std::io::stdout().lock();
    let mut write_error = None;
    let out = model.generate(&prompt, &options, |piece| {
        if stream
            && write_error.is_none()
            && let Err(e) = stdout
                .write_all(piece.as_bytes())
                .and_then(|()| stdout.flush())
        {
            write_error = Some(e);
        }
    })?;
    if let Some(e) = write_error {
        return Err(e).context("writing to stdout");
    }
    let load_ms = model.load_time().as_secs_f64() * 1e3;
    if args.json {
        writeln!(stdout, "{}", json_output(&out, load_ms))?;
    } else {
        if !stream {
            stdout.write_all(out.text.as_bytes())?;
        }
        writeln!(stdout)?;
    }
    if args.profile {
        profile::print(&model, std::slice::from_ref(&out));
    } else if std::io::stderr().is_terminal() {
        eprintln!("{}", profile::summary(&out));
    }
    Ok(())
}

fn json_output(out: &Output, load_ms: f64) -> serde_json::Value {
    let t = &out.timings;
    let spec = out.usage.speculation;
    json!({
        "speculation": {
            "proposed": spec.proposed,
            "accepted": spec.accepted,
            "tokens_per_step": profile::tokens_per_step(out),
        },
        "text": out.text,
        "token_ids": out.tokens,
        "prompt_tokens": out.usage.prompt_tokens,
        "completion_tokens": out.usage.completion_tokens,
        "finish_reason": out.finish_reason.as_str(),
        "timings": {
            "load_ms": load_ms,
            "ttft_ms": t.ttft.as_secs_f64() * 1e3,
            "prefill_tok_s": t.prefill_tok_s,
            "decode_tok_s": t.decode_tok_s,
        },
    })
}
