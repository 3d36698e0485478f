//! oxgen: run generative AI models stored as ONNX.
//!
//! Open a package, then generate with a callback per piece of text:
//!
//! ```no_run
//! use oxgen::{GenerateOptions, Model, ModelOptions, Prompt};
//!
//! let mut model = Model::open("path/to/package", &ModelOptions::default())?;
//! let prompt = Prompt::chat(&[("user", "Why is the sky blue?")]);
//! let out = model.generate(&prompt, &model.default_options(), |text| print!("{text}"))?;
//! eprintln!("{} tokens, {:.1} tok/s", out.usage.completion_tokens, out.timings.decode_tok_s);
//! # Ok::<(), oxgen::Error>(())
//! ```
//!
//! or pull tokens as an iterator, with seeded sampling and a stop string:
//!
//! ```no_run
//! use oxgen::{Model, ModelOptions, Prompt};
//!
//! let mut model = Model::open("path/to/package", &ModelOptions::default())?;
//! let mut options = model.default_options();
//! options.sampling.greedy = false;
//! options.sampling.temperature = 0.7;
//! options.sampling.top_p = 0.9;
//! options.sampling.seed = 42;
//! options.stop = vec!["\n\n".into()];
//! let mut stream = model.stream(&Prompt::Text("Once upon a time".into()), &options)?;
//! for token in &mut stream {
//!     print!("{}", token?.text);
//! }
//! let out = stream.finish();
//! eprintln!("finished: {:?}", out.finish_reason);
//! # Ok::<(), oxgen::Error>(())
//! ```
//!
//! A package folder holds the graph, its config and the tokenizer: onnxruntime-genai's layout
//! (`genai_config.json`) or optimum's (`config.json`). The model's I/O contract comes from
//! the graph and the config files, never from its name. This crate is the only one that
//! picks a backend.

mod adapters;
mod backend;
mod chat;
mod context;
mod defaults;
pub mod embed;
mod encoder;
pub mod engine;
mod identity;
mod package;
pub mod prepare;
mod score;
mod sequence;
mod speculative;
mod stream;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use oxgen_generate::Tokenizer;
use oxgen_runtime::{LanguageModel, SeqId};

pub use adapters::{Adapter, AdapterInfo, max_adapters, read_adapter};
pub use backend::{AutoChoice, Backend, HAS_ORT, auto_choice};
pub use chat::{CHAT_CTX_SIZE, Chat, Resumed};
pub use context::{ContextLimit, Sizing};
pub use defaults::PackageDefaults;
pub use embed::{
    EmbedInput, EmbedOptions, EmbedTokenizer, EmbedTokens, Embedder, EncoderKind, Pooling,
};
pub use encoder::Encoder;
pub use engine::{Engine, EngineError, EngineStatus, Event, Job, JobPrompt};
pub use oxgen_exec::{ExpertCache, KvBudget, MemoryOptions};
pub use oxgen_generate::{
    ChatMessage, ChatTemplate, Constraint, FinishReason, GenerateError, Grammar, Grammars, Param,
    ReasoningBudget, Reply, ReplyDelta, ReplyParser, ReplySyntax, SamplingParams, SamplingRequest,
    Tool, ToolCall, ToolChoice, ToolFormat, ToolSet, after_reasoning, close_objects, fresh_seed,
    tool_grammar,
};
pub use oxgen_generate::{PromptLookup, SpecStats};
pub use oxgen_runtime::{
    Capabilities, DiskStats, KvDtype, KvUsage, MAX_THREADS, OpTime, StepCounters, check_threads,
};
pub use package::{DeclaredShape, PackageConfig, PackageFormat};
pub use score::Scorer;
pub use sequence::{Logprobs, Sequence, Step};
pub use speculative::{DEFAULT_SPEC_TOKENS, MAX_SPEC_TOKENS, SPEC_MAX_BATCH, Speculative};
pub use stream::{Output, Stream, Timings, Token, Usage, quantile};

/// Errors from opening a model or generating with it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {reason}")]
    Package { path: String, reason: String },
    #[error(transparent)]
    Native(#[from] oxgen_exec::OpenError),
    #[error(transparent)]
    Runtime(#[from] oxgen_runtime::RuntimeError),
    #[error(transparent)]
    Generate(#[from] oxgen_generate::GenerateError),
    /// A LoRA adapter could not be loaded (the reason names the file or module).
    #[error("LoRA adapter '{name}': {reason}")]
    Adapter { name: String, reason: String },
    /// A generation named an adapter that is not loaded.
    #[error(
        "no LoRA adapter named '{name}' is loaded ({}); load it with --lora NAME=PATH",
        if loaded.is_empty() { "none is".to_string() } else { format!("loaded: {}", loaded.join(", ")) }
    )]
    UnknownAdapter { name: String, loaded: Vec<String> },
}

/// The disk tier's budget where none is given: 8 GiB (the 1.5B model's 4,000-token prompt
/// takes 230 MB of f32 KV).
pub const DEFAULT_KV_DISK_BUDGET: u64 = 8 << 30;

/// How to open a model.
#[derive(Debug, Clone)]
pub struct ModelOptions {
    /// Kernel threads; 0 uses every core, fewer while other processes hold some.
    pub threads: usize,
    /// f32 activations whatever the model's `accuracy_level` allows (no int8 activations;
    /// native backend only).
    pub exact: bool,
    pub backend: Backend,
    /// ONNX Runtime's shared library (else `ORT_DYLIB_PATH`, else the Python wheel's).
    pub ort_lib: Option<PathBuf>,
    /// The KV pool (its size, dtype, prefix cache, the positions a sequence holds) and the
    /// experts' weight budget; the native backend's. `ctx_size` larger than the package's
    /// context length is clamped to it.
    pub memory: MemoryOptions,
    /// A folder for the prefix cache's second tier (native backend, paged graphs; turns the
    /// prefix cache on): every full KV block is written there under the model's identity
    /// and its token prefix, and a prompt's prefix missing from memory is read back instead
    /// of prefilled, across restarts too. Greedy output is the same bits as a cold run.
    pub kv_disk_cache: Option<PathBuf>,
    /// The most bytes the disk tier keeps for this model; past it, the least recently used
    /// blocks are removed.
    pub kv_disk_budget: u64,
    /// A Jinja chat template file to use instead of the package's.
    pub chat_template: Option<PathBuf>,
    /// Extra arguments every chat render gives the template (`{"enable_thinking": false}`
    /// for Qwen3, `{"reasoning_effort": "high"}` for gpt-oss); a request's own
    /// `chat_template_kwargs` take precedence, name by name.
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    /// Speculative decoding: how ids are proposed for the model to verify (`None`: off).
    pub speculative: Option<Speculative>,
    /// The most ids a step proposes, unless a generation asks for fewer
    /// ([`GenerateOptions::spec_tokens`]); at most [`MAX_SPEC_TOKENS`].
    pub spec_tokens: usize,
    /// LoRA adapters loaded at open, by name: a PEFT folder (`adapter_config.json` and
    /// `adapter_model.safetensors`) or an `.onnx_adapter` file (native backend).
    pub lora: Vec<(String, PathBuf)>,
    /// The most adapters held at once, loaded at open or later ([`Model::load_adapter`]); at
    /// least `lora`'s count. With none, the model runs no adapters and fuses its gate and up
    /// projections with the SiLU between them (a little faster).
    pub max_loras: usize,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            threads: 0,
            exact: false,
            backend: Backend::default(),
            ort_lib: None,
            memory: MemoryOptions::default(),
            kv_disk_cache: None,
            kv_disk_budget: DEFAULT_KV_DISK_BUDGET,
            chat_template: None,
            chat_template_kwargs: serde_json::Map::new(),
            speculative: None,
            spec_tokens: DEFAULT_SPEC_TOKENS,
            lora: Vec::new(),
            max_loras: 0,
        }
    }
}

/// Stops a generation from another thread (or a signal handler) at the next token.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn new() -> Cancel {
        Cancel::default()
    }

    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// Clears the flag, so the token can serve the next generation.
    pub fn reset(&self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// What to generate. [`Model::default_options`] starts from the package's own defaults.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    /// Strings that end generation; they are not part of the text unless `include_stop`.
    pub stop: Vec<String>,
    /// Ids that end generation besides the package's EOS ids (vLLM's `stop_token_ids`).
    pub stop_ids: Vec<u32>,
    /// Ids generated before an EOS or stop id may end generation.
    pub min_new_tokens: usize,
    /// Keep the stop string that ended generation at the end of the text.
    pub include_stop: bool,
    /// Close the reply's reasoning block once it has spent this many tokens.
    pub reasoning_budget: Option<ReasoningBudget>,
    /// Keep generating past end-of-sequence tokens (their logits are masked).
    pub ignore_eos: bool,
    pub cancel: Option<Cancel>,
    /// A grammar the output must follow ([`Model::compile`] makes one).
    pub constraint: Option<Grammar>,
    /// Keep special tokens in the text (for a [`ReplyParser`] whose markers are special).
    pub keep_special: bool,
    /// The most ids each step proposes for speculative decoding, at most the model's
    /// [`ModelOptions::spec_tokens`] (`None`: the model's; 0: no speculation). Output is the
    /// same either way (greedy and seeded sampling alike); only the speed differs.
    pub spec_tokens: Option<usize>,
    /// Ids the output is expected to resemble (OpenAI's predicted outputs: a file being
    /// edited, say): proposed for speculative decoding in place of the model's proposer, even
    /// on a model opened without one, up to `spec_tokens` (default
    /// [`DEFAULT_SPEC_TOKENS`]) per step. The output is unchanged.
    pub prediction: Vec<u32>,
    /// Keep this prompt's prefix in the prefix cache longer: its blocks leave memory (and
    /// the disk tier) after every unmarked one (Anthropic's `cache_control`, OpenAI's
    /// `prompt_cache_key`).
    pub keep_prefix: bool,
    /// The LoRA adapter to generate under, by the name it was loaded with (`None`: the base
    /// model).
    pub adapter: Option<String>,
}

impl Default for GenerateOptions {
    /// Greedy, 256 new tokens, no stop strings.
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: 256,
            sampling: SamplingParams {
                greedy: true,
                ..SamplingParams::default()
            },
            stop: Vec::new(),
            stop_ids: Vec::new(),
            min_new_tokens: 0,
            include_stop: false,
            reasoning_budget: None,
            ignore_eos: false,
            cancel: None,
            constraint: None,
            keep_special: false,
            spec_tokens: None,
            prediction: Vec::new(),
            keep_prefix: false,
            adapter: None,
        }
    }
}

/// A prompt: chat messages rendered with the package's template, raw text, or token ids.
#[derive(Debug, Clone)]
pub enum Prompt {
    Chat(Vec<ChatMessage>),
    Text(String),
    Tokens(Vec<u32>),
}

impl Prompt {
    /// Chat messages from `(role, content)` pairs.
    pub fn chat(messages: &[(&str, &str)]) -> Prompt {
        Prompt::Chat(
            messages
                .iter()
                .map(|(r, c)| ChatMessage::new(r, c))
                .collect(),
        )
    }
}

/// The sequence whose KV outlives a generation, so the next prompt that starts with the same
/// ids (the next turn of a chat) prefills only what it adds.
struct CachedSeq {
    seq: SeqId,
    /// The ids whose KV the sequence holds.
    ids: Vec<u32>,
    ctx_size: usize,
    /// The adapter it ran under.
    adapter: Option<oxgen_runtime::AdapterId>,
}

/// A loaded model with its tokenizer, chat template and generation defaults.
pub struct Model {
    lm: Box<dyn LanguageModel>,
    /// Why `auto` picked ONNX Runtime.
    backend_note: Option<String>,
    encoder: Encoder,
    config: PackageConfig,
    defaults: PackageDefaults,
    limit: ContextLimit,
    /// Kernel threads, resolved ([`ModelOptions::threads`] 0 is every core).
    threads: usize,
    /// The grammar compiler, built on first use (the token trie costs a pass over the
    /// vocabulary that unconstrained use never needs).
    grammars: std::sync::OnceLock<Result<Arc<Grammars>, String>>,
    prefix_cache: bool,
    cached: Option<CachedSeq>,
    /// The speculative proposer, when one was asked for.
    spec: Option<speculative::Speculation>,
    /// Logits of the last step of [`Model::advance`].
    scratch: oxgen_runtime::StepLogits,
    dir: PathBuf,
    model_path: PathBuf,
    /// SHA-256 of the graph and weights, made on first use (the disk tier's, when it has one).
    identity: std::sync::OnceLock<String>,
    load_time: std::time::Duration,
    adapters: adapters::Adapters,
}

/// Hands heap memory that loading freed back to the OS. Parsing the tokenizer's JSON (3.5 MB
/// for the default model) leaves about 24 MB of freed chunks that glibc keeps for later
/// allocations; a long-running process never needs them, and they would count in its RSS.
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only returns free pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl Model {
    /// Opens a package folder (or its graph file).
    pub fn open(path: impl AsRef<Path>, options: &ModelOptions) -> Result<Model, Error> {
        Model::open_on(path.as_ref(), options, None)
    }

    /// [`Model::open`] whose native backend runs on `pool` (a draft on its target's threads);
    /// `None`: a pool of its own, shared with its draft when it speculates.
    pub(crate) fn open_on(
        path: &Path,
        options: &ModelOptions,
        pool: Option<Arc<oxgen_exec::ThreadPool>>,
    ) -> Result<Model, Error> {
        let start = Instant::now();
        let dir = if path.is_dir() {
            path.to_path_buf()
        } else if path.exists() {
            path.parent().map(Path::to_path_buf).unwrap_or_default()
        } else {
            return Err(Error::Package {
                path: path.display().to_string(),
                reason: "no such file or folder; give a package folder (oxgen pull fetches \
                         the default model, oxgen import converts a GGUF)"
                    .into(),
            });
        };
        let config = PackageConfig::read(&dir)?;
        let model_path = dir.join(&config.model_file);
        oxgen_runtime::check_threads(options.threads).map_err(|reason| Error::Package {
            path: dir.display().to_string(),
            reason,
        })?;
        // Resolved here, once: the native pool is built of this many, ONNX Runtime gets as
        // many, and `threads()` reports it.
        let threads = oxgen_runtime::resolve_threads(options.threads);
        let leave_room = options.threads == 0;
        let pool = pool.or_else(|| {
            let shared = || Arc::new(oxgen_exec::pool_of(threads, leave_room));
            options.speculative.is_some().then(shared)
        });
        let limit = ContextLimit::new(options.memory.ctx_size, config.context_length);
        let disk = match &options.kv_disk_cache {
            Some(dir) => Some(oxgen_runtime::DiskTier {
                dir: dir.clone(),
                budget: options.kv_disk_budget,
                identity: identity::model_identity(&model_path, Some(&dir.join("identities")))?,
            }),
            None => None,
        };
        let identity = std::sync::OnceLock::new();
        if let Some(d) = &disk {
            let _ = identity.set(d.identity.clone());
        }
        let open = backend::Open {
            model_path: &model_path,
            config: &config,
            options,
            threads,
            memory: MemoryOptions {
                ctx_size: limit.ctx_size(),
                prefix_cache: options.memory.prefix_cache || disk.is_some(),
                ..options.memory
            },
            pool,
            disk,
        };
        let (lm, mut backend_note) = backend::open(&open)?;
        if open.disk.is_some() && lm.kv_usage().is_none() {
            let off = "its KV is not paged on this backend, so the prefix cache and its disk \
                       tier (kv_disk_cache) are off";
            backend_note = Some(match backend_note {
                Some(note) => format!("{note}; {off}"),
                None => off.into(),
            });
        }
        config.check_contract(lm.contract())?;
        let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
        let template = ChatTemplate::open(&dir, options.chat_template.as_deref())?
            .map(|t| t.with_defaults(options.chat_template_kwargs.clone()))
            .transpose()?;
        let defaults = PackageDefaults::read(&dir)?;
        release_freed_heap();
        let spec = speculative::open(options, &open, lm.as_ref(), &tokenizer)?;
        let prefix_cache = open.memory.prefix_cache;
        let mut model = Model {
            lm,
            backend_note,
            encoder: Encoder::new(tokenizer, template),
            config,
            defaults,
            limit,
            threads,
            grammars: std::sync::OnceLock::new(),
            prefix_cache,
            cached: None,
            spec,
            scratch: Default::default(),
            dir,
            model_path,
            identity,
            load_time: start.elapsed(),
            adapters: adapters::Adapters::new(max_adapters(options)),
        };
        for (name, path) in &options.lora {
            model.load_adapter(name, path)?;
        }
        model.load_time = start.elapsed();
        Ok(model)
    }

    /// Loads the LoRA adapter at `path` (a PEFT folder or an `.onnx_adapter` file) as `name`,
    /// for generations that name it ([`GenerateOptions::adapter`]). Refused with a message
    /// naming the module when the adapter does not fit this model.
    pub fn load_adapter(&mut self, name: &str, path: &Path) -> Result<AdapterInfo, Error> {
        self.adapters.load(self.lm.as_mut(), name, path)
    }

    /// [`Model::load_adapter`] of an adapter already read ([`read_adapter`]).
    pub fn add_adapter(
        &mut self,
        name: &str,
        path: &Path,
        adapter: Adapter,
    ) -> Result<AdapterInfo, Error> {
        self.adapters.add(self.lm.as_mut(), name, path, adapter)
    }

    /// Drops adapter `name`; generations running under it finish under it.
    pub fn unload_adapter(&mut self, name: &str) -> Result<(), Error> {
        // The kept sequence ran under it: its id may name another adapter later.
        let id = self.adapters.id(Some(name))?;
        if self.cached.as_ref().is_some_and(|c| c.adapter == id) {
            self.drop_cache();
        }
        self.adapters.unload(self.lm.as_mut(), name)
    }

    /// The adapters loaded, by name.
    pub fn adapters(&self) -> Vec<AdapterInfo> {
        self.adapters.list()
    }

    /// The most adapters it holds at once ([`ModelOptions::max_loras`]).
    pub fn max_adapters(&self) -> usize {
        self.adapters.max()
    }

    /// The backend's model, for a draft (its tokenizer and template are let go).
    pub(crate) fn into_lm(self) -> Box<dyn LanguageModel> {
        self.lm
    }

    /// The speculative mode and what it did since the model was opened.
    pub fn speculation(&self) -> Option<(&'static str, SpecStats)> {
        self.spec.as_ref().map(|s| (s.name(), s.stats))
    }

    pub fn config(&self) -> &PackageConfig {
        &self.config
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        self.encoder.tokenizer()
    }

    /// The tokenizer and chat template, to share with other threads.
    pub fn encoder(&self) -> &Encoder {
        &self.encoder
    }

    /// The kernel threads it runs with (0 asked for is resolved to the core count).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// `native` or `ort`.
    pub fn backend(&self) -> &'static str {
        self.lm.backend()
    }

    /// What the backend can run in one forward (fused batches of sequences).
    pub fn capabilities(&self) -> Capabilities {
        self.lm.capabilities()
    }

    /// Why the `auto` backend chose ONNX Runtime, when it did, and what that turned off.
    pub fn backend_note(&self) -> Option<&str> {
        self.backend_note.as_deref()
    }

    /// The package folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The model's identity: the first 16 bytes of SHA-256 over its graph and weight files,
    /// in hex. What outlives the process (the disk tier, saved sessions) is filed under it,
    /// so that no other model or version reads it. Hashed on first use.
    pub fn identity(&self) -> Result<&str, Error> {
        if let Some(id) = self.identity.get() {
            return Ok(id);
        }
        let id = identity::model_identity(&self.model_path, None)?;
        Ok(self.identity.get_or_init(|| id))
    }

    /// How long [`Model::open`] took.
    pub fn load_time(&self) -> std::time::Duration {
        self.load_time
    }

    /// The package's generation defaults (`generation_config.json`, `genai_config.json`).
    pub fn defaults(&self) -> &PackageDefaults {
        &self.defaults
    }

    /// Options with the package's defaults: its sampling settings, and its `max_new_tokens`
    /// or 256.
    pub fn default_options(&self) -> GenerateOptions {
        GenerateOptions {
            max_new_tokens: self.defaults.max_new_tokens.unwrap_or(256),
            sampling: self.defaults.sampling.clone(),
            ..GenerateOptions::default()
        }
    }

    /// Bytes of KV cache a sequence of `positions` holds.
    pub fn kv_bytes(&self, positions: usize) -> usize {
        self.lm.contract().kv_bytes(self.lm.kv_dtype(), positions)
    }

    /// What the KV cache stores (the graph's KV dtype unless [`MemoryOptions::kv_dtype`]
    /// chose another).
    pub fn kv_dtype(&self) -> KvDtype {
        self.lm.kv_dtype()
    }

    /// How full the paged KV pool is (native backend on a paged graph).
    pub fn kv_usage(&self) -> Option<oxgen_runtime::KvUsage> {
        self.lm.kv_usage()
    }

    /// What the prefix cache's disk tier did ([`ModelOptions::kv_disk_cache`]).
    pub fn kv_disk(&self) -> Option<oxgen_runtime::DiskStats> {
        self.lm.kv_disk()
    }

    /// Whether sequences share cached prefix blocks (asked for, and the KV is paged).
    pub fn prefix_cache(&self) -> bool {
        self.prefix_cache && self.lm.kv_usage().is_some()
    }

    /// Steps, graph runs, tokens fed and weight bytes read since the model was opened.
    pub fn counters(&self) -> oxgen_runtime::StepCounters {
        self.lm.counters()
    }

    /// Positions the KV kept from the last generation holds.
    pub fn kv_positions(&self) -> Option<usize> {
        self.cached.as_ref().map(|c| c.ctx_size)
    }

    /// Times every op type of the native backend from now on (a little slower); read them
    /// with [`Model::op_times`].
    pub fn set_profiling(&mut self, on: bool) {
        self.lm.set_profiling(on);
    }

    /// Time per op type since profiling was switched on, most expensive first.
    pub fn op_times(&self) -> Vec<OpTime> {
        self.lm.op_times()
    }

    /// The token ids a prompt becomes.
    pub fn encode(&self, prompt: &Prompt) -> Result<Vec<u32>, Error> {
        self.encoder.encode(prompt)
    }

    /// Generates, calling `on_text` with each complete piece of text as it comes.
    pub fn generate(
        &mut self,
        prompt: &Prompt,
        options: &GenerateOptions,
        mut on_text: impl FnMut(&str),
    ) -> Result<Output, Error> {
        let mut stream = self.stream(prompt, options)?;
        for token in &mut stream {
            on_text(&token?.text);
        }
        Ok(stream.finish())
    }

    /// Starts a generation whose tokens are pulled as an iterator.
    pub fn stream(
        &mut self,
        prompt: &Prompt,
        options: &GenerateOptions,
    ) -> Result<Stream<'_>, Error> {
        let start = Instant::now();
        let ids = self.encode(prompt)?;
        let sizing = self.limit.size(ids.len(), options.max_new_tokens)?;
        // The sequence is kept for the next prompt: a fixed ctx_size lets later turns fit.
        let ctx_size = self.limit.ctx_size().unwrap_or(sizing.positions);
        let adapter = self.adapters.id(options.adapter.as_deref())?;
        let (seq, reused) = self.sequence_for(&ids, ctx_size, adapter)?;
        let decode = self.decode_options(options);
        let decoding = match oxgen_generate::Decoding::new(&ids, reused, ctx_size, decode) {
            Ok(d) => d,
            Err(e) => {
                self.lm_remove(seq);
                return Err(e.into());
            }
        };
        let spec_tokens = self.spec_tokens(options);
        let mut seq = Sequence::new(seq, decoding, reused, ctx_size, spec_tokens, None);
        seq.adapter = adapter;
        Ok(Stream::new(self, seq, options.cancel.clone(), start))
    }

    /// The grammar compiler of this model's tokenizer, shared (compile on any thread). Built
    /// on the first call.
    pub fn grammars(&self) -> Result<Arc<Grammars>, Error> {
        let built = self.grammars.get_or_init(|| {
            let vocab =
                (self.lm.contract().vocab_size).unwrap_or_else(|| self.tokenizer().vocab_size());
            Grammars::new(
                self.encoder.shared_tokenizer(),
                vocab,
                &self.config.eos_token_ids,
            )
            .map(Arc::new)
            .map_err(|e| e.to_string())
        });
        built
            .clone()
            .map_err(|e| GenerateError::Constraint(e).into())
    }

    /// Compiles a constraint for [`GenerateOptions::constraint`]; an error says why it does
    /// not compile.
    pub fn compile(&self, constraint: &Constraint) -> Result<Grammar, Error> {
        Ok(self.grammars()?.compile(constraint)?)
    }

    /// The positions sequences may hold, to size requests on other threads as the model
    /// does.
    pub fn context_limit(&self) -> ContextLimit {
        self.limit
    }

    fn decode_options(&self, options: &GenerateOptions) -> oxgen_generate::DecodeOptions {
        oxgen_generate::DecodeOptions {
            max_new_tokens: options.max_new_tokens,
            eos: self.config.eos_token_ids.clone(),
            ignore_eos: options.ignore_eos,
            stop: options.stop.clone(),
            stop_ids: options.stop_ids.clone(),
            min_new_tokens: options.min_new_tokens,
            include_stop: options.include_stop,
            reasoning_budget: options.reasoning_budget.clone(),
            sampling: options.sampling.clone(),
            constraint: options.constraint.clone(),
            keep_special: options.keep_special,
        }
    }

    /// A sequence holding `ids`' longest cached prefix, and that prefix's length.
    fn sequence_for(
        &mut self,
        ids: &[u32],
        ctx_size: usize,
        adapter: Option<oxgen_runtime::AdapterId>,
    ) -> Result<(SeqId, usize), Error> {
        if let Some(c) = self.cached.take() {
            let shared = c.ids.iter().zip(ids).take_while(|(a, b)| a == b).count();
            // Sharing nothing, a prefix cache may still hold the prompt's start.
            let fits = c.ctx_size >= ctx_size && c.adapter == adapter;
            if fits && (shared > 0 || !self.prefix_cache) {
                return Ok((c.seq, shared));
            }
            self.lm_remove(c.seq);
        }
        let cacheable = if self.prefix_cache { ids } else { &[] };
        Ok(self.lm.start_sequence(ctx_size, cacheable, adapter)?)
    }

    /// Frees a sequence's KV, and its draft's.
    fn lm_remove(&mut self, seq: SeqId) {
        self.lm.remove_sequence(seq);
        if let Some(spec) = &mut self.spec {
            spec.forget(seq);
        }
    }

    fn drop_cache(&mut self) {
        if let Some(c) = self.cached.take() {
            self.lm_remove(c.seq);
        }
    }

    /// Writes the KV kept from the last generation to `out` (see [`Chat::save`]): the ids
    /// it holds, its size and layout; `None` when nothing is kept.
    pub(crate) fn save_kept(
        &mut self,
        out: &mut dyn std::io::Write,
    ) -> Result<Option<(Vec<u32>, usize, oxgen_runtime::BlockFormat)>, Error> {
        // KV computed under an adapter is not saved: loaded into the base model it would
        // continue (and be cached) as if the base had computed it. The messages still are.
        let Some(c) = self.cached.as_ref().filter(|c| c.adapter.is_none()) else {
            return Ok(None);
        };
        let format = self.lm.save_kv(c.seq, out)?;
        Ok(Some((c.ids.clone(), c.ctx_size, format)))
    }

    /// Keeps, as if the last generation had left it, a sequence of `ctx_size` positions
    /// holding `ids`' KV read from `input` in `format`.
    pub(crate) fn load_kept(
        &mut self,
        ids: &[u32],
        ctx_size: usize,
        format: &oxgen_runtime::BlockFormat,
        input: &mut dyn std::io::Read,
    ) -> Result<(), Error> {
        self.drop_cache();
        let ctx_size = ctx_size.min(self.limit.max());
        let seq = self.lm.load_kv(ctx_size, ids, format, input)?;
        self.cached = Some(CachedSeq {
            seq,
            ids: ids.to_vec(),
            ctx_size,
            adapter: None,
        });
        Ok(())
    }

    /// Forgets the KV kept from the last generation.
    pub fn reset(&mut self) {
        self.drop_cache();
    }
}

/// The README's Rust examples compile as doctests (a README that stops compiling fails CI).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
