//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`): its
//! content blocks (`text`, `tool_use`, `tool_result`, `thinking`), `system`, tools with
//! `input_schema`, `tool_choice` and `thinking` validated and turned into a chat request. A
//! conversation ending in an assistant message is continued from where it ends (Anthropic's
//! prefill).

use oxgen::{ChatMessage, ToolCall};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{
    Bounds, Common, Render, Request, Unknown, constraint, flat_tools, object, renamed, role, tools,
    typed,
};
use crate::error::ApiError;

/// The fields `/v1/messages` reads.
const MESSAGES_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "messages",
    "system",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "thinking",
    "metadata",
    "service_tier",
    "output_config",
];

/// Fields refused: they ask for what this server does not have.
const MESSAGES_REFUSED: &[(&str, &str)] = &[
    ("mcp_servers", "MCP servers are not supported"),
    ("container", "code execution containers are not supported"),
];

#[derive(Deserialize)]
struct MessagesFields {
    max_tokens: Option<i64>,
    messages: Vec<Map<String, Value>>,
    system: Option<Value>,
    stop_sequences: Option<Vec<String>>,
    thinking: Option<Thinking>,
    output_config: Option<OutputConfig>,
}

#[derive(Deserialize)]
struct Thinking {
    #[serde(rename = "type")]
    kind: String,
    budget_tokens: Option<i64>,
}

#[derive(Deserialize)]
struct OutputConfig {
    effort: Option<String>,
    format: Option<Value>,
}

/// A Messages request, validated, and the stop strings its `stop_sequence` names.
pub struct Messages {
    pub request: Request,
    pub stop_sequences: Vec<String>,
}

/// Whether `v` holds a `cache_control` field at any depth.
fn has_cache_control(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.contains_key("cache_control") || m.values().any(has_cache_control),
        Value::Array(a) => a.iter().any(has_cache_control),
        _ => false,
    }
}

/// `POST /v1/messages` (with `counting`, `/v1/messages/count_tokens`, which takes no
/// `max_tokens`); unknown fields are ignored unless `strict`.
pub fn messages(
    body: &[u8],
    bounds: &Bounds,
    strict: bool,
    counting: bool,
) -> Result<Messages, ApiError> {
    let map = object(body)?;
    for (key, why) in MESSAGES_REFUSED {
        if map.get(*key).is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid(*key, format!("{key}: {why}")));
        }
    }
    let mut unknown = Unknown::new(strict);
    unknown.check(&map, "", &[MESSAGES_FIELDS])?;
    let value = Value::Object(map);
    let fields: MessagesFields = typed(&value)?;
    if fields.max_tokens.is_none() && !counting {
        return Err(ApiError::invalid(
            "max_tokens",
            "max_tokens is required: the most tokens the reply may have",
        ));
    }
    // The sampling fields under chat completions' names, checked as there.
    let mut common = Map::new();
    for (from, to) in [
        ("model", "model"),
        ("stream", "stream"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("stop_sequences", "stop"),
    ] {
        if let Some(v) = value.get(from) {
            common.insert(to.into(), v.clone());
        }
    }
    let common: Common = typed(&Value::Object(common))?;
    let stop_sequences = fields.stop_sequences.unwrap_or_default();
    let mut messages = Vec::with_capacity(fields.messages.len() + 1);
    if let Some(system) = &fields.system {
        messages.push(ChatMessage::new("system", &text_blocks(system, "system")?));
    }
    messages.extend(conversation(&fields.messages, &mut unknown)?);
    // A final assistant message is a prefill: the reply continues it.
    let prefill = messages.last().is_some_and(|m| m.role == "assistant");
    let max_tokens = (fields.max_tokens, 1);
    let prompts = vec![oxgen::Prompt::Chat(messages)];
    let mut request = (common.into_request(prompts, max_tokens, None, bounds, &mut unknown))
        .map_err(|e| renamed(e, &[("stop", "stop_sequences")]))?;
    request.render = Render {
        add_generation_prompt: !prefill,
        continue_final_message: prefill,
    };
    request.tools = tools(&chat_tools(&value)?).map_err(|e| {
        renamed(
            e,
            &[
                ("function.parameters", "input_schema"),
                (".function.", "."),
                ("tool_choice.function.name", "tool_choice.name"),
            ],
        )
    })?;
    if let Some(format) = fields
        .output_config
        .as_ref()
        .and_then(|o| o.format.as_ref())
    {
        let schema = format.get("schema").cloned().ok_or_else(|| {
            ApiError::invalid(
                "output_config.format.schema",
                "output_config.format needs {type: json_schema, schema}",
            )
        })?;
        let chat =
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}});
        request.constraint = constraint(&chat)
            .map_err(|e| {
                renamed(
                    e,
                    &[("response_format.json_schema", "output_config.format")],
                )
            })?
            .map(|(_, c)| ("output_config.format.schema".to_string(), c));
        // Anthropic's structured outputs always hold to the schema: strict.
        request.strict_schema = true;
    }
    let effort = fields.output_config.and_then(|o| o.effort);
    request.reasoning_effort = match effort.as_deref() {
        None => None,
        Some(e @ ("low" | "medium" | "high")) => Some(e.to_string()),
        Some("xhigh" | "max") => Some("high".to_string()),
        Some(other) => {
            return Err(ApiError::invalid(
                "output_config.effort",
                format!(
                    "output_config.effort '{other}' is not one of low, medium, high, xhigh, max"
                ),
            ));
        }
    };
    match fields.thinking {
        None => {}
        Some(t) if t.kind == "disabled" => request.reasoning_effort = Some("none".into()),
        Some(t) if t.kind == "enabled" || t.kind == "adaptive" => {
            (request.reasoning_effort).get_or_insert_with(|| "high".into());
            request.reasoning_budget = (t.budget_tokens)
                .map(|n| super::count("thinking.budget_tokens", n, 0, bounds.max_tokens_limit))
                .transpose()?;
        }
        Some(t) => {
            return Err(ApiError::invalid(
                "thinking.type",
                format!(
                    "thinking.type '{}' is not one of enabled, adaptive, disabled",
                    t.kind
                ),
            ));
        }
    }
    // A `cache_control` breakpoint anywhere (system, messages, tools) asks for the prompt
    // to stay cached: its prefix blocks are kept longer (the whole prompt's, not only the
    // part before the breakpoint).
    request.options.keep_prefix = ["system", "messages", "tools"]
        .iter()
        .any(|k| value.get(*k).is_some_and(has_cache_control));
    request.ignored = unknown.names;
    Ok(Messages {
        request,
        stop_sequences,
    })
}

/// `system`, or a `tool_result`'s content: a string, or text blocks (joined by blank lines).
fn text_blocks(v: &Value, at: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (i, b) in blocks.iter().enumerate() {
                match (b.get("type").and_then(Value::as_str), b.get("text")) {
                    (Some("text"), Some(Value::String(t))) => texts.push(t.as_str()),
                    _ => {
                        return Err(ApiError::invalid(
                            format!("{at}[{i}]"),
                            format!("{at}[{i}] must be a text block {{type: text, text}}"),
                        ));
                    }
                }
            }
            Ok(texts.join("\n\n"))
        }
        _ => Err(ApiError::invalid(
            at,
            format!("{at} must be a string or a list of text blocks"),
        )),
    }
}

/// The messages as chat messages: a user message's `tool_result` blocks become tool
/// messages (before its text, if any), an assistant's `tool_use` blocks its calls and its
/// `thinking` blocks its reasoning.
fn conversation(
    messages: &[Map<String, Value>],
    unknown: &mut Unknown,
) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages is empty"));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        unknown.check(m, &at, &[&["role", "content"]])?;
        // The system prompt is the top-level `system`.
        let role = role(m, &at, &["user", "assistant"])?;
        let blocks = match m.get("content") {
            Some(Value::String(s)) => {
                out.push(ChatMessage::new(role, s));
                continue;
            }
            Some(Value::Array(blocks)) => blocks,
            _ => {
                return Err(ApiError::invalid(
                    format!("{at}.content"),
                    "content must be a string or a list of content blocks",
                ));
            }
        };
        let (mut text, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
        for (j, block) in blocks.iter().enumerate() {
            let at = format!("{at}.content[{j}]");
            let Some(block) = block.as_object() else {
                return Err(ApiError::invalid(&at, format!("{at} must be an object")));
            };
            let kind = block
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let field = |key: &str| block.get(key).unwrap_or(&Value::Null);
            match (role, kind) {
                (_, "text") => {
                    unknown.check(
                        block,
                        &at,
                        &[&["type", "text", "cache_control", "citations"]],
                    )?;
                    text.push_str(&super::string(&format!("{at}.text"), field("text"))?);
                }
                ("user", "tool_result") => {
                    const FIELDS: &[&str] = &[
                        "type",
                        "tool_use_id",
                        "content",
                        "is_error",
                        "cache_control",
                    ];
                    unknown.check(block, &at, &[FIELDS])?;
                    let id = super::string(&format!("{at}.tool_use_id"), field("tool_use_id"))?;
                    let content = match field("content") {
                        Value::Null => String::new(),
                        v => text_blocks(v, &format!("{at}.content"))?,
                    };
                    let mut message = ChatMessage::new("tool", &content);
                    message.tool_call_id = Some(id);
                    out.push(message);
                }
                ("assistant", "tool_use") => {
                    unknown.check(
                        block,
                        &at,
                        &[&["type", "id", "name", "input", "cache_control"]],
                    )?;
                    let input = match field("input") {
                        Value::Null => json!({}),
                        v => v.clone(),
                    };
                    calls.push(ToolCall {
                        id: super::string(&format!("{at}.id"), field("id"))?,
                        name: super::string(&format!("{at}.name"), field("name"))?,
                        arguments: input.to_string(),
                    });
                }
                ("assistant", "thinking") => {
                    unknown.check(block, &at, &[&["type", "thinking", "signature"]])?;
                    reasoning.push_str(&super::string(
                        &format!("{at}.thinking"),
                        field("thinking"),
                    )?);
                }
                ("assistant", "redacted_thinking") => {}
                _ => {
                    return Err(ApiError::invalid(
                        format!("{at}.type"),
                        format!(
                            "{role} content blocks of type '{kind}' are not supported; a user \
                             sends text and tool_result blocks, an assistant text, tool_use \
                             and thinking"
                        ),
                    ));
                }
            }
        }
        // A user message of tool results alone has nothing more to say.
        if role == "user" && text.is_empty() && blocks.iter().any(|b| b["type"] == "tool_result") {
            continue;
        }
        let mut message = ChatMessage::new(role, &text);
        if !reasoning.is_empty() {
            message = message.with_reasoning(&reasoning);
        }
        message.tool_calls = calls;
        out.push(message);
    }
    Ok(out)
}

/// `tools` (`{name, description, input_schema}`) and `tool_choice` (`{type: auto | any |
/// tool | none, name, disable_parallel_tool_use}`) in chat completions' shape, for
/// [`tools`] to validate. Anthropic's server tools (bash, text editor, web search, ...) are
/// a 400.
fn chat_tools(body: &Value) -> Result<Value, ApiError> {
    let mut out = Map::new();
    if let Some(tools) = body.get("tools") {
        let refusal = |kind: Option<&str>| {
            format!(
                "Anthropic's server tools ('{}') are not supported; define the tool with name, \
                 description and input_schema",
                kind.unwrap_or_default()
            )
        };
        let custom = |k: Option<&str>| matches!(k, None | Some("custom"));
        out.insert(
            "tools".into(),
            flat_tools(tools, "input_schema", custom, refusal)?,
        );
    }
    if let Some(choice) = body.get("tool_choice").filter(|v| !v.is_null()) {
        let kind = choice.get("type").and_then(Value::as_str);
        let chat = match kind {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => json!({"type": "function", "function": {"name": choice.get("name")}}),
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice.type",
                    "tool_choice.type must be auto, any, tool or none",
                ));
            }
        };
        out.insert("tool_choice".into(), chat);
        let single = choice
            .get("disable_parallel_tool_use")
            .and_then(Value::as_bool);
        out.insert(
            "parallel_tool_calls".into(),
            json!(!single.unwrap_or(false)),
        );
    }
    Ok(Value::Object(out))
}
