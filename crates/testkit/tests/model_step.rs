//! The model step on a fixture package (onnxruntime-genai graph shape): the tests that define
//! correctness for everything built on it.
//!
//! (a) logits equal onnxruntime's over a prefill and 16 decode steps, within an f32 tolerance;
//! (b) prefill in one step, in chunks, or token by token gives bitwise identical logits;
//! (c) sequences stepped together give bitwise the logits each gives alone.

use std::path::{Path, PathBuf};

use oxgen_exec::{ExecOptions, MemoryOptions, NativeLm, NativeOptions};
use oxgen_runtime::{Batch, LanguageModel, LogitsWanted, SeqId, SeqStep, StepLogits};
use oxgen_testkit::fixtures::{FixtureConfig, Rng, tokenizer::VOCAB_SIZE, write_package};
use oxgen_testkit::spans::{argmax, bits, run_spans};

/// Both backends compute in f32 from the same dequantized 4-bit weights; only summation order
/// differs (onnxruntime's MLAS blocks K, the reference kernels sum it in order), which moves
/// logits of magnitude ~5 by ~1e-6 relative per op over 2 layers. 1e-4 absolute leaves two
/// orders of margin while catching any semantic slip (a wrong rotary angle moves logits by >0.1).
const ORT_LOGIT_ATOL: f32 = 1e-4;

fn fixture() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    write_package(dir.path(), &FixtureConfig::default()).unwrap();
    let model = dir.path().join("model.onnx");
    (dir, model)
}

fn lm(model: &Path, threads: usize) -> NativeLm {
    let options = NativeOptions {
        exec: ExecOptions {
            threads,
            ..Default::default()
        },
        ..NativeOptions::default()
    };
    NativeLm::open(model, &options).unwrap()
}

fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| 3 + (rng.next_u64() % (VOCAB_SIZE as u64 - 3)) as u32)
        .collect()
}

#[test]
fn logits_match_onnxruntime_over_prefill_and_16_decode_steps() {
    let (_dir, model) = fixture();
    let prompt = tokens(1, 12);
    let decode = tokens(2, 16);
    let mut spans: Vec<&[u32]> = vec![&prompt];
    spans.extend(decode.chunks(1));
    let mut native = lm(&model, 2);
    assert!(
        native.shared_kv(),
        "GroupQueryAttention graphs keep KV in context-sized buffers"
    );
    let ours = run_spans(&mut native, &spans);

    let owned: Vec<Vec<u32>> = spans.iter().map(|s| s.to_vec()).collect();
    let theirs = oxgen_testkit::ort_oracle::step_lm(&model, &owned).unwrap();
    assert_eq!(theirs.dims(), &[12 + 16, VOCAB_SIZE]);
    let theirs = theirs.as_slice::<f32>().unwrap();
    let mut worst = 0.0f32;
    for (r, row) in ours.iter().enumerate() {
        let expected = &theirs[r * VOCAB_SIZE..(r + 1) * VOCAB_SIZE];
        for (a, e) in row.iter().zip(expected) {
            worst = worst.max((a - e).abs());
        }
        assert_eq!(
            argmax(row),
            argmax(expected),
            "row {r}: greedy token differs from onnxruntime"
        );
    }
    assert!(
        worst <= ORT_LOGIT_ATOL,
        "max |native - onnxruntime| = {worst:e} > {ORT_LOGIT_ATOL:e}"
    );
    eprintln!("max |native - onnxruntime| logit difference over 28 rows: {worst:e}");
}

#[test]
fn prefill_in_one_step_in_chunks_or_token_by_token_is_bitwise_identical() {
    let (_dir, model) = fixture();
    let prompt = tokens(3, 13);
    let mut native = lm(&model, 2);
    let whole = run_spans(&mut native, &[&prompt]);
    let chunked = run_spans(&mut native, &[&prompt[..5], &prompt[5..9], &prompt[9..]]);
    let singles: Vec<&[u32]> = prompt.chunks(1).collect();
    let one_by_one = run_spans(&mut native, &singles);
    assert_eq!(
        bits(&whole),
        bits(&chunked),
        "chunked prefill differs from one-step prefill"
    );
    assert_eq!(
        bits(&whole),
        bits(&one_by_one),
        "token-by-token prefill differs from one-step prefill"
    );
    let mut one_thread = lm(&model, 1);
    assert_eq!(
        bits(&whole),
        bits(&run_spans(&mut one_thread, &[&prompt])),
        "thread count changed logits"
    );
}

#[test]
fn a_prompt_step_that_wants_the_last_row_computes_the_same_bits() {
    // With `LogitsWanted::Last` the output head runs on the last prompt row alone; that row
    // must be the one a full prefill computes, bit for bit (rows of a product are
    // independent, DESIGN.md §6).
    let (_dir, model) = fixture();
    let mut lm = lm(&model, 2);
    let prompt = tokens(9, 13);
    let all = run_spans(&mut lm, &[&prompt]);
    let seq = lm.add_sequence(64).unwrap();
    let mut out = StepLogits::default();
    let step = [SeqStep {
        seq,
        tokens: &prompt,
        pos: 0,
        logits: LogitsWanted::Last,
        proposed: 0,
    }];
    lm.step(&Batch { steps: &step }, &mut out).unwrap();
    assert_eq!(out.rows, vec![0..1]);
    assert_eq!(bits(&[out.row(0, 0).to_vec()]), bits(&all[12..]));
}

#[test]
fn sequences_stepped_together_match_each_stepped_alone() {
    let (_dir, model) = fixture();
    let (a, b) = (tokens(4, 9), tokens(5, 4));
    let (next_a, next_b) = (tokens(6, 1), tokens(7, 1));
    let mut native = lm(&model, 2);
    let alone_a = run_spans(&mut native, &[&a, &next_a]);
    let alone_b = run_spans(&mut native, &[&b, &next_b]);

    let (sa, sb): (SeqId, SeqId) = (
        native.add_sequence(64).unwrap(),
        native.add_sequence(64).unwrap(),
    );
    let mut out = StepLogits::default();
    let prefill = [
        SeqStep {
            seq: sa,
            tokens: &a,
            pos: 0,
            logits: LogitsWanted::All,
            proposed: 0,
        },
        SeqStep {
            seq: sb,
            tokens: &b,
            pos: 0,
            logits: LogitsWanted::All,
            proposed: 0,
        },
    ];
    native.step(&Batch { steps: &prefill }, &mut out).unwrap();
    let together_a: Vec<Vec<f32>> = (0..a.len()).map(|r| out.row(0, r).to_vec()).collect();
    let together_b: Vec<Vec<f32>> = (0..b.len()).map(|r| out.row(1, r).to_vec()).collect();
    let decode = [
        SeqStep {
            seq: sb,
            tokens: &next_b,
            pos: b.len(),
            logits: LogitsWanted::Last,
            proposed: 0,
        },
        SeqStep {
            seq: sa,
            tokens: &next_a,
            pos: a.len(),
            logits: LogitsWanted::Last,
            proposed: 0,
        },
    ];
    native.step(&Batch { steps: &decode }, &mut out).unwrap();
    assert_eq!(bits(&together_a), bits(&alone_a[..a.len()]));
    assert_eq!(bits(&together_b), bits(&alone_b[..b.len()]));
    assert_eq!(bits(&[out.row(1, 0).to_vec()]), bits(&alone_a[a.len()..]));
    assert_eq!(bits(&[out.row(0, 0).to_vec()]), bits(&alone_b[b.len()..]));
    assert_eq!(native.sequence_len(sa), Some(a.len() + 1));
}

#[test]
fn rewinding_a_sequence_recomputes_the_same_logits() {
    let (_dir, model) = fixture();
    let prompt = tokens(8, 10);
    let mut native = lm(&model, 1);
    let seq = native.add_sequence(32).unwrap();
    let mut out = StepLogits::default();
    let all = [SeqStep {
        seq,
        tokens: &prompt,
        pos: 0,
        logits: LogitsWanted::All,
        proposed: 0,
    }];
    native.step(&Batch { steps: &all }, &mut out).unwrap();
    let first: Vec<u32> = out.row(0, 9).iter().map(|v| v.to_bits()).collect();
    let again = [SeqStep {
        seq,
        tokens: &prompt[6..],
        pos: 6,
        logits: LogitsWanted::Last,
        proposed: 0,
    }];
    native.step(&Batch { steps: &again }, &mut out).unwrap();
    assert_eq!(
        out.row(0, 0)
            .iter()
            .map(|v| v.to_bits())
            .collect::<Vec<_>>(),
        first
    );
}

#[test]
fn bad_steps_are_errors_that_name_the_sequence() {
    let (_dir, model) = fixture();
    let mut native = lm(&model, 1);
    let seq = native.add_sequence(8).unwrap();
    let mut out = StepLogits::default();
    let long = tokens(9, 9);
    let e = native
        .step(
            &Batch {
                steps: &[SeqStep {
                    seq,
                    tokens: &long,
                    pos: 0,
                    logits: LogitsWanted::Last,
                    proposed: 0,
                }],
            },
            &mut out,
        )
        .unwrap_err();
    assert!(e.to_string().contains("exceed the context of 8"), "{e}");
    let e = native
        .step(
            &Batch {
                steps: &[SeqStep {
                    seq,
                    tokens: &long[..2],
                    pos: 3,
                    logits: LogitsWanted::Last,
                    proposed: 0,
                }],
            },
            &mut out,
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("past the sequence's length 0"),
        "{e}"
    );
    let e = native
        .step(
            &Batch {
                steps: &[SeqStep {
                    seq: SeqId(99),
                    tokens: &long[..1],
                    pos: 0,
                    logits: LogitsWanted::Last,
                    proposed: 0,
                }],
            },
            &mut out,
        )
        .unwrap_err();
    assert!(e.to_string().contains("sequence 99"), "{e}");
}

#[test]
fn a_graph_without_kv_inputs_is_not_a_language_model() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = oxgen_onnx::writer::ModelBuilder::new("oxgen-test");
    b.opset("", 21);
    b.input(
        "input_ids",
        oxgen_tensor::DType::I64,
        &["b".into(), "s".into()],
    );
    b.node(
        "Cast",
        "",
        "c",
        &["input_ids"],
        &["logits"],
        vec![oxgen_onnx::writer::attr::int("to", 1)],
    );
    b.output(
        "logits",
        oxgen_tensor::DType::F32,
        &["b".into(), "s".into()],
    );
    let path = dir.path().join("m.onnx");
    b.save(&path, None).unwrap();
    let e = NativeLm::open(&path, &NativeOptions::default())
        .err()
        .expect("no KV inputs");
    assert!(e.to_string().contains("past_key_values.%d.key"), "{e}");
}

/// A verification step's proposed tokens stay out of the prefix cache until a later step
/// settles them: a block they fill is not registered, and once the sequence rewinds and
/// writes other ids there, a new sequence with the rejected ids finds only the settled
/// blocks.
#[test]
fn proposed_tokens_fill_no_prefix_cache_block() {
    let (_dir, model) = fixture();
    let options = NativeOptions {
        exec: ExecOptions {
            threads: 1,
            ..Default::default()
        },
        memory: MemoryOptions {
            prefix_cache: true,
            ..MemoryOptions::default()
        },
        ..NativeOptions::default()
    };
    let mut lm = NativeLm::open(&model, &options).unwrap();
    let bs = oxgen_exec::KV_BLOCK_SIZE;
    let ids = tokens(11, 3 * bs);
    let (seq, _) = lm.start_sequence(4 * bs, &ids, None).unwrap();
    let mut out = StepLogits::default();
    let mut step = |lm: &mut NativeLm, tokens: &[u32], pos: usize, proposed: usize| {
        let steps = [SeqStep {
            seq,
            tokens,
            pos,
            logits: LogitsWanted::All,
            proposed,
        }];
        lm.step(&Batch { steps: &steps }, &mut out).unwrap();
    };
    // Two blocks of settled ids, then a verification whose last bs + 1 ids are proposals:
    // the second block holds one proposal, the third is all proposals.
    step(&mut lm, &ids[..bs + 1], 0, 0);
    step(&mut lm, &ids[bs + 1..], bs + 1, bs + 1);
    assert_eq!(
        lm.kv_usage().unwrap().cached,
        1,
        "only the first block settled"
    );
    // The proposals were rejected from position 2·bs − 1 on: other ids go there.
    let other = tokens(12, bs + 1);
    step(&mut lm, &other, 2 * bs - 1, 0);
    assert_eq!(
        lm.kv_usage().unwrap().cached,
        3,
        "three full blocks of settled ids"
    );
    // A sequence asking for the rejected ids reuses the settled first block only.
    let (_, cached) = lm.start_sequence(4 * bs, &ids, None).unwrap();
    assert_eq!(cached, bs);
}
