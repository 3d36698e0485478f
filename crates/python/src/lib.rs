//! `oxgen._oxgen`: the native module of the `oxgen` Python package, a front end over the
//! facade (DESIGN.md §11) built with PyO3 for the stable ABI (Python 3.9 and later).
//!
//! Generation releases the GIL and checks for signals after every token, so Ctrl-C (or
//! [`PyModel::cancel`] from another thread) stops it cleanly. Errors are `oxgen.Error`s:
//! `ModelLoadError`, `InvalidArgument` (bad keywords, values, prompts, constraints) and
//! `GenerationError`. Sampling keywords are read in one place ([`options`]), named like the
//! CLI's flags.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use numpy::{PyArray1, PyArrayMethods};
use oxgen::engine::Limits;
use oxgen::{
    Backend, Cancel, Chat as Conversation, ChatMessage, Constraint, Encoder, Engine, EngineStatus,
    Event, GenerateError, GenerateOptions, Job, JobPrompt, KvBudget, Model as Inner, ModelOptions,
    Output, Param, Prompt, Reply, ReplySyntax, SamplingRequest, Sequence, fresh_seed,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyStopIteration};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

create_exception!(_oxgen, Error, PyException, "An error from oxgen.");
create_exception!(
    _oxgen,
    ModelLoadError,
    Error,
    "The model could not be opened."
);
create_exception!(
    _oxgen,
    InvalidArgument,
    Error,
    "An argument is unknown, of the wrong type or out of range (a keyword, a prompt, a constraint)."
);
create_exception!(_oxgen, GenerationError, Error, "Generation failed.");

fn invalid(message: impl Into<String>) -> PyErr {
    InvalidArgument::new_err(message.into())
}

/// The facade's error as the exception a caller can act on.
fn error(e: oxgen::Error) -> PyErr {
    match &e {
        oxgen::Error::Generate(
            GenerateError::Prompt(_)
            | GenerateError::PromptTooLong { .. }
            | GenerateError::Sampling(_)
            | GenerateError::Constraint(_)
            | GenerateError::Template(_),
        ) => invalid(e.to_string()),
        _ => GenerationError::new_err(e.to_string()),
    }
}

/// The sampling keywords `generate`, `stream`, `generate_batch` and `Chat.send` take.
const KEYWORDS: &[&str] = &[
    "max_new_tokens",
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

fn extract<'py, T: FromPyObjectOwned<'py>>(key: &str, v: &Bound<'py, PyAny>) -> PyResult<T> {
    v.extract::<T>().map_err(|e| {
        let e: PyErr = e.into();
        invalid(format!("{key}: {e}"))
    })
}

/// A float keyword checked by its parameter's one range check.
fn param(which: Param, v: &Bound<'_, PyAny>) -> PyResult<f32> {
    which
        .check(extract::<f32>(which.name(), v)?)
        .map_err(invalid)
}

/// Extra chat template arguments: a dict of what `json.dumps` takes.
fn template_kwargs(
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
fn json_dumps(v: &Bound<'_, PyAny>) -> PyResult<String> {
    v.py()
        .import("json")?
        .call_method1("dumps", (v,))?
        .extract()
}

/// A JSON schema given as a dict (or anything `json.dumps` takes) or as JSON text.
fn schema(v: &Bound<'_, PyAny>) -> PyResult<serde_json::Value> {
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
struct Keywords {
    options: GenerateOptions,
    constraint: Option<(String, Constraint)>,
    /// `tools`, `tool_choice` and `parallel_tool_calls` as JSON, as OpenAI's API takes them.
    tools: serde_json::Map<String, serde_json::Value>,
    reasoning_effort: Option<String>,
}

fn keywords(model: &Inner, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Keywords> {
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
struct Ready {
    ids: Vec<Vec<u32>>,
    syntax: Option<ReplySyntax>,
    options: GenerateOptions,
}

impl Keywords {
    /// The options alone, for a conversation that renders its own prompt (no tools).
    fn plain(self, model: &Inner) -> PyResult<GenerateOptions> {
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

    fn prepare(self, model: &Inner, prompts: Vec<Prompt>) -> PyResult<Ready> {
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
fn messages(list: &Bound<'_, PyList>) -> PyResult<Vec<ChatMessage>> {
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
fn prompt(v: &Bound<'_, PyAny>) -> PyResult<Prompt> {
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

/// What a generation gave.
#[pyclass(module = "oxgen", frozen, get_all)]
pub struct Completion {
    /// The whole reply's text.
    text: String,
    /// The reply's answer: its text without the reasoning and the tool calls.
    content: String,
    /// The reply's reasoning (Qwen3's `<think>` block, gpt-oss's analysis), if it reasoned.
    reasoning: Option<String>,
    /// The tool calls it made, in OpenAI's shape: dicts of `id`, `type` and `function`
    /// (`name`, and `arguments` as a dict where they parse).
    tool_calls: Py<PyList>,
    token_ids: Vec<u32>,
    /// `stop`, `length` or `cancelled`.
    finish_reason: String,
    /// `prompt_tokens`, `completion_tokens`, `prefix_reused`.
    usage: Py<PyDict>,
    /// `ttft_s`, `prefill_tok_s`, `decode_tok_s`, `total_s`.
    timings: Py<PyDict>,
}

#[pymethods]
impl Completion {
    fn __repr__(&self) -> String {
        format!(
            "Completion(text={:?}, finish_reason={:?}, tokens={})",
            self.text,
            self.finish_reason,
            self.token_ids.len()
        )
    }
}

impl Completion {
    /// `out` with its reply taken apart as `syntax` says (no syntax: all of it is content).
    fn new(py: Python<'_>, out: Output, syntax: Option<ReplySyntax>) -> PyResult<Completion> {
        let reply = match syntax {
            Some(syntax) => Reply::parse(syntax, &out.text, fresh_seed()),
            None => Reply {
                content: out.text.clone(),
                ..Reply::default()
            },
        };
        let tool_calls = PyList::empty(py);
        let loads = py.import("json")?.getattr("loads")?;
        for call in &reply.calls {
            let text = serde_json::to_string(call).map_err(|e| invalid(e.to_string()))?;
            tool_calls.append(loads.call1((text,))?)?;
        }
        let usage = PyDict::new(py);
        usage.set_item("prompt_tokens", out.usage.prompt_tokens)?;
        usage.set_item("completion_tokens", out.usage.completion_tokens)?;
        usage.set_item("prefix_reused", out.usage.prefix_reused)?;
        let spec = out.usage.speculation;
        usage.set_item("spec_proposed", spec.proposed)?;
        usage.set_item("spec_accepted", spec.accepted)?;
        let timings = PyDict::new(py);
        timings.set_item("ttft_s", out.timings.ttft.as_secs_f64())?;
        timings.set_item("prefill_tok_s", out.timings.prefill_tok_s)?;
        timings.set_item("decode_tok_s", out.timings.decode_tok_s)?;
        timings.set_item("total_s", out.timings.total.as_secs_f64())?;
        Ok(Completion {
            text: out.text,
            content: reply.content,
            reasoning: (!reply.reasoning.is_empty()).then_some(reply.reasoning),
            tool_calls: tool_calls.unbind(),
            token_ids: out.tokens,
            finish_reason: out.finish_reason.as_str().into(),
            usage: usage.unbind(),
            timings: timings.unbind(),
        })
    }
}

/// One generated token.
#[pyclass(module = "oxgen", frozen, get_all)]
pub struct Token {
    id: u32,
    /// The text this token completed (empty while a character or a stop string is held back).
    text: String,
}

#[pymethods]
impl Token {
    fn __repr__(&self) -> String {
        format!("Token(id={}, text={:?})", self.id, self.text)
    }
}

/// A package's tokenizer and chat template.
#[pyclass(module = "oxgen", frozen)]
pub struct Tokenizer {
    encoder: Encoder,
}

#[pymethods]
impl Tokenizer {
    /// Token ids of `text`; `add_special` adds what the tokenizer's post-processor adds.
    #[pyo3(signature = (text, add_special = false))]
    fn encode(&self, text: &str, add_special: bool) -> PyResult<Vec<u32>> {
        (self.encoder.tokenizer())
            .encode(text, add_special)
            .map_err(|e| invalid(e.to_string()))
    }

    /// The text of `ids`, special tokens left out unless `skip_special` is false.
    #[pyo3(signature = (ids, skip_special = true))]
    fn decode(&self, ids: Vec<u32>, skip_special: bool) -> PyResult<String> {
        self.encoder
            .decode(&ids, skip_special)
            .map_err(|e| invalid(e.to_string()))
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.encoder.tokenizer().vocab_size()
    }
}

/// A language model (see the package docs). Methods may be called from several threads;
/// one generation runs at a time, the others wait for it.
#[pyclass(name = "Model", module = "oxgen", subclass, frozen)]
pub struct PyModel {
    inner: Mutex<Inner>,
    encoder: Encoder,
    cancel: Cancel,
    path: String,
    /// Sequences of streams dropped while the model was busy, ended at the next lock.
    orphans: Mutex<Vec<Sequence>>,
    /// How `generate_batch` runs its prompts.
    limits: Limits,
}

impl PyModel {
    /// The model, once no other thread is generating with it. The wait does not hold the
    /// GIL, which that generation takes after each token to check for signals.
    fn lock(&self, py: Python<'_>) -> MutexGuard<'_, Inner> {
        loop {
            let mut model = match self.inner.try_lock() {
                Ok(model) => model,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
                Err(TryLockError::WouldBlock) => {
                    py.detach(|| std::thread::sleep(Duration::from_millis(1)));
                    continue;
                }
            };
            let orphans =
                std::mem::take(&mut *self.orphans.lock().unwrap_or_else(|e| e.into_inner()));
            orphans.into_iter().for_each(|s| model.end(s));
            return model;
        }
    }
}

/// Runs `stream`'s tokens to the end with the GIL released, checking for signals (Ctrl-C)
/// after each one: a signal cancels the generation and is raised once it has stopped.
fn run(
    py: Python<'_>,
    model: &mut Inner,
    prompt: &Prompt,
    options: &GenerateOptions,
) -> PyResult<Output> {
    let cancel = options.cancel.clone().expect("run sets a cancel token");
    let (output, signal) = py.detach(|| {
        let mut signal = None;
        let mut stream = model.stream(prompt, options).map_err(error)?;
        for token in &mut stream {
            token.map_err(error)?;
            if let Err(e) = Python::attach(|py| py.check_signals()) {
                signal = Some(e);
                cancel.cancel();
            }
        }
        Ok::<_, PyErr>((stream.finish(), signal))
    })?;
    match signal {
        Some(e) => Err(e),
        None => Ok(output),
    }
}

#[pymethods]
impl PyModel {
    #[new]
    #[pyo3(signature = (path, *, backend = "auto", threads = 0, ctx_size = None, exact = false,
                        chat_template = None, max_batch = 8, ort_lib = None, speculative = None,
                        spec_tokens = oxgen::DEFAULT_SPEC_TOKENS, kv_dtype = None,
                        weight_budget_mib = None, expert_cache = "frequency",
                        chat_template_kwargs = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: String,
        backend: &str,
        threads: usize,
        ctx_size: Option<usize>,
        exact: bool,
        chat_template: Option<PathBuf>,
        max_batch: usize,
        ort_lib: Option<PathBuf>,
        speculative: Option<&str>,
        spec_tokens: usize,
        kv_dtype: Option<&str>,
        weight_budget_mib: Option<u64>,
        expert_cache: &str,
        chat_template_kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyModel> {
        let backend = Backend::parse(backend)
            .ok_or_else(|| invalid(format!("backend '{backend}': use native, ort or auto")))?;
        if max_batch == 0 {
            return Err(invalid("max_batch must be at least 1"));
        }
        let speculative = speculative
            .map(|s| s.parse::<oxgen::Speculative>().map_err(invalid))
            .transpose()?;
        if !(1..=oxgen::MAX_SPEC_TOKENS).contains(&spec_tokens) {
            return Err(invalid(format!(
                "spec_tokens {spec_tokens}: give 1 to {}",
                oxgen::MAX_SPEC_TOKENS
            )));
        }
        let kv_dtype = kv_dtype
            .map(|s| s.parse::<oxgen::KvDtype>().map_err(invalid))
            .transpose()?;
        let options = ModelOptions {
            threads,
            // Fixed, so chat turns and repeated prompts reuse the KV before them.
            ctx_size: ctx_size.or(Some(oxgen::CHAT_CTX_SIZE)),
            exact,
            backend,
            ort_lib,
            kv: KvBudget::Sequences(max_batch),
            kv_dtype,
            weight_budget: weight_budget_mib.map(|mib| mib.saturating_mul(1 << 20)),
            expert_cache: expert_cache.parse().map_err(invalid)?,
            prefix_cache: true,
            chat_template,
            chat_template_kwargs: template_kwargs(chat_template_kwargs)?,
            speculative,
            spec_tokens,
        };
        let model = py
            .detach(|| Inner::open(&path, &options))
            .map_err(|e| ModelLoadError::new_err(format!("opening {path}: {e}")))?;
        Ok(PyModel {
            encoder: model.encoder().clone(),
            inner: Mutex::new(model),
            cancel: Cancel::new(),
            path,
            orphans: Mutex::new(Vec::new()),
            limits: Limits {
                max_batch,
                prefill_chunk: usize::MAX,
                max_queue: usize::MAX,
                request_timeout: None,
            },
        })
    }

    /// Generates from a prompt (text, token ids or chat messages); see the package docs for
    /// the keywords.
    #[pyo3(signature = (prompt, **kwargs))]
    fn generate(
        &self,
        py: Python<'_>,
        prompt: &Bound<'_, PyAny>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Completion> {
        let prompt = self::prompt(prompt)?;
        let mut model = self.lock(py);
        let Ready {
            mut ids,
            syntax,
            mut options,
        } = keywords(&model, kwargs)?.prepare(&model, vec![prompt])?;
        self.cancel.reset();
        options.cancel = Some(self.cancel.clone());
        let prompt = Prompt::Tokens(ids.swap_remove(0));
        let out = run(py, &mut model, &prompt, &options)?;
        Completion::new(py, out, syntax)
    }

    /// The tokens of a generation as they come: an iterator of `Token`s.
    #[pyo3(signature = (prompt, **kwargs))]
    fn stream(
        slf: &Bound<'_, Self>,
        prompt: &Bound<'_, PyAny>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<TokenStream> {
        let py = slf.py();
        let this = slf.get();
        let prompt = self::prompt(prompt)?;
        let mut model = this.lock(py);
        let ready = keywords(&model, kwargs)?.prepare(&model, vec![prompt])?;
        let seq = (model.start(&ready.ids[0], &ready.options, None)).map_err(error)?;
        Ok(TokenStream {
            model: slf.clone().unbind(),
            seq: Mutex::new(Some(seq)),
            pending: Mutex::new(Default::default()),
            finish_reason: Mutex::new(None),
        })
    }

    /// Generates from each prompt, all in one batch (one forward per step over every
    /// sequence, as the server runs them); the completions in the prompts' order.
    #[pyo3(signature = (prompts, **kwargs))]
    fn generate_batch(
        &self,
        py: Python<'_>,
        prompts: &Bound<'_, PyList>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Vec<Completion>> {
        let prompts: Vec<Prompt> = prompts
            .iter()
            .map(|p| prompt(&p))
            .collect::<PyResult<_>>()?;
        let mut model = self.lock(py);
        let ready = keywords(&model, kwargs)?.prepare(&model, prompts)?;
        self.cancel.reset();
        let cancel = self.cancel.clone();
        let model = &mut *model;
        let limits = self.limits;
        let outputs = py.detach(|| batch(model, limits, &ready, &cancel))?;
        outputs
            .into_iter()
            .map(|o| Completion::new(py, o, ready.syntax))
            .collect()
    }

    /// The raw logits at every position of `token_ids`: a NumPy float32 array of shape
    /// `(len(token_ids), vocab)`, which owns the buffer the model wrote (no copy).
    fn logits<'py>(
        &self,
        py: Python<'py>,
        token_ids: Vec<u32>,
    ) -> PyResult<Bound<'py, numpy::PyArray2<f32>>> {
        let mut model = self.lock(py);
        let model = &mut *model;
        let (rows, vocab) = py.detach(|| model.logits(&token_ids)).map_err(error)?;
        PyArray1::from_vec(py, rows).reshape([token_ids.len(), vocab])
    }

    /// A conversation that keeps its KV between turns.
    #[pyo3(signature = (system = None))]
    fn chat(slf: &Bound<'_, Self>, system: Option<&str>) -> Chat {
        Chat {
            model: slf.clone().unbind(),
            conversation: Mutex::new(Conversation::new(system)),
        }
    }

    /// The prompt text chat `messages` render to with the package's template; other
    /// keywords are the template's own arguments (`enable_thinking=False`), as in
    /// transformers.
    #[pyo3(signature = (messages, add_generation_prompt = true, **kwargs))]
    fn apply_chat_template(
        &self,
        messages: &Bound<'_, PyList>,
        add_generation_prompt: bool,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<String> {
        let messages = self::messages(messages)?;
        let template = self.encoder.template().ok_or_else(|| {
            invalid("the package has no chat_template; send the prompt as raw text")
        })?;
        template
            .render_with(
                &messages,
                None,
                add_generation_prompt,
                &template_kwargs(kwargs)?,
            )
            .map_err(|e| invalid(e.to_string()))
    }

    /// Stops the running generation (from another thread) at its next token.
    fn cancel(&self) {
        self.cancel.cancel();
    }

    #[getter]
    fn tokenizer(&self) -> Tokenizer {
        Tokenizer {
            encoder: self.encoder.clone(),
        }
    }

    /// `native` or `ort`.
    #[getter]
    fn backend(&self, py: Python<'_>) -> &'static str {
        self.lock(py).backend()
    }

    /// Kernel threads, as resolved (0 asked for every core).
    #[getter]
    fn threads(&self, py: Python<'_>) -> usize {
        self.lock(py).threads()
    }

    /// What the KV cache stores (`f32`, `f16`, `bf16` or `int8`), as resolved.
    #[getter]
    fn kv_dtype(&self, py: Python<'_>) -> &'static str {
        self.lock(py).kv_dtype().name()
    }

    #[getter]
    fn path(&self) -> &str {
        &self.path
    }

    fn __repr__(&self) -> String {
        format!("oxgen.Model({:?})", self.path)
    }
}

/// Where one prompt's events go: tagged with the prompt, closed once the batch is
/// cancelled (the engine then drops what is left of it).
struct Tagged {
    prompt: usize,
    events: std::sync::mpsc::Sender<(usize, Event)>,
    cancel: Cancel,
}

impl oxgen::engine::Sink for Tagged {
    fn send(&self, event: Event) {
        let _ = self.events.send((self.prompt, event));
    }

    fn is_closed(&self) -> bool {
        self.cancel.is_cancelled()
    }
}

/// Runs each prompt of `ready` as a request to one [`Engine`] (the server's scheduler: as
/// many at once as `limits` and the KV pool allow, one forward per step over them all)
/// until every one finishes or `cancel` is set.
fn batch(
    model: &mut Inner,
    limits: Limits,
    ready: &Ready,
    cancel: &Cancel,
) -> PyResult<Vec<Output>> {
    let started = Instant::now();
    let limit = model.context_limit();
    let mut engine = Engine::new(limits, Arc::new(EngineStatus::default()));
    let (events, received) = std::sync::mpsc::channel();
    for (prompt, ids) in ready.ids.iter().enumerate() {
        let sizing = (limit.size(ids.len(), ready.options.max_new_tokens)).map_err(error)?;
        engine.submit(Job {
            prompts: vec![JobPrompt {
                ids: ids.clone(),
                positions: sizing.positions,
            }],
            options: ready.options.clone(),
            n: 1,
            top_logprobs: None,
            prompt_logprobs: None,
            arrived: started,
            deadline: None,
            events: Box::new(Tagged {
                prompt,
                events: events.clone(),
                cancel: cancel.clone(),
            }),
        });
    }
    while !engine.idle() {
        engine.turn(model);
    }
    let total = started.elapsed();
    let mut outputs: Vec<Output> = (ready.ids.iter())
        .map(|ids| Output {
            text: String::new(),
            tokens: Vec::new(),
            usage: oxgen::Usage {
                prompt_tokens: ids.len(),
                ..Default::default()
            },
            finish_reason: oxgen::FinishReason::Cancelled,
            timings: oxgen::Timings {
                total,
                ..Default::default()
            },
        })
        .collect();
    for (prompt, event) in received.try_iter() {
        let out = &mut outputs[prompt];
        match event {
            Event::Token { step, .. } => {
                out.text.push_str(&step.text);
                out.tokens.push(step.id);
                out.usage.completion_tokens += 1;
                if let Some(finish) = step.finish {
                    out.finish_reason = finish;
                }
            }
            Event::Done(counts) => out.usage.prefix_reused = counts.cached_tokens,
            Event::Error(e) => return Err(GenerationError::new_err(e.to_string())),
            Event::PromptLogprobs { .. } => {}
        }
    }
    Ok(outputs)
}

/// The tokens of one generation, as an iterator; the sequence is freed when it finishes or
/// when the iterator is dropped.
#[pyclass(module = "oxgen", frozen)]
pub struct TokenStream {
    model: Py<PyModel>,
    seq: Mutex<Option<Sequence>>,
    /// Tokens a speculative step confirmed that were not pulled yet.
    pending: Mutex<std::collections::VecDeque<Token>>,
    finish_reason: Mutex<Option<&'static str>>,
}

#[pymethods]
impl TokenStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Token> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(token) = pending.pop_front() {
            return Ok(token);
        }
        let mut seq = self.seq.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = seq.as_mut() else {
            return Err(PyStopIteration::new_err(()));
        };
        py.check_signals()?;
        let mut model = self.model.get().lock(py);
        let m = &mut *model;
        let steps = py.detach(|| m.advance(s)).map_err(error)?;
        for step in steps {
            if let Some(f) = step.finish {
                *self.finish_reason.lock().unwrap_or_else(|e| e.into_inner()) = Some(f.as_str());
                if let Some(s) = seq.take() {
                    model.end(s);
                }
            }
            pending.push_back(Token {
                id: step.id,
                text: step.text,
            });
        }
        pending
            .pop_front()
            .ok_or_else(|| PyStopIteration::new_err(()))
    }

    /// `stop`, `length` or `cancelled` once the stream ended, else `None`.
    #[getter]
    fn finish_reason(&self) -> Option<&'static str> {
        *self.finish_reason.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for TokenStream {
    /// Frees the sequence now if the model is free, else at its next use (waiting here, with
    /// the GIL held, could deadlock a generation that checks for signals).
    fn drop(&mut self) {
        let seq = self.seq.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(seq) = seq {
            let owner = self.model.get();
            match owner.inner.try_lock() {
                Ok(mut model) => model.end(seq),
                Err(_) => owner
                    .orphans
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(seq),
            }
        }
    }
}

/// A conversation whose turns reuse the KV of the conversation so far.
#[pyclass(module = "oxgen", frozen)]
pub struct Chat {
    model: Py<PyModel>,
    conversation: Mutex<Conversation>,
}

#[pymethods]
impl Chat {
    /// Adds `text` as the user's turn, generates the reply and adds it.
    #[pyo3(signature = (text, **kwargs))]
    fn send(
        &self,
        py: Python<'_>,
        text: &str,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Completion> {
        let owner = self.model.get();
        let mut conversation = self.conversation.lock().unwrap_or_else(|e| e.into_inner());
        let mut model = owner.lock(py);
        let mut options = keywords(&model, kwargs)?.plain(&model)?;
        owner.cancel.reset();
        options.cancel = Some(owner.cancel.clone());
        let model = &mut *model;
        let conversation = &mut *conversation;
        let out = py
            .detach(|| conversation.send(model, text, &options, |_| {}))
            .map_err(error)?;
        Completion::new(py, out, None)
    }

    /// The user and assistant messages so far, as dicts.
    #[getter]
    fn messages<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let conversation = self.conversation.lock().unwrap_or_else(|e| e.into_inner());
        let list = PyList::empty(py);
        for m in conversation.messages() {
            let d = PyDict::new(py);
            d.set_item("role", &m.role)?;
            d.set_item("content", &m.content)?;
            list.append(d)?;
        }
        Ok(list)
    }
}

#[pymodule]
fn _oxgen(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("Error", py.get_type::<Error>())?;
    m.add("ModelLoadError", py.get_type::<ModelLoadError>())?;
    m.add("InvalidArgument", py.get_type::<InvalidArgument>())?;
    m.add("GenerationError", py.get_type::<GenerationError>())?;
    m.add_class::<PyModel>()?;
    m.add_class::<Completion>()?;
    m.add_class::<Token>()?;
    m.add_class::<TokenStream>()?;
    m.add_class::<Tokenizer>()?;
    m.add_class::<Chat>()?;
    Ok(())
}
