//! Tool calling: the tools a request offers, how a model family writes its calls, the grammar
//! that enforces a call, and the prompt a template without tool support gets instead.
//!
//! A [`ToolFormat`] is one family's call syntax, picked from the chat template's text
//! ([`ToolFormat::detect`]) or named by the user:
//!
//! | format | the model writes | families |
//! |---|---|---|
//! | `hermes` | `<tool_call>{"name": N, "arguments": {..}}</tool_call>` per call | Qwen 2.5/3, Hermes, SmolLM3 |
//! | `llama3` | `{"name": N, "parameters": {..}}` (optionally after `<\|python_tag\|>`), `;` between calls | Llama 3.1-3.3 |
//! | `mistral` | `[TOOL_CALLS][{"name": N, "arguments": {..}}, ..]` | Mistral, Mixtral |
//! | `phi4-mini` | `<\|tool_call\|>[{"name": N, "arguments": {..}}]<\|/tool_call\|>` (or `functools[..]`) | Phi-4-mini, Granite 3 |
//! | `nemotron` | `<TOOLCALL>[{"name": N, "arguments": {..}}, ..]</TOOLCALL>` | Nemotron Nano 2 |
//! | `harmony` | `<\|channel\|>commentary to=functions.N <\|constrain\|>json<\|message\|>{..}` | gpt-oss |
//! | `json` | the `hermes` form, with the tools described by oxgen in the system message | any template without tool support |
//!
//! `required` and a named function are enforced: [`tool_grammar`] writes a Lark grammar whose
//! arguments are each tool's `parameters` schema (`%json`), so a call always parses and
//! validates. `auto` gets a grammar with a free-text branch beside the calls where the format
//! has a marker to tell them apart. [`crate::ReplyParser`] turns the text back into calls.

use serde::{Serialize, Serializer};
use serde_json::{Value, json};

use crate::constraint::for_grammar;
use crate::{ChatMessage, Constraint, ReplySyntax, Tokenizer};

/// A function the model may call (OpenAI's `tools[].function`).
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// A JSON schema for the arguments (an object schema).
    pub parameters: Value,
}

impl Tool {
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`, in that
    /// order: the shape chat templates are written for (some write it out with `tojson`).
    pub fn to_json(&self) -> Value {
        let mut function = serde_json::Map::new();
        function.insert("name".into(), json!(self.name));
        if let Some(d) = &self.description {
            function.insert("description".into(), json!(d));
        }
        function.insert("parameters".into(), self.parameters.clone());
        json!({"type": "function", "function": function})
    }
}

/// Whether and which tool the model must call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// No call: the tools are described, the reply is text.
    None,
    /// Text or calls, as the model chooses.
    Auto,
    /// At least one call.
    Required,
    /// A call of this function.
    Function(String),
}

/// A call a model made, or one in the conversation's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// OpenAI's shape, with `arguments` as an object when they parse: templates write them out
/// with `tojson`, which would quote a string.
impl Serialize for ToolCall {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let arguments = serde_json::from_str::<Value>(&self.arguments)
            .unwrap_or_else(|_| Value::String(self.arguments.clone()));
        json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": arguments},
        })
        .serialize(s)
    }
}

/// A family's tool-call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Llama3,
    Mistral,
    Phi4Mini,
    Nemotron,
    Harmony,
    /// Hermes-style calls for a template that knows no tools: oxgen describes them.
    Json,
}

impl ToolFormat {
    pub const ALL: [ToolFormat; 7] = [
        ToolFormat::Hermes,
        ToolFormat::Llama3,
        ToolFormat::Mistral,
        ToolFormat::Phi4Mini,
        ToolFormat::Nemotron,
        ToolFormat::Harmony,
        ToolFormat::Json,
    ];

    /// The name `--tool-parser` takes.
    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Hermes => "hermes",
            ToolFormat::Llama3 => "llama3",
            ToolFormat::Mistral => "mistral",
            ToolFormat::Phi4Mini => "phi4-mini",
            ToolFormat::Nemotron => "nemotron",
            ToolFormat::Harmony => "harmony",
            ToolFormat::Json => "json",
        }
    }

    pub fn from_name(name: &str) -> Option<ToolFormat> {
        ToolFormat::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The format a chat template's text implies: the markers it renders. A template that
    /// mentions none (or no template) gets [`ToolFormat::Json`].
    pub fn detect(template: Option<&str>) -> ToolFormat {
        let Some(t) = template else {
            return ToolFormat::Json;
        };
        if t.contains("<|channel|>") {
            ToolFormat::Harmony
        } else if t.contains("<TOOLCALL>") {
            ToolFormat::Nemotron
        } else if t.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if t.contains("<|tool_call|>") || t.contains("<|tool|>") {
            ToolFormat::Phi4Mini
        } else if t.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if t.contains("<|python_tag|>") || t.contains("ipython") {
            ToolFormat::Llama3
        } else {
            ToolFormat::Json
        }
    }

    /// Its markers are special tokens, so the reply's text must keep them to be parsed.
    pub fn keeps_special(self) -> bool {
        matches!(
            self,
            ToolFormat::Mistral
                | ToolFormat::Phi4Mini
                | ToolFormat::Nemotron
                | ToolFormat::Harmony
                | ToolFormat::Llama3
        )
    }

    /// The key the arguments go under.
    fn arguments_key(self) -> &'static str {
        match self {
            ToolFormat::Llama3 => "parameters",
            _ => "arguments",
        }
    }

    /// Mistral's templates check for 9-character ids.
    pub(crate) fn call_id(self, seed: u64) -> String {
        let len = if self == ToolFormat::Mistral { 9 } else { 24 };
        let alphabet = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        let mut x = seed | 1;
        let id: String = (0..len)
            .map(|_| {
                // xorshift64*: enough to keep ids of one process apart.
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
                alphabet[(r >> 58) as usize % alphabet.len()] as char
            })
            .collect();
        match self {
            ToolFormat::Mistral => id,
            _ => format!("call_{id}"),
        }
    }
}

/// The tools of a request and how the model must use them.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSet {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    /// More than one call per reply.
    pub parallel: bool,
    pub format: ToolFormat,
}

/// `text` as a Lark string literal (JSON's escapes).
fn literal(text: &str) -> String {
    Value::String(text.into()).to_string()
}

/// A marker: the special token of that text where the tokenizer has one (by id, since
/// Mistral's `[TOOL_CALLS]` would read as a token range), else the text itself.
fn marker(text: &str, tokenizer: &Tokenizer) -> String {
    match tokenizer.token_id(text) {
        Some(id) if tokenizer.special_token(id).is_some() => format!("<[{id}]>"),
        _ => literal(text),
    }
}

/// Free text up to and including `end`, as (what a rule writes, the rule that defines
/// `name`). Where `end` is text, a lazy rule that stops at its first occurrence (a greedy
/// lexeme would have taken the marker's first bytes already); where it is a special token,
/// text then the token, since no text lexeme can produce one.
fn text_until(name: &str, end: &str, tokenizer: &Tokenizer) -> (String, String) {
    let m = marker(end, tokenizer);
    if m.starts_with("<[") {
        (format!("{name} {m}"), format!("{name}: /(?s:.*)/"))
    } else {
        (name.to_string(), format!("{name}[suffix={m}]: /(?s:.*)/"))
    }
}

/// gpt-oss's analysis message, which may come before what a grammar asks for.
fn harmony_analysis(tokenizer: &Tokenizer) -> [String; 2] {
    let (reason, rule) = text_until("reason", "<|end|>", tokenizer);
    [
        format!(
            "analysis: {} \"analysis\" {} {reason} {} \"assistant\"",
            marker("<|channel|>", tokenizer),
            marker("<|message|>", tokenizer),
            marker("<|start|>", tokenizer),
        ),
        rule,
    ]
}

/// `text` matched literally inside a Lark `/regex/`.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A Lark expression for the text a constraint allows, to nest in a larger grammar.
pub fn lark_expression(c: &Constraint) -> String {
    if let Some(schema) = c.json_schema() {
        return format!("%json {schema}");
    }
    match c {
        Constraint::JsonSchema(_) | Constraint::JsonObject => unreachable!("handled above"),
        Constraint::Regex(rx) => format!("/{}/", rx.replace('/', "\\/")),
        Constraint::Lark(g) => format!("%lark {{\n{g}\n}}"),
        Constraint::Choice(cs) => {
            let alternatives: Vec<String> = cs.iter().map(|c| literal(c)).collect();
            format!("({})", alternatives.join(" | "))
        }
    }
}

/// The grammar that enforces `set.choice`, or `None` where nothing is enforced (`none`, or
/// `auto` in a format without a marker that sets calls apart from text). `answer`, when
/// given, constrains the text branch of `auto` (a `response_format` beside the tools).
pub fn tool_grammar(
    set: &ToolSet,
    answer: Option<&Constraint>,
    tokenizer: &Tokenizer,
) -> Option<Constraint> {
    let offered: Vec<&Tool> = match &set.choice {
        ToolChoice::None => return None,
        ToolChoice::Function(name) => set.tools.iter().filter(|t| &t.name == name).collect(),
        ToolChoice::Auto | ToolChoice::Required => set.tools.iter().collect(),
    };
    let auto = set.choice == ToolChoice::Auto;
    let format = set.format;
    if auto && matches!(format, ToolFormat::Llama3 | ToolFormat::Harmony) {
        return None;
    }
    let mut rules = Vec::new();
    let mut bodies = Vec::new();
    for (i, tool) in offered.iter().enumerate() {
        let schema = if tool.parameters.is_null() {
            for_grammar(&json!({"type": "object"}))
        } else {
            for_grammar(&tool.parameters)
        };
        if format == ToolFormat::Harmony {
            let head = format!("commentary to=functions.{} ", tool.name);
            rules.push(format!(
                "fn{i}: {} {} {} \"json\" {} %json {schema}",
                marker("<|channel|>", tokenizer),
                literal(&head),
                marker("<|constrain|>", tokenizer),
                marker("<|message|>", tokenizer),
            ));
        } else {
            let head = format!(
                "{{\"name\": \"{}\", \"{}\": ",
                tool.name,
                format.arguments_key()
            );
            rules.push(format!("fn{i}: {} %json {schema} \"}}\"", literal(&head)));
        }
        bodies.push(format!("fn{i}"));
    }
    rules.push(format!("body: {}", bodies.join(" | ")));
    let many = |sep: &str| {
        if set.parallel {
            format!("body ({} body)*", literal(sep))
        } else {
            "body".into()
        }
    };
    let calls = match format {
        ToolFormat::Hermes | ToolFormat::Json => {
            let call = "OPEN body CLOSE";
            // ASCII blanks: `\s` would take multi-byte spaces, which byte tokens split.
            rules.push(r"OPEN: /[ \t\n]*<tool_call>\n?/".into());
            rules.push(r"CLOSE: /\n?<\/tool_call>/".into());
            if set.parallel {
                format!("{call} ({call})*")
            } else {
                call.into()
            }
        }
        ToolFormat::Phi4Mini => format!(
            "{} \"[\" {} \"]\" {}",
            marker("<|tool_call|>", tokenizer),
            many(", "),
            marker("<|/tool_call|>", tokenizer)
        ),
        ToolFormat::Nemotron => format!(
            "{} \"[\" {} \"]\" {}",
            marker("<TOOLCALL>", tokenizer),
            many(", "),
            marker("</TOOLCALL>", tokenizer)
        ),
        ToolFormat::Mistral => format!(
            "{} \"[\" {} \"]\"",
            marker("[TOOL_CALLS]", tokenizer),
            many(", ")
        ),
        ToolFormat::Llama3 => many("; "),
        ToolFormat::Harmony => {
            // The model may think first, on the analysis channel.
            rules.extend(harmony_analysis(tokenizer));
            "analysis? body".into()
        }
    };
    rules.push(format!("calls: {calls}"));
    let start = if auto {
        let text = match answer {
            Some(c) => lark_expression(c),
            None => {
                // Free text that does not open a call (a marker that is a special token
                // needs no exclusion: no text lexeme produces one).
                let opens: &[&str] = match format {
                    ToolFormat::Hermes | ToolFormat::Json => &["<tool_call>"],
                    ToolFormat::Phi4Mini => &["<|tool_call|>", "functools["],
                    ToolFormat::Nemotron => &["<TOOLCALL>"],
                    ToolFormat::Mistral => &["[TOOL_CALLS]"],
                    ToolFormat::Llama3 | ToolFormat::Harmony => &[],
                };
                let texts: Vec<String> = (opens.iter())
                    .filter(|m| !marker(m, tokenizer).starts_with("<["))
                    .map(|m| regex_escape(m))
                    .collect();
                rules.push(if texts.is_empty() {
                    r"TEXT: /(?s:.*)/".into()
                } else {
                    format!(r"TEXT: /(?s:.*)/ & ~/(?s:[ \t\n]*({}).*)/", texts.join("|"))
                });
                "TEXT".into()
            }
        };
        format!("start: {text} | calls")
    } else {
        "start: calls".into()
    };
    rules.insert(0, start);
    Some(Constraint::Lark(rules.join("\n")))
}

/// `c` constraining only the answer of a reply that may reason first: after a
/// `<think>...</think>` block (or, where the prompt opened it, after `</think>`), or after
/// gpt-oss's analysis message, on its final channel. Other replies are constrained as they
/// are.
pub fn after_reasoning(c: Constraint, syntax: &ReplySyntax, tokenizer: &Tokenizer) -> Constraint {
    let answer = lark_expression(&c);
    let lark = if syntax.harmony {
        let [analysis, reason] = harmony_analysis(tokenizer);
        let final_head = format!(
            "{} \"final\" {}",
            marker("<|channel|>", tokenizer),
            marker("<|message|>", tokenizer)
        );
        format!("start: analysis? {final_head} answer\n{analysis}\n{reason}\nanswer: {answer}")
    } else if syntax.think {
        let (reason, rule) = text_until("reason", "</think>", tokenizer);
        let think = if syntax.think_open {
            format!("{reason} BLANK")
        } else {
            format!("({} {reason} BLANK)?", marker("<think>", tokenizer))
        };
        format!("start: {think} answer\n{rule}\nBLANK: /[ \\t\\n]*/\nanswer: {answer}")
    } else {
        return c;
    };
    Constraint::Lark(lark)
}

/// What oxgen tells a model whose template renders no tools: the definitions, one JSON
/// object per line, and the call syntax ([`ToolFormat::Json`]).
fn tools_prompt(tools: &[Tool], choice: &ToolChoice) -> String {
    let mut text = String::from(
        "You can call functions. To call one, reply with\n\
         <tool_call>\n{\"name\": \"FUNCTION\", \"arguments\": {ARGUMENTS}}\n</tool_call>\n\
         where ARGUMENTS follow the function's parameters. The functions:\n",
    );
    for t in tools {
        text.push_str(&t.to_json()["function"].to_string());
        text.push('\n');
    }
    match choice {
        ToolChoice::Required => text.push_str("Call at least one function.\n"),
        ToolChoice::Function(name) => text.push_str(&format!("Call the function {name}.\n")),
        ToolChoice::None => text.push_str("Do not call a function now; answer in text.\n"),
        ToolChoice::Auto => {}
    }
    text
}

/// The calls of an assistant message as the `json` format writes them.
fn calls_text(calls: &[ToolCall]) -> String {
    calls
        .iter()
        .map(|c| {
            let arguments = serde_json::from_str::<Value>(&c.arguments)
                .unwrap_or_else(|_| Value::String(c.arguments.clone()));
            // Written as the grammar makes the model write it.
            format!(
                "<tool_call>\n{{\"name\": {}, \"arguments\": {arguments}}}\n</tool_call>",
                Value::String(c.name.clone())
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The messages a template without tool support renders for a conversation with tools: the
/// tool prompt joins the system message (or becomes one), calls in the history become the
/// assistant's text, and tool results become user messages.
pub(crate) fn messages_without_tools(
    messages: &[ChatMessage],
    tools: &[Tool],
    choice: &ToolChoice,
) -> Vec<ChatMessage> {
    let prompt = tools_prompt(tools, choice);
    let mut out = Vec::with_capacity(messages.len() + 1);
    match messages.first() {
        Some(m) if m.role == "system" => out.push(ChatMessage::new(
            "system",
            &format!("{}\n\n{prompt}", m.content),
        )),
        _ => out.push(ChatMessage::new("system", prompt.trim_end())),
    }
    let skip = usize::from(messages.first().is_some_and(|m| m.role == "system"));
    for m in &messages[skip..] {
        out.push(match m.role.as_str() {
            "assistant" if !m.tool_calls.is_empty() => {
                let text = [m.content.as_str(), &calls_text(&m.tool_calls)]
                    .iter()
                    .filter(|s| !s.is_empty())
                    .copied()
                    .collect::<Vec<_>>()
                    .join("\n");
                ChatMessage::new("assistant", &text)
            }
            "tool" => ChatMessage::new(
                "user",
                &format!("<tool_response>\n{}\n</tool_response>", m.content),
            ),
            _ => ChatMessage::new(&m.role, &m.content),
        });
    }
    out
}
