//! `oxgen bench [MODEL]`: prefill and decode throughput over repeated runs of a prompt of an
//! exact length, each from an empty KV cache (no prefix reuse between runs). With `--batch N`,
//! N sequences of the prompt run side by side, each step one forward over all of them
//! (aggregate throughput, and the weight bytes read per step and per generated token).

use std::io::Write;

use anyhow::Context;

use std::time::Instant;

use oxgen::{GenerateOptions, Model, Output, Prompt, Sequence, StepCounters};
use serde_json::json;

use crate::options::{
    BackendArgs, RunArgs, Usage, json_schema, model_dir, open_model, peak_rss_bytes,
};
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
    /// Decode under this JSON schema (a file, or its JSON text): constrained decoding's cost.
    /// Pick one that does not end within --gen-len (an array of numbers, say).
    #[arg(long, env = "OXGEN_JSON_SCHEMA")]
    json_schema: Option<String>,
    /// The prompt: a file whose text is sent as a user chat message (instead of --prompt and
    /// --prompt-len), for a real workload (speculative decoding's, say).
    #[arg(long, env = "OXGEN_PROMPT_FILE")]
    prompt_file: Option<std::path::PathBuf>,
    /// Stop at end-of-sequence (by default every run generates --gen-len tokens).
    #[arg(long, env = "OXGEN_EOS")]
    eos: bool,
    /// Sequences decoded side by side (one forward per step over all of them).
    #[arg(long, env = "OXGEN_BATCH", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    batch: u64,
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
    // A prompt file's length is known once the model's tokenizer has read it.
    let ctx = args.prompt_file.is_none().then_some(prompt_len + gen_len);
    let mut model = open_model(&dir, &args.run, &args.backend, ctx)?;
    let ids = match (&args.prompt_file, args.prompt) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --prompt-file {}", path.display()))?;
            model.encode(&Prompt::chat(&[("user", text.trim_end())]))?
        }
        (None, PromptKind::Random) => {
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
        (None, PromptKind::Fixed) => {
            let piece = model.encode(&Prompt::Text(FIXED_TEXT.into()))?;
            piece.iter().copied().cycle().take(prompt_len).collect()
        }
    };
    let constraint = match &args.json_schema {
        Some(s) => Some(
            model
                .compile(&json_schema(s)?)
                .map_err(|e| Usage(e.to_string()))?,
        ),
        None => None,
    };
    let prompt_len = ids.len();
    let options = GenerateOptions {
        max_new_tokens: gen_len,
        ignore_eos: !args.eos,
        constraint,
        adapter: args.run.adapter(),
        ..GenerateOptions::default()
    };
    if args.batch > 1 {
        return run_batch(args, &mut model, &ids, &options);
    }
    let prompt = Prompt::Tokens(ids);
    let mut outs: Vec<Output> = Vec::new();
    let counters = model.counters();
    // Weight bytes per decode step (the prompt's forwards excluded), per run.
    let mut decode_bytes = Vec::new();
    for i in 0..args.warmup + args.runs {
        if i == args.warmup {
            model.set_profiling(args.profile);
        }
        model.reset();
        let mut stream = model.stream(&prompt, &options)?;
        let mut after_prompt = None;
        while let Some(token) = stream.next() {
            token?;
            after_prompt.get_or_insert_with(|| stream.counters());
        }
        let out = stream.finish();
        if let Some(since) = after_prompt {
            decode_bytes.extend(weight_bytes_per(&model, since, |c| c.steps));
        }
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
    let accept = series(&|o| o.usage.speculation.accept_rate());
    let per_step = series(&profile::tokens_per_step);
    let generated = series(&|o| o.tokens.len() as f64);
    let report = json!({
        "model": dir.display().to_string(),
        "threads": model.threads(),
        "prompt_len": prompt_len,
        "gen_len": gen_len,
        "runs": args.runs,
        "warmup": args.warmup,
        "prefill_tok_s": prefill,
        "decode_tok_s": decode,
        "ttft_ms": ttft,
        "load_ms": model.load_time().as_secs_f64() * 1e3,
        "kv_dtype": model.kv_dtype().name(),
        "kv_cache_bytes": model.kv_positions().map(|p| model.kv_bytes(p)),
        "peak_rss_bytes": peak_rss_bytes(),
        "weight_bytes_per_token": weight_bytes_per(&model, counters, |c| c.tokens),
        "weight_bytes_per_decode_step": (!decode_bytes.is_empty()).then(|| stats(&decode_bytes)["median"].clone()),
        "moe": moe_report(model.counters(), counters),
        "generated_tokens": stats(&generated),
        "speculative": model.speculation().map(|(mode, _)| mode),
        "spec_accept_rate": stats(&accept),
        "spec_tokens_per_step": stats(&per_step),
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
        if let Some(mode) = model.speculation().map(|(mode, _)| mode) {
            let median = |k: &str| report[k]["median"].as_f64().unwrap_or_default();
            writeln!(
                stdout,
                "speculation ({mode}) median accept rate {:.0}%, {:.2} tokens per decode step",
                100.0 * median("spec_accept_rate"),
                median("spec_tokens_per_step")
            )?;
        }
        if let Some(rss) = peak_rss_bytes() {
            writeln!(stdout, "peak RSS {}", crate::options::mib(rss))?;
        }
    }
    if args.profile {
        profile::print(&model, &outs);
    }
    Ok(())
}

/// Weight bytes read since `since` per unit of `count`: per token fed (prefill and decode) or
/// per forward step, when the backend counts them.
fn weight_bytes_per(
    model: &Model,
    since: StepCounters,
    count: impl Fn(&StepCounters) -> u64,
) -> Option<f64> {
    let now = model.counters();
    let units = count(&now) - count(&since);
    (now.weight_bytes > 0 && units > 0)
        .then(|| (now.weight_bytes - since.weight_bytes) as f64 / units as f64)
}

/// A mixture-of-experts model's routing since `since`: distinct experts each MoE layer
/// computed per forward (each streamed its weights once) and tokens per computed expert
/// (how many shared those weights); `null` for a dense model or a backend that does not count.
fn moe_report(now: StepCounters, since: StepCounters) -> serde_json::Value {
    let (layers, experts, routes) = (
        now.moe_layers - since.moe_layers,
        now.moe_experts - since.moe_experts,
        now.moe_routes - since.moe_routes,
    );
    if layers == 0 {
        return serde_json::Value::Null;
    }
    let r = now.experts;
    let (hits, misses) = (r.hits - since.experts.hits, r.misses - since.experts.misses);
    json!({
        "layer_runs": layers,
        "experts_per_layer_step": experts as f64 / layers as f64,
        "tokens_per_expert": routes as f64 / experts.max(1) as f64,
        "weight_budget_bytes": (r.budget > 0).then_some(r.budget),
        "expert_hits": hits,
        "expert_misses": misses,
        "expert_hit_rate": hits as f64 / (hits + misses).max(1) as f64,
        "expert_bytes_read": r.miss_bytes - since.experts.miss_bytes,
        "expert_evictions": r.evictions - since.experts.evictions,
        "expert_resident_bytes": r.resident_bytes,
        "expert_peak_bytes": r.peak_bytes,
        "page_faults": page_faults(),
        "rss_anon_bytes": status_bytes("RssAnon:"),
        "rss_file_bytes": status_bytes("RssFile:"),
    })
}

/// This process's page faults so far, `{minor, major}` (`getrusage`).
fn page_faults() -> serde_json::Value {
    // SAFETY: getrusage writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return serde_json::Value::Null;
    }
    json!({"minor": usage.ru_minflt, "major": usage.ru_majflt})
}

/// A `kB` line of `/proc/self/status` in bytes.
fn status_bytes(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// `--batch N`: per run, N sequences of the prompt prefilled in one step, then decoded in
/// lockstep; aggregate throughput and weight bytes per decode step and per decoded token.
fn run_batch(
    args: &Args,
    model: &mut Model,
    ids: &[u32],
    options: &GenerateOptions,
) -> anyhow::Result<()> {
    let n = args.batch as usize;
    let (mut prefill, mut decode, mut per_step, mut per_token) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Counters at the start of the first measured decode.
    let mut measured = model.counters();
    for i in 0..args.warmup + args.runs {
        if i == args.warmup {
            model.set_profiling(args.profile);
        }
        model.reset();
        // Sequences spread over the --lora adapters, in turn.
        let mut seqs = (0..n)
            .map(|s| {
                let adapter = (args.run.lora.get(s % args.run.lora.len().max(1)))
                    .map(|(name, _)| name.clone());
                let options = GenerateOptions {
                    adapter,
                    ..options.clone()
                };
                model.start(ids, &options, None)
            })
            .collect::<Result<Vec<Sequence>, _>>()?;
        let mut refs: Vec<&mut Sequence> = seqs.iter_mut().collect();
        let started = Instant::now();
        for r in model.advance_batch(&mut refs, usize::MAX) {
            r?;
        }
        let prefilled = started.elapsed().as_secs_f64();
        let (before, started) = (model.counters(), Instant::now());
        if i == args.warmup {
            measured = before;
        }
        let (mut steps, mut tokens) = (0u64, 0u64);
        // Lockstep until the first sequence finishes (a constraint's text may end early, and
        // speculative steps give several tokens).
        let mut finished = false;
        while !finished && refs.iter().all(|s| s.pending() > 0) {
            for r in model.advance_batch(&mut refs, usize::MAX) {
                let got = r?;
                tokens += got.len() as u64;
                finished |= got.iter().any(|token| token.finish.is_some());
            }
            steps += 1;
        }
        let decoded = started.elapsed().as_secs_f64();
        let after = model.counters();
        for s in seqs {
            model.end(s);
        }
        if i < args.warmup {
            continue;
        }
        prefill.push((n * ids.len()) as f64 / prefilled);
        decode.push(tokens as f64 / decoded);
        let bytes = (after.weight_bytes - before.weight_bytes) as f64;
        per_step.push(bytes / steps.max(1) as f64);
        per_token.push(bytes / tokens.max(1) as f64);
        if !args.json {
            eprintln!(
                "run {}: batch {n} | prefill {:.1} tok/s | decode {:.1} tok/s aggregate, {:.1} per sequence | weights {:.1} MB per step, {:.2} MB per token",
                i - args.warmup + 1,
                prefill.last().unwrap_or(&0.0),
                decode.last().unwrap_or(&0.0),
                decode.last().unwrap_or(&0.0) / n as f64,
                per_step.last().unwrap_or(&0.0) / 1e6,
                per_token.last().unwrap_or(&0.0) / 1e6,
            );
        }
    }
    let report = json!({
        "model": model.dir().display().to_string(),
        "threads": model.threads(),
        "kv_dtype": model.kv_dtype().name(),
        "batch": n,
        "adapters": args.run.lora.len(),
        "adapter_bytes": model.adapters().iter().map(|a| a.bytes).sum::<usize>(),
        "prompt_len": ids.len(),
        "gen_len": options.max_new_tokens,
        "runs": args.runs,
        "prefill_tok_s": stats(&prefill),
        "decode_tok_s": stats(&decode),
        "weight_bytes_per_step": stats(&per_step),
        "weight_bytes_per_token": stats(&per_token),
        "moe": moe_report(model.counters(), measured),
        "peak_rss_bytes": peak_rss_bytes(),
    });
    let mut stdout = std::io::stdout().lock();
    if args.json {
        writeln!(stdout, "{report}")?;
    } else {
        let median = |k: &str| report[k]["median"].as_f64().unwrap_or_default();
        writeln!(
            stdout,
            "{}\nbatch {n} over {} LoRA adapters, prompt {} tokens, {} generated, {} runs after {} warm-up",
            model.dir().display(),
            args.run.lora.len(),
            ids.len(),
            options.max_new_tokens,
            args.runs,
            args.warmup
        )?;
        writeln!(
            stdout,
            "prefill  median {:>8.1} tok/s aggregate",
            median("prefill_tok_s")
        )?;
        writeln!(
            stdout,
            "decode   median {:>8.1} tok/s aggregate",
            median("decode_tok_s")
        )?;
        writeln!(
            stdout,
            "weights  {:.1} MB per step, {:.2} MB per generated token",
            median("weight_bytes_per_step") / 1e6,
            median("weight_bytes_per_token") / 1e6
        )?;
        if let Some(rss) = peak_rss_bytes() {
            writeln!(stdout, "peak RSS {}", crate::options::mib(rss))?;
        }
    }
    if args.profile {
        profile::print_ops(model);
    }
    Ok(())
}
