//! Request bodies: validated and turned into what the engine runs. A field this server does
//! not implement is ignored and named back ([`Unknown`]), or a 400 naming it under
//! `--strict-api`; a field whose meaning it cannot honour without changing the answer
//! ([`REFUSED`]) is a 400 either way. `null` is "absent" for every optional field.

use std::collections::BTreeMap;

use oxgen::{
    Constraint, GenerateOptions, Param, Prompt, SamplingParams, SamplingRequest, fresh_seed,
};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::ApiError;

mod anthropic;
mod chat;
mod completion;
mod ollama;
mod responses;
pub use anthropic::messages;
pub use chat::chat;
pub(crate) use chat::{Tools, chat_messages, template_kwargs, tools};
pub use completion::completion;
pub use ollama::{ollama_chat, ollama_generate};
pub use responses::responses;

/// Fields both completion endpoints take beyond [`Common`]'s: the constraint's, read by
/// [`constraint`].
const CONSTRAINT_FIELDS: &[&str] = &[
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "grammar",
];

/// The field names serde reads into the struct `T`: its own list, so no list repeats it.
fn fields<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    /// A deserializer that only notes the fields a struct asks for.
    struct Fields(&'static [&'static str]);
    impl<'de> serde::Deserializer<'de> for &mut Fields {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: serde::de::Visitor<'de>>(
            self,
            _: V,
        ) -> Result<V::Value, Self::Error> {
            Err(serde::de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            self.0 = fields;
            Err(serde::de::Error::custom("fields noted"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut noted = Fields(&[]);
    let _ = T::deserialize(&mut noted);
    noted.0
}

/// Keys of `stream_options`: vLLM's `continuous_usage_stats` is accepted and has no effect.
const STREAM_OPTIONS: &[&str] = &["include_usage", "continuous_usage_stats"];

/// Fields refused even when unknown fields are ignored: honouring them would change the
/// answer, and ignoring them would hand back one the client did not ask for.
const REFUSED: &[(&str, &str)] = &[
    ("audio", "audio output is not supported"),
    (
        "functions",
        "the legacy 'functions' field is not supported; send 'tools'",
    ),
    (
        "function_call",
        "the legacy 'function_call' field is not supported; send 'tool_choice'",
    ),
    ("suffix", "insertion ('suffix') is not supported"),
    ("web_search_options", "web search is not supported"),
];

/// At most this many stop strings (OpenAI allows 4; coding assistants send 6-9).
pub const MAX_STOP: usize = 64;
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
    stream_options: Option<Map<String, Value>>,
    stop: Option<Value>,
    stop_token_ids: Option<Vec<u32>>,
    min_tokens: Option<i64>,
    include_stop_str_in_output: Option<bool>,
    skip_special_tokens: Option<bool>,
    seed: Option<i64>,
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    repetition_penalty: Option<f64>,
    logit_bias: Option<BTreeMap<String, f64>>,
    #[allow(dead_code)]
    user: Option<String>,
    /// How long the model stays in memory after this request (ollama's; read by the routes
    /// before the body is parsed, when they pick the model).
    #[allow(dead_code)]
    keep_alive: Option<Value>,
    ignore_eos: Option<bool>,
    /// OpenAI's cache routing key: here, a prompt to keep in the prefix cache longer.
    prompt_cache_key: Option<String>,
    close_objects: Option<bool>,
    close_structured_output: Option<bool>,
}

/// How a chat's messages are rendered (vLLM's names): with the template's generation prompt
/// (the default), or continuing the last (assistant) message where it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Render {
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
}

/// A completion request, validated.
#[derive(Debug)]
pub struct Request {
    pub model: String,
    /// One prompt (chat; a completion's string or ids) or a completion's batch of them.
    pub prompts: Vec<Prompt>,
    /// Sampling and stopping; `max_new_tokens` is set once the prompt length is known.
    pub options: GenerateOptions,
    /// `max_tokens` as asked, if it was (0: nothing is generated, as for scoring a prompt).
    pub max_tokens: Option<usize>,
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// Alternatives per token when log-probabilities were asked for.
    pub top_logprobs: Option<usize>,
    /// Completions: the prompt is part of each choice's text (and of its log-probabilities).
    pub echo: bool,
    /// Alternatives per prompt token when the prompt's log-probabilities are wanted (`echo`
    /// with `logprobs`, or vLLM's `prompt_logprobs`).
    pub prompt_logprobs: Option<usize>,
    /// Chat: how the messages are rendered.
    pub render: Render,
    /// Chat: the reasoning effort asked for (`reasoning_effort` or `reasoning.effort`).
    pub reasoning_effort: Option<String>,
    /// Chat: the predicted output's text, proposed for speculative decoding.
    pub prediction: Option<String>,
    /// Chat: tokens the reply may spend reasoning before its reasoning block is closed
    /// (vLLM's `thinking_token_budget`).
    pub reasoning_budget: Option<usize>,
    /// Fields given that this server does not implement (ignored).
    pub ignored: Vec<String>,
    /// The constraint asked for, and the field that asked (named when it does not compile).
    pub constraint: Option<(String, Constraint)>,
    /// The tools offered (chat only).
    pub tools: Option<Tools>,
    /// Extra arguments for the chat template (chat only).
    pub template_kwargs: Map<String, Value>,
    /// Ollama's `num_ctx`: the prompt and the reply together fit in this many positions.
    pub num_ctx: Option<usize>,
    /// The JSON schema constraint said `strict: true`.
    pub strict_schema: bool,
    /// oxgen's `close_objects`: close (or leave open) every object of this request's schema
    /// and tools, whatever the server's `--close-objects` says.
    pub close_objects: Option<bool>,
    /// oxgen's `close_structured_output` (default true): a constrained reply is closed before
    /// the limit cuts it.
    pub close_structured_output: bool,
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

/// A completion request's body: its fields outside [`Common`]'s, the constraint's and `own`
/// go to the
/// returned [`Unknown`] (or a 400 when `strict`); then the common fields and the endpoint's
/// own, `T`, typed.
fn parse<T: for<'de> Deserialize<'de>>(
    body: &[u8],
    own: &[&str],
    strict: bool,
) -> Result<(Value, Common, T, Unknown), ApiError> {
    let map = object(body)?;
    let mut unknown = Unknown::new(strict);
    unknown.check(&map, "", &[fields::<Common>(), CONSTRAINT_FIELDS, own])?;
    let value = Value::Object(map);
    let common: Common = typed(&value)?;
    let fields: T = typed(&value)?;
    Ok((value, common, fields, unknown))
}

/// The fields of a request this server does not implement: collected (and answered in the
/// `x-oxgen-ignored-fields` header) by default, a 400 naming the first with `strict`.
#[derive(Debug, Default)]
pub struct Unknown {
    strict: bool,
    /// Their paths (`reasoning_effort`, `messages[2].refusal`), in the order met.
    pub names: Vec<String>,
}

impl Unknown {
    pub fn new(strict: bool) -> Unknown {
        Unknown {
            strict,
            names: Vec::new(),
        }
    }

    /// Checks the keys of `map` (at `at`: empty at the top, else a path like `messages[0]`)
    /// against `known`; [`REFUSED`] fields are a 400 wherever they are met, `null` ones are
    /// absent.
    pub fn check(
        &mut self,
        map: &Map<String, Value>,
        at: &str,
        known: &[&[&str]],
    ) -> Result<(), ApiError> {
        for (key, value) in map {
            if value.is_null() || known.iter().any(|set| set.contains(&key.as_str())) {
                continue;
            }
            let path = if at.is_empty() {
                key.clone()
            } else {
                format!("{at}.{key}")
            };
            if let Some((_, why)) = REFUSED.iter().find(|(k, _)| k == key) {
                return Err(ApiError::invalid(&path, format!("{path}: {why}")));
            }
            if self.strict {
                return Err(ApiError::invalid(
                    &path,
                    format!(
                        "unsupported field '{path}': this server does not implement it (it runs \
                         with --strict-api; without it such fields are ignored)"
                    ),
                ));
            }
            self.names.push(path);
        }
        Ok(())
    }
}

/// A message's `role` (the message at `at`), one of `allowed`; `developer` is taken as
/// `system` where `allowed` names it. Another is a 400 listing them.
fn role<'m>(m: &'m Map<String, Value>, at: &str, allowed: &[&str]) -> Result<&'m str, ApiError> {
    match m.get("role").and_then(Value::as_str) {
        Some("developer") if allowed.contains(&"developer") => Ok("system"),
        Some(r) if allowed.contains(&r) => Ok(r),
        other => Err(ApiError::invalid(
            format!("{at}.role"),
            format!(
                "role {} is not supported; use {}",
                other.map_or("(missing)".into(), |r| format!("'{r}'")),
                allowed.join(", ")
            ),
        )),
    }
}

/// A protocol's flat function tools (`{type, name, description, SCHEMA, strict}`, the
/// schema under `schema_key`) in chat completions' shape, for [`tools`] to validate; a tool
/// whose `type` `is_function` refuses is a 400 saying `refusal(type)`. Anything but a list
/// is passed on for [`tools`] to refuse.
fn flat_tools(
    tools: &Value,
    schema_key: &str,
    is_function: impl Fn(Option<&str>) -> bool,
    refusal: impl Fn(Option<&str>) -> String,
) -> Result<Value, ApiError> {
    let Value::Array(list) = tools else {
        return Ok(tools.clone());
    };
    let mut chat = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let kind = t.get("type").and_then(Value::as_str);
        if !is_function(kind) {
            let at = format!("tools[{i}]");
            return Err(ApiError::invalid(
                format!("{at}.type"),
                format!("{at}: {}", refusal(kind)),
            ));
        }
        let mut function = Map::new();
        for (from, to) in [
            ("name", "name"),
            ("description", "description"),
            (schema_key, "parameters"),
            ("strict", "strict"),
        ] {
            if let Some(v) = t.get(from) {
                function.insert(to.into(), v.clone());
            }
        }
        chat.push(serde_json::json!({"type": "function", "function": function}));
    }
    Ok(Value::Array(chat))
}

/// `e` with the field names of another protocol: each `(from, to)` replaced in its `param`
/// and message (its checks are chat completions', its names the caller's).
fn renamed(mut e: ApiError, names: &[(&str, &str)]) -> ApiError {
    for (from, to) in names {
        e.message = e.message.replace(from, to);
        e.param = e.param.map(|p| p.replace(from, to));
    }
    e
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
    // An empty stop string would end every generation at once: it is no stop.
    Ok(strings.into_iter().filter(|s| !s.is_empty()).collect())
}

impl Common {
    /// Everything but the prompt and the log-probabilities; `min_max_tokens` is the least
    /// `max_tokens` the endpoint takes.
    fn into_request(
        self,
        prompts: Vec<Prompt>,
        (max_tokens, min_max_tokens): (Option<i64>, i64),
        top_logprobs: Option<usize>,
        bounds: &Bounds,
        unknown: &mut Unknown,
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
            .map(|m| count("max_tokens", m, min_max_tokens, bounds.max_tokens_limit))
            .transpose()
            .map_err(|mut e| {
                e.message.push_str(" (this server's --max-tokens-limit)");
                e
            })?;
        let stream = self.stream.unwrap_or(false);
        let stream_options = self.stream_options.unwrap_or_default();
        if !stream_options.is_empty() && !stream && unknown.strict {
            return Err(ApiError::invalid(
                "stream_options",
                "stream_options is only allowed with stream: true",
            ));
        }
        unknown.check(&stream_options, "stream_options", &[STREAM_OPTIONS])?;
        let include_usage = boolean(
            "stream_options.include_usage",
            stream_options.get("include_usage"),
            false,
        )?;
        let stop_ids = self.stop_token_ids.unwrap_or_default();
        token_ids("stop_token_ids", &stop_ids, bounds.vocab)?;
        let min_new_tokens = self
            .min_tokens
            .map(|m| count("min_tokens", m, 0, bounds.max_tokens_limit))
            .transpose()?
            .unwrap_or(0);
        Ok(Request {
            model: self.model,
            prompts,
            options: GenerateOptions {
                max_new_tokens: 0,
                sampling: s,
                stop: stop_strings(self.stop)?,
                stop_ids,
                min_new_tokens,
                include_stop: self.include_stop_str_in_output.unwrap_or(false),
                reasoning_budget: None,
                ignore_eos: self.ignore_eos.unwrap_or(false),
                cancel: None,
                constraint: None,
                keep_special: self.skip_special_tokens == Some(false),
                spec_tokens: None,
                prediction: Vec::new(),
                keep_prefix: self.prompt_cache_key.is_some(),
                adapter: None,
            },
            max_tokens,
            n,
            stream,
            include_usage: stream && include_usage,
            top_logprobs,
            echo: false,
            prompt_logprobs: None,
            render: Render {
                add_generation_prompt: true,
                continue_final_message: false,
            },
            reasoning_effort: None,
            prediction: None,
            reasoning_budget: None,
            ignored: Vec::new(),
            constraint: None,
            tools: None,
            template_kwargs: Map::new(),
            num_ctx: None,
            strict_schema: false,
            close_objects: self.close_objects,
            close_structured_output: self.close_structured_output.unwrap_or(true),
        })
    }
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

/// Whether `response_format` is a JSON schema that says `strict: true`.
fn strict_schema(body: &Value) -> bool {
    body.pointer("/response_format/json_schema/strict") == Some(&Value::Bool(true))
}

/// Checks that every id of `ids` (the field `param`) is below the vocabulary size.
pub(crate) fn token_ids(param: &str, ids: &[u32], vocab: usize) -> Result<(), ApiError> {
    match ids.iter().find(|&&id| id as usize >= vocab) {
        Some(bad) => Err(ApiError::invalid(
            param,
            format!("{param}: token id {bad} is not below the vocabulary size {vocab}"),
        )),
        None => Ok(()),
    }
}

/// An optional boolean field: `default` when absent or `null`.
pub(crate) fn boolean(param: &str, v: Option<&Value>, default: bool) -> Result<bool, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid(
            param,
            format!("{param} must be a boolean"),
        )),
    }
}

pub(crate) fn string(param: &str, v: &Value) -> Result<String, ApiError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The common fields are read from `Common` itself: every one of them, in its order.
    #[test]
    fn the_common_fields_are_the_structs_own() {
        let names = fields::<Common>();
        assert_eq!(names.first(), Some(&"model"));
        assert_eq!(names.last(), Some(&"close_structured_output"));
        assert_eq!(names.len(), 25, "{names:?}");
        assert!(names.contains(&"logit_bias") && names.contains(&"stop_token_ids"));
        assert!(names.contains(&"keep_alive") && names.contains(&"prompt_cache_key"));
    }
}
