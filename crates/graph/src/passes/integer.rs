//! onnxruntime's dynamic int8 products as `quantize_dynamic` spells them out,
//! `Add(Mul(Cast(MatMulInteger(A, B, za, zb)), S), bias)` (operands of `Mul` and `Add` in
//! either order, the bias optional) → one `com.microsoft::MatMulIntegerToFloat(A, B, a_scale,
//! b_scale, za, zb, bias)`: the kernel finishes each tile's `float(acc) · (a_scale · b_scale)`
//! plus the bias while it is in registers instead of three passes over the activations, with
//! the same operations in the same order (the scales' product, the conversion, the product,
//! the sum; none fused into one rounding), so the same bits.
//!
//! `S` is either `Mul(p, q)` read by nothing else, of one value each or one value and one per
//! column of `B` (its operands become the op's scales: the same product), or a constant of
//! one value or one per column (the op's scales are 1 and `S`). `p` counts as one value when
//! it is a `DynamicQuantizeLinear`'s scale (a scalar by the spec) or a one-value constant.
//! `B` is a 2-D constant (its columns are known), the bias a float32 constant of one value
//! per column, and each intermediate value is read by nothing else.

use oxgen_tensor::{DType, Tensor};

use super::edit::{self, Edits, Index, binary_operands, input, other_operand, output};
use crate::ops::{BinaryOp, Op};
use crate::{Graph, ValueId};

/// The scales `[a_scale, b_scale]` a product's `S` stands for: its operands when it is a
/// `Mul` only `reader` reads (and the `Mul`'s index), else a 1 to be added and `S`; `a_scale`
/// one value and `b_scale` one or one per column (`n`), float32, and made before node
/// `product` (which the fused node replaces).
fn scales(
    graph: &Graph,
    index: &Index,
    s: ValueId,
    (product, reader): (usize, usize),
    n: usize,
) -> Option<([Option<ValueId>; 2], Option<usize>)> {
    let per_column = |v: ValueId| {
        edit::constant(graph, v).is_some_and(|t| {
            t.dtype() == DType::F32 && (t.numel() == 1 || (t.numel() == n && t.dims() == [n]))
        })
    };
    let one_value = |v: ValueId| {
        let quantizer_scale = index.node(graph, v).is_some_and(|(at, node)| {
            at < product
                && matches!(node.op, Op::DynamicQuantize)
                && node.outputs.get(1) == Some(&Some(v))
        });
        quantizer_scale || edit::constant(graph, v).is_some_and(|t| t.numel() == 1)
    };
    if per_column(s) {
        return Some(([None, Some(s)], None));
    }
    let (mi, mul) = index.node(graph, s)?;
    let (p, q) = binary_operands(mul, BinaryOp::Mul)?;
    let (a, b) = match () {
        _ if one_value(p) && per_column(q) => (p, q),
        _ if per_column(p) && one_value(q) => (q, p),
        _ => return None,
    };
    (index.only_read_by(s, reader)).then_some(([Some(a), Some(b)], Some(mi)))
}

/// Fuses every spelled-out dynamic int8 product; returns how many.
pub fn fuse_integer_to_float(graph: &mut Graph) -> usize {
    let index = Index::new(graph);
    // (the MatMulInteger, the scales (a missing one is a 1 to add), the bias, the output,
    // the nodes that go).
    let mut found = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        if !matches!(node.op, Op::MatMulInteger) {
            continue;
        }
        let Some(n) =
            (input(node, 1).and_then(|b| edit::constant(graph, b))).and_then(|b| match b.dims() {
                &[_, n] => Some(n),
                _ => None,
            })
        else {
            continue;
        };
        let Some(ci) = output(node).and_then(|y| index.sole_reader(y)) else {
            continue;
        };
        let cast = &graph.nodes[ci];
        let Op::Cast(c) = &cast.op else {
            continue;
        };
        let Some(mi) =
            (output(cast).filter(|_| c.to == Some(DType::F32))).and_then(|y| index.sole_reader(y))
        else {
            continue;
        };
        let mul = &graph.nodes[mi];
        let Some(s) = output(cast).and_then(|c| other_operand(mul, BinaryOp::Mul, c)) else {
            continue;
        };
        let Some((scales, scale_mul)) = scales(graph, &index, s, (i, mi), n) else {
            continue;
        };
        // The bias, when the product's one reader adds a constant of one value per column.
        let bias = output(mul).and_then(|y| {
            let ai = index.sole_reader(y)?;
            let b = other_operand(&graph.nodes[ai], BinaryOp::Add, y)?;
            edit::constant(graph, b)
                .filter(|t| t.dtype() == DType::F32 && t.dims() == [n])
                .map(|_| (b, ai))
        });
        let out = match bias {
            Some((_, ai)) => output(&graph.nodes[ai]),
            None => output(mul),
        };
        let mut gone = vec![ci, mi];
        gone.extend(scale_mul);
        gone.extend(bias.map(|(_, ai)| ai));
        found.push((i, scales, bias.map(|(b, _)| b), out, gone));
    }
    let mut edits = Edits::default();
    let mut one = None;
    for (i, [a_scale, b_scale], bias, out, gone) in found {
        if gone.iter().any(|g| edits.remove.contains(g)) {
            continue;
        }
        let a_scale = a_scale.unwrap_or_else(|| {
            *one.get_or_insert_with(|| edit::add_initializer(graph, "one", Tensor::scalar(1f32)))
        });
        let node = &graph.nodes[i];
        let inputs = vec![
            input(node, 0),
            input(node, 1),
            Some(a_scale),
            b_scale,
            input(node, 2),
            input(node, 3),
            bias,
        ];
        let fused = edit::new_node(
            graph,
            format!("{}/to_float", node.name),
            ("com.microsoft", "MatMulIntegerToFloat"),
            Op::MatMulIntegerToFloat,
            inputs,
            vec![out],
        );
        edits.replace.push((i, fused));
        edits.remove.extend(gone);
    }
    let n = edits.replace.len();
    if edit::apply(graph, edits) { n } else { 0 }
}
