//! One reply (a request of one prompt and one choice) assembled from the engine's events
//! and taken apart into content, reasoning and tool calls, whatever the template; and the
//! stream an adapter encodes from it. The Responses, Anthropic and Ollama endpoints are
//! built on it, each encoding its steps in its own shape.

use std::time::Instant;

use futures_util::Stream;
use oxgen::{Reply, ReplyDelta};
use tokio::sync::mpsc::UnboundedReceiver;

use super::response::{Choice, Pending};
use crate::error::ApiError;
use oxgen::engine::{Counts, Event};

/// A reply on its way.
pub(super) struct Turn {
    events: UnboundedReceiver<Event>,
    choice: Choice,
    /// What the last step released.
    pub(super) deltas: Vec<ReplyDelta>,
    /// Set by the last step.
    pub(super) finish: Option<oxgen::FinishReason>,
    /// The prompt's ids.
    pub(super) prompt_tokens: usize,
    /// When the request was queued and when its first token came.
    pub(super) queued: Instant,
    pub(super) first_token: Option<Instant>,
}

/// What [`Turn::next`] got.
pub(super) enum Progress {
    /// A token: its deltas are in [`Turn::deltas`], its finish (if last) in [`Turn::finish`].
    Step,
    /// The request is over.
    Done(Counts),
}

impl Turn {
    pub(super) fn new(p: Pending) -> Turn {
        let syntax = p.syntax.unwrap_or_default();
        Turn {
            events: p.events,
            choice: Choice::parsed(syntax, oxgen::fresh_seed()),
            deltas: Vec::new(),
            finish: None,
            prompt_tokens: p.prompts.iter().map(|(ids, _)| ids.len()).sum(),
            queued: Instant::now(),
            first_token: None,
        }
    }

    /// The next step, or the end.
    pub(super) async fn next(&mut self) -> Result<Progress, ApiError> {
        loop {
            match self.events.recv().await {
                Some(Event::PromptLogprobs { .. }) => {}
                Some(Event::Token { step, .. }) => {
                    self.first_token.get_or_insert_with(Instant::now);
                    let last = step.finish.is_some();
                    self.choice.push(&step.text, last, &mut self.deltas);
                    self.finish = step.finish;
                    return Ok(Progress::Step);
                }
                Some(Event::Done(counts)) => return Ok(Progress::Done(counts)),
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

    /// Waits for the whole reply.
    pub(super) async fn collect(&mut self) -> Result<Counts, ApiError> {
        loop {
            if let Progress::Done(counts) = self.next().await? {
                return Ok(counts);
            }
        }
    }

    /// The reply so far.
    pub(super) fn reply(&self) -> &Reply {
        &self.choice.reply
    }

    /// Tokens generated inside the reasoning block.
    pub(super) fn reasoning_tokens(&self) -> usize {
        self.choice.reasoning_tokens
    }
}

/// How an adapter writes a reply as it streams: its opening, each step, its end, or an
/// error; each call returns the frames to send (SSE events, JSON lines).
pub(super) trait Encode: Send + 'static {
    type Frame: Send + 'static;
    fn start(&mut self, turn: &Turn) -> Vec<Self::Frame>;
    fn step(&mut self, turn: &Turn) -> Vec<Self::Frame>;
    fn done(&mut self, turn: &Turn, counts: Counts) -> Vec<Self::Frame>;
    fn error(&mut self, e: ApiError) -> Vec<Self::Frame>;
}

/// The frames `encoder` makes of `turn`, from its opening to its end. Dropping the stream
/// (the client left) drops the turn's receiver, which cancels the request at the engine's
/// next turn.
pub(super) fn frames<E: Encode>(turn: Turn, mut encoder: E) -> impl Stream<Item = E::Frame> {
    use futures_util::StreamExt;
    let head = encoder.start(&turn);
    let body = futures_util::stream::unfold(Some((turn, encoder)), |state| async move {
        let (mut turn, mut encoder) = state?;
        match turn.next().await {
            Ok(Progress::Step) => {
                let frames = encoder.step(&turn);
                Some((frames, Some((turn, encoder))))
            }
            Ok(Progress::Done(counts)) => Some((encoder.done(&turn, counts), None)),
            Err(e) => Some((encoder.error(e), None)),
        }
    });
    futures_util::stream::iter(head).chain(body.flat_map(futures_util::stream::iter))
}
