//! OpenAI's responses, built from the engine's events: a whole `chat.completion` or
//! `text_completion`, or its stream of chunks; each choice's text taken apart into content,
//! reasoning and tool calls where the reply has them; log-probabilities in each endpoint's
//! shape (an echoed prompt's first); usage.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::response::IntoResponse;
use axum::response::sse::{Event as Sse, KeepAlive};
use futures_util::StreamExt;
use oxgen::{Logprobs, Reply, ReplyDelta, ReplyParser, ReplySyntax};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::error::ApiError;
use oxgen::engine::{Counts, Event};

pub(super) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// An id: the object's prefix (`chatcmpl-`, `resp_`, `msg_`) and 24 random hex digits.
pub(super) fn response_id(prefix: &str) -> String {
    use std::hash::{BuildHasher, RandomState};
    let a = RandomState::new().hash_one(Instant::now());
    let b = RandomState::new().hash_one(a);
    format!("{prefix}{a:016x}{:08x}", b as u32)
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Chat,
    Completion,
}

/// A request on its way: what the response needs besides the engine's events.
pub(super) struct Pending {
    pub(super) kind: Kind,
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) model: String,
    pub(super) n: usize,
    pub(super) stream: bool,
    pub(super) include_usage: bool,
    pub(super) logprobs: bool,
    pub(super) events: UnboundedReceiver<Event>,
    pub(super) encoder: oxgen::Encoder,
    /// How a chat reply is taken apart (reasoning, tool calls); `None`: all content.
    pub(super) syntax: Option<ReplySyntax>,
    /// Each prompt's ids and text (a completion's token-id prompt has its text only when
    /// echoed); choice `c` is prompt `c / per_prompt`'s.
    pub(super) prompts: Vec<(Vec<u32>, String)>,
    pub(super) per_prompt: usize,
    /// Each completion choice begins with its prompt.
    pub(super) echo: bool,
    /// Each choice's `prompt_logprobs` is answered (vLLM's field).
    pub(super) prompt_logprobs: bool,
    /// `max_tokens: 0`: the one token generated (the engine always chooses one) is dropped.
    pub(super) discard: bool,
    /// What the response's headers say of the request (fields ignored, a constraint that
    /// cannot be closed early).
    pub(super) notes: super::http::Notes,
}

/// One choice being assembled.
#[derive(Default, Clone)]
pub(super) struct Choice {
    /// The text, when the reply is not taken apart.
    text: String,
    /// The reply taken apart by `parser`.
    pub(super) reply: Reply,
    parser: Option<ReplyParser>,
    finish: Option<&'static str>,
    /// (id, log-probabilities) per token.
    logprobs: Vec<(u32, Logprobs)>,
    /// Its prompt's log-probabilities, from the prompt's second id on.
    prompt: Vec<Logprobs>,
    /// Streaming: the echoed prompt went out.
    echoed: bool,
    /// Tokens generated inside the reasoning block.
    pub(super) reasoning_tokens: usize,
}

impl Choice {
    /// A choice whose reply is taken apart as `syntax` says.
    pub(super) fn parsed(syntax: ReplySyntax, seed: u64) -> Choice {
        Choice {
            parser: Some(ReplyParser::new(syntax, seed)),
            ..Choice::default()
        }
    }

    /// Takes a step's text through the parser, whose deltas go to `deltas`; without one the
    /// text is kept as it is (and `deltas` left empty).
    pub(super) fn push(&mut self, text: &str, last: bool, deltas: &mut Vec<ReplyDelta>) {
        deltas.clear();
        let Some(parser) = &mut self.parser else {
            self.text.push_str(text);
            return;
        };
        let reasoning = parser.in_reasoning();
        parser.push(text, deltas);
        if reasoning || parser.in_reasoning() {
            self.reasoning_tokens += 1;
        }
        if last {
            parser.finish(deltas);
        }
        for d in deltas.iter() {
            self.reply.apply(d);
        }
    }
    /// OpenAI's finish reason: `tool_calls` when a reply that ended of itself made calls.
    fn finish_reason(&self, finish: oxgen::FinishReason) -> &'static str {
        let calls = self.parser.as_ref().is_some_and(|p| p.calls() > 0);
        match finish.as_str() {
            "stop" if calls => "tool_calls",
            other => other,
        }
    }

    /// The chat message of a whole reply.
    fn message(&self) -> Value {
        if self.parser.is_none() {
            return json!({"role": "assistant", "content": self.text});
        }
        let r = &self.reply;
        let content = if r.content.is_empty() && !r.calls.is_empty() {
            Value::Null
        } else {
            json!(r.content)
        };
        let mut m = json!({"role": "assistant", "content": content});
        if !r.reasoning.is_empty() {
            m["reasoning_content"] = json!(r.reasoning);
        }
        if !r.calls.is_empty() {
            m["tool_calls"] = (r.calls.iter())
                .map(|c| {
                    json!({"id": c.id, "type": "function",
                           "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect();
        }
        m
    }
}

/// A streamed chat delta.
pub(super) fn delta_json(d: &ReplyDelta) -> Value {
    match d {
        ReplyDelta::Content(t) => json!({"content": t}),
        ReplyDelta::Reasoning(t) => json!({"reasoning_content": t}),
        ReplyDelta::CallStart { index, id, name } => json!({"tool_calls": [{
            "index": index, "id": id, "type": "function",
            "function": {"name": name, "arguments": ""},
        }]}),
        ReplyDelta::CallArguments { index, text } => json!({"tool_calls": [{
            "index": index, "function": {"arguments": text},
        }]}),
    }
}

/// `usage`, with the prompt tokens the prefix cache served and, for chat, the tokens spent
/// reasoning.
pub(super) fn usage(counts: Counts, reasoning_tokens: Option<usize>) -> Value {
    let mut u = json!({
        "prompt_tokens": counts.prompt_tokens,
        "completion_tokens": counts.completion_tokens,
        "total_tokens": counts.prompt_tokens + counts.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": counts.cached_tokens},
    });
    if let Some(reasoning_tokens) = reasoning_tokens {
        u["completion_tokens_details"] = json!({
            "reasoning_tokens": reasoning_tokens,
            "accepted_prediction_tokens": counts.accepted_prediction_tokens,
            "rejected_prediction_tokens": counts.rejected_prediction_tokens,
        });
    }
    u
}

/// Two completions `logprobs` objects as one: each array of `b` after `a`'s.
pub(super) fn concat_logprobs(a: Value, b: Value) -> Value {
    match (a, b) {
        (Value::Object(mut a), Value::Object(b)) => {
            for (k, v) in b {
                if let (Some(Value::Array(into)), Value::Array(more)) = (a.get_mut(&k), v) {
                    into.extend(more);
                }
            }
            Value::Object(a)
        }
        (a, _) => a,
    }
}

/// The text of token `id` alone: U+FFFD where it holds part of a character.
pub(super) fn token_text(encoder: &oxgen::Encoder, id: u32) -> String {
    encoder.decode(&[id], false).unwrap_or_default()
}

impl Pending {
    /// The `logprobs` object of a choice's `tokens`, in the endpoint's shape, and the
    /// `text_offset` after them: completions' offsets run over the token texts (whether the
    /// tokens arrive at once or chunk by chunk), from `text_start`.
    fn logprobs_json(&self, tokens: &[(u32, Logprobs)], text_start: usize) -> (Value, usize) {
        if !self.logprobs {
            return (Value::Null, text_start);
        }
        match self.kind {
            Kind::Chat => {
                let entry = |id: u32, logprob: f32| {
                    json!({
                        "token": token_text(&self.encoder, id),
                        "logprob": logprob,
                        "bytes": self.encoder.token_bytes(id),
                    })
                };
                let content: Vec<Value> = tokens
                    .iter()
                    .map(|(id, lp)| {
                        let mut e = entry(*id, lp.logprob);
                        e["top_logprobs"] = lp
                            .top
                            .iter()
                            .map(|&(t, l)| entry(t, l))
                            .collect::<Vec<_>>()
                            .into();
                        e
                    })
                    .collect();
                (json!({ "content": content }), text_start)
            }
            Kind::Completion => {
                let entries = tokens.iter().map(|(id, lp)| (*id, Some(lp)));
                self.completion_logprobs(entries, text_start)
            }
        }
    }

    /// Completions' `logprobs` over `entries` (an id and its log-probabilities; `None` for a
    /// prompt's first id, which has none), offsets from `text_start`.
    fn completion_logprobs<'l>(
        &self,
        entries: impl Iterator<Item = (u32, Option<&'l Logprobs>)>,
        text_start: usize,
    ) -> (Value, usize) {
        let mut offset = text_start;
        let (mut texts, mut lps, mut tops, mut offsets) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (id, lp) in entries {
            let token = token_text(&self.encoder, id);
            offsets.push(offset);
            offset += token.len();
            texts.push(token);
            let Some(lp) = lp else {
                lps.push(Value::Null);
                tops.push(Value::Null);
                continue;
            };
            lps.push(json!(lp.logprob));
            // Keyed by text: ids that decode alike keep the likeliest one's value.
            let mut top = serde_json::Map::new();
            for &(t, l) in &lp.top {
                top.entry(token_text(&self.encoder, t)).or_insert(json!(l));
            }
            tops.push(Value::Object(top));
        }
        let v = json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops,
               "text_offset": offsets});
        (v, offset)
    }

    /// Choice `c`'s prompt: its ids and text.
    fn prompt_of(&self, c: usize) -> &(Vec<u32>, String) {
        &self.prompts[c / self.per_prompt.max(1)]
    }

    /// Choice `c`'s echoed prompt: its text, and its ids as completions' `logprobs` entries
    /// with the offset after them (`null` without log-probabilities).
    fn echo_json(&self, c: usize, choice: &Choice) -> (String, Value, usize) {
        let (ids, text) = self.prompt_of(c);
        if !self.logprobs {
            return (text.clone(), Value::Null, 0);
        }
        let lps = std::iter::once(None).chain(choice.prompt.iter().map(Some));
        let (logprobs, end) = self.completion_logprobs(ids.iter().copied().zip(lps), 0);
        (text.clone(), logprobs, end)
    }

    /// vLLM's `prompt_logprobs` of a choice: `null` for the first id, then for each a map
    /// from token id to `{logprob, rank, decoded_token}` holding the prompt's id and the
    /// likeliest ones (`rank` where it is among them).
    fn prompt_logprobs_json(&self, c: usize, choice: &Choice) -> Value {
        let (ids, _) = self.prompt_of(c);
        let mut out = vec![Value::Null];
        for (id, lp) in ids.iter().skip(1).zip(&choice.prompt) {
            let mut m = Map::new();
            let mut put = |id: u32, logprob: f32| {
                let rank = lp.top.iter().position(|&(t, _)| t == id).map(|r| r + 1);
                m.entry(id.to_string()).or_insert_with(|| {
                    json!({"logprob": logprob, "rank": rank,
                           "decoded_token": token_text(&self.encoder, id)})
                });
            };
            put(*id, lp.logprob);
            for &(t, l) in &lp.top {
                put(t, l);
            }
            out.push(Value::Object(m));
        }
        Value::Array(out)
    }

    fn object(&self) -> &'static str {
        match (self.kind, self.stream) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": self.object(),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": Value::Null,
            "choices": choices,
        })
    }

    /// A streaming chunk; with `include_usage` every chunk carries `"usage": null`.
    fn chunk(&self, choices: Vec<Value>) -> Value {
        let mut chunk = self.envelope(choices);
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    /// A choice of a response or a chunk: `body` as its message, delta or text.
    fn choice(&self, index: usize, body: Value, logprobs: Value, finish: Option<&str>) -> Value {
        let mut c = json!({"index": index, "logprobs": logprobs, "finish_reason": finish});
        let key = match (self.kind, self.stream) {
            (Kind::Chat, false) => "message",
            (Kind::Chat, true) => "delta",
            (Kind::Completion, _) => "text",
        };
        c[key] = body;
        c
    }

    /// A whole choice of a non-streamed response.
    fn whole_choice(&self, i: usize, c: &Choice) -> Value {
        let (logprobs, _) = self.logprobs_json(&c.logprobs, 0);
        let mut choice = match self.kind {
            Kind::Chat => self.choice(i, c.message(), logprobs, c.finish),
            Kind::Completion if self.echo => {
                let (text, echoed, end) = self.echo_json(i, c);
                let (generated, _) = self.logprobs_json(&c.logprobs, end);
                let logprobs = concat_logprobs(echoed, generated);
                self.choice(i, json!(text + &c.text), logprobs, c.finish)
            }
            Kind::Completion => self.choice(i, json!(c.text), logprobs, c.finish),
        };
        if self.prompt_logprobs {
            choice["prompt_logprobs"] = self.prompt_logprobs_json(i, c);
        }
        choice
    }

    /// The chunks one token of choice `i` makes: the echoed prompt before its first, its
    /// deltas, and its finish chunk after its last.
    fn token_chunks(
        &self,
        i: usize,
        step: oxgen::Step,
        c: &mut Choice,
        offset: &mut usize,
        deltas: &mut Vec<ReplyDelta>,
    ) -> Vec<Value> {
        let mut out = Vec::new();
        if self.echo && !c.echoed {
            c.echoed = true;
            let (text, logprobs, end) = self.echo_json(i, c);
            *offset = end;
            out.push(self.chunk(vec![self.choice(i, json!(text), logprobs, None)]));
        }
        if self.discard {
            out.push(self.chunk(vec![self.choice(i, json!(""), Value::Null, Some("length"))]));
            return out;
        }
        if c.parser.is_some() {
            c.push(&step.text, step.finish.is_some(), deltas);
        } else if !step.text.is_empty() {
            deltas.clear();
            deltas.push(ReplyDelta::Content(step.text));
        } else {
            deltas.clear();
        }
        let tokens: Vec<_> = step.logprobs.map(|lp| (step.id, lp)).into_iter().collect();
        let (mut logprobs, end) = self.logprobs_json(&tokens, *offset);
        *offset = end;
        if deltas.is_empty() && !logprobs.is_null() {
            deltas.push(ReplyDelta::Content(String::new()));
        }
        for d in deltas.iter() {
            let body = match (self.kind, d) {
                (Kind::Chat, d) => delta_json(d),
                (Kind::Completion, ReplyDelta::Content(t)) => json!(t),
                (Kind::Completion, _) => continue,
            };
            let lp = std::mem::take(&mut logprobs);
            out.push(self.chunk(vec![self.choice(i, body, lp, None)]));
        }
        if let Some(f) = step.finish {
            let empty = match self.kind {
                Kind::Chat => json!({}),
                Kind::Completion => json!(""),
            };
            let reason = c.finish_reason(f);
            out.push(self.chunk(vec![self.choice(i, empty, Value::Null, Some(reason))]));
        }
        out
    }

    /// The response's `usage`.
    fn usage(&self, mut counts: Counts, choices: &[Choice]) -> Value {
        if self.discard {
            counts.completion_tokens = 0;
        }
        let reasoning =
            (self.kind == Kind::Chat).then(|| choices.iter().map(|c| c.reasoning_tokens).sum());
        usage(counts, reasoning)
    }

    /// The choices, each with its parser when the reply is taken apart.
    fn choices(&self) -> Vec<Choice> {
        let seed = oxgen::fresh_seed();
        (0..self.n)
            .map(|i| match self.syntax {
                Some(s) => Choice::parsed(s, seed.wrapping_add(i as u64 * 0x9e37)),
                None => Choice::default(),
            })
            .collect()
    }
}

/// Waits for the whole generation.
pub(super) async fn collect(mut p: Pending) -> Result<Value, ApiError> {
    let mut choices = p.choices();
    let mut deltas = Vec::new();
    loop {
        match p.events.recv().await {
            Some(Event::PromptLogprobs { choice, logprobs }) => {
                choices[choice].prompt.extend(logprobs);
            }
            Some(Event::Token { choice, step }) => {
                let c = &mut choices[choice];
                if p.discard {
                    c.finish = Some("length");
                    continue;
                }
                c.push(&step.text, step.finish.is_some(), &mut deltas);
                if let Some(lp) = step.logprobs {
                    c.logprobs.push((step.id, lp));
                }
                c.finish = step.finish.map(|f| c.finish_reason(f));
            }
            Some(Event::Done(counts)) => {
                let usage = p.usage(counts, &choices);
                let choices = (choices.iter().enumerate())
                    .map(|(i, c)| p.whole_choice(i, c))
                    .collect();
                let mut body = p.envelope(choices);
                body["usage"] = usage;
                return Ok(body);
            }
            Some(Event::Error(e)) => return Err(e.into()),
            None => {
                return Err(ApiError::unavailable(
                    "engine_failed",
                    "the engine stopped before the request finished",
                ));
            }
        }
    }
}

/// Server-sent events: a role chunk first (chat), content chunks (reasoning and tool-call
/// deltas too, when the reply is taken apart; an echoed prompt first), a finish chunk per
/// choice, the usage chunk when asked, then `[DONE]`; an error becomes an error chunk
/// followed by `[DONE]`. Dropping the stream (the client left) drops the receiver, which
/// cancels the request at the engine's next turn.
pub(super) fn stream(p: Pending) -> impl IntoResponse {
    let data = |v: Value| Sse::default().data(v.to_string());
    let mut first = Vec::new();
    if p.kind == Kind::Chat {
        let role = (0..p.n)
            .map(|i| {
                p.choice(
                    i,
                    json!({"role": "assistant", "content": ""}),
                    Value::Null,
                    None,
                )
            })
            .collect();
        first.push(p.chunk(role));
    }
    let offsets = vec![0usize; p.n];
    let choices = p.choices();
    let head = futures_util::stream::iter(first.into_iter().map(data));
    let state = Some((p, offsets, choices, Vec::new()));
    let body = futures_util::stream::unfold(state, move |state| async move {
        let (mut p, mut offsets, mut choices, mut deltas) = state?;
        let out = match p.events.recv().await {
            Some(Event::PromptLogprobs { choice, logprobs }) => {
                choices[choice].prompt.extend(logprobs);
                return Some((Vec::new(), Some((p, offsets, choices, deltas))));
            }
            Some(Event::Token { choice, step }) => {
                let (c, offset) = (&mut choices[choice], &mut offsets[choice]);
                let out = p.token_chunks(choice, step, c, offset, &mut deltas);
                return Some((
                    out.into_iter().map(data).collect::<Vec<_>>(),
                    Some((p, offsets, choices, deltas)),
                ));
            }
            Some(Event::Done(counts)) => {
                let mut out = Vec::new();
                if p.include_usage {
                    let mut chunk = p.envelope(Vec::new());
                    chunk["usage"] = p.usage(counts, &choices);
                    out.push(data(chunk));
                }
                out
            }
            Some(Event::Error(e)) => vec![data(ApiError::from(e).body())],
            None => vec![data(
                ApiError::unavailable("engine_failed", "the engine stopped").body(),
            )],
        };
        let mut out = out;
        out.push(Sse::default().data("[DONE]"));
        Some((out, None))
    })
    .flat_map(futures_util::stream::iter);
    let events = head.chain(body).map(Ok::<_, Infallible>);
    axum::response::Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(1)))
}
