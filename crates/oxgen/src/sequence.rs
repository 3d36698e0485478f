//! Generations stepped side by side by a caller that owns the loop (a server's running set):
//! [`Model::start`] → [`Model::advance_batch`] (every running sequence in one forward where
//! the backend fuses batches) until finished → [`Model::end`].

use oxgen_generate::{Decoding, FinishReason};
use oxgen_runtime::{Batch, LogitsWanted, SeqId, SeqStep};

use crate::{Error, GenerateOptions, Model};

/// One generation in a running set. Its KV lives in the model until [`Model::end`].
pub struct Sequence {
    seq: SeqId,
    decoding: Decoding,
    top_logprobs: Option<usize>,
    cached: usize,
}

impl Sequence {
    /// Prompt ids whose KV came from the prefix cache (not prefilled).
    pub fn cached(&self) -> usize {
        self.cached
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
        let positions = self
            .limit
            .size(ids.len(), options.max_new_tokens)?
            .positions;
        // Checked before any KV is reserved.
        Decoding::new(ids, 0, positions, self.decode_options(options))?;
        let (seq, cached) = self.lm.start_sequence(positions, ids)?;
        let decoding = match Decoding::new(ids, cached, positions, self.decode_options(options)) {
            Ok(d) => d,
            Err(e) => {
                self.lm.remove_sequence(seq);
                return Err(e.into());
            }
        };
        Ok(Sequence {
            seq,
            decoding,
            top_logprobs,
            cached,
        })
    }

    /// Generates the sequence's next token: prefills the prompt on the first call.
    pub fn advance(&mut self, s: &mut Sequence) -> Result<Step, Error> {
        let mut steps = self.step_fused(&mut [s], usize::MAX)?;
        Ok(steps.pop().flatten().expect("a whole span yields a token"))
    }

    /// Runs one step over `seqs` (one forward when the backend fuses batches): each feeds
    /// its pending ids, a prompt at most `prompt_chunk` ids at a time, and gets its next
    /// token once its whole prompt is in (`None` after a partial prompt chunk). If the fused
    /// step fails, each sequence is stepped alone so one bad sequence fails only itself.
    pub fn advance_batch(
        &mut self,
        seqs: &mut [&mut Sequence],
        prompt_chunk: usize,
    ) -> Vec<Result<Option<Step>, Error>> {
        match self.step_fused(seqs, prompt_chunk) {
            Ok(steps) => steps.into_iter().map(Ok).collect(),
            Err(e) if seqs.len() == 1 => vec![Err(e)],
            Err(_) => seqs
                .iter_mut()
                .map(|s| {
                    let mut one = self.step_fused(&mut [&mut **s], prompt_chunk)?;
                    Ok(one.pop().flatten())
                })
                .collect(),
        }
    }

    fn step_fused(
        &mut self,
        seqs: &mut [&mut Sequence],
        prompt_chunk: usize,
    ) -> Result<Vec<Option<Step>>, Error> {
        let chunk = prompt_chunk.max(1);
        let steps: Vec<SeqStep> = seqs
            .iter()
            .map(|s| {
                let (pos, span) = s.decoding.span();
                let n = span.len().min(chunk);
                SeqStep {
                    seq: s.seq,
                    tokens: &span[..n],
                    pos,
                    logits: if n == span.len() {
                        LogitsWanted::Last
                    } else {
                        LogitsWanted::None
                    },
                }
            })
            .collect();
        let fed: Vec<(usize, bool)> = steps
            .iter()
            .map(|s| (s.tokens.len(), s.logits == LogitsWanted::Last))
            .collect();
        self.lm.step(&Batch { steps: &steps }, &mut self.scratch)?;
        drop(steps);
        let mut out = Vec::with_capacity(seqs.len());
        for (i, (s, (n, whole))) in seqs.iter_mut().zip(fed).enumerate() {
            if !whole {
                s.decoding.feed_prompt(n)?;
                out.push(None);
                continue;
            }
            let row = self.scratch.row(i, 0);
            let emitted = s.decoding.on_logits(row, self.encoder.tokenizer())?;
            let logprobs = s
                .top_logprobs
                .map(|top| Logprobs::from_logits(row, emitted.id, top));
            out.push(Some(Step {
                id: emitted.id,
                text: s.decoding.take_text(),
                finish: emitted.finish,
                logprobs,
            }));
        }
        Ok(out)
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
