//! `oxgen._oxgen`: the native module of the `oxgen` Python package, a front end over the
//! facade (DESIGN.md §11) built with PyO3 for the stable ABI (Python 3.9 and later).
//!
//! Generation releases the GIL and checks for signals after every token, so Ctrl-C (or
//! [`PyModel::cancel`] from another thread) stops it cleanly. Errors are `oxgen.Error`s:
//! `ModelLoadError`, `InvalidArgument` (bad keywords, values, prompts, constraints) and
//! `GenerationError`. Sampling keywords are read in one place ([`options`]), named like the
//! CLI's flags.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use numpy::{PyArray1, PyArrayMethods};
use oxgen::{
    Backend, Cancel, Chat as Conversation, ChatMessage, Constraint, Encoder, GenerateError,
    GenerateOptions, KvBudget, Model as Inner, ModelOptions, Output, Param, Prompt,
    SamplingRequest, Sequence, fresh_seed,
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

/// The model's options with the keywords laid over them (the CLI's rule: package defaults,
/// sampling turned on by any of temperature > 0, top_k, top_p, min_p or seed).
fn options(model: &Inner, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<GenerateOptions> {
    let mut o = model.default_options();
    let mut request = SamplingRequest::default();
    let mut constraint = None;
    for (key, v) in kwargs.into_iter().flat_map(|d| d.iter()) {
        let key: String = key.extract()?;
        if v.is_none() {
            continue;
        }
        let mut one = |c: Constraint| match constraint.replace(c) {
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
    if let Some(c) = constraint {
        o.constraint = Some(model.compile(&c).map_err(error)?);
    }
    Ok(o)
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
    text: String,
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
    fn new(py: Python<'_>, out: Output) -> PyResult<Completion> {
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
        let mut options = options(&model, kwargs)?;
        self.cancel.reset();
        options.cancel = Some(self.cancel.clone());
        let out = run(py, &mut model, &prompt, &options)?;
        Completion::new(py, out)
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
        let ids = this.encoder.encode(&prompt).map_err(error)?;
        let mut model = this.lock(py);
        let options = options(&model, kwargs)?;
        let seq = model.start(&ids, &options, None).map_err(error)?;
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
        let ids: Vec<Vec<u32>> = (prompts.iter())
            .map(|p| self.encoder.encode(p).map_err(error))
            .collect::<PyResult<_>>()?;
        let mut model = self.lock(py);
        let options = options(&model, kwargs)?;
        self.cancel.reset();
        let cancel = self.cancel.clone();
        let model = &mut *model;
        let outputs = py.detach(|| batch(model, &ids, &options, &cancel))?;
        outputs
            .into_iter()
            .map(|o| Completion::new(py, o))
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

/// Runs `ids` as one batch until every sequence finishes (or `cancel` is set).
fn batch(
    model: &mut Inner,
    ids: &[Vec<u32>],
    options: &GenerateOptions,
    cancel: &Cancel,
) -> PyResult<Vec<Output>> {
    let started = Instant::now();
    let mut seqs: Vec<Sequence> = Vec::with_capacity(ids.len());
    for prompt in ids {
        match model.start(prompt, options, None) {
            Ok(s) => seqs.push(s),
            Err(e) => {
                seqs.into_iter().for_each(|s| model.end(s));
                return Err(error(e));
            }
        }
    }
    let mut texts = vec![String::new(); ids.len()];
    let mut tokens = vec![Vec::new(); ids.len()];
    let mut finish = vec![None; ids.len()];
    let mut failure = None;
    while failure.is_none() && finish.iter().any(Option::is_none) {
        let mut live: Vec<(usize, &mut Sequence)> = (seqs.iter_mut().enumerate())
            .filter(|(i, _)| finish[*i].is_none())
            .collect();
        let mut refs: Vec<&mut Sequence> = live.iter_mut().map(|(_, s)| &mut **s).collect();
        let steps = model.advance_batch(&mut refs, usize::MAX);
        let order: Vec<usize> = live.iter().map(|(i, _)| *i).collect();
        for (i, step) in order.into_iter().zip(steps) {
            match step {
                Ok(steps) => {
                    for step in steps {
                        texts[i].push_str(&step.text);
                        tokens[i].push(step.id);
                        finish[i] = step.finish;
                    }
                }
                Err(e) => failure = Some(error(e)),
            }
            if cancel.is_cancelled() && finish[i].is_none() {
                finish[i] = Some(oxgen::FinishReason::Cancelled);
            }
        }
    }
    seqs.into_iter().for_each(|s| model.end(s));
    if let Some(e) = failure {
        return Err(e);
    }
    let total = started.elapsed();
    Ok((0..ids.len())
        .map(|i| Output {
            text: std::mem::take(&mut texts[i]),
            usage: oxgen::Usage {
                prompt_tokens: ids[i].len(),
                completion_tokens: tokens[i].len(),
                ..Default::default()
            },
            tokens: std::mem::take(&mut tokens[i]),
            finish_reason: finish[i].expect("every sequence finished"),
            timings: oxgen::Timings {
                total,
                ..Default::default()
            },
        })
        .collect())
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
        let mut options = options(&model, kwargs)?;
        owner.cancel.reset();
        options.cancel = Some(owner.cancel.clone());
        let model = &mut *model;
        let conversation = &mut *conversation;
        let out = py
            .detach(|| conversation.send(model, text, &options, |_| {}))
            .map_err(error)?;
        Completion::new(py, out)
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
