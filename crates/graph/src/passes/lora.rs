//! A base graph's empty LoRA branches → nothing.
//!
//! onnxruntime-genai runs LoRA adapters over a graph that computes each adapted projection as
//! `Add(x W, (x A) B)`, with `A` and `B` graph inputs whose default initializers hold zero
//! ranks (`[k, 0]` and `[0, n]`): without an adapter the branch adds zeros. The backend
//! applies adapters beside the projection itself (`oxgen-exec`'s `lora`), so the branch only
//! costs two products and an addition per projection; readers of the `Add` read the
//! projection instead. Exact: a product over zero terms is zero, and `y + 0 = y`.

use std::collections::HashMap;

use super::edit::{self, Index, input, output};
use crate::ops::{BinaryOp, Op};
use crate::{Graph, ValueId};

/// Whether `v` is an initializer with no elements.
fn empty(graph: &Graph, v: Option<ValueId>) -> bool {
    v.and_then(|v| edit::constant(graph, v))
        .is_some_and(|t| t.numel() == 0)
}

/// The input of a `(x A) B` branch over empty `A` and `B` producing `d`.
fn empty_branch(graph: &Graph, index: &Index, d: ValueId) -> Option<ValueId> {
    let (_, second) = index.node(graph, d)?;
    let (Op::MatMul, Some(t)) = (&second.op, input(second, 0)) else {
        return None;
    };
    let (_, first) = index.node(graph, t)?;
    let matches = matches!(first.op, Op::MatMul)
        && empty(graph, input(first, 1))
        && empty(graph, input(second, 1));
    matches.then(|| input(first, 0)).flatten()
}

/// Whether `y` is a projection of `x` (a `MatMul` or `MatMulNBits` reading it).
fn projects(graph: &Graph, index: &Index, y: ValueId, x: ValueId) -> bool {
    index.node(graph, y).is_some_and(|(_, n)| {
        matches!(n.op, Op::MatMul | Op::MatMulNBits(_)) && input(n, 0) == Some(x)
    })
}

/// Removes every empty LoRA branch (see the module doc); returns how many.
pub fn strip_empty_lora(graph: &mut Graph) -> usize {
    let index = Index::new(graph);
    let mut renamed: HashMap<ValueId, ValueId> = HashMap::new();
    for node in &graph.nodes {
        let (Op::Binary(BinaryOp::Add), Some(a), Some(b), Some(sum)) =
            (&node.op, input(node, 0), input(node, 1), output(node))
        else {
            continue;
        };
        if index.is_output[sum.0] {
            continue;
        }
        for (y, d) in [(a, b), (b, a)] {
            if empty_branch(graph, &index, d).is_some_and(|x| projects(graph, &index, y, x)) {
                renamed.insert(sum, y);
                break;
            }
        }
    }
    if renamed.is_empty() {
        return 0;
    }
    for node in &mut graph.nodes {
        for v in node.inputs.iter_mut().flatten() {
            if let Some(&y) = renamed.get(v) {
                *v = y;
            }
        }
    }
    edit::remove_dead(graph);
    renamed.len()
}
