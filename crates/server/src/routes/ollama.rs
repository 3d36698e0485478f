//! Ollama's API over the engine: `/api/chat` and `/api/generate` (newline-delimited JSON
//! streaming unless `stream: false`, the last object with Ollama's timings in nanoseconds),
//! `/api/tags`, `/api/show`, `/api/ps`, `/api/version`; errors as `{"error": "..."}`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use oxgen::{FinishReason, Reply, ReplyDelta};
use serde::Serialize;
use serde_json::Value;

use super::http::body;
use super::response::Kind;
use super::turn::{Encode, Turn, frames};
use crate::error::{ApiError, Protocol};
use crate::models::{KeepAlive, Listed, Served};
use crate::{App, api};
use oxgen::engine::Counts;

/// The version `/api/version` reports: the Ollama API level these endpoints follow (clients
/// gate features on it).
const OLLAMA_API_VERSION: &str = "0.12.6";

/// Ollama's timestamps: RFC 3339 in UTC with nanoseconds.
fn now() -> String {
    jiff::Timestamp::now().to_string()
}

/// A model name as Ollama clients send it, less the `:latest` tag they may add.
fn untagged(name: &str) -> String {
    name.strip_suffix(":latest").unwrap_or(name).to_string()
}

/// `/api/chat` writes a `message`, `/api/generate` a `response`.
#[derive(Clone, Copy, PartialEq)]
enum Endpoint {
    Chat,
    Generate,
}

/// One object of a reply's stream, or the whole reply.
#[derive(Serialize)]
struct Object<'a> {
    model: &'a str,
    created_at: String,
    /// `/api/chat`'s.
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<ChatMessage<'a>>,
    /// `/api/generate`'s text and thinking.
    #[serde(skip_serializing_if = "Option::is_none")]
    response: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<&'a str>,
    done: bool,
    /// The last object's: why it ended, token counts and timings in nanoseconds.
    #[serde(flatten)]
    end: Option<End>,
}

#[derive(Serialize)]
struct ChatMessage<'a> {
    role: &'static str,
    content: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<Call<'a>>,
}

/// A call, its arguments as an object.
#[derive(Serialize)]
struct Call<'a> {
    id: &'a str,
    function: CallFunction<'a>,
}

#[derive(Serialize)]
struct CallFunction<'a> {
    name: &'a str,
    arguments: Value,
}

#[derive(Serialize)]
struct End {
    done_reason: &'static str,
    total_duration: u64,
    load_duration: u64,
    prompt_eval_count: usize,
    prompt_eval_duration: u64,
    eval_count: usize,
    eval_duration: u64,
}

/// A reply as Ollama streams or returns it.
struct Lines {
    endpoint: Endpoint,
    model: String,
    /// Parts of the last step not sent yet (tool calls go out whole, at the end).
    content: String,
    thinking: String,
}

impl Lines {
    /// One object of the stream (or the whole reply): the reply's text and thinking in
    /// `content` and `thinking`, its calls (chat) with their arguments as objects.
    fn object<'a>(
        &'a self,
        content: &'a str,
        thinking: &'a str,
        calls: &'a [oxgen::ToolCall],
        done: bool,
    ) -> Object<'a> {
        let thinking = (!thinking.is_empty()).then_some(thinking);
        let chat = self.endpoint == Endpoint::Chat;
        Object {
            model: &self.model,
            created_at: now(),
            message: chat.then(|| ChatMessage {
                role: "assistant",
                content,
                thinking,
                tool_calls: (calls.iter())
                    .map(|c| Call {
                        id: &c.id,
                        function: CallFunction {
                            name: &c.name,
                            arguments: serde_json::from_str(&c.arguments)
                                .unwrap_or_else(|_| Value::Object(Default::default())),
                        },
                    })
                    .collect(),
            }),
            response: (!chat).then_some(content),
            thinking: thinking.filter(|_| !chat),
            done,
            end: None,
        }
    }

    /// The last object's fields: why it ended, the token counts and the timings.
    fn end(turn: &Turn, counts: Counts) -> End {
        let reason = match turn.finish {
            Some(FinishReason::Length | FinishReason::Context) => "length",
            _ => "stop",
        };
        let end = Instant::now();
        let first = turn.first_token.unwrap_or(end);
        let nanos = |from: Instant, to: Instant| to.duration_since(from).as_nanos() as u64;
        End {
            done_reason: reason,
            total_duration: nanos(turn.queued, end),
            load_duration: 0,
            prompt_eval_count: counts.prompt_tokens,
            prompt_eval_duration: nanos(turn.queued, first),
            eval_count: counts.completion_tokens,
            eval_duration: nanos(first, end),
        }
    }

    fn line(v: &impl Serialize) -> String {
        let mut line = serde_json::to_string(v).unwrap_or_default();
        line.push('\n');
        line
    }
}

impl Encode for Lines {
    type Frame = String;

    fn start(&mut self, _turn: &Turn) -> Vec<String> {
        Vec::new()
    }

    fn step(&mut self, turn: &Turn) -> Vec<String> {
        for d in &turn.deltas {
            match d {
                ReplyDelta::Content(t) => self.content.push_str(t),
                ReplyDelta::Reasoning(t) => self.thinking.push_str(t),
                ReplyDelta::CallStart { .. } | ReplyDelta::CallArguments { .. } => {}
            }
        }
        if self.content.is_empty() && self.thinking.is_empty() {
            return Vec::new();
        }
        let line = Lines::line(&self.object(&self.content, &self.thinking, &[], false));
        self.content.clear();
        self.thinking.clear();
        vec![line]
    }

    fn done(&mut self, turn: &Turn, counts: Counts) -> Vec<String> {
        let mut out = Vec::new();
        let calls = &turn.reply().calls;
        if !calls.is_empty() && self.endpoint == Endpoint::Chat {
            out.push(Lines::line(&self.object("", "", calls, false)));
        }
        let mut last = self.object("", "", &[], true);
        last.end = Some(Lines::end(turn, counts));
        out.push(Lines::line(&last));
        out
    }

    fn error(&mut self, e: ApiError) -> Vec<String> {
        vec![Lines::line(&e.shaped(Protocol::Ollama).1)]
    }
}

/// `POST /api/chat`.
pub(super) async fn chat(State(app): State<Arc<App>>, request: Request) -> Response {
    generate_with(app, request, Endpoint::Chat).await
}

/// `POST /api/generate`.
pub(super) async fn generate(State(app): State<Arc<App>>, request: Request) -> Response {
    generate_with(app, request, Endpoint::Generate).await
}

async fn generate_with(app: Arc<App>, request: Request, endpoint: Endpoint) -> Response {
    let read = async {
        app.accepting()?;
        body(request, app.config.max_body, app.config.body_timeout).await
    };
    let body = match read.await {
        Ok(body) => body,
        Err(e) => return e.response(Protocol::Ollama),
    };
    if is_load_request(&body, endpoint) {
        let done = load_or_unload(&app, &body, endpoint).await;
        return done.unwrap_or_else(|e| e.response(Protocol::Ollama));
    }
    let started = async {
        let lease = app.lease_for(&body).await?;
        let (bounds, strict) = (app.bounds(lease.lm()?.0), app.config.strict_api);
        let mut req = match endpoint {
            Endpoint::Chat => api::ollama_chat(&body, &bounds, strict)?,
            Endpoint::Generate => api::ollama_generate(&body, &bounds, strict)?,
        };
        req.model = untagged(&req.model);
        let model = req.model.clone();
        let kind = match req.prompts.first() {
            Some(oxgen::Prompt::Text(_)) => Kind::Completion,
            _ => Kind::Chat,
        };
        Ok::<_, ApiError>((model, app.submit(&lease, kind, req).await?))
    };
    let (model, mut pending) = match started.await {
        Ok(started) => started,
        Err(e) => return e.response(Protocol::Ollama),
    };
    let notes = std::mem::take(&mut pending.notes);
    let stream = pending.stream;
    let mut turn = Turn::new(pending);
    let lines = Lines {
        endpoint,
        model,
        content: String::new(),
        thinking: String::new(),
    };
    let mut response = if stream {
        let frames = frames(turn, lines).map(Ok::<_, std::convert::Infallible>);
        (
            [(header::CONTENT_TYPE, "application/x-ndjson")],
            Body::from_stream(frames),
        )
            .into_response()
    } else {
        match turn.collect().await {
            Ok(counts) => {
                let Reply {
                    content,
                    reasoning,
                    calls,
                } = turn.reply();
                let calls = if endpoint == Endpoint::Chat {
                    &calls[..]
                } else {
                    &[]
                };
                let mut o = lines.object(content, reasoning, calls, true);
                o.end = Some(Lines::end(&turn, counts));
                axum::Json(o).into_response()
            }
            Err(e) => e.response(Protocol::Ollama),
        }
    };
    notes.apply(&mut response);
    response
}

/// Whether a body is Ollama's way to load or unload a model: `/api/generate` with no prompt,
/// `/api/chat` with no messages.
fn is_load_request(body: &[u8], endpoint: Endpoint) -> bool {
    let Ok(map) = api::object(body) else {
        return false;
    };
    let empty = |key: &str| match map.get(key) {
        None | Some(Value::Null) => true,
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(_) => false,
    };
    match endpoint {
        Endpoint::Generate => empty("prompt") && empty("system"),
        Endpoint::Chat => empty("messages"),
    }
}

/// Loads the model a body names and answers at once (`done_reason: "load"`), or with
/// `keep_alive: 0` unloads it (`"unload"`; once its requests end, if some run), as Ollama
/// does for a request with nothing to generate.
async fn load_or_unload(
    app: &Arc<App>,
    body: &[u8],
    endpoint: Endpoint,
) -> Result<Response, ApiError> {
    let map = api::object(body)?;
    let keep_alive = (map.get("keep_alive").filter(|v| !v.is_null()))
        .map(|v| KeepAlive::from_json(v).map_err(|e| ApiError::invalid("keep_alive", e)))
        .transpose()?;
    let name = match map.get("model") {
        Some(Value::String(m)) => untagged(m),
        _ => return Err(ApiError::invalid("model", "model is required")),
    };
    let reason = match keep_alive == Some(KeepAlive::For(Duration::ZERO)) {
        true => {
            let entry = app.models.find(&name)?;
            if entry.is_resident() {
                // Its keep-alive becomes 0: unloaded now if idle, else once its requests end.
                drop(app.lease_for(body).await?);
                entry.unload("an Ollama request with keep_alive 0");
            }
            "unload"
        }
        false => {
            drop(app.lease_for(body).await?);
            "load"
        }
    };
    let lines = Lines {
        endpoint,
        model: name,
        content: String::new(),
        thinking: String::new(),
    };
    let mut object = lines.object("", "", &[], true);
    object.end = Some(End {
        done_reason: reason,
        total_duration: 0,
        load_duration: 0,
        prompt_eval_count: 0,
        prompt_eval_duration: 0,
        eval_count: 0,
        eval_duration: 0,
    });
    Ok(axum::Json(object).into_response())
}

/// The model as `/api/tags`, `/api/show` and `/api/ps` list it (what Ollama reads from a
/// GGUF's metadata, an ONNX package does not say: those fields are empty).
#[derive(Serialize)]
struct Entry<'a> {
    name: &'a str,
    model: &'a str,
    modified_at: String,
    size: u64,
    digest: &'static str,
    details: Details,
}

#[derive(Serialize)]
struct Details {
    parent_model: &'static str,
    format: &'static str,
    family: &'static str,
    families: [&'static str; 0],
    parameter_size: &'static str,
    quantization_level: &'static str,
}

fn entry<'a>(app: &App, listed: &'a Listed) -> Entry<'a> {
    let modified = jiff::Timestamp::from_second(app.started as i64).unwrap_or_default();
    let name = &listed.entry.spec.name;
    Entry {
        name,
        model: name,
        modified_at: modified.to_string(),
        size: listed.entry.spec.bytes,
        digest: "",
        details: Details {
            parent_model: "",
            format: "onnx",
            family: "",
            families: [],
            parameter_size: "",
            quantization_level: "",
        },
    }
}

#[derive(Serialize)]
struct Models<T> {
    models: Vec<T>,
}

/// `GET /api/tags`: every model served, loaded or not.
pub(super) async fn tags(State(app): State<Arc<App>>) -> Response {
    app.models.rescan();
    let listed = app.models.list();
    axum::Json(Models {
        models: listed.iter().map(|l| entry(&app, l)).collect(),
    })
    .into_response()
}

/// A model as `/api/ps` lists it, resident.
#[derive(Serialize)]
struct Resident<'a> {
    #[serde(flatten)]
    entry: Entry<'a>,
    /// When it is unloaded if no request comes (far in the future: kept).
    expires_at: String,
    size_vram: u64,
    context_length: usize,
}

/// `GET /api/ps`: the models in memory, with what they hold (`size`: weights and KV cache)
/// and when their keep-alive lapses.
pub(super) async fn ps(State(app): State<Arc<App>>) -> Response {
    let listed = app.models.list();
    let models = (listed.iter())
        .filter_map(|l| {
            let resident = l.resident.as_ref()?;
            let context_length = match &resident.served {
                Served::Lm { loaded, .. } => loaded.limit.max(),
                Served::Encoder { loaded, .. } => loaded.tokenizer.max_tokens(),
            };
            let expires = resident.expires().map_or(KEPT.to_string(), |t| {
                jiff::Timestamp::try_from(t).map_or(KEPT.to_string(), |t| t.to_string())
            });
            let mut entry = entry(&app, l);
            entry.size = resident.bytes;
            Some(Resident {
                entry,
                expires_at: expires,
                size_vram: 0,
                context_length,
            })
        })
        .collect();
    axum::Json(Models { models }).into_response()
}

/// `expires_at` of a model kept until the budget needs its room (what ollama sends for
/// `keep_alive: -1`).
const KEPT: &str = "2318-01-01T00:00:00Z";

#[derive(Serialize)]
struct Version {
    version: &'static str,
}

/// `GET /api/version`.
pub(super) async fn version() -> Response {
    axum::Json(Version {
        version: OLLAMA_API_VERSION,
    })
    .into_response()
}

/// What `/api/show` says of the model.
#[derive(Serialize)]
struct Shown<'a> {
    #[serde(flatten)]
    entry: Entry<'a>,
    modelfile: &'static str,
    parameters: &'static str,
    template: &'a str,
    model_info: ModelInfo<'a>,
    capabilities: Vec<&'static str>,
}

#[derive(Serialize)]
struct ModelInfo<'a> {
    #[serde(rename = "general.architecture")]
    architecture: &'static str,
    #[serde(rename = "general.basename")]
    basename: &'a str,
    #[serde(rename = "oxgen.context_length")]
    context_length: usize,
}

/// `POST /api/show` (`{"model": NAME}`): the model's template, context length and
/// capabilities.
pub(super) async fn show(State(app): State<Arc<App>>, request: Request) -> Response {
    let shown = async {
        app.accepting()?;
        let body = body(request, app.config.max_body, app.config.body_timeout).await?;
        let map = api::object(&body)?;
        if !map.contains_key("model") && !map.contains_key("name") {
            return Err(ApiError::invalid(
                "model",
                "model is required: the model to show",
            ));
        }
        let lease = app.lease_for(&body).await?;
        let (loaded, _) = lease.lm()?;
        let listed = app.models.list();
        let listed = (listed.into_iter())
            .find(|l| l.entry.spec.name == lease.name)
            .ok_or_else(|| ApiError::not_found("the model was unloaded meanwhile"))?;
        let template = loaded.encoder.template().map_or("", |t| t.source());
        let mut capabilities = vec!["completion", "tools"];
        if template.contains("</think>") || template.contains("<|channel|>") {
            capabilities.push("thinking");
        }
        let shown = Shown {
            entry: entry(&app, &listed),
            modelfile: "",
            parameters: "",
            template,
            model_info: ModelInfo {
                architecture: "oxgen",
                basename: &listed.entry.spec.name,
                context_length: loaded.limit.max(),
            },
            capabilities,
        };
        Ok::<_, ApiError>(axum::Json(shown).into_response())
    };
    shown.await.unwrap_or_else(|e| e.response(Protocol::Ollama))
}
