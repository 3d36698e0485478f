//! Generations stepped side by side by a caller that owns the loop (a server's running set):
//! [`Model::start`] → [`Model::advance_batch`] (every running sequence in one forward where
//! the backend fuses batches) until finished → [`Model::end`].
//!
//! With speculative decoding a sequence's step feeds its last id and the proposed ones, and
//! yields every id the model confirms plus the one it chose after them (see
//! `oxgen_generate`'s `speculate` module for why the output is unchanged).

use oxgen_generate::{Adaptive, Decoding, FinishReason, SpecStats};
use oxgen_runtime::{Batch, LogitsWanted, SeqId, SeqStep};

use crate::{Error, GenerateOptions, Model};

/// One generation in a running set. Its KV lives in the model until [`Model::end`].
pub struct Sequence {
    pub(crate) seq: SeqId,
    pub(crate) decoding: Decoding,
    top_logprobs: Option<usize>,
    cached: usize,
    /// Positions its KV holds.
    pub(crate) positions: usize,
    /// How many ids it proposes per step.
    pub(crate) adaptive: Adaptive,
    /// This step's span when it verifies proposals: its last id, then the proposed ones.
    pub(crate) verify: Vec<u32>,
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
            cached,
            positions,
            adaptive: Adaptive::new(spec_tokens),
            verify: Vec::with_capacity(spec_tokens + 1),
        }
    }

    /// What speculative decoding did for this sequence.
    pub fn speculation(&self) -> SpecStats {
        self.adaptive.stats
    }

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
                self.lm_remove(seq);
                return Err(e.into());
            }
        };
        let spec_tokens = self.spec_tokens(options);
        Ok(Sequence::new(
            seq,
            decoding,
            cached,
            positions,
            spec_tokens,
            top_logprobs,
        ))
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
                SeqStep {
                    seq: s.seq,
                    tokens: &span[..n],
                    pos,
                    logits: if n == span.len() {
                        LogitsWanted::Last
                    } else {
                        LogitsWanted::None
                    },
                    proposed: 0,
                }
            })
            .collect();
        let fed: Vec<(usize, bool)> = steps
            .iter()
            .map(|s| (s.tokens.len(), s.logits != LogitsWanted::None))
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
            if !whole {
                s.decoding.feed_prompt(n)?;
                out.push(Vec::new());
                continue;
            }
            out.push(self.verify(i, s)?);
        }
        Ok(out)
    }

    /// The ids step row `i` of the last forward gives `s`: the first row's choice, and while
    /// each choice equals the next proposal, the next row's.
    fn verify(&mut self, i: usize, s: &mut Sequence) -> Result<Vec<Step>, Error> {
        let proposed = s.verify.len().saturating_sub(1);
        let mut steps = Vec::with_capacity(proposed + 1);
        let mut accepted = 0;
        for r in 0..=proposed {
            let row = self.scratch.row(i, r);
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
        if let Some(spec) = &mut self.spec {
            spec.record(&mut s.adaptive, proposed, accepted);
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
