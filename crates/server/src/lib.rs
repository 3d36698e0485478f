//! oxgen-server: an OpenAI-compatible HTTP API over one [`oxgen::Model`].
//!
//! Threads: a small tokio runtime answers HTTP and streams results on one worker, and
//! tokenizes prompts on at most one blocking thread (so a huge prompt does not stall every
//! other connection); one engine thread owns the model and runs the scheduler loop
//! ([`engine`]), its kernels fanning out over the model's own compute pool, of which the
//! engine thread is one. So the busy threads are the pool's; the HTTP worker wakes for a
//! few microseconds per streamed token. Measured on 2 cores (`bench/serve_load.py`): the
//! pool on both cores decodes 130 tok/s beside the HTTP worker, on one core 74 tok/s, so
//! `oxgen serve` gives the kernels every core by default.
//!
//! ```no_run
//! use oxgen_server::{Config, Server};
//!
//! let config = Config::new("my-model");
//! let server = Server::start(config, "127.0.0.1:8080", Box::new(|| {
//!     oxgen::Model::open("path/to/package", &Default::default()).map_err(|e| e.to_string())
//! }))?;
//! server.wait()?; // until SIGTERM / Ctrl-C (with `config.handle_signals`) or `shutdown`
//! # Ok::<(), String>(())
//! ```

mod adapters;
mod api;
mod error;
mod keep_alive;
mod metrics;
mod models;
mod routes;
mod serving;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use oxgen::{Model, SamplingParams, ToolFormat};
use tokio::sync::Notify;

pub use error::ApiError;
pub use models::{Catalog, KeepAlive, Load, ModelSpec, Opened};

use models::{Entry, Lease, Models};
use serving::Loaded;

/// The endpoints whose bodies [`validate_request`] parses.
pub const REQUEST_ENDPOINTS: [&str; 6] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/api/chat",
    "/api/generate",
];

/// Parses and validates a request body as `POST endpoint` (one of [`REQUEST_ENDPOINTS`])
/// does, against a 49152-id vocabulary and the default limits, with no model loaded and
/// unknown fields ignored: what the fuzzer (`fuzz/`) and tests drive with arbitrary bytes.
pub fn validate_request(endpoint: &str, body: &[u8]) -> Result<(), ApiError> {
    let defaults = SamplingParams::default();
    let bounds = api::Bounds {
        defaults: &defaults,
        vocab: 49152,
        max_n: DEFAULT_MAX_BATCH,
        max_tokens_limit: DEFAULT_MAX_TOKENS_LIMIT,
    };
    match endpoint {
        "/v1/chat/completions" => drop(api::chat(body, &bounds, false)?),
        "/v1/completions" => drop(api::completion(body, &bounds, false)?),
        "/v1/responses" => drop(api::responses(body, &bounds, false)?),
        "/v1/messages" => drop(api::messages(body, &bounds, false, false)?),
        "/api/chat" => drop(api::ollama_chat(body, &bounds, false)?),
        "/api/generate" => drop(api::ollama_generate(body, &bounds, false)?),
        other => return Err(ApiError::not_found(format!("no endpoint {other}"))),
    }
    Ok(())
}
pub use metrics::Metrics;

use oxgen::engine;

/// How the server behaves; the CLI fills it from flags and `OXGEN_*` variables.
#[derive(Debug, Clone)]
pub struct Config {
    /// The id clients name in `model`.
    pub model_id: String,
    /// Other names accepted in `model`.
    pub aliases: Vec<String>,
    /// When set, every endpoint but `/health` needs `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Requests waiting for a slot in the running set beyond this many get 429. At least 1
    /// (0 is taken as 1: every request waits in the queue, however briefly, on its way in).
    pub max_queue: usize,
    /// Sequences generating at once (a request with `n` choices counts `n`); also bounds `n`.
    pub max_batch: usize,
    /// Prompt ids a sequence feeds per step: longer prompts are prefilled a chunk per step,
    /// between the decode steps of the others.
    pub prefill_chunk: usize,
    /// The most tokens one request may ask for, and what it gets when it asks for none.
    pub max_tokens_limit: usize,
    /// From arrival to the last token; `None` (or one too large to add to a time): no limit.
    pub request_timeout: Option<Duration>,
    /// Request bodies over this many bytes get 413.
    pub max_body: usize,
    /// A request body that takes longer to arrive gets 408.
    pub body_timeout: Duration,
    /// A connection whose request head (request line and headers) has not arrived this long
    /// after it could start, when the connection opened or the previous response ended, is
    /// closed: slow or idle clients cannot hold connections forever.
    pub header_timeout: Duration,
    /// On shutdown, how long running requests may take to finish (one too large to add to a
    /// time: no limit).
    pub shutdown_timeout: Duration,
    /// Stop on SIGTERM and Ctrl-C (the CLI; in-process tests call [`Server::shutdown`]).
    pub handle_signals: bool,
    /// How tool calls are written and parsed; `None`: what the chat template implies.
    pub tool_parser: Option<ToolFormat>,
    /// A request field this server does not implement is a 400 (else it is ignored and
    /// named in the `x-oxgen-ignored-fields` response header).
    pub strict_api: bool,
    /// Origins browsers may call from (`*`: any); empty: no CORS headers, no preflights.
    pub cors_origins: Vec<String>,
    /// Responses API objects kept for `previous_response_id` and `GET /v1/responses/{id}`
    /// (the newest this many; 0: none).
    pub responses_store: usize,
    /// Serve the chat page at `/`.
    pub webui: bool,
    /// Which JSON schemas get their objects closed (`additionalProperties: false` where they
    /// say nothing of it).
    pub close_objects: CloseObjects,
    /// Bytes the resident models (weights and KV caches) may hold together; past it the
    /// least recently used idle ones are unloaded. `None`: no bound.
    pub memory_budget: Option<u64>,
    /// Serve the admin endpoints (`/admin/models`: list, load, unload), behind the API key.
    pub admin: bool,
}

/// Whose objects are closed ([`oxgen::close_objects`]): a request's `close_objects` field
/// overrides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CloseObjects {
    /// Schemas and tools that say `strict: true`, as OpenAI's strict mode has them.
    Strict,
    /// Those, and every tool's parameters (a call's arguments are for a function that takes
    /// the parameters it declares): the default.
    #[default]
    Tools,
    /// Every schema and every tool.
    All,
}

/// [`Config::max_queue`]'s default.
pub const DEFAULT_MAX_QUEUE: usize = 64;
/// [`Config::max_batch`]'s default.
pub const DEFAULT_MAX_BATCH: usize = 8;
/// [`Config::prefill_chunk`]'s default: long enough that a prompt's chunks run near full
/// prefill speed, short enough that running streams wait about one chunk per step.
pub const DEFAULT_PREFILL_CHUNK: usize = 256;
/// [`Config::max_tokens_limit`]'s default.
pub const DEFAULT_MAX_TOKENS_LIMIT: usize = 4096;
/// [`Config::request_timeout`]'s default, in seconds.
pub const DEFAULT_REQUEST_TIMEOUT_SECS: u64 = 600;
/// [`Config::max_body`]'s default: 4 MiB.
pub const DEFAULT_MAX_BODY: usize = 4 << 20;
/// [`Config::responses_store`]'s default.
pub const DEFAULT_RESPONSES_STORE: usize = 256;
/// [`Config::body_timeout`]'s default, in seconds.
pub const DEFAULT_BODY_TIMEOUT_SECS: u64 = 30;
/// [`Config::header_timeout`]'s default, in seconds.
pub const DEFAULT_HEADER_TIMEOUT_SECS: u64 = 30;
/// The longest a load waits for busy models to go idle and leave it room in the budget.
const ROOM_WAIT: Duration = Duration::from_secs(60);
/// How often idle models are checked against their keep-alive.
const REAP_PERIOD: Duration = Duration::from_millis(100);
/// [`Config::shutdown_timeout`]'s default, in seconds.
pub const DEFAULT_SHUTDOWN_TIMEOUT_SECS: u64 = 30;

impl Config {
    /// The defaults above, no API key, no aliases.
    pub fn new(model_id: &str) -> Config {
        Config {
            model_id: model_id.into(),
            aliases: Vec::new(),
            api_key: None,
            max_queue: DEFAULT_MAX_QUEUE,
            max_batch: DEFAULT_MAX_BATCH,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            max_tokens_limit: DEFAULT_MAX_TOKENS_LIMIT,
            request_timeout: Some(Duration::from_secs(DEFAULT_REQUEST_TIMEOUT_SECS)),
            max_body: DEFAULT_MAX_BODY,
            body_timeout: Duration::from_secs(DEFAULT_BODY_TIMEOUT_SECS),
            header_timeout: Duration::from_secs(DEFAULT_HEADER_TIMEOUT_SECS),
            shutdown_timeout: Duration::from_secs(DEFAULT_SHUTDOWN_TIMEOUT_SECS),
            handle_signals: false,
            tool_parser: None,
            strict_api: false,
            cors_origins: Vec::new(),
            responses_store: DEFAULT_RESPONSES_STORE,
            webui: true,
            close_objects: CloseObjects::default(),
            memory_budget: None,
            admin: true,
        }
    }

    /// How the engine runs requests.
    fn limits(&self) -> engine::Limits {
        engine::Limits {
            max_batch: self.max_batch,
            prefill_chunk: self.prefill_chunk,
            max_queue: self.max_queue,
            request_timeout: self.request_timeout,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    Loading = 0,
    Ready = 1,
    Draining = 2,
    Failed = 3,
}

/// State shared by the HTTP handlers and the models' threads.
pub(crate) struct App {
    config: Config,
    /// Every model served, and which are in memory.
    models: Models,
    phase: AtomicU8,
    failure: OnceLock<String>,
    /// Tells every model's thread to fail what is left and stop.
    abort: AtomicBool,
    /// Wakes the HTTP side to shut down (signal, `Server::shutdown`, failed load).
    stop: Notify,
    metrics: Metrics,
    /// Unix seconds at start, the `created` of `/v1/models`.
    started: u64,
    /// Ignored request field names already logged.
    ignored: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Responses API objects kept (`--responses-store`).
    responses: std::sync::Mutex<routes::Store>,
    /// LoRA adapters served, by name.
    adapters: adapters::Adapters,
}

impl App {
    fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Loading,
            1 => Phase::Ready,
            2 => Phase::Draining,
            _ => Phase::Failed,
        }
    }

    fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Release);
    }

    /// Loading → Ready; a shutdown (or failure) that began during the load stands.
    fn mark_ready(&self) {
        let _ = self.phase.compare_exchange(
            Phase::Loading as u8,
            Phase::Ready as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// Any phase but Failed → Draining.
    fn begin_drain(&self) {
        let _ = self
            .phase
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                (p != Phase::Failed as u8).then_some(Phase::Draining as u8)
            });
    }

    /// Records why the server cannot go on, and stops it.
    fn fail(&self, reason: String) {
        eprintln!("oxgen serve: {reason}");
        let _ = self.failure.set(reason);
        self.set_phase(Phase::Failed);
        self.stop.notify_one();
    }

    /// Whether requests are taken now; why not when they are not.
    fn accepting(&self) -> Result<(), ApiError> {
        match self.phase() {
            Phase::Ready => Ok(()),
            _ => Err(self.not_ready()),
        }
    }

    /// A hold on the model `name` (the only one when `None` and there is one), loaded first
    /// if it is not in memory.
    async fn lease(self: &Arc<Self>, name: Option<&str>) -> Result<Lease, ApiError> {
        self.accepting()?;
        // A LoRA adapter's name (no model known by it): its base model, under the adapter.
        // Asked before a model by that name is searched for, which reads the catalog again.
        let adapter = name
            .filter(|n| !self.models.knows(n))
            .and_then(|n| Some((n, self.adapter(n)?.base)));
        let name = match (adapter.as_ref(), name) {
            (Some((_, base)), _) => base.clone(),
            (None, Some(name)) => name.to_string(),
            (None, None) => self.models.default_name().ok_or_else(|| {
                ApiError::invalid(
                    "model",
                    format!(
                        "model is required: this server serves {}",
                        quoted(&self.models.names())
                    ),
                )
            })?,
        };
        let start = |entry: Arc<Entry>| self.spawn_model(entry);
        let mut lease = self.models.acquire(&name, &start).await?;
        lease.adapter = adapter.map(|(n, _)| self.adapters.begin(n));
        Ok(lease)
    }

    /// The LoRA adapters served, by name: those loaded, and those a model loads with that has
    /// not loaded yet (a model unloaded, or not yet asked for, loads them with it).
    fn adapters_served(&self) -> Vec<(String, adapters::Lora)> {
        let mut served = self.adapters.list();
        for e in self.models.entries() {
            for (name, path) in &e.spec.lora {
                if !served.iter().any(|(n, _)| n == name) && !self.adapters.is_removed(name) {
                    let lora = adapters::Lora {
                        base: e.spec.name.clone(),
                        path: path.clone(),
                        info: None,
                    };
                    served.push((name.clone(), lora));
                }
            }
        }
        served
    }

    /// LoRA adapter `name`, when served.
    fn adapter(&self, name: &str) -> Option<adapters::Lora> {
        (self.adapters_served().into_iter())
            .find(|(n, _)| n == name)
            .map(|(_, l)| l)
    }

    /// Why no request can run in the current phase (loading, draining, failed).
    fn not_ready(&self) -> ApiError {
        match self.phase() {
            Phase::Loading | Phase::Ready => {
                ApiError::unavailable("loading", "the model is still loading; retry shortly")
            }
            Phase::Draining => {
                ApiError::unavailable("shutting_down", "the server is shutting down")
            }
            Phase::Failed => ApiError::unavailable(
                "engine_failed",
                format!(
                    "the engine failed: {}",
                    self.failure.get().map_or("unknown", String::as_str)
                ),
            ),
        }
    }
}

/// Names quoted and joined with "or".
fn quoted(names: &[String]) -> String {
    let quoted: Vec<String> = names.iter().map(|m| format!("'{m}'")).collect();
    quoted.join(" or ")
}

/// Opens the model on its thread (each time the server loads it).
pub type Open = Box<dyn Fn() -> Result<Model, String> + Send + Sync>;

/// Opens an encoder package on its thread (each time the server loads it).
pub type OpenEncoder = Box<dyn Fn() -> Result<oxgen::Embedder, String> + Send + Sync>;

/// A running server: an HTTP thread, and a thread per model in memory.
pub struct Server {
    addr: SocketAddr,
    app: Arc<App>,
    http: std::thread::JoinHandle<Result<(), String>>,
}

impl Server {
    /// Binds `addr` (port 0 picks a free one) and starts serving one language model, named
    /// by [`Config::model_id`] and [`Config::aliases`]; it loads in the background while
    /// `/health` answers 503, and stays loaded. A failed load stops the server.
    pub fn start(config: Config, addr: &str, open: Open) -> Result<Server, String> {
        let load: Load = Arc::new(move || open().map(Opened::Lm));
        Server::start_one(config, addr, load)
    }

    /// [`Server::start`] for an encoder package: `/v1/embeddings` and `/v1/rerank` run on it,
    /// generation endpoints answer 400.
    pub fn start_encoder(config: Config, addr: &str, open: OpenEncoder) -> Result<Server, String> {
        let load: Load = Arc::new(move || open().map(Opened::Encoder));
        Server::start_one(config, addr, load)
    }

    fn start_one(config: Config, addr: &str, load: Load) -> Result<Server, String> {
        let spec = ModelSpec {
            name: config.model_id.clone(),
            aliases: config.aliases.clone(),
            dir: None,
            bytes: 0,
            context: None,
            keep_alive: KeepAlive::Forever,
            lora: Vec::new(),
            load,
        };
        let server = Server::start_models(config, addr, vec![spec], None)?;
        let app = server.app.clone();
        let entry = app.models.entries().swap_remove(0);
        entry.begin_load();
        app.spawn_model(entry)?;
        Ok(server)
    }

    /// Serves several models, each loaded when a request first names it and unloaded when
    /// idle past its keep-alive or when [`Config::memory_budget`] needs its room: `models`
    /// as given, and what `catalog` lists (read again when a request names a model not
    /// known).
    pub fn start_models(
        config: Config,
        addr: &str,
        models: Vec<ModelSpec>,
        catalog: Option<Box<dyn Catalog>>,
    ) -> Result<Server, String> {
        let listener = std::net::TcpListener::bind(addr).map_err(|e| {
            format!("cannot listen on {addr}: {e} (is another server using the port? pick one with --port)")
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("{addr}: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let store = routes::Store::new(config.responses_store);
        let single = catalog.is_none() && models.len() == 1;
        let models = Models::new(
            models,
            catalog,
            config.memory_budget,
            config.request_timeout.unwrap_or(ROOM_WAIT).min(ROOM_WAIT),
        );
        let app = Arc::new(App {
            config,
            models,
            // One model given loads now (and the server is ready once it has); models loaded
            // on demand leave the server ready at once.
            phase: AtomicU8::new(match single {
                true => Phase::Loading as u8,
                false => Phase::Ready as u8,
            }),
            failure: OnceLock::new(),
            abort: AtomicBool::new(false),
            stop: Notify::new(),
            metrics: Metrics::default(),
            started,
            ignored: Default::default(),
            responses: std::sync::Mutex::new(store),
            adapters: adapters::Adapters::default(),
        });
        let http_app = app.clone();
        let http = std::thread::Builder::new()
            .name("oxgen-http".into())
            .spawn(move || serve_http(http_app, listener))
            .map_err(|e| format!("starting the HTTP thread: {e}"))?;
        Ok(Server { addr, app, http })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops as SIGTERM does: new requests get 503, running ones finish (up to
    /// [`Config::shutdown_timeout`]), then the server exits.
    pub fn shutdown(self) -> Result<(), String> {
        self.app.stop.notify_one();
        self.wait()
    }

    /// Blocks until the server stops; an error if the engine failed (the model did not load,
    /// or the engine thread panicked).
    pub fn wait(self) -> Result<(), String> {
        let served = self
            .http
            .join()
            .map_err(|_| "the HTTP thread panicked".to_string())?;
        served?;
        match self.app.failure.get() {
            Some(reason) => Err(reason.clone()),
            None => Ok(()),
        }
    }
}

fn serve_http(app: Arc<App>, listener: std::net::TcpListener) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        // Prompts are tokenized here (`spawn_blocking`): one thread keeps the budget.
        .max_blocking_threads(1)
        .thread_name("oxgen-http-io")
        .enable_all()
        .build()
        .map_err(|e| format!("starting the HTTP runtime: {e}"))?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
        let router = routes::router(app.clone());
        let reaper = app.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REAP_PERIOD).await;
                reaper.models.reap();
            }
        });
        let shutdown = async {
            wait_for_stop(&app).await;
            drain(&app).await;
        };
        accept(listener, router, app.config.header_timeout, shutdown).await;
        Ok(())
    })
}

/// Serves HTTP/1.1 connections from `listener` until `shutdown` resolves, then waits up to
/// [`CONNECTION_GRACE`] for open connections to finish their exchange and close.
async fn accept(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    header_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of descriptors and the like: the connection is gone; pause, go on.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Streamed tokens leave at once, not when a segment fills.
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // A client that went away or stalled past the header timeout: nothing to do.
            let _ = connection.await;
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(CONNECTION_GRACE, graceful.shutdown()).await;
}

/// Resolves on `Server::shutdown`, a failed load, or (when handled) SIGTERM / Ctrl-C.
async fn wait_for_stop(app: &App) {
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    if app.config.handle_signals {
        tokio::select! {
            () = app.stop.notified() => {}
            () = terminate => eprintln!("oxgen serve: SIGTERM, draining"),
            _ = tokio::signal::ctrl_c() => eprintln!("oxgen serve: interrupted, draining"),
        }
    } else {
        app.stop.notified().await;
    }
}

/// New requests get 503 from here on; running and queued ones get until the shutdown
/// timeout to finish, then the engine fails what is left. A failed engine answers nothing
/// more (its requests already got errors when it went), so there is nothing to wait for.
async fn drain(app: &App) {
    app.begin_drain();
    if app.phase() == Phase::Failed {
        return;
    }
    // Pairs with the fence in `submit` between counting a request and its last look at the
    // phase: either that look sees Draining, or `live` below counts the request.
    std::sync::atomic::fence(Ordering::SeqCst);
    settle(app, app.config.shutdown_timeout).await;
    app.abort.store(true, Ordering::Relaxed);
    app.models.abort_all();
    // Let the engine answer what it still held.
    settle(app, ENGINE_STOP_GRACE).await;
}

/// How long the engine gets to fail what it held once told to stop.
const ENGINE_STOP_GRACE: Duration = Duration::from_secs(2);

/// How long connections get to close after the drain. A shutdown takes at most
/// `shutdown_timeout` + `ENGINE_STOP_GRACE` + `CONNECTION_GRACE`; the deployment files'
/// stop timeouts cover that sum (scripts/check_deploy.py reads both constants).
const CONNECTION_GRACE: Duration = Duration::from_secs(5);

/// Waits until no request is queued or running, or `within` has passed (a `within` too
/// large to add to a time: no limit).
async fn settle(app: &App, within: Duration) {
    let deadline = Instant::now().checked_add(within);
    let live = || app.models.live();
    while live() > 0 && deadline.is_none_or(|d| Instant::now() < d) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
