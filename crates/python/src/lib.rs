//! `oxgen._oxgen`: the native module of the `oxgen` Python package, a front end over the
//! facade (DESIGN.md §11) built with PyO3 for the stable ABI (Python 3.9 and later).
//!
//! Generation releases the GIL and checks for signals after every token, so Ctrl-C (or
//! [`PyModel::cancel`] from another thread) stops it cleanly. Errors are `oxgen.Error`s:
//! `ModelLoadError`, `InvalidArgument` (bad keywords, values, prompts, constraints) and
//! `GenerationError`. Keywords are read in one place (`args.rs`), named like the CLI's
//! flags; `generate_batch` runs on the facade's engine (`batch.rs`); encoder packages open
//! as `Embedder`s (`embed.rs`).

mod args;
mod batch;
mod embed;

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::Duration;

use numpy::{PyArray1, PyArrayMethods};
use oxgen::engine::Limits;
use oxgen::{
    Backend, Cancel, Chat as Conversation, Encoder, GenerateError, GenerateOptions, KvBudget,
    MemoryOptions, Model as Inner, ModelOptions, Output, Prompt, Reply, ReplySyntax, Sequence,
    fresh_seed,
};

use crate::args::{Ready, keywords, messages, prompt, template_kwargs};
use crate::batch::batch;
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

/// The `backend` keyword's value.
fn backend_named(name: &str) -> PyResult<Backend> {
    Backend::parse(name)
        .ok_or_else(|| invalid(format!("backend '{name}': use native, ort or auto")))
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
        oxgen::Error::Adapter { .. } | oxgen::Error::UnknownAdapter { .. } => {
            invalid(e.to_string())
        }
        _ => GenerationError::new_err(e.to_string()),
    }
}

/// An adapter as Python sees it.
fn adapter_dict<'py>(py: Python<'py>, a: &oxgen::AdapterInfo) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", &a.name)?;
    d.set_item("path", a.path.display().to_string())?;
    d.set_item("rank", a.rank)?;
    d.set_item("modules", a.modules)?;
    d.set_item("bytes", a.bytes)?;
    Ok(d)
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
                        chat_template_kwargs = None, kv_disk_cache = None,
                        kv_disk_budget_mib = oxgen::DEFAULT_KV_DISK_BUDGET >> 20, lora = None,
                        max_loras = 0))]
    // The parameters are Python's keyword arguments, named by the signature above.
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
        kv_disk_cache: Option<PathBuf>,
        kv_disk_budget_mib: u64,
        lora: Option<std::collections::BTreeMap<String, PathBuf>>,
        max_loras: usize,
    ) -> PyResult<PyModel> {
        let backend = backend_named(backend)?;
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
            exact,
            backend,
            ort_lib,
            memory: MemoryOptions {
                // Fixed, so chat turns and repeated prompts reuse the KV before them.
                ctx_size: ctx_size.or(Some(oxgen::CHAT_CTX_SIZE)),
                kv: KvBudget::Sequences(max_batch),
                kv_dtype,
                prefix_cache: true,
                weight_budget: weight_budget_mib.map(|mib| mib.saturating_mul(1 << 20)),
                expert_cache: expert_cache.parse().map_err(invalid)?,
            },
            kv_disk_cache,
            kv_disk_budget: kv_disk_budget_mib.saturating_mul(1 << 20),
            chat_template,
            chat_template_kwargs: template_kwargs(chat_template_kwargs)?,
            speculative,
            spec_tokens,
            lora: lora.unwrap_or_default().into_iter().collect(),
            max_loras,
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

    /// Loads the LoRA adapter at `path` (a PEFT folder or an `.onnx_adapter` file) as `name`,
    /// for generations given `adapter=name`; a dict describing it.
    fn load_adapter<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        path: PathBuf,
    ) -> PyResult<Bound<'py, PyDict>> {
        let mut model = self.lock(py);
        let model = &mut *model;
        let info = py
            .detach(|| model.load_adapter(name, &path))
            .map_err(error)?;
        adapter_dict(py, &info)
    }

    /// Drops adapter `name`.
    fn unload_adapter(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        self.lock(py).unload_adapter(name).map_err(error)
    }

    /// The adapters loaded: a list of dicts (name, path, rank, modules, bytes).
    fn adapters<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let adapters = self.lock(py).adapters();
        adapters.iter().map(|a| adapter_dict(py, a)).collect()
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
    m.add_class::<embed::PyEmbedder>()?;
    m.add_function(wrap_pyfunction!(embed::is_encoder, m)?)?;
    Ok(())
}
