//! Generations stepped side by side by a caller that owns the loop (a server's running set):
//! [`Model::start`] → [`Model::advance_batch`] (every running sequence in one forward where
//! the backend fuses batches) until finished → [`Model::end`].
//!
//! With speculative decoding a sequence's step feeds its last id and the proposed ones, and
//! yields every id the model confirms plus the one it chose after them (see
//! `oxgen_generate`'s `speculate` module for why the output is unchanged).

use oxgen_generate::{Adaptive, Decoding, FinishReason, PromptLookup, SpecStats};
use oxgen_runtime::{Batch, Capabilities, LogitsWanted, SeqId, SeqStep};

use crate::speculative::{DEFAULT_SPEC_TOKENS, SPEC_MAX_BATCH, prior_cost};
use crate::{Error, GenerateOptions, Model};

/// One generation in a running set. Its KV lives in the model until [`Model::end`].
pub struct Sequence {
    pub(crate) seq: SeqId,
    pub(crate) decoding: Decoding,
    top_logprobs: Option<usize>,
    /// Alternatives per prompt token when the prompt's log-probabilities are wanted.
    prompt_top: Option<usize>,
    /// The prompt's log-probabilities computed so far and not yet taken.
    prompt_logprobs: Vec<Logprobs>,
    cached: usize,
    /// Positions its KV holds.
    pub(crate) positions: usize,
    /// How many ids it proposes per step.
    pub(crate) adaptive: Adaptive,
    /// This step's span when it verifies proposals: its last id, then the proposed ones.
    pub(crate) verify: Vec<u32>,
    /// The output predicted for it ([`GenerateOptions::prediction`]), which proposes its ids.
    pub(crate) prediction: Option<Prediction>,
    /// The LoRA adapter it runs under.
    pub(crate) adapter: Option<oxgen_runtime::AdapterId>,
}

/// A predicted output as a proposer: while the generated ids follow the prediction from its
/// start, the prediction's next ids; once they part, the continuation of the latest earlier
/// match of the last ids in the prediction and the output (as prompt lookup does).
pub(crate) struct Prediction {
    /// The predicted ids, then the ids generated so far (room for all reserved up front).
    ids: Vec<u32>,
    predicted: usize,
    /// Generated ids that equal the prediction's first ones, while all have.
    aligned: Option<usize>,
}

impl Prediction {
    fn new(predicted: &[u32], max_new_tokens: usize) -> Prediction {
        let mut ids = Vec::with_capacity(predicted.len() + max_new_tokens);
        ids.extend_from_slice(predicted);
        Prediction {
            ids,
            predicted: predicted.len(),
            aligned: Some(0),
        }
    }

    /// Up to `max` ids to propose after `generated`.
    fn propose(&mut self, generated: &[u32], max: usize) -> &[u32] {
        for &id in &generated[self.ids.len() - self.predicted..] {
            self.aligned = self
                .aligned
                .filter(|&a| self.ids.get(a) == Some(&id) && a < self.predicted)
                .map(|a| a + 1);
            self.ids.push(id);
        }
        match self.aligned {
            Some(a) => &self.ids[a..self.predicted.min(a + max)],
            None => PromptLookup::default().lookup(&self.ids, max),
        }
    }
}

impl Sequence {
    pub(crate) fn new(
        seq: SeqId,
        decoding: Decoding,
        cached: usize,
        positions: usize,
        spec_tokens: usize,
        top_logprobs: Option<usize>,
    ) -> Sequence {
        Sequence {
            seq,
            decoding,
            top_logprobs,
            prompt_top: None,
            prompt_logprobs: Vec::new(),
            cached,
            positions,
            adaptive: Adaptive::new(spec_tokens),
            verify: Vec::with_capacity(spec_tokens + 1),
            prediction: None,
            adapter: None,
        }
    }

    /// What speculative decoding did for this sequence (with a prediction: the predicted ids
    /// it verified, `proposed`, and kept, `accepted`).
    pub fn speculation(&self) -> SpecStats {
        self.adaptive.stats
    }

    /// Prompt ids whose KV came from the prefix cache (not prefilled).
    pub fn cached(&self) -> usize {
        self.cached
    }

    /// The log-probabilities of the prompt's ids computed since the last call, in order,
    /// from its second id on (the first has none), when the sequence was started with
    /// [`Model::start_scoring_prompt`]. The last comes with the step whose logits also choose
    /// the first generated id.
    pub fn take_prompt_logprobs(&mut self) -> Vec<Logprobs> {
        std::mem::take(&mut self.prompt_logprobs)
    }

    /// Ids the next step feeds unless a prompt chunk limit cuts it.
    pub fn pending(&self) -> usize {
        self.decoding.span().1.len()
    }
}

/// One generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub id: u32,
    /// Text completed by this token (empty while a character or a possible stop string is
    /// held back).
    pub text: String,
    /// Set on the sequence's last token.
    pub finish: Option<FinishReason>,
    /// Asked for at [`Model::start`].
    pub logprobs: Option<Logprobs>,
}

/// Log-probabilities from the model's raw logits (before any sampling processor).
#[derive(Debug, Clone, PartialEq)]
pub struct Logprobs {
    /// The chosen id's.
    pub logprob: f32,
    /// The most likely ids with theirs, most likely first.
    pub top: Vec<(u32, f32)>,
}

impl Logprobs {
    /// The log-softmax of `row` at `id`, and its `top` largest entries (ties: lower id first).
    pub fn from_logits(row: &[f32], id: u32, top: usize) -> Logprobs {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = row.iter().map(|&x| f64::from(x - max).exp()).sum();
        let log_z = f64::from(max) + sum.ln();
        let lp = |x: f32| (f64::from(x) - log_z) as f32;
        let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
        for (i, &x) in row.iter().enumerate().filter(|_| top > 0) {
            if best.len() == top && best.last().is_some_and(|&(_, b)| x <= b) {
                continue;
            }
            let at = best.partition_point(|&(_, b)| b >= x);
            best.insert(at, (i as u32, x));
            best.truncate(top);
        }
        Logprobs {
            logprob: row.get(id as usize).map_or(f32::NEG_INFINITY, |&x| lp(x)),
            top: best.into_iter().map(|(i, x)| (i, lp(x))).collect(),
        }
    }
}

/// Whether sequences that verify proposals may share this step: alone always; batched only
/// up to [`SPEC_MAX_BATCH`], and where a multi-token span with past may share a forward.
pub(crate) fn verifies_in_batch(batch: usize, capabilities: Capabilities) -> bool {
    batch == 1
        || (batch <= SPEC_MAX_BATCH
            && (capabilities.fused_prefill_with_past || !capabilities.fused_decode))
}

/// Fills the span to verify of each decode-phase sequence with a prediction, from it.
fn propose_predictions(seqs: &mut [&mut Sequence], capabilities: Capabilities) {
    let batch_ok = verifies_in_batch(seqs.len(), capabilities);
    for s in seqs.iter_mut() {
        let Sequence {
            decoding,
            adaptive,
            verify,
            prediction: Some(prediction),
            ..
        } = &mut **s
        else {
            continue;
        };
        verify.clear();
        if !batch_ok || decoding.span().1.len() != 1 || decoding.finish_reason().is_some() {
            continue;
        }
        let k = adaptive
            .tokens(prior_cost)
            .min(decoding.room().saturating_sub(1));
        let proposed = prediction.propose(decoding.generated(), k);
        if k > 0 && !proposed.is_empty() {
            verify.extend_from_slice(decoding.span().1);
            verify.extend_from_slice(proposed);
        }
    }
}

impl Model {
    /// Starts a generation of `ids` whose KV holds the prompt and `options.max_new_tokens`
    /// (at most the model's [`ContextLimit`](crate::ContextLimit)). `top_logprobs`: report
    /// each token's log-probability and that many alternatives.
    pub fn start(
        &mut self,
        ids: &[u32],
        options: &GenerateOptions,
        top_logprobs: Option<usize>,
    ) -> Result<Sequence, Error> {
        self.start_with(ids, options, top_logprobs, None)
    }

    /// [`Model::start`], also computing the log-probability of every prompt id after the
    /// first with `prompt_top` alternatives each ([`Sequence::take_prompt_logprobs`]): the
    /// whole prompt is fed (no prefix is reused, since a reused prefix has no logits), and
    /// each prompt chunk's rows are kept. They equal the log-softmax of
    /// [`Model::logits`]'s rows, as a generated token's do.
    pub fn start_scoring_prompt(
        &mut self,
        ids: &[u32],
        options: &GenerateOptions,
        top_logprobs: Option<usize>,
        prompt_top: usize,
    ) -> Result<Sequence, Error> {
        self.start_with(ids, options, top_logprobs, Some(prompt_top))
    }

    fn start_with(
        &mut self,
        ids: &[u32],
        options: &GenerateOptions,
        top_logprobs: Option<usize>,
        prompt_top: Option<usize>,
    ) -> Result<Sequence, Error> {
        let positions = self
            .limit
            .size(ids.len(), options.max_new_tokens)?
            .positions;
        // Checked before any KV is reserved.
        Decoding::new(ids, 0, positions, self.decode_options(options))?;
        let adapter = self.adapters.id(options.adapter.as_deref())?;
        // A scored prompt computes every position's logits: nothing comes from the cache.
        let cacheable = if prompt_top.is_some() { &[][..] } else { ids };
        let (seq, cached) = self.lm.start_sequence(positions, cacheable, adapter)?;
        if options.keep_prefix {
            self.lm.keep_prefix(seq);
        }
        let decoding = match Decoding::new(ids, cached, positions, self.decode_options(options)) {
            Ok(d) => d,
            Err(e) => {
                self.lm_remove(seq);
                return Err(e.into());
            }
        };
        let mut spec_tokens = self.spec_tokens(options);
        if !options.prediction.is_empty() {
            spec_tokens = options.spec_tokens.unwrap_or(DEFAULT_SPEC_TOKENS);
        }
        let mut s = Sequence::new(seq, decoding, cached, positions, spec_tokens, top_logprobs);
        s.adapter = adapter;
        s.prompt_top = prompt_top;
        if !options.prediction.is_empty() {
            s.prediction = Some(Prediction::new(&options.prediction, options.max_new_tokens));
        }
        Ok(s)
    }

    /// The most ids a generation with `options` proposes per step (0 without speculation).
    pub(crate) fn spec_tokens(&self, options: &GenerateOptions) -> usize {
        self.spec.as_ref().map_or(0, |spec| {
            options
                .spec_tokens
                .map_or(spec.tokens, |t| t.min(spec.tokens))
        })
    }

    /// Generates the sequence's next tokens, prefilling the prompt on the first call: one,
    /// or with speculative decoding every id the step confirmed.
    pub fn advance(&mut self, s: &mut Sequence) -> Result<Vec<Step>, Error> {
        let mut steps = self.step_fused(&mut [s], usize::MAX)?;
        Ok(steps.pop().unwrap_or_default())
    }

    /// Runs one step over `seqs` (one forward when the backend fuses batches): each feeds
    /// its pending ids, a prompt at most `prompt_chunk` ids at a time, and gets its next
    /// tokens once its whole prompt is in (none after a partial prompt chunk; several when
    /// speculative decoding confirmed proposals). If the fused step fails, each sequence is
    /// stepped alone so one bad sequence fails only itself.
    pub fn advance_batch(
        &mut self,
        seqs: &mut [&mut Sequence],
        prompt_chunk: usize,
    ) -> Vec<Result<Vec<Step>, Error>> {
        match self.step_fused(seqs, prompt_chunk) {
            Ok(steps) => steps.into_iter().map(Ok).collect(),
            Err(e) if seqs.len() == 1 => vec![Err(e)],
            Err(_) => seqs
                .iter_mut()
                .map(|s| {
                    let mut one = self.step_fused(&mut [&mut **s], prompt_chunk)?;
                    Ok(one.pop().unwrap_or_default())
                })
                .collect(),
        }
    }

    pub(crate) fn step_fused(
        &mut self,
        seqs: &mut [&mut Sequence],
        prompt_chunk: usize,
    ) -> Result<Vec<Vec<Step>>, Error> {
        if let Some(spec) = &mut self.spec {
            spec.propose(seqs, self.lm.capabilities());
        }
        propose_predictions(seqs, self.lm.capabilities());
        let chunk = prompt_chunk.max(1);
        let steps: Vec<SeqStep> = seqs
            .iter()
            .map(|s| {
                let (pos, span) = s.decoding.span();
                if s.verify.len() > 1 {
                    return SeqStep {
                        seq: s.seq,
                        tokens: &s.verify,
                        pos,
                        logits: LogitsWanted::All,
                        proposed: s.verify.len() - 1,
                    };
                }
                let n = span.len().min(chunk);
                let scored = s.prompt_top.is_some() && pos < s.decoding.prompt_len();
                SeqStep {
                    seq: s.seq,
                    tokens: &span[..n],
                    pos,
                    logits: match (scored, n == span.len()) {
                        (true, _) => LogitsWanted::All,
                        (false, true) => LogitsWanted::Last,
                        (false, false) => LogitsWanted::None,
                    },
                    proposed: 0,
                }
            })
            .collect();
        // Each step's ids fed, and whether they end its pending span (so its last row
        // chooses the next id).
        let fed: Vec<(usize, bool)> = (steps.iter().zip(seqs.iter()))
            .map(|(st, s)| {
                let whole = st.proposed > 0 || st.tokens.len() == s.decoding.span().1.len();
                (st.tokens.len(), whole)
            })
            .collect();
        let started = std::time::Instant::now();
        let stepped = self.lm.step(&Batch { steps: &steps }, &mut self.scratch);
        if let (Some(spec), [step]) = (&mut self.spec, steps.as_slice())
            && step.tokens.len() == 1 + step.proposed
        {
            spec.timed_step(started.elapsed(), step.proposed);
        }
        drop(steps);
        if let Err(e) = stepped {
            seqs.iter_mut().for_each(|s| s.verify.clear());
            return Err(e.into());
        }
        let mut out = Vec::with_capacity(seqs.len());
        for (i, (s, (n, whole))) in seqs.iter_mut().zip(fed).enumerate() {
            if let Some(top) = s.prompt_top {
                self.score_prompt(i, s, n, top);
            }
            if !whole {
                s.decoding.feed_prompt(n)?;
                out.push(Vec::new());
                continue;
            }
            out.push(self.verify(i, s)?);
        }
        Ok(out)
    }

    /// The log-probabilities of the prompt ids that the `n` rows step `i` of the last
    /// forward gave `s` predict (a row predicts the id after the one it was fed for).
    fn score_prompt(&self, i: usize, s: &mut Sequence, n: usize, top: usize) {
        let (pos, _) = s.decoding.span();
        let prompt = &s.decoding.ids()[..s.decoding.prompt_len()];
        for r in 0..n {
            if let Some(&next) = prompt.get(pos + r + 1) {
                let row = self.scratch.row(i, r);
                s.prompt_logprobs
                    .push(Logprobs::from_logits(row, next, top));
            }
        }
        if pos + n >= prompt.len() {
            s.prompt_top = None;
        }
    }

    /// The ids the rows of step `i` of the last forward give `s`: the first row's choice
    /// (after a prompt's rows, its last one), and while each choice equals the next
    /// proposal, the next row's.
    fn verify(&mut self, i: usize, s: &mut Sequence) -> Result<Vec<Step>, Error> {
        let proposed = s.verify.len().saturating_sub(1);
        let mut steps = Vec::with_capacity(proposed + 1);
        let mut accepted = 0;
        let first = self.scratch.rows[i].len() - (proposed + 1);
        for r in 0..=proposed {
            let row = self.scratch.row(i, first + r);
            let emitted = s.decoding.on_logits(row, self.encoder.tokenizer())?;
            let logprobs = s
                .top_logprobs
                .map(|top| Logprobs::from_logits(row, emitted.id, top));
            steps.push(Step {
                id: emitted.id,
                text: s.decoding.take_text(),
                finish: emitted.finish,
                logprobs,
            });
            if r == proposed || emitted.id != s.verify[r + 1] {
                break;
            }
            accepted += 1;
            if emitted.finish.is_some() {
                break;
            }
        }
        match &mut self.spec {
            Some(spec) if s.prediction.is_none() => {
                spec.record(&mut s.adaptive, proposed, accepted)
            }
            _ => s.adaptive.record(proposed, accepted),
        }
        s.verify.clear();
        Ok(steps)
    }

    /// Frees the sequence's KV.
    pub fn end(&mut self, s: Sequence) {
        self.lm_remove(s.seq);
    }

    /// Sequences whose KV the model holds (started and not ended, plus the one kept for
    /// prefix reuse by [`Model::stream`]).
    pub fn live_sequences(&self) -> usize {
        self.lm.sequence_count()
    }
}

#[cfg(test)]
mod tests {
    use super::Logprobs;

    #[test]
    fn logprobs_are_the_log_softmax_of_the_raw_row() {
        let row = [1.0f32, 3.0, 2.0, 3.0];
        let z: f64 = row.iter().map(|&x| f64::from(x).exp()).sum();
        let want = |x: f32| (f64::from(x) - z.ln()) as f32;
        let got = Logprobs::from_logits(&row, 2, 3);
        assert!((got.logprob - want(2.0)).abs() < 1e-6);
        // Ties keep the lower id first.
        let ids: Vec<u32> = got.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 3, 2]);
        assert!((got.top[0].1 - want(3.0)).abs() < 1e-6);
        let total: f64 = row.iter().map(|&x| f64::from(want(x)).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!(Logprobs::from_logits(&row, 0, 0).top.is_empty());
    }
}
