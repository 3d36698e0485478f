//! Everything the registry cannot build fails at load, naming the node, op type, domain and
//! opset, never at run time.

use oxgen_graph::{Graph, GraphError};
use oxgen_onnx::proto::AttributeProto;
use oxgen_onnx::writer::{Dim, ModelBuilder, attr};
use oxgen_tensor::DType;

struct N<'a> {
    op: &'a str,
    domain: &'a str,
    name: &'a str,
    inputs: &'a [&'a str],
    outputs: &'a [&'a str],
    attrs: Vec<AttributeProto>,
}

fn load(opset: i64, nodes: Vec<N>) -> Result<Graph, GraphError> {
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", opset).opset("com.microsoft", 1);
    b.input("x", DType::F32, &[Dim::Fixed(2), Dim::Fixed(3)]);
    b.input("s", DType::F32, &[Dim::Fixed(3)]);
    for n in &nodes {
        b.node(n.op, n.domain, n.name, n.inputs, n.outputs, n.attrs.clone());
    }
    b.output("y", DType::F32, &[]);
    let model =
        oxgen_onnx::Model::from_bytes(prost::Message::encode_to_vec(&b.build()).into(), None)
            .unwrap();
    Graph::from_model(&model)
}

fn node<'a>(op: &'a str, name: &'a str, inputs: &'a [&'a str]) -> N<'a> {
    N {
        op,
        domain: "",
        name,
        inputs,
        outputs: &["y"],
        attrs: vec![],
    }
}

fn err(opset: i64, nodes: Vec<N>) -> String {
    load(opset, nodes)
        .expect_err("the model must not load")
        .to_string()
}

#[test]
fn a_supported_graph_loads_in_topological_order() {
    let g = load(
        21,
        vec![
            node("Relu", "second", &["h"]),
            N {
                outputs: &["h"],
                ..node("Add", "first", &["x", "s"])
            },
        ],
    )
    .unwrap();
    let names: Vec<&str> = g.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["first", "second"]);
}

#[test]
fn unknown_op_names_node_domain_and_opset() {
    let e = err(
        21,
        vec![N {
            domain: "com.microsoft",
            ..node("FancyAttention", "attn_3", &["x"])
        }],
    );
    assert!(
        e.contains("node 'attn_3' (com.microsoft::FancyAttention, opset 1)")
            && e.contains("not supported"),
        "{e}"
    );
}

#[test]
fn unsupported_opset_lists_the_supported_ones() {
    let e = err(18, vec![node("Gelu", "g", &["x"])]);
    assert!(
        e.contains("node 'g' (ai.onnx::Gelu, opset 18)")
            && e.contains("opset 18 is not supported")
            && e.contains("20+"),
        "{e}"
    );
}

#[test]
fn unknown_attribute_is_rejected() {
    let e = err(
        21,
        vec![N {
            attrs: vec![attr::int("future_flag", 1)],
            ..node("Relu", "r", &["x"])
        }],
    );
    assert!(
        e.contains("node 'r'") && e.contains("attribute 'future_flag'"),
        "{e}"
    );
}

#[test]
fn bad_attribute_value_is_rejected() {
    let e = err(
        21,
        vec![N {
            attrs: vec![attr::string("approximate", "fast")],
            ..node("Gelu", "g", &["x"])
        }],
    );
    assert!(
        e.contains("attribute 'approximate'") && e.contains("\"fast\""),
        "{e}"
    );
    let e = err(
        21,
        vec![N {
            attrs: vec![attr::float("axis", 1.0)],
            ..node("Softmax", "sm", &["x"])
        }],
    );
    assert!(e.contains("expected type INT, found FLOAT"), "{e}");
}

#[test]
fn unsupported_optional_input_is_rejected() {
    let e = err(23, vec![node("RMSNormalization", "norm", &["x", "s", "s"])]);
    assert!(
        e.contains("node 'norm'") && e.contains("optional input 2"),
        "{e}"
    );
}

#[test]
fn missing_required_input_and_undefined_values() {
    let e = err(21, vec![node("Add", "a", &["x"])]);
    assert!(e.contains("takes 2..=2 inputs, got 1"), "{e}");
    let e = err(21, vec![node("Add", "a", &["x", "nowhere"])]);
    assert!(e.contains("input 'nowhere' is not produced"), "{e}");
}

#[test]
fn cycles_and_duplicate_outputs_are_rejected() {
    let e = err(
        21,
        vec![
            N {
                outputs: &["h"],
                ..node("Add", "a", &["x", "y"])
            },
            node("Relu", "b", &["h"]),
        ],
    );
    assert!(e.contains("cycle"), "{e}");
    let e = err(
        21,
        vec![node("Relu", "a", &["x"]), node("Relu", "b", &["x"])],
    );
    assert!(e.contains("'y' is produced twice"), "{e}");
}
