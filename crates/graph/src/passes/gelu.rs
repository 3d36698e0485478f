//! The erf GELU as `torch.onnx` (and oxgen's encoder import) spells it out,
//! `Mul(Mul(x, Add(Erf(Div(x, c)), 1)), 0.5)` or `Mul(Mul(x, 0.5), Add(Erf(Div(x, c)), 1))`
//! (operands of each `Add` and `Mul` in either order, any one-value float32 constants) →
//! one `oxgen::ErfGelu`: one pass over the activations instead of five, each element computed
//! with the same operations in the same order (the division, the f32 erf, the sum, the two
//! products), so the same bits. When `x` is `Add(m, bias)`, read by nothing but the GELU, and
//! the bias a float32 constant of `m`'s last dimension, the bias is added in the same pass.
//!
//! `x` must be known to be float32, each intermediate value read by nothing else, and `x`
//! read by the `Div` and one `Mul` only when its bias is taken in.

use super::edit::{
    self, Edits, Index, binary_operands as operands, input, other_operand as other, output,
    scalar_f32 as scalar,
};
use super::shapes::{Facts, Sym};
use crate::ops::{BinaryOp, ErfGelu, Op, UnaryOp};
use crate::{Graph, ValueId};

/// A GELU found around an `Erf`: the op, its `x`, the nodes it replaces (the last one, which
/// makes its output, first).
struct Found {
    gelu: ErfGelu,
    x: ValueId,
    nodes: Vec<usize>,
}

/// The GELU whose `Erf` is node `ei`, if the pattern holds.
fn gelu_at(graph: &Graph, index: &Index, ei: usize) -> Option<Found> {
    let erf = &graph.nodes[ei];
    let (di, div) = index.node(graph, input(erf, 0)?)?;
    let (x, c) = operands(div, BinaryOp::Div)?;
    let divisor = scalar(graph, c)?;
    let e = output(erf)?;
    index.only_read_by(output(div)?, ei).then_some(())?;
    let ai = index.sole_reader(e)?;
    let add = &graph.nodes[ai];
    let plus = scalar(graph, other(add, BinaryOp::Add, e)?)?;
    let p = output(add)?;
    let mi = index.sole_reader(p)?;
    let mul = &graph.nodes[mi];
    let q = other(mul, BinaryOp::Mul, p)?;
    let y_node = |i: usize| output(&graph.nodes[i]);
    // (x · p) · half, or (x · half) · p.
    let (half, half_first, nodes) = if q == x {
        let ti = index.sole_reader(y_node(mi)?)?;
        let half = scalar(graph, other(&graph.nodes[ti], BinaryOp::Mul, y_node(mi)?)?)?;
        (half, false, vec![ti, mi])
    } else {
        let (ti, t) = index.node(graph, q)?;
        let half = scalar(graph, other(t, BinaryOp::Mul, x)?)?;
        index.only_read_by(q, mi).then_some(())?;
        (half, true, vec![mi, ti])
    };
    let mut nodes = nodes;
    nodes.extend([ai, ei, di]);
    let gelu = ErfGelu {
        divisor,
        add: plus,
        half,
        half_first,
    };
    Some(Found { gelu, x, nodes })
}

/// Fuses every spelled-out erf GELU; returns how many.
pub fn fuse_erf_gelu(graph: &mut Graph) -> usize {
    let index = Index::new(graph);
    let facts = Facts::infer(graph);
    let mut edits = Edits::default();
    for (ei, node) in graph.nodes.iter().enumerate() {
        if !matches!(node.op, Op::Unary(UnaryOp::Erf)) {
            continue;
        }
        let Some(Found { gelu, x, mut nodes }) = gelu_at(graph, &index, ei) else {
            continue;
        };
        let f32 = Some(oxgen_tensor::DType::F32);
        if facts.dtype(x) != f32 || nodes.iter().any(|n| edits.remove.contains(n)) {
            continue;
        }
        // x = m + bias, read only by the Div and the Mul of x: the bias joins the pass.
        let readers = &index.consumers[x.0];
        let inside = readers.len() == 2 && readers.iter().all(|r| nodes.contains(r));
        let biased = index
            .node(graph, x)
            .filter(|_| inside && !index.is_output[x.0]);
        let biased = biased.and_then(|(bi, add)| {
            let (a, b) = operands(add, BinaryOp::Add)?;
            let bias_len = |v: ValueId| {
                let t = edit::constant(graph, v)?;
                let &[n] = t.dims() else { return None };
                (t.dtype() == oxgen_tensor::DType::F32).then_some(n as i64)
            };
            let last = |v: ValueId| facts.dims(v).and_then(|d| d.last().copied());
            [(a, b), (b, a)].into_iter().find_map(|(m, bias)| {
                let n = bias_len(bias)?;
                (last(m) == Some(Sym::Known(n))).then_some((bi, m, bias))
            })
        });
        let inputs = match biased {
            Some((bi, m, bias)) if !edits.remove.contains(&bi) => {
                nodes.push(bi);
                vec![Some(m), Some(bias)]
            }
            _ => vec![Some(x)],
        };
        let last = nodes[0];
        let fused = edit::new_node(
            graph,
            format!("{}/erf_gelu", graph.nodes[last].name),
            ("oxgen", "ErfGelu"),
            Op::ErfGelu(gelu),
            inputs,
            vec![output(&graph.nodes[last])],
        );
        edits.replace.push((last, fused));
        edits.remove.extend(&nodes[1..]);
    }
    let n = edits.replace.len();
    if edit::apply(graph, edits) { n } else { 0 }
}
