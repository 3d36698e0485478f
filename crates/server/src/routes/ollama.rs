//! Ollama's API over the engine: `/api/chat` and `/api/generate` (newline-delimited JSON
//! streaming unless `stream: false`, the last object with Ollama's timings in nanoseconds),
//! `/api/tags`, `/api/show`, `/api/ps`, `/api/version`; errors as `{"error": "..."}`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use oxgen::{FinishReason, Reply, ReplyDelta};
use serde_json::{Map, Value, json};

use super::http::body;
use super::response::Kind;
use super::turn::{Encode, Turn, frames};
use crate::error::{ApiError, Protocol};
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
fn served(app: &App, name: &str) -> Result<String, ApiError> {
    let name = name.strip_suffix(":latest").unwrap_or(name);
    app.check_model(name)?;
    Ok(name.to_string())
}

/// `/api/chat` writes a `message`, `/api/generate` a `response`.
#[derive(Clone, Copy, PartialEq)]
enum Endpoint {
    Chat,
    Generate,
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
    fn object(
        &self,
        content: &str,
        thinking: &str,
        calls: &[oxgen::ToolCall],
        done: bool,
    ) -> Value {
        let mut o = json!({"model": self.model, "created_at": now()});
        match self.endpoint {
            Endpoint::Chat => {
                let mut message = json!({"role": "assistant", "content": content});
                if !thinking.is_empty() {
                    message["thinking"] = json!(thinking);
                }
                if !calls.is_empty() {
                    message["tool_calls"] = (calls.iter())
                        .map(|c| {
                            let arguments: Value = serde_json::from_str(&c.arguments)
                                .unwrap_or_else(|_| json!({}));
                            json!({"id": c.id, "function": {"name": c.name, "arguments": arguments}})
                        })
                        .collect();
                }
                o["message"] = message;
            }
            Endpoint::Generate => {
                o["response"] = json!(content);
                if !thinking.is_empty() {
                    o["thinking"] = json!(thinking);
                }
            }
        }
        o["done"] = json!(done);
        o
    }

    /// The last object's fields: why it ended, the token counts and the timings.
    fn finish(o: &mut Value, turn: &Turn, counts: Counts) {
        let reason = match turn.finish {
            Some(FinishReason::Length | FinishReason::Context) => "length",
            _ => "stop",
        };
        let end = Instant::now();
        let first = turn.first_token.unwrap_or(end);
        let nanos = |from: Instant, to: Instant| to.duration_since(from).as_nanos() as u64;
        o["done_reason"] = json!(reason);
        o["total_duration"] = json!(nanos(turn.queued, end));
        o["load_duration"] = json!(0);
        o["prompt_eval_count"] = json!(counts.prompt_tokens);
        o["prompt_eval_duration"] = json!(nanos(turn.queued, first));
        o["eval_count"] = json!(counts.completion_tokens);
        o["eval_duration"] = json!(nanos(first, end));
    }

    fn line(v: &Value) -> String {
        let mut line = v.to_string();
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
        let o = self.object(&self.content, &self.thinking, &[], false);
        self.content.clear();
        self.thinking.clear();
        vec![Lines::line(&o)]
    }

    fn done(&mut self, turn: &Turn, counts: Counts) -> Vec<String> {
        let mut out = Vec::new();
        let calls = &turn.reply().calls;
        if !calls.is_empty() && self.endpoint == Endpoint::Chat {
            out.push(Lines::line(&self.object("", "", calls, false)));
        }
        let mut last = self.object("", "", &[], true);
        Lines::finish(&mut last, turn, counts);
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
    let started = async {
        let loaded = app.ready()?;
        let body = body(request, app.config.max_body, app.config.body_timeout).await?;
        let (bounds, strict) = (app.bounds(loaded), app.config.strict_api);
        let mut req = match endpoint {
            Endpoint::Chat => api::ollama_chat(&body, &bounds, strict)?,
            Endpoint::Generate => api::ollama_generate(&body, &bounds, strict)?,
        };
        req.model = served(&app, &req.model)?;
        let model = req.model.clone();
        let kind = match req.prompts.first() {
            Some(oxgen::Prompt::Text(_)) => Kind::Completion,
            _ => Kind::Chat,
        };
        Ok::<_, ApiError>((model, app.submit(kind, req).await?))
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
                Lines::finish(&mut o, &turn, counts);
                axum::Json(o).into_response()
            }
            Err(e) => e.response(Protocol::Ollama),
        }
    };
    notes.apply(&mut response);
    response
}

/// The model as `/api/tags`, `/api/show` and `/api/ps` list it (what Ollama reads from a
/// GGUF's metadata, an ONNX package does not say: those fields are empty).
fn entry(app: &App) -> Map<String, Value> {
    let modified = jiff::Timestamp::from_second(app.started as i64).unwrap_or_default();
    let mut m = Map::new();
    m.insert("name".into(), json!(app.config.model_id));
    m.insert("model".into(), json!(app.config.model_id));
    m.insert("modified_at".into(), json!(modified.to_string()));
    m.insert("size".into(), json!(0));
    m.insert("digest".into(), json!(""));
    let details = json!({"parent_model": "", "format": "onnx", "family": "", "families": [],
                         "parameter_size": "", "quantization_level": ""});
    m.insert("details".into(), details);
    m
}

/// `GET /api/tags`: the model served.
pub(super) async fn tags(State(app): State<Arc<App>>) -> Response {
    axum::Json(json!({"models": [entry(&app)]})).into_response()
}

/// `GET /api/ps`: the model resident (the one served, once loaded).
pub(super) async fn ps(State(app): State<Arc<App>>) -> Response {
    let mut models = Vec::new();
    if let Some(loaded) = app.loaded.get() {
        let mut m = entry(&app);
        m.insert("expires_at".into(), json!("2318-01-01T00:00:00Z"));
        m.insert("size_vram".into(), json!(0));
        m.insert("context_length".into(), json!(loaded.limit.max()));
        models.push(Value::Object(m));
    }
    axum::Json(json!({"models": models})).into_response()
}

/// `GET /api/version`.
pub(super) async fn version() -> Response {
    axum::Json(json!({"version": OLLAMA_API_VERSION})).into_response()
}

/// `POST /api/show` (`{"model": NAME}`): the model's template, context length and
/// capabilities.
pub(super) async fn show(State(app): State<Arc<App>>, request: Request) -> Response {
    let shown = async {
        let loaded = app.ready()?;
        let body = body(request, app.config.max_body, app.config.body_timeout).await?;
        let body = api::object(&body)?;
        let name = (body
            .get("model")
            .or(body.get("name"))
            .and_then(Value::as_str))
        .ok_or_else(|| ApiError::invalid("model", "model is required: the model to show"))?;
        served(&app, name)?;
        let template = loaded.encoder.template().map_or("", |t| t.source());
        let mut capabilities = vec!["completion", "tools"];
        if template.contains("</think>") || template.contains("<|channel|>") {
            capabilities.push("thinking");
        }
        let mut shown = entry(&app);
        shown.insert("modelfile".into(), json!(""));
        shown.insert("parameters".into(), json!(""));
        shown.insert("template".into(), json!(template));
        shown.insert(
            "model_info".into(),
            json!({
                "general.architecture": "oxgen",
                "general.basename": app.config.model_id,
                "oxgen.context_length": loaded.limit.max(),
            }),
        );
        shown.insert("capabilities".into(), json!(capabilities));
        Ok::<_, ApiError>(Value::Object(shown))
    };
    match shown.await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.response(Protocol::Ollama),
    }
}
