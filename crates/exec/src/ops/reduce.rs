//! Reductions along axes: ReduceX, ArgMax/ArgMin, TopK, CumSum, Softmax/LogSoftmax/Hardmax.
//!
//! Every op here views its input as `(outer, n, inner)` around the reduced axis and calls a
//! kernel in `oxgen_kernels::{reduce, softmax}`. ReduceX merges adjacent reduced axes into one
//! and, when the reduced axes are not adjacent, first permutes the input so they come last
//! (keeping their order, so lanes still reduce row-major over the reduced indices).
//! Reference: ONNX operator docs and `onnx/reference/ops` for each op.

use oxgen_graph::Op;
use oxgen_graph::ops::{ArgReduce, CumSum, Reduce, ReduceKind, Softmax, TopK};
use oxgen_kernels::acc::Accum;
use oxgen_kernels::reduce::{self as kr, Lanes, ReduceOp};
use oxgen_kernels::softmax::{self as ks, SoftmaxKind};
use oxgen_tensor::{DType, Element, Tensor};

use super::{OpCtx, input, norm_axis, opt_input, read_i64s};
use smallvec::smallvec;

use super::{Outputs, Small};
use crate::OpError;

pub(super) fn run(
    op: &Op,
    inputs: &[Option<&Tensor>],
    _n_outputs: usize,
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError> {
    match op {
        Op::Reduce(r) => reduce(r, inputs, ctx).map(|t| smallvec![t]),
        Op::ArgReduce(a) => arg_reduce(a, input(inputs, 0)?, ctx).map(|t| smallvec![t]),
        Op::TopK(t) => top_k(t, inputs, ctx),
        Op::CumSum(c) => cumsum(c, input(inputs, 0)?, input(inputs, 1)?, ctx).map(|t| smallvec![t]),
        Op::Softmax(s) => softmax(s, input(inputs, 0)?, ctx).map(|t| smallvec![t]),
        _ => unreachable!("ops::run routes only reductions here"),
    }
}

/// The lanes `(outer, n, inner)` around axis `axis` of `dims`.
pub(super) fn split_at_axis(dims: &[usize], axis: usize) -> Lanes {
    Lanes {
        outer: dims[..axis].iter().product(),
        n: dims[axis],
        inner: dims[axis + 1..].iter().product(),
    }
}

fn reduce_op(kind: ReduceKind) -> ReduceOp {
    match kind {
        ReduceKind::Sum => ReduceOp::Sum,
        ReduceKind::Mean => ReduceOp::Mean,
        ReduceKind::Max => ReduceOp::Max,
        ReduceKind::Min => ReduceOp::Min,
        ReduceKind::Prod => ReduceOp::Prod,
        ReduceKind::SumSquare => ReduceOp::SumSquare,
        ReduceKind::L1 => ReduceOp::L1,
        ReduceKind::L2 => ReduceOp::L2,
        ReduceKind::LogSum => ReduceOp::LogSum,
        ReduceKind::LogSumExp => ReduceOp::LogSumExp,
    }
}

/// Which axes of a rank-`rank` input a reduction folds, from the attribute or input 1.
fn reduced_axes(
    r: &Reduce,
    inputs: &[Option<&Tensor>],
    rank: usize,
) -> Result<Small<bool>, OpError> {
    let axes: Small<i64> = match (&r.axes, opt_input(inputs, 1)) {
        (Some(a), _) => Small::from_slice(a),
        (None, Some(t)) => read_i64s(t, "axes")?,
        (None, None) => Small::new(),
    };
    if axes.is_empty() {
        return Ok(smallvec![!r.noop_with_empty_axes; rank]);
    }
    let mut reduced: Small<bool> = smallvec![false; rank];
    for &a in &axes {
        let ax = norm_axis(a, rank)?;
        if std::mem::replace(&mut reduced[ax], true) {
            return Err(OpError::value(format!(
                "axes {axes:?} name axis {ax} twice"
            )));
        }
    }
    Ok(reduced)
}

/// How a reduction walks its input: a permutation to apply first (when reduced axes are not
/// adjacent), then lanes of `(outer, n, inner)`.
struct Plan {
    perm: Option<Vec<usize>>,
    lanes: Lanes,
}

fn plan(dims: &[usize], reduced: &[bool]) -> Plan {
    // Size-1 axes neither move data nor change the order, so only the others decide whether
    // the reduced axes form one block.
    let mut groups: Small<(bool, usize)> = Small::new();
    for (&d, &r) in dims.iter().zip(reduced).filter(|(d, _)| **d != 1) {
        match groups.last_mut() {
            Some((gr, size)) if *gr == r => *size *= d,
            _ => groups.push((r, d)),
        }
    }
    let reduced_groups = groups.iter().filter(|(r, _)| *r).count();
    let numel: usize = dims.iter().product();
    match reduced_groups {
        0 => Plan {
            perm: None,
            lanes: Lanes {
                outer: numel,
                n: 1,
                inner: 1,
            },
        },
        1 => {
            let at = groups.iter().position(|(r, _)| *r).unwrap_or(0);
            let prod = |g: &[(bool, usize)]| g.iter().map(|(_, s)| s).product::<usize>();
            Plan {
                perm: None,
                lanes: Lanes {
                    outer: prod(&groups[..at]),
                    n: groups[at].1,
                    inner: prod(&groups[at + 1..]),
                },
            }
        }
        _ => {
            let (kept, red): (Vec<usize>, Vec<usize>) = (0..dims.len()).partition(|&i| !reduced[i]);
            let n = red.iter().map(|&i| dims[i]).product();
            let outer = kept.iter().map(|&i| dims[i]).product();
            Plan {
                perm: Some(kept.into_iter().chain(red).collect()),
                lanes: Lanes { outer, n, inner: 1 },
            }
        }
    }
}

fn reduce_typed<T: Accum + Element>(
    op: ReduceOp,
    x: &Tensor,
    plan: &Plan,
    out_dims: &[usize],
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let mut out = ctx.alloc(x.dtype(), out_dims)?;
    let permuted = match &plan.perm {
        Some(perm) => {
            let mut t = ctx.alloc(x.dtype(), [x.numel()])?;
            oxgen_kernels::transpose::transpose(
                x.as_slice::<T>()?,
                x.dims(),
                perm,
                t.as_mut_slice::<T>()?,
            )
            .map_err(OpError::from)?;
            Some(t)
        }
        None => None,
    };
    let src = permuted.as_ref().unwrap_or(x);
    let result = kr::reduce(
        op,
        src.as_slice::<T>()?,
        plan.lanes,
        out.as_mut_slice::<T>()?,
        ctx.pool,
    )
    .map_err(OpError::from);
    if let Some(t) = permuted {
        ctx.arena.release(t);
    }
    result.map(|()| out)
}

fn reduce(r: &Reduce, inputs: &[Option<&Tensor>], ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let x = input(inputs, 0)?;
    let dims = x.dims();
    let reduced = reduced_axes(r, inputs, dims.len())?;
    let out_dims: Small<usize> = dims
        .iter()
        .zip(&reduced)
        .filter_map(|(&d, &red)| {
            if !red {
                Some(d)
            } else if r.keepdims {
                Some(1)
            } else {
                None
            }
        })
        .collect();
    let plan = plan(dims, &reduced);
    let op = reduce_op(r.kind);
    match x.dtype() {
        DType::Bool if matches!(op, ReduceOp::Max | ReduceOp::Min) => {
            let mut out = reduce_typed::<u8>(op, x, &plan, &out_dims, ctx)?;
            // Over an empty set u8's identities (0, 255) stand for false and true.
            out.as_mut_slice::<u8>()?
                .iter_mut()
                .for_each(|v| *v = (*v).min(1));
            Ok(out)
        }
        d => dispatch_num!(d, T => reduce_typed::<T>(op, x, &plan, &out_dims, ctx)),
    }
}

fn arg_reduce(a: &ArgReduce, x: &Tensor, ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let dims = x.dims();
    let axis = norm_axis(a.axis, dims.len())?;
    let lanes = split_at_axis(dims, axis);
    let n = lanes.n;
    if n == 0 {
        return Err(OpError::shape(format!(
            "{} over axis {axis} of size 0 (input shape {}) has no answer",
            if a.max { "ArgMax" } else { "ArgMin" },
            x.shape()
        )));
    }
    let out_dims: Small<usize> = dims
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| {
            if i != axis {
                Some(d)
            } else if a.keepdims {
                Some(1)
            } else {
                None
            }
        })
        .collect();
    let mut out = ctx.alloc(DType::I64, out_dims)?;
    let (max, last) = (a.max, a.select_last_index);
    dispatch_num!(x.dtype(), T => kr::arg_reduce(x.as_slice::<T>()?, lanes, max, last, out.as_mut_slice::<i64>()?, ctx.pool).map_err(OpError::from))?;
    Ok(out)
}

fn top_k(t: &TopK, inputs: &[Option<&Tensor>], ctx: &mut OpCtx) -> Result<Outputs, OpError> {
    let x = input(inputs, 0)?;
    let k = match t.k {
        Some(k) => k,
        None => match read_i64s(input(inputs, 1)?, "K")?.as_slice() {
            [k] => *k,
            other => {
                return Err(OpError::value(format!(
                    "K must hold exactly one value, got {}",
                    other.len()
                )));
            }
        },
    };
    let dims = x.dims();
    let axis = norm_axis(t.axis, dims.len())?;
    let lanes = split_at_axis(dims, axis);
    let n = lanes.n;
    let k = usize::try_from(k).ok().filter(|&k| k <= n).ok_or_else(|| {
        OpError::value(format!(
            "K = {k} must be in 0..={n} (axis {axis} of input shape {})",
            x.shape()
        ))
    })?;
    let mut out_dims: Small<usize> = Small::from_slice(dims);
    out_dims[axis] = k;
    let mut values = ctx.alloc(x.dtype(), out_dims.as_slice())?;
    let mut indices = ctx.alloc(DType::I64, out_dims)?;
    let largest = t.largest;
    dispatch_num!(x.dtype(), T => kr::top_k(x.as_slice::<T>()?, lanes, k, largest, values.as_mut_slice::<T>()?, indices.as_mut_slice::<i64>()?, ctx.pool).map_err(OpError::from))?;
    Ok(smallvec![values, indices])
}

fn cumsum(c: &CumSum, x: &Tensor, axis: &Tensor, ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let axis = match read_i64s(axis, "axis")?.as_slice() {
        [a] => *a,
        other => {
            return Err(OpError::value(format!(
                "axis must hold exactly one value, got {}",
                other.len()
            )));
        }
    };
    let dims = x.dims();
    let axis = norm_axis(axis, dims.len())?;
    let lanes = split_at_axis(dims, axis);
    let mut out = ctx.alloc(x.dtype(), x.shape().clone())?;
    let (exclusive, reverse) = (c.exclusive, c.reverse);
    dispatch_num!(x.dtype(), T => kr::cumsum(x.as_slice::<T>()?, lanes, exclusive, reverse, out.as_mut_slice::<T>()?, ctx.pool).map_err(OpError::from))?;
    Ok(out)
}

fn softmax(s: &Softmax, x: &Tensor, ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let dims = x.dims();
    let axis = norm_axis(s.axis, dims.len())?;
    let Lanes { outer, n, inner } = if s.flatten {
        // Opset < 13: coerce to 2-D at `axis` and normalize each row.
        Lanes {
            outer: dims[..axis].iter().product(),
            n: dims[axis..].iter().product(),
            inner: 1,
        }
    } else {
        split_at_axis(dims, axis)
    };
    let kind = match (s.hard, s.log) {
        (true, _) => SoftmaxKind::Hardmax,
        (false, true) => SoftmaxKind::LogSoftmax,
        (false, false) => SoftmaxKind::Softmax,
    };
    let mut out = ctx.alloc(x.dtype(), x.shape().clone())?;
    dispatch_float!(x.dtype(), T => ks::softmax(kind, x.as_slice::<T>()?, outer, n, inner, out.as_mut_slice::<T>()?, ctx.pool).map_err(OpError::from))?;
    Ok(out)
}
