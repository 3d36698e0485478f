//! RMSNorm as exporters spell it → `SimplifiedLayerNormalization`, and a residual `Add`
//! feeding one → `com.microsoft::SkipSimplifiedLayerNormalization`.
//!
//! Hugging Face's `LlamaRMSNorm` (and its copies in most decoder families) exports as
//!
//! ```text
//! xf = Cast(x, float32)?            (absent when x is already float32)
//! r  = Reciprocal(Sqrt(Add(ReduceMean(Pow(xf, 2), axes=[-1], keepdims=1), eps)))
//!      | Div(1, Sqrt(...))
//! y  = Mul(weight, Cast(Mul(xf, r), float32)?)
//! ```
//!
//! (`Mul(xf, xf)` may stand for the `Pow`; operands of `Add`/`Mul` in either order). Only
//! float32 inputs are fused, where the fused kernel computes the same function in the same
//! precision. The fused op's skip form takes the residual sum as an output, so the residual
//! stream keeps flowing to the next layer.

use super::edit::{self, Edits, Index, input, output, scalar_f64};
use super::shapes::Facts;
use crate::ops::{BinaryOp, Norm, NormKind, Op, ReduceKind, SkipNorm, UnaryOp};
use crate::{Graph, Node, ValueId};

/// The operands of a binary node of kind `op`, in both orders.
fn operands(node: &Node, op: BinaryOp) -> Option<[(ValueId, ValueId); 2]> {
    edit::binary_operands(node, op).map(|(a, b)| [(a, b), (b, a)])
}

/// `v` without a float32 `Cast` in front, when `v` is such a cast.
fn strip_f32_cast(graph: &Graph, index: &Index, v: ValueId) -> ValueId {
    match index.node(graph, v) {
        Some((_, n)) if matches!(&n.op, Op::Cast(c) if c.to == Some(oxgen_tensor::DType::F32)) => {
            input(n, 0).unwrap_or(v)
        }
        _ => v,
    }
}

/// `1 / sqrt(mean(xf^2) + eps)` rooted at `r`: returns `(xf, eps)`.
fn inverse_rms(graph: &Graph, index: &Index, facts: &Facts, r: ValueId) -> Option<(ValueId, f64)> {
    let (_, rn) = index.node(graph, r)?;
    let s = match &rn.op {
        Op::Unary(UnaryOp::Reciprocal) => input(rn, 0)?,
        Op::Binary(BinaryOp::Div) if scalar_f64(graph, input(rn, 0)?) == Some(1.0) => input(rn, 1)?,
        _ => return None,
    };
    let (_, sn) = index.node(graph, s)?;
    if !matches!(sn.op, Op::Unary(UnaryOp::Sqrt)) {
        return None;
    }
    let (_, an) = index.node(graph, input(sn, 0)?)?;
    let (m, eps) = operands(an, BinaryOp::Add)?
        .into_iter()
        .find_map(|(m, e)| Some((m, scalar_f64(graph, e)?)))?;
    let (_, mn) = index.node(graph, m)?;
    let Op::Reduce(red) = &mn.op else {
        return None;
    };
    let axes = match (&red.axes, input(mn, 1)) {
        (Some(a), None) => a.clone(),
        (None, Some(a)) => edit::ints(graph, a)?,
        _ => return None,
    };
    let (_, pn) = index.node(graph, input(mn, 0)?)?;
    let xf = match pn.op {
        Op::Binary(BinaryOp::Pow) if scalar_f64(graph, input(pn, 1)?) == Some(2.0) => input(pn, 0)?,
        Op::Binary(BinaryOp::Mul) if input(pn, 0) == input(pn, 1) => input(pn, 0)?,
        _ => return None,
    };
    let rank = facts.rank(xf)? as i64;
    let last_axis_only = axes.len() == 1 && (axes[0] == -1 || axes[0] == rank - 1);
    (red.kind == ReduceKind::Mean && red.keepdims && last_axis_only && eps >= 0.0)
        .then_some((xf, eps))
}

/// Matches RMSNorm at `node` (the final `Mul` by the weight): `(x, weight, eps)`.
fn match_rms(
    graph: &Graph,
    index: &Index,
    facts: &Facts,
    node: &Node,
) -> Option<(ValueId, ValueId, f64)> {
    for (w, y) in operands(node, BinaryOp::Mul)? {
        let Some(weight) = edit::constant(graph, w) else {
            continue;
        };
        let y = strip_f32_cast(graph, index, y);
        let Some((_, yn)) = index.node(graph, y) else {
            continue;
        };
        let Some(pairs) = operands(yn, BinaryOp::Mul) else {
            continue;
        };
        for (xf, r) in pairs {
            let Some((xf2, eps)) = inverse_rms(graph, index, facts, r) else {
                continue;
            };
            if xf2 != xf {
                continue;
            }
            let x = strip_f32_cast(graph, index, xf);
            let width = facts.dim(x, -1);
            let fits = weight.dtype() == oxgen_tensor::DType::F32
                && weight.rank() == 1
                && width == Some(super::shapes::Sym::Known(weight.dims()[0] as i64))
                && facts.dtype(x) == Some(oxgen_tensor::DType::F32);
            if fits {
                return Some((x, w, eps));
            }
        }
    }
    None
}

/// Replaces every RMSNorm pattern with `SimplifiedLayerNormalization`; returns how many.
pub fn fuse_rms_norm(graph: &mut Graph) -> usize {
    let index = Index::new(graph);
    let facts = Facts::infer(graph);
    let mut edits = Edits::default();
    for (i, node) in graph.nodes.iter().enumerate() {
        let Some((x, w, eps)) = match_rms(graph, &index, &facts, node) else {
            continue;
        };
        let fused = edit::new_node(
            graph,
            format!("{}/rms_norm", node.name),
            ("", "SimplifiedLayerNormalization"),
            Op::Norm(Norm {
                kind: NormKind::Rms,
                axis: -1,
                epsilon: eps as f32,
                outputs: 1,
            }),
            vec![Some(x), Some(w)],
            vec![output(node)],
        );
        edits.replace.push((i, fused));
    }
    let n = edits.replace.len();
    if edit::apply(graph, edits) { n } else { 0 }
}

/// Folds the residual `Add` in front of each `SimplifiedLayerNormalization` into a
/// `SkipSimplifiedLayerNormalization` whose fourth output is the sum; returns how many.
pub fn fuse_skip_norm(graph: &mut Graph) -> usize {
    let index = Index::new(graph);
    let facts = Facts::infer(graph);
    let mut edits = Edits::default();
    for (i, node) in graph.nodes.iter().enumerate() {
        let Op::Norm(norm) = &node.op else {
            continue;
        };
        let rank = input(node, 0).and_then(|v| facts.rank(v));
        let last_axis = rank.is_some_and(|r| norm.axis == -1 || norm.axis == r as i64 - 1);
        let only_y = node.outputs.iter().skip(1).all(Option::is_none);
        if norm.kind != NormKind::Rms || !last_axis || !only_y {
            continue;
        }
        let (Some(sum), Some(w)) = (input(node, 0), input(node, 1)) else {
            continue;
        };
        let Some((add_index, add)) = index.node(graph, sum) else {
            continue;
        };
        if edits.remove.contains(&add_index) {
            continue;
        }
        let Some([(a, b), _]) = operands(add, BinaryOp::Add) else {
            continue;
        };
        // The fused op adds two tensors of one shape; a broadcasting Add stays.
        let same_shape = facts.dims(a).is_some() && facts.dims(a) == facts.dims(b);
        let float32 = facts.dtype(a) == Some(oxgen_tensor::DType::F32)
            && facts.dtype(b) == Some(oxgen_tensor::DType::F32);
        let constant = graph.initializers.contains_key(&a) || graph.initializers.contains_key(&b);
        if !same_shape || !float32 || constant {
            continue;
        }
        let sum_used = !index.only_read_by(sum, i);
        let fused = edit::new_node(
            graph,
            format!("{}/skip_norm", node.name),
            ("com.microsoft", "SkipSimplifiedLayerNormalization"),
            Op::SkipNorm(SkipNorm {
                kind: NormKind::Rms,
                epsilon: norm.epsilon,
            }),
            vec![Some(a), Some(b), Some(w)],
            vec![output(node), None, None, sum_used.then_some(sum)],
        );
        edits.replace.push((i, fused));
        edits.remove.insert(add_index);
    }
    let n = edits.replace.len();
    if edit::apply(graph, edits) { n } else { 0 }
}
