//! A BERT encoder's fused ops against onnxruntime 1.32 (the `ort_oracle`), as its
//! transformer optimizer writes them: com.microsoft::EmbedLayerNormalization, BiasGelu,
//! FastGelu, Gelu and Attention, over their input forms, with seeded pseudo-random data,
//! each test's cases in one model (see `quant_ops.rs` for the harness and the tolerances:
//! the GELUs and the norm take the norms' bound, Attention the f32 product's). Needs
//! `OXGEN_PYTHON` (see `scripts/test.sh`).

mod ops_batch;

use oxgen_onnx::writer::attr;
use oxgen_tensor::{DType, Tensor};
use oxgen_testkit::Rng;

use ops_batch::*;

/// The encoder ops refuse at load, naming the node, what they cannot run: an
/// EmbedLayerNormalization without its position table or with segment ids but no segment
/// table, and an Attention with a decoder's past (which `--backend auto` then runs on ONNX
/// Runtime).
#[test]
fn encoder_ops_refuse_what_they_cannot_run_at_load_naming_the_node() {
    let embed = |inputs: &'static [&'static str]| {
        load_error(|b| {
            for n in ["ids", "seg", "word", "pos", "segtab", "gamma", "beta"] {
                b.input(n, DType::F32, &fixed(&[2, 4]));
            }
            let outs = ["y", "mask_index"];
            b.node(
                "EmbedLayerNormalization",
                "com.microsoft",
                "embeddings",
                inputs,
                &outs,
                vec![],
            );
            b.output("y", DType::F32, &fixed(&[1, 2, 4]));
        })
    };
    let err = embed(&["ids", "", "word", "", "", "gamma", "beta"]);
    assert!(
        err.contains("embeddings") && err.contains("input 3"),
        "{err}"
    );
    let err = embed(&["ids", "seg", "word", "pos", "", "gamma", "beta"]);
    assert!(
        err.contains("embeddings") && err.contains("segment_embedding"),
        "{err}"
    );
    let err = load_error(|b| {
        for n in ["x", "w", "bias", "mask", "past"] {
            b.input(n, DType::F32, &fixed(&[1, 2, 4]));
        }
        let attrs = vec![attr::int("num_heads", 2)];
        let inputs = ["x", "w", "bias", "mask", "past"];
        b.node(
            "Attention",
            "com.microsoft",
            "self_attention",
            &inputs,
            &["y"],
            attrs,
        );
        b.output("y", DType::F32, &fixed(&[1, 2, 4]));
    });
    assert!(
        err.contains("self_attention") && err.contains("past"),
        "{err}"
    );
}

/// BiasGelu (erf GELU of `x + bias`), FastGelu (tanh GELU, with and without its bias) and
/// com.microsoft::Gelu, on rows short of and past the vector erf's window, in one model.
#[test]
fn bias_gelu_fast_gelu_and_gelu_match_onnxruntime() {
    let mut batch = Batch::new();
    let mut rng = Rng::new(0x5eed_0007);
    let cases: [(&str, &[usize], bool); 7] = [
        ("BiasGelu", &[2, 3, 16], true),
        ("BiasGelu", &[1, 5, 67], true),
        ("BiasGelu", &[3, 384], true),
        ("FastGelu", &[2, 3, 16], true),
        ("FastGelu", &[4, 33], false),
        ("Gelu", &[2, 50], false),
        ("Gelu", &[1, 1, 1], false),
    ];
    for (i, &(op, dims, bias)) in cases.iter().enumerate() {
        let (x, b, y) = (format!("x{i}"), format!("b{i}"), format!("y{i}"));
        let total: usize = dims.iter().product();
        batch.input(
            &x,
            float_tensor(dims, &rng.floats(total, -4.0, 4.0), DType::F32),
        );
        let mut inputs = vec![x.as_str()];
        if bias {
            let n = dims[dims.len() - 1];
            batch.init(
                &b,
                float_tensor(&[n], &rng.floats(n, -1.0, 1.0), DType::F32),
            );
            inputs.push(&b);
        }
        batch.builder.node(
            op,
            "com.microsoft",
            &format!("node{i}"),
            &inputs,
            &[&y],
            vec![],
        );
        batch.output(
            &y,
            DType::F32,
            dims,
            format!("{op} {dims:?} bias {bias}"),
            F32_NORM,
        );
    }
    batch.run("BiasGelu, FastGelu and Gelu");
}

/// EmbedLayerNormalization as a BERT's embeddings use it: with and without segments, a
/// mask (its `mask_index` counts), positions given as `[1, seq]`, `[batch, seq]` or not at
/// all, and the optional sum of the embeddings before the norm.
#[test]
fn embed_layer_norm_matches_onnxruntime() {
    let mut batch = Batch::new();
    let mut rng = Rng::new(0x5eed_0008);
    let (vocab, max_pos, hidden) = (30usize, 12usize, 24usize);
    // (batch, seq, segments, mask, position ids' rows (0: none), outputs)
    let cases: [(usize, usize, bool, bool, usize, usize); 5] = [
        (2, 5, true, true, 0, 2),
        (1, 7, true, false, 1, 3),
        (2, 4, false, false, 1, 2),
        (3, 6, true, true, 3, 3),
        (1, 1, false, true, 0, 2),
    ];
    for (i, &(b, s, segments, mask, pos_rows, outputs)) in cases.iter().enumerate() {
        let name = |what: &str| format!("{what}{i}");
        let int = |dims: &[usize], values: Vec<i32>| Tensor::from_slice(dims, &values).unwrap();
        let ids: Vec<i32> = (0..b * s).map(|_| rng.below(vocab as u64) as i32).collect();
        batch.input(&name("ids"), int(&[b, s], ids));
        let mut inputs = vec![name("ids"), String::new()];
        if segments {
            let seg: Vec<i32> = (0..b * s).map(|_| rng.below(2) as i32).collect();
            batch.input(&name("seg"), int(&[b, s], seg));
            inputs[1] = name("seg");
        }
        for (what, rows) in [("word", vocab), ("pos", max_pos)] {
            let table = rng.floats(rows * hidden, -1.0, 1.0);
            batch.init(
                &name(what),
                float_tensor(&[rows, hidden], &table, DType::F32),
            );
            inputs.push(name(what));
        }
        inputs.push(String::new());
        if segments {
            let table = rng.floats(2 * hidden, -1.0, 1.0);
            batch.init(
                &name("segtab"),
                float_tensor(&[2, hidden], &table, DType::F32),
            );
            inputs[4] = name("segtab");
        }
        for (what, lo, hi) in [("gamma", 0.5, 1.5), ("beta", -0.5, 0.5)] {
            let v = rng.floats(hidden, lo, hi);
            batch.init(&name(what), float_tensor(&[hidden], &v, DType::F32));
            inputs.push(name(what));
        }
        if mask {
            let m: Vec<i32> = (0..b * s)
                .map(|t| i32::from(t % s < s - t / s % 2))
                .collect();
            batch.input(&name("mask"), int(&[b, s], m));
            inputs.push(name("mask"));
        } else if pos_rows > 0 {
            inputs.push(String::new());
        }
        if pos_rows > 0 {
            let p: Vec<i32> = (0..pos_rows * s)
                .map(|_| rng.below(max_pos as u64) as i32)
                .collect();
            batch.input(&name("posids"), int(&[pos_rows, s], p));
            inputs.push(name("posids"));
        }
        let outs = [name("y"), name("mask_index"), name("sum")];
        let outs: Vec<&str> = outs[..outputs].iter().map(String::as_str).collect();
        let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        let attrs = vec![attr::float("epsilon", 1e-12)];
        batch.builder.node(
            "EmbedLayerNormalization",
            "com.microsoft",
            &name("node"),
            &inputs,
            &outs,
            attrs,
        );
        let label = |what: &str| {
            format!(
                "case {i} ({b}x{s}, segments {segments}, mask {mask}, positions {pos_rows}) {what}"
            )
        };
        batch.output(
            outs[0],
            DType::F32,
            &[b, s, hidden],
            label("output"),
            F32_NORM,
        );
        if outputs > 1 {
            batch.output(outs[1], DType::I32, &[b], label("mask_index"), EXACT);
        }
        if outputs > 2 {
            batch.output(
                outs[2],
                DType::F32,
                &[b, s, hidden],
                label("embedding_sum"),
                F32_NORM,
            );
        }
    }
    batch.run("EmbedLayerNormalization");
}

/// Attention as a BERT's fused self-attention: the mask forms (none, right-padded lengths,
/// end and start positions, a raw (batch, keys) and (batch, queries, keys) mask), causal,
/// Q, K and V of different widths, an attention bias, a custom scale and filter value.
#[test]
fn attention_matches_onnxruntime() {
    let mut batch = Batch::new();
    let mut rng = Rng::new(0x5eed_0009);
    // (batch, seq, input hidden, heads, qkv widths, mask form, unidirectional, attention bias)
    type Case = (
        usize,
        usize,
        usize,
        usize,
        [usize; 3],
        &'static str,
        bool,
        bool,
    );
    let cases: [Case; 7] = [
        (2, 5, 32, 4, [32, 32, 32], "none", false, false),
        (2, 6, 16, 2, [16, 16, 16], "keys", false, false),
        (3, 4, 24, 3, [24, 24, 24], "lengths", true, false),
        (2, 5, 16, 2, [16, 16, 16], "spans", false, false),
        (2, 4, 16, 4, [16, 16, 24], "pairs", false, true),
        (1, 7, 64, 2, [64, 64, 64], "keys", true, true),
        (1, 1, 8, 1, [8, 8, 8], "lengths", false, false),
    ];
    for (i, &(b, s, hin, heads, [qw, kw, vw], mask, causal, with_bias)) in cases.iter().enumerate()
    {
        let name = |what: &str| format!("att_{what}{i}");
        let width = qw + kw + vw;
        batch.input(
            &name("x"),
            float_tensor(
                &[b, s, hin],
                &rng.floats(b * s * hin, -1.0, 1.0),
                DType::F32,
            ),
        );
        batch.init(
            &name("w"),
            float_tensor(
                &[hin, width],
                &rng.floats(hin * width, -0.5, 0.5),
                DType::F32,
            ),
        );
        batch.init(
            &name("bias"),
            float_tensor(&[width], &rng.floats(width, -0.2, 0.2), DType::F32),
        );
        let mut inputs = vec![name("x"), name("w"), name("bias"), String::new()];
        let int = |dims: &[usize], values: Vec<i32>| Tensor::from_slice(dims, &values).unwrap();
        // Each sequence b keeps its first s - b keys (at least one).
        let keep = |seq: usize| s - (seq % s).min(s - 1);
        let m = match mask {
            "lengths" => Some(int(&[b], (0..b).map(|q| keep(q) as i32).collect())),
            "spans" => Some(int(
                &[2 * b],
                (0..b)
                    .map(|_| s as i32)
                    .chain((0..b).map(|q| (s - keep(q)) as i32))
                    .collect(),
            )),
            "keys" => Some(int(
                &[b, s],
                (0..b * s).map(|t| i32::from(t % s < keep(t / s))).collect(),
            )),
            "pairs" => Some(int(
                &[b, s, s],
                (0..b * s * s)
                    .map(|t| i32::from((t + t / s) % 3 != 0 || t % s == 0))
                    .collect(),
            )),
            _ => None,
        };
        if let Some(m) = m {
            batch.input(&name("mask"), m);
            inputs[3] = name("mask");
        }
        if with_bias {
            inputs.push(String::new());
            let planes = heads;
            let v = rng.floats(planes * s * s, -1.0, 1.0);
            batch.input(&name("ab"), float_tensor(&[1, heads, s, s], &v, DType::F32));
            inputs.push(name("ab"));
        }
        while inputs.last().is_some_and(String::is_empty) {
            inputs.pop();
        }
        let mut attrs = vec![attr::int("num_heads", heads as i64)];
        if causal {
            attrs.push(attr::int("unidirectional", 1));
        }
        if vw != qw {
            attrs.push(attr::ints(
                "qkv_hidden_sizes",
                &[qw as i64, kw as i64, vw as i64],
            ));
        }
        if i == 5 {
            attrs.push(attr::float("scale", 0.3));
            attrs.push(attr::float("mask_filter_value", -500.0));
        }
        let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        let y = name("y");
        batch.builder.node(
            "Attention",
            "com.microsoft",
            &name("node"),
            &inputs,
            &[&y],
            attrs,
        );
        let label = format!(
            "case {i}: {b}x{s}, {heads} heads, widths {qw}/{kw}/{vw}, mask {mask}, causal {causal}, bias {with_bias}"
        );
        batch.output(&y, DType::F32, &[b, s, vw], label, F32_MATMUL);
    }
    batch.run("Attention");
}
