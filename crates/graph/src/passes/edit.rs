//! Editing helpers the passes share: constants, new values and nodes, applying a batch of
//! rewrites, and removing dead nodes (who produces and reads each value: [`crate::Index`]).

use std::collections::{BTreeSet, HashSet};

use oxgen_tensor::{DType, Tensor};

use crate::ops::{BinaryOp, Op};
use crate::{Dim, Graph, Node, ValueId, ValueInfo, ValueKind};

pub(crate) use crate::Index;

/// Input `k` of `node`, when present.
pub(crate) fn input(node: &Node, k: usize) -> Option<ValueId> {
    node.inputs.get(k).copied().flatten()
}

/// Output 0 of `node`.
pub(crate) fn output(node: &Node) -> Option<ValueId> {
    node.outputs.first().copied().flatten()
}

/// The two operands of `node` when it is the binary `op`.
pub(crate) fn binary_operands(node: &Node, op: BinaryOp) -> Option<(ValueId, ValueId)> {
    match &node.op {
        Op::Binary(b) if *b == op => Some((input(node, 0)?, input(node, 1)?)),
        _ => None,
    }
}

/// `node`'s operand other than `v`, when `node` is the binary `op` and exactly one of its
/// operands is `v`.
pub(crate) fn other_operand(node: &Node, op: BinaryOp, v: ValueId) -> Option<ValueId> {
    match binary_operands(node, op)? {
        (a, b) if a == v && b != v => Some(b),
        (a, b) if b == v && a != v => Some(a),
        _ => None,
    }
}

/// The value of `v` when it is an initializer.
pub(crate) fn constant(graph: &Graph, v: ValueId) -> Option<&Tensor> {
    graph.initializers.get(&v)
}

/// A one-value float32 initializer.
pub(crate) fn scalar_f32(graph: &Graph, v: ValueId) -> Option<f32> {
    let t = constant(graph, v)?;
    (t.dtype() == DType::F32 && t.numel() == 1)
        .then(|| t.as_slice::<f32>().ok().map(|s| s[0]))
        .flatten()
}

/// A one-element float initializer (any float dtype) as `f64`.
pub(crate) fn scalar_f64(graph: &Graph, v: ValueId) -> Option<f64> {
    let t = constant(graph, v)?;
    if t.numel() != 1 {
        return None;
    }
    match t.dtype() {
        DType::F32 => t.as_slice::<f32>().ok().map(|s| f64::from(s[0])),
        DType::F64 => t.as_slice::<f64>().ok().map(|s| s[0]),
        DType::F16 => t
            .as_slice::<oxgen_tensor::f16>()
            .ok()
            .map(|s| f64::from(s[0].to_f32())),
        _ => None,
    }
}

/// An integer initializer's elements.
pub(crate) fn ints(graph: &Graph, v: ValueId) -> Option<Vec<i64>> {
    let t = constant(graph, v)?;
    match t.dtype() {
        DType::I64 => t.as_slice::<i64>().ok().map(<[i64]>::to_vec),
        DType::I32 => t
            .as_slice::<i32>()
            .ok()
            .map(|s| s.iter().map(|&x| i64::from(x)).collect()),
        _ => None,
    }
}

/// Adds a value named after `hint`, unique in the graph.
pub(crate) fn add_value(
    graph: &mut Graph,
    hint: &str,
    kind: ValueKind,
    dtype: Option<DType>,
    dims: Option<Vec<Dim>>,
) -> ValueId {
    let taken: HashSet<&str> = graph.values.iter().map(|v| v.name.as_str()).collect();
    let mut name = format!("oxgen::{hint}");
    let mut k = 1;
    while taken.contains(name.as_str()) {
        k += 1;
        name = format!("oxgen::{hint}_{k}");
    }
    let id = ValueId(graph.values.len());
    graph.values.push(ValueInfo {
        name,
        kind,
        dtype,
        dims,
    });
    id
}

/// Adds an initializer named after `hint`.
pub(crate) fn add_initializer(graph: &mut Graph, hint: &str, tensor: Tensor) -> ValueId {
    let dims = tensor.dims().iter().map(|&d| Dim::Fixed(d)).collect();
    let id = add_value(
        graph,
        hint,
        ValueKind::Initializer,
        Some(tensor.dtype()),
        Some(dims),
    );
    graph.initializers.insert(id, tensor);
    id
}

/// Turns node output `v` into an initializer holding `tensor` (its producer must go).
pub(crate) fn set_constant(graph: &mut Graph, v: ValueId, tensor: Tensor) {
    let info = &mut graph.values[v.0];
    info.kind = ValueKind::Initializer;
    info.dtype = Some(tensor.dtype());
    info.dims = Some(tensor.dims().iter().map(|&d| Dim::Fixed(d)).collect());
    graph.initializers.insert(v, tensor);
}

/// The opset a new node of `domain` gets: the highest any node of that domain has, else 1.
/// Typed ops carry their semantics; the opset is only reported in errors.
fn opset_of(graph: &Graph, domain: &str) -> i64 {
    graph
        .nodes
        .iter()
        .filter(|n| n.domain == domain)
        .map(|n| n.opset)
        .max()
        .unwrap_or(1)
}

/// A node built by a pass; `name` should say which pass and where.
pub(crate) fn new_node(
    graph: &Graph,
    name: String,
    (domain, op_type): (&str, &str),
    op: Op,
    inputs: Vec<Option<ValueId>>,
    outputs: Vec<Option<ValueId>>,
) -> Node {
    Node {
        name,
        op_type: op_type.to_string(),
        domain: domain.to_string(),
        opset: opset_of(graph, domain),
        op,
        inputs,
        outputs,
    }
}

/// A batch of rewrites: nodes to drop (by index in the current order), nodes to replace in
/// place, nodes to add.
#[derive(Default)]
pub(crate) struct Edits {
    pub remove: BTreeSet<usize>,
    pub replace: Vec<(usize, Node)>,
    pub add: Vec<Node>,
}

impl Edits {
    pub fn is_empty(&self) -> bool {
        self.remove.is_empty() && self.replace.is_empty() && self.add.is_empty()
    }
}

/// Applies `edits`, restores topological order and removes nodes nothing needs any more.
/// When the edits would leave a value produced twice or a cycle (a pass bug), the nodes are
/// left as they were and `false` is returned.
pub(crate) fn apply(graph: &mut Graph, edits: Edits) -> bool {
    if edits.is_empty() {
        return true;
    }
    let mut nodes: Vec<Option<Node>> = graph.nodes.iter().cloned().map(Some).collect();
    for (i, node) in edits.replace {
        nodes[i] = Some(node);
    }
    for &i in &edits.remove {
        nodes[i] = None;
    }
    let candidate: Vec<Node> = nodes.into_iter().flatten().chain(edits.add).collect();
    match topo_order(&candidate, graph.values.len()) {
        Some(order) => {
            let mut slots: Vec<Option<Node>> = candidate.into_iter().map(Some).collect();
            graph.nodes = order
                .into_iter()
                .map(|i| slots[i].take().expect("each node is placed once"))
                .collect();
            remove_dead(graph);
            true
        }
        None => false,
    }
}

/// Kahn's algorithm, stable with respect to the current order; `None` on a cycle or on a
/// value produced by two nodes.
fn topo_order(nodes: &[Node], n_values: usize) -> Option<Vec<usize>> {
    let mut produced_by: Vec<Option<usize>> = vec![None; n_values];
    for (i, node) in nodes.iter().enumerate() {
        for out in node.outputs.iter().flatten() {
            if produced_by[out.0].replace(i).is_some() {
                return None;
            }
        }
    }
    let mut pending = vec![0usize; nodes.len()];
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        for v in node.inputs.iter().flatten() {
            if let Some(p) = produced_by[v.0] {
                pending[i] += 1;
                consumers[p].push(i);
            }
        }
    }
    let mut ready: BTreeSet<usize> = (0..nodes.len()).filter(|&i| pending[i] == 0).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &c in &consumers[i] {
            pending[c] -= 1;
            if pending[c] == 0 {
                ready.insert(c);
            }
        }
    }
    (order.len() == nodes.len()).then_some(order)
}

/// Removes nodes none of whose outputs reach a graph output, and initializers no remaining
/// node reads. Returns how many nodes went.
pub(crate) fn remove_dead(graph: &mut Graph) -> usize {
    let mut needed = vec![false; graph.values.len()];
    for v in &graph.outputs {
        needed[v.0] = true;
    }
    let mut live = vec![false; graph.nodes.len()];
    for (i, node) in graph.nodes.iter().enumerate().rev() {
        if node.outputs.iter().flatten().any(|v| needed[v.0]) {
            live[i] = true;
            for v in node.inputs.iter().flatten() {
                needed[v.0] = true;
            }
        }
    }
    let before = graph.nodes.len();
    let mut k = 0;
    graph.nodes.retain(|_| {
        k += 1;
        live[k - 1]
    });
    graph.initializers.retain(|v, _| needed[v.0]);
    before - graph.nodes.len()
}
