//! Ollama's API (`POST /api/chat`, `POST /api/generate`): messages with tool calls whose
//! arguments are objects, `options` under Ollama's names, `format` (`"json"` or a schema),
//! `think`, streaming on unless `stream: false`; validated and turned into a chat request
//! (`/api/generate` renders its prompt with the chat template as a user message, unless
//! `raw`).

use oxgen::{ChatMessage, Constraint, Prompt, ToolCall};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{Bounds, Common, Request, Unknown, object, renamed, role, tools, typed};
use crate::error::ApiError;

const CHAT_FIELDS: &[&str] = &[
    "model",
    "messages",
    "tools",
    "format",
    "options",
    "stream",
    "keep_alive",
    "think",
];

const GENERATE_FIELDS: &[&str] = &[
    "model",
    "prompt",
    "system",
    "raw",
    "format",
    "options",
    "stream",
    "keep_alive",
    "think",
    "suffix",
    "images",
    "template",
    "context",
];

/// `options` this server maps, and the chat completions field each becomes.
const OPTIONS: &[(&str, &str)] = &[
    ("temperature", "temperature"),
    ("top_k", "top_k"),
    ("top_p", "top_p"),
    ("min_p", "min_p"),
    ("repeat_penalty", "repetition_penalty"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
    ("seed", "seed"),
    ("stop", "stop"),
];

#[derive(Deserialize)]
struct Options {
    num_ctx: Option<i64>,
    num_predict: Option<i64>,
}

/// `POST /api/chat`.
pub fn ollama_chat(body: &[u8], bounds: &Bounds, strict: bool) -> Result<Request, ApiError> {
    let map = object(body)?;
    let mut unknown = Unknown::new(strict);
    unknown.check(&map, "", &[CHAT_FIELDS])?;
    let value = Value::Object(map);
    let messages: Vec<Map<String, Value>> =
        typed(&value["messages"]).map_err(|e| renamed(e, &[(": ", "messages: ")]))?;
    let messages = chat_messages(&messages, &mut unknown)?;
    let mut out = request(&value, vec![Prompt::Chat(messages)], bounds, &mut unknown)?;
    // Ollama's tools are in chat completions' shape, and it has no `tool_choice`.
    out.tools = tools(&value)?;
    out.ignored = unknown.names;
    Ok(out)
}

/// `POST /api/generate`: `prompt` (and `system`) rendered by the chat template, or the
/// prompt as it is with `raw: true`.
pub fn ollama_generate(body: &[u8], bounds: &Bounds, strict: bool) -> Result<Request, ApiError> {
    let map = object(body)?;
    let mut unknown = Unknown::new(strict);
    unknown.check(&map, "", &[GENERATE_FIELDS])?;
    for (key, why) in [
        ("suffix", "fill-in-the-middle ('suffix') is not supported"),
        (
            "images",
            "images are not supported: this server runs text models",
        ),
        (
            "template",
            "a per-request template is not supported; the model's chat template renders the prompt (or send raw: true)",
        ),
        (
            "context",
            "'context' (the ids of an earlier generation) is not supported; send the conversation to /api/chat",
        ),
    ] {
        let given = map.get(key).is_some_and(|v| match v {
            Value::Null => false,
            Value::String(s) => !s.is_empty(),
            Value::Array(a) => !a.is_empty(),
            _ => true,
        });
        if given {
            return Err(ApiError::invalid(key, format!("{key}: {why}")));
        }
    }
    let value = Value::Object(map);
    let text = |key: &str| match value.get(key) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(v) => super::string(key, v),
    };
    let (prompt, system) = (text("prompt")?, text("system")?);
    let raw = super::boolean("raw", value.get("raw"), false)?;
    let prompt = if raw {
        Prompt::Text(prompt)
    } else {
        let mut messages = Vec::with_capacity(2);
        if !system.is_empty() {
            messages.push(ChatMessage::new("system", &system));
        }
        messages.push(ChatMessage::new("user", &prompt));
        Prompt::Chat(messages)
    };
    let mut out = request(&value, vec![prompt], bounds, &mut unknown)?;
    out.ignored = unknown.names;
    Ok(out)
}

/// What both endpoints share: `model`, `stream` (on by default), `options`, `format`,
/// `think`.
fn request(
    body: &Value,
    prompts: Vec<Prompt>,
    bounds: &Bounds,
    unknown: &mut Unknown,
) -> Result<Request, ApiError> {
    let options = match body.get("options") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => return Err(ApiError::invalid("options", "options must be an object")),
    };
    // Ollama's other options tune its runner (threads, GPU layers, mmap, ...) or samplers
    // this server does not have: ignored and named.
    let known: Vec<&str> = (OPTIONS.iter().map(|(k, _)| *k))
        .chain(["num_ctx", "num_predict"])
        .collect();
    unknown.check(&options, "options", &[&known])?;
    let mut common = Map::new();
    common.insert(
        "model".into(),
        body.get("model").cloned().unwrap_or(Value::Null),
    );
    let stream = super::boolean("stream", body.get("stream"), true)?;
    common.insert("stream".into(), json!(stream));
    for (from, to) in OPTIONS {
        if let Some(v) = options.get(*from) {
            common.insert((*to).into(), v.clone());
        }
    }
    // An error names the option as the request gave it.
    let rename = |e: ApiError| {
        let option = (OPTIONS.iter()).find(|(_, to)| e.param.as_deref() == Some(*to));
        match option {
            Some((from, to)) => renamed(e, &[(to, &format!("options.{from}"))]),
            None => e,
        }
    };
    let common: Common = typed(&Value::Object(common)).map_err(rename)?;
    let limits: Options = typed(&Value::Object(options)).map_err(|e| {
        renamed(
            e,
            &[
                ("num_ctx", "options.num_ctx"),
                ("num_predict", "options.num_predict"),
            ],
        )
    })?;
    let max_tokens = match limits.num_predict {
        None | Some(-1 | -2) => None,
        Some(n) if n >= 1 => Some(n),
        Some(n) => {
            return Err(ApiError::invalid(
                "options.num_predict",
                format!(
                    "options.num_predict must be -1 (no limit), -2 (fill the context) or at least 1, got {n}"
                ),
            ));
        }
    };
    let num_ctx = (limits.num_ctx)
        .map(|n| super::count("options.num_ctx", n, 1, usize::MAX))
        .transpose()?;
    let mut request = (common.into_request(prompts, (max_tokens, 1), None, bounds, unknown))
        .map_err(|e| renamed(e, &[("max_tokens", "options.num_predict")]))
        .map_err(rename)?;
    request.constraint = match body.get("format") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) if s == "json" => Some(("format".into(), Constraint::JsonObject)),
        Some(schema @ Value::Object(_)) => {
            Some(("format".into(), Constraint::JsonSchema(schema.clone())))
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "format",
                "format must be \"json\" or a JSON schema (an object)",
            ));
        }
    };
    request.reasoning_effort = match body.get("think") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(true)) => Some("medium".into()),
        Some(Value::Bool(false)) => Some("none".into()),
        Some(Value::String(s)) if matches!(s.as_str(), "low" | "medium" | "high") => {
            Some(s.clone())
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "think",
                "think must be true, false, \"low\", \"medium\" or \"high\"",
            ));
        }
    };
    request.num_ctx = num_ctx;
    Ok(request)
}

/// Ollama's messages: `role` (system, user, assistant, tool), `content`, an assistant's
/// `tool_calls` (arguments an object) and `thinking`, a tool result's `tool_name`.
fn chat_messages(
    messages: &[Map<String, Value>],
    unknown: &mut Unknown,
) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages is empty"));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        const FIELDS: &[&str] = &[
            "role",
            "content",
            "tool_calls",
            "thinking",
            "tool_name",
            "images",
        ];
        unknown.check(m, &at, &[FIELDS])?;
        if m.get("images")
            .is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty()))
        {
            return Err(ApiError::invalid(
                format!("{at}.images"),
                "images are not supported: this server runs text models",
            ));
        }
        let role = role(m, &at, &["system", "user", "assistant", "tool"])?;
        let content = match m.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(v) => super::string(&format!("{at}.content"), v)?,
        };
        let mut message = ChatMessage::new(role, &content);
        if let Some(Value::String(t)) = m.get("thinking").filter(|_| role == "assistant") {
            message = message.with_reasoning(t);
        }
        if let Some(calls) = m.get("tool_calls").filter(|v| !v.is_null()) {
            let calls = calls
                .as_array()
                .filter(|_| role == "assistant")
                .ok_or_else(|| {
                    ApiError::invalid(
                        format!("{at}.tool_calls"),
                        "tool_calls must be an array, on an assistant message",
                    )
                })?;
            for (j, c) in calls.iter().enumerate() {
                let at = format!("{at}.tool_calls[{j}].function");
                let function = c.get("function").unwrap_or(&Value::Null);
                let name = super::string(&format!("{at}.name"), &function["name"])?;
                let arguments = match &function["arguments"] {
                    Value::Null => "{}".to_string(),
                    Value::String(s) => s.clone(),
                    v => v.to_string(),
                };
                let id = c.get("id").and_then(Value::as_str).unwrap_or_default();
                message.tool_calls.push(ToolCall {
                    id: id.to_string(),
                    name,
                    arguments,
                });
            }
        }
        if role == "tool" {
            let name = m
                .get("tool_name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            message.tool_call_id = Some(name.to_string());
        }
        out.push(message);
    }
    Ok(out)
}
