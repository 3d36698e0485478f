//! Flags shared by the commands that run a model: where the model is, how to run it, and how
//! to sample. Precedence (DESIGN.md §9): flag > `OXGEN_*` variable > the package's own
//! defaults > built-in defaults, which is why sampling flags are `Option`s.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use oxgen::{
    Constraint, GenerateOptions, MemoryOptions, Model, ModelOptions, Param, SamplingRequest,
};

/// How to load and run the model.
#[derive(clap::Args, Clone)]
pub struct RunArgs {
    /// Kernel threads (0: every core, fewer while other processes hold some; at most 1024).
    #[arg(long, env = "OXGEN_THREADS", default_value_t = 0, value_parser = threads)]
    pub threads: usize,
    /// f32 activations everywhere, whatever the model's accuracy_level allows.
    #[arg(long, env = "OXGEN_EXACT")]
    pub exact: bool,
    /// Positions the KV cache holds per sequence (default: prompt + max new tokens, at most
    /// the model's context length); the KV pool is sized for two sequences of it (serve:
    /// --max-batch of them, unless --kv-memory or --kv-blocks).
    #[arg(long, env = "OXGEN_CTX_SIZE", value_parser = clap::value_parser!(u64).range(2..))]
    pub ctx_size: Option<u64>,
    /// What the KV cache stores: f32, f16, bf16 or int8 (one scale per token and head;
    /// 0.27x an f32 cache's memory at head size 64). Default: the model's KV dtype.
    #[arg(long, env = "OXGEN_KV_DTYPE", value_parser = clap::value_parser!(oxgen::KvDtype))]
    pub kv_dtype: Option<oxgen::KvDtype>,
    /// A folder for the prefix cache's second tier: full KV blocks are written there (under
    /// the model's identity) and read back when a prompt starts with them, after they left
    /// memory or after a restart, instead of being prefilled again. Turns the prefix cache
    /// on (native backend, paged models).
    #[arg(long, env = "OXGEN_KV_DISK_CACHE", value_name = "DIR")]
    pub kv_disk_cache: Option<PathBuf>,
    /// MiB of KV blocks --kv-disk-cache keeps per model; past it the least recently used
    /// are removed.
    #[arg(long, env = "OXGEN_KV_DISK_BUDGET", value_name = "MIB",
          default_value_t = oxgen::DEFAULT_KV_DISK_BUDGET >> 20,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub kv_disk_budget: u64,
    /// MiB of mixture-of-experts weights that may stay resident: experts are read from the
    /// model files as needed and the least recently used dropped past this (default: no
    /// bound). Outputs do not change with it.
    #[arg(long, env = "OXGEN_WEIGHT_BUDGET", value_name = "MIB")]
    pub weight_budget: Option<u64>,
    /// Which resident experts --weight-budget drops first: frequency (least often used,
    /// counts halved as the text goes on) or lru (least recently used).
    #[arg(long, env = "OXGEN_EXPERT_CACHE", default_value = "frequency",
          value_parser = clap::value_parser!(oxgen::ExpertCache))]
    pub expert_cache: oxgen::ExpertCache,
    /// A Jinja chat template file to use instead of the package's.
    #[arg(long, env = "OXGEN_CHAT_TEMPLATE")]
    pub chat_template: Option<PathBuf>,
    /// Extra arguments for the chat template, a JSON object: '{"enable_thinking": false}'
    /// (Qwen3, SmolLM3), '{"reasoning_effort": "high"}' (gpt-oss). serve: a request's own
    /// chat_template_kwargs take precedence.
    #[arg(long, env = "OXGEN_CHAT_TEMPLATE_KWARGS", value_name = "JSON",
          value_parser = json_object)]
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Speculative decoding (same output, faster where proposals land): prompt-lookup
    /// (continue an n-gram seen earlier; prompt-lookup:N or :MIN-MAX sets n), draft:PATH (a
    /// smaller package with the same tokenizer) or self:LAYERS (the model's first layers).
    #[arg(long, env = "OXGEN_SPECULATIVE", value_parser = clap::value_parser!(oxgen::Speculative))]
    pub speculative: Option<oxgen::Speculative>,
    /// The most ids each speculative step proposes (it adapts below this to what lands).
    #[arg(long, env = "OXGEN_SPEC_TOKENS", default_value_t = oxgen::DEFAULT_SPEC_TOKENS,
          value_parser = spec_tokens)]
    pub spec_tokens: usize,
    /// A LoRA adapter to load, as NAME=PATH: a PEFT folder (adapter_config.json and
    /// adapter_model.safetensors) or an .onnx_adapter file; repeatable (native backend).
    /// generate, run and bench run under the last one given (bench --batch spreads its
    /// sequences over all of them); serve lists each as a model of its own.
    #[arg(long = "lora", value_name = "NAME=PATH", value_parser = lora)]
    pub lora: Vec<(String, PathBuf)>,
    /// The most LoRA adapters held at once (at least --lora's count; serve loads more
    /// through /v1/load_lora_adapter up to it). With none, gate and up projections are
    /// fused with the SiLU between them, a little faster.
    #[arg(long, env = "OXGEN_MAX_LORAS", default_value_t = 0)]
    pub max_loras: usize,
}

impl RunArgs {
    /// The adapter generate, run and bench run under: the last --lora.
    pub fn adapter(&self) -> Option<String> {
        self.lora.last().map(|(name, _)| name.clone())
    }

    /// The model options these flags and `backend` give.
    pub fn model_options(&self, backend: &BackendArgs) -> ModelOptions {
        ModelOptions {
            threads: self.threads,
            exact: self.exact,
            backend: backend.backend(),
            ort_lib: backend.ort_lib.clone(),
            memory: MemoryOptions {
                ctx_size: self.ctx_size.map(|c| c as usize),
                kv_dtype: self.kv_dtype,
                weight_budget: self.weight_budget.map(|mib| mib.saturating_mul(1 << 20)),
                expert_cache: self.expert_cache,
                ..MemoryOptions::default()
            },
            kv_disk_cache: self.kv_disk_cache.clone(),
            kv_disk_budget: self.kv_disk_budget.saturating_mul(1 << 20),
            chat_template: self.chat_template.clone(),
            chat_template_kwargs: self.chat_template_kwargs.clone().unwrap_or_default(),
            speculative: self.speculative.clone(),
            spec_tokens: self.spec_tokens,
            lora: self.lora.clone(),
            max_loras: self.max_loras,
        }
    }
}

fn json_object(s: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str(s) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err("give a JSON object, e.g. '{\"enable_thinking\": false}'".into()),
        Err(e) => Err(format!("not valid JSON: {e}")),
    }
}

fn lora(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((name, path)) if !name.is_empty() && !path.is_empty() => {
            Ok((name.to_string(), PathBuf::from(path)))
        }
        _ => Err(format!(
            "'{s}' is not NAME=PATH (a name for the adapter, then its PEFT folder or \
             .onnx_adapter file)"
        )),
    }
}

fn spec_tokens(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=oxgen::MAX_SPEC_TOKENS).contains(&n) => Ok(n),
        _ => Err(format!(
            "'{s}' is not a count of proposed ids from 1 to {}",
            oxgen::MAX_SPEC_TOKENS
        )),
    }
}

/// Which backend runs the model.
#[derive(clap::Args, Debug, Clone)]
pub struct BackendArgs {
    /// native (oxgen's kernels), ort (ONNX Runtime) or auto (native unless the graph needs an
    /// op native lacks, then ONNX Runtime with a note saying which).
    #[arg(long, env = "OXGEN_BACKEND", default_value = "auto",
          value_parser = ["native", "ort", "auto"])]
    pub backend: String,
    /// ONNX Runtime's shared library (libonnxruntime.so, or the onnxruntime wheel's folder);
    /// else ORT_DYLIB_PATH, else the one Python's onnxruntime package ships.
    #[arg(long, env = "OXGEN_ORT_LIB")]
    pub ort_lib: Option<PathBuf>,
}

impl BackendArgs {
    pub fn backend(&self) -> oxgen::Backend {
        oxgen::Backend::parse(&self.backend).unwrap_or_default()
    }
}

/// A thread count (0: every core), up to the bound [`oxgen::check_threads`] checks.
pub fn threads(s: &str) -> Result<usize, String> {
    let n = (s.parse::<usize>())
        .map_err(|_| format!("'{s}' is not a thread count (0 uses every core)"))?;
    oxgen::check_threads(n)
}

/// A sampling value from a flag or `/set`, checked by the one range check of its parameter.
fn param(which: Param, s: &str) -> Result<f32, String> {
    let v: f32 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    which.check(v)
}

fn temperature(s: &str) -> Result<f32, String> {
    param(Param::Temperature, s)
}

fn top_p(s: &str) -> Result<f32, String> {
    param(Param::TopP, s)
}

fn min_p(s: &str) -> Result<f32, String> {
    param(Param::MinP, s)
}

fn repetition_penalty(s: &str) -> Result<f32, String> {
    param(Param::RepetitionPenalty, s)
}

fn frequency_penalty(s: &str) -> Result<f32, String> {
    param(Param::FrequencyPenalty, s)
}

fn presence_penalty(s: &str) -> Result<f32, String> {
    param(Param::PresencePenalty, s)
}

/// What to generate and how to choose tokens.
#[derive(clap::Args, Clone)]
pub struct SampleArgs {
    /// Stop after this many new tokens (default: the package's, else 256).
    #[arg(long, env = "OXGEN_MAX_NEW_TOKENS")]
    pub max_new_tokens: Option<usize>,
    /// Softmax temperature; 0 is greedy.
    #[arg(long, env = "OXGEN_TEMPERATURE", value_parser = temperature, allow_hyphen_values = true)]
    pub temperature: Option<f32>,
    /// Keep the k most likely tokens (0: off).
    #[arg(long, env = "OXGEN_TOP_K")]
    pub top_k: Option<usize>,
    /// Keep the smallest set of tokens whose probability reaches p, in (0, 1].
    #[arg(long, env = "OXGEN_TOP_P", value_parser = top_p, allow_hyphen_values = true)]
    pub top_p: Option<f32>,
    /// Drop tokens less likely than min-p times the most likely one, in [0, 1].
    #[arg(long, env = "OXGEN_MIN_P", value_parser = min_p, allow_hyphen_values = true)]
    pub min_p: Option<f32>,
    /// Divide the logits of tokens already seen (prompt and output) by this (> 0; 1: off).
    #[arg(long, env = "OXGEN_REPETITION_PENALTY", value_parser = repetition_penalty, allow_hyphen_values = true)]
    pub repetition_penalty: Option<f32>,
    /// Subtract this times a token's count in the output, in [-2, 2].
    #[arg(long, env = "OXGEN_FREQUENCY_PENALTY", value_parser = frequency_penalty, allow_hyphen_values = true)]
    pub frequency_penalty: Option<f32>,
    /// Subtract this from tokens present in the output, in [-2, 2].
    #[arg(long, env = "OXGEN_PRESENCE_PENALTY", value_parser = presence_penalty, allow_hyphen_values = true)]
    pub presence_penalty: Option<f32>,
    /// Seed of the sampler's ChaCha8 generator (default: a fresh one each run).
    #[arg(long, env = "OXGEN_SEED")]
    pub seed: Option<u64>,
    /// Always pick the most likely token (overrides the package's sampling defaults).
    #[arg(long, env = "OXGEN_GREEDY")]
    pub greedy: bool,
    /// Stop when the text contains this string (not printed); repeatable.
    #[arg(long, env = "OXGEN_STOP")]
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens, to --max-new-tokens.
    #[arg(long, env = "OXGEN_IGNORE_EOS")]
    pub ignore_eos: bool,
    /// Constrain the output to a JSON schema: a file holding it, or its JSON text.
    #[arg(long, env = "OXGEN_JSON_SCHEMA", group = "constraint")]
    pub json_schema: Option<String>,
    /// Constrain the output to a JSON object (any).
    #[arg(long, env = "OXGEN_JSON_OBJECT", group = "constraint")]
    pub json_object: bool,
    /// Constrain the output to match this regular expression (Rust regex syntax), whole.
    #[arg(long, env = "OXGEN_REGEX", group = "constraint")]
    pub regex: Option<String>,
    /// Constrain the output to a grammar: a file in llguidance's Lark dialect.
    #[arg(long, env = "OXGEN_GRAMMAR", group = "constraint")]
    pub grammar: Option<PathBuf>,
    /// Constrain the output to one of these strings (repeatable).
    #[arg(long, group = "constraint")]
    pub choice: Vec<String>,
}

/// `--json-schema`'s value: a file holding the schema, or its JSON text.
pub fn json_schema(arg: &str) -> Result<Constraint, Usage> {
    let usage = |e: String| Usage(format!("--json-schema: {e}"));
    let text = match std::fs::read_to_string(arg) {
        Ok(text) => text,
        Err(_) if arg.trim_start().starts_with('{') => arg.to_string(),
        Err(e) => return Err(usage(format!("reading {arg}: {e}"))),
    };
    let schema = serde_json::from_str(&text).map_err(|e| usage(format!("not valid JSON: {e}")))?;
    Ok(Constraint::JsonSchema(schema))
}

/// A usage error found after the flags parsed (a schema that does not compile, say): exit 2.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

impl SampleArgs {
    /// The constraint the flags ask for, and the flag.
    fn constraint(&self) -> anyhow::Result<Option<(&'static str, Constraint)>> {
        let usage = |flag: &str, e: String| Usage(format!("--{flag}: {e}"));
        if let Some(s) = &self.json_schema {
            return Ok(Some(("json-schema", json_schema(s)?)));
        }
        if self.json_object {
            return Ok(Some(("json-object", Constraint::JsonObject)));
        }
        if let Some(rx) = &self.regex {
            return Ok(Some(("regex", Constraint::Regex(rx.clone()))));
        }
        if let Some(path) = &self.grammar {
            let lark = std::fs::read_to_string(path)
                .map_err(|e| usage("grammar", format!("reading {}: {e}", path.display())))?;
            return Ok(Some(("grammar", Constraint::Lark(lark))));
        }
        if !self.choice.is_empty() {
            return Ok(Some(("choice", Constraint::Choice(self.choice.clone()))));
        }
        Ok(None)
    }

    /// The sampling values these flags give.
    fn request(&self) -> SamplingRequest {
        SamplingRequest {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: Vec::new(),
            seed: self.seed,
            choices: 1,
            greedy: self.greedy,
        }
    }

    /// The model's defaults with these flags laid over them (the rule that turns sampling on
    /// is [`SamplingRequest::resolve`]'s); `fresh_seed` seeds the draw when `--seed` is not
    /// given.
    pub fn options(&self, model: &Model, fresh_seed: u64) -> anyhow::Result<GenerateOptions> {
        let mut o = model.default_options();
        if let Some((flag, c)) = self.constraint()? {
            let grammar = model
                .compile(&c)
                .map_err(|e| Usage(format!("--{flag}: {e}")))?;
            o.constraint = Some(grammar);
        }
        o.sampling = self.request().resolve(&o.sampling, fresh_seed)?;
        if let Some(n) = self.max_new_tokens {
            o.max_new_tokens = n;
        }
        o.stop = self.stop.clone();
        o.ignore_eos = self.ignore_eos;
        Ok(o)
    }
}

/// `[MODEL]` resolved: the given folder, a model's name (`crate::models::resolve`), or the
/// default model (pulled first if needed).
pub fn model_dir(model: Option<&str>) -> anyhow::Result<PathBuf> {
    match model {
        Some(m) => crate::models::resolve(m),
        None => crate::pull::ensure_default_model(false),
    }
}

/// A spinner on stderr while `work` runs; nothing when stderr is not a terminal.
pub fn with_spinner<T>(message: String, work: impl FnOnce() -> T) -> T {
    let spinner = ProgressBar::new_spinner().with_message(message);
    if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} {elapsed}") {
        spinner.set_style(style);
    }
    spinner.enable_steady_tick(Duration::from_millis(100));
    let out = work();
    spinner.finish_and_clear();
    out
}

/// Opens the model at `dir` behind a spinner; says why when `auto` picked ONNX Runtime.
pub fn open_model(
    dir: &std::path::Path,
    run: &RunArgs,
    backend: &BackendArgs,
    default_ctx: Option<usize>,
) -> anyhow::Result<Model> {
    let mut options = run.model_options(backend);
    options.memory.ctx_size = options.memory.ctx_size.or(default_ctx);
    let model = with_spinner(format!("loading {}", dir.display()), || {
        Model::open(dir, &options)
    })
    .with_context(|| format!("opening {}", dir.display()))?;
    if let Some(note) = model.backend_note() {
        eprintln!("note: {note}");
    }
    Ok(model)
}

/// Peak resident memory of this process (`VmHWM`), when the OS reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Bytes as MiB with one decimal.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn on_off(value: &str) -> Result<bool, String> {
    match value {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(format!("'{value}': use on or off")),
    }
}

/// `/set PARAM VALUE` in the chat REPL: the same names and checks as the flags, and the
/// same rule when the REPL resolves them again ([`SampleArgs::options`]).
pub fn set_param(a: &mut SampleArgs, name: &str, value: &str) -> Result<(), String> {
    let int = |v: &str| {
        v.parse::<u64>()
            .map_err(|_| format!("'{v}' is not a whole number"))
    };
    match name.replace('-', "_").as_str() {
        "temperature" => a.temperature = Some(temperature(value)?),
        "top_k" => a.top_k = Some(int(value)? as usize),
        "top_p" => a.top_p = Some(top_p(value)?),
        "min_p" => a.min_p = Some(min_p(value)?),
        "repetition_penalty" => a.repetition_penalty = Some(repetition_penalty(value)?),
        "frequency_penalty" => a.frequency_penalty = Some(frequency_penalty(value)?),
        "presence_penalty" => a.presence_penalty = Some(presence_penalty(value)?),
        "seed" => a.seed = Some(int(value)?),
        "greedy" => a.greedy = on_off(value)?,
        "max_new_tokens" => a.max_new_tokens = Some(int(value)? as usize),
        "json" => a.json_object = on_off(value)?,
        _ => {
            return Err(format!(
                "unknown parameter '{name}'; one of: temperature, top_k, top_p, min_p, \
                 repetition_penalty, frequency_penalty, presence_penalty, seed, greedy, \
                 max_new_tokens, json"
            ));
        }
    }
    Ok(())
}
