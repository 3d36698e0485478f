//! A generation in progress, pulled token by token, and what it reports when done.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use oxgen_generate::{FinishReason, SpecStats};

use crate::{CachedSeq, Cancel, Error, Model, Sequence};

/// One generated token and the text it completed (often the token's own text; empty while a
/// multi-byte character or a possible stop string is held back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub id: u32,
    pub text: String,
}

/// Token counts of a generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens whose KV was reused from the previous generation (not prefilled again).
    pub prefix_reused: usize,
    /// Forwards that produced generated ids (prefill's last one included).
    pub steps: usize,
    /// What speculative decoding proposed and the model confirmed.
    pub speculation: SpecStats,
}

/// Where the time went.
#[derive(Debug, Clone, Default)]
pub struct Timings {
    /// From the call to the first token: template, tokenizer, prefill and the first sample.
    pub ttft: Duration,
    /// Prompt tokens prefilled per second (reused ones not counted).
    pub prefill_tok_s: f64,
    /// Tokens per second after the first.
    pub decode_tok_s: f64,
    /// From the call to the last token.
    pub total: Duration,
    /// The time each token after the first took.
    pub inter_token: Vec<Duration>,
}

/// The result of a generation.
#[derive(Debug, Clone)]
pub struct Output {
    pub text: String,
    /// Generated ids, including a final end-of-sequence id.
    pub tokens: Vec<u32>,
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub timings: Timings,
}

/// Tokens of one generation as an iterator; [`Stream::finish`] gives the [`Output`].
///
/// The stream borrows the model. Dropping it early ends the generation (the finish reason is
/// then `Cancelled`) and keeps the KV for the next prompt that shares its ids.
pub struct Stream<'m> {
    model: &'m mut Model,
    seq: Sequence,
    cancel: Option<Cancel>,
    /// Tokens a speculative step confirmed that the caller has not pulled yet.
    pending: VecDeque<Token>,
    steps: usize,
    start: Instant,
    last: Instant,
    prefilled: usize,
    prefix_reused: usize,
    text: String,
    timings: Timings,
    done: bool,
    failed: bool,
}

impl<'m> Stream<'m> {
    pub(crate) fn new(
        model: &'m mut Model,
        seq: Sequence,
        cancel: Option<Cancel>,
        start: Instant,
    ) -> Stream<'m> {
        let (reused, span) = seq.decoding.span();
        let (prefilled, done) = (span.len(), seq.decoding.finish_reason().is_some());
        Stream {
            model,
            seq,
            cancel,
            pending: VecDeque::new(),
            steps: 0,
            start,
            last: start,
            prefilled,
            prefix_reused: reused,
            text: String::new(),
            timings: Timings::default(),
            done,
            failed: false,
        }
    }

    /// The model's counters so far ([`crate::Model::counters`]), mid-generation: taken after
    /// the first token, they split the prompt's weight bytes from the decode steps'.
    pub fn counters(&self) -> oxgen_runtime::StepCounters {
        self.model.counters()
    }

    /// Ends the generation and reports it.
    pub fn finish(mut self) -> Output {
        let decoding = &mut self.seq.decoding;
        let finish_reason = decoding.finish_reason().unwrap_or_else(|| {
            decoding.cancel();
            FinishReason::Cancelled
        });
        let tokens = decoding.generated().to_vec();
        let t = &mut self.timings;
        t.total = self.last - self.start;
        let decode = t.total.saturating_sub(t.ttft).as_secs_f64();
        if tokens.len() > 1 && decode > 0.0 {
            t.decode_tok_s = (tokens.len() - 1) as f64 / decode;
        }
        Output {
            text: std::mem::take(&mut self.text),
            finish_reason,
            usage: Usage {
                prompt_tokens: self.seq.decoding.prompt_len(),
                completion_tokens: tokens.len(),
                prefix_reused: self.prefix_reused,
                steps: self.steps,
                speculation: self.seq.speculation(),
            },
            tokens,
            timings: std::mem::take(&mut self.timings),
        }
    }

    /// Runs one step; queues the tokens it gave (several when speculation confirmed
    /// proposals, which arrive together: the ones after the first took no time).
    fn step(&mut self) -> Result<(), Error> {
        let first = self.seq.decoding.generated().is_empty();
        let steps = self.model.step_fused(&mut [&mut self.seq], usize::MAX)?;
        self.steps += 1;
        let now = Instant::now();
        for (k, step) in steps.into_iter().flatten().enumerate() {
            if first && k == 0 {
                self.timings.ttft = now - self.start;
                let secs = self.timings.ttft.as_secs_f64();
                if secs > 0.0 {
                    self.timings.prefill_tok_s = self.prefilled as f64 / secs;
                }
            } else {
                let took = if k == 0 {
                    now - self.last
                } else {
                    Duration::ZERO
                };
                self.timings.inter_token.push(took);
            }
            self.done |= step.finish.is_some();
            self.text.push_str(&step.text);
            self.pending.push_back(Token {
                id: step.id,
                text: step.text,
            });
        }
        self.last = now;
        Ok(())
    }
}

impl Iterator for Stream<'_> {
    type Item = Result<Token, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(token) = self.pending.pop_front() {
            return Some(Ok(token));
        }
        if self.done {
            return None;
        }
        if self.cancel.as_ref().is_some_and(Cancel::is_cancelled) {
            self.seq.decoding.cancel();
            self.done = true;
            return None;
        }
        if let Err(e) = self.step() {
            self.done = true;
            self.failed = true;
            return Some(Err(e));
        }
        self.pending.pop_front().map(Ok)
    }
}

impl Drop for Stream<'_> {
    /// Keeps the sequence for the next prompt, unless a failed step left its KV unknown.
    fn drop(&mut self) {
        if self.failed {
            self.model.lm_remove(self.seq.seq);
            return;
        }
        let fed = self.seq.decoding.span().0;
        self.model.cached = Some(CachedSeq {
            seq: self.seq.seq,
            ids: self.seq.decoding.ids()[..fed].to_vec(),
            ctx_size: self.seq.positions,
            adapter: self.seq.adapter,
        });
    }
}

/// Durations' `q`-quantile (nearest rank), zero when empty.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}
