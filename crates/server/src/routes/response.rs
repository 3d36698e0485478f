//! OpenAI's responses, built from the engine's events: a whole `chat.completion` or
//! `text_completion`, or its stream of chunks; each choice's text taken apart into content,
//! reasoning and tool calls where the reply has them; log-probabilities in each endpoint's
//! shape (an echoed prompt's first); usage.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::response::IntoResponse;
use axum::response::sse::{Event as Sse, KeepAlive};
use futures_util::StreamExt;
use oxgen::engine::{Counts, Event};
use oxgen::{Reply, ReplyDelta, ReplyParser, ReplySyntax};
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;

use super::openai::{
    Body, Choice as ChoiceOut, Completion, CompletionLogprobs, Delta, DeltaCall, DeltaFunction,
    Function, Keyed, Logprobs, Message, PromptLogprob, TokenLogprob, ToolCall, Usage, UsageField,
};
use crate::error::ApiError;

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
    logprobs: Vec<(u32, oxgen::Logprobs)>,
    /// Its prompt's log-probabilities, from the prompt's second id on.
    prompt: Vec<oxgen::Logprobs>,
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
    fn message(&self) -> Message {
        let mut m = Message {
            role: "assistant",
            content: Some(self.text.clone()),
            reasoning_content: None,
            tool_calls: Vec::new(),
        };
        if self.parser.is_none() {
            return m;
        }
        let r = &self.reply;
        m.content = (!r.content.is_empty() || r.calls.is_empty()).then(|| r.content.clone());
        m.reasoning_content = (!r.reasoning.is_empty()).then(|| r.reasoning.clone());
        m.tool_calls = (r.calls.iter())
            .map(|c| ToolCall {
                id: c.id.clone(),
                kind: "function",
                function: Function {
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                },
            })
            .collect();
        m
    }
}

/// A streamed chat delta.
fn delta(d: &ReplyDelta) -> Delta {
    let call = |index, id: Option<&String>, name: Option<&String>, arguments: &str| DeltaCall {
        index,
        id: id.cloned(),
        kind: id.map(|_| "function"),
        function: DeltaFunction {
            name: name.cloned(),
            arguments: arguments.to_string(),
        },
    };
    match d {
        ReplyDelta::Content(t) => Delta {
            content: Some(t.clone()),
            ..Delta::default()
        },
        ReplyDelta::Reasoning(t) => Delta {
            reasoning_content: Some(t.clone()),
            ..Delta::default()
        },
        ReplyDelta::CallStart { index, id, name } => Delta {
            tool_calls: vec![call(*index, Some(id), Some(name), "")],
            ..Delta::default()
        },
        ReplyDelta::CallArguments { index, text } => Delta {
            tool_calls: vec![call(*index, None, None, text)],
            ..Delta::default()
        },
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
    fn logprobs(&self, tokens: &[(u32, oxgen::Logprobs)], text_start: usize) -> (Logprobs, usize) {
        if !self.logprobs {
            return (Logprobs::None, text_start);
        }
        match self.kind {
            Kind::Chat => {
                let entry = |id: u32, logprob: f32| TokenLogprob {
                    token: token_text(&self.encoder, id),
                    logprob,
                    bytes: self.encoder.token_bytes(id),
                    top_logprobs: None,
                };
                let content = (tokens.iter())
                    .map(|(id, lp)| TokenLogprob {
                        top_logprobs: Some(lp.top.iter().map(|&(t, l)| entry(t, l)).collect()),
                        ..entry(*id, lp.logprob)
                    })
                    .collect();
                (Logprobs::Chat { content }, text_start)
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
        entries: impl Iterator<Item = (u32, Option<&'l oxgen::Logprobs>)>,
        text_start: usize,
    ) -> (Logprobs, usize) {
        let mut offset = text_start;
        let mut out = CompletionLogprobs::default();
        for (id, lp) in entries {
            let token = token_text(&self.encoder, id);
            out.text_offset.push(offset);
            offset += token.len();
            out.tokens.push(token);
            out.token_logprobs.push(lp.map(|lp| lp.logprob));
            out.top_logprobs.push(lp.map(|lp| {
                // Keyed by text: ids that decode alike keep the likeliest one's value.
                let mut top = Keyed::new();
                for &(t, l) in &lp.top {
                    top.first(token_text(&self.encoder, t), || l);
                }
                top
            }));
        }
        (Logprobs::Completion(out), offset)
    }

    /// Choice `c`'s prompt: its ids and text.
    fn prompt_of(&self, c: usize) -> &(Vec<u32>, String) {
        &self.prompts[c / self.per_prompt.max(1)]
    }

    /// Choice `c`'s echoed prompt: its text, and its ids as completions' `logprobs` entries
    /// with the offset after them (`null` without log-probabilities).
    fn echo(&self, c: usize, choice: &Choice) -> (String, Logprobs, usize) {
        let (ids, text) = self.prompt_of(c);
        if !self.logprobs {
            return (text.clone(), Logprobs::None, 0);
        }
        let lps = std::iter::once(None).chain(choice.prompt.iter().map(Some));
        let (logprobs, end) = self.completion_logprobs(ids.iter().copied().zip(lps), 0);
        (text.clone(), logprobs, end)
    }

    /// vLLM's `prompt_logprobs` of a choice: `null` for the first id, then for each a map
    /// from token id to `{logprob, rank, decoded_token}` holding the prompt's id and the
    /// likeliest ones (`rank` where it is among them).
    fn prompt_logprobs(&self, c: usize, choice: &Choice) -> Vec<Option<Keyed<PromptLogprob>>> {
        let (ids, _) = self.prompt_of(c);
        let mut out = vec![None];
        for (id, lp) in ids.iter().skip(1).zip(&choice.prompt) {
            let mut m = Keyed::new();
            let own = std::iter::once((*id, lp.logprob));
            for (id, logprob) in own.chain(lp.top.iter().copied()) {
                m.first(id.to_string(), || PromptLogprob {
                    logprob,
                    rank: lp.top.iter().position(|&(t, _)| t == id).map(|r| r + 1),
                    decoded_token: token_text(&self.encoder, id),
                });
            }
            out.push(Some(m));
        }
        out
    }

    fn object(&self) -> &'static str {
        match (self.kind, self.stream) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, choices: Vec<ChoiceOut>, usage: UsageField) -> Completion<'_> {
        Completion {
            id: &self.id,
            object: self.object(),
            created: self.created,
            model: &self.model,
            system_fingerprint: None,
            choices,
            usage,
        }
    }

    /// A streaming chunk; with `include_usage` every chunk carries `"usage": null`.
    fn chunk(&self, choices: Vec<ChoiceOut>) -> Completion<'_> {
        let usage = match self.include_usage {
            true => UsageField::Null,
            false => UsageField::Absent,
        };
        self.envelope(choices, usage)
    }

    /// A choice's body from its text: a completion's text, or a chat delta or message of it.
    fn body(&self, text: String) -> Body {
        match (self.kind, self.stream) {
            (Kind::Completion, _) => Body::Text(text),
            (Kind::Chat, true) => Body::Delta(Delta {
                content: Some(text),
                ..Delta::default()
            }),
            (Kind::Chat, false) => Body::Message(Message {
                role: "assistant",
                content: Some(text),
                reasoning_content: None,
                tool_calls: Vec::new(),
            }),
        }
    }

    /// A choice of a response or a chunk.
    fn choice(
        &self,
        index: usize,
        body: Body,
        logprobs: Logprobs,
        finish: Option<&'static str>,
    ) -> ChoiceOut {
        ChoiceOut {
            index,
            body,
            logprobs,
            finish_reason: finish,
            prompt_logprobs: None,
        }
    }

    /// A whole choice of a non-streamed response.
    fn whole_choice(&self, i: usize, c: &Choice) -> ChoiceOut {
        let (logprobs, _) = self.logprobs(&c.logprobs, 0);
        let mut choice = match self.kind {
            Kind::Chat => self.choice(i, Body::Message(c.message()), logprobs, c.finish),
            Kind::Completion if self.echo => {
                let (text, echoed, end) = self.echo(i, c);
                let (generated, _) = self.logprobs(&c.logprobs, end);
                self.choice(
                    i,
                    Body::Text(text + &c.text),
                    echoed.then(generated),
                    c.finish,
                )
            }
            Kind::Completion => self.choice(i, Body::Text(c.text.clone()), logprobs, c.finish),
        };
        if self.prompt_logprobs {
            choice.prompt_logprobs = Some(self.prompt_logprobs(i, c));
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
    ) -> Vec<Completion<'_>> {
        let mut out = Vec::new();
        if self.echo && !c.echoed {
            c.echoed = true;
            let (text, logprobs, end) = self.echo(i, c);
            *offset = end;
            out.push(self.chunk(vec![self.choice(i, self.body(text), logprobs, None)]));
        }
        if self.discard {
            let body = self.body(String::new());
            out.push(self.chunk(vec![self.choice(i, body, Logprobs::None, Some("length"))]));
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
        let (mut logprobs, end) = self.logprobs(&tokens, *offset);
        *offset = end;
        if deltas.is_empty() && !logprobs.is_none() {
            deltas.push(ReplyDelta::Content(String::new()));
        }
        for d in deltas.iter() {
            let body = match (self.kind, d) {
                (Kind::Chat, d) => Body::Delta(delta(d)),
                (Kind::Completion, ReplyDelta::Content(t)) => Body::Text(t.clone()),
                (Kind::Completion, _) => continue,
            };
            let lp = std::mem::take(&mut logprobs);
            out.push(self.chunk(vec![self.choice(i, body, lp, None)]));
        }
        if let Some(f) = step.finish {
            let empty = match self.kind {
                Kind::Chat => Body::Delta(Delta::default()),
                Kind::Completion => Body::Text(String::new()),
            };
            let reason = c.finish_reason(f);
            out.push(self.chunk(vec![self.choice(i, empty, Logprobs::None, Some(reason))]));
        }
        out
    }

    /// The response's `usage`.
    fn usage(&self, mut counts: Counts, choices: &[Choice]) -> UsageField {
        if self.discard {
            counts.completion_tokens = 0;
        }
        let reasoning =
            (self.kind == Kind::Chat).then(|| choices.iter().map(|c| c.reasoning_tokens).sum());
        UsageField::Counts(Usage::new(counts, reasoning))
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
                let body = serde_json::to_value(p.envelope(choices, usage));
                return body.map_err(|e| ApiError::internal(format!("the response: {e}")));
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

/// One server-sent event of `v` as JSON.
fn data(v: &impl serde::Serialize) -> Sse {
    Sse::default().data(serde_json::to_string(v).unwrap_or_default())
}

/// Server-sent events: a role chunk first (chat), content chunks (reasoning and tool-call
/// deltas too, when the reply is taken apart; an echoed prompt first), a finish chunk per
/// choice, the usage chunk when asked, then `[DONE]`; an error becomes an error chunk
/// followed by `[DONE]`. Dropping the stream (the client left) drops the receiver, which
/// cancels the request at the engine's next turn.
pub(super) fn stream(p: Pending) -> impl IntoResponse {
    let mut first = Vec::new();
    if p.kind == Kind::Chat {
        let role = (0..p.n)
            .map(|i| {
                let delta = Delta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                    ..Delta::default()
                };
                p.choice(i, Body::Delta(delta), Logprobs::None, None)
            })
            .collect();
        first.push(data(&p.chunk(role)));
    }
    let offsets = vec![0usize; p.n];
    let choices = p.choices();
    let head = futures_util::stream::iter(first);
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
                let out = out.iter().map(data).collect::<Vec<_>>();
                return Some((out, Some((p, offsets, choices, deltas))));
            }
            Some(Event::Done(counts)) => {
                let mut out = Vec::new();
                if p.include_usage {
                    out.push(data(&p.envelope(Vec::new(), p.usage(counts, &choices))));
                }
                out
            }
            Some(Event::Error(e)) => vec![data(&ApiError::from(e).body())],
            None => vec![data(
                &ApiError::unavailable("engine_failed", "the engine stopped").body(),
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
