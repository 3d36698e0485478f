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
use serde::Serialize;
use serde_json::{Map, Value};

use super::http::body;
use super::response::{Kind, Pending, response_id, unix_now};
use super::turn::{Encode, Progress, Turn, frames};
use crate::App;
use crate::api;
use crate::error::{ApiError, Protocol};
use oxgen::engine::Counts;

/// A response object.
#[derive(Serialize)]
struct ResponseObject<'a> {
    id: &'a str,
    object: &'static str,
    created_at: u64,
    status: &'static str,
    background: bool,
    error: Option<()>,
    incomplete_details: Option<Incomplete>,
    model: &'a str,
    output: Vec<Item>,
    usage: Option<Usage>,
    store: bool,
    service_tier: &'static str,
    top_logprobs: u32,
    max_tool_calls: Option<()>,
    user: Option<()>,
    /// The request's settings, as the response echoes them.
    #[serde(flatten)]
    echo: &'a Map<String, Value>,
}

#[derive(Serialize)]
struct Incomplete {
    reason: &'static str,
}

#[derive(Serialize)]
struct Usage {
    input_tokens: usize,
    input_tokens_details: InputDetails,
    output_tokens: usize,
    output_tokens_details: OutputDetails,
    total_tokens: usize,
}

#[derive(Serialize)]
struct InputDetails {
    cached_tokens: usize,
}

#[derive(Serialize)]
struct OutputDetails {
    reasoning_tokens: usize,
}

/// An output item.
#[derive(Serialize, Clone)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Item {
    Reasoning {
        id: String,
        summary: [(); 0],
        content: Vec<Part>,
        status: &'static str,
    },
    Message {
        id: String,
        role: &'static str,
        status: &'static str,
        content: Vec<Part>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: &'static str,
    },
}

/// A content part of an item (`logprobs` on a finished message's text).
#[derive(Serialize, Clone)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Part {
    ReasoningText {
        text: String,
    },
    OutputText {
        text: String,
        annotations: [(); 0],
        #[serde(skip_serializing_if = "Option::is_none")]
        logprobs: Option<[(); 0]>,
    },
}

/// A streamed event's payload (each also carries its `type` and `sequence_number`).
#[derive(Serialize)]
#[serde(untagged)]
enum Payload<'a> {
    Response {
        response: &'a Value,
    },
    Item {
        output_index: usize,
        item: &'a Item,
    },
    Part {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        part: &'a Part,
    },
    /// Text or arguments so far (`delta`) or whole (`text`, `arguments`).
    Text(TextPayload<'a>),
    Error {
        code: Option<&'static str>,
        message: &'a str,
        param: Option<&'a str>,
    },
}

#[derive(Serialize)]
struct TextPayload<'a> {
    item_id: &'a str,
    output_index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_index: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delta: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    arguments: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<[(); 0]>,
}

/// An event: its payload with its `type` and `sequence_number`.
#[derive(Serialize)]
struct EventBody<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    sequence_number: u64,
    #[serde(flatten)]
    payload: Payload<'a>,
}

/// A text event's payload with no text yet: the fields are set by the caller.
fn text_event(item_id: &str, output_index: usize, content: bool) -> TextPayload<'_> {
    TextPayload {
        item_id,
        output_index,
        content_index: content.then_some(0),
        name: None,
        delta: None,
        text: None,
        arguments: None,
        logprobs: None,
    }
}

#[derive(Serialize)]
struct Deleted<'a> {
    id: &'a str,
    object: &'static str,
    deleted: bool,
}

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
        status: &'static str,
        output: Vec<Item>,
        usage: Option<Usage>,
        finish: Option<FinishReason>,
    ) -> Value {
        let cut = matches!(finish, Some(FinishReason::Length | FinishReason::Context));
        let object = ResponseObject {
            id: &self.id,
            object: "response",
            created_at: self.created_at,
            status,
            background: false,
            error: None,
            incomplete_details: cut.then_some(Incomplete {
                reason: "max_output_tokens",
            }),
            model: &self.model,
            output,
            usage,
            store: self.store,
            service_tier: "default",
            top_logprobs: 0,
            max_tool_calls: None,
            user: None,
            echo: &self.echo,
        };
        serde_json::to_value(object).unwrap_or_default()
    }

    /// The finished response: its status, object and (with `store`) its place in the store.
    fn finish(&self, output: Vec<Item>, reply: &Reply, turn: &Turn, counts: Counts) -> Value {
        let status = match turn.finish {
            Some(FinishReason::Length | FinishReason::Context) => "incomplete",
            _ => "completed",
        };
        let usage = Usage {
            input_tokens: counts.prompt_tokens,
            input_tokens_details: InputDetails {
                cached_tokens: counts.cached_tokens,
            },
            output_tokens: counts.completion_tokens,
            output_tokens_details: OutputDetails {
                reasoning_tokens: turn.reasoning_tokens(),
            },
            total_tokens: counts.prompt_tokens + counts.completion_tokens,
        };
        let body = self.object(status, output, Some(usage), turn.finish);
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

impl Open {
    fn id(&self) -> &str {
        match self {
            Open::Reasoning { id, .. } | Open::Message { id, .. } | Open::Call { id, .. } => id,
        }
    }
}

/// A reply's output items, built delta by delta; streaming, with the events that say so.
struct Output {
    items: Vec<Item>,
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

    fn emit(&mut self, kind: &'static str, payload: Payload) {
        if !self.stream {
            return;
        }
        let body = EventBody {
            kind,
            sequence_number: self.sequence,
            payload,
        };
        self.sequence += 1;
        let data = serde_json::to_string(&body).unwrap_or_default();
        self.events.push(Sse::default().event(kind).data(data));
    }

    fn index(&self) -> usize {
        self.items.len()
    }

    /// Opens an item: announced, with its content part where it has one.
    fn begin(&mut self, open: Open) {
        let output_index = self.index();
        let (item, part) = match &open {
            Open::Reasoning { id, .. } => (
                Item::Reasoning {
                    id: id.clone(),
                    summary: [],
                    content: Vec::new(),
                    status: "in_progress",
                },
                Some(Part::ReasoningText {
                    text: String::new(),
                }),
            ),
            Open::Message { id, .. } => (
                Item::Message {
                    id: id.clone(),
                    role: "assistant",
                    status: "in_progress",
                    content: Vec::new(),
                },
                Some(Part::OutputText {
                    text: String::new(),
                    annotations: [],
                    logprobs: None,
                }),
            ),
            Open::Call {
                id, call_id, name, ..
            } => (
                Item::FunctionCall {
                    id: id.clone(),
                    call_id: call_id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                    status: "in_progress",
                },
                None,
            ),
        };
        let item = &item;
        self.emit(
            "response.output_item.added",
            Payload::Item { output_index, item },
        );
        if let Some(part) = &part {
            let item_id = open.id();
            self.emit(
                "response.content_part.added",
                Payload::Part {
                    item_id,
                    output_index,
                    content_index: 0,
                    part,
                },
            );
        }
        self.open = Some(open);
    }

    /// Closes the open item: its `done` events, and the item among the output.
    fn end(&mut self) {
        let Some(open) = self.open.take() else {
            return;
        };
        let output_index = self.index();
        let item = match open {
            Open::Reasoning { id, text } => {
                self.emit(
                    "response.reasoning_text.done",
                    Payload::Text(TextPayload {
                        text: Some(&text),
                        ..text_event(&id, output_index, true)
                    }),
                );
                let part = Part::ReasoningText { text };
                self.done_part(&id, output_index, &part);
                Item::Reasoning {
                    id,
                    summary: [],
                    content: vec![part],
                    status: "completed",
                }
            }
            Open::Message { id, text } => {
                self.emit(
                    "response.output_text.done",
                    Payload::Text(TextPayload {
                        text: Some(&text),
                        logprobs: Some([]),
                        ..text_event(&id, output_index, true)
                    }),
                );
                let part = Part::OutputText {
                    text,
                    annotations: [],
                    logprobs: Some([]),
                };
                self.done_part(&id, output_index, &part);
                Item::Message {
                    id,
                    role: "assistant",
                    status: "completed",
                    content: vec![part],
                }
            }
            Open::Call {
                id,
                call_id,
                name,
                arguments,
            } => {
                self.emit(
                    "response.function_call_arguments.done",
                    Payload::Text(TextPayload {
                        name: Some(&name),
                        arguments: Some(&arguments),
                        ..text_event(&id, output_index, false)
                    }),
                );
                Item::FunctionCall {
                    id,
                    call_id,
                    name,
                    arguments,
                    status: "completed",
                }
            }
        };
        self.emit(
            "response.output_item.done",
            Payload::Item {
                output_index,
                item: &item,
            },
        );
        self.items.push(item);
    }

    /// `response.content_part.done` for item `item_id`'s finished part.
    fn done_part(&mut self, item_id: &str, output_index: usize, part: &Part) {
        self.emit(
            "response.content_part.done",
            Payload::Part {
                item_id,
                output_index,
                content_index: 0,
                part,
            },
        );
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
                    self.emit(
                        "response.reasoning_text.delta",
                        Payload::Text(TextPayload {
                            delta: Some(t),
                            ..text_event(&id, index, true)
                        }),
                    );
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
                    self.emit(
                        "response.output_text.delta",
                        Payload::Text(TextPayload {
                            delta: Some(t),
                            logprobs: Some([]),
                            ..text_event(&id, index, true)
                        }),
                    );
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
                        Payload::Text(TextPayload {
                            delta: Some(t),
                            ..text_event(&id, index, false)
                        }),
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
        let response = &self.meta.object("in_progress", Vec::new(), None, None);
        (self.output).emit("response.created", Payload::Response { response });
        (self.output).emit("response.in_progress", Payload::Response { response });
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
        let response = &self.meta.finish(items, turn.reply(), turn, counts);
        // `response.completed` even for an incomplete response (its status says so): the
        // SDK's `get_final_response` finds the response in that event alone.
        (self.output).emit("response.completed", Payload::Response { response });
        self.take()
    }

    fn error(&mut self, e: ApiError) -> Vec<Sse> {
        let error = Payload::Error {
            code: e.code,
            message: &e.message,
            param: e.param.as_deref(),
        };
        self.output.emit("error", error);
        self.take()
    }
}

/// `POST /v1/responses`.
pub(super) async fn create(State(app): State<Arc<App>>, request: Request) -> Response {
    let started = async {
        app.accepting()?;
        let body = body(request, app.config.max_body, app.config.body_timeout).await?;
        let lease = app.lease_for(&body).await?;
        let r = api::responses(&body, &app.bounds(lease.lm()?.0), app.config.strict_api)?;
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
        let pending = app.submit(&lease, Kind::Chat, request).await?;
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
        true => axum::Json(Deleted {
            id: &id,
            object: "response",
            deleted: true,
        })
        .into_response(),
        false => app.missing(&id, "response_id").into_response(),
    }
}
