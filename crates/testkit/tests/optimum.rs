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

use oxgen_exec::{ExecOptions, NativeLm, NativeOptions, PassOptions};
use oxgen_runtime::{Batch, LanguageModel, LogitsWanted, SeqStep, StepLogits};
use oxgen_testkit::fixtures::{FixtureConfig, Rng, tokenizer::VOCAB_SIZE};
use oxgen_testkit::optimum::write_optimum_package;
use oxgen_testkit::spans::{argmax, bits, max_diff, prefill_then_decode as spans, run_spans};

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
    let options = NativeOptions {
        exec: ExecOptions {
            threads: 1,
            ..Default::default()
        },
        context_length: passes.context_length,
        optimize: passes.enabled,
        ..NativeOptions::default()
    };
    NativeLm::open(model, &options).unwrap()
}

fn unoptimized(model: &Path) -> NativeLm {
    load(
        model,
        &PassOptions {
            enabled: false,
            ..Default::default()
        },
    )
}

fn optimized(model: &Path, cfg: &FixtureConfig) -> NativeLm {
    load(
        model,
        &PassOptions {
            enabled: true,
            context_length: Some(cfg.context),
            ..Default::default()
        },
    )
}

fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| 3 + (rng.next_u64() % (VOCAB_SIZE as u64 - 3)) as u32)
        .collect()
}

fn op_histogram(lm: &NativeLm) -> BTreeMap<String, usize> {
    let mut h = BTreeMap::new();
    for n in &lm.graph().nodes {
        *h.entry(n.op_type.clone()).or_insert(0) += 1;
    }
    h
}

/// Prefill of 12 tokens, then 16 single-token decode steps.
fn prefill_and_decode() -> (Vec<u32>, Vec<u32>) {
    (tokens(1, 12), tokens(2, 16))
}

/// Greedy ids: prefill `prompt`, then feed back the argmax `n` times.
fn greedy(lm: &mut NativeLm, prompt: &[u32], n: usize) -> Vec<u32> {
    let seq = lm.add_sequence(64).unwrap();
    let mut out = StepLogits::default();
    let mut ids = Vec::new();
    let mut next: Vec<u32> = prompt.to_vec();
    let mut pos = 0;
    for _ in 0..n {
        let step = [SeqStep {
            seq,
            tokens: &next,
            pos,
            logits: LogitsWanted::Last,
            proposed: 0,
        }];
        lm.step(&Batch { steps: &step }, &mut out).unwrap();
        pos += next.len();
        let id = argmax(out.row(0, 0)) as u32;
        ids.push(id);
        next = vec![id];
    }
    ids
}

/// Per layer: input norm, q/k/v, attention, o, post-attention norm, gate, up, the gated SiLU
/// (one `SiluMul`), down = 11; plus the embedding Gather, the final norm, the head and the
/// five nodes computing seqlens_k and total_sequence_length from attention_mask.
fn fused_node_count(layers: usize) -> usize {
    11 * layers + 3 + 5
}

#[test]
fn passes_leave_the_fused_graph() {
    // With repeat_kv (4 heads over 2 KV heads) and without (3 layers, 4 KV heads).
    for cfg in [
        FixtureConfig::default(),
        FixtureConfig {
            layers: 3,
            kv_heads: 4,
            ..FixtureConfig::default()
        },
    ] {
        let (_dir, model) = fixture(&cfg);
        let plain = unoptimized(&model);
        let fused = optimized(&model, &cfg);
        let l = cfg.layers;
        eprintln!(
            "{l} layers, {} KV heads: {} nodes -> {}",
            cfg.kv_heads,
            plain.graph().nodes.len(),
            fused.graph().nodes.len()
        );
        let r = fused.pass_report();
        assert!(r.skipped.is_empty(), "{:?}", r.skipped);
        assert_eq!(
            (
                r.rms_norms,
                r.skip_norms,
                r.rotaries,
                r.attentions,
                r.silu_muls
            ),
            (2 * l + 1, 2 * l, 2 * l, l, l)
        );
        assert_eq!(fused.graph().nodes.len(), fused_node_count(l));
        let expected: BTreeMap<String, usize> = [
            ("Cast", 2),
            ("Gather", 1),
            ("GroupQueryAttention", l),
            ("MatMul", 7 * l + 1),
            ("ReduceSum", 1),
            ("Shape", 1),
            ("SiluMul", l),
            ("SimplifiedLayerNormalization", 1),
            ("SkipSimplifiedLayerNormalization", 2 * l),
            ("Sub", 1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(op_histogram(&fused), expected);
        // Every present output now comes out of an attention node that appends in place.
        let g = fused.graph();
        for layer in &fused.contract().layers {
            let id = g.find(&layer.present_key).unwrap();
            let producer = g
                .nodes
                .iter()
                .find(|n| n.outputs.contains(&Some(id)))
                .unwrap();
            assert_eq!(producer.op_type, "GroupQueryAttention");
        }
        assert!(!plain.shared_kv(), "the export grows KV by Concat");
        assert!(
            fused.shared_kv(),
            "past KV is read only by GroupQueryAttention"
        );
    }
}

#[test]
fn optimized_logits_equal_unoptimized_and_onnxruntime() {
    let cfg = FixtureConfig::default();
    let (_dir, model) = fixture(&cfg);
    let (prompt, decode) = prefill_and_decode();
    let spans = spans(&prompt, &decode);
    let base = run_spans(&mut unoptimized(&model), &spans);
    let fused = run_spans(&mut optimized(&model, &cfg), &spans);
    let owned: Vec<Vec<u32>> = spans.iter().map(|s| s.to_vec()).collect();
    let theirs = oxgen_testkit::ort_oracle::step_lm(&model, &owned).unwrap();
    assert_eq!(theirs.dims(), &[12 + 16, VOCAB_SIZE]);
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
        "max |unoptimized - onnxruntime| = {d_ort:e}, |optimized - unoptimized| = {d_fused:e}, \
         |optimized - onnxruntime| = {d_fused_ort:e} over 28 rows"
    );
    assert!(
        d_ort <= ORT_LOGIT_ATOL,
        "unoptimized vs onnxruntime: {d_ort:e}"
    );
    assert!(
        d_fused <= FUSED_LOGIT_ATOL,
        "optimized vs unoptimized: {d_fused:e}"
    );
    assert!(
        d_fused_ort <= ORT_LOGIT_ATOL,
        "optimized vs onnxruntime: {d_fused_ort:e}"
    );
    for (r, ((a, b), c)) in base.iter().zip(&fused).zip(&theirs).enumerate() {
        assert_eq!(
            argmax(a),
            argmax(b),
            "row {r}: greedy token changed by the passes"
        );
        assert_eq!(
            argmax(a),
            argmax(c),
            "row {r}: greedy token differs from onnxruntime"
        );
    }
}

#[test]
fn greedy_ids_are_identical_with_and_without_the_passes() {
    let cfg = FixtureConfig::default();
    let (_dir, model) = fixture(&cfg);
    let prompt = tokens(3, 9);
    let base = greedy(&mut unoptimized(&model), &prompt, 24);
    let fused = greedy(&mut optimized(&model, &cfg), &prompt, 24);
    assert_eq!(base, fused);
}

#[test]
fn without_rotary_caches_attention_still_fuses() {
    // What `NativeLm::new` does when it is not told the context: rotary stays spelled out,
    // attention reads the rotated heads back as rows.
    let cfg = FixtureConfig::default();
    let (_dir, model) = fixture(&cfg);
    let mut fused = load(&model, &PassOptions::default());
    let r = fused.pass_report().clone();
    assert_eq!((r.rotaries, r.attentions), (0, cfg.layers));
    assert!(fused.shared_kv());
    let gqa: Vec<_> = fused
        .graph()
        .nodes
        .iter()
        .filter_map(|n| match &n.op {
            oxgen_graph::Op::GroupQueryAttention(g) => Some(g.do_rotary),
            _ => None,
        })
        .collect();
    assert_eq!(gqa, vec![false; cfg.layers]);
    let (prompt, decode) = prefill_and_decode();
    let spans = spans(&prompt, &decode);
    let base = run_spans(&mut unoptimized(&model), &spans);
    let ours = run_spans(&mut fused, &spans);
    let d = max_diff(&base, &ours);
    assert!(d <= FUSED_LOGIT_ATOL, "{d:e}");
}

#[test]
fn chunked_prefill_on_the_fused_graph_is_bitwise_identical() {
    let cfg = FixtureConfig::default();
    let (_dir, model) = fixture(&cfg);
    let mut fused = optimized(&model, &cfg);
    let prompt = tokens(4, 13);
    let whole = run_spans(&mut fused, &[&prompt]);
    let chunked = run_spans(&mut fused, &[&prompt[..5], &prompt[5..9], &prompt[9..]]);
    assert_eq!(bits(&whole), bits(&chunked));
}
