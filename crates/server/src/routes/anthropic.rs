//! Anthropic's Messages API over the engine: `POST /v1/messages` (a whole message, or its
//! stream of named events `message_start` ... `message_stop`, with `ping`s while it waits),
//! `POST /v1/messages/count_tokens`; errors in Anthropic's envelope.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use oxgen::{FinishReason, Reply, ReplyDelta};
use serde_json::{Value, json};

use super::http::body;
use super::response::{Kind, response_id};
use super::turn::{Encode, Turn, frames};
use super::{PrepareRequest, prepare};
use crate::App;
use crate::api;
use crate::error::{ApiError, Protocol};
use oxgen::engine::Counts;

/// Why the reply stopped, in Anthropic's words, and the stop sequence that ended it.
fn stop_reason(turn: &Turn, stops: &[String]) -> (&'static str, Option<String>) {
    match turn.finish {
        Some(FinishReason::StopString(i)) => ("stop_sequence", stops.get(i).cloned()),
        Some(FinishReason::Length | FinishReason::Context) => ("max_tokens", None),
        _ if !turn.reply().calls.is_empty() => ("tool_use", None),
        _ => ("end_turn", None),
    }
}

/// A call's arguments as the object `input` is (`{}` where a reply cut short left them
/// unfinished).
fn input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| json!({}))
}

/// The content blocks of a whole reply: its thinking, its text, its calls.
fn content(reply: &Reply) -> Vec<Value> {
    let mut blocks = Vec::new();
    if !reply.reasoning.is_empty() {
        blocks.push(json!({"type": "thinking", "thinking": reply.reasoning, "signature": ""}));
    }
    if !reply.content.is_empty() || reply.calls.is_empty() {
        blocks.push(json!({"type": "text", "text": reply.content}));
    }
    for c in &reply.calls {
        blocks.push(
            json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input(&c.arguments)}),
        );
    }
    blocks
}

fn usage(counts: Counts) -> Value {
    json!({
        "input_tokens": counts.prompt_tokens - counts.cached_tokens,
        "output_tokens": counts.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": counts.cached_tokens,
    })
}

/// The block open while a reply streams.
#[derive(PartialEq)]
enum Block {
    Thinking,
    Text,
    ToolUse,
}

/// The streamed message.
struct Events {
    id: String,
    model: String,
    stops: Vec<String>,
    open: Option<Block>,
    /// Blocks opened so far.
    blocks: usize,
}

fn event(name: &str, data: Value) -> Sse {
    Sse::default().event(name).data(data.to_string())
}

impl Events {
    /// Opens block `block` (closing the one before), started by `start`.
    fn begin(&mut self, block: Block, start: Value, out: &mut Vec<Sse>) {
        self.end(out);
        let index = self.blocks;
        out.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        self.open = Some(block);
        self.blocks += 1;
    }

    fn end(&mut self, out: &mut Vec<Sse>) {
        if self.open.take().is_some() {
            let index = self.blocks - 1;
            out.push(event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    fn delta(&self, delta: Value) -> Sse {
        let index = self.blocks - 1;
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    }
}

impl Encode for Events {
    type Frame = Sse;

    fn start(&mut self, turn: &Turn) -> Vec<Sse> {
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "content": [],
            "model": self.model, "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": turn.prompt_tokens, "output_tokens": 0},
        });
        vec![
            event(
                "message_start",
                json!({"type": "message_start", "message": message}),
            ),
            event("ping", json!({"type": "ping"})),
        ]
    }

    fn step(&mut self, turn: &Turn) -> Vec<Sse> {
        let mut out = Vec::new();
        for d in &turn.deltas {
            match d {
                ReplyDelta::Reasoning(t) => {
                    if self.open != Some(Block::Thinking) {
                        let start = json!({"type": "thinking", "thinking": "", "signature": ""});
                        self.begin(Block::Thinking, start, &mut out);
                    }
                    out.push(self.delta(json!({"type": "thinking_delta", "thinking": t})));
                }
                ReplyDelta::Content(t) => {
                    if self.open != Some(Block::Text) {
                        self.begin(Block::Text, json!({"type": "text", "text": ""}), &mut out);
                    }
                    out.push(self.delta(json!({"type": "text_delta", "text": t})));
                }
                ReplyDelta::CallStart { id, name, .. } => {
                    let start = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                    self.begin(Block::ToolUse, start, &mut out);
                }
                ReplyDelta::CallArguments { text, .. } => {
                    out.push(self.delta(json!({"type": "input_json_delta", "partial_json": text})));
                }
            }
        }
        out
    }

    fn done(&mut self, turn: &Turn, counts: Counts) -> Vec<Sse> {
        let mut out = Vec::new();
        self.end(&mut out);
        let (reason, sequence) = stop_reason(turn, &self.stops);
        out.push(event(
            "message_delta",
            json!({"type": "message_delta",
                   "delta": {"stop_reason": reason, "stop_sequence": sequence},
                   "usage": usage(counts)}),
        ));
        out.push(event("message_stop", json!({"type": "message_stop"})));
        out
    }

    fn error(&mut self, e: ApiError) -> Vec<Sse> {
        let (_, body) = e.shaped(Protocol::Anthropic);
        vec![event("error", body)]
    }
}

/// `POST /v1/messages`.
pub(super) async fn messages(State(app): State<Arc<App>>, request: Request) -> Response {
    let started = async {
        let loaded = app.ready()?;
        let body = body(request, app.config.max_body, app.config.body_timeout).await?;
        let m = api::messages(&body, &app.bounds(loaded), app.config.strict_api, false)?;
        let model = m.request.model.clone();
        let pending = app.submit(Kind::Chat, m.request).await?;
        Ok::<_, ApiError>((model, m.stop_sequences, pending))
    };
    let (model, stops, mut pending) = match started.await {
        Ok(started) => started,
        Err(e) => return e.response(Protocol::Anthropic),
    };
    let notes = std::mem::take(&mut pending.notes);
    let stream = pending.stream;
    let mut turn = Turn::new(pending);
    let id = response_id("msg_");
    let mut response = if stream {
        let events = Events {
            id,
            model,
            stops,
            open: None,
            blocks: 0,
        };
        let frames = frames(turn, events).map(Ok::<_, std::convert::Infallible>);
        let ping = event("ping", json!({"type": "ping"}));
        axum::response::Sse::new(frames)
            .keep_alive(
                KeepAlive::new()
                    .interval(Duration::from_secs(1))
                    .event(ping),
            )
            .into_response()
    } else {
        match turn.collect().await {
            Ok(counts) => {
                let (reason, sequence) = stop_reason(&turn, &stops);
                axum::Json(json!({
                    "id": id, "type": "message", "role": "assistant", "model": model,
                    "content": content(turn.reply()),
                    "stop_reason": reason, "stop_sequence": sequence,
                    "usage": usage(counts),
                }))
                .into_response()
            }
            Err(e) => e.response(Protocol::Anthropic),
        }
    };
    notes.apply(&mut response);
    response
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as `/v1/messages` would render it.
pub(super) async fn count_tokens(State(app): State<Arc<App>>, request: Request) -> Response {
    let counted = async {
        let loaded = app.ready()?;
        let body = body(request, app.config.max_body, app.config.body_timeout).await?;
        let mut m = api::messages(&body, &app.bounds(loaded), app.config.strict_api, true)?;
        app.check_model(&m.request.model)?;
        let r = &mut m.request;
        let mut request = PrepareRequest::new(std::mem::take(&mut r.prompts), "messages");
        request.tools = r.tools.take().map(|t| t.with_format(loaded.tool_format));
        request.template_kwargs = std::mem::take(&mut r.template_kwargs);
        request.reasoning_effort = r.reasoning_effort.take();
        request.continue_final_message = r.render.continue_final_message;
        request.add_generation_prompt = r.render.add_generation_prompt;
        let prepared = prepare(loaded, request, false).await?;
        let tokens: usize = prepared.prompts.iter().map(|(ids, _)| ids.len()).sum();
        Ok::<_, ApiError>(json!({"input_tokens": tokens}))
    };
    match counted.await {
        Ok(body) => axum::Json(body).into_response(),
        Err(e) => e.response(Protocol::Anthropic),
    }
}
