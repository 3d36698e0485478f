//! Teacher forcing: a text fed to the model piece by piece, with the logits of every position
//! handed back as each piece is stepped. What measuring a model takes (perplexity, or how
//! far one configuration's logits drift from another's over a long text) without holding
//! every row of a long text at once.

use oxgen_runtime::{Batch, LogitsWanted, SeqId, SeqStep, StepLogits};

use crate::{Error, GenerateError, Model};

/// A sequence of its own that a text is fed to ([`Model::scorer`]); its KV is freed when
/// the scorer is dropped.
pub struct Scorer<'m> {
    model: &'m mut Model,
    seq: SeqId,
    /// Positions fed so far, and the most the sequence holds.
    pos: usize,
    positions: usize,
    out: StepLogits,
}

impl Model {
    /// A scorer for up to `positions` ids (at most the context length). The KV kept from the
    /// last generation is let go first.
    pub fn scorer(&mut self, positions: usize) -> Result<Scorer<'_>, Error> {
        let positions = self.limit.size(positions, 0)?.positions;
        self.drop_cache();
        let seq = self.lm.add_sequence(positions)?;
        Ok(Scorer {
            model: self,
            seq,
            pos: 0,
            positions,
            out: StepLogits::default(),
        })
    }

    /// The model's raw logits at every position of `ids`, and the width of a row: row-major,
    /// `ids.len()` rows. They come from a sequence of their own (the KV kept from the last
    /// generation is let go first).
    pub fn logits(&mut self, ids: &[u32]) -> Result<(Vec<f32>, usize), Error> {
        let mut scorer = self.scorer(ids.len())?;
        scorer.feed(ids)?;
        let vocab = scorer.vocab();
        let rows = (0..ids.len())
            .flat_map(|i| scorer.row(i))
            .copied()
            .collect();
        Ok((rows, vocab))
    }
}

impl Scorer<'_> {
    /// Feeds `ids` after those fed before, in one step; their logits rows are then
    /// [`Scorer::row`] `0..ids.len()`.
    pub fn feed(&mut self, ids: &[u32]) -> Result<(), Error> {
        if ids.is_empty() {
            return Err(GenerateError::Prompt("no token ids to score".into()).into());
        }
        if self.pos + ids.len() > self.positions {
            return Err(GenerateError::Prompt(format!(
                "{} ids after {} do not fit in the scorer's {} positions",
                ids.len(),
                self.pos,
                self.positions
            ))
            .into());
        }
        let step = [SeqStep {
            seq: self.seq,
            tokens: ids,
            pos: self.pos,
            logits: LogitsWanted::All,
            proposed: 0,
        }];
        self.model.lm.step(&Batch { steps: &step }, &mut self.out)?;
        self.pos += ids.len();
        Ok(())
    }

    /// Row `i` of the last [`Scorer::feed`]: the logits after its `i`-th id.
    pub fn row(&self, i: usize) -> &[f32] {
        self.out.row(0, i)
    }

    /// The width of a row.
    pub fn vocab(&self) -> usize {
        self.out.vocab
    }
}

impl Drop for Scorer<'_> {
    fn drop(&mut self) {
        self.model.lm.remove_sequence(self.seq);
    }
}
