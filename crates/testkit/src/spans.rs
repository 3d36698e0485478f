//! Running a language model step by step as the model tests do: spans of ids on one
//! sequence, every logits row kept, and what they compare on those rows.

use oxgen_runtime::{Batch, LanguageModel, LogitsWanted, SeqStep, StepLogits};

/// Runs `spans` in turn on one fresh sequence of `lm` (64 positions); returns every logits
/// row, in order.
pub fn run_spans(lm: &mut dyn LanguageModel, spans: &[&[u32]]) -> Vec<Vec<f32>> {
    let seq = lm.add_sequence(64).expect("a sequence of 64 positions");
    let mut rows = Vec::new();
    let mut out = StepLogits::default();
    let mut pos = 0;
    for span in spans {
        let step = [SeqStep {
            seq,
            tokens: span,
            pos,
            logits: LogitsWanted::All,
            proposed: 0,
        }];
        lm.step(&Batch { steps: &step }, &mut out)
            .expect("the step runs");
        rows.extend((0..span.len()).map(|r| out.row(0, r).to_vec()));
        pos += span.len();
    }
    lm.remove_sequence(seq);
    rows
}

/// `prompt` as one span, then each id of `decode` as a span of its own.
pub fn prefill_then_decode<'a>(prompt: &'a [u32], decode: &'a [u32]) -> Vec<&'a [u32]> {
    let mut spans: Vec<&[u32]> = vec![prompt];
    spans.extend(decode.chunks(1));
    spans
}

/// The first index of the largest value.
pub fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best })
}

/// The rows' bits, to compare for identity.
pub fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|r| r.iter().map(|v| v.to_bits()).collect())
        .collect()
}

/// The largest absolute difference between two sets of rows of the same shape.
pub fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len(), "as many rows");
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}
