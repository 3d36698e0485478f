//! Helpers the sampling and selection tests share.

// Each test file compiles its own copy and uses part of it.
#![allow(dead_code)]

use oxgen_generate::{Sampler, SamplingParams};

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
