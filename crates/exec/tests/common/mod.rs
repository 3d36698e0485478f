//! Shared helpers for the session-level op tests: build a one-node model and run it.

#![allow(dead_code)]

use oxgen_exec::{ExecOptions, NativeSession};
use oxgen_graph::Graph;
use oxgen_onnx::proto::AttributeProto;
use oxgen_onnx::writer::{Dim, ModelBuilder};
use oxgen_runtime::Session;
use oxgen_tensor::{DType, Element, Tensor};

/// Runs one `op_type` node at `opset` on `inputs` (named i0, i1, ...; `None` leaves an optional
/// input empty) with `threads` threads and returns its `n_out` outputs, or the error message.
pub fn run_on(
    threads: usize,
    op_type: &str,
    opset: i64,
    inputs: &[Option<Tensor>],
    attrs: Vec<AttributeProto>,
    n_out: usize,
) -> Result<Vec<Tensor>, String> {
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", opset);
    let mut names = Vec::new();
    let mut feeds = Vec::new();
    for (i, t) in inputs.iter().enumerate() {
        match t {
            Some(t) => {
                let name = format!("i{i}");
                let dims: Vec<Dim> = t.dims().iter().map(|&d| Dim::Fixed(d)).collect();
                b.input(&name, t.dtype(), &dims);
                feeds.push((name.clone(), t.clone()));
                names.push(name);
            }
            None => names.push(String::new()),
        }
    }
    let outs: Vec<String> = (0..n_out).map(|i| format!("o{i}")).collect();
    for o in &outs {
        b.output(o, inputs[0].as_ref().map_or(DType::F32, |t| t.dtype()), &[]);
    }
    let in_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let out_refs: Vec<&str> = outs.iter().map(String::as_str).collect();
    b.node(op_type, "", "the_node", &in_refs, &out_refs, attrs);
    let bytes = prost::Message::encode_to_vec(&b.build());
    let model = oxgen_onnx::Model::from_bytes(bytes.into(), None).map_err(|e| e.to_string())?;
    let graph = Graph::from_model(&model).map_err(|e| e.to_string())?;
    let mut s = NativeSession::new(
        graph,
        &ExecOptions {
            threads,
            ..Default::default()
        },
    );
    let out = s.run(feeds).map_err(|e| e.to_string())?;
    Ok(out.into_iter().map(|(_, t)| t).collect())
}

pub fn run(
    op_type: &str,
    opset: i64,
    inputs: &[Option<Tensor>],
    attrs: Vec<AttributeProto>,
    n_out: usize,
) -> Result<Vec<Tensor>, String> {
    run_on(1, op_type, opset, inputs, attrs, n_out)
}

pub fn t<T: Element>(dims: &[usize], v: &[T]) -> Option<Tensor> {
    Some(Tensor::from_slice(dims, v).unwrap())
}

pub fn vals<T: Element>(t: &Tensor) -> Vec<T> {
    t.as_slice::<T>().unwrap().to_vec()
}

pub fn err(r: Result<Vec<Tensor>, String>) -> String {
    let e = r.expect_err("the op should fail");
    assert!(e.contains("the_node"), "error should name the node: {e}");
    e
}
