//! oxgen-generate: from text to tokens and back, and the decoding loop.
//!
//! - [`Tokenizer`]: a Hugging Face `tokenizer.json` (the `tokenizers` crate, pure Rust), with
//!   a [`Detokenizer`] that streams text without ever splitting a UTF-8 character.
//! - [`ChatTemplate`]: the package's Jinja chat template (minijinja with Python-compatible
//!   methods, `raise_exception` and `strftime_now`).
//! - [`generate_greedy`]: prefill then decode through any [`oxgen_runtime::LanguageModel`].
//!
//! This crate sees logits as `&[f32]` rows; it must never know which backend runs the model
//! or read ONNX files.

mod decode;
mod template;
mod tokenizer;

pub use decode::{GenerateOptions, Generated, StopReason, generate_greedy};
pub use template::{ChatMessage, ChatTemplate};
pub use tokenizer::{Detokenizer, Tokenizer};

/// Errors from tokenizing, templating or decoding.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("tokenizer {path}: {reason}")]
    Tokenizer { path: String, reason: String },
    #[error("chat template: {0}")]
    Template(String),
    #[error("prompt: {0}")]
    Prompt(String),
    #[error(transparent)]
    Runtime(#[from] oxgen_runtime::RuntimeError),
}
