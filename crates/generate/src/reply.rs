//! A model's reply taken apart as it streams: reasoning (Qwen3's `<think>...</think>`, gpt-oss's
//! analysis channel), content, and tool calls in the family's [`ToolFormat`].
//!
//! [`ReplyParser::push`] takes text pieces in the order they are generated and yields
//! [`ReplyDelta`]s: text is released as soon as it cannot be the start of a marker; a call is
//! announced (index, id, name) as soon as its name is read, and its arguments follow as they
//! arrive, so a streaming client sees them grow. A whole reply is the sum of its deltas
//! ([`Reply::apply`]), so a streamed and a collected response say the same thing.
//!
//! A call whose text does not parse is given back as content, unless part of it was already
//! announced; a reply cut short (max tokens) ends with what was read.

use serde_json::Value;

use crate::tools::{ToolCall, ToolFormat};

/// A piece of a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyDelta {
    Content(String),
    Reasoning(String),
    /// Call `index` of this reply begins.
    CallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// More of call `index`'s arguments (JSON text).
    CallArguments {
        index: usize,
        text: String,
    },
}

/// A whole reply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reply {
    pub content: String,
    pub reasoning: String,
    pub calls: Vec<ToolCall>,
}

impl Reply {
    /// A whole reply's text taken apart as `syntax` says (call ids seeded by `seed`).
    pub fn parse(syntax: ReplySyntax, text: &str, seed: u64) -> Reply {
        let mut parser = ReplyParser::new(syntax, seed);
        let mut deltas = Vec::new();
        parser.push(text, &mut deltas);
        parser.finish(&mut deltas);
        let mut reply = Reply::default();
        deltas.iter().for_each(|d| reply.apply(d));
        reply
    }

    pub fn apply(&mut self, delta: &ReplyDelta) {
        match delta {
            ReplyDelta::Content(t) => self.content.push_str(t),
            ReplyDelta::Reasoning(t) => self.reasoning.push_str(t),
            ReplyDelta::CallStart { id, name, .. } => self.calls.push(ToolCall {
                id: id.clone(),
                name: name.clone(),
                arguments: String::new(),
            }),
            ReplyDelta::CallArguments { index, text } => {
                if let Some(c) = self.calls.get_mut(*index) {
                    c.arguments.push_str(text);
                }
            }
        }
    }
}

/// What a reply may hold besides content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReplySyntax {
    /// Calls in this format are parsed out.
    pub tools: Option<ToolFormat>,
    /// The template thinks in `<think>...</think>`, and the prompt did not close the block.
    pub think: bool,
    /// The prompt already opened `<think>`: the reply starts inside it.
    pub think_open: bool,
    /// The reply is in gpt-oss's harmony channels.
    pub harmony: bool,
}

impl ReplySyntax {
    /// What a chat template's text implies; `prompt` is the rendered prompt.
    pub fn of_template(template: &str, prompt: &str, tools: Option<ToolFormat>) -> ReplySyntax {
        let harmony = template.contains("<|channel|>");
        // A prompt that closed the block (thinking turned off: Qwen3's `enable_thinking:
        // false`, Nemotron's `/no_think`) leaves the reply nothing to reason in.
        let closed = prompt.trim_end().ends_with("</think>");
        let think = !harmony && template.contains("</think>") && !closed;
        ReplySyntax {
            tools: tools.filter(|&f| f != ToolFormat::Harmony),
            think,
            think_open: think && prompt.trim_end().ends_with("<think>"),
            harmony,
        }
    }

    /// Whether a parser is needed at all (else the reply is all content).
    pub fn is_plain(&self) -> bool {
        self.tools.is_none() && !self.think && !self.harmony
    }
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

/// The length of `text` that can be released: all but a tail that may begin one of
/// `markers`. The tail is ASCII (markers are), so the cut is on a character boundary.
fn releasable(text: &str, markers: &[&str]) -> usize {
    let mut keep = text.len();
    for m in markers {
        for start in (text.len().saturating_sub(m.len() - 1)..text.len()).rev() {
            if text.is_char_boundary(start) && m.starts_with(&text[start..]) {
                keep = keep.min(start);
            }
        }
    }
    keep
}

/// The first of `markers` in `text`: (position, marker).
fn find_first<'m>(text: &str, markers: &[&'m str]) -> Option<(usize, &'m str)> {
    markers
        .iter()
        .filter_map(|m| text.find(m).map(|p| (p, *m)))
        .min_by_key(|&(p, m)| (p, std::cmp::Reverse(m.len())))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Think {
    Off,
    /// Not yet known whether the reply opens with `<think>`.
    Undecided,
    Inside,
    /// Past `</think>`: leading blank lines of the answer are dropped.
    Closed,
    After,
}

/// The state of a tool-call section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Calls {
    /// Free text.
    Text,
    /// Inside a call section, between calls.
    Between,
    /// At the `{` of a call object.
    Object,
    /// Streaming the arguments of call `.0`.
    Arguments(usize, JsonScan),
    /// After a call's arguments, before the object's `}`.
    CloseObject,
    /// After a call section: blanks, then another section or text.
    Gap,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Channel {
    /// Before `<|message|>`: the header of a harmony message.
    Header,
    Reasoning,
    Content,
    Call(usize),
}

/// Takes a reply apart as it streams (see the module docs).
#[derive(Debug, Clone)]
pub struct ReplyParser {
    syntax: ReplySyntax,
    think: Think,
    calls: Calls,
    channel: Channel,
    /// Text received but not yet decided.
    buf: String,
    /// Calls announced so far.
    count: usize,
    /// Any content released yet (a bare JSON call must open the reply).
    started: bool,
    /// Seeds call ids.
    seed: u64,
}

impl ReplyParser {
    /// `seed` makes the call ids (give each reply its own).
    pub fn new(syntax: ReplySyntax, seed: u64) -> ReplyParser {
        let think = match (syntax.think, syntax.think_open) {
            (false, _) => Think::Off,
            (true, false) => Think::Undecided,
            (true, true) => Think::Inside,
        };
        ReplyParser {
            syntax,
            think,
            calls: Calls::Text,
            channel: Channel::Header,
            buf: String::new(),
            count: 0,
            started: false,
            seed,
        }
    }

    /// Calls announced so far.
    pub fn calls(&self) -> usize {
        self.count
    }

    /// Whether the text parsed so far left the reply inside its reasoning (a `<think>`
    /// block, or harmony's analysis channel).
    pub fn in_reasoning(&self) -> bool {
        self.think == Think::Inside || (self.syntax.harmony && self.channel == Channel::Reasoning)
    }

    /// Parses `text`, appending what it releases to `out`.
    pub fn push(&mut self, text: &str, out: &mut Vec<ReplyDelta>) {
        self.buf.push_str(text);
        self.advance(false, out);
    }

    /// The reply ended: releases everything held.
    pub fn finish(&mut self, out: &mut Vec<ReplyDelta>) {
        self.advance(true, out);
        let rest = std::mem::take(&mut self.buf);
        if rest.is_empty() {
            return;
        }
        out.push(match (self.calls, self.channel) {
            (Calls::Arguments(index, _), _) => ReplyDelta::CallArguments { index, text: rest },
            (_, Channel::Call(index)) if self.syntax.harmony => {
                ReplyDelta::CallArguments { index, text: rest }
            }
            (_, Channel::Reasoning) if self.syntax.harmony => ReplyDelta::Reasoning(rest),
            _ if self.think == Think::Inside => ReplyDelta::Reasoning(rest),
            _ => return self.content(rest, out),
        });
    }

    fn content(&mut self, text: String, out: &mut Vec<ReplyDelta>) {
        if text.is_empty() {
            return;
        }
        self.started = true;
        out.push(ReplyDelta::Content(text));
    }

    fn take(&mut self, n: usize) -> String {
        self.buf.drain(..n).collect()
    }

    fn start_call(&mut self, name: String, out: &mut Vec<ReplyDelta>) -> usize {
        let index = self.count;
        self.count += 1;
        self.seed = self.seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let format = self.syntax.tools.unwrap_or(ToolFormat::Harmony);
        out.push(ReplyDelta::CallStart {
            index,
            id: format.call_id(self.seed),
            name,
        });
        index
    }

    fn advance(&mut self, end: bool, out: &mut Vec<ReplyDelta>) {
        loop {
            let progressed = if self.syntax.harmony {
                self.harmony(end, out)
            } else if !matches!(self.think, Think::Off | Think::After) {
                self.thinking(end, out)
            } else if let Some(format) = self.syntax.tools {
                self.tool_calls(format, end, out)
            } else {
                let text = std::mem::take(&mut self.buf);
                self.content(text, out);
                false
            };
            if !progressed {
                return;
            }
        }
    }

    /// The `<think>` stage; true when the state moved on.
    fn thinking(&mut self, end: bool, out: &mut Vec<ReplyDelta>) -> bool {
        match self.think {
            Think::Undecided => {
                let t = self.buf.trim_start();
                if t.starts_with(THINK_OPEN) {
                    let skip = self.buf.len() - t.len() + THINK_OPEN.len();
                    self.take(skip);
                    self.think = Think::Inside;
                } else if !end && THINK_OPEN.starts_with(t) {
                    return false;
                } else {
                    self.think = Think::After;
                }
                true
            }
            Think::Inside => match self.buf.find(THINK_CLOSE) {
                Some(p) => {
                    let text = self.take(p);
                    self.take(THINK_CLOSE.len());
                    if !text.is_empty() {
                        out.push(ReplyDelta::Reasoning(text));
                    }
                    self.think = Think::Closed;
                    true
                }
                None => {
                    let n = releasable(&self.buf, &[THINK_CLOSE]);
                    if n > 0 {
                        let text = self.take(n);
                        out.push(ReplyDelta::Reasoning(text));
                    }
                    false
                }
            },
            Think::Closed => {
                let t = self.buf.trim_start();
                if t.is_empty() && !end {
                    return false;
                }
                let skip = self.buf.len() - t.len();
                self.take(skip);
                self.think = Think::After;
                true
            }
            Think::Off | Think::After => false,
        }
    }

    /// One move of the tool-call scanner; true when it made progress.
    fn tool_calls(&mut self, format: ToolFormat, end: bool, out: &mut Vec<ReplyDelta>) -> bool {
        let (opens, close): (&[&str], Option<&str>) = match format {
            ToolFormat::Hermes | ToolFormat::Json => (&["<tool_call>"], Some("</tool_call>")),
            ToolFormat::Phi4Mini => (&["<|tool_call|>", "functools["], Some("<|/tool_call|>")),
            ToolFormat::Nemotron => (&["<TOOLCALL>"], Some("</TOOLCALL>")),
            ToolFormat::Mistral => (&["[TOOL_CALLS]"], None),
            ToolFormat::Llama3 | ToolFormat::Harmony => (&["<|python_tag|>"], None),
        };
        // A bare JSON call opens the reply (Llama 3's form; the json format takes it too).
        let bare = matches!(format, ToolFormat::Llama3 | ToolFormat::Json) && !self.started;
        match self.calls {
            Calls::Text => {
                if bare {
                    let t = self.buf.trim_start();
                    if t.starts_with('{') {
                        let skip = self.buf.len() - t.len();
                        self.take(skip);
                        self.calls = Calls::Object;
                        return true;
                    }
                    if t.is_empty() && !end {
                        return false;
                    }
                }
                // Blanks are held until text follows: before a call they are dropped.
                if let Some((p, m)) = find_first(&self.buf, opens) {
                    let text = self.take(p);
                    self.content(text.trim_end().to_string(), out);
                    self.take(m.len());
                    self.calls = Calls::Between;
                    return true;
                }
                let n = match end {
                    true if self.count > 0 => self.buf.trim_end().len(),
                    true => self.buf.len(),
                    false => self.buf[..releasable(&self.buf, opens)].trim_end().len(),
                };
                let text = self.take(n);
                self.content(text, out);
                if end {
                    self.buf.clear();
                }
                false
            }
            Calls::Between => {
                let skip = self.buf.len()
                    - self
                        .buf
                        .trim_start_matches(|c: char| c.is_whitespace() || "[],;".contains(c))
                        .len();
                self.take(skip);
                if self.buf.starts_with('{') {
                    self.calls = Calls::Object;
                    return true;
                }
                if let Some(c) = close {
                    if self.buf.starts_with(c) {
                        self.take(c.len());
                        self.calls = Calls::Gap;
                        return true;
                    }
                    if !end && c.starts_with(self.buf.as_str()) {
                        return false;
                    }
                } else if self.buf.is_empty() && !end {
                    return false;
                }
                if self.buf.is_empty() {
                    return false;
                }
                // Not a call: the rest is text.
                self.calls = Calls::Text;
                self.started = true;
                true
            }
            Calls::Object => match call_header(&self.buf) {
                Header::Named { name, len } => {
                    self.take(len);
                    let index = self.start_call(name, out);
                    self.calls = Calls::Arguments(index, JsonScan::default());
                    true
                }
                Header::Incomplete if !end => false,
                Header::Other | Header::Incomplete => {
                    // Another key order: wait for the whole object.
                    let Some(n) = JsonScan::default().value_end(&self.buf) else {
                        if end {
                            let text = std::mem::take(&mut self.buf);
                            self.content(text, out);
                        }
                        return false;
                    };
                    match whole_call(&self.buf[..n]) {
                        Some((name, arguments)) => {
                            self.take(n);
                            let index = self.start_call(name, out);
                            out.push(ReplyDelta::CallArguments {
                                index,
                                text: arguments,
                            });
                            self.calls = Calls::Between;
                        }
                        None => {
                            let text = self.take(n);
                            self.content(text, out);
                            self.calls = Calls::Text;
                        }
                    }
                    true
                }
            },
            Calls::Arguments(index, mut scan) => {
                let (n, done) = scan.feed(&self.buf);
                if n > 0 {
                    let text = self.take(n);
                    out.push(ReplyDelta::CallArguments { index, text });
                }
                self.calls = if done {
                    Calls::CloseObject
                } else {
                    Calls::Arguments(index, scan)
                };
                done
            }
            Calls::Gap => {
                let t = self.buf.trim_start();
                let skip = self.buf.len() - t.len();
                if t.is_empty() || (!end && opens.iter().any(|m| m.starts_with(t))) {
                    if end {
                        self.buf.clear();
                    }
                    return false;
                }
                // Blanks between sections are not content.
                if opens.iter().any(|m| t.starts_with(m)) {
                    self.take(skip);
                }
                self.calls = Calls::Text;
                true
            }
            Calls::CloseObject => {
                let t = self.buf.trim_start();
                if t.is_empty() {
                    return false;
                }
                let skip = self.buf.len() - t.len() + usize::from(t.starts_with('}'));
                self.take(skip);
                self.calls = Calls::Between;
                true
            }
        }
    }

    /// One move through gpt-oss's harmony messages; true when it made progress.
    fn harmony(&mut self, end: bool, out: &mut Vec<ReplyDelta>) -> bool {
        const MESSAGE: &str = "<|message|>";
        const ENDS: [&str; 4] = ["<|end|>", "<|call|>", "<|return|>", "<|start|>"];
        match self.channel {
            Channel::Header => {
                let Some(p) = self.buf.find(MESSAGE) else {
                    if end && !self.buf.contains("<|") {
                        // Not harmony at all: plain text.
                        let text = std::mem::take(&mut self.buf);
                        self.content(text, out);
                    }
                    return false;
                };
                let header = self.take(p);
                self.take(MESSAGE.len());
                let channel = header
                    .split("<|channel|>")
                    .nth(1)
                    .and_then(|c| c.split_whitespace().next())
                    .unwrap_or("final")
                    .split("<|")
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let recipient = header.split_whitespace().find_map(|w| {
                    w.strip_prefix("to=")
                        .map(|r| r.split("<|").next().unwrap_or_default().to_string())
                });
                self.channel = match recipient
                    .as_deref()
                    .and_then(|r| r.strip_prefix("functions."))
                {
                    Some(name) => Channel::Call(self.start_call(name.to_string(), out)),
                    None if channel == "analysis" => Channel::Reasoning,
                    None => Channel::Content,
                };
                true
            }
            channel => {
                let found = find_first(&self.buf, &ENDS);
                let n = match found {
                    Some((p, _)) => p,
                    None if end => self.buf.len(),
                    None => releasable(&self.buf, &ENDS),
                };
                let text = self.take(n);
                if !text.is_empty() {
                    out.push(match channel {
                        Channel::Reasoning => ReplyDelta::Reasoning(text),
                        Channel::Call(index) => ReplyDelta::CallArguments { index, text },
                        _ => {
                            self.started = true;
                            ReplyDelta::Content(text)
                        }
                    });
                }
                match found {
                    Some((_, m)) => {
                        if m != "<|start|>" {
                            self.take(m.len());
                        }
                        self.channel = Channel::Header;
                        true
                    }
                    None => false,
                }
            }
        }
    }
}

/// How a call object opens.
enum Header {
    /// `{"name": "N", "arguments": ` read, `len` bytes, and the value has begun.
    Named { name: String, len: usize },
    /// The text so far could still open that way.
    Incomplete,
    /// It does not (another key order, or not a call).
    Other,
}

/// Reads `{"name": "N", "arguments"|"parameters": ` at the start of `text`.
fn call_header(text: &str) -> Header {
    let b = text.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // Each expected piece in turn; running out of text means it may yet come.
    let expect = |i: &mut usize, lit: &[&str]| -> Option<bool> {
        ws(i);
        let rest = &text[*i..];
        for l in lit {
            if rest.starts_with(l) {
                *i += l.len();
                return Some(true);
            }
        }
        if lit.iter().any(|l| l.starts_with(rest)) {
            None
        } else {
            Some(false)
        }
    };
    // The pieces in turn, then the start of what follows them.
    let pieces = |i: &mut usize, groups: &[&[&str]]| -> Result<(), Header> {
        for lit in groups {
            match expect(i, lit) {
                Some(true) => {}
                Some(false) => return Err(Header::Other),
                None => return Err(Header::Incomplete),
            }
        }
        ws(i);
        if *i >= b.len() {
            return Err(Header::Incomplete);
        }
        Ok(())
    };
    if let Err(h) = pieces(&mut i, &[&["{"], &["\"name\""], &[":"]]) {
        return h;
    }
    if b[i] != b'"' {
        return Header::Other;
    }
    let Some(n) = JsonScan::default().value_end(&text[i..]) else {
        return Header::Incomplete;
    };
    let Ok(name) = serde_json::from_str::<String>(&text[i..i + n]) else {
        return Header::Other;
    };
    i += n;
    if let Err(h) = pieces(
        &mut i,
        &[&[","], &["\"arguments\"", "\"parameters\""], &[":"]],
    ) {
        return h;
    }
    Header::Named { name, len: i }
}

/// A whole call object in any key order: its name and arguments as JSON text.
fn whole_call(text: &str) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(text).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => "{}".into(),
    };
    Some((name, arguments))
}

/// Finds where one JSON value ends, fed in pieces: brackets counted outside strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct JsonScan {
    depth: u32,
    in_string: bool,
    escaped: bool,
    started: bool,
}

impl JsonScan {
    /// Consumes `text` up to the end of the value: (bytes consumed, whether it ended). A
    /// scalar ends before the delimiter that follows it.
    fn feed(&mut self, text: &str) -> (usize, bool) {
        for (i, &c) in text.as_bytes().iter().enumerate() {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if c == b'\\' {
                    self.escaped = true;
                } else if c == b'"' {
                    self.in_string = false;
                    if self.depth == 0 {
                        return (i + 1, true);
                    }
                }
                continue;
            }
            match c {
                _ if !self.started && c.is_ascii_whitespace() => continue,
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' if self.depth > 0 => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        return (i + 1, true);
                    }
                }
                _ if self.depth == 0
                    && self.started
                    && (c.is_ascii_whitespace() || b",}]".contains(&c)) =>
                {
                    return (i, true);
                }
                _ => {}
            }
            self.started = true;
        }
        (text.len(), false)
    }

    /// The length of the value at the start of `text`, once it is whole.
    fn value_end(mut self, text: &str) -> Option<usize> {
        match self.feed(text) {
            (n, true) => Some(n),
            _ => None,
        }
    }
}
