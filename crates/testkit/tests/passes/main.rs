//! The graph passes that run nodes (constant folding, rotary and attention fusion) with the
//! native evaluator, on minimal graphs and on the optimum-style fixture: what matches is
//! rewritten into values equal to the original's, and near-misses are left alone with a
//! reason. The encoder passes (int8 products, the erf GELU, self-attention) are in
//! `encoder.rs`.

mod encoder;

use std::collections::BTreeMap;

use oxgen_exec::{ExecOptions, NativeSession, PassOptions, optimize};
use oxgen_graph::ops::{BinaryOp, Op};
use oxgen_graph::{Graph, Node, ValueId, ValueInfo, ValueKind};
use oxgen_onnx::writer::{Dim, ModelBuilder, attr};
use oxgen_runtime::{IoSpec, KvTemplates, LmContract, Session};
use oxgen_tensor::{DType, Tensor};
use oxgen_testkit::fixtures::{FixtureConfig, Rng, write_package};
use oxgen_testkit::optimum;

fn graph(b: &ModelBuilder) -> Graph {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.onnx");
    b.save(&path, None).unwrap();
    Graph::from_model(&oxgen_onnx::Model::load(&path).unwrap()).unwrap()
}

fn op_types(g: &Graph) -> Vec<String> {
    g.nodes.iter().map(|n| n.op_type.clone()).collect()
}

fn passes(context_length: Option<usize>) -> PassOptions {
    PassOptions {
        enabled: true,
        context_length,
        ..Default::default()
    }
}

fn run(g: Graph, inputs: &[(&str, Tensor)]) -> Vec<Tensor> {
    run_on(g, inputs, 1)
}

fn run_on(g: Graph, inputs: &[(&str, Tensor)], threads: usize) -> Vec<Tensor> {
    let mut s = NativeSession::new(
        g,
        &ExecOptions {
            threads,
            ..Default::default()
        },
    );
    let inputs = inputs
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect();
    s.run(inputs).unwrap().into_iter().map(|(_, t)| t).collect()
}

fn random(dims: &[usize], seed: u64) -> Tensor {
    let mut rng = Rng::new(seed);
    let v: Vec<f32> = (0..dims.iter().product::<usize>())
        .map(|_| rng.uniform())
        .collect();
    Tensor::from_slice(dims, &v).unwrap()
}

/// Asserts two runs' outputs are the same f32 bits, shape by shape.
fn assert_same_bits(before: &[Tensor], after: &[Tensor], what: &str) {
    assert_eq!(before.len(), after.len());
    for (b, a) in before.iter().zip(after) {
        assert_eq!(b.dims(), a.dims());
        let (b, a) = (b.as_slice::<f32>().unwrap(), a.as_slice::<f32>().unwrap());
        assert!(
            b.iter().zip(a).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{what}"
        );
    }
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    let (a, b) = (a.as_slice::<f32>().unwrap(), b.as_slice::<f32>().unwrap());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn constant_subgraphs_fold_unless_they_would_grow_the_model() {
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 14);
    b.input("x", DType::F32, &[Dim::from("n"), Dim::Fixed(4)]);
    b.initializer("w", random(&[4, 3], 1));
    b.initializer("big", Tensor::from_slice([2], &[512i64, 512]).unwrap());
    b.node(
        "Transpose",
        "",
        "wt",
        &["w"],
        &["wt"],
        vec![attr::ints("perm", &[1, 0])],
    );
    b.node(
        "Transpose",
        "",
        "wtt",
        &["wt"],
        &["wtt"],
        vec![attr::ints("perm", &[1, 0])],
    );
    b.node("MatMul", "", "mm", &["x", "wtt"], &["y"], vec![]);
    // 1 MiB of zeros from 16 bytes: stays a node.
    b.node("ConstantOfShape", "", "zeros", &["big"], &["z"], vec![]);
    b.output("y", DType::F32, &[]);
    b.output("z", DType::F32, &[]);
    let g = graph(&b);
    let x = random(&[2, 4], 2);
    let before = run(g.clone(), &[("x", x.clone())]);
    let (g, report) = optimize(g, None, &passes(None));
    assert_eq!(report.folded, 2);
    assert_eq!(op_types(&g), ["MatMul", "ConstantOfShape"]);
    let after = run(g, &[("x", x)]);
    assert_eq!(max_diff(&before[0], &after[0]), 0.0);
}

/// A LoRA-input graph's branch over zero-rank defaults (`Add(x W, (x A) B)`, A `[4, 0]`, B
/// `[0, 3]`) goes, its readers reading the projection; one over a real rank stays.
#[test]
fn empty_lora_branches_are_removed_and_real_ones_kept() {
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 14);
    b.input("x", DType::F32, &[Dim::from("n"), Dim::Fixed(4)]);
    b.initializer("w", random(&[4, 3], 1));
    b.initializer("a0", Tensor::zeros(DType::F32, [4, 0]).unwrap());
    b.initializer("b0", Tensor::zeros(DType::F32, [0, 3]).unwrap());
    b.initializer("a1", random(&[4, 1], 2));
    b.initializer("b1", random(&[1, 3], 3));
    b.node("MatMul", "", "proj", &["x", "w"], &["y"], vec![]);
    for k in ["0", "1"] {
        let (a, bb) = (format!("a{k}"), format!("b{k}"));
        let (t, d, out) = (format!("t{k}"), format!("d{k}"), format!("out{k}"));
        b.node(
            "MatMul",
            "",
            &format!("lora_A{k}"),
            &["x", &a],
            &[&t],
            vec![],
        );
        b.node(
            "MatMul",
            "",
            &format!("lora_B{k}"),
            &[&t, &bb],
            &[&d],
            vec![],
        );
        b.node("Add", "", &format!("add{k}"), &["y", &d], &[&out], vec![]);
        b.node(
            "Relu",
            "",
            &format!("relu{k}"),
            &[&out],
            &[&format!("r{k}")],
            vec![],
        );
        b.output(&format!("r{k}"), DType::F32, &[]);
    }
    let g = graph(&b);
    let x = random(&[2, 4], 4);
    let before = run(g.clone(), &[("x", x.clone())]);
    let (g, report) = optimize(g, None, &passes(None));
    assert_eq!(report.lora_branches, 1);
    assert_eq!(
        op_types(&g),
        ["MatMul", "Relu", "MatMul", "MatMul", "Add", "Relu"]
    );
    let after = run(g, &[("x", x)]);
    assert_same_bits(&before, &after, "empty LoRA branch");
}

/// What the rotary test graph may get wrong.
#[derive(Clone, Copy, PartialEq)]
enum RotaryVariant {
    Exact,
    /// `Concat(Neg(x1), x2)`: not rotate_half.
    SwappedHalves,
    /// cos also depends on the rotated input.
    CosReadsX,
}

/// `y = x * cos + rotate_half(x) * sin` with cos/sin from `position_ids` as transformers
/// computes them; x is `[batch, 2, seq, 8]`.
fn rotary_graph(variant: RotaryVariant) -> ModelBuilder {
    let d = 8usize;
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 14);
    let (batch, seq) = (Dim::from("batch"), Dim::from("seq"));
    b.input(
        "x",
        DType::F32,
        &[batch.clone(), Dim::Fixed(2), seq.clone(), Dim::Fixed(d)],
    );
    b.input("position_ids", DType::I64, &[batch, seq]);
    let inv: Vec<f32> = (0..d / 2)
        .map(|i| 1.0 / 10_000f32.powf(2.0 * i as f32 / d as f32))
        .collect();
    b.initializer("inv_freq", Tensor::from_slice([1, d / 2, 1], &inv).unwrap());
    for (name, v) in [
        ("ax1", vec![1i64]),
        ("zero", vec![0]),
        ("half", vec![d as i64 / 2]),
        ("end", vec![i64::MAX]),
        ("last", vec![-1]),
    ] {
        b.initializer(name, Tensor::from_slice([v.len()], &v).unwrap());
    }
    b.node(
        "Unsqueeze",
        "",
        "",
        &["position_ids", "ax1"],
        &["p3"],
        vec![],
    );
    b.node("Cast", "", "", &["p3"], &["pf"], vec![attr::int("to", 1)]);
    b.node("MatMul", "", "", &["inv_freq", "pf"], &["freqs"], vec![]);
    b.node(
        "Transpose",
        "",
        "",
        &["freqs"],
        &["ft"],
        vec![attr::ints("perm", &[0, 2, 1])],
    );
    b.node(
        "Concat",
        "",
        "",
        &["ft", "ft"],
        &["emb"],
        vec![attr::int("axis", -1)],
    );
    let emb = if variant == RotaryVariant::CosReadsX {
        b.node(
            "ReduceMean",
            "",
            "",
            &["x"],
            &["xm"],
            vec![attr::int("keepdims", 0)],
        );
        b.node("Add", "", "", &["emb", "xm"], &["emb2"], vec![]);
        "emb2"
    } else {
        "emb"
    };
    b.node("Cos", "", "", &[emb], &["cos"], vec![]);
    b.node("Sin", "", "", &["emb"], &["sin"], vec![]);
    b.node("Unsqueeze", "", "", &["cos", "ax1"], &["cos4"], vec![]);
    b.node("Unsqueeze", "", "", &["sin", "ax1"], &["sin4"], vec![]);
    b.node(
        "Slice",
        "",
        "",
        &["x", "zero", "half", "last"],
        &["x1"],
        vec![],
    );
    b.node(
        "Slice",
        "",
        "",
        &["x", "half", "end", "last"],
        &["x2"],
        vec![],
    );
    let (negated, kept) = if variant == RotaryVariant::SwappedHalves {
        ("x1", "x2")
    } else {
        ("x2", "x1")
    };
    b.node("Neg", "", "", &[negated], &["neg"], vec![]);
    b.node(
        "Concat",
        "",
        "",
        &["neg", kept],
        &["rot"],
        vec![attr::int("axis", -1)],
    );
    b.node("Mul", "", "", &["x", "cos4"], &["a"], vec![]);
    b.node("Mul", "", "", &["sin4", "rot"], &["b"], vec![]);
    b.node("Add", "", "", &["a", "b"], &["y"], vec![]);
    b.output("y", DType::F32, &[]);
    b
}

#[test]
fn rotary_spelled_out_becomes_rotary_embedding_with_equal_values() {
    let g = graph(&rotary_graph(RotaryVariant::Exact));
    let x = random(&[1, 2, 5, 8], 3);
    let pos = Tensor::from_slice([1, 5], &[3i64, 4, 5, 6, 7]).unwrap();
    let before = run(
        g.clone(),
        &[("x", x.clone()), ("position_ids", pos.clone())],
    );
    let (fused, report) = optimize(g, None, &passes(Some(32)));
    assert_eq!(report.rotaries, 1, "{report:?}");
    assert_eq!(op_types(&fused), ["RotaryEmbedding"]);
    let after = run(fused, &[("x", x), ("position_ids", pos)]);
    let diff = max_diff(&before[0], &after[0]);
    assert!(diff <= 1e-6, "{diff:e}");
}

#[test]
fn rotary_near_misses_stay_spelled_out() {
    for (variant, context_length, reason) in [
        (RotaryVariant::Exact, None, None),
        (RotaryVariant::SwappedHalves, Some(32), None),
        (
            RotaryVariant::CosReadsX,
            Some(32),
            Some("more than one graph input"),
        ),
    ] {
        let g = graph(&rotary_graph(variant));
        let (after, report) = optimize(g, None, &passes(context_length));
        assert_eq!(report.rotaries, 0);
        assert!(!op_types(&after).contains(&"RotaryEmbedding".to_string()));
        if let Some(reason) = reason {
            assert!(
                report.skipped.iter().any(|s| s.contains(reason)),
                "{:?}",
                report.skipped
            );
        }
    }
}

fn contract(g: &Graph) -> LmContract {
    let spec = |id: &ValueId| {
        let v = g.value(*id);
        IoSpec {
            name: v.name.clone(),
            dtype: v.dtype,
            dims: v.dims.clone(),
        }
    };
    let inputs: Vec<IoSpec> = g.inputs.iter().map(spec).collect();
    let outputs: Vec<IoSpec> = g.outputs.iter().map(spec).collect();
    LmContract::from_io(&inputs, &outputs, &KvTemplates::default()).unwrap()
}

fn optimum_graph(cfg: &FixtureConfig) -> Graph {
    graph(&optimum::build_model(cfg))
}

fn histogram(g: &Graph) -> BTreeMap<String, usize> {
    let mut h = BTreeMap::new();
    for t in op_types(g) {
        *h.entry(t).or_insert(0) += 1;
    }
    h
}

#[test]
fn attention_with_a_non_causal_mask_is_left_alone() {
    let cfg = FixtureConfig::default();
    let mut g = optimum_graph(&cfg);
    // `keys > cache_position` masks the future; `<` masks the past instead.
    let greater = g
        .nodes
        .iter_mut()
        .find(|n| n.op_type == "Greater")
        .expect("the fixture's mask compares key and query positions");
    greater.op = Op::Binary(BinaryOp::Less);
    let lm = contract(&g);
    let (after, report) = optimize(g, Some(&lm), &passes(Some(cfg.context)));
    assert_eq!(report.attentions, 0);
    assert_eq!(report.skipped.len(), cfg.layers, "{:?}", report.skipped);
    assert!(
        report.skipped[0].contains("a causal mask gives"),
        "{}",
        report.skipped[0]
    );
    let h = histogram(&after);
    assert_eq!(h.get("Softmax"), Some(&cfg.layers));
    assert_eq!(h.get("GroupQueryAttention"), None);
}

#[test]
fn attention_whose_kv_is_read_elsewhere_keeps_its_concat() {
    let cfg = FixtureConfig::default();
    let mut g = optimum_graph(&cfg);
    // A second reader of layer 0's concatenated key: it would see the in-place buffer.
    let present = g.find("present.0.key").unwrap();
    let extra = ValueId(g.values.len());
    g.values.push(ValueInfo {
        name: "extra".into(),
        kind: ValueKind::Node,
        dtype: Some(DType::F32),
        dims: None,
    });
    let mut node: Node = g.nodes[0].clone();
    node.name = "extra_reader".into();
    node.op_type = "Identity".into();
    node.op = Op::Identity;
    node.inputs = vec![Some(present)];
    node.outputs = vec![Some(extra)];
    g.nodes.push(node);
    g.outputs.push(extra);
    let lm = contract(&g);
    let (after, report) = optimize(g, Some(&lm), &passes(Some(cfg.context)));
    assert_eq!(report.attentions, cfg.layers - 1);
    assert!(
        report
            .skipped
            .iter()
            .any(|s| s.contains("reads the concatenated KV")),
        "{:?}",
        report.skipped
    );
    let h = histogram(&after);
    assert_eq!(h.get("GroupQueryAttention"), Some(&(cfg.layers - 1)));
    assert_eq!(h.get("Softmax"), Some(&1));
}

#[test]
fn a_genai_graph_is_already_fused_and_only_its_projections_and_silu_are_joined() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = FixtureConfig::default();
    write_package(dir.path(), &cfg).unwrap();
    let m = oxgen_onnx::Model::load(dir.path().join("model.onnx")).unwrap();
    let g = Graph::from_model(&m).unwrap();
    let lm = contract(&g);
    let before = histogram(&g);
    let (after, report) = optimize(g, Some(&lm), &passes(Some(128)));
    assert_eq!(
        (
            report.folded,
            report.rms_norms,
            report.skip_norms,
            report.rotaries,
            report.attentions
        ),
        (0, 0, 0, 0, 0)
    );
    // Per layer: Q, K, V into one group, gate and up into another, the gated SiLU into one
    // op, and that op with the gate and up group into one.
    assert_eq!(
        (report.matmul_groups, report.silu_muls, report.glus),
        (2 * cfg.layers, cfg.layers, cfg.layers)
    );
    let mut after = histogram(&after);
    assert_eq!(after.remove("MatMulNBitsGroup"), Some(cfg.layers));
    assert_eq!(after.remove("MatMulNBitsGlu"), Some(cfg.layers));
    *after.entry("MatMulNBits".into()).or_default() += 5 * cfg.layers;
    *after.entry("Sigmoid".into()).or_default() += cfg.layers;
    *after.entry("Mul".into()).or_default() += 2 * cfg.layers;
    assert_eq!(after, before);
}

/// `MatMulNBits` attributes for an `n × k` 4-bit matrix in blocks of 32.
fn nbits_attrs(n: usize, k: usize, accuracy_level: i64) -> Vec<oxgen_onnx::proto::AttributeProto> {
    vec![
        attr::int("K", k as i64),
        attr::int("N", n as i64),
        attr::int("bits", 4),
        attr::int("block_size", 32),
        attr::int("accuracy_level", accuracy_level),
    ]
}

#[test]
fn matmul_nbits_reading_one_input_are_grouped_with_the_same_bits() {
    let k = 96;
    let mut rng = Rng::new(5);
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 14);
    b.opset("com.microsoft", 1);
    b.input("x", DType::F32, &[Dim::from("n"), Dim::Fixed(k)]);
    b.input("other", DType::F32, &[Dim::from("n"), Dim::Fixed(k)]);
    // Three projections of x (one with zero points, which puts it in its own group with the
    // fourth), and one of another input.
    let widths = [40, 8, 24, 16, 32];
    for (i, &n) in widths.iter().enumerate() {
        let codes = Tensor::from_slice([n, k / 32, 16], &rng.bytes(n * k / 2)).unwrap();
        let scales: Vec<f32> = (0..n * k / 32)
            .map(|_| 0.01 + 0.01 * rng.uniform())
            .collect();
        b.initializer(&format!("b{i}"), codes);
        b.initializer(
            &format!("s{i}"),
            Tensor::from_slice([n * k / 32], &scales).unwrap(),
        );
        let (b_name, s_name) = (format!("b{i}"), format!("s{i}"));
        let mut inputs = vec![if i == 4 { "other" } else { "x" }, &b_name, &s_name];
        let z_name = format!("z{i}");
        if (2..4).contains(&i) {
            let zp = Tensor::from_slice(
                [n * (k / 32).div_ceil(2)],
                &rng.bytes(n * (k / 32).div_ceil(2)),
            )
            .unwrap();
            b.initializer(&z_name, zp);
            inputs.push(&z_name);
        }
        let out = format!("y{i}");
        b.node(
            "MatMulNBits",
            "com.microsoft",
            &format!("mm{i}"),
            &inputs,
            &[&out],
            nbits_attrs(n, k, 4),
        );
        b.output(&out, DType::F32, &[]);
    }
    let g = graph(&b);
    let x = random(&[3, k], 6);
    let other = random(&[3, k], 7);
    let feeds = [("x", x), ("other", other)];
    let before = run(g.clone(), &feeds);
    let (g, report) = optimize(g, None, &passes(None));
    assert_eq!(report.matmul_groups, 2, "{report:?}");
    let h = histogram(&g);
    assert_eq!(
        (h.get("MatMulNBitsGroup"), h.get("MatMulNBits")),
        (Some(&2), Some(&1))
    );
    let after = run(g, &feeds);
    assert_same_bits(&before, &after, "a grouped output differs from its node's");
}

#[test]
fn gated_silu_becomes_one_op_with_the_same_bits_unless_its_parts_are_read_elsewhere() {
    // y = (g * sigmoid(g)) * u, operands in both orders; the second copy's sigmoid is also
    // a graph output, so it stays spelled out.
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 14);
    for name in ["g", "u"] {
        b.input(name, DType::F32, &[Dim::from("n"), Dim::Fixed(40)]);
    }
    b.node("Sigmoid", "", "sig", &["g"], &["s"], vec![]);
    b.node("Mul", "", "silu", &["s", "g"], &["a"], vec![]);
    b.node("Mul", "", "gated", &["u", "a"], &["y"], vec![]);
    b.node("Sigmoid", "", "sig2", &["g"], &["s2"], vec![]);
    b.node("Mul", "", "silu2", &["g", "s2"], &["a2"], vec![]);
    b.node("Mul", "", "gated2", &["a2", "u"], &["y2"], vec![]);
    for name in ["y", "y2", "s2"] {
        b.output(name, DType::F32, &[]);
    }
    let g = graph(&b);
    // Values around 0 and far out, where the sigmoid saturates.
    let feeds = [("g", random(&[5, 40], 8)), ("u", random(&[5, 40], 9))];
    let scaled: Vec<f32> = feeds[0]
        .1
        .as_slice::<f32>()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, v)| v * (1 + i % 30) as f32)
        .collect();
    let feeds = [
        ("g", Tensor::from_slice([5, 40], &scaled).unwrap()),
        feeds[1].clone(),
    ];
    let before = run(g.clone(), &feeds);
    let (g, report) = optimize(g, None, &passes(None));
    assert_eq!(report.silu_muls, 1, "{report:?}");
    let h = histogram(&g);
    assert_eq!(
        (h.get("SiluMul"), h.get("Sigmoid"), h.get("Mul")),
        (Some(&1), Some(&1), Some(&2))
    );
    let after = run(g, &feeds);
    assert_same_bits(&before, &after, "the fused gated SiLU differs from its ops");
}

#[test]
fn gate_and_up_projections_with_their_gated_silu_become_one_op_with_the_same_bits() {
    // y = silu(x·Gᵀ) * (x·Uᵀ) with 4-bit G and U at accuracy_level 4 (int8 activations, the
    // packed kernel) and float zero points, as a GGUF Q4_1 import writes them.
    let (k, n) = (96, 40);
    let mut rng = Rng::new(12);
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 14);
    b.opset("com.microsoft", 1);
    b.input("x", DType::F32, &[Dim::from("n"), Dim::Fixed(k)]);
    for name in ["gate", "up"] {
        let codes = Tensor::from_slice([n, k / 32, 16], &rng.bytes(n * k / 2)).unwrap();
        let scales: Vec<f32> = (0..n * k / 32)
            .map(|_| 0.02 + 0.02 * rng.uniform())
            .collect();
        let zp: Vec<f32> = (0..n * k / 32).map(|_| 8.0 + 4.0 * rng.uniform()).collect();
        b.initializer(&format!("{name}_b"), codes);
        b.initializer(
            &format!("{name}_s"),
            Tensor::from_slice([n * k / 32], &scales).unwrap(),
        );
        b.initializer(
            &format!("{name}_z"),
            Tensor::from_slice([n * k / 32], &zp).unwrap(),
        );
        b.node(
            "MatMulNBits",
            "com.microsoft",
            name,
            &[
                "x",
                &format!("{name}_b"),
                &format!("{name}_s"),
                &format!("{name}_z"),
            ],
            &[&format!("{name}_y")],
            nbits_attrs(n, k, 4),
        );
    }
    b.node("Sigmoid", "", "sig", &["gate_y"], &["s"], vec![]);
    b.node("Mul", "", "silu", &["gate_y", "s"], &["a"], vec![]);
    b.node("Mul", "", "gated", &["a", "up_y"], &["y"], vec![]);
    b.output("y", DType::F32, &[]);
    let g = graph(&b);
    // Rows wide enough that the sigmoid sees both signs and its tails.
    let x: Vec<f32> = random(&[5, k], 13)
        .as_slice::<f32>()
        .unwrap()
        .iter()
        .map(|v| 6.0 * v)
        .collect();
    let feeds = [("x", Tensor::from_slice([5, k], &x).unwrap())];
    let (fused, report) = optimize(g.clone(), None, &passes(None));
    assert_eq!(
        (report.matmul_groups, report.silu_muls, report.glus),
        (1, 1, 1)
    );
    assert_eq!(op_types(&fused), ["MatMulNBitsGlu"]);
    for exact in [false, true] {
        for threads in [1, 2] {
            let opts = ExecOptions { threads, exact };
            let run_with = |g: Graph| {
                let mut s = NativeSession::new(g, &opts);
                let inputs = feeds
                    .iter()
                    .map(|(n, t)| (n.to_string(), t.clone()))
                    .collect();
                s.run(inputs)
                    .unwrap()
                    .into_iter()
                    .map(|(_, t)| t)
                    .collect::<Vec<_>>()
            };
            assert_same_bits(
                &run_with(g.clone()),
                &run_with(fused.clone()),
                &format!("the fused gated MLP differs (exact {exact}, {threads} threads)"),
            );
        }
    }
}
