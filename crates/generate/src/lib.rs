//! oxgen-generate: from text to tokens and back, and the decoding loop.
//!
//! - [`Tokenizer`]: a Hugging Face `tokenizer.json` (the `tokenizers` crate, pure Rust), with
//!   a [`Detokenizer`] that streams text without ever splitting a UTF-8 character.
//! - [`ChatTemplate`]: the package's Jinja chat template (minijinja with Python-compatible
//!   methods, `raise_exception` and `strftime_now`).
//! - [`Sampler`]: the logits-processor chain (bias, penalties, temperature, top-k, top-p,
//!   min-p) and seeded selection, matching Hugging Face transformers' processors.
//! - Tools ([`ToolSet`], [`tool_grammar`]) and [`ReplyParser`]: tool definitions rendered
//!   into the prompt, calls enforced by a grammar and parsed back out of the reply, with its
//!   reasoning apart.
//! - [`StopStrings`]: stop strings matched across streamed pieces, held back until decided.
//! - [`Decoding`]: one sequence's decoding state (sampler, detokenizer, stop strings), stepped
//!   through any [`oxgen_runtime::LanguageModel`].
//! - Speculative decoding's [`Proposer`]s ([`PromptLookup`], [`DraftModel`]) and the
//!   per-sequence [`Adaptive`] choice of how many ids to verify.
//!
//! This crate sees logits as `&[f32]` rows; it must never know which backend runs the model
//! or read ONNX files.

mod budget;
mod closing;
mod constraint;
mod decode;
mod processors;
mod reply;
mod sampling;
mod schema;
mod speculate;
mod stop;
mod template;
mod tokenizer;
mod tools;

pub use budget::ReasoningBudget;
pub use constraint::{Constraint, Grammar, GrammarMask, Grammars};
pub use decode::{DecodeOptions, Decoding, Emitted, FinishReason, argmax_excluding, step_sequence};
pub use processors::{
    FrequencyPresence, History, LogitBias, LogitsProcessor, MinP, ProcessorState,
    RepetitionPenalty, Scratch, Temperature, TopK, TopP, apply_frequency_presence,
    apply_logit_bias, apply_min_p, apply_repetition_penalty, apply_temperature, apply_top_k,
    apply_top_p,
};
pub use reply::{Reply, ReplyDelta, ReplyParser, ReplySyntax};
pub use sampling::{Param, Sampler, SamplingParams, SamplingRequest, fresh_seed};
pub use schema::{ENFORCED_FORMATS, close_objects, drop_unknown_formats};
pub use speculate::{
    Adaptive, DraftModel, MAX_BACKOFF, PromptLookup, ProposalRequest, Proposer, SpecStats,
    running_mean,
};
pub use stop::{StopCheck, StopStrings};
pub use template::{ChatMessage, ChatTemplate};
pub use tokenizer::{Detokenizer, Tokenizer, byte_level_char};
pub use tools::{
    Tool, ToolCall, ToolChoice, ToolFormat, ToolSet, after_reasoning, lark_expression, tool_grammar,
};

/// Errors from tokenizing, templating or decoding.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("tokenizer {path}: {reason}")]
    Tokenizer { path: String, reason: String },
    #[error("chat template: {0}")]
    Template(String),
    #[error("prompt: {0}")]
    Prompt(String),
    #[error(
        "prompt: the prompt has {prompt_tokens} tokens but the context holds {ctx_size}; \
         shorten the prompt or raise the context (--ctx-size, at most the model's \
         {context_length})"
    )]
    PromptTooLong {
        prompt_tokens: usize,
        ctx_size: usize,
        context_length: usize,
    },
    #[error("sampling: {0}")]
    Sampling(String),
    #[error("constraint: {0}")]
    Constraint(String),
    #[error(transparent)]
    Runtime(#[from] oxgen_runtime::RuntimeError),
}
