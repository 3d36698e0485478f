//! One sequence's decoding, as a state machine any driver can step: feed [`Decoding::span`]
//! to the model, hand the last logits row to [`Decoding::on_logits`], emit what it returns,
//! repeat until it reports a [`FinishReason`].
//!
//! The state machine owns what belongs to the sequence (its sampler chain and RNG, the
//! incremental detokenizer, the stop-string matcher, the ids) and nothing of the backend, so
//! one driver can run it alone (with [`step_sequence`]) and a scheduler can run many in one batch.

use oxgen_runtime::{Batch, LanguageModel, LogitsWanted, SeqId, SeqStep, StepLogits};

use crate::budget::Budget;
use crate::{
    Detokenizer, GenerateError, Grammar, ProcessorState, ReasoningBudget, Sampler, SamplingParams,
    StopCheck, StopStrings, Tokenizer,
};

/// What to generate after a prompt.
#[derive(Debug, Clone)]
pub struct DecodeOptions {
    pub max_new_tokens: usize,
    /// Token ids that end generation (the package's EOS ids).
    pub eos: Vec<u32>,
    /// Mask the EOS logits so generation runs to `max_new_tokens`.
    pub ignore_eos: bool,
    /// Strings that end generation; they are not emitted unless `include_stop`.
    pub stop: Vec<String>,
    /// Ids that end generation besides `eos` (emitted, like an EOS id, as no text).
    pub stop_ids: Vec<u32>,
    /// Ids generated before `eos` and `stop_ids` may end generation (their logits are
    /// masked until then).
    pub min_new_tokens: usize,
    /// Emit the stop string that ended generation.
    pub include_stop: bool,
    pub sampling: SamplingParams,
    /// A grammar the text must follow (the first processor of the chain).
    pub constraint: Option<Grammar>,
    /// Keep special tokens in the text (a tool format whose markers are special tokens).
    pub keep_special: bool,
    /// Close the reply's reasoning block once it has spent this budget.
    pub reasoning_budget: Option<ReasoningBudget>,
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token was generated.
    Eos,
    /// Stop string number `.0` of [`DecodeOptions::stop`] appeared in the text.
    StopString(usize),
    /// `max_new_tokens` were generated.
    Length,
    /// The sequence filled its context.
    Context,
    /// The constraint's grammar is complete: nothing may follow.
    Grammar,
    /// The caller cancelled.
    Cancelled,
}

impl FinishReason {
    /// The OpenAI spelling: `stop`, `length` or `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eos | FinishReason::StopString(_) | FinishReason::Grammar => "stop",
            FinishReason::Length | FinishReason::Context => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// What one logits row produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Emitted {
    /// The chosen id.
    pub id: u32,
    /// Set when the sequence is finished after this id.
    pub finish: Option<FinishReason>,
}

/// The decoding state of one sequence.
pub struct Decoding {
    options: DecodeOptions,
    ctx_size: usize,
    sampler: Sampler,
    detok: Detokenizer,
    stops: StopStrings,
    /// Prompt then generated ids: everything the KV will hold.
    ids: Vec<u32>,
    prompt_len: usize,
    /// Ids before this index are in the KV cache.
    fed: usize,
    finish: Option<FinishReason>,
    /// Text released to the caller but not yet taken.
    text: String,
    /// The ids masked while fewer than `min_new_tokens` were generated: `eos` and `stop_ids`.
    enders: Vec<u32>,
    budget: Option<Budget>,
}

impl Decoding {
    /// Starts decoding after `prompt`, whose first `cached` ids are already in the sequence's
    /// KV (reused from an earlier turn). At least the last prompt id is always fed, since its
    /// logits choose the first new id. `ctx_size` is the positions the sequence's KV holds.
    pub fn new(
        prompt: &[u32],
        cached: usize,
        ctx_size: usize,
        options: DecodeOptions,
    ) -> Result<Decoding, GenerateError> {
        if prompt.is_empty() {
            return Err(GenerateError::Prompt("the prompt has no tokens".into()));
        }
        if prompt.len() >= ctx_size {
            // Requests are sized before they get here (`ContextLimit::size` in the facade,
            // which says how to fit); this is the contract between the two.
            return Err(GenerateError::Prompt(format!(
                "the prompt has {} tokens and the sequence holds {ctx_size} positions: no \
                 room to generate",
                prompt.len()
            )));
        }
        let mut sampler = Sampler::new(options.sampling.clone())?;
        if let Some(grammar) = &options.constraint {
            sampler.push_front(Box::new(grammar.mask()));
        }
        sampler.reset(prompt);
        let mut ids = Vec::with_capacity((prompt.len() + options.max_new_tokens).min(ctx_size));
        ids.extend_from_slice(prompt);
        let stops = StopStrings::new(options.stop.clone());
        let detok = Detokenizer::new(!options.keep_special);
        let finish = (options.max_new_tokens == 0).then_some(FinishReason::Length);
        let enders = [&options.eos[..], &options.stop_ids[..]].concat();
        Ok(Decoding {
            enders,
            budget: options.reasoning_budget.clone().map(Budget::new),
            options,
            ctx_size,
            sampler,
            detok,
            stops,
            prompt_len: prompt.len(),
            fed: cached.min(prompt.len() - 1),
            ids,
            finish,
            text: String::new(),
        })
    }

    /// The ids to feed next and the position of the first: the uncached prompt at first, then
    /// the last generated id.
    pub fn span(&self) -> (usize, &[u32]) {
        (self.fed, &self.ids[self.fed..])
    }

    /// Marks the first `n` ids of [`Decoding::span`] as fed without their logits (a prompt
    /// chunk); the span must keep at least one id, whose logits choose the next.
    pub fn feed_prompt(&mut self, n: usize) -> Result<(), GenerateError> {
        if self.fed + n >= self.ids.len() {
            return Err(GenerateError::Prompt(format!(
                "a prompt chunk of {n} ids would feed all {} unfed ids; the last one's logits \
                 are needed",
                self.ids.len() - self.fed
            )));
        }
        self.fed += n;
        Ok(())
    }

    /// How many ids the prompt has.
    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// Every id: the prompt, then the generated ones.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The generated ids.
    pub fn generated(&self) -> &[u32] {
        &self.ids[self.prompt_len..]
    }

    /// How many more ids the sequence may generate (its `max_new_tokens` and its context).
    pub fn room(&self) -> usize {
        let generated = self.ids.len() - self.prompt_len;
        (self.options.max_new_tokens.saturating_sub(generated))
            .min(self.ctx_size.saturating_sub(self.ids.len()))
    }

    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.finish
    }

    /// Chooses the next id from the logits of the last fed id, and advances.
    pub fn on_logits(&mut self, row: &[f32], tok: &Tokenizer) -> Result<Emitted, GenerateError> {
        if let Some(finish) = self.finish {
            return Err(GenerateError::Prompt(format!(
                "the sequence already finished ({finish:?})"
            )));
        }
        self.fed = self.ids.len();
        let generated = self.ids.len() - self.prompt_len;
        let masked: &[u32] = if generated < self.options.min_new_tokens {
            &self.enders
        } else if self.options.ignore_eos {
            &self.options.eos
        } else {
            &[]
        };
        if self.options.constraint.is_some() {
            self.sampler.room(self.room());
        }
        let id = match self.budget.as_ref().and_then(Budget::forced) {
            Some(id) => id,
            None => self.sampler.sample(row, masked),
        };
        self.sampler.accept(id);
        let constraint = self.sampler.state();
        if let ProcessorState::Failed(e) = constraint {
            // Never unconstrained text: the sequence ends here, with the error.
            self.finish = Some(FinishReason::Cancelled);
            return Err(GenerateError::Constraint(format!(
                "the output left the grammar after {} tokens: {e}",
                self.ids.len() - self.prompt_len
            )));
        }
        self.ids.push(id);
        let generated = generated + 1;
        if (!self.options.ignore_eos && self.options.eos.contains(&id))
            || self.options.stop_ids.contains(&id)
        {
            self.finish = Some(FinishReason::Eos);
        } else {
            let piece = self.detok.push(tok, id)?;
            if let Some(b) = &mut self.budget {
                b.on_token(id, &piece);
            }
            self.release(&piece);
            if self.finish.is_none() && constraint == ProcessorState::Complete {
                self.finish = Some(FinishReason::Grammar);
            }
        }
        // A text closed early ends as the limit that closed it.
        if constraint == ProcessorState::Closed
            && matches!(
                self.finish,
                None | Some(FinishReason::Eos | FinishReason::Grammar)
            )
        {
            self.finish = Some(match generated >= self.options.max_new_tokens {
                false if self.ids.len() >= self.ctx_size => FinishReason::Context,
                _ => FinishReason::Length,
            });
        }
        if self.finish.is_none() {
            if generated >= self.options.max_new_tokens {
                self.finish = Some(FinishReason::Length);
            } else if self.ids.len() >= self.ctx_size {
                self.finish = Some(FinishReason::Context);
            }
        }
        if self
            .finish
            .is_some_and(|f| !matches!(f, FinishReason::StopString(_)))
        {
            let rest = self.detok.flush(tok)?;
            self.release(&rest);
            if !matches!(self.finish, Some(FinishReason::StopString(_))) {
                let held = self.stops.finish().to_string();
                self.text.push_str(&held);
            }
        }
        Ok(Emitted {
            id,
            finish: self.finish,
        })
    }

    /// Stops the sequence (the caller cancelled); held-back text is dropped.
    pub fn cancel(&mut self) {
        self.finish.get_or_insert(FinishReason::Cancelled);
    }

    /// Text released since the last call: complete characters, with stop strings and what
    /// may begin one held back.
    pub fn take_text(&mut self) -> String {
        std::mem::take(&mut self.text)
    }

    fn release(&mut self, piece: &str) {
        if piece.is_empty() || matches!(self.finish, Some(FinishReason::StopString(_))) {
            return;
        }
        match self.stops.push(piece) {
            StopCheck::Continue(text) => self.text.push_str(text),
            StopCheck::Stop { text, which } => {
                self.text.push_str(text);
                if self.options.include_stop {
                    self.text.push_str(&self.options.stop[which]);
                }
                self.finish = Some(FinishReason::StopString(which));
            }
        }
    }
}

/// Feeds `decoding`'s span to `seq` and returns the logits row of its last id.
pub fn step_sequence<'l>(
    lm: &mut dyn LanguageModel,
    seq: SeqId,
    decoding: &Decoding,
    logits: &'l mut StepLogits,
) -> Result<&'l [f32], GenerateError> {
    let (pos, tokens) = decoding.span();
    let step = [SeqStep {
        seq,
        tokens,
        pos,
        logits: LogitsWanted::Last,
        proposed: 0,
    }];
    lm.step(&Batch { steps: &step }, logits)?;
    Ok(logits.row(0, 0))
}

/// Index of the largest value not in `excluded`; the first one on ties (what greedy decoding
/// everywhere does). Reads the row in place: nothing is copied per token.
pub fn argmax_excluding(row: &[f32], excluded: &[u32]) -> usize {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in row.iter().enumerate() {
        if excluded.contains(&(i as u32)) {
            continue;
        }
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map_or(0, |(i, _)| i)
}
