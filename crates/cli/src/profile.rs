//! What `--profile` prints (to stderr), and the one-line summary after a generation.

use std::time::Duration;

use oxgen::{Model, Output, quantile};

use crate::options::{mib, peak_rss_bytes};

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// prompt tokens (reused), TTFT, prefill and decode throughput, finish reason, and what
/// speculation did.
pub fn summary(out: &Output) -> String {
    let t = &out.timings;
    let mut line = format!(
        "prompt {} tokens ({} reused) | TTFT {} | prefill {:.1} tok/s | {} tokens, decode {:.1} tok/s | {}",
        out.usage.prompt_tokens,
        out.usage.prefix_reused,
        ms(t.ttft),
        t.prefill_tok_s,
        out.usage.completion_tokens,
        t.decode_tok_s,
        out.finish_reason.as_str()
    );
    let spec = out.usage.speculation;
    if spec.proposed > 0 {
        line.push_str(&format!(
            " | speculation {} of {} accepted ({:.0}%), {:.2} tokens per decode step",
            spec.accepted,
            spec.proposed,
            100.0 * spec.accept_rate(),
            tokens_per_step(out)
        ));
    }
    line
}

/// Generated tokens per decode forward: 1 without speculation.
pub fn tokens_per_step(out: &Output) -> f64 {
    let decode_steps = out.usage.steps.saturating_sub(1);
    if decode_steps == 0 {
        return 1.0;
    }
    out.tokens.len().saturating_sub(1) as f64 / decode_steps as f64
}

/// The full profile of one or more generations with `model`.
pub fn print(model: &Model, outs: &[Output]) {
    let Some(last) = outs.last() else {
        return;
    };
    let mut latencies: Vec<Duration> = outs
        .iter()
        .flat_map(|o| o.timings.inter_token.iter().copied())
        .collect();
    latencies.sort();
    eprintln!("model load      {}", ms(model.load_time()));
    eprintln!(
        "backend         {}, {} threads",
        model.backend(),
        model.threads()
    );
    eprintln!("TTFT            {}", ms(last.timings.ttft));
    eprintln!("prefill         {:.1} tok/s", last.timings.prefill_tok_s);
    eprintln!("decode          {:.1} tok/s", last.timings.decode_tok_s);
    eprintln!(
        "inter-token     p50 {} | p90 {} | p99 {}",
        ms(quantile(&latencies, 0.5)),
        ms(quantile(&latencies, 0.9)),
        ms(quantile(&latencies, 0.99))
    );
    eprintln!("prefix reused: {} tokens", last.usage.prefix_reused);
    if let Some((mode, total)) = model.speculation() {
        let proposed: u64 = outs.iter().map(|o| o.usage.speculation.proposed).sum();
        let accepted: u64 = outs.iter().map(|o| o.usage.speculation.accepted).sum();
        let steps: f64 = outs.iter().map(tokens_per_step).sum();
        eprintln!(
            "speculation     {mode}: {accepted} of {proposed} proposed ids accepted ({:.0}%), \
             {:.2} tokens per decode step; {} verifications since load",
            100.0 * accepted as f64 / proposed.max(1) as f64,
            steps / outs.len() as f64,
            total.verify_steps
        );
    }
    if let Some(positions) = model.kv_positions() {
        eprintln!(
            "KV cache        {} ({positions} positions)",
            mib(model.kv_bytes(positions) as u64)
        );
    }
    if let Some(rss) = peak_rss_bytes() {
        eprintln!("peak RSS        {}", mib(rss));
    }
    print_ops(model);
}

/// Weight bytes read per step and per token so far, and the time per op type.
pub fn print_ops(model: &Model) {
    let c = model.counters();
    if c.steps > 0 && c.weight_bytes > 0 {
        eprintln!(
            "weights read    {:.1} MB per step, {:.2} MB per token fed ({} steps, {} forwards, {} tokens)",
            c.weight_bytes as f64 / c.steps as f64 / 1e6,
            c.weight_bytes as f64 / c.tokens.max(1) as f64 / 1e6,
            c.steps,
            c.forwards,
            c.tokens
        );
    }
    if c.moe_layers > 0 {
        eprintln!(
            "experts         {:.2} computed per MoE layer-step, {:.2} tokens each ({} layer runs)",
            c.moe_experts as f64 / c.moe_layers as f64,
            c.moe_routes as f64 / c.moe_experts.max(1) as f64,
            c.moe_layers
        );
        let r = c.experts;
        eprintln!(
            "expert weights  {} hits, {} misses ({:.1} MB read), {} evictions; resident {:.1} MB, peak {:.1} MB{}",
            r.hits,
            r.misses,
            r.miss_bytes as f64 / 1e6,
            r.evictions,
            r.resident_bytes as f64 / 1e6,
            r.peak_bytes as f64 / 1e6,
            if r.budget > 0 {
                format!(", budget {:.1} MB", r.budget as f64 / 1e6)
            } else {
                String::new()
            }
        );
    }
    print_op_times(&model.op_times());
}

/// The table of time per op type (nothing when no op was timed).
pub fn print_op_times(times: &[oxgen::OpTime]) {
    let total: Duration = times.iter().map(|t| t.total).sum();
    if total.is_zero() {
        return;
    }
    eprintln!(
        "{:<48} {:>8} {:>11} {:>7}",
        "op type", "calls", "total ms", "share"
    );
    for t in times {
        eprintln!(
            "{:<48} {:>8} {:>11.1} {:>6.1}%",
            t.op_type,
            t.calls,
            t.total.as_secs_f64() * 1e3,
            100.0 * t.total.as_secs_f64() / total.as_secs_f64()
        );
    }
}
