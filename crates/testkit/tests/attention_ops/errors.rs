//! Unsupported inputs and attributes fail at load naming the node; bad data fails at run time
//! with an error, never a panic.

use oxgen_onnx::proto::AttributeProto;
use oxgen_onnx::writer::{Dim, ModelBuilder, attr};
use oxgen_tensor::{DType, Tensor};
use oxgen_testkit::node_tests::native_session;

const NODE: &str = "layers.0.attn/GroupQueryAttention";

/// A batch-1 GQA model (4 heads, 2 KV heads, head size 8, past of `past` positions) whose
/// node takes `extra` as inputs 9.. and `attrs` on top of the head counts.
fn model(
    dir: &std::path::Path,
    past: usize,
    extra: &[&str],
    attrs: Vec<AttributeProto>,
    outputs: &[&str],
) -> std::path::PathBuf {
    let mut b = ModelBuilder::new("oxgen-attention-test");
    b.opset("", 21).opset("com.microsoft", 1);
    let d = |v: &[usize]| v.iter().map(|&x| Dim::Fixed(x)).collect::<Vec<_>>();
    b.input(
        "q",
        DType::F32,
        &[Dim::Fixed(1), Dim::Fixed(1), Dim::from("hidden")],
    )
    .input("k", DType::F32, &d(&[1, 1, 16]))
    .input("v", DType::F32, &d(&[1, 1, 16]));
    b.input("pk", DType::F32, &d(&[1, 2, past, 8]))
        .input("pv", DType::F32, &d(&[1, 2, past, 8]));
    b.input("sl", DType::I32, &[Dim::from("batch")])
        .input("total", DType::I32, &[]);
    let mut ins = vec!["q", "k", "v", "pk", "pv", "sl", "total", "", ""];
    ins.extend(extra);
    for name in extra.iter().filter(|n| !n.is_empty()) {
        b.input(name, DType::F32, &[Dim::from("x")]);
    }
    let mut all = vec![attr::int("num_heads", 4), attr::int("kv_num_heads", 2)];
    all.extend(attrs);
    b.node(
        "GroupQueryAttention",
        "com.microsoft",
        NODE,
        &ins,
        outputs,
        all,
    );
    for o in outputs.iter().filter(|o| !o.is_empty()) {
        b.output(o, DType::F32, &[]);
    }
    let path = dir.join("m.onnx");
    b.save(&path, None).unwrap();
    path
}

fn load_error(path: &std::path::Path) -> String {
    match native_session(path) {
        Ok(_) => panic!("the model loaded"),
        Err(e) => e,
    }
}

#[test]
fn unsupported_inputs_outputs_and_attributes_fail_at_load_naming_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let out = ["out", "k2", "v2"];
    for (extra, attrs, outputs, needle) in [
        (vec!["", "bias"], vec![], &out[..], "attention_bias"),
        (vec!["pos"], vec![], &out[..], "position_ids"),
        (vec!["", "", "", "kscale"], vec![], &out[..], "k_scale"),
        (
            vec![],
            vec![attr::int("smooth_softmax", 2)],
            &out[..],
            "smooth_softmax",
        ),
        (vec![], vec![attr::int("causal", 0)], &out[..], "causal"),
        (
            vec![],
            vec![attr::string("k_quant_type", "PER_TENSOR")],
            &out[..],
            "k_quant_type",
        ),
        (
            vec![],
            vec![attr::int("qk_output", 1)],
            &out[..],
            "qk_output",
        ),
        (
            vec![],
            vec![],
            &["out", "k2", "v2", "qk"][..],
            "at most 3 outputs",
        ),
        (
            vec![],
            vec![attr::int("local_window_size", -3)],
            &out[..],
            "local_window_size",
        ),
    ] {
        let err = load_error(&model(dir.path(), 4, &extra, attrs, outputs));
        assert!(
            err.contains(NODE) && err.contains(needle),
            "{needle}: {err}"
        );
    }
    // Defaults spelled out are accepted.
    let defaults = vec![
        attr::int("smooth_softmax", 0),
        attr::int("causal", 1),
        attr::string("v_quant_type", "NONE"),
        attr::float("qk_norm_epsilon", 1e-6),
    ];
    native_session(&model(dir.path(), 4, &[], defaults, &out)).unwrap();
}

#[test]
fn bad_shapes_and_seqlens_are_run_time_errors_naming_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let path = model(dir.path(), 4, &[], vec![], &["out", "k2", "v2"]);
    let mut session = native_session(&path).unwrap();
    let feeds = |q_width: usize, seqlen: i32, total: i32| {
        vec![
            (
                "q".to_string(),
                Tensor::zeros(DType::F32, [1, 1, q_width]).unwrap(),
            ),
            (
                "k".to_string(),
                Tensor::zeros(DType::F32, [1, 1, 16]).unwrap(),
            ),
            (
                "v".to_string(),
                Tensor::zeros(DType::F32, [1, 1, 16]).unwrap(),
            ),
            (
                "pk".to_string(),
                Tensor::zeros(DType::F32, [1, 2, 4, 8]).unwrap(),
            ),
            (
                "pv".to_string(),
                Tensor::zeros(DType::F32, [1, 2, 4, 8]).unwrap(),
            ),
            (
                "sl".to_string(),
                Tensor::from_slice([1], &[seqlen]).unwrap(),
            ),
            ("total".to_string(), Tensor::scalar(total)),
        ]
    };
    assert!(session.run(feeds(32, 4, 5)).is_ok());
    assert!(
        session.run(feeds(32, 3, 4)).is_ok(),
        "a shared buffer with room"
    );
    for (f, needle) in [
        (feeds(32, 5, 5), "seqlens_k[0] = 5"),
        (feeds(32, -1, 5), "seqlens_k[0] = -1"),
        // Decoding after 5 positions but the (non-shared) past holds 4.
        (feeds(32, 5, 6), "past_key holds only 4"),
        (feeds(30, 4, 5), "query hidden size 30"),
        (feeds(32, 4, 0), "total_sequence_length must be at least 1"),
    ] {
        let err = session.run(f).map(|_| ()).unwrap_err().to_string();
        assert!(
            err.contains(NODE) && err.contains(needle),
            "{needle}: {err}"
        );
    }
}

#[test]
fn rotary_positions_past_the_caches_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = ModelBuilder::new("oxgen-attention-test");
    b.opset("", 23).opset("com.microsoft", 1);
    b.input(
        "x",
        DType::F32,
        &[Dim::Fixed(1), Dim::Fixed(2), Dim::Fixed(16)],
    );
    b.input("pos", DType::I64, &[Dim::Fixed(1), Dim::Fixed(2)]);
    b.input("cos", DType::F32, &[Dim::Fixed(4), Dim::Fixed(8)])
        .input("sin", DType::F32, &[Dim::Fixed(4), Dim::Fixed(8)]);
    b.node(
        "RotaryEmbedding",
        "com.microsoft",
        "rope",
        &["x", "pos", "cos", "sin"],
        &["y"],
        vec![],
    );
    b.output("y", DType::F32, &[]);
    let path = dir.path().join("r.onnx");
    b.save(&path, None).unwrap();
    let mut session = native_session(&path).unwrap();
    let feeds = |p: [i64; 2]| {
        vec![
            (
                "x".to_string(),
                Tensor::zeros(DType::F32, [1, 2, 16]).unwrap(),
            ),
            ("pos".to_string(), Tensor::from_slice([1, 2], &p).unwrap()),
            (
                "cos".to_string(),
                Tensor::zeros(DType::F32, [4, 8]).unwrap(),
            ),
            (
                "sin".to_string(),
                Tensor::zeros(DType::F32, [4, 8]).unwrap(),
            ),
        ]
    };
    assert!(session.run(feeds([0, 3])).is_ok());
    for p in [[0, 4], [-1, 0]] {
        let err = session.run(feeds(p)).map(|_| ()).unwrap_err().to_string();
        assert!(
            err.contains("'rope'") && err.contains("out of range"),
            "{err}"
        );
    }
    // The same model with a second, packed-batching node.
    b.node(
        "RotaryEmbedding",
        "com.microsoft",
        "rope2",
        &["x", "pos", "cos", "sin"],
        &["y2"],
        vec![attr::int("is_packed_batching", 1)],
    );
    b.save(&path, None).unwrap();
    let err = load_error(&path);
    assert!(
        err.contains("rope2") && err.contains("is_packed_batching"),
        "{err}"
    );
}
