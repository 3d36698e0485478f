//! An encoder's self-attention as `torch.onnx` (and oxgen's encoder import) spells it out →
//! one `oxgen::EncoderAttention`:
//!
//! ```text
//! q4 = Transpose(Reshape(q, [b, s, H, d]), [0,2,1,3])     v4 likewise
//! kT = Transpose(Reshape(k, [b, s, H, d]), [0,2,3,1])
//! P  = Softmax(Add(Div(MatMul(q4, kT), c), mask), axis=-1)  (Mul by c instead of Div; the
//!                                                            mask Add optional, either order)
//! o  = Reshape(Transpose(MatMul(P, v4), [0,2,1,3]), [b, s, H·d])
//! ```
//!
//! The op computes each head's scores with the same f32 product kernel (each score one chain
//! over the head's dimensions, in order), the graph's scaling and mask sum, the same row
//! softmax and the same product with `v`, so the same bits, without the four transposes
//! and the passes over the scores between the ops.
//!
//! What is checked: every edge and op above, each intermediate value read by nothing else;
//! `q`, `k` and `v` float32 of rank 3 whose last dimension the `Reshape`s split into `H`
//! heads of a known size, keeping the first two (by the inferred shapes, not the constants'
//! spelling), and the last `Reshape` merging them back; `c` a one-value float32 constant;
//! the mask of rank at most 4. Where `q`, `k` or `v` is `Add(m, bias)` of a float32 constant
//! bias, read by nothing else, the op takes `m` and the bias and adds it as it gathers each
//! head (the same sum).

use super::edit::{self, Edits, Index, binary_operands as operands, input, output, scalar_f32};
use super::shapes::{Facts, Sym};
use crate::ops::{BinaryOp, EncoderAttention, Op, ScoreScale, Softmax};
use crate::{Graph, ValueId};

/// An attention block found at a `Softmax`: the op, its inputs, the nodes it replaces (the
/// one making its output first).
struct Found {
    op: EncoderAttention,
    inputs: Vec<Option<ValueId>>,
    nodes: Vec<usize>,
}

/// `x` of `Transpose(Reshape(x, ·), perm)` read only through this chain, with the heads and
/// head size the `Reshape` splits `x`'s last dimension into: `(x, heads, size, [transpose,
/// reshape])`.
fn split_heads(
    graph: &Graph,
    (index, facts): (&Index, &Facts),
    v: ValueId,
    perm: &[i64],
) -> Option<(ValueId, i64, i64, [usize; 2])> {
    let (ti, t) = index.node(graph, v)?;
    match &t.op {
        Op::Transpose { perm: Some(p) } if p == perm => {}
        _ => return None,
    }
    let r = input(t, 0)?;
    index.only_read_by(r, ti).then_some(())?;
    let (ri, reshape) = index.node(graph, r)?;
    matches!(reshape.op, Op::Reshape { .. }).then_some(())?;
    let x = input(reshape, 0)?;
    let &[b, s, Sym::Known(width)] = facts.dims(x)? else {
        return None;
    };
    let &[b2, s2, Sym::Known(heads), Sym::Known(size)] = facts.dims(r)? else {
        return None;
    };
    (b2 == b && s2 == s && heads > 0 && heads * size == width).then_some(())?;
    Some((x, heads, size, [ti, ri]))
}

/// `x = Add(m, bias)` read only by node `reader`, `bias` a float32 constant of one value per
/// element of `x`'s last axis and `m` of `x`'s shape: `(m, bias, the Add)`.
fn biased(
    graph: &Graph,
    (index, facts): (&Index, &Facts),
    x: ValueId,
    reader: usize,
) -> Option<(ValueId, ValueId, usize)> {
    index.only_read_by(x, reader).then_some(())?;
    let (ai, add) = index.node(graph, x)?;
    let (a, b) = operands(add, BinaryOp::Add)?;
    let width = *facts.dims(x)?.last()?;
    [(a, b), (b, a)].into_iter().find_map(|(m, bias)| {
        let t = edit::constant(graph, bias)?;
        let &[n] = t.dims() else { return None };
        let fits = t.dtype() == oxgen_tensor::DType::F32
            && Sym::Known(n as i64) == width
            && facts.dims(m) == facts.dims(x);
        fits.then_some((m, bias, ai))
    })
}

/// The block whose `Softmax` is node `si`, if the pattern holds.
fn attention_at(graph: &Graph, (index, facts): (&Index, &Facts), si: usize) -> Option<Found> {
    let softmax = &graph.nodes[si];
    match softmax.op {
        Op::Softmax(Softmax {
            axis: -1 | 3,
            flatten: false,
            log: false,
            hard: false,
        }) => {}
        _ => return None,
    }
    let p = output(softmax)?;
    let mut nodes = Vec::new();
    // Backward from the softmax: the mask's Add (optional), the scale, the scores.
    let mut x = input(softmax, 0)?;
    let mut reader = si;
    let mut mask = None;
    let (ai, add) = index.node(graph, x)?;
    if let Some((a, b)) = operands(add, BinaryOp::Add) {
        index.only_read_by(x, reader).then_some(())?;
        let (scaled, m) = match index.node(graph, a) {
            Some((_, n)) if matches!(n.op, Op::Binary(BinaryOp::Div | BinaryOp::Mul)) => (a, b),
            _ => (b, a),
        };
        (facts.rank(m)? <= 4 && facts.dtype(m) == Some(oxgen_tensor::DType::F32)).then_some(())?;
        (mask, x, reader) = (Some(m), scaled, ai);
        nodes.push(ai);
    }
    index.only_read_by(x, reader).then_some(())?;
    let (ci, scale_node) = index.node(graph, x)?;
    let (scores, scale) = match operands(scale_node, BinaryOp::Div) {
        Some((s, c)) => (s, ScoreScale::Divide(scalar_f32(graph, c)?)),
        None => {
            let (a, b) = operands(scale_node, BinaryOp::Mul)?;
            match scalar_f32(graph, b) {
                Some(c) => (a, ScoreScale::Multiply(c)),
                None => (b, ScoreScale::Multiply(scalar_f32(graph, a)?)),
            }
        }
    };
    nodes.push(ci);
    index.only_read_by(scores, ci).then_some(())?;
    let (qi, qk) = index.node(graph, scores)?;
    matches!(qk.op, Op::MatMul).then_some(())?;
    nodes.push(qi);
    let (q4, kt) = (input(qk, 0)?, input(qk, 1)?);
    (index.only_read_by(q4, qi) && index.only_read_by(kt, qi)).then_some(())?;
    let (q, heads, size, q_nodes) = split_heads(graph, (index, facts), q4, &[0, 2, 1, 3])?;
    let (k, k_heads, k_size, k_nodes) = split_heads(graph, (index, facts), kt, &[0, 2, 3, 1])?;
    (k_heads == heads && k_size == size).then_some(())?;
    // Forward from the softmax: the product with v, the heads merged.
    let pi = index.sole_reader(p)?;
    let pv = &graph.nodes[pi];
    (matches!(pv.op, Op::MatMul) && input(pv, 0)? == p).then_some(())?;
    let v4 = input(pv, 1)?;
    index.only_read_by(v4, pi).then_some(())?;
    let (v, v_heads, v_size, v_nodes) = split_heads(graph, (index, facts), v4, &[0, 2, 1, 3])?;
    (v_heads == heads).then_some(())?;
    let o = output(pv)?;
    let ti = index.sole_reader(o)?;
    let merge = &graph.nodes[ti];
    matches!(&merge.op, Op::Transpose { perm: Some(p) } if p == &[0, 2, 1, 3]).then_some(())?;
    let ot = output(merge)?;
    let mi = index.sole_reader(ot)?;
    let merged = &graph.nodes[mi];
    matches!(merged.op, Op::Reshape { .. }).then_some(())?;
    let &[b, s, _] = facts.dims(q)? else {
        return None;
    };
    let want = [b, s, Sym::Known(heads * v_size)];
    (facts.dims(output(merged)?)? == want).then_some(())?;
    let f32 = Some(oxgen_tensor::DType::F32);
    [q, k, v]
        .iter()
        .all(|&x| facts.dtype(x) == f32)
        .then_some(())?;
    let mut all = vec![mi, ti, pi, si];
    all.extend(nodes);
    all.extend(q_nodes.into_iter().chain(k_nodes).chain(v_nodes));
    // Projections' biases join the op, which adds them as it gathers each head.
    let mut inputs = vec![Some(q), Some(k), Some(v), mask];
    let mut biases = Vec::new();
    for (x, reshape) in [(q, q_nodes[1]), (k, k_nodes[1]), (v, v_nodes[1])] {
        match biased(graph, (index, facts), x, reshape) {
            Some((m, bias, add)) => {
                inputs[biases.len()] = Some(m);
                all.push(add);
                biases.push(Some(bias));
            }
            None => biases.push(None),
        }
    }
    if biases.iter().any(Option::is_some) {
        inputs.extend(biases);
    }
    let op = EncoderAttention {
        heads: usize::try_from(heads).ok()?,
        scale,
    };
    Some(Found {
        op,
        inputs,
        nodes: all,
    })
}

/// Fuses every spelled-out encoder self-attention; returns how many.
pub fn fuse_encoder_attention(graph: &mut Graph) -> usize {
    let index = Index::new(graph);
    let facts = Facts::infer(graph);
    let mut edits = Edits::default();
    for (si, node) in graph.nodes.iter().enumerate() {
        if !matches!(node.op, Op::Softmax(_)) {
            continue;
        }
        let Some(found) = attention_at(graph, (&index, &facts), si) else {
            continue;
        };
        if found.nodes.iter().any(|n| edits.remove.contains(n)) {
            continue;
        }
        let last = found.nodes[0];
        let fused = edit::new_node(
            graph,
            format!("{}/encoder_attention", graph.nodes[last].name),
            ("oxgen", "EncoderAttention"),
            Op::EncoderAttention(found.op),
            found.inputs,
            vec![output(&graph.nodes[last])],
        );
        edits.replace.push((last, fused));
        edits.remove.extend(&found.nodes[1..]);
    }
    let n = edits.replace.len();
    if edit::apply(graph, edits) { n } else { 0 }
}
