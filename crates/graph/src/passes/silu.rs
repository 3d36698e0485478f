//! The gated SiLU of a decoder's MLP, `Mul(Mul(g, Sigmoid(g)), u)` (operands of either `Mul`
//! in either order) → one `oxgen::SiluMul(g, u)`: one pass over the activations instead of
//! three ops, each element computed with the same operations in the same order (the f32
//! sigmoid, then `g * s`, then `* u`), so the same bits.
//!
//! Only float32 `g` and `u` of one shape are fused (inferred, or known because both are
//! outputs of one `MatMulNBitsGroup` with the same `N`), and only when the sigmoid and the
//! first product are read by nothing else.
//!
//! Then [`fuse_glu`] joins a `SiluMul` with the group of gate and up projections it reads
//! into one `oxgen::MatMulNBitsGlu`.

use super::edit::{self, Edits, Index, binary_operands, input, output};
use super::shapes::Facts;
use crate::ops::{BinaryOp, Op, UnaryOp};
use crate::{Graph, ValueId};

/// Whether `g` and `u` are two outputs of one `MatMulNBitsGroup` (one input A) with the same
/// `N` and float32 scales: then both are float32 of A's leading shape by `N`, whatever the
/// shape inference could not follow upstream.
fn sibling_projections(graph: &Graph, index: &Index, g: ValueId, u: ValueId) -> bool {
    let (Some((gi, node)), Some((ui, _))) = (index.node(graph, g), index.node(graph, u)) else {
        return false;
    };
    let Op::MatMulNBitsGroup(parts) = &node.op else {
        return false;
    };
    let part = |v: ValueId| node.outputs.iter().position(|&o| o == Some(v));
    let (Some(pg), Some(pu)) = (part(g), part(u)) else {
        return false;
    };
    let f32_scales = |p: usize| {
        input(node, 2 + 3 * p)
            .and_then(|v| edit::constant(graph, v))
            .is_some_and(|t| t.dtype() == oxgen_tensor::DType::F32)
    };
    gi == ui && pg != pu && parts[pg].n == parts[pu].n && f32_scales(pg) && f32_scales(pu)
}

/// Fuses every gated SiLU; returns how many.
pub fn fuse_silu_mul(graph: &mut Graph) -> usize {
    let index = Index::new(graph);
    let facts = Facts::infer(graph);
    let mut edits = Edits::default();
    for (i, node) in graph.nodes.iter().enumerate() {
        let Some((x, y)) = binary_operands(node, BinaryOp::Mul) else {
            continue;
        };
        // One operand is `a = g * sigmoid(g)`, the other `u`.
        let found = [(x, y), (y, x)].into_iter().find_map(|(a, u)| {
            let (ai, an) = index.node(graph, a)?;
            let (p, q) = binary_operands(an, BinaryOp::Mul)?;
            let (g, si) = [(p, q), (q, p)].into_iter().find_map(|(g, s)| {
                let (si, sn) = index.node(graph, s)?;
                (matches!(sn.op, Op::Unary(UnaryOp::Sigmoid)) && input(sn, 0) == Some(g))
                    .then_some((g, si))
            })?;
            let s = output(&graph.nodes[si])?;
            let private = index.only_read_by(a, i) && index.only_read_by(s, ai);
            Some((g, u, ai, si)).filter(|_| private)
        });
        let Some((g, u, ai, si)) = found else {
            continue;
        };
        let f32 = Some(oxgen_tensor::DType::F32);
        let fits = (facts.dtype(g) == f32
            && facts.dtype(u) == f32
            && facts.dims(g).is_some()
            && facts.dims(g) == facts.dims(u))
            || sibling_projections(graph, &index, g, u);
        if !fits || edits.remove.contains(&ai) || edits.remove.contains(&si) {
            continue;
        }
        let fused = edit::new_node(
            graph,
            format!("{}/silu_mul", node.name),
            ("oxgen", "SiluMul"),
            Op::SiluMul,
            vec![Some(g), Some(u)],
            vec![output(node)],
        );
        edits.replace.push((i, fused));
        edits.remove.extend([ai, si]);
    }
    let n = edits.replace.len();
    if edit::apply(graph, edits) { n } else { 0 }
}

/// Fuses every `SiluMul` whose `g` and `u` are the only two outputs of one
/// `MatMulNBitsGroup`, read by nothing else, with that group into one
/// `oxgen::MatMulNBitsGlu` (gate part first): the gate and up products and the gated SiLU in
/// one op, so a kernel can finish each tile's SiLU while the tile is in registers. Returns
/// how many.
pub fn fuse_glu(graph: &mut Graph) -> usize {
    let index = Index::new(graph);
    let mut edits = Edits::default();
    for (i, node) in graph.nodes.iter().enumerate() {
        if !matches!(node.op, Op::SiluMul) {
            continue;
        }
        let (Some(g), Some(u), Some(y)) = (input(node, 0), input(node, 1), output(node)) else {
            continue;
        };
        if g == u || !sibling_projections(graph, &index, g, u) {
            continue;
        }
        let Some((gi, group)) = index.node(graph, g) else {
            continue;
        };
        let Op::MatMulNBitsGroup(parts) = &group.op else {
            continue;
        };
        let private = index.only_read_by(g, i) && index.only_read_by(u, i);
        if parts.len() != 2 || group.outputs.len() != 2 || !private {
            continue;
        }
        // Gate first: the part that produced g.
        let first = usize::from(group.outputs[0] != Some(g));
        let order = [first, 1 - first];
        let mut inputs = vec![input(group, 0)];
        for &p in &order {
            inputs.extend((1..4).map(|k| input(group, 3 * p + k)));
        }
        let fused = edit::new_node(
            graph,
            format!("{}/glu", group.name),
            ("oxgen", "MatMulNBitsGlu"),
            Op::MatMulNBitsGlu([parts[order[0]], parts[order[1]]]),
            inputs,
            vec![Some(y)],
        );
        edits.replace.push((gi, fused));
        edits.remove.insert(i);
    }
    let n = edits.replace.len();
    if edit::apply(graph, edits) { n } else { 0 }
}
