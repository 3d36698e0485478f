//! A chat request: its messages, tools and template arguments, validated (a message field
//! this server does not know is ignored, or a 400 naming it under `--strict-api`) and turned
//! into what the chat template renders; how it is rendered (`add_generation_prompt`,
//! `continue_final_message`, the reasoning effort); its predicted output.

use oxgen::{ChatMessage, ChatTemplate, Prompt, ToolCall};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::{
    Bounds, MAX_TOP_LOGPROBS, Render, Request, Unknown, constraint, count, parse, role, string,
};
use crate::error::ApiError;

/// Chat fields beyond the common ones. `store`, `metadata` and `service_tier` are accepted
/// and ignored (the README lists them).
const CHAT_FIELDS: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "store",
    "metadata",
    "service_tier",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "reasoning_effort",
    "reasoning",
    "modalities",
    "prediction",
    "thinking_token_budget",
];

#[derive(Deserialize)]
struct ChatFields {
    messages: Vec<Map<String, Value>>,
    max_completion_tokens: Option<i64>,
    logprobs: Option<bool>,
    top_logprobs: Option<i64>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
    reasoning_effort: Option<String>,
    reasoning: Option<Reasoning>,
    modalities: Option<Vec<String>>,
    prediction: Option<PredictionField>,
    thinking_token_budget: Option<i64>,
}

/// OpenAI's predicted output: `{"type": "content", "content": text or text parts}`.
#[derive(Deserialize)]
struct PredictionField {
    #[serde(rename = "type")]
    kind: String,
    content: Value,
}

/// Responses-style `reasoning: {effort}`.
#[derive(Deserialize)]
struct Reasoning {
    effort: Option<String>,
}

/// `POST /v1/chat/completions`; unknown fields are ignored (named in
/// [`Request::ignored`]) unless `strict`.
pub fn chat(body: &[u8], bounds: &Bounds, strict: bool) -> Result<Request, ApiError> {
    let (value, common, chat, mut unknown) = parse::<ChatFields>(body, CHAT_FIELDS, strict)?;
    let top_logprobs = match (chat.logprobs.unwrap_or(false), chat.top_logprobs) {
        (true, top) => Some(count(
            "top_logprobs",
            top.unwrap_or(0),
            0,
            MAX_TOP_LOGPROBS,
        )?),
        (false, None | Some(0)) => None,
        (false, Some(_)) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ));
        }
    };
    if let Some(m) = chat.modalities.iter().flatten().find(|m| *m != "text") {
        return Err(ApiError::invalid(
            "modalities",
            format!("modalities: only 'text' output is supported, not '{m}'"),
        ));
    }
    let render = Render {
        add_generation_prompt: chat.add_generation_prompt.unwrap_or(true),
        continue_final_message: chat.continue_final_message.unwrap_or(false),
    };
    if render.add_generation_prompt && render.continue_final_message {
        return Err(ApiError::invalid(
            "continue_final_message",
            "continue_final_message continues the last message: send add_generation_prompt: \
             false with it",
        ));
    }
    let messages = chat_messages(chat.messages, &mut unknown)?;
    if render.continue_final_message && messages.last().is_some_and(|m| m.role != "assistant") {
        return Err(ApiError::invalid(
            "continue_final_message",
            "continue_final_message needs the last message to be the assistant's",
        ));
    }
    let effort = match (chat.reasoning_effort, chat.reasoning.and_then(|r| r.effort)) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::invalid(
                "reasoning",
                format!("reasoning_effort '{a}' and reasoning.effort '{b}' disagree; give one"),
            ));
        }
        (a, b) => a.or(b),
    };
    if let Some(e) = effort.as_deref().filter(|e| !REASONING_EFFORTS.contains(e)) {
        return Err(ApiError::invalid(
            "reasoning_effort",
            format!(
                "reasoning_effort '{e}' is not one of {}",
                REASONING_EFFORTS.join(", ")
            ),
        ));
    }
    let prediction = match chat.prediction {
        None => None,
        Some(p) if p.kind == "content" => Some(match &p.content {
            Value::String(s) => s.clone(),
            v => message_text(Some(v), "prediction")?,
        }),
        Some(p) => {
            return Err(ApiError::invalid(
                "prediction.type",
                format!(
                    "prediction.type '{}' is not supported; use 'content'",
                    p.kind
                ),
            ));
        }
    };
    let max_tokens = (chat.max_completion_tokens.or(common.max_tokens), 1);
    let prompts = vec![Prompt::Chat(messages)];
    let mut request =
        common.into_request(prompts, max_tokens, top_logprobs, bounds, &mut unknown)?;
    request.constraint = constraint(&value)?;
    request.strict_schema = super::strict_schema(&value);
    request.tools = tools(&value)?;
    request.template_kwargs = template_kwargs(&value)?;
    request.render = render;
    request.reasoning_effort = effort;
    request.prediction = prediction;
    request.reasoning_budget = (chat.thinking_token_budget)
        .map(|n| count("thinking_token_budget", n, 0, bounds.max_tokens_limit))
        .transpose()?;
    request.ignored = unknown.names;
    Ok(request)
}

pub use oxgen::prepare::{REASONING_EFFORTS, Tools};

/// A chat message's text: a string, or text parts.
pub(super) fn message_text(content: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match content {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (i, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str);
                match (kind, part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (Some("text"), None) => {
                        return Err(ApiError::invalid(
                            format!("{at}.content[{i}].text"),
                            "a text part needs a string 'text'",
                        ));
                    }
                    (kind, _) => {
                        return Err(ApiError::invalid(
                            format!("{at}.content[{i}].type"),
                            format!(
                                "content part type {} is not supported; only 'text'",
                                kind.map_or("(missing)".into(), |k| format!("'{k}'"))
                            ),
                        ));
                    }
                }
            }
            Ok(text)
        }
        _ => Err(ApiError::invalid(
            format!("{at}.content"),
            "content must be a string or an array of text parts",
        )),
    }
}

/// The calls of an assistant message in the history (`messages[i].tool_calls`).
fn history_calls(v: &Value, at: &str) -> Result<Vec<ToolCall>, ApiError> {
    let items = v.as_array().ok_or_else(|| {
        ApiError::invalid(format!("{at}.tool_calls"), "tool_calls must be an array")
    })?;
    (items.iter().enumerate())
        .map(|(j, c)| {
            let at = format!("{at}.tool_calls[{j}]");
            let function = c.get("function").ok_or_else(|| {
                ApiError::invalid(&at, "a tool call needs a function: {name, arguments}")
            })?;
            let name = string(
                &format!("{at}.function.name"),
                function.get("name").unwrap_or(&Value::Null),
            )?;
            let arguments = match function.get("arguments") {
                Some(Value::String(a)) => a.clone(),
                None | Some(Value::Null) => "{}".into(),
                Some(other) => other.to_string(),
            };
            let id = c.get("id").and_then(Value::as_str).unwrap_or_default();
            Ok(ToolCall {
                id: id.to_string(),
                name,
                arguments,
            })
        })
        .collect()
}

/// Validates chat messages: roles (`developer` is taken as `system`), text content, an
/// assistant's `tool_calls` (its content may then be null) and reasoning
/// (`reasoning_content`, or `reasoning`), and `tool` results with their `tool_call_id`; a
/// message's `name` is accepted and ignored, other fields go to `unknown`.
pub(crate) fn chat_messages(
    messages: Vec<Map<String, Value>>,
    unknown: &mut Unknown,
) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages is empty"));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let at = format!("messages[{i}]");
            const FIELDS: [&str; 7] = [
                "role",
                "content",
                "name",
                "tool_calls",
                "tool_call_id",
                "reasoning_content",
                "reasoning",
            ];
            unknown.check(m, &at, &[&FIELDS])?;
            let role = role(
                m,
                &at,
                &["system", "developer", "user", "assistant", "tool"],
            )?;
            let calls = match m.get("tool_calls").filter(|v| !v.is_null()) {
                Some(v) if role == "assistant" => history_calls(v, &at)?,
                Some(_) => {
                    return Err(ApiError::invalid(
                        format!("{at}.tool_calls"),
                        "only assistant messages carry tool_calls",
                    ));
                }
                None => Vec::new(),
            };
            let content = match m.get("content") {
                None | Some(Value::Null) if !calls.is_empty() => String::new(),
                content => message_text(content, &at)?,
            };
            let mut message = ChatMessage::new(role, &content);
            let reasoning = ["reasoning_content", "reasoning"]
                .into_iter()
                .find_map(|k| m.get(k).filter(|v| !v.is_null()).map(|v| (k, v)));
            match reasoning {
                Some((_, Value::String(r))) if role == "assistant" => {
                    message = message.with_reasoning(r);
                }
                Some((k, Value::String(_))) => {
                    return Err(ApiError::invalid(
                        format!("{at}.{k}"),
                        "only assistant messages carry reasoning",
                    ));
                }
                Some((k, _)) => {
                    return Err(ApiError::invalid(
                        format!("{at}.{k}"),
                        format!("{k} must be a string"),
                    ));
                }
                None => {}
            }
            message.tool_calls = calls;
            if role == "tool" {
                let id = m
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        ApiError::invalid(
                            format!("{at}.tool_call_id"),
                            "a tool message needs the tool_call_id of the call it answers",
                        )
                    })?;
                message.tool_call_id = Some(id.to_string());
            }
            Ok(message)
        })
        .collect()
}

/// `tools`, `tool_choice` and `parallel_tool_calls` ([`oxgen::prepare::tools`]).
pub(crate) fn tools(body: &Value) -> Result<Option<Tools>, ApiError> {
    Ok(oxgen::prepare::tools(body)?)
}

/// `chat_template_kwargs`: extra arguments for the chat template, as vLLM takes them
/// (`{"enable_thinking": false}`); the names the render sets itself are refused.
pub(crate) fn template_kwargs(body: &Value) -> Result<Map<String, Value>, ApiError> {
    const PARAM: &str = "chat_template_kwargs";
    match body.get(PARAM) {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(map)) => {
            match (map.keys()).find(|k| ChatTemplate::RESERVED.contains(&k.as_str())) {
                Some(k) => Err(ApiError::invalid(
                    format!("{PARAM}.{k}"),
                    format!("{PARAM} may not set '{k}': give it as the request's own field"),
                )),
                None => Ok(map.clone()),
            }
        }
        Some(_) => Err(ApiError::invalid(
            PARAM,
            "chat_template_kwargs must be an object, e.g. {\"enable_thinking\": false}",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxgen::ToolFormat;

    /// Twelve families' chat templates (Gemma 2, Phi-3.5, Qwen2.5, Qwen3, Llama 3.1-3.3,
    /// SmolLM3, Granite 3.3, Mistral Nemo, Nemotron Nano 2, gpt-oss) on eleven request bodies,
    /// parsed as a chat request is and rendered as the server renders them, against
    /// transformers' `apply_chat_template` on the same bodies (the committed
    /// `make_expected.py` wrote them): the same text byte for byte, or a refusal where the
    /// template refuses. Tools are compared where the template renders them in a call format
    /// oxgen parses; for the others oxgen describes the tools itself.
    #[test]
    fn chat_templates_render_as_transformers_does() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../testkit/thirdparty/chat_templates"
        );
        let expected: Value =
            serde_json::from_str(&std::fs::read_to_string(format!("{dir}/expected.json")).unwrap())
                .unwrap();
        // The frozen clock make_expected.py gave strftime_now, as today's date.
        let today = jiff::Zoned::now();
        let dates = [
            ("February 03, 2031", "%B %d, %Y"),
            ("03 Feb 2031", "%d %b %Y"),
            ("2031-02-03", "%Y-%m-%d"),
        ]
        .map(|(frozen, format)| (frozen, today.strftime(format).to_string()));
        let (mut compared, mut refused) = (0, 0);
        let templates = expected["templates"].as_object().unwrap();
        for (name, t) in templates {
            let source = std::fs::read_to_string(format!("{dir}/templates/{name}.jinja")).unwrap();
            let special = |k: &str| t[k].as_str().unwrap_or_default().to_string();
            let template =
                ChatTemplate::new(&source, &special("bos_token"), &special("eos_token")).unwrap();
            let format = ToolFormat::detect(Some(&source));
            for (case, body) in expected["cases"].as_object().unwrap() {
                let tools = tools(body).unwrap().map(|t| t.with_format(format));
                if tools.is_some() && format == ToolFormat::Json {
                    continue;
                }
                let messages: Vec<Map<String, Value>> =
                    serde_json::from_value(body["messages"].clone()).unwrap();
                let messages = chat_messages(messages, &mut Unknown::new(true)).unwrap();
                let kwargs = template_kwargs(body).unwrap();
                let generation = body["add_generation_prompt"].as_bool().unwrap_or(true);
                let ours = template.render_with(&messages, tools.as_ref(), generation, &kwargs);
                let theirs = &t["rendered"][case];
                match (ours, theirs["text"].as_str()) {
                    (Ok(text), Some(want)) => {
                        let want = dates.iter().fold(want.to_string(), |w, (frozen, today)| {
                            w.replace(frozen, today)
                        });
                        assert_eq!(text, want, "{name}, {case}");
                        compared += 1;
                    }
                    (Err(e), None) => {
                        let why = theirs["error"].as_str().unwrap();
                        assert!(e.to_string().contains(why), "{name}, {case}: {e} / {why}");
                        refused += 1;
                    }
                    (ours, _) => panic!("{name}, {case}: oxgen {ours:?}, transformers {theirs}"),
                }
            }
        }
        assert!(
            compared >= 120 && refused >= 3,
            "{compared} compared, {refused} refused"
        );
    }
}
