//! Greedy decoding over a [`LanguageModel`]: prefill the prompt, then one token at a time
//! until an end-of-sequence token, the token budget or the context runs out.

use oxgen_runtime::{Batch, LanguageModel, LogitsWanted, SeqStep, StepLogits};

use crate::GenerateError;

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    /// Token ids that end generation.
    pub eos: Vec<u32>,
    /// Mask the EOS logits so generation always runs to `max_new_tokens`.
    pub ignore_eos: bool,
    /// Positions the sequence's KV is sized for (prompt + generated).
    pub context: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    Eos,
    MaxTokens,
    Context,
    /// The token callback asked to stop.
    Callback,
}

/// The result of a generation.
#[derive(Debug, Clone)]
pub struct Generated {
    pub tokens: Vec<u32>,
    pub stop: StopReason,
    pub prompt_tokens: usize,
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

/// Generates greedily after `prompt`. `on_token` sees each new id and returns `false` to
/// stop. The sequence is removed from the model afterwards, also on error.
pub fn generate_greedy(
    lm: &mut dyn LanguageModel,
    prompt: &[u32],
    options: &GenerateOptions,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<Generated, GenerateError> {
    if prompt.is_empty() {
        return Err(GenerateError::Prompt("the prompt has no tokens".into()));
    }
    if prompt.len() >= options.context {
        return Err(GenerateError::Prompt(format!(
            "the prompt has {} tokens but the context holds {}; shorten it or raise the context",
            prompt.len(),
            options.context
        )));
    }
    let seq = lm.add_sequence(options.context)?;
    let result = decode_loop(lm, seq, prompt, options, &mut on_token);
    lm.remove_sequence(seq);
    result
}

fn decode_loop(
    lm: &mut dyn LanguageModel,
    seq: oxgen_runtime::SeqId,
    prompt: &[u32],
    options: &GenerateOptions,
    on_token: &mut impl FnMut(u32) -> bool,
) -> Result<Generated, GenerateError> {
    let mut logits = StepLogits::default();
    let mut tokens = Vec::with_capacity(options.max_new_tokens);
    let mut span: Vec<u32> = prompt.to_vec();
    let mut pos = 0;
    let stop = loop {
        if tokens.len() >= options.max_new_tokens {
            break StopReason::MaxTokens;
        }
        if pos + span.len() > options.context {
            break StopReason::Context;
        }
        let step = [SeqStep {
            seq,
            tokens: &span,
            pos,
            logits: LogitsWanted::Last,
        }];
        lm.step(&Batch { steps: &step }, &mut logits)?;
        pos += span.len();
        let row = logits.row(0, 0);
        let masked: &[u32] = if options.ignore_eos {
            &options.eos
        } else {
            &[]
        };
        let next = argmax_excluding(row, masked) as u32;
        tokens.push(next);
        if !options.ignore_eos && options.eos.contains(&next) {
            break StopReason::Eos;
        }
        if !on_token(next) {
            break StopReason::Callback;
        }
        span.clear();
        span.push(next);
    };
    Ok(Generated {
        tokens,
        stop,
        prompt_tokens: prompt.len(),
    })
}
