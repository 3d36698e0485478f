//! The pure-IR passes on minimal graphs: shape facts, folding of shape arithmetic, RMSNorm and
//! skip-norm fusion; and that a pattern that does not match exactly leaves the graph alone.
//! (Passes that run nodes are tested with the native evaluator in oxgen-testkit.)

use oxgen_graph::passes::shapes::{Facts, Sym};
use oxgen_graph::passes::{Evaluator, fold, norm};
use oxgen_graph::{Graph, Op, ValueId};
use oxgen_onnx::writer::{Dim, ModelBuilder, attr};
use oxgen_tensor::{DType, Tensor};

/// An evaluator that runs nothing: only what the facts prove folds.
struct NoEval;

impl Evaluator for NoEval {
    fn evaluate(
        &mut self,
        _: &Graph,
        _: &[(ValueId, Tensor)],
        _: &[ValueId],
    ) -> Result<Vec<Tensor>, String> {
        Err("not running nodes in this test".into())
    }
}

fn builder() -> ModelBuilder {
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 14);
    b.input(
        "x",
        DType::F32,
        &[Dim::from("batch"), Dim::from("seq"), Dim::Fixed(64)],
    );
    b
}

fn graph(b: &ModelBuilder) -> Graph {
    let model =
        oxgen_onnx::Model::from_bytes(prost::Message::encode_to_vec(&b.build()).into(), None)
            .unwrap();
    Graph::from_model(&model).unwrap()
}

fn ints(b: &mut ModelBuilder, name: &str, v: &[i64]) {
    b.initializer(name, Tensor::from_slice([v.len()], v).unwrap());
}

fn op_types(g: &Graph) -> Vec<&str> {
    g.nodes.iter().map(|n| n.op_type.as_str()).collect()
}

/// `Reshape(x, Concat(Shape(x)[:-1], [-1, 16]))` and `Shape(x)[2] / 2`.
fn shape_arithmetic() -> ModelBuilder {
    let mut b = builder();
    ints(&mut b, "zero", &[0]);
    ints(&mut b, "minus_one", &[-1]);
    ints(&mut b, "tail", &[-1, 16]);
    b.initializer("two", Tensor::scalar(2i64));
    b.initializer("idx", Tensor::scalar(2i64));
    b.node("Shape", "", "shape", &["x"], &["shape"], vec![]);
    b.node(
        "Slice",
        "",
        "lead",
        &["shape", "zero", "minus_one", "zero"],
        &["lead"],
        vec![],
    );
    b.node(
        "Concat",
        "",
        "target",
        &["lead", "tail"],
        &["target"],
        vec![attr::int("axis", 0)],
    );
    b.node("Reshape", "", "split", &["x", "target"], &["split"], vec![]);
    b.node(
        "Gather",
        "",
        "width",
        &["shape", "idx"],
        &["width"],
        vec![attr::int("axis", 0)],
    );
    b.node("Div", "", "half", &["width", "two"], &["half"], vec![]);
    b.output("split", DType::F32, &[]);
    b.output("half", DType::I64, &[]);
    b
}

#[test]
fn shape_facts_carry_symbols_through_shape_arithmetic() {
    let g = graph(&shape_arithmetic());
    let f = Facts::infer(&g);
    let x = f.dims(g.find("x").unwrap()).unwrap().to_vec();
    let (batch, seq) = (x[0], x[1]);
    assert!(matches!(batch, Sym::Var(_)) && batch != seq);
    assert_eq!(
        f.data(g.find("lead").unwrap()).unwrap(),
        &[batch, seq],
        "Shape(x)[:-1]"
    );
    assert_eq!(
        f.dims(g.find("split").unwrap()).unwrap(),
        &[batch, seq, Sym::Known(4), Sym::Known(16)],
        "the -1 is solved by cancelling batch and seq"
    );
    assert_eq!(f.known_data(g.find("half").unwrap()), Some(vec![32]));
}

#[test]
fn shape_arithmetic_over_fixed_dims_folds_and_dynamic_dims_stay() {
    let mut g = graph(&shape_arithmetic());
    let folded = fold::run(&mut g, &mut NoEval);
    // Shape(x)[2] / 2 is 32 whatever the sequence: Gather and Div fold; the reshape target
    // needs batch and seq, so Shape, Slice, Concat and Reshape stay.
    assert_eq!(folded, 2);
    assert_eq!(op_types(&g), ["Shape", "Slice", "Concat", "Reshape"]);
    let half = g.find("half").unwrap();
    assert_eq!(g.initializers[&half].as_slice::<i64>().unwrap(), &[32]);
}

#[test]
fn constant_nodes_become_initializers() {
    let mut b = builder();
    b.node(
        "Constant",
        "",
        "c",
        &[],
        &["c"],
        vec![attr::tensor("value", &Tensor::scalar(2.0f32))],
    );
    b.node("Mul", "", "m", &["x", "c"], &["y"], vec![]);
    b.output("y", DType::F32, &[]);
    let mut g = graph(&b);
    assert_eq!(fold::run(&mut g, &mut NoEval), 1);
    assert_eq!(op_types(&g), ["Mul"]);
    assert!(g.initializers.contains_key(&g.find("c").unwrap()));
}

/// What the RMSNorm pattern may vary.
#[derive(Clone, Copy)]
struct Rms {
    exponent: f32,
    axis: i64,
    divide: bool,
    casts: bool,
    constant_weight: bool,
}

const RMS: Rms = Rms {
    exponent: 2.0,
    axis: -1,
    divide: false,
    casts: false,
    constant_weight: true,
};

/// `LlamaRMSNorm(x)` as torch exports it, into `y`.
fn rms_norm(r: Rms) -> ModelBuilder {
    let mut b = builder();
    let w: Vec<f32> = (0..64).map(|i| 1.0 + i as f32 / 64.0).collect();
    if r.constant_weight {
        b.initializer("w", Tensor::from_slice([64], &w).unwrap());
    } else {
        b.input("w", DType::F32, &[Dim::Fixed(64)]);
    }
    b.initializer("p", Tensor::scalar(r.exponent));
    b.initializer("eps", Tensor::scalar(1e-6f32));
    b.initializer("one", Tensor::scalar(1.0f32));
    let to_f32 = || vec![attr::int("to", 1)];
    let xf = if r.casts {
        b.node("Cast", "", "xf", &["x"], &["xf"], to_f32());
        "xf"
    } else {
        "x"
    };
    b.node("Pow", "", "pow", &[xf, "p"], &["sq"], vec![]);
    b.node(
        "ReduceMean",
        "",
        "mean",
        &["sq"],
        &["mean"],
        vec![attr::ints("axes", &[r.axis]), attr::int("keepdims", 1)],
    );
    b.node("Add", "", "add", &["eps", "mean"], &["var"], vec![]);
    b.node("Sqrt", "", "sqrt", &["var"], &["std"], vec![]);
    if r.divide {
        b.node("Div", "", "inv", &["one", "std"], &["inv"], vec![]);
    } else {
        b.node("Reciprocal", "", "inv", &["std"], &["inv"], vec![]);
    }
    b.node("Mul", "", "normed", &["inv", xf], &["normed"], vec![]);
    let normed = if r.casts {
        b.node("Cast", "", "back", &["normed"], &["back"], to_f32());
        "back"
    } else {
        "normed"
    };
    b.node("Mul", "", "scaled", &[normed, "w"], &["y"], vec![]);
    b.output("y", DType::F32, &[]);
    b
}

#[test]
fn rms_norm_spelled_out_becomes_one_node() {
    for variant in [
        RMS,
        Rms {
            divide: true,
            ..RMS
        },
        Rms { casts: true, ..RMS },
        Rms { axis: 2, ..RMS },
    ] {
        let mut g = graph(&rms_norm(variant));
        assert_eq!(norm::fuse_rms_norm(&mut g), 1);
        assert_eq!(op_types(&g), ["SimplifiedLayerNormalization"]);
        let node = &g.nodes[0];
        let Op::Norm(n) = &node.op else {
            panic!("{:?}", node.op)
        };
        assert_eq!((n.axis, n.epsilon), (-1, 1e-6));
        assert_eq!(node.inputs, [g.find("x"), g.find("w")]);
        assert_eq!(node.outputs, [g.find("y")]);
    }
}

#[test]
fn rms_norm_variants_that_are_not_rms_norm_stay() {
    for variant in [
        Rms {
            exponent: 3.0,
            ..RMS
        },
        Rms { axis: 1, ..RMS },
        Rms {
            constant_weight: false,
            ..RMS
        },
    ] {
        let mut g = graph(&rms_norm(variant));
        let before = op_types(&g).join(",");
        assert_eq!(norm::fuse_rms_norm(&mut g), 0);
        assert_eq!(op_types(&g).join(","), before);
    }
}

/// `h = x + r; y = RMSNorm(h); z = h + y` (the residual stream goes on).
fn residual_norm(skip_dims: &[Dim]) -> ModelBuilder {
    let mut b = builder();
    b.input("r", DType::F32, skip_dims);
    b.initializer("w", Tensor::from_slice([64], &[1.0f32; 64]).unwrap());
    b.node("Add", "", "residual", &["x", "r"], &["h"], vec![]);
    b.node(
        "SimplifiedLayerNormalization",
        "",
        "norm",
        &["h", "w"],
        &["y"],
        vec![attr::float("epsilon", 1e-5)],
    );
    b.node("Add", "", "next", &["h", "y"], &["z"], vec![]);
    b.output("z", DType::F32, &[]);
    b
}

#[test]
fn a_residual_add_folds_into_a_skip_norm_that_returns_the_sum() {
    let mut g = graph(&residual_norm(&[
        Dim::from("batch"),
        Dim::from("seq"),
        Dim::Fixed(64),
    ]));
    assert_eq!(norm::fuse_skip_norm(&mut g), 1);
    assert_eq!(op_types(&g), ["SkipSimplifiedLayerNormalization", "Add"]);
    let skip = &g.nodes[0];
    assert_eq!(skip.inputs, [g.find("x"), g.find("r"), g.find("w")]);
    assert_eq!(skip.outputs, [g.find("y"), None, None, g.find("h")]);
}

#[test]
fn a_broadcasting_residual_add_stays() {
    let mut g = graph(&residual_norm(&[Dim::Fixed(64)]));
    assert_eq!(norm::fuse_skip_norm(&mut g), 0);
    assert_eq!(op_types(&g), ["Add", "SimplifiedLayerNormalization", "Add"]);
}
