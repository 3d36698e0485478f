//! The endpoints: OpenAI's completion APIs (a request parsed by `api`, prepared here:
//! tokenized, constrained, sized and queued for the engine; answered by `response`), models,
//! health and metrics; the other protocols' adapters (`responses`, `anthropic`, `ollama`,
//! each a request parsed by `api`, prepared and queued here, and a reply encoded from
//! `turn`); the tokenizer's endpoints in `tokens`, what every endpoint shares of HTTP in
//! `http`; the chat page in `webui`.

mod admin;
mod anthropic;
mod embeddings;
mod http;
mod lora;
mod ollama;
mod openai;
mod response;
mod responses;
mod tokens;
mod turn;
mod webui;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{Method, StatusCode, Uri, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use oxgen::Constraint;
use oxgen::engine::{Event, Job, JobPrompt, Sink};
use oxgen::prepare::Prepared;
pub(super) use oxgen::prepare::Request as PrepareRequest;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};

use self::http::{MAX_IGNORED_NAME, Notes, body, cors, guard, reply};
use self::response::{Kind, Pending, collect, response_id, stream, unix_now};
pub(crate) use self::responses::Store;
use self::tokens::{detokenize, tokenize, tokenizer_info};
use crate::api::{self, Bounds};
use crate::error::{ApiError, Protocol};
use crate::models::{KeepAlive, Lease, Served};
use crate::{App, CloseObjects, Loaded, Phase};

pub fn router(app: Arc<App>) -> Router {
    let mut router = Router::new();
    if app.config.webui {
        router = webui::routes(router);
    }
    if app.config.admin {
        router = admin::routes(router);
        router = lora::routes(router);
    }
    router
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(responses::create))
        .route(
            "/v1/responses/{id}",
            get(responses::get).delete(responses::delete),
        )
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/tags", get(ollama::tags))
        .route("/api/show", post(ollama::show))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/rerank", post(embeddings::rerank))
        .route("/v2/rerank", post(embeddings::rerank))
        .route("/rerank", post(embeddings::rerank))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/tokenizer_info", get(tokenizer_info))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(app.clone(), guard))
        .fallback(|uri: Uri| async move {
            ApiError::not_found("no such endpoint").response(Protocol::of_path(uri.path()))
        })
        .method_not_allowed_fallback(|method: Method, uri: Uri| async move {
            let e = ApiError::method_not_allowed(method.as_str(), uri.path());
            e.response(Protocol::of_path(uri.path()))
        })
        .layer(middleware::from_fn_with_state(app.clone(), cors))
        .with_state(app)
}

/// Prepares a request (renders, tokenizes, compiles its constraint: [`oxgen::prepare`]) on
/// the runtime's blocking thread, so that a huge prompt does not hold up the worker
/// answering every other connection. A chat template that refuses the messages is a 422, a
/// constraint that does not compile a 400 naming the field that gave it, before anything is
/// queued. Only rendered and tokenized (`oxgen::prepare::render`) unless `whole`.
pub(super) async fn prepare(
    loaded: &Loaded,
    mut request: PrepareRequest,
    whole: bool,
) -> Result<Prepared, ApiError> {
    let encoder = loaded.encoder.clone();
    let grammars = loaded.grammars.clone();
    tokio::task::spawn_blocking(move || match whole {
        true => {
            let grammars = grammars.as_ref().map_err(String::as_str);
            oxgen::prepare::prepare(&encoder, grammars, request)
        }
        false => oxgen::prepare::render(&encoder, &mut request),
    })
    .await
    .map_err(|e| ApiError::internal(format!("preparing the prompt failed: {e}")))?
    .map_err(ApiError::from)
}

impl App {
    fn bounds<'a>(&self, loaded: &'a Loaded) -> Bounds<'a> {
        Bounds {
            defaults: &loaded.sampling,
            vocab: loaded.vocab,
            max_n: self.config.max_batch,
            max_tokens_limit: self.config.max_tokens_limit,
        }
    }

    /// The model a request's body names (its `model`, or Ollama's `name`; the only model
    /// served when it names none), held for the request and loaded first if need be, with
    /// the body's `keep_alive` applied to it.
    async fn lease_for(self: &Arc<Self>, body: &[u8]) -> Result<Lease, ApiError> {
        #[derive(serde::Deserialize, Default)]
        struct Addressed {
            model: Option<Value>,
            name: Option<Value>,
            keep_alive: Option<Value>,
        }
        let addressed: Addressed = serde_json::from_slice(body).unwrap_or_default();
        let name = match addressed.model.or(addressed.name) {
            Some(Value::String(m)) => Some(m),
            None | Some(Value::Null) => {
                // With several models a body that is not an object says so first.
                if self.models.default_name().is_none() {
                    api::object(body)?;
                }
                None
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    "model",
                    format!("model is {other}; give a model's name as a string"),
                ));
            }
        };
        let keep_alive = (addressed.keep_alive.filter(|v| !v.is_null()))
            .map(|v| KeepAlive::from_json(&v).map_err(|e| ApiError::invalid("keep_alive", e)))
            .transpose()?;
        let lease = self.lease(name.as_deref()).await?;
        if let Some(keep_alive) = keep_alive {
            lease.keep_alive(keep_alive);
        }
        Ok(lease)
    }

    /// Tokenizes, sizes and queues a request on the model `lease` holds.
    async fn submit(
        &self,
        lease: &Lease,
        kind: Kind,
        mut req: api::Request,
    ) -> Result<Pending, ApiError> {
        let (loaded, queue) = lease.lm()?;
        req.options.adapter = lease.adapter.as_ref().map(|a| a.name.clone());
        self.note_ignored(&req.ignored);
        self.close_objects(&mut req);
        let param = if kind == Kind::Chat {
            "messages"
        } else {
            "prompt"
        };
        let mut prepared = prepare(
            loaded,
            PrepareRequest {
                prompts: std::mem::take(&mut req.prompts),
                param: param.into(),
                tools: req.tools.take().map(|t| t.with_format(loaded.tool_format)),
                constraint: req.constraint.take(),
                template_kwargs: std::mem::take(&mut req.template_kwargs),
                reasoning_effort: req.reasoning_effort.take(),
                add_generation_prompt: req.render.add_generation_prompt,
                continue_final_message: req.render.continue_final_message,
                reasoning_budget: req.reasoning_budget,
                close_structured_output: req.close_structured_output,
                prediction: req.prediction.take(),
                keep_text: req.echo,
            },
            true,
        )
        .await?;
        prepared.apply(&mut req.options);
        let (mut prompts, syntax) = (std::mem::take(&mut prepared.prompts), prepared.syntax);
        // `max_tokens: 0` generates one token and drops it: the prompt's logits are computed
        // either way, and a sequence always chooses its next id.
        let discard = req.max_tokens == Some(0);
        let asked = match req.max_tokens {
            Some(0) => 1,
            Some(m) => m,
            None => self.config.max_tokens_limit,
        };
        let at = |i: usize| match prompts.len() {
            1 => param.to_string(),
            _ => format!("{param}[{i}]"),
        };
        // Every prompt of a batch generates as many as the shortest room allows, and each
        // holds the positions that takes.
        let mut max_new_tokens = asked;
        for (i, (ids, _)) in prompts.iter().enumerate() {
            if ids.is_empty() {
                return Err(ApiError::invalid(at(i), "the prompt has no tokens"));
            }
            let sizing = loaded.limit.size(ids.len(), asked).map_err(|e| {
                let mut e = ApiError::invalid(at(i), e.to_string());
                e.code = Some("context_length_exceeded");
                e
            })?;
            max_new_tokens = max_new_tokens.min(sizing.max_new_tokens);
            if let Some(ctx) = req.num_ctx {
                if ids.len() >= ctx {
                    return Err(ApiError::invalid(
                        "options.num_ctx",
                        format!(
                            "the prompt has {} tokens: options.num_ctx {ctx} leaves no room to \
                             generate",
                            ids.len()
                        ),
                    ));
                }
                max_new_tokens = max_new_tokens.min(ctx - ids.len());
            }
        }
        req.options.max_new_tokens = max_new_tokens;
        // The response needs the prompts' ids only to echo or score them.
        let keep_ids = req.echo || req.prompt_logprobs.is_some();
        let mut job_prompts = Vec::with_capacity(prompts.len());
        for (ids, _) in &mut prompts {
            let positions = (loaded.limit.size(ids.len(), max_new_tokens))
                .expect("each prompt was sized above: it leaves room to generate")
                .positions;
            let ids = match keep_ids {
                true => ids.clone(),
                false => std::mem::take(ids),
            };
            job_prompts.push(JobPrompt { ids, positions });
        }
        if let Some(kv) = &loaded.kv {
            oxgen::engine::kv_need(req.n, &job_prompts, kv)?;
        }
        let ticket = queue.reserve()?;
        // Counted as queued (and fenced as `drain` is after it marks the phase) before this
        // last look: a drain that began meanwhile is seen here, or it sees this request.
        self.accepting()?;
        let (events, receiver) = unbounded_channel();
        let arrived = Instant::now();
        ticket.send(Job {
            prompts: job_prompts,
            options: req.options,
            n: req.n,
            top_logprobs: req.top_logprobs,
            prompt_logprobs: req.prompt_logprobs,
            arrived,
            // A timeout too large to add to a time is no limit.
            deadline: self
                .config
                .request_timeout
                .and_then(|t| arrived.checked_add(t)),
            // The adapter counts as in flight until the engine lets go of the job.
            events: Box::new(Events {
                tx: events,
                _adapter: lease.adapter.clone(),
            }),
        })?;
        let prompt_count = prompts.len();
        Ok(Pending {
            kind,
            id: response_id(if kind == Kind::Chat {
                "chatcmpl-"
            } else {
                "cmpl-"
            }),
            created: unix_now(),
            model: req.model,
            n: req.n * prompt_count,
            stream: req.stream,
            include_usage: req.include_usage,
            logprobs: req.top_logprobs.is_some(),
            events: receiver,
            encoder: loaded.encoder.clone(),
            syntax,
            prompts,
            per_prompt: req.n,
            echo: req.echo,
            prompt_logprobs: req.prompt_logprobs.is_some() && !req.echo,
            discard,
            notes: Notes {
                ignored: req.ignored,
                unclosable: prepared.unclosable,
            },
        })
    }

    /// Closes the objects of the request's schema and tools as `--close-objects` (or the
    /// request's own `close_objects`) says.
    fn close_objects(&self, req: &mut api::Request) {
        let policy = self.config.close_objects;
        let schema =
            (req.close_objects).unwrap_or(policy == CloseObjects::All || req.strict_schema);
        if schema && let Some((_, Constraint::JsonSchema(s))) = &mut req.constraint {
            *s = oxgen::close_objects(s);
        }
        if let Some(tools) = &mut req.tools {
            let forced = req.close_objects;
            tools
                .close_objects(|strict| forced.unwrap_or(policy != CloseObjects::Strict || strict));
        }
    }

    /// Logs each ignored field's name the first time a request sends it.
    fn note_ignored(&self, names: &[String]) {
        if names.is_empty() {
            return;
        }
        let mut seen = self.ignored.lock().unwrap_or_else(|e| e.into_inner());
        for name in names {
            // `messages[3].refusal` is logged once as `messages[].refusal`.
            let general: String = (name.split('['))
                .map(|part| part.split_once(']').map_or(part, |(_, rest)| rest))
                .collect::<Vec<_>>()
                .join("[]")
                .escape_default()
                .take(MAX_IGNORED_NAME)
                .collect();
            if seen.len() < MAX_IGNORED_LOGGED && seen.insert(general.clone()) {
                eprintln!(
                    "oxgen serve: ignoring request field '{general}': not implemented (named \
                     in the x-oxgen-ignored-fields response header; --strict-api refuses it)"
                );
            }
        }
    }
}

/// A connection's end of a request's events, closed when the client leaves; it holds the
/// job's adapter counted as in flight.
struct Events {
    tx: UnboundedSender<Event>,
    _adapter: Option<crate::adapters::InFlight>,
}

impl Sink for Events {
    fn send(&self, event: Event) {
        let _ = self.tx.send(event);
    }

    fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Distinct ignored field names logged at most (a client inventing names cannot fill the
/// log or the memory).
const MAX_IGNORED_LOGGED: usize = 256;

async fn chat_completions(State(app): State<Arc<App>>, request: Request) -> Response {
    complete(app, request, Kind::Chat).await
}

async fn completions(State(app): State<Arc<App>>, request: Request) -> Response {
    complete(app, request, Kind::Completion).await
}

async fn complete(app: Arc<App>, request: Request, kind: Kind) -> Response {
    let pending = async {
        app.accepting()?;
        let body = body(request, app.config.max_body, app.config.body_timeout).await?;
        let lease = app.lease_for(&body).await?;
        let bounds = app.bounds(lease.lm()?.0);
        let strict = app.config.strict_api;
        let req = match kind {
            Kind::Chat => api::chat(&body, &bounds, strict)?,
            Kind::Completion => api::completion(&body, &bounds, strict)?,
        };
        app.submit(&lease, kind, req).await
    };
    match pending.await {
        Err(e) => e.into_response(),
        Ok(mut p) => {
            let notes = std::mem::take(&mut p.notes);
            let mut response = match p.stream {
                true => stream(p).into_response(),
                false => reply(collect(p).await, Protocol::OpenAi),
            };
            notes.apply(&mut response);
            response
        }
    }
}

/// `/v1/models`' list.
#[derive(Serialize)]
struct ModelList<'a> {
    object: &'static str,
    data: Vec<Card<'a>>,
}

/// A model, or a LoRA adapter over one.
#[derive(Serialize)]
#[serde(untagged)]
enum Card<'a> {
    Model(ModelCard<'a>),
    Adapter(AdapterCard),
}

/// A LoRA adapter as `/v1/models` lists it (as vLLM does: its base model as `parent`, its
/// files as `root`).
#[derive(Serialize)]
struct AdapterCard {
    id: String,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
    parent: String,
    root: String,
    meta: AdapterMeta,
}

#[derive(Serialize)]
struct AdapterMeta {
    kind: &'static str,
    /// Its largest rank, projections adapted and bytes held (`null` until its base model
    /// has loaded it).
    rank: Option<usize>,
    modules: Option<usize>,
    resident_bytes: Option<usize>,
}

fn adapter_card(app: &App, name: &str, lora: &crate::adapters::Lora) -> AdapterCard {
    let info = lora.info.as_ref();
    AdapterCard {
        id: name.to_string(),
        object: "model",
        created: app.started,
        owned_by: "oxgen",
        parent: lora.base.clone(),
        root: lora.path.display().to_string(),
        meta: AdapterMeta {
            kind: "lora",
            rank: info.map(|i| i.rank),
            modules: info.map(|i| i.modules),
            resident_bytes: info.map(|i| i.bytes),
        },
    }
}

async fn models(State(app): State<Arc<App>>) -> Response {
    app.models.rescan();
    let listed = app.models.list();
    let adapters = app.adapters_served();
    let models = listed.iter().map(|l| Card::Model(model_card(&app, l)));
    let adapters = (adapters.iter()).map(|(name, l)| Card::Adapter(adapter_card(&app, name, l)));
    axum::Json(ModelList {
        object: "list",
        data: models.chain(adapters).collect(),
    })
    .into_response()
}

async fn model(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    let entry = match app.models.find(&id) {
        Ok(entry) => entry,
        Err(e) => match app.adapter(&id) {
            Some(lora) => return axum::Json(adapter_card(&app, &id, &lora)).into_response(),
            None => return e.into_response(),
        },
    };
    let listed = app.models.list();
    match listed.iter().find(|l| Arc::ptr_eq(&l.entry, &entry)) {
        Some(l) => axum::Json(model_card(&app, l)).into_response(),
        None => ApiError::model_not_found(&id, &app.models.names()).into_response(),
    }
}

/// How the engine batches on this backend.
fn batching(served: Option<&Served>) -> &'static str {
    match served {
        Some(Served::Lm { loaded, .. }) if loaded.capabilities.fused_decode => {
            "continuous: each step runs every running sequence (decode tokens and prompt \
             chunks) in one forward over paged KV"
        }
        Some(Served::Lm { .. }) => {
            "requests join and leave at token boundaries; each sequence runs its own forward \
             (this backend does not fuse a batch)"
        }
        Some(Served::Encoder { .. }) => {
            "each turn runs every waiting request's sequences, each at its own length (no \
             padding)"
        }
        None => "not loaded",
    }
}

/// A model as `/v1/models` lists it, with its state and, once loaded, how it runs (`null`s
/// while it is not in memory).
#[derive(Serialize)]
struct ModelCard<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
    aliases: &'a [String],
    meta: ModelMeta,
}

#[derive(Serialize)]
struct ModelMeta {
    /// `unloaded`, `loading`, `loaded` or `failed`.
    state: &'static str,
    loaded: bool,
    /// Why its last load failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// Bytes it holds in memory (weights and KV cache), as the memory budget counts them.
    resident_bytes: Option<u64>,
    /// When it is unloaded if no request comes (Unix seconds; `null`: not by time).
    expires_at: Option<u64>,
    /// Seconds its last load took.
    load_seconds: Option<f64>,
    loads: u64,
    /// Requests that found it resident, and that waited for it to load.
    cache_hits: u64,
    cache_misses: u64,
    /// `generate`, `embedding` or `rerank` (`null` while not loaded).
    kind: Option<&'static str>,
    /// Values per embedding, for an embedding model.
    #[serde(skip_serializing_if = "Option::is_none")]
    dimensions: Option<usize>,
    backend: Option<&'static str>,
    threads: Option<usize>,
    context_length: Option<usize>,
    max_batch: usize,
    max_tokens_limit: usize,
    batching: &'static str,
    prefill_chunk: usize,
    fused_decode: Option<bool>,
    fused_prefill_with_past: Option<bool>,
    kv_dtype: Option<&'static str>,
    kv_cache: Option<KvCache>,
}

#[derive(Serialize)]
struct KvCache {
    paged: bool,
    block_size: usize,
    blocks: usize,
    prefix_cache: bool,
}

fn model_card<'a>(app: &App, l: &'a crate::models::Listed) -> ModelCard<'a> {
    use std::sync::atomic::Ordering::Relaxed;
    let served = l.resident.as_ref().map(|r| &r.served);
    let (loaded, encoder) = match served {
        Some(Served::Lm { loaded, .. }) => (Some(loaded), None),
        Some(Served::Encoder { loaded, .. }) => (None, Some(loaded)),
        None => (None, None),
    };
    let kind = match (loaded, encoder.map(|e| e.kind)) {
        (Some(_), _) => Some("generate"),
        (None, Some(oxgen::EncoderKind::Embedding { .. })) => Some("embedding"),
        (None, Some(oxgen::EncoderKind::Reranker { .. })) => Some("rerank"),
        (None, None) => None,
    };
    let stats = &l.entry.stats;
    let unix = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    };
    ModelCard {
        id: &l.entry.spec.name,
        object: "model",
        created: app.started,
        owned_by: "oxgen",
        aliases: &l.entry.spec.aliases,
        meta: ModelMeta {
            state: l.state,
            loaded: l.resident.is_some(),
            error: l.error.clone(),
            resident_bytes: l.resident.as_ref().map(|r| r.bytes),
            expires_at: l.resident.as_ref().and_then(|r| r.expires()).map(unix),
            load_seconds: (stats.loads.load(Relaxed) > 0)
                .then(|| stats.last_load_micros.load(Relaxed) as f64 / 1e6),
            loads: stats.loads.load(Relaxed),
            cache_hits: stats.hits.load(Relaxed),
            cache_misses: stats.misses.load(Relaxed),
            kind,
            dimensions: encoder
                .filter(|e| matches!(e.kind, oxgen::EncoderKind::Embedding { .. }))
                .map(|e| e.dim),
            backend: (loaded.map(|l| l.backend)).or(encoder.map(|e| e.backend)),
            threads: (loaded.map(|l| l.threads)).or(encoder.map(|e| e.threads)),
            context_length: (loaded.map(|l| l.limit.max()))
                .or(encoder.map(|e| e.tokenizer.max_tokens()))
                .or(l.entry.spec.context),
            max_batch: app.config.max_batch,
            max_tokens_limit: app.config.max_tokens_limit,
            batching: batching(served),
            prefill_chunk: app.config.prefill_chunk,
            fused_decode: loaded.map(|l| l.capabilities.fused_decode),
            fused_prefill_with_past: loaded.map(|l| l.capabilities.fused_prefill_with_past),
            kv_dtype: loaded.map(|l| l.kv_dtype.name()),
            kv_cache: loaded.and_then(|l| {
                l.kv.map(|kv| KvCache {
                    paged: true,
                    block_size: kv.block_size,
                    blocks: kv.total,
                    prefix_cache: l.prefix_cache,
                })
            }),
        },
    }
}

/// `/health`'s body: the phase, the requests the engine holds, and why it failed if it did.
#[derive(Serialize)]
struct Health<'a> {
    status: &'static str,
    requests: Live,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
}

#[derive(Serialize)]
struct Live {
    queued: usize,
    running: usize,
    kv_sequences: usize,
}

async fn health(State(app): State<Arc<App>>) -> Response {
    let entries = app.models.entries();
    let sum = |f: &dyn Fn(&crate::models::Entry) -> usize| entries.iter().map(|e| f(e)).sum();
    let (status, state) = match app.phase() {
        Phase::Ready => (StatusCode::OK, "ok"),
        Phase::Loading => (StatusCode::SERVICE_UNAVAILABLE, "loading"),
        Phase::Draining => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
        Phase::Failed => (StatusCode::SERVICE_UNAVAILABLE, "failed"),
    };
    let body = Health {
        status: state,
        requests: Live {
            queued: sum(&|e| e.engine.queued() + e.embed.queued()),
            running: sum(&|e| e.engine.running() + e.embed.running()),
            kv_sequences: sum(&|e| e.engine.kv_sequences()),
        },
        error: app.failure.get().map(String::as_str),
    };
    (status, axum::Json(body)).into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(&app.models, &app.adapters),
    )
        .into_response()
}
