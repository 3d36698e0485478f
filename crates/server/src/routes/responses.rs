//! OpenAI's Responses API over the engine: `POST /v1/responses` (whole, or streamed as the
//! typed events the SDK accumulates: `response.created` ... `response.completed`, each with
//! its `sequence_number`; a response cut by `max_output_tokens` ends in
//! `response.completed` too, with `status: incomplete`), and the bounded store behind `GET` /
//! `DELETE /v1/responses/{id}` and `previous_response_id`.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use oxgen::{ChatMessage, FinishReason, Prompt, Reply, ReplyDelta};
use serde_json::{Map, Value, json};

use super::http::body;
use super::response::{Kind, Pending, response_id, unix_now};
use super::turn::{Encode, Progress, Turn, frames};
use crate::App;
use crate::api;
use crate::error::{ApiError, Protocol};
use oxgen::engine::Counts;

/// Responses kept for `GET /v1/responses/{id}` and `previous_response_id`: the newest
/// `capacity`, the oldest evicted first.
pub(crate) struct Store {
    capacity: usize,
    order: VecDeque<String>,
    entries: HashMap<String, Stored>,
}

#[derive(Clone)]
struct Stored {
    /// The response object.
    body: Value,
    /// The conversation it ends (its input after the previous response's, then its output),
    /// without `instructions`, which do not carry over.
    conversation: Vec<ChatMessage>,
}

impl Store {
    pub(crate) fn new(capacity: usize) -> Store {
        Store {
            capacity,
            order: VecDeque::new(),
            entries: HashMap::new(),
        }
    }

    fn put(&mut self, id: String, stored: Stored) {
        if self.capacity == 0 {
            return;
        }
        while self.entries.len() >= self.capacity {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.entries.remove(&oldest);
        }
        self.order.push_back(id.clone());
        self.entries.insert(id, stored);
    }

    fn remove(&mut self, id: &str) -> bool {
        self.order.retain(|o| o != id);
        self.entries.remove(id).is_some()
    }
}

impl App {
    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.responses.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A stored response, or a 404 naming its id.
    fn stored(&self, id: &str, param: &str) -> Result<Stored, ApiError> {
        let found = self.store().entries.get(id).cloned();
        found.ok_or_else(|| self.missing(id, param))
    }

    /// 404: no response `id` is stored.
    fn missing(&self, id: &str, param: &str) -> ApiError {
        let mut e = ApiError::not_found(format!(
            "no stored response '{id}': it was created with store: false, deleted, or evicted \
             from this server's store of the last {} (--responses-store)",
            self.config.responses_store
        ));
        e.param = Some(param.into());
        e
    }
}

/// What a response echoes and stores besides what the engine makes.
struct Meta {
    id: String,
    created_at: u64,
    model: String,
    echo: Map<String, Value>,
    store: bool,
    /// The conversation so far, without `instructions` (stored with the reply after it).
    history: Vec<ChatMessage>,
    app: Arc<App>,
}

impl Meta {
    /// The response object.
    fn object(
        &self,
        status: &str,
        output: Vec<Value>,
        usage: Value,
        finish: Option<FinishReason>,
    ) -> Value {
        let incomplete = matches!(finish, Some(FinishReason::Length | FinishReason::Context))
            .then(|| json!({"reason": "max_output_tokens"}));
        let mut o = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": false,
            "error": null,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": output,
            "usage": usage,
            "store": self.store,
            "service_tier": "default",
            "top_logprobs": 0,
            "max_tool_calls": null,
            "user": null,
        });
        for (key, value) in &self.echo {
            o[key] = value.clone();
        }
        o
    }

    /// The finished response: its status, object and (with `store`) its place in the store.
    fn finish(&self, output: Vec<Value>, reply: &Reply, turn: &Turn, counts: Counts) -> Value {
        let status = match turn.finish {
            Some(FinishReason::Length | FinishReason::Context) => "incomplete",
            _ => "completed",
        };
        let usage = json!({
            "input_tokens": counts.prompt_tokens,
            "input_tokens_details": {"cached_tokens": counts.cached_tokens},
            "output_tokens": counts.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": turn.reasoning_tokens()},
            "total_tokens": counts.prompt_tokens + counts.completion_tokens,
        });
        let body = self.object(status, output, usage, turn.finish);
        if self.store {
            let mut conversation = self.history.clone();
            conversation.push(assistant_message(reply));
            let stored = Stored {
                body: body.clone(),
                conversation,
            };
            self.app.store().put(self.id.clone(), stored);
        }
        body
    }
}

/// A reply as the assistant message of a conversation.
pub(super) fn assistant_message(reply: &Reply) -> ChatMessage {
    let mut m = ChatMessage::new("assistant", &reply.content);
    if !reply.reasoning.is_empty() {
        m = m.with_reasoning(&reply.reasoning);
    }
    m.tool_calls = reply.calls.clone();
    m
}

/// The output item open while a reply streams.
enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// A reply's output items, built delta by delta; streaming, with the events that say so.
struct Output {
    items: Vec<Value>,
    open: Option<Open>,
    /// Events to send (streaming only), each with its sequence number.
    events: Vec<Sse>,
    stream: bool,
    sequence: u64,
}

impl Output {
    fn new(stream: bool) -> Output {
        Output {
            items: Vec::new(),
            open: None,
            events: Vec::new(),
            stream,
            sequence: 0,
        }
    }

    fn emit(&mut self, kind: &str, data: impl FnOnce() -> Value) {
        if !self.stream {
            return;
        }
        let mut data = data();
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        self.events
            .push(Sse::default().event(kind).data(data.to_string()));
    }

    fn index(&self) -> usize {
        self.items.len()
    }

    /// Opens an item: announced, with its content part where it has one.
    fn begin(&mut self, open: Open) {
        let index = self.index();
        let (item, part) = match &open {
            Open::Reasoning { id, .. } => (
                json!({"type": "reasoning", "id": id, "summary": [], "content": [], "status": "in_progress"}),
                Some((id.clone(), json!({"type": "reasoning_text", "text": ""}))),
            ),
            Open::Message { id, .. } => (
                json!({"type": "message", "id": id, "role": "assistant", "status": "in_progress", "content": []}),
                Some((
                    id.clone(),
                    json!({"type": "output_text", "text": "", "annotations": []}),
                )),
            ),
            Open::Call {
                id, call_id, name, ..
            } => (
                json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
                       "arguments": "", "status": "in_progress"}),
                None,
            ),
        };
        self.emit(
            "response.output_item.added",
            || json!({"output_index": index, "item": item}),
        );
        if let Some((id, part)) = part {
            self.emit(
                "response.content_part.added",
                || json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
            );
        }
        self.open = Some(open);
    }

    /// Closes the open item: its `done` events, and the item among the output.
    fn end(&mut self) {
        let Some(open) = self.open.take() else {
            return;
        };
        let index = self.index();
        let item = match open {
            Open::Reasoning { id, text } => {
                let part = json!({"type": "reasoning_text", "text": text});
                self.emit("response.reasoning_text.done", || {
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text})
                });
                self.emit("response.content_part.done", || {
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part})
                });
                json!({"type": "reasoning", "id": id, "summary": [], "content": [part], "status": "completed"})
            }
            Open::Message { id, text } => {
                let part =
                    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                self.emit("response.output_text.done", || {
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text,
                           "logprobs": []})
                });
                self.emit("response.content_part.done", || {
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": part})
                });
                json!({"type": "message", "id": id, "role": "assistant", "status": "completed",
                       "content": [part]})
            }
            Open::Call {
                id,
                call_id,
                name,
                arguments,
            } => {
                self.emit("response.function_call_arguments.done", || {
                    json!({"item_id": id, "output_index": index, "name": name, "arguments": arguments})
                });
                json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
                       "arguments": arguments, "status": "completed"})
            }
        };
        self.emit(
            "response.output_item.done",
            || json!({"output_index": index, "item": item}),
        );
        self.items.push(item);
    }

    fn delta(&mut self, d: &ReplyDelta) {
        match d {
            ReplyDelta::Reasoning(t) => {
                if !matches!(self.open, Some(Open::Reasoning { .. })) {
                    self.end();
                    self.begin(Open::Reasoning {
                        id: response_id("rs_"),
                        text: String::new(),
                    });
                }
                let index = self.index();
                if let Some(Open::Reasoning { id, text }) = &mut self.open {
                    text.push_str(t);
                    let id = id.clone();
                    self.emit("response.reasoning_text.delta", || {
                        json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t})
                    });
                }
            }
            ReplyDelta::Content(t) => {
                if !matches!(self.open, Some(Open::Message { .. })) {
                    self.end();
                    self.begin(Open::Message {
                        id: response_id("msg_"),
                        text: String::new(),
                    });
                }
                let index = self.index();
                if let Some(Open::Message { id, text }) = &mut self.open {
                    text.push_str(t);
                    let id = id.clone();
                    self.emit("response.output_text.delta", || {
                        json!({"item_id": id, "output_index": index, "content_index": 0, "delta": t,
                               "logprobs": []})
                    });
                }
            }
            ReplyDelta::CallStart { id, name, .. } => {
                self.end();
                self.begin(Open::Call {
                    id: response_id("fc_"),
                    call_id: id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                });
            }
            ReplyDelta::CallArguments { text: t, .. } => {
                let index = self.index();
                if let Some(Open::Call { id, arguments, .. }) = &mut self.open {
                    arguments.push_str(t);
                    let id = id.clone();
                    self.emit(
                        "response.function_call_arguments.delta",
                        || json!({"item_id": id, "output_index": index, "delta": t}),
                    );
                }
            }
        }
    }

    /// The reply ended: its last item closed; a reply with no output gets an empty message.
    fn finish(&mut self) {
        self.end();
        if self.items.is_empty() {
            self.begin(Open::Message {
                id: response_id("msg_"),
                text: String::new(),
            });
            self.end();
        }
    }
}

/// The streamed response.
struct Events {
    meta: Meta,
    output: Output,
}

impl Events {
    fn take(&mut self) -> Vec<Sse> {
        std::mem::take(&mut self.output.events)
    }
}

impl Encode for Events {
    type Frame = Sse;

    fn start(&mut self, _turn: &Turn) -> Vec<Sse> {
        let response = self
            .meta
            .object("in_progress", Vec::new(), Value::Null, None);
        self.output
            .emit("response.created", || json!({"response": response}));
        self.output
            .emit("response.in_progress", || json!({"response": response}));
        self.take()
    }

    fn step(&mut self, turn: &Turn) -> Vec<Sse> {
        for d in &turn.deltas {
            self.output.delta(d);
        }
        self.take()
    }

    fn done(&mut self, turn: &Turn, counts: Counts) -> Vec<Sse> {
        self.output.finish();
        let items = self.output.items.clone();
        let response = self.meta.finish(items, turn.reply(), turn, counts);
        // `response.completed` even for an incomplete response (its status says so): the
        // SDK's `get_final_response` finds the response in that event alone.
        self.output
            .emit("response.completed", || json!({"response": response}));
        self.take()
    }

    fn error(&mut self, e: ApiError) -> Vec<Sse> {
        self.output.emit(
            "error",
            || json!({"code": e.code, "message": e.message, "param": e.param}),
        );
        self.take()
    }
}

/// `POST /v1/responses`.
pub(super) async fn create(State(app): State<Arc<App>>, request: Request) -> Response {
    let started = async {
        let loaded = app.ready()?;
        let body = body(request, app.config.max_body, app.config.body_timeout).await?;
        let r = api::responses(&body, &app.bounds(loaded), app.config.strict_api)?;
        app.check_model(&r.request.model)?;
        let mut history = match &r.previous_response_id {
            Some(id) => app.stored(id, "previous_response_id")?.conversation,
            None => Vec::new(),
        };
        history.extend(r.input);
        if history.is_empty() {
            return Err(ApiError::invalid("input", "input is empty"));
        }
        let mut conversation = Vec::with_capacity(history.len() + 1);
        if let Some(instructions) = &r.instructions {
            conversation.push(ChatMessage::new("system", instructions));
        }
        conversation.extend(history.iter().cloned());
        let mut request = r.request;
        request.prompts = vec![Prompt::Chat(conversation)];
        let meta = Meta {
            id: response_id("resp_"),
            created_at: unix_now(),
            model: request.model.clone(),
            echo: r.echo,
            store: r.store,
            history,
            app: app.clone(),
        };
        let pending = app.submit(Kind::Chat, request).await?;
        Ok::<(Meta, Pending), ApiError>((meta, pending))
    };
    let (meta, mut pending) = match started.await {
        Ok(started) => started,
        Err(e) => return e.response(Protocol::OpenAi),
    };
    let notes = std::mem::take(&mut pending.notes);
    let stream = pending.stream;
    let turn = Turn::new(pending);
    let mut response = if stream {
        let events = Events {
            meta,
            output: Output::new(true),
        };
        let frames = frames(turn, events).map(Ok::<_, std::convert::Infallible>);
        axum::response::Sse::new(frames)
            .keep_alive(KeepAlive::new().interval(Duration::from_secs(1)))
            .into_response()
    } else {
        match whole(meta, turn).await {
            Ok(body) => axum::Json(body).into_response(),
            Err(e) => e.response(Protocol::OpenAi),
        }
    };
    notes.apply(&mut response);
    response
}

/// A whole response: the reply's items built as a stream builds them.
async fn whole(meta: Meta, mut turn: Turn) -> Result<Value, ApiError> {
    let mut output = Output::new(false);
    let counts = loop {
        match turn.next().await? {
            Progress::Step => turn.deltas.iter().for_each(|d| output.delta(d)),
            Progress::Done(counts) => break counts,
        }
    };
    output.finish();
    Ok(meta.finish(output.items, turn.reply(), &turn, counts))
}

/// `GET /v1/responses/{id}`.
pub(super) async fn get(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    match app.stored(&id, "response_id") {
        Ok(stored) => axum::Json(stored.body).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `DELETE /v1/responses/{id}`.
pub(super) async fn delete(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    let removed = app.store().remove(&id);
    match removed {
        true => {
            axum::Json(json!({"id": id, "object": "response", "deleted": true})).into_response()
        }
        false => app.missing(&id, "response_id").into_response(),
    }
}
