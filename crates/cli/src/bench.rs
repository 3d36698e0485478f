//! `oxgen bench [MODEL]`: prefill and decode throughput over repeated runs of a prompt of an
//! exact length, each from an empty KV cache (no prefix reuse between runs).

use std::io::Write;

use oxgen::{GenerateOptions, Output, Prompt};
use serde_json::json;

use crate::options::{BackendArgs, RunArgs, model_dir, open_model, peak_rss_bytes};
use crate::profile;

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum PromptKind {
    /// Token ids drawn uniformly from the vocabulary (seeded).
    Random,
    /// A fixed English text, repeated to the length.
    Fixed,
}

#[derive(clap::Args)]
pub struct Args {
    /// A package folder; the default model when absent.
    model: Option<String>,
    /// Prompt tokens per run.
    #[arg(long, env = "OXGEN_PROMPT_LEN", default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..))]
    prompt_len: u64,
    /// Tokens generated per run (greedy, end-of-sequence ignored).
    #[arg(long, env = "OXGEN_GEN_LEN", default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..))]
    gen_len: u64,
    /// Measured runs.
    #[arg(long, env = "OXGEN_RUNS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    runs: u64,
    /// Unmeasured runs first.
    #[arg(long, env = "OXGEN_WARMUP", default_value_t = 1)]
    warmup: u64,
    /// Where the prompt's tokens come from.
    #[arg(long, env = "OXGEN_PROMPT", value_enum, default_value_t = PromptKind::Random)]
    prompt: PromptKind,
    /// Seed of the random prompt.
    #[arg(long, env = "OXGEN_SEED", default_value_t = 0)]
    seed: u64,
    /// Print one JSON object instead of the table.
    #[arg(long, env = "OXGEN_JSON")]
    json: bool,
    /// Also print latency percentiles, KV bytes and time per op type (stderr).
    #[arg(long, env = "OXGEN_PROFILE")]
    profile: bool,
    #[command(flatten)]
    run: RunArgs,
    #[command(flatten)]
    backend: BackendArgs,
}

const FIXED_TEXT: &str = "The quick brown fox jumps over the lazy dog while the river runs \
                          past the old mill, and the miller counts his sacks of grain. ";

/// splitmix64: a small, well-mixed generator for prompt ids.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Median, mean and standard deviation of the runs.
fn stats(values: &[f64]) -> serde_json::Value {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    let mean = values.iter().sum::<f64>() / n as f64;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
    json!({ "median": median, "mean": mean, "std": var.sqrt(), "runs": values })
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let dir = model_dir(args.model.as_deref())?;
    let (prompt_len, gen_len) = (args.prompt_len as usize, args.gen_len as usize);
    let mut model = open_model(&dir, &args.run, &args.backend, Some(prompt_len + gen_len))?;
    let ids = match args.prompt {
        PromptKind::Random => {
            let vocab = model.tokenizer().vocab_size().max(1) as u64;
            let special = [
                model.config().eos_token_ids.clone(),
                model.config().bos_token_id.into_iter().collect(),
            ]
            .concat();
            let mut state = args.seed;
            let mut ids = Vec::with_capacity(prompt_len);
            while ids.len() < prompt_len {
                let id = (splitmix(&mut state) % vocab) as u32;
                if !special.contains(&id) {
                    ids.push(id);
                }
            }
            ids
        }
        PromptKind::Fixed => {
            let piece = model.encode(&Prompt::Text(FIXED_TEXT.into()))?;
            piece.iter().copied().cycle().take(prompt_len).collect()
        }
    };
    let prompt = Prompt::Tokens(ids);
    let options = GenerateOptions {
        max_new_tokens: gen_len,
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    let mut outs: Vec<Output> = Vec::new();
    for i in 0..args.warmup + args.runs {
        if i == args.warmup {
            model.set_profiling(args.profile);
        }
        model.reset();
        let out = model.generate(&prompt, &options, |_| {})?;
        if i >= args.warmup {
            if !args.json {
                eprintln!("run {}: {}", i - args.warmup + 1, profile::summary(&out));
            }
            outs.push(out);
        }
    }
    let series = |f: &dyn Fn(&Output) -> f64| outs.iter().map(f).collect::<Vec<f64>>();
    let prefill = stats(&series(&|o| o.timings.prefill_tok_s));
    let decode = stats(&series(&|o| o.timings.decode_tok_s));
    let ttft = stats(&series(&|o| o.timings.ttft.as_secs_f64() * 1e3));
    let report = json!({
        "model": dir.display().to_string(),
        "threads": args.run.threads,
        "prompt_len": prompt_len,
        "gen_len": gen_len,
        "runs": args.runs,
        "warmup": args.warmup,
        "prefill_tok_s": prefill,
        "decode_tok_s": decode,
        "ttft_ms": ttft,
        "load_ms": model.load_time().as_secs_f64() * 1e3,
        "kv_cache_bytes": model.kv_positions().map(|p| model.kv_bytes(p)),
        "peak_rss_bytes": peak_rss_bytes(),
    });
    let mut stdout = std::io::stdout().lock();
    if args.json {
        writeln!(stdout, "{report}")?;
    } else {
        let line = |name: &str, s: &serde_json::Value, unit: &str| {
            format!(
                "{name:<8} median {:>8.1} {unit}   mean {:>8.1} ± {:.1}",
                s["median"].as_f64().unwrap_or_default(),
                s["mean"].as_f64().unwrap_or_default(),
                s["std"].as_f64().unwrap_or_default()
            )
        };
        writeln!(stdout, "{}", dir.display())?;
        writeln!(
            stdout,
            "prompt {prompt_len} tokens, {gen_len} generated, {} runs after {} warm-up",
            args.runs, args.warmup
        )?;
        writeln!(
            stdout,
            "{}",
            line("prefill", &report["prefill_tok_s"], "tok/s")
        )?;
        writeln!(
            stdout,
            "{}",
            line("decode", &report["decode_tok_s"], "tok/s")
        )?;
        writeln!(stdout, "{}", line("TTFT", &report["ttft_ms"], "ms"))?;
        if let Some(rss) = peak_rss_bytes() {
            writeln!(stdout, "peak RSS {}", crate::options::mib(rss))?;
        }
    }
    if args.profile {
        profile::print(&model, &outs);
    }
    Ok(())
}
