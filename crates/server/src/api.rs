//! Request bodies: parsed strictly (a field this server does not know is a 400 naming it),
//! validated, and turned into what the engine runs.

use std::collections::BTreeMap;

use oxgen::{
    ChatMessage, ChatTemplate, Constraint, GenerateOptions, Param, Prompt, SamplingParams,
    SamplingRequest, Tool, ToolCall, ToolChoice, ToolFormat, ToolSet, fresh_seed,
};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::ApiError;

/// Fields both completion endpoints take.
const COMMON_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "user",
    "ignore_eos",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "grammar",
];

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
];

const COMPLETION_FIELDS: &[&str] = &["prompt", "logprobs"];

/// At most this many stop strings (OpenAI's limit).
const MAX_STOP: usize = 4;
/// At most this many alternatives per token.
pub const MAX_TOP_LOGPROBS: usize = 20;

#[derive(Deserialize)]
struct Common {
    model: String,
    max_tokens: Option<i64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    n: Option<i64>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    stop: Option<Value>,
    seed: Option<i64>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    repetition_penalty: Option<f64>,
    logit_bias: Option<BTreeMap<String, f64>>,
    #[allow(dead_code)]
    user: Option<String>,
    ignore_eos: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
}

#[derive(Deserialize)]
struct ChatFields {
    messages: Vec<Map<String, Value>>,
    max_completion_tokens: Option<i64>,
    logprobs: Option<bool>,
    top_logprobs: Option<i64>,
}

#[derive(Deserialize)]
struct CompletionFields {
    prompt: Value,
    logprobs: Option<i64>,
}

/// A completion request, validated.
#[derive(Debug)]
pub struct Request {
    pub model: String,
    pub prompt: Prompt,
    /// Sampling and stopping; `max_new_tokens` is set once the prompt length is known.
    pub options: GenerateOptions,
    /// `max_tokens` as asked, if it was.
    pub max_tokens: Option<usize>,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// Alternatives per token when log-probabilities were asked for.
    pub top_logprobs: Option<usize>,
    /// The constraint asked for, and the field that asked (named when it does not compile).
    pub constraint: Option<(String, Constraint)>,
    /// The tools offered (chat only).
    pub tools: Option<Tools>,
    /// Extra arguments for the chat template (chat only).
    pub template_kwargs: Map<String, Value>,
}

/// A chat request's `tools`, `tool_choice` and `parallel_tool_calls`.
#[derive(Debug, Clone)]
pub struct Tools {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    pub parallel: bool,
}

impl Tools {
    /// The set the model gets, in the model's call format.
    pub fn with_format(self, format: ToolFormat) -> ToolSet {
        ToolSet {
            tools: self.tools,
            choice: self.choice,
            parallel: self.parallel,
            format,
        }
    }
}

/// What requests are checked against.
pub struct Bounds<'a> {
    pub defaults: &'a SamplingParams,
    pub vocab: usize,
    /// `n` at most.
    pub max_n: usize,
    pub max_tokens_limit: usize,
}

/// The body as a JSON object.
pub fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::invalid(
            "",
            "the request body must be a JSON object",
        )),
        Err(e) => Err(ApiError::invalid(
            "",
            format!("the request body is not valid JSON: {e}"),
        )),
    }
}

/// Deserializes `value` as `T`, naming the field at fault. Reads through the reference, so
/// each struct pulled from one body copies only the fields it keeps.
pub fn typed<'de, T: Deserialize<'de>>(value: &'de Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let param = if path == "." { String::new() } else { path };
        ApiError::invalid(param.clone(), format!("{param}: {}", e.into_inner()))
    })
}

/// Rejects keys outside `known`, naming the first.
pub fn known_fields(map: &Map<String, Value>, known: &[&[&str]]) -> Result<(), ApiError> {
    match map
        .keys()
        .find(|k| !known.iter().any(|set| set.contains(&k.as_str())))
    {
        Some(k) => Err(ApiError::invalid(
            k.clone(),
            format!("unsupported field '{k}': this server does not implement it"),
        )),
        None => Ok(()),
    }
}

fn range(param: &str, v: f64, lo: f64, hi: f64) -> Result<f32, ApiError> {
    if (lo..=hi).contains(&v) {
        Ok(v as f32)
    } else {
        Err(ApiError::invalid(
            param,
            format!("{param} must be between {lo} and {hi}, got {v}"),
        ))
    }
}

fn count(param: &str, v: i64, lo: i64, hi: usize) -> Result<usize, ApiError> {
    if v >= lo && v as u64 <= hi as u64 {
        Ok(v as usize)
    } else {
        Err(ApiError::invalid(
            param,
            format!("{param} must be between {lo} and {hi}, got {v}"),
        ))
    }
}

/// A float sampling value checked by its parameter's one range check.
fn param(which: Param, v: Option<f32>) -> Result<Option<f32>, ApiError> {
    v.map(|v| {
        which
            .check(v)
            .map_err(|m| ApiError::invalid(which.name(), m))
    })
    .transpose()
}

fn stop_strings(stop: Option<Value>) -> Result<Vec<String>, ApiError> {
    let strings = match stop {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                _ => Err(ApiError::invalid(
                    "stop",
                    "stop must be a string or strings",
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::invalid(
                "stop",
                "stop must be a string or an array of strings",
            ));
        }
    };
    if strings.len() > MAX_STOP {
        return Err(ApiError::invalid(
            "stop",
            format!("at most {MAX_STOP} stop strings, got {}", strings.len()),
        ));
    }
    if strings.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "a stop string is empty"));
    }
    Ok(strings)
}

impl Common {
    /// Everything but the prompt and the log-probabilities.
    fn into_request(
        self,
        prompt: Prompt,
        max_tokens: Option<i64>,
        top_logprobs: Option<usize>,
        bounds: &Bounds,
    ) -> Result<Request, ApiError> {
        let n = count("n", self.n.unwrap_or(1), 1, bounds.max_n)?;
        // OpenAI's documented bounds for these two; every range check proper is `Param`'s.
        let temperature = self
            .temperature
            .map(|t| range("temperature", t, 0.0, 2.0))
            .transpose()?;
        let mut logit_bias = Vec::new();
        for (key, bias) in self.logit_bias.unwrap_or_default() {
            let id = key
                .parse::<u32>()
                .ok()
                .filter(|&id| (id as usize) < bounds.vocab);
            let Some(id) = id else {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!(
                        "logit_bias key '{key}' is not a token id below {}",
                        bounds.vocab
                    ),
                ));
            };
            logit_bias.push((id, range("logit_bias", bias, -100.0, 100.0)?));
        }
        let request = SamplingRequest {
            temperature: param(Param::Temperature, temperature)?,
            top_k: self
                .top_k
                .map(|k| count("top_k", k, 0, bounds.vocab))
                .transpose()?,
            top_p: param(Param::TopP, self.top_p.map(|v| v as f32))?,
            min_p: param(Param::MinP, self.min_p.map(|v| v as f32))?,
            repetition_penalty: param(
                Param::RepetitionPenalty,
                self.repetition_penalty.map(|v| v as f32),
            )?,
            frequency_penalty: param(
                Param::FrequencyPenalty,
                self.frequency_penalty.map(|v| v as f32),
            )?,
            presence_penalty: param(
                Param::PresencePenalty,
                self.presence_penalty.map(|v| v as f32),
            )?,
            logit_bias,
            seed: self.seed.map(|v| v as u64),
            choices: n,
            greedy: false,
        };
        let s = request
            .resolve(bounds.defaults, fresh_seed())
            .map_err(|e| ApiError::invalid("", e.to_string()))?;
        let max_tokens = max_tokens
            .map(|m| count("max_tokens", m, 1, bounds.max_tokens_limit))
            .transpose()
            .map_err(|mut e| {
                e.message.push_str(" (this server's --max-tokens-limit)");
                e
            })?;
        let stream = self.stream.unwrap_or(false);
        if self.stream_options.is_some() && !stream {
            return Err(ApiError::invalid(
                "stream_options",
                "stream_options is only allowed with stream: true",
            ));
        }
        Ok(Request {
            model: self.model,
            prompt,
            options: GenerateOptions {
                max_new_tokens: 0,
                sampling: s,
                stop: stop_strings(self.stop)?,
                ignore_eos: self.ignore_eos.unwrap_or(false),
                cancel: None,
                constraint: None,
                keep_special: false,
                spec_tokens: None,
            },
            max_tokens,
            n,
            stream,
            include_usage: self
                .stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
            top_logprobs,
            constraint: None,
            tools: None,
            template_kwargs: Map::new(),
        })
    }
}

/// A chat message's text: a string, or text parts.
fn message_text(content: Option<&Value>, at: &str) -> Result<String, ApiError> {
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
/// message's `name` is accepted and ignored.
pub(crate) fn chat_messages(
    messages: Vec<Map<String, Value>>,
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
            if let Some(k) = m.keys().find(|k| !FIELDS.contains(&k.as_str())) {
                return Err(ApiError::invalid(
                    format!("{at}.{k}"),
                    format!("unsupported message field '{k}'"),
                ));
            }
            let role = match m.get("role").and_then(Value::as_str) {
                Some("developer") => "system",
                Some(r @ ("system" | "user" | "assistant" | "tool")) => r,
                other => {
                    return Err(ApiError::invalid(
                        format!("{at}.role"),
                        format!(
                            "role {} is not supported; use system, developer, user, assistant or tool",
                            other.map_or("(missing)".into(), |r| format!("'{r}'"))
                        ),
                    ));
                }
            };
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
                let id = m.get("tool_call_id").and_then(Value::as_str).ok_or_else(|| {
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

/// A function name as OpenAI allows it: 1-64 of `a-z A-Z 0-9 _ -`.
fn function_name(param: &str, v: Option<&Value>) -> Result<String, ApiError> {
    let name = string(param, v.unwrap_or(&Value::Null))?;
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(name)
    } else {
        Err(ApiError::invalid(
            param,
            format!("{param} must be 1 to 64 of a-z, A-Z, 0-9, _ and -, got {name:?}"),
        ))
    }
}

/// `tools`, `tool_choice` and `parallel_tool_calls`. Without tools, `tool_choice` may only
/// be `none`.
pub(crate) fn tools(body: &Value) -> Result<Option<Tools>, ApiError> {
    let list = match body.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items.clone(),
        Some(_) => return Err(ApiError::invalid("tools", "tools must be an array")),
    };
    let mut tools: Vec<Tool> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::invalid(
                format!("{at}.type"),
                "only tools of type 'function' are supported",
            ));
        }
        let Some(function) = t.get("function").and_then(Value::as_object) else {
            return Err(ApiError::invalid(
                format!("{at}.function"),
                "a tool needs function: {name, description, parameters}",
            ));
        };
        let name = function_name(&format!("{at}.function.name"), function.get("name"))?;
        if tools.iter().any(|t| t.name == name) {
            return Err(ApiError::invalid(
                format!("{at}.function.name"),
                format!("two tools are named '{name}'"),
            ));
        }
        let parameters = match function.get("parameters") {
            None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return Err(ApiError::invalid(
                    format!("{at}.function.parameters"),
                    "parameters must be a JSON schema object",
                ));
            }
        };
        let description = match function.get("description") {
            None | Some(Value::Null) => None,
            Some(d) => Some(string(&format!("{at}.function.description"), d)?),
        };
        tools.push(Tool {
            name,
            description,
            parameters,
        });
    }
    let choice = match body.get("tool_choice") {
        None | Some(Value::Null) if tools.is_empty() => ToolChoice::None,
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "tool_choice '{other}' is not one of none, auto, required or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                    ),
                ));
            }
        },
        Some(v) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"));
            let name = function_name("tool_choice.function.name", name)?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("tool_choice names '{name}', which is not among the tools"),
                ));
            }
            ToolChoice::Function(name)
        }
    };
    if tools.is_empty() && choice != ToolChoice::None {
        return Err(ApiError::invalid(
            "tool_choice",
            "tool_choice needs tools to choose from",
        ));
    }
    let parallel = match body.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::invalid(
                "parallel_tool_calls",
                "parallel_tool_calls must be a boolean",
            ));
        }
    };
    Ok((!tools.is_empty()).then_some(Tools {
        tools,
        choice,
        parallel,
    }))
}

/// A JSON schema given as an object, or as a string holding one (vLLM accepts both).
fn schema(param: &str, v: &Value) -> Result<Value, ApiError> {
    let parsed = match v {
        Value::String(s) => serde_json::from_str(s)
            .map_err(|e| ApiError::invalid(param, format!("{param} is not valid JSON: {e}")))?,
        other => other.clone(),
    };
    match parsed {
        Value::Object(_) | Value::Bool(_) => Ok(parsed),
        _ => Err(ApiError::invalid(
            param,
            format!("{param} must be a JSON schema (an object)"),
        )),
    }
}

fn string(param: &str, v: &Value) -> Result<String, ApiError> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| ApiError::invalid(param, format!("{param} must be a string")))
}

fn choices(param: &str, v: &Value) -> Result<Vec<String>, ApiError> {
    let items = v.as_array().filter(|a| !a.is_empty()).ok_or_else(|| {
        ApiError::invalid(
            param,
            format!("{param} must be a non-empty array of strings"),
        )
    })?;
    items.iter().map(|c| string(param, c)).collect()
}

/// The one constraint a request asks for: `response_format` (OpenAI), `structured_outputs`
/// (vLLM) or vLLM's older `guided_*` fields. Giving two is a 400, as is llama.cpp's GBNF
/// `grammar`.
fn constraint(body: &Value) -> Result<Option<(String, Constraint)>, ApiError> {
    let mut found: Vec<(String, Constraint)> = Vec::new();
    if let Some(f) = body.get("response_format").filter(|v| !v.is_null()) {
        let kind = f.get("type").and_then(Value::as_str);
        match kind {
            Some("text") => {}
            Some("json_object") => found.push(("response_format".into(), Constraint::JsonObject)),
            Some("json_schema") => {
                let param = "response_format.json_schema.schema";
                let spec = f.get("json_schema").ok_or_else(|| {
                    ApiError::invalid(
                        "response_format.json_schema",
                        "response_format of type json_schema needs json_schema: {name, schema}",
                    )
                })?;
                let s = spec
                    .get("schema")
                    .map_or(Ok(Value::Bool(true)), |s| schema(param, s))?;
                found.push((param.into(), Constraint::JsonSchema(s)));
            }
            _ => {
                return Err(ApiError::invalid(
                    "response_format.type",
                    "response_format.type must be text, json_object or json_schema",
                ));
            }
        }
    }
    if let Some(so) = body.get("structured_outputs").filter(|v| !v.is_null()) {
        let Some(map) = so.as_object() else {
            return Err(ApiError::invalid(
                "structured_outputs",
                "structured_outputs must be an object with one of json, regex, choice, grammar",
            ));
        };
        for (key, v) in map {
            let param = format!("structured_outputs.{key}");
            let c = match key.as_str() {
                "json" => Constraint::JsonSchema(schema(&param, v)?),
                "regex" => Constraint::Regex(string(&param, v)?),
                "choice" => Constraint::Choice(choices(&param, v)?),
                "grammar" => Constraint::Lark(string(&param, v)?),
                _ => {
                    return Err(ApiError::invalid(
                        param,
                        format!(
                            "unsupported structured_outputs field '{key}'; use json, regex, choice or grammar"
                        ),
                    ));
                }
            };
            found.push((param, c));
        }
    }
    for key in [
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
    ] {
        let Some(v) = body.get(key).filter(|v| !v.is_null()) else {
            continue;
        };
        let c = match key {
            "guided_json" => Constraint::JsonSchema(schema(key, v)?),
            "guided_regex" => Constraint::Regex(string(key, v)?),
            "guided_choice" => Constraint::Choice(choices(key, v)?),
            _ => Constraint::Lark(string(key, v)?),
        };
        found.push((key.into(), c));
    }
    if body.get("grammar").is_some_and(|v| !v.is_null()) {
        return Err(ApiError::invalid(
            "grammar",
            "GBNF grammars (llama.cpp's grammar field) are not supported; send a Lark grammar \
             in structured_outputs.grammar",
        ));
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        return Err(ApiError::invalid(
            &found[1].0,
            format!("give one constraint, not several ({})", names.join(", ")),
        ));
    }
    Ok(found.pop())
}

/// `POST /v1/chat/completions`.
pub fn chat(body: &[u8], bounds: &Bounds) -> Result<Request, ApiError> {
    let map = object(body)?;
    known_fields(&map, &[COMMON_FIELDS, CHAT_FIELDS])?;
    let value = Value::Object(map);
    let common: Common = typed(&value)?;
    let chat: ChatFields = typed(&value)?;
    let top_logprobs = match (chat.logprobs.unwrap_or(false), chat.top_logprobs) {
        (true, top) => Some(count(
            "top_logprobs",
            top.unwrap_or(0),
            0,
            MAX_TOP_LOGPROBS,
        )?),
        (false, Some(_)) => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ));
        }
        (false, None) => None,
    };
    let max_tokens = chat.max_completion_tokens.or(common.max_tokens);
    let prompt = Prompt::Chat(chat_messages(chat.messages)?);
    let mut request = common.into_request(prompt, max_tokens, top_logprobs, bounds)?;
    request.constraint = constraint(&value)?;
    request.tools = tools(&value)?;
    request.template_kwargs = template_kwargs(&value)?;
    Ok(request)
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

/// `POST /v1/completions`: the prompt is a string or token ids (or a list of one of them).
pub fn completion(body: &[u8], bounds: &Bounds) -> Result<Request, ApiError> {
    let map = object(body)?;
    known_fields(&map, &[COMMON_FIELDS, COMPLETION_FIELDS])?;
    let value = Value::Object(map);
    let common: Common = typed(&value)?;
    let fields: CompletionFields = typed(&value)?;
    let prompt = completion_prompt(fields.prompt, bounds.vocab)?;
    let top_logprobs = fields
        .logprobs
        .map(|n| count("logprobs", n, 0, MAX_TOP_LOGPROBS))
        .transpose()?;
    let max_tokens = common.max_tokens;
    let mut request = common.into_request(prompt, max_tokens, top_logprobs, bounds)?;
    request.constraint = constraint(&value)?;
    Ok(request)
}

fn completion_prompt(prompt: Value, vocab: usize) -> Result<Prompt, ApiError> {
    let bad = || {
        ApiError::invalid(
            "prompt",
            "prompt must be a string or an array of token ids (batches of prompts are not supported)",
        )
    };
    match prompt {
        Value::String(s) => Ok(Prompt::Text(s)),
        Value::Array(items) if items.len() == 1 && !items[0].is_number() => {
            completion_prompt(items.into_iter().next().expect("one item"), vocab)
        }
        Value::Array(items) if items.iter().all(Value::is_number) => {
            let ids = items
                .iter()
                .map(|v| v.as_u64().filter(|&id| (id as usize) < vocab))
                .collect::<Option<Vec<u64>>>()
                .ok_or_else(|| {
                    ApiError::invalid(
                        "prompt",
                        format!("token ids must be integers below {vocab}"),
                    )
                })?;
            Ok(Prompt::Tokens(
                ids.into_iter().map(|id| id as u32).collect(),
            ))
        }
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                let messages = chat_messages(messages).unwrap();
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
