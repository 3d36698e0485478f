//! `MatMulNBits` nodes that read the same input → one `oxgen::MatMulNBitsGroup`.
//!
//! A decoder layer multiplies its normed input by Q, K and V (and its MLP input by gate and
//! up) in separate nodes. Run apart, each quantizes the same activations and opens its own
//! parallel region: for a small model at batch 1 that fixed cost rivals the arithmetic. The
//! group node has the same outputs, each computed exactly as its node computed it (the
//! backend packs the weights side by side and runs all parts in one region), so the rewrite
//! changes no bits.
//!
//! Members must share A, `K`, `bits`, `block_size` and `accuracy_level`, take their weights,
//! scales and zero points (if any, all of one dtype) from initializers, and have no `g_idx`
//! or bias. At most [`MAX_PARTS`] nodes go into one group, in graph order.

use std::collections::BTreeMap;

use super::edit::{self, Edits, input};
use crate::ops::Op;
use crate::{Graph, ValueId};

/// The most nodes one group takes (the kernels keep per-part state inline up to this).
pub const MAX_PARTS: usize = 4;

/// What must match for two nodes to share a group: A, the node's attributes but `n`, and
/// the dtypes of its scales and zero points.
type Key = (
    ValueId,
    usize,
    u32,
    usize,
    u8,
    Option<oxgen_tensor::DType>,
    Option<oxgen_tensor::DType>,
);

/// Groups `MatMulNBits` nodes as the module doc says; returns how many groups it made.
pub fn group_matmul_nbits(graph: &mut Graph) -> usize {
    let mut by_key: BTreeMap<Key, Vec<usize>> = BTreeMap::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let Op::MatMulNBits(m) = &node.op else {
            continue;
        };
        let init = |k: usize| input(node, k).and_then(|v| edit::constant(graph, v));
        let (Some(a), Some(_), Some(scales)) = (input(node, 0), init(1), init(2)) else {
            continue;
        };
        let zero_points = match input(node, 3) {
            None => None,
            Some(_) => match init(3) {
                Some(z) => Some(z.dtype()),
                None => continue,
            },
        };
        if input(node, 4).is_some() || input(node, 5).is_some() || node.outputs.len() != 1 {
            continue;
        }
        let key = (
            a,
            m.k,
            m.bits,
            m.block_size,
            m.accuracy_level,
            Some(scales.dtype()),
            zero_points,
        );
        by_key.entry(key).or_default().push(i);
    }
    let mut edits = Edits::default();
    let mut groups = 0;
    for members in by_key.values() {
        for chunk in members.chunks(MAX_PARTS).filter(|c| c.len() > 1) {
            let first = &graph.nodes[chunk[0]];
            let mut parts = Vec::with_capacity(chunk.len());
            let mut inputs = vec![input(first, 0)];
            let mut outputs = Vec::with_capacity(chunk.len());
            for &i in chunk {
                let node = &graph.nodes[i];
                let Op::MatMulNBits(m) = &node.op else {
                    unreachable!("only MatMulNBits nodes were collected");
                };
                parts.push(*m);
                inputs.extend((1..4).map(|k| input(node, k)));
                outputs.push(node.outputs[0]);
            }
            let node = edit::new_node(
                graph,
                format!("group_matmul_nbits/{}", first.name),
                ("oxgen", "MatMulNBitsGroup"),
                Op::MatMulNBitsGroup(parts),
                inputs,
                outputs,
            );
            edits.replace.push((chunk[0], node));
            edits.remove.extend(&chunk[1..]);
            groups += 1;
        }
    }
    if edit::apply(graph, edits) { groups } else { 0 }
}
