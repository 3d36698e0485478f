//! Speculative decoding: proposers guess the next few ids of a sequence, the model checks
//! them in one forward, and the sequence keeps the longest prefix it would have generated
//! anyway.
//!
//! - **Proposers** ([`Proposer`]): [`PromptLookup`] matches the last n-gram against the ids so
//!   far; [`DraftModel`] runs a smaller [`LanguageModel`] (a second package with the same
//!   tokenizer, or the target's own first layers) greedily.
//! - **Verification** is the driver's: it feeds the last id and the k proposals as one span
//!   ([`SeqStep::proposed`] = k), takes all k + 1 logits rows, and hands them to
//!   [`crate::Decoding::on_logits`] in order while the chosen id equals the proposal. Rows of a
//!   multi-token span equal decode rows bit for bit (DESIGN.md §6), so greedy output is the
//!   plain decoder's, byte for byte.
//! - **Sampling** keeps the target's distribution by the standard rejection rule for a
//!   deterministic proposal (the proposal distribution q is one-hot at the proposed id x):
//!   accept x with probability min(1, p(x) / q(x)) = p(x), else draw from the residual
//!   max(0, p − q) renormalized, which is p without x. Drawing y ~ p with the sequence's own
//!   RNG and accepting iff y = x does exactly that (P(accept) = p(x); a rejected draw is
//!   distributed as p conditioned on y ≠ x), and consumes one draw per emitted id as plain
//!   decoding does: a seeded speculative run emits the same ids as the plain run.
//! - **Adaptive** ([`Adaptive`]): how many ids to ask for follows each sequence's running
//!   acceptance rate and the relative cost of a verified row; where speculation does not pay
//!   it switches off for a while (backing off) and probes again later.

use std::collections::HashMap;

use oxgen_runtime::{Batch, LanguageModel, LogitsWanted, SeqId, SeqStep, StepLogits};

use crate::{GenerateError, argmax_excluding};

/// One sequence's request for proposals.
#[derive(Debug, Clone, Copy)]
pub struct ProposalRequest<'a> {
    /// The target's sequence (a draft model keys its own KV by it).
    pub seq: SeqId,
    /// The prompt and the ids generated so far; the last one is the next the target feeds.
    pub ids: &'a [u32],
    /// Positions the target's sequence holds.
    pub ctx_size: usize,
    /// The most ids to propose.
    pub max: usize,
}

/// Guesses the ids that follow a sequence.
pub trait Proposer: Send {
    /// How `--speculative` names it (`prompt-lookup`, `draft`, `self`).
    fn name(&self) -> &'static str;
    /// Replaces `out[i]` with at most `requests[i].max` ids likely to follow
    /// `requests[i].ids` (none when it has no guess).
    fn propose(
        &mut self,
        requests: &[ProposalRequest],
        out: &mut [Vec<u32>],
    ) -> Result<(), GenerateError>;
    /// The target let `seq` go: free what was kept for it.
    fn forget(&mut self, seq: SeqId) {
        let _ = seq;
    }
    /// Seconds one more proposed id costs in steady state (a draft model's decode forward),
    /// as measured so far; `None` when it costs next to nothing (a lookup).
    fn secs_per_id(&self) -> Option<f64> {
        None
    }
}

/// Proposes what followed the most recent earlier occurrence of the sequence's last n ids
/// (n from `max_n` down to `min_n`): text that copies spans of the prompt (edits, summaries,
/// code) repeats them. Needs no model; allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptLookup {
    pub min_n: usize,
    pub max_n: usize,
}

impl Default for PromptLookup {
    /// n-grams of 2 to 4 ids: a single id matches too often to be worth verifying.
    fn default() -> Self {
        PromptLookup { min_n: 2, max_n: 4 }
    }
}

impl PromptLookup {
    /// The continuation of the latest earlier match of `ids`' last n ids, at most `max` long.
    pub fn lookup<'a>(&self, ids: &'a [u32], max: usize) -> &'a [u32] {
        let len = ids.len();
        for n in (self.min_n.max(1)..=self.max_n).rev() {
            if n >= len {
                continue;
            }
            let tail = &ids[len - n..];
            // Latest first: the start of a match leaves at least one id after it.
            if let Some(start) = (0..len - n).rev().find(|&i| &ids[i..i + n] == tail) {
                let from = start + n;
                return &ids[from..(from + max).min(len)];
            }
        }
        &[]
    }
}

impl Proposer for PromptLookup {
    fn name(&self) -> &'static str {
        "prompt-lookup"
    }

    fn propose(
        &mut self,
        requests: &[ProposalRequest],
        out: &mut [Vec<u32>],
    ) -> Result<(), GenerateError> {
        for (r, out) in requests.iter().zip(out) {
            out.clear();
            out.extend_from_slice(self.lookup(r.ids, r.max));
        }
        Ok(())
    }
}

/// What a draft model holds for one target sequence.
#[derive(Debug)]
struct DraftSeq {
    seq: SeqId,
    /// The ids whose KV the draft's sequence holds.
    fed: Vec<u32>,
    /// Positions it was added with.
    ctx_size: usize,
}

/// One request's part of a proposal round: the draft sequence, the ids it feeds next at
/// `pos`, and how many ids it still proposes.
#[derive(Debug, Default)]
struct DraftSpan {
    seq: Option<SeqId>,
    tokens: Vec<u32>,
    pos: usize,
    left: usize,
}

/// Proposes a smaller model's greedy continuation: a package with the same tokenizer, or the
/// target's first layers with its output head. Each target sequence has a draft sequence of
/// its own; before proposing, the draft feeds only the ids it has not seen (the KV of its
/// rejected proposals is overwritten). Each proposed id of a batch is one fused forward.
pub struct DraftModel {
    lm: Box<dyn LanguageModel>,
    name: &'static str,
    /// The target's vocabulary: draft ids at or above it are never proposed.
    vocab: usize,
    seqs: HashMap<SeqId, DraftSeq>,
    logits: StepLogits,
    spans: Vec<DraftSpan>,
    /// Running seconds per round of single-id spans (one proposed id per sequence).
    round_secs: Option<f64>,
}

impl DraftModel {
    /// A draft over `lm` (named `name` in reports) for a target of `vocab` ids.
    pub fn new(lm: Box<dyn LanguageModel>, name: &'static str, vocab: usize) -> DraftModel {
        DraftModel {
            lm,
            name,
            vocab,
            seqs: HashMap::new(),
            logits: StepLogits::default(),
            spans: Vec::new(),
            round_secs: None,
        }
    }

    /// The draft's own sequence for `r` (added, or re-added with more positions, on demand)
    /// with the ids it lacks in `span`.
    fn prepare(&mut self, r: &ProposalRequest, span: &mut DraftSpan) -> Result<(), GenerateError> {
        span.tokens.clear();
        span.seq = None;
        span.left = r.max.min(r.ctx_size.saturating_sub(r.ids.len()));
        if span.left == 0 || r.ids.is_empty() {
            return Ok(());
        }
        if self
            .seqs
            .get(&r.seq)
            .is_some_and(|d| d.ctx_size < r.ctx_size)
        {
            self.forget(r.seq);
        }
        let d = match self.seqs.entry(r.seq) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(DraftSeq {
                seq: self.lm.add_sequence(r.ctx_size)?,
                fed: Vec::with_capacity(r.ctx_size),
                ctx_size: r.ctx_size,
            }),
        };
        let shared = d.fed.iter().zip(r.ids).take_while(|(a, b)| a == b).count();
        // The last id is always fed: its logits give the first proposal.
        let from = shared.min(r.ids.len() - 1);
        d.fed.truncate(from);
        span.seq = Some(d.seq);
        span.pos = from;
        span.tokens.extend_from_slice(&r.ids[from..]);
        Ok(())
    }
}

impl Proposer for DraftModel {
    fn name(&self) -> &'static str {
        self.name
    }

    fn propose(
        &mut self,
        requests: &[ProposalRequest],
        out: &mut [Vec<u32>],
    ) -> Result<(), GenerateError> {
        let mut spans = std::mem::take(&mut self.spans);
        spans.resize_with(requests.len().max(spans.len()), DraftSpan::default);
        let prepared = requests
            .iter()
            .zip(spans.iter_mut())
            .try_for_each(|(r, span)| self.prepare(r, span));
        let spans_now = &mut spans[..requests.len()];
        let proposed = prepared.and_then(|()| self.rounds(requests, spans_now, out));
        self.spans = spans;
        proposed
    }

    fn forget(&mut self, seq: SeqId) {
        if let Some(d) = self.seqs.remove(&seq) {
            self.lm.remove_sequence(d.seq);
        }
    }

    fn secs_per_id(&self) -> Option<f64> {
        self.round_secs
    }
}

impl DraftModel {
    /// Steps every span that still proposes, one proposed id per round.
    fn rounds(
        &mut self,
        requests: &[ProposalRequest],
        spans: &mut [DraftSpan],
        out: &mut [Vec<u32>],
    ) -> Result<(), GenerateError> {
        out.iter_mut().for_each(Vec::clear);
        loop {
            let live = |s: &DraftSpan| s.seq.is_some() && s.left > 0;
            let steps: Vec<SeqStep> = (spans.iter().filter(|s| live(s)))
                .map(|s| SeqStep {
                    seq: s.seq.expect("live"),
                    tokens: &s.tokens,
                    pos: s.pos,
                    logits: LogitsWanted::Last,
                    proposed: 0,
                })
                .collect();
            if steps.is_empty() {
                return Ok(());
            }
            // Rounds that catch up on a prompt are not what a proposed id costs.
            let steady = steps.iter().all(|s| s.tokens.len() <= 2);
            let started = std::time::Instant::now();
            self.lm.step(&Batch { steps: &steps }, &mut self.logits)?;
            if steady {
                let secs = started.elapsed().as_secs_f64();
                self.round_secs = Some(running_mean(self.round_secs, secs));
            }
            drop(steps);
            let stepped = spans.iter_mut().enumerate().filter(|(_, s)| live(s));
            for (row, (i, span)) in stepped.enumerate() {
                let logits = self.logits.row(row, 0);
                let id = argmax_excluding(&logits[..logits.len().min(self.vocab)], &[]) as u32;
                if let Some(d) = self.seqs.get_mut(&requests[i].seq) {
                    d.fed.extend_from_slice(&span.tokens);
                }
                out[i].push(id);
                span.pos += span.tokens.len();
                span.tokens.clear();
                span.tokens.push(id);
                span.left -= 1;
            }
        }
    }
}

/// `mean` moved a fifth of the way toward `x` (`x` itself when there is no mean yet): the
/// running time measures speculation weighs its costs by.
pub fn running_mean(mean: Option<f64>, x: f64) -> f64 {
    mean.map_or(x, |m| 0.8 * m + 0.2 * x)
}

/// Speculation's counts since a model was opened (or over one generation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Forwards that verified at least one proposal.
    pub verify_steps: u64,
    /// Proposed ids, and those the model confirmed.
    pub proposed: u64,
    pub accepted: u64,
    /// Steps whose proposer failed (they ran without proposals); counted per model.
    pub proposer_errors: u64,
}

impl SpecStats {
    /// Accepted ÷ proposed (0 when nothing was proposed).
    pub fn accept_rate(&self) -> f64 {
        if self.proposed == 0 {
            0.0
        } else {
            self.accepted as f64 / self.proposed as f64
        }
    }

    pub fn add(&mut self, other: &SpecStats) {
        self.verify_steps += other.verify_steps;
        self.proposed += other.proposed;
        self.accepted += other.accepted;
        self.proposer_errors += other.proposer_errors;
    }
}

/// How many ids one sequence asks to verify, from its running acceptance rate.
///
/// With per-id acceptance `a`, a step that proposes k ids emits `(1 − a^(k+1)) / (1 − a)` ids
/// on average and costs `cost(k)` plain steps (the driver's measure: the verified rows and the
/// proposer's own work). It asks for the k in `1..=max` that emits most per cost; when no k beats a
/// plain step, it proposes nothing for `backoff` steps (doubling up to [`MAX_BACKOFF`] while
/// speculation keeps failing) and then probes with a single proposed id: speculation resumes
/// if it lands, else pauses again.
#[derive(Debug, Clone)]
pub struct Adaptive {
    max: usize,
    /// Running acceptance rate per proposed id.
    rate: f32,
    /// Steps left without proposing.
    skip: u32,
    backoff: u32,
    /// After a pause: the next step proposes one id, and its fate decides whether
    /// speculation resumes or pauses again for longer.
    probing: bool,
    pub stats: SpecStats,
}

/// The acceptance rate a sequence starts from.
const PRIOR_RATE: f32 = 0.6;
/// How much of the running rate each verification replaces.
const RATE_WEIGHT: f32 = 0.5;
/// The longest pause, in steps, between probes of a sequence where speculation fails.
pub const MAX_BACKOFF: u32 = 64;

impl Adaptive {
    /// Up to `max` proposed ids per step (0: never speculates).
    pub fn new(max: usize) -> Adaptive {
        Adaptive {
            max,
            rate: PRIOR_RATE,
            skip: 0,
            backoff: 1,
            probing: false,
            stats: SpecStats::default(),
        }
    }

    /// Ids to ask the proposer for this step, given `cost(k)`: what a step verifying k
    /// proposals costs (proposing them included), in plain decode steps.
    pub fn tokens(&mut self, cost: impl Fn(usize) -> f32) -> usize {
        if self.max == 0 {
            return 0;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return 0;
        }
        if self.probing {
            return 1;
        }
        let a = self.rate.clamp(0.0, 0.999);
        let (mut best, mut best_gain) = (0, 1.0f32);
        let mut emitted = 1.0f32;
        let mut ak = 1.0f32;
        for k in 1..=self.max {
            ak *= a;
            emitted += ak;
            let gain = emitted / cost(k);
            if gain > best_gain {
                (best, best_gain) = (k, gain);
            }
        }
        if best == 0 {
            self.pause();
        }
        best
    }

    fn pause(&mut self) {
        self.skip = self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        self.probing = true;
    }

    /// Records a verification of `proposed` ids of which the first `accepted` were kept.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        if proposed == 0 {
            return;
        }
        self.stats.verify_steps += 1;
        self.stats.proposed += proposed as u64;
        self.stats.accepted += accepted as u64;
        if self.probing {
            self.probing = false;
            if accepted == 0 {
                return self.pause();
            }
            self.rate = self.rate.max(PRIOR_RATE);
        }
        let rate = accepted as f32 / proposed as f32;
        self.rate = (1.0 - RATE_WEIGHT) * self.rate + RATE_WEIGHT * rate;
        if accepted > 0 {
            self.backoff = 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_lookup_continues_the_latest_longest_match() {
        let pl = PromptLookup { min_n: 1, max_n: 3 };
        // "1 2 3 4 5 | 9 2 3 7 | 1 2 3": the 3-gram [1 2 3] matched at 0 → 4 5 9.
        let ids = [1, 2, 3, 4, 5, 9, 2, 3, 7, 1, 2, 3];
        assert_eq!(pl.lookup(&ids, 3), [4, 5, 9]);
        // Only a 2-gram [2 3] matches: the latest one (at 6) → 7 1 2 3.
        let ids = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 2, 3];
        assert_eq!(pl.lookup(&ids, 4), [7, 8, 2, 3]);
        // The continuation stops at the end of the ids.
        assert_eq!(pl.lookup(&[5, 6, 5], 4), [6, 5]);
        assert!(pl.lookup(&[1, 2, 3], 4).is_empty());
        assert!(pl.lookup(&[], 4).is_empty());
        let strict = PromptLookup { min_n: 2, max_n: 2 };
        assert!(strict.lookup(&[1, 2, 3, 9, 3], 4).is_empty());
    }

    #[test]
    fn adaptive_asks_for_more_when_proposals_land_and_pauses_when_they_do_not() {
        let mut a = Adaptive::new(6);
        let mut landed = 0;
        let cheap = |k: usize| 1.0 + 0.05 * k as f32;
        for _ in 0..8 {
            let k = a.tokens(cheap);
            a.record(k, k);
            landed += k as u64;
        }
        assert_eq!(a.tokens(cheap), 6);
        // Every proposal rejected: it pauses, and the pauses grow.
        let mut pauses = Vec::new();
        for _ in 0..200 {
            let k = a.tokens(cheap);
            if k == 0 {
                *pauses.last_mut().unwrap_or(&mut 0) += 1;
            } else {
                pauses.push(0);
                a.record(k, 0);
            }
        }
        let proposing = pauses.len();
        assert!(proposing < 16, "proposed on {proposing} of 200 steps");
        assert!(pauses.iter().rev().nth(1).is_some_and(|&p| p >= 16));
        assert_eq!(a.stats.accepted, landed);
        assert_eq!(a.stats.verify_steps, 8 + proposing as u64);
        // Expensive rows: even a 90% rate pays only with few ids.
        let mut a = Adaptive::new(8);
        a.rate = 0.9;
        assert!((1..=3).contains(&a.tokens(|k| 1.0 + 0.5 * k as f32)));
        // A fixed cost of going past one row: a 40% rate does not pay, a 70% one does.
        let fixed = |k: usize| 1.45 + 0.11 * k as f32;
        a.rate = 0.4;
        assert_eq!(a.tokens(fixed), 0);
        let mut a = Adaptive::new(8);
        a.rate = 0.7;
        assert!(a.tokens(fixed) >= 3);
        assert_eq!(Adaptive::new(0).tokens(|_| 1.0), 0);
    }
}
