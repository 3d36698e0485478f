//! `If`, `Loop` and `Scan` against onnxruntime 1.32, with subgraphs that read values of the
//! graphs around them (an initializer, a graph input, a value of the enclosing branch) and
//! an `If` nested in a branch. Every case must match onnxruntime exactly: the arithmetic is
//! a few float adds and multiplies in the same order on both sides.
//!
//! Requires `OXGEN_PYTHON` (see `oxgen_testkit::ort_oracle`).

use oxgen_onnx::writer::{Dim, ModelBuilder, attr};
use oxgen_tensor::{DType, Tensor};
use oxgen_testkit::node_tests::native_session;
use oxgen_testkit::ort_oracle;

fn fixed(dims: &[usize]) -> Vec<Dim> {
    dims.iter().map(|&d| Dim::Fixed(d)).collect()
}

/// Runs `b` on both backends with `feeds` and asserts equal outputs.
fn same_as_ort(b: &ModelBuilder, feeds: Vec<(String, Tensor)>, what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.onnx");
    b.save(&path, None).unwrap();
    let ort = ort_oracle::run(&path, &feeds).unwrap();
    let ours = native_session(&path).unwrap().run(feeds).unwrap();
    assert_eq!(ours.len(), ort.len(), "{what}: output count");
    for ((name, t), o) in ours.iter().zip(&ort) {
        assert_eq!(t.dims(), o.dims(), "{what}: {name} shape");
        assert_eq!(
            t.as_bytes(),
            o.as_bytes(),
            "{what}: {name} differs from onnxruntime"
        );
    }
}

fn f32s(dims: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_slice(dims, v).unwrap()
}

/// `If(sum(x) > 0)`: then `t = x * w` and a nested `If(flag)` giving `-t` or `t + x`; else
/// `x - w`. The branches read the initializer `w`, the input `x`, the input `flag` and (the
/// nested ones) the then branch's own `t`.
#[test]
fn if_branches_read_enclosing_values_and_nest() {
    let v3 = fixed(&[3]);
    let mut inner_then = ModelBuilder::new("t");
    inner_then.node("Neg", "", "", &["t"], &["r1"], vec![]);
    inner_then.output("r1", DType::F32, &v3);
    let mut inner_else = ModelBuilder::new("t");
    inner_else.node("Add", "", "", &["t", "x"], &["r2"], vec![]);
    inner_else.output("r2", DType::F32, &v3);
    let mut then = ModelBuilder::new("t");
    then.node("Mul", "", "", &["x", "w"], &["t"], vec![]);
    then.node(
        "If",
        "",
        "inner",
        &["flag"],
        &["y_then"],
        vec![
            attr::graph("then_branch", inner_then.subgraph("inner_then")),
            attr::graph("else_branch", inner_else.subgraph("inner_else")),
        ],
    );
    then.output("y_then", DType::F32, &v3);
    let mut other = ModelBuilder::new("t");
    other.node("Sub", "", "", &["x", "w"], &["y_else"], vec![]);
    other.output("y_else", DType::F32, &v3);

    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 21);
    b.input("x", DType::F32, &v3);
    b.input("flag", DType::Bool, &[]);
    b.initializer("w", f32s(&[3], &[0.5, -2.0, 3.25]));
    b.initializer("zero", Tensor::scalar(0f32));
    b.node(
        "ReduceSum",
        "",
        "",
        &["x"],
        &["s"],
        vec![attr::int("keepdims", 0)],
    );
    b.node("Greater", "", "", &["s", "zero"], &["c"], vec![]);
    b.node(
        "If",
        "",
        "outer",
        &["c"],
        &["y"],
        vec![
            attr::graph("then_branch", then.subgraph("then")),
            attr::graph("else_branch", other.subgraph("else")),
        ],
    );
    b.output("y", DType::F32, &v3);
    for x in [[1.0f32, 2.0, -0.5], [-1.0, -2.0, 0.25]] {
        for flag in [true, false] {
            same_as_ort(
                &b,
                vec![
                    ("x".into(), f32s(&[3], &x)),
                    ("flag".into(), Tensor::from_bools([], &[flag]).unwrap()),
                ],
                &format!("x {x:?}, flag {flag}"),
            );
        }
    }
}

/// `Loop(M, cond)` carrying `acc` (from `x`): `acc += x * i`, stopping after M trips or
/// once `i >= 4`; scan output: `acc` after each trip. M = 0 gives an empty scan output.
#[test]
fn loop_carries_values_stacks_scan_outputs_and_stops_on_cond_or_count() {
    let v3 = fixed(&[3]);
    let mut body = ModelBuilder::new("t");
    body.input("i", DType::I64, &[]);
    body.input("cond_in", DType::Bool, &[]);
    body.input("acc_in", DType::F32, &v3);
    body.initializer("four", Tensor::scalar(4i64));
    body.node("Cast", "", "", &["i"], &["fi"], vec![attr::int("to", 1)]);
    body.node("Mul", "", "", &["x", "fi"], &["step"], vec![]);
    body.node("Add", "", "", &["acc_in", "step"], &["acc_out"], vec![]);
    body.node("Less", "", "", &["i", "four"], &["cond_out"], vec![]);
    body.node("Identity", "", "", &["acc_out"], &["scan"], vec![]);
    body.output("cond_out", DType::Bool, &[]);
    body.output("acc_out", DType::F32, &v3);
    body.output("scan", DType::F32, &v3);

    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 21);
    b.input("m", DType::I64, &[]);
    b.input("go", DType::Bool, &[]);
    b.input("x", DType::F32, &v3);
    b.node(
        "Loop",
        "",
        "loop",
        &["m", "go", "x"],
        &["acc", "scans"],
        vec![attr::graph("body", body.subgraph("body"))],
    );
    b.output("acc", DType::F32, &v3);
    b.output(
        "scans",
        DType::F32,
        &[Dim::Symbolic("n".into()), Dim::Fixed(3)],
    );
    for (m, go) in [(0i64, true), (3, true), (10, true), (10, false)] {
        same_as_ort(
            &b,
            vec![
                ("m".into(), Tensor::scalar(m)),
                ("go".into(), Tensor::from_bools([], &[go]).unwrap()),
                ("x".into(), f32s(&[3], &[0.5, 1.5, -2.0])),
            ],
            &format!("M {m}, cond {go}"),
        );
    }
}

/// `Scan` with a running-sum state, one input scanned along axis 0, another backwards along
/// axis 1, a scan output stacked backwards along axis 1, and a captured initializer.
#[test]
fn scan_walks_axes_both_ways() {
    let mut body = ModelBuilder::new("t");
    body.input("sum_in", DType::F32, &fixed(&[2]));
    body.input("a", DType::F32, &fixed(&[2]));
    body.input("b", DType::F32, &fixed(&[2]));
    body.node("Mul", "", "", &["b", "scale"], &["bs"], vec![]);
    body.node("Add", "", "", &["a", "bs"], &["ab"], vec![]);
    body.node("Add", "", "", &["sum_in", "ab"], &["sum_out"], vec![]);
    body.node("Identity", "", "", &["sum_out"], &["trace"], vec![]);
    body.output("sum_out", DType::F32, &fixed(&[2]));
    body.output("trace", DType::F32, &fixed(&[2]));

    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 21);
    b.input("init", DType::F32, &fixed(&[2]));
    b.input("a", DType::F32, &fixed(&[4, 2]));
    b.input("b", DType::F32, &fixed(&[2, 4]));
    b.initializer("scale", f32s(&[2], &[10.0, 100.0]));
    b.node(
        "Scan",
        "",
        "scan",
        &["init", "a", "b"],
        &["sum", "traces"],
        vec![
            attr::graph("body", body.subgraph("body")),
            attr::int("num_scan_inputs", 2),
            attr::ints("scan_input_axes", &[0, 1]),
            attr::ints("scan_input_directions", &[0, 1]),
            attr::ints("scan_output_axes", &[1]),
            attr::ints("scan_output_directions", &[1]),
        ],
    );
    b.output("sum", DType::F32, &fixed(&[2]));
    b.output("traces", DType::F32, &fixed(&[2, 4]));
    let a: Vec<f32> = (0..8).map(|k| k as f32 * 0.25).collect();
    let bb: Vec<f32> = (0..8).map(|k| k as f32 - 3.0).collect();
    same_as_ort(
        &b,
        vec![
            ("init".into(), f32s(&[2], &[1.0, -1.0])),
            ("a".into(), f32s(&[4, 2], &a)),
            ("b".into(), f32s(&[2, 4], &bb)),
        ],
        "scan",
    );
}
