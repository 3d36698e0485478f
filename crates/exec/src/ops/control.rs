//! ONNX `If`, `Loop` and `Scan`: each branch or body runs as a [`NativeSession`] of its own,
//! built once with the node's session, which holds the subgraph from then on
//! ([`crate::lower::Lowered::Control`]: `If`'s then and else branches, a loop's body). A call feeds a subgraph its formal inputs, then copies of the values it
//! captures from enclosing graphs.
//!
//! Slicing and stacking (`Loop`'s scan outputs, `Scan`) move whole elements as bytes, so every
//! dtype of at least one byte works; sub-byte dtypes are refused.

use oxgen_graph::Op;
use oxgen_graph::ops::{If, Loop, Scan, Subgraph};
use oxgen_tensor::{DType, Tensor};
use smallvec::SmallVec;
use std::cell::RefMut;

use super::{OpCtx, Outputs, input, norm_axis, opt_input, read_i64s};
use crate::{ExecError, NativeSession, OpError};

pub(super) fn run(
    op: &Op,
    inputs: &[Option<&Tensor>],
    n_outputs: usize,
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError> {
    match op {
        Op::If(i) => run_if(i, inputs, ctx),
        Op::Loop(l) => run_loop(l, inputs, n_outputs, ctx),
        Op::Scan(s) => run_scan(s, inputs, ctx),
        _ => unreachable!("ops::run routes only control flow here"),
    }
}

/// The session of subgraph `k` of the node.
fn session<'a>(ctx: &OpCtx<'a>, k: usize) -> Result<RefMut<'a, NativeSession>, OpError> {
    ctx.lowered.subgraph(k).ok_or_else(|| {
        OpError::value("control flow runs only inside a session (not while folding constants)")
    })
}

/// Runs `sub` on `formal` inputs plus copies of its captures (from the node's `inputs`).
fn call(
    session: &mut NativeSession,
    sub: &Subgraph,
    formal: impl IntoIterator<Item = Tensor>,
    inputs: &[Option<&Tensor>],
) -> Result<Vec<Tensor>, OpError> {
    let mut ins: Vec<Option<Tensor>> = formal.into_iter().map(Some).collect();
    for &k in &sub.inputs {
        ins.push(Some(input(inputs, k)?.clone()));
    }
    let mut outs = vec![None; session.graph().outputs.len()];
    session
        .run_ordered(&mut ins, &mut outs)
        .map_err(|e| match e {
            ExecError::Node { node, source } => {
                OpError::value(format!("in the subgraph, {node}: {source}"))
            }
            other => OpError::value(format!("in the subgraph: {other}")),
        })?;
    Ok(outs
        .into_iter()
        .map(|t| t.expect("a successful run fills every output"))
        .collect())
}

/// A one-element bool tensor's value.
fn flag(t: &Tensor, what: &str) -> Result<bool, OpError> {
    if t.dtype() != DType::Bool || t.numel() != 1 {
        return Err(OpError::value(format!(
            "{what} must be one bool, got {} of shape {}",
            t.dtype(),
            t.shape()
        )));
    }
    Ok(t.as_bytes()[0] != 0)
}

fn run_if(op: &If, inputs: &[Option<&Tensor>], ctx: &mut OpCtx) -> Result<Outputs, OpError> {
    let cond = flag(input(inputs, 0)?, "cond")?;
    let (k, branch) = if cond {
        (0, &op.then_branch)
    } else {
        (1, &op.else_branch)
    };
    Ok(call(&mut *session(ctx, k)?, branch, [], inputs)?.into())
}

/// Element size in bytes, refusing sub-byte dtypes.
fn elem_bytes(dtype: DType) -> Result<usize, OpError> {
    if !dtype.bits().is_multiple_of(8) {
        return Err(OpError::DType {
            dtype,
            detail: ": control flow slices and stacks whole bytes".into(),
        });
    }
    Ok(dtype.bits() / 8)
}

/// Stacks `slices` (one shape and dtype) along a new axis `axis` of the result, slice `t`
/// at index `order(t)`.
fn stack(
    slices: &[Tensor],
    axis: usize,
    order: impl Fn(usize) -> usize,
) -> Result<Tensor, OpError> {
    let first = &slices[0];
    let (dtype, dims) = (first.dtype(), first.dims());
    if let Some(bad) = slices
        .iter()
        .find(|s| s.dtype() != dtype || s.dims() != dims)
    {
        return Err(OpError::shape(format!(
            "scan output slices differ: {} {} then {} {}",
            dtype,
            first.shape(),
            bad.dtype(),
            bad.shape()
        )));
    }
    let n = slices.len();
    let mut out_dims: SmallVec<[usize; 8]> = SmallVec::from_slice(dims);
    out_dims.insert(axis, n);
    let outer: usize = dims[..axis].iter().product();
    let inner = dims[axis..].iter().product::<usize>() * elem_bytes(dtype)?;
    let mut out = Tensor::zeros(dtype, &out_dims[..])?;
    let bytes = out.as_mut_bytes();
    for (t, s) in slices.iter().enumerate() {
        let at = order(t);
        let src = s.as_bytes();
        for o in 0..outer {
            bytes[(o * n + at) * inner..][..inner].copy_from_slice(&src[o * inner..][..inner]);
        }
    }
    Ok(out)
}

fn run_loop(
    op: &Loop,
    inputs: &[Option<&Tensor>],
    n_outputs: usize,
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError> {
    let mut body = session(ctx, 0)?;
    let carried = body.graph().inputs.len() - 2;
    let trips = match opt_input(inputs, 0) {
        Some(m) => match read_i64s(m, "M")?[..] {
            [m] => Some(m),
            _ => return Err(OpError::shape("M (the trip count) must hold one value")),
        },
        None => None,
    };
    let mut cond = match opt_input(inputs, 1) {
        Some(c) => flag(c, "cond")?,
        None => true,
    };
    if trips.is_none() && opt_input(inputs, 1).is_none() {
        return Err(OpError::value(
            "Loop has neither M nor cond, so it would never end",
        ));
    }
    let mut values: Vec<Tensor> = (0..carried)
        .map(|k| input(inputs, 2 + k).cloned())
        .collect::<Result<_, _>>()?;
    let scans = n_outputs - carried;
    let mut slices: Vec<Vec<Tensor>> = vec![Vec::new(); scans];
    let mut i: i64 = 0;
    while cond && trips.is_none_or(|m| i < m) {
        let formal = [Tensor::scalar(i), Tensor::from_bools([], &[cond])?]
            .into_iter()
            .chain(values.drain(..));
        let mut outs = call(&mut body, &op.body, formal, inputs)?.into_iter();
        cond = flag(
            &outs.next().expect("the body returns cond first"),
            "the body's cond",
        )?;
        values.extend(outs.by_ref().take(carried));
        for (k, t) in outs.enumerate() {
            slices[k].push(t);
        }
        i += 1;
    }
    let mut out: Outputs = values.into_iter().collect();
    for (k, s) in slices.iter().enumerate() {
        if s.is_empty() {
            // No iteration ran: an empty stack of what the body declares.
            let graph = body.graph();
            let declared = graph.value(graph.outputs[1 + carried + k]);
            let dims: Option<Vec<usize>> = (declared.dims.iter().flatten())
                .map(|d| match d {
                    oxgen_graph::Dim::Fixed(n) => Some(*n),
                    _ => None,
                })
                .collect();
            let (Some(dtype), Some(mut dims)) = (declared.dtype, dims) else {
                return Err(OpError::shape(format!(
                    "scan output {k} of a loop that ran no iteration has no declared type and shape"
                )));
            };
            dims.insert(0, 0);
            out.push(Tensor::zeros(dtype, &dims[..])?);
        } else {
            out.push(stack(s, 0, |t| t)?);
        }
    }
    Ok(out)
}

/// Slice `t` of `x` along `axis` (that axis removed).
fn slice_at(x: &Tensor, axis: usize, t: usize) -> Result<Tensor, OpError> {
    let dims = x.dims();
    let n = dims[axis];
    let outer: usize = dims[..axis].iter().product();
    let inner = dims[axis + 1..].iter().product::<usize>() * elem_bytes(x.dtype())?;
    let mut out_dims: SmallVec<[usize; 8]> = SmallVec::from_slice(dims);
    out_dims.remove(axis);
    let mut out = Tensor::zeros(x.dtype(), &out_dims[..])?;
    let (src, dst) = (x.as_bytes(), out.as_mut_bytes());
    for o in 0..outer {
        dst[o * inner..][..inner].copy_from_slice(&src[(o * n + t) * inner..][..inner]);
    }
    Ok(out)
}

fn run_scan(op: &Scan, inputs: &[Option<&Tensor>], ctx: &mut OpCtx) -> Result<Outputs, OpError> {
    let m = op.num_scan_inputs;
    let mut body = session(ctx, 0)?;
    let n = body.graph().inputs.len() - m;
    let mut states: Vec<Tensor> = (0..n)
        .map(|k| input(inputs, k).cloned())
        .collect::<Result<_, _>>()?;
    let mut scanned = Vec::with_capacity(m);
    let mut length = None;
    for j in 0..m {
        let x = input(inputs, n + j)?;
        let axis = norm_axis(op.input_axes[j], x.rank())?;
        let len = x.dims()[axis];
        if length.is_some_and(|l| l != len) {
            return Err(OpError::shape(format!(
                "scanned input {j} has {len} slices along axis {axis}, an earlier one {}",
                length.unwrap_or(0)
            )));
        }
        length = Some(len);
        scanned.push((x, axis));
    }
    let length = length.unwrap_or(0);
    if length == 0 {
        return Err(OpError::shape("the scanned inputs have no slices"));
    }
    let k = op.output_axes.len();
    let mut slices: Vec<Vec<Tensor>> = vec![Vec::new(); k];
    for t in 0..length {
        let mut formal = std::mem::take(&mut states);
        for (j, &(x, axis)) in scanned.iter().enumerate() {
            let at = if op.input_reverse[j] {
                length - 1 - t
            } else {
                t
            };
            formal.push(slice_at(x, axis, at)?);
        }
        let mut outs = call(&mut body, &op.body, formal, inputs)?.into_iter();
        states.extend(outs.by_ref().take(n));
        for (q, s) in outs.enumerate() {
            slices[q].push(s);
        }
    }
    let mut out: Outputs = states.into_iter().collect();
    for (q, s) in slices.iter().enumerate() {
        let axis = norm_axis(op.output_axes[q], s[0].rank() + 1)?;
        let reverse = op.output_reverse[q];
        out.push(stack(
            s,
            axis,
            |t| if reverse { length - 1 - t } else { t },
        )?);
    }
    Ok(out)
}
