//! The models a server serves, and which of them are in memory.
//!
//! Each model a server knows is an [`Entry`]: its [`ModelSpec`] (names, folder, how to open
//! it), its state (unloaded, loading, resident, failed), and what it reports (its engine's
//! or encoder's status, load and cache counts), kept across loads. A resident model runs on
//! a thread of its own: a language model's engine loop over its [`Queue`], or an encoder's
//! turns over its [`EmbedQueue`]; dropping the [`Resident`] drops the queue, the thread's
//! loop ends and the model is freed.
//!
//! A request takes a [`Lease`] on the model it names ([`Models::acquire`]): a resident one
//! at once; one loading, after the load (every request for it waits for the one load);
//! an unloaded one is loaded first, after room is made under the memory budget by unloading
//! the least recently used idle models (never one with a lease or a request queued or
//! running). A model idle past its keep-alive is unloaded by [`Models::reap`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use oxgen::embed::{EmbedQueue, EmbedStatus};
use oxgen::engine::Queue;
use oxgen::{Embedder, EngineStatus, Model};
use tokio::sync::Notify;

use crate::error::ApiError;
pub use crate::keep_alive::KeepAlive;
use crate::serving::{EncoderLoaded, Loaded};

/// A model opened, ready to serve.
// One per model load: the variant size is irrelevant.
#[allow(clippy::large_enum_variant)]
pub enum Opened {
    /// A language model: generation endpoints.
    Lm(Model),
    /// An encoder: embeddings or reranking.
    Encoder(Embedder),
}

/// Opens a model; called on the model's own thread each time it loads.
pub type Load = Arc<dyn Fn() -> Result<Opened, String> + Send + Sync>;

/// A model the server can serve, before it is loaded.
#[derive(Clone)]
pub struct ModelSpec {
    /// The id clients name in `model`.
    pub name: String,
    /// Other names accepted in `model`.
    pub aliases: Vec<String>,
    /// The package folder. A model whose folder went away is no longer served (404).
    pub dir: Option<PathBuf>,
    /// Bytes it is expected to hold before it has loaded once (its files' sizes); after a
    /// load, what it held then (weights and KV pool) is used.
    pub bytes: u64,
    /// Positions a sequence may hold, when known before it loads (what `/v1/models` says of
    /// it while unloaded).
    pub context: Option<usize>,
    /// How long it stays in memory once idle, unless a request says otherwise.
    pub keep_alive: KeepAlive,
    /// The LoRA adapters it loads with, by name (served as models of their own).
    pub lora: Vec<(String, PathBuf)>,
    pub load: Load,
}

impl ModelSpec {
    fn answers_to(&self, name: &str) -> bool {
        self.name == name || self.aliases.iter().any(|a| a == name)
    }
}

/// Where a server's models come from: a folder of packages, read again when a request
/// names a model not yet known.
pub trait Catalog: Send + Sync {
    /// The models there now.
    fn scan(&self) -> Result<Vec<ModelSpec>, String>;
}

/// Load and cache counts of one model, kept across its loads.
#[derive(Default)]
pub(crate) struct Stats {
    pub loads: AtomicU64,
    pub load_micros: AtomicU64,
    pub last_load_micros: AtomicU64,
    pub unloads: AtomicU64,
    pub failures: AtomicU64,
    /// Requests that found it resident.
    pub hits: AtomicU64,
    /// Requests that waited for it to load.
    pub misses: AtomicU64,
    /// What it held when it last loaded (0: not loaded yet).
    pub bytes: AtomicU64,
}

/// One model the server knows.
pub(crate) struct Entry {
    pub spec: ModelSpec,
    state: Mutex<State>,
    /// Woken when a load ends, ready or failed.
    settled: Arc<Notify>,
    /// What its engine reports (a language model), kept across loads.
    pub engine: Arc<EngineStatus>,
    /// What its encoder's thread reports (an encoder), kept across loads.
    pub embed: Arc<EmbedStatus>,
    pub stats: Stats,
}

pub(crate) enum State {
    Unloaded,
    /// `reserved` bytes of the budget are held for it.
    Loading {
        reserved: u64,
    },
    Ready(Arc<Resident>),
    /// Its last load failed; tried again once its files change.
    Failed {
        reason: String,
        files: u64,
    },
}

/// A model in memory.
pub(crate) struct Resident {
    pub served: Served,
    /// Bytes it holds as the budget counts them: its weights and its KV pool.
    pub bytes: u64,
    pub load_time: Duration,
    /// Tells its thread to fail what it holds and stop.
    pub abort: Arc<AtomicBool>,
    leases: AtomicUsize,
    /// Whether a request has held it: until one has (or [`FRESH_GRACE`] has passed), it is
    /// not idle, so the requests that waited for its load find it still there.
    claimed: AtomicBool,
    loaded: Instant,
    last_used: Mutex<Instant>,
    /// When it was last seen idle (by the reaper), if it has been since its last request.
    idle_since: Mutex<Option<Instant>>,
    keep_alive: Mutex<KeepAlive>,
}

/// How long a freshly loaded model no request has held yet counts as busy.
const FRESH_GRACE: Duration = Duration::from_secs(5);

/// What a resident model serves through.
// One per resident model: the variant size is irrelevant.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Served {
    Lm {
        loaded: Loaded,
        queue: Queue,
    },
    Encoder {
        loaded: EncoderLoaded,
        queue: EmbedQueue,
    },
}

impl Resident {
    pub fn new(served: Served, bytes: u64, load_time: Duration, keep_alive: KeepAlive) -> Self {
        Resident {
            served,
            bytes,
            load_time,
            abort: Arc::default(),
            leases: AtomicUsize::new(0),
            claimed: AtomicBool::new(false),
            loaded: Instant::now(),
            last_used: Mutex::new(Instant::now()),
            idle_since: Mutex::new(None),
            keep_alive: Mutex::new(keep_alive),
        }
    }

    pub fn keep_alive(&self) -> KeepAlive {
        *lock(&self.keep_alive)
    }

    /// When it will be unloaded if no request comes (`None`: not by time).
    pub fn expires(&self) -> Option<SystemTime> {
        let since = (*lock(&self.idle_since)).map_or(self.last_used(), |s| s.max(self.last_used()));
        let at = self.keep_alive().expiry(since)?;
        let left = at.saturating_duration_since(Instant::now());
        SystemTime::now().checked_add(left)
    }
}

/// A request's hold on a resident model: while held, the model is not unloaded.
pub(crate) struct Lease {
    resident: Arc<Resident>,
    /// The model's own id (a request may have named an alias).
    pub name: String,
    /// The LoRA adapter the request named, when it named one instead of the model.
    pub adapter: Option<crate::adapters::InFlight>,
}

impl Lease {
    fn new(resident: Arc<Resident>, name: &str) -> Lease {
        resident.leases.fetch_add(1, Relaxed);
        resident.claimed.store(true, Relaxed);
        *lock(&resident.last_used) = Instant::now();
        *lock(&resident.idle_since) = None;
        Lease {
            resident,
            name: name.to_string(),
            adapter: None,
        }
    }

    /// The language model, or a 400 saying this one is an encoder.
    pub fn lm(&self) -> Result<(&Loaded, &Queue), ApiError> {
        match &self.resident.served {
            Served::Lm { loaded, queue } => Ok((loaded, queue)),
            Served::Encoder { .. } => Err(ApiError::invalid(
                "model",
                format!(
                    "'{}' is an encoder: it serves /v1/embeddings and /v1/rerank, not \
                     generation; name a language model for this endpoint",
                    self.name
                ),
            )),
        }
    }

    /// The encoder, or a 400 saying this one is a language model.
    pub fn encoder(&self) -> Result<(&EncoderLoaded, &EmbedQueue), ApiError> {
        match &self.resident.served {
            Served::Encoder { loaded, queue } => Ok((loaded, queue)),
            Served::Lm { .. } => Err(ApiError::invalid(
                "model",
                format!(
                    "'{}' is a language model; embeddings and reranking need an encoder \
                     package (`oxgen import` a sentence-transformers folder, then serve it)",
                    self.name
                ),
            )),
        }
    }

    /// Sets how long the model stays once idle (a request's `keep_alive`).
    pub fn keep_alive(&self, keep_alive: KeepAlive) {
        *lock(&self.resident.keep_alive) = keep_alive;
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        *lock(&self.resident.last_used) = Instant::now();
        self.resident.leases.fetch_sub(1, Relaxed);
    }
}

/// A model as `/v1/models`, `/api/ps` and the admin endpoints list it.
pub(crate) struct Listed {
    pub entry: Arc<Entry>,
    pub resident: Option<Arc<Resident>>,
    pub state: &'static str,
    pub error: Option<String>,
}

/// Every model the server knows, and the memory budget they share.
pub(crate) struct Models {
    catalog: Option<Box<dyn Catalog>>,
    entries: Mutex<Vec<Arc<Entry>>>,
    /// Bytes resident models (weights and KV) may hold together; `None`: no bound.
    pub budget: Option<u64>,
    /// A load waits this long for busy models to go idle and make room.
    room_wait: Duration,
    /// One model given, loaded at start: its failed load stops the server.
    single: bool,
}

/// How often a load waiting for room looks again.
const ROOM_POLL: Duration = Duration::from_millis(50);

impl Models {
    pub fn new(
        specs: Vec<ModelSpec>,
        catalog: Option<Box<dyn Catalog>>,
        budget: Option<u64>,
        room_wait: Duration,
    ) -> Models {
        Models {
            single: catalog.is_none() && specs.len() == 1,
            catalog,
            entries: Mutex::new(specs.into_iter().map(Entry::new).collect()),
            budget,
            room_wait,
        }
    }

    /// Whether the server serves one model given to it (loaded at start, kept).
    pub fn is_single(&self) -> bool {
        self.single
    }

    pub fn entries(&self) -> Vec<Arc<Entry>> {
        lock(&self.entries).clone()
    }

    /// Reads the catalog again: new packages are added, ones whose folder went away while
    /// unloaded are forgotten. Models already known keep their state.
    pub fn rescan(&self) {
        let Some(catalog) = &self.catalog else { return };
        let specs = match catalog.scan() {
            Ok(specs) => specs,
            Err(e) => return eprintln!("oxgen serve: reading the models folder: {e}"),
        };
        let mut entries = lock(&self.entries);
        entries.retain(|e| {
            // A model no longer listed goes once nothing holds it.
            let listed = specs.iter().any(|s| s.name == e.spec.name);
            listed || e.is_resident()
        });
        for spec in specs {
            if !entries.iter().any(|e| e.spec.name == spec.name) {
                entries.push(Entry::new(spec));
            }
        }
    }

    /// Names clients may use in `model`, each model's own id first (bounded for messages).
    pub fn names(&self) -> Vec<String> {
        let entries = lock(&self.entries);
        (entries.iter())
            .flat_map(|e| std::iter::once(&e.spec.name).chain(&e.spec.aliases))
            .take(MAX_NAMES_LISTED)
            .cloned()
            .collect()
    }

    /// The model a request that names none gets: the only one, when there is one.
    pub fn default_name(&self) -> Option<String> {
        let entries = lock(&self.entries);
        match entries.as_slice() {
            [only] => Some(only.spec.name.clone()),
            _ => None,
        }
    }

    /// Whether a model known now answers to `name` (the catalog is not read again).
    pub fn knows(&self, name: &str) -> bool {
        lock(&self.entries).iter().any(|e| e.spec.answers_to(name))
    }

    /// The entry answering to `name`; the catalog is read again for a name not known.
    pub fn find(&self, name: &str) -> Result<Arc<Entry>, ApiError> {
        let known = || {
            let entries = lock(&self.entries);
            entries.iter().find(|e| e.spec.answers_to(name)).cloned()
        };
        let found = known().or_else(|| {
            self.rescan();
            known()
        });
        // Ollama's clients may add the `:latest` tag to a name.
        let untagged = || name.strip_suffix(":latest").and_then(|n| self.find(n).ok());
        found
            .or_else(untagged)
            .ok_or_else(|| ApiError::model_not_found(name, &self.names()))
    }

    /// A hold on the model `name`, loaded first if it is not resident (`start` spawns its
    /// thread, which opens it and settles its state).
    pub async fn acquire(
        &self,
        name: &str,
        start: &(dyn Fn(Arc<Entry>) -> Result<(), String> + Sync),
    ) -> Result<Lease, ApiError> {
        enum Next {
            Wait,
            Load,
            Gone,
        }
        let mut entry = self.find(name)?;
        let mut waited = false;
        loop {
            let notify = entry.settled.clone();
            let settled = notify.notified();
            tokio::pin!(settled);
            // Registered before the state is read: a load that settles after this is heard.
            settled.as_mut().enable();
            let next = {
                let mut state = entry.lock();
                let next = match &*state {
                    State::Ready(resident) => {
                        let counter = match waited {
                            true => &entry.stats.misses,
                            false => &entry.stats.hits,
                        };
                        counter.fetch_add(1, Relaxed);
                        return Ok(Lease::new(resident.clone(), &entry.spec.name));
                    }
                    State::Loading { .. } => Next::Wait,
                    State::Failed { reason, files } if *files == entry.files() => {
                        return Err(load_failed(&entry.spec.name, reason));
                    }
                    State::Unloaded | State::Failed { .. } => {
                        match entry.spec.dir.as_ref().is_some_and(|d| !d.exists()) {
                            true => Next::Gone,
                            false => Next::Load,
                        }
                    }
                };
                if let Next::Load = next {
                    *state = State::Loading { reserved: 0 };
                }
                next
            };
            match next {
                Next::Wait => {}
                Next::Gone => {
                    self.rescan();
                    entry = self.find(name)?;
                    continue;
                }
                Next::Load => {
                    if let Err(e) = self.make_room(&entry).await {
                        entry.settle(State::Unloaded);
                        return Err(e);
                    }
                    if let Err(e) = start(entry.clone()) {
                        let files = entry.files();
                        entry.settle(State::Failed {
                            reason: e.clone(),
                            files,
                        });
                        return Err(load_failed(&entry.spec.name, &e));
                    }
                }
            }
            waited = true;
            settled.await;
        }
    }

    /// Bytes held by resident and loading models.
    pub fn used(&self) -> u64 {
        (self.entries().iter())
            .map(|e| match &*e.lock() {
                State::Ready(r) => r.bytes,
                State::Loading { reserved } => *reserved,
                _ => 0,
            })
            .sum()
    }

    /// Reserves `entry`'s expected bytes under the budget, unloading the least recently used
    /// idle models as needed; waits (up to `room_wait`) while only busy ones could make room.
    async fn make_room(&self, entry: &Entry) -> Result<(), ApiError> {
        let need = entry.expected_bytes();
        let Some(budget) = self.budget else {
            entry.set_reserved(need);
            return Ok(());
        };
        if need > budget {
            return Err(over_budget(&entry.spec.name, need, budget));
        }
        let deadline = Instant::now() + self.room_wait;
        loop {
            if self.evict_for(need, Some(&entry.spec.name)) {
                entry.set_reserved(need);
                return Ok(());
            }
            if Instant::now() >= deadline {
                let busy: Vec<String> = (self.entries().iter())
                    .filter(|e| e.is_resident())
                    .map(|e| format!("'{}'", e.spec.name))
                    .collect();
                let mut e = ApiError::unavailable(
                    "memory_budget_full",
                    format!(
                        "'{}' needs {} MiB but the memory budget ({} MiB, --memory-budget) is \
                         held by models with requests running ({}); retry shortly",
                        entry.spec.name,
                        mib(need),
                        mib(budget),
                        busy.join(", ")
                    ),
                );
                e.retry_after = Some(5);
                return Err(e);
            }
            tokio::time::sleep(ROOM_POLL).await;
        }
    }

    /// Unloads idle models, least recently used first, until `need` more bytes fit the
    /// budget; whether they do.
    pub fn evict_for(&self, need: u64, for_model: Option<&str>) -> bool {
        let Some(budget) = self.budget else {
            return true;
        };
        loop {
            let used = self.used();
            if used.saturating_add(need) <= budget {
                return true;
            }
            let victim = (self.entries().into_iter())
                .filter(|e| Some(e.spec.name.as_str()) != for_model)
                .filter_map(|e| {
                    let last = e.idle_resident()?.last_used();
                    Some((last, e))
                })
                .min_by_key(|(last, _)| *last);
            let Some((_, victim)) = victim else {
                return false;
            };
            let why = match for_model {
                Some(name) => format!("making room for '{name}'"),
                None => "the memory budget is exceeded".into(),
            };
            // Taken meanwhile by a request: look again.
            victim.unload(&why);
        }
    }

    /// Unloads idle models whose keep-alive has lapsed, counted from when they went idle;
    /// called periodically.
    pub fn reap(&self) {
        let now = Instant::now();
        for entry in self.entries() {
            let resident = match &*entry.lock() {
                State::Ready(r) => r.clone(),
                _ => continue,
            };
            if entry.idle_resident().is_none() {
                *lock(&resident.idle_since) = None;
                continue;
            }
            let since = *lock(&resident.idle_since).get_or_insert(now);
            let lapsed = (resident.keep_alive())
                .expiry(since.max(resident.last_used()))
                .is_some_and(|at| at <= now);
            if lapsed {
                entry.unload("its keep_alive lapsed");
            }
        }
    }

    /// Requests queued or running, all models together.
    pub fn live(&self) -> usize {
        (self.entries().iter())
            .map(|e| e.engine.live() + e.embed.live())
            .sum()
    }

    /// Tells every resident model's thread to fail what it holds and stop.
    pub fn abort_all(&self) {
        for entry in self.entries() {
            if let State::Ready(r) = &*entry.lock() {
                r.abort.store(true, Relaxed);
            }
        }
    }

    /// Every model, with its state.
    pub fn list(&self) -> Vec<Listed> {
        (self.entries().into_iter())
            .map(|entry| {
                let (state, resident, error) = match &*entry.lock() {
                    State::Unloaded => ("unloaded", None, None),
                    State::Loading { .. } => ("loading", None, None),
                    State::Ready(r) => ("loaded", Some(r.clone()), None),
                    State::Failed { reason, .. } => ("failed", None, Some(reason.clone())),
                };
                Listed {
                    entry,
                    resident,
                    state,
                    error,
                }
            })
            .collect()
    }
}

/// Model names an error message lists at most.
const MAX_NAMES_LISTED: usize = 32;

impl Entry {
    fn new(spec: ModelSpec) -> Arc<Entry> {
        Arc::new(Entry {
            spec,
            state: Mutex::new(State::Unloaded),
            settled: Arc::default(),
            engine: Arc::default(),
            embed: Arc::default(),
            stats: Stats::default(),
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Marks it loading (its thread is about to start) with nothing reserved.
    pub fn begin_load(&self) {
        *self.lock() = State::Loading { reserved: 0 };
    }

    /// Ends a load (or an unload): the new state, and every request waiting is woken.
    pub fn settle(&self, state: State) {
        *self.lock() = state;
        self.settled.notify_waiters();
    }

    fn set_reserved(&self, bytes: u64) {
        if let State::Loading { reserved } = &mut *self.lock() {
            *reserved = bytes;
        }
    }

    /// Bytes it is expected to hold: what it held last time, else its files' size.
    fn expected_bytes(&self) -> u64 {
        match self.stats.bytes.load(Relaxed) {
            0 => self.spec.bytes,
            measured => measured,
        }
    }

    pub fn is_resident(&self) -> bool {
        matches!(&*self.lock(), State::Ready(_) | State::Loading { .. })
    }

    /// The resident model when no request holds it, is queued or runs on it.
    fn idle_resident(&self) -> Option<Arc<Resident>> {
        let state = self.lock();
        let State::Ready(r) = &*state else {
            return None;
        };
        self.is_idle(r).then(|| r.clone())
    }

    /// Whether `r` (its resident model, read under the state's lock) is idle.
    fn is_idle(&self, r: &Resident) -> bool {
        let fresh = !r.claimed.load(Relaxed) && r.loaded.elapsed() < FRESH_GRACE;
        !fresh && r.leases.load(Relaxed) == 0 && self.engine.live() + self.embed.live() == 0
    }

    /// Unloads the model if it is resident and idle (its thread ends once the queue is
    /// dropped, and frees it); whether it did. `why` is logged. Idleness is judged under the
    /// state's lock, which a request takes its lease under: none can start on it meanwhile.
    pub fn unload(&self, why: &str) -> bool {
        let resident = {
            let mut state = self.lock();
            let State::Ready(r) = &*state else {
                return false;
            };
            if !self.is_idle(r) {
                return false;
            }
            let State::Ready(r) = std::mem::replace(&mut *state, State::Unloaded) else {
                unreachable!("matched above under the same lock");
            };
            r
        };
        self.stats.unloads.fetch_add(1, Relaxed);
        eprintln!(
            "oxgen serve: unloaded '{}' ({} MiB): {why}",
            self.spec.name,
            mib(resident.bytes)
        );
        self.settled.notify_waiters();
        true
    }

    /// A fingerprint of the package's files (sizes and modification times): a failed load
    /// is tried again once it changes.
    pub fn files(&self) -> u64 {
        let Some(dir) = &self.spec.dir else { return 0 };
        let Ok(read) = std::fs::read_dir(dir) else {
            return 0;
        };
        read.flatten()
            .filter_map(|f| f.metadata().ok())
            .map(|m| {
                let modified = (m.modified().ok())
                    .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_nanos() as u64);
                m.len().wrapping_mul(31).wrapping_add(modified)
            })
            .fold(0u64, |acc, x| acc.wrapping_add(x.rotate_left(7) ^ acc))
    }
}

impl Resident {
    fn last_used(&self) -> Instant {
        *lock(&self.last_used)
    }
}

fn load_failed(name: &str, reason: &str) -> ApiError {
    let mut e = ApiError::unavailable(
        "model_load_failed",
        format!("the model '{name}' failed to load: {reason}"),
    );
    e.retry_after = None;
    e
}

fn over_budget(name: &str, need: u64, budget: u64) -> ApiError {
    let mut e = ApiError::unavailable(
        "model_too_large",
        format!(
            "the model '{name}' needs {} MiB, more than the whole memory budget of {} MiB \
             (--memory-budget); raise the budget or shrink the model's context (ctx_size)",
            mib(need),
            mib(budget)
        ),
    );
    e.retry_after = None;
    e
}

/// Bytes in MiB, rounded up.
pub(crate) fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
