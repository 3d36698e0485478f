//! OpenAI's Responses API (`POST /v1/responses`): its flat shapes (`input` items, function
//! tools as `{type, name, parameters}`, `text.format`) validated and turned into a chat
//! request; what the response echoes back; the conversation kept for
//! `previous_response_id`.

use oxgen::{ChatMessage, ToolCall};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::chat::{REASONING_EFFORTS, message_text};
use super::{
    Bounds, Common, Request, Unknown, constraint, flat_tools, object, renamed, role, string, tools,
    typed,
};
use crate::error::ApiError;

/// The fields `/v1/responses` reads, besides the sampling ones of [`SAMPLING`].
const RESPONSES_FIELDS: &[&str] = &[
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "reasoning",
    "max_output_tokens",
    "metadata",
    "store",
    "previous_response_id",
    "truncation",
    "include",
    "service_tier",
    "safety_identifier",
];

/// Sampling fields taken as chat completions take them (vLLM accepts its extra ones here
/// too).
const SAMPLING: &[&str] = &[
    "model",
    "prompt_cache_key",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stream",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "user",
];

/// Fields refused: honouring them is beyond this server, and ignoring them would answer
/// something else than asked.
const RESPONSES_REFUSED: &[(&str, &str)] = &[
    (
        "background",
        "background responses are not supported; stream the response instead",
    ),
    (
        "conversation",
        "conversation objects are not supported; continue with previous_response_id",
    ),
    ("prompt", "stored prompt templates are not supported"),
];

#[derive(Deserialize)]
struct ResponsesFields {
    input: Option<Value>,
    instructions: Option<String>,
    max_output_tokens: Option<i64>,
    metadata: Option<Map<String, Value>>,
    store: Option<bool>,
    previous_response_id: Option<String>,
    reasoning: Option<Reasoning>,
}

#[derive(Deserialize)]
struct Reasoning {
    effort: Option<String>,
}

/// A Responses request, validated: the chat request it runs (its prompt is set once the
/// previous response's conversation is known), and what the response and the store need.
pub struct Responses {
    pub request: Request,
    /// This request's input as chat messages (without `instructions`).
    pub input: Vec<ChatMessage>,
    pub instructions: Option<String>,
    pub previous_response_id: Option<String>,
    pub store: bool,
    /// The request's settings as a response object echoes them.
    pub echo: Map<String, Value>,
}

/// `POST /v1/responses`; unknown fields are ignored (named in [`Request::ignored`]) unless
/// `strict`.
pub fn responses(body: &[u8], bounds: &Bounds, strict: bool) -> Result<Responses, ApiError> {
    let map = object(body)?;
    for (key, why) in RESPONSES_REFUSED {
        if map
            .get(*key)
            .is_some_and(|v| !v.is_null() && v != &Value::Bool(false))
        {
            return Err(ApiError::invalid(*key, format!("{key}: {why}")));
        }
    }
    let mut unknown = Unknown::new(strict);
    unknown.check(&map, "", &[SAMPLING, RESPONSES_FIELDS, &["background"]])?;
    let sampling: Map<String, Value> = (map.iter())
        .filter(|(k, _)| SAMPLING.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let common: Common = typed(&Value::Object(sampling))?;
    let value = Value::Object(map);
    let fields: ResponsesFields = typed(&value)?;
    let input = match fields.input {
        Some(v) => input_messages(&v, &mut unknown)?,
        None if fields.previous_response_id.is_some() => Vec::new(),
        None => {
            return Err(ApiError::invalid(
                "input",
                "input is required: a string or a list of input items",
            ));
        }
    };
    let effort = fields.reasoning.and_then(|r| r.effort);
    if let Some(e) = effort.as_deref().filter(|e| !REASONING_EFFORTS.contains(e)) {
        return Err(ApiError::invalid(
            "reasoning.effort",
            format!(
                "reasoning.effort '{e}' is not one of {}",
                REASONING_EFFORTS.join(", ")
            ),
        ));
    }
    if let Some(m) = &fields.metadata
        && m.len() > 16
    {
        return Err(ApiError::invalid(
            "metadata",
            "metadata holds at most 16 keys",
        ));
    }
    let max_tokens = (fields.max_output_tokens, 1);
    let mut request = (common.into_request(Vec::new(), max_tokens, None, bounds, &mut unknown))
        .map_err(|e| renamed(e, &[("max_tokens", "max_output_tokens")]))?;
    request.tools = tools(&chat_tools(&value)?)
        .map_err(|e| renamed(e, &[(".function.", "."), ("function.name", "name")]))?;
    request.constraint = text_format(&value)?;
    request.strict_schema = value.pointer("/text/format/strict") == Some(&Value::Bool(true));
    request.reasoning_effort = effort;
    request.ignored = unknown.names;
    let mut echo = Map::new();
    for key in [
        "instructions",
        "max_output_tokens",
        "previous_response_id",
        "temperature",
        "top_p",
    ] {
        echo.insert(key.into(), value.get(key).cloned().unwrap_or(Value::Null));
    }
    echo.insert(
        "tools".into(),
        value.get("tools").cloned().unwrap_or(json!([])),
    );
    let choice = value.get("tool_choice").filter(|v| !v.is_null());
    echo.insert(
        "tool_choice".into(),
        choice.cloned().unwrap_or(json!("auto")),
    );
    let parallel = value.get("parallel_tool_calls").and_then(Value::as_bool);
    echo.insert(
        "parallel_tool_calls".into(),
        json!(parallel.unwrap_or(true)),
    );
    let format = value.pointer("/text/format").filter(|v| !v.is_null());
    echo.insert(
        "text".into(),
        json!({"format": format.cloned().unwrap_or(json!({"type": "text"}))}),
    );
    let reasoning = json!({"effort": request.reasoning_effort, "summary": null});
    echo.insert("reasoning".into(), reasoning);
    echo.insert(
        "metadata".into(),
        json!(fields.metadata.unwrap_or_default()),
    );
    echo.insert("truncation".into(), json!("disabled"));
    Ok(Responses {
        request,
        input,
        instructions: fields.instructions,
        previous_response_id: fields.previous_response_id,
        store: fields.store.unwrap_or(true),
        echo,
    })
}

/// The body's `tools`, `tool_choice` and `parallel_tool_calls` in chat completions' shape,
/// for [`tools`] to validate: a function tool is `{type, name, description, parameters}`
/// here, `{type, function: {name, description, parameters}}` there. Other tool types (web
/// search, file search, MCP, ...) are a 400.
fn chat_tools(body: &Value) -> Result<Value, ApiError> {
    let mut out = Map::new();
    if let Some(tools) = body.get("tools") {
        let refusal = |kind: Option<&str>| {
            let kind = kind.map_or("(missing)".into(), |k| format!("'{k}'"));
            format!("only function tools are supported here, not {kind}")
        };
        let tools = flat_tools(tools, "parameters", |k| k == Some("function"), refusal)?;
        out.insert("tools".into(), tools);
    }
    if let Some(choice) = body.get("tool_choice") {
        let chat = match choice.get("name") {
            Some(name) if choice.get("type").and_then(Value::as_str) == Some("function") => {
                json!({"type": "function", "function": {"name": name}})
            }
            _ => choice.clone(),
        };
        out.insert("tool_choice".into(), chat);
    }
    if let Some(v) = body.get("parallel_tool_calls") {
        out.insert("parallel_tool_calls".into(), v.clone());
    }
    Ok(Value::Object(out))
}

/// `text.format` (`text`, `json_object`, or `{type: json_schema, name, schema, strict}`) as
/// the constraint it asks for.
fn text_format(body: &Value) -> Result<Option<(String, oxgen::Constraint)>, ApiError> {
    let Some(format) = body.pointer("/text/format").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let mut response_format = Map::new();
    if let Some(kind) = format.get("type") {
        response_format.insert("type".into(), kind.clone());
    }
    if let Some(schema) = format.get("schema") {
        response_format.insert("json_schema".into(), json!({"schema": schema}));
    } else if format.get("type").and_then(Value::as_str) == Some("json_schema") {
        return Err(ApiError::invalid(
            "text.format.schema",
            "text.format of type json_schema needs a schema",
        ));
    }
    let chat = json!({"response_format": response_format});
    let found = constraint(&chat).map_err(|e| {
        renamed(
            e,
            &[
                ("response_format.json_schema.schema", "text.format.schema"),
                ("response_format", "text.format"),
            ],
        )
    })?;
    Ok(found.map(|(_, c)| ("text.format.schema".to_string(), c)))
}

/// The text of a message's content: a string, or parts of type `input_text`,
/// `output_text` or `text`.
fn content_text(content: Option<&Value>, at: &str) -> Result<String, ApiError> {
    let Some(Value::Array(parts)) = content else {
        return message_text(content, at);
    };
    let mut text = String::new();
    for (i, part) in parts.iter().enumerate() {
        let kind = part.get("type").and_then(Value::as_str);
        match (kind, part.get("text").and_then(Value::as_str)) {
            (Some("input_text" | "output_text" | "text"), Some(t)) => text.push_str(t),
            (kind, _) => {
                return Err(ApiError::invalid(
                    format!("{at}.content[{i}]"),
                    format!(
                        "{at}.content[{i}]: content parts of type {} are not supported; only \
                         input_text and output_text (with their text)",
                        kind.map_or("(missing)".into(), |k| format!("'{k}'"))
                    ),
                ));
            }
        }
    }
    Ok(text)
}

/// `input`: a string (one user message) or a list of items (messages, function calls and
/// their outputs, reasoning), as the chat messages they make. An assistant turn's items
/// (reasoning, message, calls) fold into one assistant message.
pub(crate) fn input_messages(
    input: &Value,
    unknown: &mut Unknown,
) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match input {
        Value::String(s) => return Ok(vec![ChatMessage::new("user", s)]),
        Value::Array(items) => items,
        _ => {
            return Err(ApiError::invalid(
                "input",
                "input must be a string or a list of input items",
            ));
        }
    };
    let mut messages: Vec<ChatMessage> = Vec::new();
    let mut reasoning: Option<String> = None;
    // Whether the last message is an assistant turn calls may still join.
    let mut open_turn = false;
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let Some(item) = item.as_object() else {
            return Err(ApiError::invalid(&at, format!("{at} must be an object")));
        };
        let kind = item.get("type").and_then(Value::as_str);
        match kind {
            None | Some("message") => {
                const FIELDS: &[&str] = &["type", "role", "content", "id", "status"];
                unknown.check(item, &at, &[FIELDS])?;
                let role = role(item, &at, &["user", "assistant", "system", "developer"])?;
                let text = content_text(item.get("content"), &at)?;
                let mut message = ChatMessage::new(role, &text);
                if role == "assistant"
                    && let Some(r) = reasoning.take()
                {
                    message = message.with_reasoning(&r);
                }
                open_turn = role == "assistant";
                messages.push(message);
            }
            Some("function_call") => {
                const FIELDS: &[&str] = &["type", "call_id", "name", "arguments", "id", "status"];
                unknown.check(item, &at, &[FIELDS])?;
                let field = |key: &str| {
                    string(
                        &format!("{at}.{key}"),
                        item.get(key).unwrap_or(&Value::Null),
                    )
                };
                let call = ToolCall {
                    id: field("call_id")?,
                    name: field("name")?,
                    arguments: field("arguments")?,
                };
                if !open_turn {
                    let mut message = ChatMessage::new("assistant", "");
                    if let Some(r) = reasoning.take() {
                        message = message.with_reasoning(&r);
                    }
                    messages.push(message);
                    open_turn = true;
                }
                let last = messages
                    .last_mut()
                    .expect("an assistant turn was just opened");
                last.tool_calls.push(call);
            }
            Some("function_call_output") => {
                const FIELDS: &[&str] = &["type", "call_id", "output", "id", "status"];
                unknown.check(item, &at, &[FIELDS])?;
                let call_id = string(
                    &format!("{at}.call_id"),
                    item.get("call_id").unwrap_or(&Value::Null),
                )?;
                let output = content_text(item.get("output"), &format!("{at}.output"))
                    .map_err(|e| renamed(e, &[(".output.content", ".output")]))?;
                let mut message = ChatMessage::new("tool", &output);
                message.tool_call_id = Some(call_id);
                messages.push(message);
                open_turn = false;
            }
            Some("reasoning") => {
                const FIELDS: &[&str] = &[
                    "type",
                    "id",
                    "summary",
                    "content",
                    "encrypted_content",
                    "status",
                ];
                unknown.check(item, &at, &[FIELDS])?;
                let texts = ["content", "summary"].iter().find_map(|key| {
                    let parts = item.get(*key)?.as_array().filter(|p| !p.is_empty())?;
                    Some(
                        (parts.iter())
                            .filter_map(|p| p.get("text").and_then(Value::as_str))
                            .collect::<Vec<_>>()
                            .join("\n"),
                    )
                });
                reasoning = texts;
                open_turn = false;
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    format!(
                        "input items of type '{other}' are not supported; send messages, \
                         function_call, function_call_output and reasoning items (continue a \
                         stored response with previous_response_id)"
                    ),
                ));
            }
        }
    }
    Ok(messages)
}
