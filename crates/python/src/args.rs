//! What the Python arguments become: prompts, chat messages, and the keywords of
//! `generate`, `stream`, `generate_batch` and `Chat.send`, read in one place ([`keywords`])
//! and prepared as the server prepares a request ([`Keywords::prepare`]).

use oxgen::{
    ChatMessage, Constraint, GenerateOptions, Model as Inner, Param, Prompt, ReplySyntax,
    SamplingRequest, fresh_seed,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::{error, invalid};

/// The sampling keywords `generate`, `stream`, `generate_batch` and `Chat.send` take.
pub(crate) const KEYWORDS: &[&str] = &[
    "max_new_tokens",
    "adapter",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "seed",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "stop",
    "ignore_eos",
    "json_schema",
    "json_object",
    "regex",
    "grammar",
    "choice",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning_effort",
];

pub(crate) fn extract<'py, T: FromPyObjectOwned<'py>>(
    key: &str,
    v: &Bound<'py, PyAny>,
) -> PyResult<T> {
    v.extract::<T>().map_err(|e| {
        let e: PyErr = e.into();
        invalid(format!("{key}: {e}"))
    })
}

/// A float keyword checked by its parameter's one range check.
pub(crate) fn param(which: Param, v: &Bound<'_, PyAny>) -> PyResult<f32> {
    which
        .check(extract::<f32>(which.name(), v)?)
        .map_err(invalid)
}

/// Extra chat template arguments: a dict of what `json.dumps` takes.
pub(crate) fn template_kwargs(
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<serde_json::Map<String, serde_json::Value>> {
    let Some(kwargs) = kwargs else {
        return Ok(serde_json::Map::new());
    };
    match serde_json::from_str(&json_dumps(kwargs.as_any())?) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        _ => Err(invalid(
            "chat template arguments must be a dict of JSON values",
        )),
    }
}

/// `json.dumps(v)`.
pub(crate) fn json_dumps(v: &Bound<'_, PyAny>) -> PyResult<String> {
    v.py()
        .import("json")?
        .call_method1("dumps", (v,))?
        .extract()
}

/// A JSON schema given as a dict (or anything `json.dumps` takes) or as JSON text.
pub(crate) fn schema(v: &Bound<'_, PyAny>) -> PyResult<serde_json::Value> {
    let text: String = match v.extract::<String>() {
        Ok(text) => text,
        Err(_) => json_dumps(v)?,
    };
    serde_json::from_str(&text).map_err(|e| invalid(format!("json_schema is not JSON: {e}")))
}

/// What the keywords ask for: the model's options with the sampling keywords laid over
/// them (the CLI's rule: package defaults, sampling turned on by any of temperature > 0,
/// top_k, top_p, min_p or seed), and what [`Keywords::prepare`] composes (the constraint,
/// the tools, the reasoning effort).
pub(crate) struct Keywords {
    options: GenerateOptions,
    constraint: Option<(String, Constraint)>,
    /// `tools`, `tool_choice` and `parallel_tool_calls` as JSON, as OpenAI's API takes them.
    tools: serde_json::Map<String, serde_json::Value>,
    reasoning_effort: Option<String>,
}

pub(crate) fn keywords(model: &Inner, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Keywords> {
    let mut o = model.default_options();
    let mut request = SamplingRequest::default();
    let mut constraint = None;
    let mut tools = serde_json::Map::new();
    let mut reasoning_effort = None;
    for (key, v) in kwargs.into_iter().flat_map(|d| d.iter()) {
        let key: String = key.extract()?;
        if v.is_none() {
            continue;
        }
        let mut one = |c: Constraint| match constraint.replace((key.clone(), c)) {
            Some(_) => Err(invalid(
                "give one constraint (json_schema, json_object, regex, grammar or choice)",
            )),
            None => Ok(()),
        };
        match key.as_str() {
            "max_new_tokens" => o.max_new_tokens = extract(&key, &v)?,
            "temperature" => request.temperature = Some(param(Param::Temperature, &v)?),
            "top_k" => request.top_k = Some(extract(&key, &v)?),
            "top_p" => request.top_p = Some(param(Param::TopP, &v)?),
            "min_p" => request.min_p = Some(param(Param::MinP, &v)?),
            "seed" => request.seed = Some(extract(&key, &v)?),
            "repetition_penalty" => {
                request.repetition_penalty = Some(param(Param::RepetitionPenalty, &v)?)
            }
            "frequency_penalty" => {
                request.frequency_penalty = Some(param(Param::FrequencyPenalty, &v)?)
            }
            "presence_penalty" => {
                request.presence_penalty = Some(param(Param::PresencePenalty, &v)?)
            }
            "stop" => {
                o.stop = match v.extract::<String>() {
                    Ok(one) => vec![one],
                    Err(_) => extract(&key, &v)?,
                }
            }
            "ignore_eos" => o.ignore_eos = extract(&key, &v)?,
            "adapter" => o.adapter = Some(extract(&key, &v)?),
            "json_schema" => one(Constraint::JsonSchema(schema(&v)?))?,
            "json_object" if extract::<bool>(&key, &v)? => one(Constraint::JsonObject)?,
            "json_object" => {}
            "regex" => one(Constraint::Regex(extract(&key, &v)?))?,
            "grammar" => one(Constraint::Lark(extract(&key, &v)?))?,
            "choice" => one(Constraint::Choice(extract(&key, &v)?))?,
            "tools" | "tool_choice" | "parallel_tool_calls" => {
                let value = serde_json::from_str(&json_dumps(&v)?)
                    .map_err(|e| invalid(format!("{key} is not JSON: {e}")))?;
                tools.insert(key, value);
            }
            "reasoning_effort" => {
                let effort: String = extract(&key, &v)?;
                if !oxgen::prepare::REASONING_EFFORTS.contains(&effort.as_str()) {
                    return Err(invalid(format!(
                        "reasoning_effort '{effort}': give one of {}",
                        oxgen::prepare::REASONING_EFFORTS.join(", ")
                    )));
                }
                reasoning_effort = Some(effort);
            }
            other => {
                return Err(invalid(format!(
                    "unknown keyword '{other}'; the keywords are {}",
                    KEYWORDS.join(", ")
                )));
            }
        }
    }
    o.sampling = request
        .resolve(&o.sampling, fresh_seed())
        .map_err(|e| invalid(e.to_string()))?;
    Ok(Keywords {
        options: o,
        constraint,
        tools,
        reasoning_effort,
    })
}

/// Prompts made ready to generate ([`oxgen::prepare`]): each one's ids, how a chat reply
/// is taken apart, and the options with the constraint, tools and reasoning composed in.
pub(crate) struct Ready {
    pub(crate) ids: Vec<Vec<u32>>,
    pub(crate) syntax: Option<ReplySyntax>,
    pub(crate) options: GenerateOptions,
}

impl Keywords {
    /// The options alone, for a conversation that renders its own prompt (no tools).
    pub(crate) fn plain(self, model: &Inner) -> PyResult<GenerateOptions> {
        if !self.tools.is_empty() || self.reasoning_effort.is_some() {
            return Err(invalid(
                "tools and reasoning_effort are taken by generate, generate_batch and stream",
            ));
        }
        let mut options = self.options;
        if let Some((_, c)) = self.constraint {
            options.constraint = Some(model.compile(&c).map_err(error)?);
        }
        Ok(options)
    }

    pub(crate) fn prepare(self, model: &Inner, prompts: Vec<Prompt>) -> PyResult<Ready> {
        let mut request = oxgen::prepare::Request::new(prompts, "prompt");
        let mut tools = oxgen::prepare::tools(&serde_json::Value::Object(self.tools))
            .map_err(|e| invalid(e.to_string()))?;
        // As the server does by default: a tool's parameters allow only the properties they
        // declare.
        if let Some(tools) = &mut tools {
            tools.close_objects(|_| true);
        }
        request.tools = tools.map(|t| t.with_format(model.encoder().tool_format()));
        request.constraint = self.constraint;
        request.reasoning_effort = self.reasoning_effort;
        let needs_grammars = request.tools.is_some() || request.constraint.is_some();
        let grammars = match needs_grammars {
            true => model.grammars().map_err(|e| e.to_string()),
            false => Err(String::new()),
        };
        let grammars = grammars.as_ref().map_err(String::as_str);
        let mut prepared = oxgen::prepare::prepare(model.encoder(), grammars, request)
            .map_err(|e| invalid(e.to_string()))?;
        let mut options = self.options;
        prepared.apply(&mut options);
        Ok(Ready {
            ids: prepared.prompts.into_iter().map(|(ids, _)| ids).collect(),
            syntax: prepared.syntax,
            options,
        })
    }
}

/// Chat messages from dicts of `role` and `content`.
pub(crate) fn messages(list: &Bound<'_, PyList>) -> PyResult<Vec<ChatMessage>> {
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let get = |key: &str| -> PyResult<String> {
                m.get_item(key)
                    .and_then(|v| v.extract())
                    .map_err(|_| invalid(format!("messages[{i}] needs a string '{key}'")))
            };
            Ok(ChatMessage::new(&get("role")?, &get("content")?))
        })
        .collect()
}

/// A prompt: text, token ids, or chat messages (dicts of `role` and `content`).
pub(crate) fn prompt(v: &Bound<'_, PyAny>) -> PyResult<Prompt> {
    if let Ok(text) = v.extract::<String>() {
        return Ok(Prompt::Text(text));
    }
    if let Ok(ids) = v.extract::<Vec<u32>>() {
        return Ok(Prompt::Tokens(ids));
    }
    match v.cast::<PyList>() {
        Ok(list) => Ok(Prompt::Chat(messages(list)?)),
        Err(_) => Err(invalid(
            "a prompt is a string, a list of token ids or a list of {'role', 'content'} messages",
        )),
    }
}
