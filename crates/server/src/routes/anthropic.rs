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
use serde::Serialize;
use serde_json::Value;

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

/// A whole message, or (with no content and no stop yet) the one a stream starts with.
#[derive(Serialize)]
struct Message<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    role: &'static str,
    model: &'a str,
    content: Vec<Block>,
    stop_reason: Option<&'static str>,
    stop_sequence: Option<String>,
    usage: Usage,
}

/// A content block.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block {
    Thinking {
        thinking: String,
        signature: &'static str,
    },
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

/// A streamed block's delta (its `type` is the block's, `_delta`).
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDelta<'a> {
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: &'a str },
    #[serde(rename = "text_delta")]
    Text { text: &'a str },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: &'a str },
}

/// The named events of a stream (each one's `type` is its name).
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StreamEvent<'a> {
    MessageStart { message: Message<'a> },
    Ping,
    ContentBlockStart { index: usize, content_block: Block },
    ContentBlockDelta { index: usize, delta: BlockDelta<'a> },
    ContentBlockStop { index: usize },
    MessageDelta { delta: StopDelta, usage: Usage },
    MessageStop,
}

#[derive(Serialize)]
struct StopDelta {
    stop_reason: &'static str,
    stop_sequence: Option<String>,
}

/// The tokens of a message: the prompt's neither read from nor written to the prefix cache,
/// the generated, and the cache's (every whole block of a prompt is cached as it fills, so
/// what is written is the prompt's whole blocks past what was read). A stream's first
/// message counts its prompt alone.
#[derive(Serialize)]
struct Usage {
    input_tokens: usize,
    output_tokens: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_creation_input_tokens: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_read_input_tokens: Option<usize>,
}

impl Usage {
    fn of(counts: Counts) -> Usage {
        Usage {
            input_tokens: counts.prompt_tokens - counts.cached_tokens - counts.cache_written_tokens,
            output_tokens: counts.completion_tokens,
            cache_creation_input_tokens: Some(counts.cache_written_tokens),
            cache_read_input_tokens: Some(counts.cached_tokens),
        }
    }
}

impl StreamEvent<'_> {
    fn name(&self) -> &'static str {
        match self {
            StreamEvent::MessageStart { .. } => "message_start",
            StreamEvent::Ping => "ping",
            StreamEvent::ContentBlockStart { .. } => "content_block_start",
            StreamEvent::ContentBlockDelta { .. } => "content_block_delta",
            StreamEvent::ContentBlockStop { .. } => "content_block_stop",
            StreamEvent::MessageDelta { .. } => "message_delta",
            StreamEvent::MessageStop => "message_stop",
        }
    }

    fn sse(&self) -> Sse {
        Sse::default()
            .event(self.name())
            .data(serde_json::to_string(self).unwrap_or_default())
    }
}

/// A call's arguments as the object `input` is (`{}` where a reply cut short left them
/// unfinished).
fn input(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::Object(Default::default()))
}

/// The content blocks of a whole reply: its thinking, its text, its calls.
fn content(reply: &Reply) -> Vec<Block> {
    let mut blocks = Vec::new();
    if !reply.reasoning.is_empty() {
        blocks.push(Block::Thinking {
            thinking: reply.reasoning.clone(),
            signature: "",
        });
    }
    if !reply.content.is_empty() || reply.calls.is_empty() {
        blocks.push(Block::Text {
            text: reply.content.clone(),
        });
    }
    for c in &reply.calls {
        blocks.push(Block::ToolUse {
            id: c.id.clone(),
            name: c.name.clone(),
            input: input(&c.arguments),
        });
    }
    blocks
}

/// The block open while a reply streams.
#[derive(PartialEq)]
enum Open {
    Thinking,
    Text,
    ToolUse,
}

/// The streamed message.
struct Events {
    id: String,
    model: String,
    stops: Vec<String>,
    open: Option<Open>,
    /// Blocks opened so far.
    blocks: usize,
}

impl Events {
    /// Opens a block of kind `open` (closing the one before), started by `start`.
    fn begin(&mut self, open: Open, start: Block, out: &mut Vec<Sse>) {
        self.end(out);
        let index = self.blocks;
        out.push(
            StreamEvent::ContentBlockStart {
                index,
                content_block: start,
            }
            .sse(),
        );
        self.open = Some(open);
        self.blocks += 1;
    }

    fn end(&mut self, out: &mut Vec<Sse>) {
        if self.open.take().is_some() {
            let index = self.blocks - 1;
            out.push(StreamEvent::ContentBlockStop { index }.sse());
        }
    }

    fn delta(&self, delta: BlockDelta) -> Sse {
        let index = self.blocks - 1;
        StreamEvent::ContentBlockDelta { index, delta }.sse()
    }
}

impl Encode for Events {
    type Frame = Sse;

    fn start(&mut self, turn: &Turn) -> Vec<Sse> {
        let message = Message {
            id: &self.id,
            kind: "message",
            role: "assistant",
            model: &self.model,
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: Usage {
                input_tokens: turn.prompt_tokens,
                output_tokens: 0,
                cache_creation_input_tokens: None,
                cache_read_input_tokens: None,
            },
        };
        vec![
            StreamEvent::MessageStart { message }.sse(),
            StreamEvent::Ping.sse(),
        ]
    }

    fn step(&mut self, turn: &Turn) -> Vec<Sse> {
        let mut out = Vec::new();
        for d in &turn.deltas {
            match d {
                ReplyDelta::Reasoning(t) => {
                    if self.open != Some(Open::Thinking) {
                        let start = Block::Thinking {
                            thinking: String::new(),
                            signature: "",
                        };
                        self.begin(Open::Thinking, start, &mut out);
                    }
                    out.push(self.delta(BlockDelta::Thinking { thinking: t }));
                }
                ReplyDelta::Content(t) => {
                    if self.open != Some(Open::Text) {
                        let start = Block::Text {
                            text: String::new(),
                        };
                        self.begin(Open::Text, start, &mut out);
                    }
                    out.push(self.delta(BlockDelta::Text { text: t }));
                }
                ReplyDelta::CallStart { id, name, .. } => {
                    let start = Block::ToolUse {
                        id: id.clone(),
                        name: name.clone(),
                        input: Value::Object(Default::default()),
                    };
                    self.begin(Open::ToolUse, start, &mut out);
                }
                ReplyDelta::CallArguments { text, .. } => {
                    out.push(self.delta(BlockDelta::InputJson { partial_json: text }));
                }
            }
        }
        out
    }

    fn done(&mut self, turn: &Turn, counts: Counts) -> Vec<Sse> {
        let mut out = Vec::new();
        self.end(&mut out);
        let (stop_reason, stop_sequence) = stop_reason(turn, &self.stops);
        let delta = StopDelta {
            stop_reason,
            stop_sequence,
        };
        let usage = Usage::of(counts);
        out.push(StreamEvent::MessageDelta { delta, usage }.sse());
        out.push(StreamEvent::MessageStop.sse());
        out
    }

    fn error(&mut self, e: ApiError) -> Vec<Sse> {
        let (_, body) = e.shaped(Protocol::Anthropic);
        vec![Sse::default().event("error").data(body.to_string())]
    }
}

/// `POST /v1/messages`.
pub(super) async fn messages(State(app): State<Arc<App>>, request: Request) -> Response {
    let started = async {
        app.accepting()?;
        let body = body(request, app.config.max_body, app.config.body_timeout).await?;
        let lease = app.lease_for(&body).await?;
        let bounds = app.bounds(lease.lm()?.0);
        let m = api::messages(&body, &bounds, app.config.strict_api, false)?;
        let model = m.request.model.clone();
        let pending = app.submit(&lease, Kind::Chat, m.request).await?;
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
        let ping = StreamEvent::Ping.sse();
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
                let (reason, stop_sequence) = stop_reason(&turn, &stops);
                axum::Json(Message {
                    id: &id,
                    kind: "message",
                    role: "assistant",
                    model: &model,
                    content: content(turn.reply()),
                    stop_reason: Some(reason),
                    stop_sequence,
                    usage: Usage::of(counts),
                })
                .into_response()
            }
            Err(e) => e.response(Protocol::Anthropic),
        }
    };
    notes.apply(&mut response);
    response
}

#[derive(Serialize)]
struct TokenCount {
    input_tokens: usize,
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as `/v1/messages` would render it.
pub(super) async fn count_tokens(State(app): State<Arc<App>>, request: Request) -> Response {
    let counted = async {
        app.accepting()?;
        let body = body(request, app.config.max_body, app.config.body_timeout).await?;
        let lease = app.lease_for(&body).await?;
        let (loaded, _) = lease.lm()?;
        let mut m = api::messages(&body, &app.bounds(loaded), app.config.strict_api, true)?;
        let r = &mut m.request;
        let mut request = PrepareRequest::new(std::mem::take(&mut r.prompts), "messages");
        request.tools = r.tools.take().map(|t| t.with_format(loaded.tool_format));
        request.template_kwargs = std::mem::take(&mut r.template_kwargs);
        request.reasoning_effort = r.reasoning_effort.take();
        request.continue_final_message = r.render.continue_final_message;
        request.add_generation_prompt = r.render.add_generation_prompt;
        let prepared = prepare(loaded, request, false).await?;
        let tokens: usize = prepared.prompts.iter().map(|(ids, _)| ids.len()).sum();
        Ok::<_, ApiError>(TokenCount {
            input_tokens: tokens,
        })
    };
    match counted.await {
        Ok(body) => axum::Json(body).into_response(),
        Err(e) => e.response(Protocol::Anthropic),
    }
}
