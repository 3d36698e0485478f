//! Request bodies: parsed strictly (a field this server does not know is a 400 naming it),
//! validated, and turned into what the engine runs.

use std::collections::BTreeMap;

use oxgen::{
    Constraint, GenerateOptions, Param, Prompt, SamplingParams, SamplingRequest, fresh_seed,
};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::ApiError;

mod chat;
pub(crate) use chat::{Tools, chat_messages, template_kwargs, tools};

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
