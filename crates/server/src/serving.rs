//! A model's thread: it opens the model, makes it resident (counted against the budget, its
//! waiting requests woken), then runs its engine loop (a language model) or its encoder's
//! turns until it is unloaded or the server stops.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use oxgen::engine::{self, Queue};
use oxgen::{ContextLimit, Encoder, Grammars, Model, SamplingParams, ToolFormat};

use crate::App;
use crate::adapters::Lora;
use crate::models::{self, Entry, Opened, Resident, Served};

/// What the HTTP side needs of a loaded encoder (an embedding model or a reranker).
pub(crate) struct EncoderLoaded {
    pub(crate) tokenizer: oxgen::EmbedTokenizer,
    pub(crate) kind: oxgen::EncoderKind,
    /// Values per embedding (a reranker's labels).
    pub(crate) dim: usize,
    pub(crate) backend: &'static str,
    pub(crate) threads: usize,
}

/// What the HTTP side needs of the loaded model.
pub(crate) struct Loaded {
    pub(crate) encoder: Encoder,
    /// Positions a sequence may hold, and how requests are sized to fit.
    pub(crate) limit: ContextLimit,
    /// The grammar compiler (built at load), or why there is none.
    pub(crate) grammars: Result<Arc<Grammars>, String>,
    pub(crate) vocab: usize,
    pub(crate) sampling: SamplingParams,
    /// `native` or `ort`.
    pub(crate) backend: &'static str,
    /// Kernel threads, resolved.
    pub(crate) threads: usize,
    pub(crate) capabilities: oxgen::Capabilities,
    /// The paged KV pool at load, when the backend pages KV.
    pub(crate) kv: Option<oxgen::KvUsage>,
    /// What the KV cache stores.
    pub(crate) kv_dtype: oxgen::KvDtype,
    pub(crate) prefix_cache: bool,
    /// How this model writes tool calls.
    pub(crate) tool_format: ToolFormat,
    /// The end-of-sequence token (the first EOS id's text) and the beginning one, if any.
    pub(crate) eos_token: Option<String>,
    pub(crate) bos_token: Option<String>,
    /// The most LoRA adapters it holds at once.
    pub(crate) max_loras: usize,
}

impl App {
    /// Starts `entry`'s thread, which opens the model and serves it until it is unloaded.
    pub(crate) fn spawn_model(self: &Arc<Self>, entry: Arc<Entry>) -> Result<(), String> {
        let app = self.clone();
        std::thread::Builder::new()
            .name("oxgen-engine".into())
            .spawn(move || model_main(&app, &entry))
            .map(drop)
            .map_err(|e| format!("starting the model's thread: {e}"))
    }

    /// A model's load failed: requests for it get the reason; a server of one model stops.
    pub(crate) fn load_failed(&self, entry: &Entry, reason: String) {
        entry.stats.failures.fetch_add(1, Ordering::Relaxed);
        entry.settle(models::State::Failed {
            reason: reason.clone(),
            files: entry.files(),
        });
        match self.models.is_single() {
            true => self.fail(format!("loading the model: {reason}")),
            false => eprintln!(
                "oxgen serve: model '{}' failed to load: {reason}",
                entry.spec.name
            ),
        }
    }

    /// A loaded model becomes resident: counted, within the budget (or refused when it
    /// cannot fit alone), its waiting requests woken.
    pub(crate) fn resident(&self, entry: &Entry, resident: Resident) -> Option<Arc<Resident>> {
        let stats = &entry.stats;
        let micros = resident.load_time.as_micros() as u64;
        stats.loads.fetch_add(1, Ordering::Relaxed);
        stats.load_micros.fetch_add(micros, Ordering::Relaxed);
        stats.last_load_micros.store(micros, Ordering::Relaxed);
        stats.bytes.store(resident.bytes, Ordering::Relaxed);
        if let Some(budget) = self.models.budget
            && resident.bytes > budget
        {
            self.load_failed(
                entry,
                format!(
                    "it holds {} MiB (weights and KV cache), more than the whole memory budget \
                     of {} MiB (--memory-budget); raise the budget or shrink its context \
                     (ctx_size)",
                    models::mib(resident.bytes),
                    models::mib(budget)
                ),
            );
            return None;
        }
        let resident = Arc::new(resident);
        entry.settle(models::State::Ready(resident.clone()));
        // The estimate may have been short: idle models make room for what it holds.
        self.models.evict_for(0, Some(&entry.spec.name));
        self.mark_ready();
        Some(resident)
    }
}

/// Marks the model failed (and a server of one model stopped) if its thread unwinds,
/// loading or running.
struct PanicGuard<'a>(&'a App, &'a Entry);

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0
                .load_failed(self.1, "the model's thread panicked".into());
        }
    }
}

/// A model's thread: opens it, then serves it until it is unloaded or the server stops.
fn model_main(app: &App, entry: &Entry) {
    let _guard = PanicGuard(app, entry);
    let started = Instant::now();
    let opened = (entry.spec.load)();
    let load_time = started.elapsed();
    match opened {
        Err(e) => app.load_failed(entry, e),
        Ok(Opened::Lm(model)) => serve_lm(app, entry, model, load_time),
        Ok(Opened::Encoder(embedder)) => serve_encoder(app, entry, embedder, load_time),
    }
}

fn serve_encoder(app: &App, entry: &Entry, mut embedder: oxgen::Embedder, load_time: Duration) {
    let kind = embedder.kind();
    let (jobs, received) = std::sync::mpsc::channel();
    let loaded = EncoderLoaded {
        tokenizer: embedder.tokenizer().clone(),
        kind,
        dim: embedder.dim(),
        backend: embedder.backend(),
        threads: embedder.threads(),
    };
    let queue = oxgen::embed::EmbedQueue::new(jobs, entry.embed.clone(), app.config.max_queue);
    let served = Served::Encoder { loaded, queue };
    let resident = Resident::new(served, entry.spec.bytes, load_time, entry.spec.keep_alive);
    let Some(resident) = app.resident(entry, resident) else {
        return;
    };
    let what = match kind {
        oxgen::EncoderKind::Embedding { pooling, normalize } => format!(
            "embeddings of {} values ({} pooling{})",
            embedder.dim(),
            pooling.name(),
            if normalize { ", normalized" } else { "" }
        ),
        oxgen::EncoderKind::Reranker { labels } => format!("a reranker ({labels} logits)"),
    };
    eprintln!(
        "oxgen serve: encoder '{}' loaded in {:.2} s on {}: {what}, up to {} tokens",
        entry.spec.name,
        load_time.as_secs_f64(),
        embedder.backend(),
        embedder.tokenizer().max_tokens()
    );
    // Only the entry holds the resident (and so the queue) from here: unloading drops it.
    let abort = resident.abort.clone();
    drop(resident);
    oxgen::embed::serve(&mut embedder, &received, &entry.embed, &|| {
        app.abort.load(Ordering::Relaxed) || abort.load(Ordering::Relaxed)
    });
}

/// Loads the adapters served over `entry` that `model` lacks (it was loaded anew, after
/// adapters were added through the API), and records the ones it loaded with.
fn sync_adapters(app: &App, entry: &Entry, model: &mut Model) {
    let base = &entry.spec.name;
    for (name, lora) in app.adapters.of_model(base) {
        if model.adapters().iter().any(|a| a.name == name) {
            continue;
        }
        if let Err(e) = model.load_adapter(&name, &lora.path) {
            eprintln!("oxgen serve: model '{base}': {e}; the adapter is no longer served");
            app.adapters.remove(&name);
        }
    }
    for info in model.adapters() {
        if app.adapters.is_removed(&info.name) {
            // Its settings name it, but it was unloaded through the API.
            let _ = model.unload_adapter(&info.name);
            continue;
        }
        let lora = Lora {
            base: base.clone(),
            path: info.path.clone(),
            info: Some(info.clone()),
        };
        app.adapters.insert(&info.name, lora);
    }
}

fn serve_lm(app: &App, entry: &Entry, mut model: Model, load_time: Duration) {
    sync_adapters(app, entry, &mut model);
    let limit = model.context_limit();
    let started = Instant::now();
    let grammars = model.grammars().map_err(|e| e.to_string());
    let trie_ms = started.elapsed().as_secs_f64() * 1e3;
    let loaded = Loaded {
        grammars,
        encoder: model.encoder().clone(),
        limit,
        vocab: model.tokenizer().vocab_size(),
        sampling: model.default_options().sampling,
        backend: model.backend(),
        threads: model.threads(),
        capabilities: model.capabilities(),
        kv: model.kv_usage(),
        kv_dtype: model.kv_dtype(),
        prefix_cache: model.prefix_cache(),
        tool_format: app
            .config
            .tool_parser
            .unwrap_or_else(|| model.encoder().tool_format()),
        eos_token: (model.config().eos_token_ids.first())
            .and_then(|&id| model.tokenizer().id_to_token(id)),
        bos_token: (model.config().bos_token_id).and_then(|id| model.tokenizer().id_to_token(id)),
        max_loras: model.max_adapters(),
    };
    let tool_format = loaded.tool_format.name();
    // What the budget counts: the weights' files and the KV pool (all of it: a busy model
    // fills it).
    let kv_positions = match model.kv_usage() {
        Some(kv) => kv.total * kv.block_size,
        None => limit.max() * app.config.max_batch,
    };
    let bytes = entry.spec.bytes + model.kv_bytes(kv_positions) as u64;
    entry.engine.observe(app.metrics.latency.clone());
    // The KV gauges are there from the first scrape that finds the model resident.
    entry.engine.publish(&model, 0);
    let (jobs, received) = std::sync::mpsc::channel();
    let queue = Queue::new(jobs, entry.engine.clone(), app.config.limits());
    let served = Served::Lm { loaded, queue };
    let resident = Resident::new(served, bytes, load_time, entry.spec.keep_alive);
    let Some(resident) = app.resident(entry, resident) else {
        return;
    };
    eprintln!(
        "oxgen serve: model '{}' loaded in {:.2} s (grammar token trie {trie_ms:.0} ms); \
         ctx_size {}; {} MiB; tool calls: {tool_format}",
        entry.spec.name,
        model.load_time().as_secs_f64(),
        limit.max(),
        models::mib(bytes)
    );
    // Only the entry holds the resident (and so the queue) from here: unloading drops it.
    let abort = resident.abort.clone();
    drop(resident);
    let mut engine = oxgen::Engine::new(app.config.limits(), entry.engine.clone());
    engine::run(&mut model, &received, &mut engine, &|| {
        app.abort.load(Ordering::Relaxed) || abort.load(Ordering::Relaxed)
    });
}
