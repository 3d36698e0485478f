//! Flags shared by the commands that run a model: where the model is, how to run it, and how
//! to sample. Precedence (DESIGN.md §9): flag > `OXGEN_*` variable > the package's own
//! defaults > built-in defaults, which is why sampling flags are `Option`s.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use oxgen::{GenerateOptions, Model, ModelOptions};

/// How to load and run the model.
#[derive(clap::Args, Clone)]
pub struct RunArgs {
    /// Kernel threads (0: every core).
    #[arg(long, env = "OXGEN_THREADS", default_value_t = 0)]
    pub threads: usize,
    /// f32 activations everywhere, whatever the model's accuracy_level allows.
    #[arg(long, env = "OXGEN_EXACT")]
    pub exact: bool,
    /// Positions the KV cache holds (default: prompt + max new tokens, at most the model's
    /// context length).
    #[arg(long, env = "OXGEN_CTX_SIZE", value_parser = clap::value_parser!(u64).range(2..))]
    pub ctx_size: Option<u64>,
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

fn parse_f32(s: &str) -> Result<f32, String> {
    let v: f32 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(format!("'{s}' is not a finite number"))
    }
}

fn temperature(s: &str) -> Result<f32, String> {
    let v = parse_f32(s)?;
    if v < 0.0 {
        return Err(format!(
            "{v} is negative; use 0 for greedy or a positive value"
        ));
    }
    Ok(v)
}

fn top_p(s: &str) -> Result<f32, String> {
    let v = parse_f32(s)?;
    if v <= 0.0 || v > 1.0 {
        return Err(format!("{v} is outside (0, 1]; 1 turns top-p off"));
    }
    Ok(v)
}

fn min_p(s: &str) -> Result<f32, String> {
    let v = parse_f32(s)?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("{v} is outside [0, 1]; 0 turns min-p off"));
    }
    Ok(v)
}

fn positive(s: &str) -> Result<f32, String> {
    let v = parse_f32(s)?;
    if v <= 0.0 {
        return Err(format!("{v} must be above 0; 1 turns the penalty off"));
    }
    Ok(v)
}

fn openai_penalty(s: &str) -> Result<f32, String> {
    let v = parse_f32(s)?;
    if !(-2.0..=2.0).contains(&v) {
        return Err(format!("{v} is outside [-2, 2]"));
    }
    Ok(v)
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
    #[arg(long, env = "OXGEN_REPETITION_PENALTY", value_parser = positive, allow_hyphen_values = true)]
    pub repetition_penalty: Option<f32>,
    /// Subtract this times a token's count in the output, in [-2, 2].
    #[arg(long, env = "OXGEN_FREQUENCY_PENALTY", value_parser = openai_penalty, allow_hyphen_values = true)]
    pub frequency_penalty: Option<f32>,
    /// Subtract this from tokens present in the output, in [-2, 2].
    #[arg(long, env = "OXGEN_PRESENCE_PENALTY", value_parser = openai_penalty, allow_hyphen_values = true)]
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
}

/// A seed nobody chose: the clock's nanoseconds mixed with the process id.
fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 32)
}

impl SampleArgs {
    /// The model's defaults with these flags laid over them. Giving a sampling parameter
    /// turns sampling on (unless it is `--temperature 0` or `--greedy`).
    pub fn options(&self, model: &Model) -> GenerateOptions {
        let mut o = model.default_options();
        let s = &mut o.sampling;
        if let Some(n) = self.max_new_tokens {
            o.max_new_tokens = n;
        }
        let sampling_flag = self.temperature.is_some()
            || self.top_k.is_some()
            || self.top_p.is_some()
            || self.min_p.is_some();
        if sampling_flag {
            s.greedy = false;
        }
        s.temperature = self.temperature.unwrap_or(s.temperature);
        s.top_k = self.top_k.unwrap_or(s.top_k);
        s.top_p = self.top_p.unwrap_or(s.top_p);
        s.min_p = self.min_p.unwrap_or(s.min_p);
        s.repetition_penalty = self.repetition_penalty.unwrap_or(s.repetition_penalty);
        s.frequency_penalty = self.frequency_penalty.unwrap_or(s.frequency_penalty);
        s.presence_penalty = self.presence_penalty.unwrap_or(s.presence_penalty);
        s.seed = self.seed.unwrap_or_else(fresh_seed);
        s.greedy |= self.greedy;
        o.stop = self.stop.clone();
        o.ignore_eos = self.ignore_eos;
        o
    }
}

/// `[MODEL]` resolved: the given folder, or the default model (pulled first if needed).
pub fn model_dir(model: Option<&str>) -> anyhow::Result<PathBuf> {
    match model {
        Some(m) => Ok(PathBuf::from(m)),
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
    let options = ModelOptions {
        threads: run.threads,
        context: run.ctx_size.map(|c| c as usize).or(default_ctx),
        exact: run.exact,
        backend: backend.backend(),
        ort_lib: backend.ort_lib.clone(),
        ..ModelOptions::default()
    };
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

/// `/set PARAM VALUE` in the chat REPL: the same names and checks as the flags.
pub fn set_param(o: &mut GenerateOptions, name: &str, value: &str) -> Result<(), String> {
    let int = |v: &str| {
        v.parse::<u64>()
            .map_err(|_| format!("'{v}' is not a whole number"))
    };
    let s = &mut o.sampling;
    match name.replace('-', "_").as_str() {
        "temperature" => {
            s.temperature = temperature(value)?;
            s.greedy = s.temperature == 0.0;
        }
        "top_k" => {
            s.top_k = int(value)? as usize;
            s.greedy = false;
        }
        "top_p" => {
            s.top_p = top_p(value)?;
            s.greedy = false;
        }
        "min_p" => {
            s.min_p = min_p(value)?;
            s.greedy = false;
        }
        "repetition_penalty" => s.repetition_penalty = positive(value)?,
        "frequency_penalty" => s.frequency_penalty = openai_penalty(value)?,
        "presence_penalty" => s.presence_penalty = openai_penalty(value)?,
        "seed" => s.seed = int(value)?,
        "greedy" => {
            s.greedy = match value {
                "on" | "true" | "1" => true,
                "off" | "false" | "0" => false,
                _ => return Err(format!("'{value}': use on or off")),
            }
        }
        "max_new_tokens" => o.max_new_tokens = int(value)? as usize,
        _ => {
            return Err(format!(
                "unknown parameter '{name}'; one of: temperature, top_k, top_p, min_p, \
                 repetition_penalty, frequency_penalty, presence_penalty, seed, greedy, \
                 max_new_tokens"
            ));
        }
    }
    Ok(())
}
