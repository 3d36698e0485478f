//! Helpers the sampling and selection tests share.

// Each test file compiles its own copy and uses part of it.
#![allow(dead_code)]

use std::sync::Arc;

use oxgen_generate::{
    Constraint, DecodeOptions, Decoding, FinishReason, Grammar, Grammars, Sampler, SamplingParams,
    Tokenizer,
};
use oxgen_testkit::fixtures::{Rng, tokenizer};

pub const NEG: f32 = f32::NEG_INFINITY;

/// Logits whose softmax is `probs`.
pub fn logits_of(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|p| p.ln() as f32).collect()
}

/// Which entries are still finite (kept) after a filter.
pub fn kept(row: &[f32]) -> Vec<usize> {
    (0..row.len()).filter(|&i| row[i] > NEG).collect()
}

pub fn sampler(params: SamplingParams) -> Sampler {
    Sampler::new(params).expect("valid parameters")
}

/// The fixtures' small byte-level BPE tokenizer.
pub fn tokenizer() -> Arc<Tokenizer> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, tokenizer::json()).unwrap();
    Arc::new(Tokenizer::from_file(&path).unwrap())
}

pub fn grammars() -> (Arc<Tokenizer>, Grammars) {
    let tok = tokenizer();
    let g = Grammars::new(tok.clone(), tokenizer::VOCAB_SIZE, &[tokenizer::EOS as u32]).unwrap();
    (tok, g)
}

/// Decodes under `constraint` from random logits (seeded), greedy or sampled at temperature
/// 1, with logits that favour the end-of-sequence id and the special tokens (which the
/// grammar must keep out until it accepts); returns the text and why it finished.
pub fn decode(
    tok: &Tokenizer,
    grammars: &Grammars,
    constraint: &Constraint,
    seed: u64,
    greedy: bool,
) -> (String, FinishReason) {
    let grammar = grammars.compile(constraint).unwrap();
    decode_grammar(tok, grammar, 400, seed, greedy, 20.0)
}

/// Decodes under `grammar` within `limit` ids from random logits (seeded), the
/// end-of-sequence and beginning ids given the logit `ending`.
pub fn decode_grammar(
    tok: &Tokenizer,
    grammar: Grammar,
    limit: usize,
    seed: u64,
    greedy: bool,
    ending: f32,
) -> (String, FinishReason) {
    let options = DecodeOptions {
        max_new_tokens: limit,
        eos: vec![tokenizer::EOS as u32],
        ignore_eos: false,
        stop: Vec::new(),
        stop_ids: Vec::new(),
        min_new_tokens: 0,
        include_stop: false,
        reasoning_budget: None,
        sampling: SamplingParams {
            greedy,
            seed,
            ..SamplingParams::default()
        },
        constraint: Some(grammar),
        keep_special: false,
    };
    let mut d = Decoding::new(&[1, 40, 41], 0, 1024, options).unwrap();
    let mut rng = Rng::new(seed);
    let mut text = String::new();
    loop {
        let mut row: Vec<f32> = (0..tokenizer::VOCAB_SIZE)
            .map(|_| rng.uniform() * 8.0)
            .collect();
        row[tokenizer::EOS] = ending;
        row[tokenizer::BOS] = ending;
        let emitted = d.on_logits(&row, tok).unwrap();
        text.push_str(&d.take_text());
        if let Some(finish) = emitted.finish {
            return (text, finish);
        }
    }
}
