//! Generations stepped side by side, one token at a time, by a caller that owns the loop (a
//! server's running set): [`Model::start`] → [`Model::advance`] until finished →
//! [`Model::end`].

use oxgen_generate::{Decoding, FinishReason, step_sequence};
use oxgen_runtime::{LanguageModel, SeqId};

use crate::{Error, GenerateOptions, Model};

/// One generation in a running set. Its KV lives in the model until [`Model::end`].
pub struct Sequence {
    seq: SeqId,
    decoding: Decoding,
    top_logprobs: Option<usize>,
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

impl Model {
    /// Starts a generation of `ids` whose KV holds up to `capacity` positions (at most the
    /// model's context). `top_logprobs`: report each token's log-probability and that many
    /// alternatives.
    pub fn start(
        &mut self,
        ids: &[u32],
        options: &GenerateOptions,
        capacity: usize,
        top_logprobs: Option<usize>,
    ) -> Result<Sequence, Error> {
        let capacity = capacity.min(self.config.context_length);
        let decoding = Decoding::new(ids, 0, capacity, self.decode_options(options))?;
        let seq = self.lm.add_sequence(capacity)?;
        Ok(Sequence {
            seq,
            decoding,
            top_logprobs,
        })
    }

    /// Generates the sequence's next token: prefills the prompt on the first call.
    pub fn advance(&mut self, s: &mut Sequence) -> Result<Step, Error> {
        let row = step_sequence(&mut self.lm, s.seq, &s.decoding, &mut self.scratch)?;
        let emitted = s.decoding.on_logits(row, self.encoder.tokenizer())?;
        let logprobs = s
            .top_logprobs
            .map(|top| Logprobs::from_logits(self.scratch.row(0, 0), emitted.id, top));
        Ok(Step {
            id: emitted.id,
            text: s.decoding.take_text(),
            finish: emitted.finish,
            logprobs,
        })
    }

    /// Frees the sequence's KV.
    pub fn end(&mut self, s: Sequence) {
        self.lm.remove_sequence(s.seq);
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
