//! What `/metrics` reports, in Prometheus' text format: the HTTP layer's counts and latency
//! histograms, what each model's engine reports of itself ([`oxgen::EngineStatus`], read
//! here), summed over the models, and each model's loads, memory and cache counts labelled by
//! model.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::adapters::Adapters;
use crate::models::{Entry, Listed, Models, Served};

/// Latency buckets in seconds, shared by TTFT and inter-token latency.
const BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A cumulative histogram of durations.
pub struct Histogram {
    /// One count per bucket (non-cumulative), then the overflow.
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_micros: AtomicU64,
}

impl Histogram {
    fn new() -> Histogram {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let bucket = BUCKETS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(BUCKETS.len());
        self.counts[bucket].fetch_add(1, Relaxed);
        self.sum_micros.fetch_add(d.as_micros() as u64, Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut total = 0;
        for (i, count) in self.counts.iter().enumerate() {
            total += count.load(Relaxed);
            let le = BUCKETS.get(i).map_or("+Inf".to_string(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {total}");
        }
        let sum = self.sum_micros.load(Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {total}");
    }
}

/// Everything `/metrics` reports.
pub struct Metrics {
    /// Responses by (protocol, endpoint, status).
    requests: Mutex<BTreeMap<(&'static str, String, u16), u64>>,
    pub latency: Arc<Latency>,
}

/// Token latencies, as the engine observes them.
pub struct Latency {
    pub ttft: Histogram,
    pub inter_token: Histogram,
}

impl oxgen::engine::Observer for Latency {
    fn first_token(&self, latency: Duration) {
        self.ttft.observe(latency);
    }

    fn inter_token(&self, gap: Duration) {
        self.inter_token.observe(gap);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let latency = Arc::new(Latency {
            ttft: Histogram::new(),
            inter_token: Histogram::new(),
        });
        Metrics {
            requests: Mutex::default(),
            latency,
        }
    }
}

impl Metrics {
    pub fn count_request(&self, protocol: &'static str, endpoint: &str, status: u16) {
        let mut requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *requests
            .entry((protocol, endpoint.to_string(), status))
            .or_default() += 1;
    }

    pub(crate) fn render(&self, models: &Models, adapters: &Adapters) -> String {
        let listed = models.list();
        let sum = |f: &dyn Fn(&Entry) -> u64| listed.iter().map(|l| f(&l.entry)).sum::<u64>();
        let mut out = String::new();
        out.push_str(
            "# HELP oxgen_requests_total HTTP responses by protocol, endpoint and status.\n\
             # TYPE oxgen_requests_total counter\n",
        );
        let requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        for ((protocol, endpoint, status), n) in requests.iter() {
            let _ = writeln!(
                out,
                "oxgen_requests_total{{protocol=\"{protocol}\",endpoint=\"{endpoint}\",\
                 status=\"{status}\"}} {n}"
            );
        }
        drop(requests);
        let counters = [
            (
                "oxgen_prompt_tokens_total",
                "Prompt tokens of admitted requests.",
                sum(&|e| e.engine.prompt_tokens()),
            ),
            (
                "oxgen_generation_tokens_total",
                "Tokens generated.",
                sum(&|e| e.engine.generated_tokens()),
            ),
            (
                "oxgen_embedded_sequences_total",
                "Sequences an encoder ran (inputs embedded, query and document pairs scored).",
                sum(&|e| e.embed.sequences()),
            ),
            (
                "oxgen_embedded_tokens_total",
                "Tokens of the sequences an encoder ran.",
                sum(&|e| e.embed.tokens()),
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        }
        let gauges = [
            (
                "oxgen_queue_depth",
                "Requests waiting to run.",
                sum(&|e| (e.engine.queued() + e.embed.queued()) as u64),
            ),
            (
                "oxgen_running_requests",
                "Requests generating (or embedding).",
                sum(&|e| (e.engine.running() + e.embed.running()) as u64),
            ),
            (
                "oxgen_kv_sequences",
                "Sequences whose KV cache is held.",
                sum(&|e| e.engine.kv_sequences() as u64),
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        }
        // The engine's own figures are a model's: reported unlabelled for the one language
        // model in memory (a server of one model, as before); several report per model below.
        let mut lms = (listed.iter()).filter(|l| {
            (l.resident.as_ref()).is_some_and(|r| matches!(r.served, Served::Lm { .. }))
        });
        if let (Some(lm), None) = (lms.next(), lms.next()) {
            let engine = lm.entry.engine.model();
            render_engine(&mut out, &engine, lm.entry.engine.generated_tokens());
            render_gateway(&mut out, &lm.entry.engine, engine.kv);
        }
        render_models(&mut out, models, &listed);
        render_lora(&mut out, &listed, adapters);
        self.latency.ttft.render(
            &mut out,
            "oxgen_time_to_first_token_seconds",
            "From a request's arrival to its first generated token.",
        );
        self.latency.inter_token.render(
            &mut out,
            "oxgen_inter_token_latency_seconds",
            "Between consecutive tokens of one sequence.",
        );
        out
    }
}

/// Each model's state, memory, loads and cache counts, labelled by model, and the budget.
fn render_models(out: &mut String, models: &Models, listed: &[Listed]) {
    metric(
        out,
        "oxgen_memory_budget_bytes",
        "gauge",
        "Bytes resident models may hold together (0: no bound).",
        models.budget.unwrap_or(0),
    );
    metric(
        out,
        "oxgen_models_resident_bytes",
        "gauge",
        "Bytes the resident and loading models hold, as the budget counts them.",
        models.used(),
    );
    type Value = dyn Fn(&Listed) -> u64;
    let families: [(&str, &str, &str, &Value); 8] = [
        (
            "oxgen_model_loaded",
            "gauge",
            "1 while the model is in memory.",
            &|l| u64::from(l.resident.is_some()),
        ),
        (
            "oxgen_model_resident_bytes",
            "gauge",
            "Bytes the model holds in memory (weights and KV cache; 0 when unloaded).",
            &|l| l.resident.as_ref().map_or(0, |r| r.bytes),
        ),
        (
            "oxgen_model_loads_total",
            "counter",
            "Times the model was loaded.",
            &|l| l.entry.stats.loads.load(Relaxed),
        ),
        (
            "oxgen_model_load_failures_total",
            "counter",
            "Loads of the model that failed.",
            &|l| l.entry.stats.failures.load(Relaxed),
        ),
        (
            "oxgen_model_unloads_total",
            "counter",
            "Times the model was unloaded (idle past its keep_alive, for room, or asked).",
            &|l| l.entry.stats.unloads.load(Relaxed),
        ),
        (
            "oxgen_model_queue_depth",
            "gauge",
            "The model's requests waiting to run.",
            &|l| (l.entry.engine.queued() + l.entry.embed.queued()) as u64,
        ),
        (
            "oxgen_model_running_requests",
            "gauge",
            "The model's requests running.",
            &|l| (l.entry.engine.running() + l.entry.embed.running()) as u64,
        ),
        (
            "oxgen_model_generation_tokens_total",
            "counter",
            "Tokens the model generated.",
            &|l| l.entry.engine.generated_tokens(),
        ),
    ];
    for (name, kind, help, value) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for l in listed {
            let model = label(&l.entry.spec.name);
            let _ = writeln!(out, "{name}{{model=\"{model}\"}} {}", value(l));
        }
    }
    let _ = writeln!(
        out,
        "# HELP oxgen_model_load_seconds_total Time spent loading the model.\n\
         # TYPE oxgen_model_load_seconds_total counter"
    );
    for l in listed {
        let secs = l.entry.stats.load_micros.load(Relaxed) as f64 / 1e6;
        let _ = writeln!(
            out,
            "oxgen_model_load_seconds_total{{model=\"{}\"}} {secs}",
            label(&l.entry.spec.name)
        );
    }
    let _ = writeln!(
        out,
        "# HELP oxgen_model_requests_total Requests by model and whether it was resident \
         (hit) or had to be loaded first (miss).\n# TYPE oxgen_model_requests_total counter"
    );
    for l in listed {
        let model = label(&l.entry.spec.name);
        let stats = &l.entry.stats;
        for (cache, n) in [("hit", &stats.hits), ("miss", &stats.misses)] {
            let _ = writeln!(
                out,
                "oxgen_model_requests_total{{model=\"{model}\",cache=\"{cache}\"}} {}",
                n.load(Relaxed)
            );
        }
    }
}

/// The inference gateway's LoRA info metric (vLLM's `lora_requests_info`): adapters with
/// requests in flight as `running_lora_adapters`, and the most adapters a resident model
/// holds as `max_lora`; its value is the time of the scrape, as vLLM's is. Left out when
/// no resident model runs adapters.
fn render_lora(out: &mut String, listed: &[Listed], adapters: &Adapters) {
    let max_lora = (listed.iter().filter_map(|l| l.resident.as_ref()))
        .filter_map(|r| match &r.served {
            Served::Lm { loaded, .. } => Some(loaded.max_loras),
            Served::Encoder { .. } => None,
        })
        .max()
        .unwrap_or(0);
    if max_lora == 0 {
        return;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let _ = writeln!(
        out,
        "# HELP oxgen_lora_requests_info LoRA adapters with requests in flight and the most \
         held at once, as labels (inference gateway: LoRA info).\n\
         # TYPE oxgen_lora_requests_info gauge\n\
         oxgen_lora_requests_info{{running_lora_adapters=\"{}\",waiting_lora_adapters=\"\",\
         max_lora=\"{max_lora}\"}} {now}",
        label(&adapters.busy().join(","))
    );
}

/// A label value escaped as the text format wants.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The gauges the Kubernetes Gateway API Inference Extension's endpoint picker reads
/// (its model-server protocol: queued and running requests, KV-cache utilization as a
/// fraction, and the cache's block size and count as labels), under names its metric
/// flags can point at. `oxgen_queue_depth` and `oxgen_running_requests` carry the same
/// counts under oxgen's own names.
fn render_gateway(out: &mut String, engine: &oxgen::EngineStatus, kv: Option<oxgen::KvUsage>) {
    metric(
        out,
        "oxgen_num_requests_waiting",
        "gauge",
        "Requests queued for a slot (inference gateway: TotalQueuedRequests).",
        engine.queued(),
    );
    metric(
        out,
        "oxgen_num_requests_running",
        "gauge",
        "Requests generating (inference gateway: TotalRunningRequests).",
        engine.running(),
    );
    // Reserved, not just written: a new request waits until what it needs fits beside
    // the live sequences' reservations, so that is how full the cache is to a router.
    let usage = kv.map_or(0.0, |kv| {
        if kv.total == 0 {
            0.0
        } else {
            kv.reserved.min(kv.total) as f64 / kv.total as f64
        }
    });
    metric(
        out,
        "oxgen_kv_cache_usage_perc",
        "gauge",
        "Fraction of KV cache blocks reserved by live sequences, 0 to 1 (inference gateway: KVCacheUtilization).",
        usage,
    );
    if let Some(kv) = kv {
        let _ = writeln!(
            out,
            "# HELP oxgen_cache_config_info KV cache layout as labels: positions per block, \
                 blocks in all (inference gateway: cache info).\n\
                 # TYPE oxgen_cache_config_info gauge\n\
                 oxgen_cache_config_info{{block_size=\"{}\",num_gpu_blocks=\"{}\"}} 1",
            kv.block_size, kv.total
        );
    }
}

fn metric(out: &mut String, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

/// KV pool, prefix cache and amortization figures.
fn render_engine(out: &mut String, e: &oxgen::engine::ModelStats, generated: u64) {
    let c = &e.counters;
    metric(
        out,
        "oxgen_batch_size",
        "gauge",
        "Sequences in the last step.",
        e.batch,
    );
    metric(
        out,
        "oxgen_steps_total",
        "counter",
        "Model steps (one per turn).",
        c.steps,
    );
    metric(
        out,
        "oxgen_forwards_total",
        "counter",
        "Graph runs (one per step when batches are fused, one per sequence otherwise).",
        c.forwards,
    );
    metric(
        out,
        "oxgen_weight_bytes_read_total",
        "counter",
        "Bytes of weight matrices streamed by all forwards.",
        c.weight_bytes,
    );
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    metric(
        out,
        "oxgen_weight_bytes_per_step",
        "gauge",
        "Weight bytes read per step, since start.",
        ratio(c.weight_bytes, c.steps),
    );
    metric(
        out,
        "oxgen_weight_bytes_per_token",
        "gauge",
        "Weight bytes read per generated token, since start.",
        ratio(c.weight_bytes, generated),
    );
    if c.moe_layers > 0 {
        metric(
            out,
            "oxgen_moe_layer_runs_total",
            "counter",
            "Mixture-of-experts layers run (one per MoE node and forward).",
            c.moe_layers,
        );
        metric(
            out,
            "oxgen_moe_experts_total",
            "counter",
            "Experts those layers computed, each streaming its weights once per layer run.",
            c.moe_experts,
        );
        metric(
            out,
            "oxgen_moe_experts_per_layer_step",
            "gauge",
            "Distinct experts computed per MoE layer run, since start.",
            ratio(c.moe_experts, c.moe_layers),
        );
        metric(
            out,
            "oxgen_moe_tokens_per_expert",
            "gauge",
            "Tokens routed to each computed expert (sharing its weights), since start.",
            ratio(c.moe_routes, c.moe_experts),
        );
        let r = &c.experts;
        for (name, kind, help, value) in [
            (
                "oxgen_expert_hits_total",
                "counter",
                "Expert uses whose weights were resident.",
                r.hits,
            ),
            (
                "oxgen_expert_misses_total",
                "counter",
                "Expert uses that read their weights anew.",
                r.misses,
            ),
            (
                "oxgen_expert_read_bytes_total",
                "counter",
                "Bytes of expert weights read by misses.",
                r.miss_bytes,
            ),
            (
                "oxgen_expert_evictions_total",
                "counter",
                "Experts dropped to stay within the weight budget.",
                r.evictions,
            ),
            (
                "oxgen_expert_resident_bytes",
                "gauge",
                "Bytes of expert weights resident.",
                r.resident_bytes,
            ),
            (
                "oxgen_expert_peak_bytes",
                "gauge",
                "Most bytes of expert weights resident at once.",
                r.peak_bytes,
            ),
            (
                "oxgen_weight_budget_bytes",
                "gauge",
                "The weight budget (0: none).",
                r.budget,
            ),
        ] {
            metric(out, name, kind, help, value);
        }
    }
    if let Some(spec) = e.speculation {
        render_speculation(out, &spec);
    }
    let Some(kv) = e.kv else { return };
    let _ = writeln!(
        out,
        "# HELP oxgen_kv_blocks KV cache blocks ({} positions each) by state.\n\
         # TYPE oxgen_kv_blocks gauge",
        kv.block_size
    );
    for (state, n) in [
        ("total", kv.total),
        ("used", kv.used),
        ("free", kv.free()),
        ("cached", kv.cached),
        ("reserved", kv.reserved),
    ] {
        let _ = writeln!(out, "oxgen_kv_blocks{{state=\"{state}\"}} {n}");
    }
    metric(
        out,
        "oxgen_prefix_cache_queries_total",
        "counter",
        "Full prompt blocks that could have come from the prefix cache.",
        kv.prefix_queries,
    );
    metric(
        out,
        "oxgen_prefix_cache_hits_total",
        "counter",
        "Prompt blocks found in the prefix cache (not prefilled).",
        kv.prefix_hits,
    );
    metric(
        out,
        "oxgen_prefix_cache_disk_hits_total",
        "counter",
        "Prompt blocks read back from the disk tier (not prefilled).",
        kv.prefix_disk_hits,
    );
    metric(
        out,
        "oxgen_prefix_cache_hit_rate",
        "gauge",
        "Share of cacheable prompt blocks found in the prefix cache (memory or disk), since \
         start.",
        ratio(kv.prefix_hits + kv.prefix_disk_hits, kv.prefix_queries),
    );
    metric(
        out,
        "oxgen_kv_evictions_total",
        "counter",
        "Cached KV blocks reused for other contents (left memory).",
        kv.evictions,
    );
    let Some(d) = e.disk else { return };
    for (name, kind, help, value) in [
        (
            "oxgen_kv_disk_writes_total",
            "counter",
            "KV blocks written to the disk tier.",
            d.writes,
        ),
        (
            "oxgen_kv_disk_written_bytes_total",
            "counter",
            "Bytes written to the disk tier.",
            d.written_bytes,
        ),
        (
            "oxgen_kv_disk_read_bytes_total",
            "counter",
            "Bytes read back from the disk tier.",
            d.read_bytes,
        ),
        (
            "oxgen_kv_disk_misses_total",
            "counter",
            "Prompt blocks looked for on disk and not found.",
            d.misses,
        ),
        (
            "oxgen_kv_disk_evictions_total",
            "counter",
            "Files removed to stay under --kv-disk-budget.",
            d.evictions,
        ),
        (
            "oxgen_kv_disk_rejected_total",
            "counter",
            "Files removed because they failed the check (truncated, altered).",
            d.rejected,
        ),
        (
            "oxgen_kv_disk_dropped_total",
            "counter",
            "Blocks not written because the writer was behind.",
            d.dropped,
        ),
        (
            "oxgen_kv_disk_files",
            "gauge",
            "Files the disk tier holds.",
            d.files,
        ),
        (
            "oxgen_kv_disk_bytes",
            "gauge",
            "Bytes the disk tier holds.",
            d.bytes,
        ),
        (
            "oxgen_kv_disk_budget_bytes",
            "gauge",
            "The disk tier's budget.",
            d.budget,
        ),
        (
            "oxgen_kv_disk_writable",
            "gauge",
            "1 while the disk tier can write (0 after a write failed).",
            u64::from(d.writable),
        ),
    ] {
        metric(out, name, kind, help, value);
    }
}

fn render_speculation(out: &mut String, spec: &oxgen::SpecStats) {
    metric(
        out,
        "oxgen_spec_proposed_tokens_total",
        "counter",
        "Ids proposed for speculative verification.",
        spec.proposed,
    );
    metric(
        out,
        "oxgen_spec_accepted_tokens_total",
        "counter",
        "Proposed ids the model confirmed.",
        spec.accepted,
    );
    metric(
        out,
        "oxgen_spec_verify_steps_total",
        "counter",
        "Sequence steps that verified proposals.",
        spec.verify_steps,
    );
    metric(
        out,
        "oxgen_spec_proposer_errors_total",
        "counter",
        "Steps whose proposer failed and ran without proposals.",
        spec.proposer_errors,
    );
    metric(
        out,
        "oxgen_spec_accept_rate",
        "gauge",
        "Accepted over proposed ids, since start.",
        spec.accept_rate(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_with_sum_and_count() {
        let m = Metrics::default();
        m.latency.ttft.observe(Duration::from_millis(3));
        m.latency.ttft.observe(Duration::from_millis(40));
        m.latency.ttft.observe(Duration::from_secs(100));
        m.count_request("openai", "/v1/chat/completions", 200);
        m.count_request("openai", "/v1/chat/completions", 200);
        let text = m.render(
            &Models::new(Vec::new(), None, None, Duration::ZERO),
            &Adapters::default(),
        );
        for line in [
            "oxgen_time_to_first_token_seconds_bucket{le=\"0.0025\"} 0",
            "oxgen_time_to_first_token_seconds_bucket{le=\"0.005\"} 1",
            "oxgen_time_to_first_token_seconds_bucket{le=\"0.05\"} 2",
            "oxgen_time_to_first_token_seconds_bucket{le=\"30\"} 2",
            "oxgen_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3",
            "oxgen_time_to_first_token_seconds_sum 100.043",
            "oxgen_time_to_first_token_seconds_count 3",
            "oxgen_requests_total{protocol=\"openai\",endpoint=\"/v1/chat/completions\",\
             status=\"200\"} 2",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
