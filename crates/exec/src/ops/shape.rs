//! Shape and data-movement ops: ConstantOfShape, Shape, Size, Reshape, Flatten, Squeeze,
//! Unsqueeze, Transpose, Concat, Split, Slice, Expand, Tile, Range, Gather, GatherElements,
//! ScatterND and Trilu.
//!
//! Each op resolves its output shape here, following the ONNX operator spec for every opset
//! the graph builders accept (attributes before opset 10/13, inputs after), then hands plain
//! slices to `oxgen_kernels::{layout, transpose, gather}`. Data movement works for every
//! dtype with an element type; shape, axis and index inputs are int64 or int32. Values that
//! came from tensors (indices, sizes, axes) are checked and reported as [`OpError`]s.

use oxgen_graph::Op;
use oxgen_graph::ops::{ScatterND, ScatterReduction, Slice, Split, Squeeze};
use oxgen_kernels::broadcast::broadcast_shape;
use oxgen_kernels::layout;
use oxgen_kernels::{Scalar, gather, transpose};
use oxgen_tensor::{DType, Element, Tensor};

use super::{OpCtx, input, norm_axis, opt_input, read_i64s};
use smallvec::{SmallVec, smallvec};

use super::{Outputs, Small, owned_input};
use crate::OpError;

pub(super) fn run(
    op: &Op,
    inputs: &[Option<&Tensor>],
    donated: &mut [Option<Tensor>],
    n_outputs: usize,
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError> {
    let one = |t: Tensor| -> Outputs { smallvec![t] };
    // The view ops own their input when the executor donates it (its last use), so they
    // relabel the buffer instead of copying it.
    let mut x = || owned_input(inputs, donated, 0);
    match op {
        Op::ConstantOfShape(value) => constant_of_shape(value, input(inputs, 0)?, ctx).map(one),
        Op::Shape { start, end } => shape(input(inputs, 0)?, *start, *end, ctx).map(one),
        Op::Size => size(input(inputs, 0)?, ctx).map(one),
        Op::Reshape { allowzero } => reshape(x()?, input(inputs, 1)?, *allowzero).map(one),
        Op::Flatten { axis } => flatten(x()?, *axis).map(one),
        Op::Squeeze(s) => squeeze(s, x()?, inputs).map(one),
        Op::Unsqueeze(s) => unsqueeze(s, x()?, inputs).map(one),
        Op::Transpose { perm } => transpose_op(input(inputs, 0)?, perm.as_deref(), ctx).map(one),
        Op::Concat { axis } => concat(inputs, *axis, ctx).map(one),
        Op::Split(s) => split(s, inputs, n_outputs, ctx),
        Op::Slice(s) => slice(s, inputs, ctx).map(one),
        Op::Expand => expand(input(inputs, 0)?, input(inputs, 1)?, ctx).map(one),
        Op::Tile => tile(input(inputs, 0)?, input(inputs, 1)?, ctx).map(one),
        Op::Range => range(input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?, ctx).map(one),
        Op::Gather(g) => gather_op(input(inputs, 0)?, input(inputs, 1)?, g.axis, ctx).map(one),
        Op::GatherElements { axis } => {
            gather_elements(input(inputs, 0)?, input(inputs, 1)?, *axis, ctx).map(one)
        }
        Op::ScatterND(s) => scatter_nd(
            s,
            input(inputs, 0)?,
            input(inputs, 1)?,
            input(inputs, 2)?,
            ctx,
        )
        .map(one),
        Op::Trilu { upper } => trilu(input(inputs, 0)?, opt_input(inputs, 1), *upper, ctx).map(one),
        _ => unreachable!("ops::run routes only shape ops here"),
    }
}

/// Reads a 1-D (or scalar) int tensor of non-negative sizes, such as a shape or repeats.
fn read_sizes(t: &Tensor, what: &str) -> Result<Small<usize>, OpError> {
    if t.rank() > 1 {
        return Err(OpError::shape(format!(
            "{what} must be 1-D, got shape {}",
            t.shape()
        )));
    }
    read_i64s(t, what)?
        .into_iter()
        .map(|v| {
            usize::try_from(v)
                .map_err(|_| OpError::value(format!("{what} holds {v}; sizes must be >= 0")))
        })
        .collect()
}

/// Reads a single int64/int32 scalar (or one-element tensor).
fn read_scalar_i64(t: &Tensor, what: &str) -> Result<i64, OpError> {
    match read_i64s(t, what)?.as_slice() {
        [v] => Ok(*v),
        _ => Err(OpError::shape(format!(
            "{what} must be a scalar, got shape {}",
            t.shape()
        ))),
    }
}

/// Normalizes a list of axes against `rank`, rejecting repeats.
fn norm_axes(axes: &[i64], rank: usize, what: &str) -> Result<Small<usize>, OpError> {
    let mut seen: Small<bool> = smallvec![false; rank];
    axes.iter()
        .map(|&a| {
            let a = norm_axis(a, rank).map_err(|e| OpError::value(format!("{what}: {e}")))?;
            if std::mem::replace(&mut seen[a], true) {
                return Err(OpError::value(format!("{what} {axes:?} repeats axis {a}")));
            }
            Ok(a)
        })
        .collect()
}

fn checked_numel(dims: &[usize]) -> Result<usize, OpError> {
    oxgen_tensor::checked_numel(dims)
        .ok_or_else(|| OpError::shape(format!("shape {dims:?} overflows")))
}

fn constant_of_shape(value: &Tensor, shape: &Tensor, ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let dims = read_sizes(shape, "ConstantOfShape's shape input")?;
    checked_numel(&dims)?;
    let mut out = ctx.alloc(value.dtype(), dims)?;
    dispatch_any!(value.dtype(), T => {
        let v = *value.as_slice::<T>()?.first().ok_or_else(|| OpError::value("ConstantOfShape's value is empty"))?;
        out.as_mut_slice::<T>()?.fill(v);
        Ok::<(), OpError>(())
    })?;
    Ok(out)
}

fn i64_vector(values: &[i64], ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let mut out = ctx.alloc(DType::I64, [values.len()])?;
    out.as_mut_slice::<i64>()?.copy_from_slice(values);
    Ok(out)
}

/// Shape (opset 15): `start`/`end` count from the back when negative and clamp to `0..=rank`.
fn shape(x: &Tensor, start: i64, end: Option<i64>, ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let r = x.rank() as i64;
    let clamp = |v: i64| (if v < 0 { v.saturating_add(r) } else { v }).clamp(0, r) as usize;
    let (s, e) = (clamp(start), clamp(end.unwrap_or(r)));
    let dims: Small<i64> = x.dims()[s..e.max(s)].iter().map(|&d| d as i64).collect();
    i64_vector(&dims, ctx)
}

fn size(x: &Tensor, ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let mut out = ctx.alloc(DType::I64, oxgen_tensor::Shape::scalar())?;
    out.as_mut_slice::<i64>()?[0] = x.numel() as i64;
    Ok(out)
}

/// Reshape: 0 copies the input dimension at the same index (or means 0 with `allowzero`),
/// -1 is inferred from the remaining elements.
fn reshape(x: Tensor, shape: &Tensor, allowzero: bool) -> Result<Tensor, OpError> {
    if shape.rank() != 1 {
        return Err(OpError::shape(format!(
            "Reshape's shape input must be 1-D, got shape {}",
            shape.shape()
        )));
    }
    let spec = read_i64s(shape, "Reshape's shape input")?;
    let mut dims = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &s) in spec.iter().enumerate() {
        let d = match s {
            -1 if infer.is_some() => return Err(OpError::value(format!("Reshape's shape {spec:?} has more than one -1"))),
            -1 => {
                infer = Some(i);
                1
            }
            0 if allowzero => 0,
            0 => *x.dims().get(i).ok_or_else(|| {
                OpError::value(format!("Reshape's shape {spec:?} has 0 at index {i}, past the input rank {} (0 copies the input dimension)", x.rank()))
            })?,
            s if s < 0 => return Err(OpError::value(format!("Reshape's shape {spec:?} holds {s}; only -1 may be negative"))),
            s => usize::try_from(s).map_err(|_| OpError::value(format!("Reshape dimension {s} does not fit in memory")))?,
        };
        dims.push(d);
    }
    let n = x.numel();
    if let Some(i) = infer {
        if allowzero && spec.contains(&0) {
            return Err(OpError::value(format!(
                "Reshape's shape {spec:?} has both 0 and -1 with allowzero=1"
            )));
        }
        let known = checked_numel(&dims)?;
        if known == 0 || !n.is_multiple_of(known) {
            return Err(OpError::shape(format!(
                "cannot reshape {} ({n} elements) to {spec:?}: the -1 dimension cannot be inferred",
                x.shape()
            )));
        }
        dims[i] = n / known;
    }
    if checked_numel(&dims)? != n {
        return Err(OpError::shape(format!(
            "cannot reshape {} ({n} elements) to {dims:?}",
            x.shape()
        )));
    }
    Ok(x.reshape(dims)?)
}

/// Flatten: `[Π dims[..axis], Π dims[axis..]]`, with `-rank <= axis <= rank`.
fn flatten(x: Tensor, axis: i64) -> Result<Tensor, OpError> {
    let r = x.rank() as i64;
    if axis < -r || axis > r {
        return Err(OpError::value(format!(
            "Flatten axis {axis} is out of range for rank {r} (valid: -{r}..={r})"
        )));
    }
    let axis = if axis < 0 { axis + r } else { axis } as usize;
    let outer: usize = x.dims()[..axis].iter().product();
    let inner: usize = x.dims()[axis..].iter().product();
    Ok(x.reshape([outer, inner])?)
}

/// Axes from the attribute (opset < 13) or the optional input 1 (opset 13+).
fn squeeze_axes(s: &Squeeze, inputs: &[Option<&Tensor>]) -> Result<Option<Small<i64>>, OpError> {
    match (&s.axes, opt_input(inputs, 1)) {
        (Some(a), _) => Ok(Some(Small::from_slice(a))),
        (None, Some(t)) => Ok(Some(read_i64s(t, "axes")?)),
        (None, None) => Ok(None),
    }
}

fn squeeze(s: &Squeeze, x: Tensor, inputs: &[Option<&Tensor>]) -> Result<Tensor, OpError> {
    let dims: Small<usize> = match squeeze_axes(s, inputs)? {
        None => x.dims().iter().copied().filter(|&d| d != 1).collect(),
        Some(axes) => {
            let axes = norm_axes(&axes, x.rank(), "Squeeze axes")?;
            if let Some(&a) = axes.iter().find(|&&a| x.dims()[a] != 1) {
                return Err(OpError::shape(format!(
                    "cannot squeeze axis {a} of shape {}: its size is not 1",
                    x.shape()
                )));
            }
            x.dims()
                .iter()
                .enumerate()
                .filter(|(i, _)| !axes.contains(i))
                .map(|(_, &d)| d)
                .collect()
        }
    };
    Ok(x.reshape(dims)?)
}

fn unsqueeze(s: &Squeeze, x: Tensor, inputs: &[Option<&Tensor>]) -> Result<Tensor, OpError> {
    let axes =
        squeeze_axes(s, inputs)?.ok_or_else(|| OpError::value("Unsqueeze needs axes (input 1)"))?;
    let rank = x.rank() + axes.len();
    let axes = norm_axes(&axes, rank, "Unsqueeze axes")?;
    let mut src = x.dims().iter();
    let dims: Small<usize> = (0..rank)
        .map(|i| {
            if axes.contains(&i) {
                Some(1)
            } else {
                src.next().copied()
            }
        })
        .collect::<Option<_>>()
        .ok_or_else(|| OpError::shape("Unsqueeze output rank mismatch"))?;
    Ok(x.reshape(dims)?)
}

fn transpose_op(x: &Tensor, perm: Option<&[i64]>, ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let rank = x.rank();
    let perm: Small<usize> = match perm {
        Some(p) => {
            if p.len() != rank {
                return Err(OpError::value(format!(
                    "Transpose perm {p:?} has {} entries for input rank {rank}",
                    p.len()
                )));
            }
            norm_axes(p, rank, "Transpose perm")?
        }
        None => (0..rank).rev().collect(),
    };
    let out_dims = transpose::transposed_dims(x.dims(), &perm);
    let mut out = ctx.alloc(x.dtype(), out_dims)?;
    dispatch_any!(x.dtype(), T => transpose::transpose(x.as_slice::<T>()?, x.dims(), &perm, out.as_mut_slice::<T>()?).map_err(OpError::from))?;
    Ok(out)
}

fn concat(inputs: &[Option<&Tensor>], axis: i64, ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let parts: SmallVec<[&Tensor; 8]> = (0..inputs.len())
        .map(|i| input(inputs, i))
        .collect::<Result<_, _>>()?;
    let first = *parts
        .first()
        .ok_or_else(|| OpError::value("Concat needs at least one input"))?;
    let rank = first.rank();
    let axis = norm_axis(axis, rank)?;
    let mut out_dims: Small<usize> = Small::from_slice(first.dims());
    out_dims[axis] = 0;
    for (i, p) in parts.iter().enumerate() {
        if p.dtype() != first.dtype() {
            return Err(OpError::DType {
                dtype: p.dtype(),
                detail: format!(
                    " for Concat input {i}: all inputs must be {}",
                    first.dtype()
                ),
            });
        }
        let same = p.rank() == rank
            && p.dims()
                .iter()
                .zip(first.dims())
                .enumerate()
                .all(|(d, (a, b))| d == axis || a == b);
        if !same {
            return Err(OpError::shape(format!(
                "Concat input {i} has shape {} but input 0 has {}; only axis {axis} may differ",
                p.shape(),
                first.shape()
            )));
        }
        out_dims[axis] = out_dims[axis]
            .checked_add(p.dims()[axis])
            .ok_or_else(|| OpError::shape("Concat output overflows"))?;
    }
    checked_numel(&out_dims)?;
    let outer: usize = first.dims()[..axis].iter().product();
    let inner: usize = first.dims()[axis + 1..].iter().product();
    let part_inner: Small<usize> = parts.iter().map(|p| p.dims()[axis] * inner).collect();
    let mut out = ctx.alloc(first.dtype(), out_dims)?;
    dispatch_any!(first.dtype(), T => {
        let slices: SmallVec<[&[T]; 8]> = parts.iter().map(|p| p.as_slice::<T>()).collect::<Result<_, _>>()?;
        layout::concat(&slices, outer, &part_inner, out.as_mut_slice::<T>()?).map_err(OpError::from)
    })?;
    Ok(out)
}

/// Split sizes: the attribute (opset < 13), input 1 (opset 13+), or `n_outputs` near-equal
/// parts: `ceil(dim / n)` each, the last one smaller (opset 18's `num_outputs`).
fn split_sizes(
    s: &Split,
    inputs: &[Option<&Tensor>],
    dim: usize,
    n_outputs: usize,
) -> Result<Vec<usize>, OpError> {
    let given = match (&s.split, opt_input(inputs, 1)) {
        (Some(v), _) => Some(v.clone()),
        // An empty split tensor means "not given", as onnxruntime reads it.
        (None, Some(t)) if t.numel() > 0 => Some(read_i64s(t, "Split's split input")?.to_vec()),
        (None, _) => None,
    };
    let sizes = match given {
        Some(v) => {
            let sizes = v
                .iter()
                .map(|&x| {
                    usize::try_from(x)
                        .map_err(|_| OpError::value(format!("split sizes {v:?} must be >= 0")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            if sizes.iter().try_fold(0usize, |a, &b| a.checked_add(b)) != Some(dim) {
                return Err(OpError::shape(format!(
                    "split sizes {v:?} do not add up to the axis size {dim}"
                )));
            }
            sizes
        }
        None => {
            let n = n_outputs.max(1);
            let chunk = dim.div_ceil(n);
            let head = chunk * (n - 1);
            if head > dim {
                return Err(OpError::shape(format!(
                    "cannot split an axis of size {dim} into {n} parts of {chunk} (the last part would be negative)"
                )));
            }
            let mut sizes = vec![chunk; n];
            sizes[n - 1] = dim - head;
            sizes
        }
    };
    if sizes.len() != n_outputs {
        return Err(OpError::value(format!(
            "Split produces {} parts but the node has {n_outputs} outputs",
            sizes.len()
        )));
    }
    Ok(sizes)
}

fn split(
    s: &Split,
    inputs: &[Option<&Tensor>],
    n_outputs: usize,
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError> {
    let x = input(inputs, 0)?;
    let axis = norm_axis(s.axis, x.rank())?;
    let sizes = split_sizes(s, inputs, x.dims()[axis], n_outputs)?;
    let outer: usize = x.dims()[..axis].iter().product();
    let inner: usize = x.dims()[axis + 1..].iter().product();
    let mut outs = Vec::with_capacity(sizes.len());
    for &size in &sizes {
        let mut dims: Small<usize> = Small::from_slice(x.dims());
        dims[axis] = size;
        outs.push(ctx.alloc(x.dtype(), dims)?);
    }
    let part_inner: Small<usize> = sizes.iter().map(|&s| s * inner).collect();
    dispatch_any!(x.dtype(), T => {
        let mut slices: Vec<&mut [T]> = outs.iter_mut().map(|o| o.as_mut_slice::<T>()).collect::<Result<_, _>>()?;
        layout::split(x.as_slice::<T>()?, outer, &part_inner, &mut slices).map_err(OpError::from)
    })?;
    Ok(outs.into())
}

/// One axis of a slice after the spec's clamping: first element, step and output length.
fn slice_axis(start: i64, end: i64, step: i64, dim: usize) -> (usize, isize, usize) {
    let d = dim as i128;
    let (mut s, mut e, st) = (start as i128, end as i128, step as i128);
    if s < 0 {
        s += d;
    }
    if e < 0 {
        e += d;
    }
    let len = if st > 0 {
        let (s, e) = (s.clamp(0, d), e.clamp(0, d));
        let len = if e > s { (e - s + st - 1) / st } else { 0 };
        (s, len)
    } else {
        let (s, e) = (s.clamp(0, (d - 1).max(0)), e.clamp(-1, (d - 1).max(-1)));
        let len = if s > e && d > 0 {
            (s - e + (-st) - 1) / (-st)
        } else {
            0
        };
        (s, len)
    };
    // Start and length are bounded by `dim`. A step only matters when it takes two or more
    // elements, and then it is below `dim`; otherwise 1 keeps the kernel's strides small.
    let step = if len.1 > 1 { step as isize } else { 1 };
    (len.0 as usize, step, len.1 as usize)
}

fn slice(s: &Slice, inputs: &[Option<&Tensor>], ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let x = input(inputs, 0)?;
    let rank = x.rank();
    let list =
        |attr: &Option<Vec<i64>>, i: usize, what: &str| -> Result<Option<Vec<i64>>, OpError> {
            match (attr, opt_input(inputs, i)) {
                (Some(v), _) => Ok(Some(v.clone())),
                (None, Some(t)) => Ok(Some(read_i64s(t, what)?.to_vec())),
                (None, None) => Ok(None),
            }
        };
    let starts = list(&s.starts, 1, "Slice starts")?
        .ok_or_else(|| OpError::value("Slice needs starts (input 1)"))?;
    let ends = list(&s.ends, 2, "Slice ends")?
        .ok_or_else(|| OpError::value("Slice needs ends (input 2)"))?;
    let axes =
        list(&s.axes, 3, "Slice axes")?.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = list(&None, 4, "Slice steps")?.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(OpError::shape(format!(
            "Slice starts, ends, axes and steps must have equal lengths, got {}, {}, {}, {}",
            starts.len(),
            ends.len(),
            axes.len(),
            steps.len()
        )));
    }
    let axes = norm_axes(&axes, rank, "Slice axes")?;
    let mut first = vec![0usize; rank];
    let mut step = vec![1isize; rank];
    let mut out_dims: Small<usize> = Small::from_slice(x.dims());
    for (k, &a) in axes.iter().enumerate() {
        if steps[k] == 0 {
            return Err(OpError::value(format!("Slice step for axis {a} is 0")));
        }
        (first[a], step[a], out_dims[a]) = slice_axis(starts[k], ends[k], steps[k], x.dims()[a]);
    }
    let mut out = ctx.alloc(x.dtype(), out_dims.as_slice())?;
    dispatch_any!(x.dtype(), T => layout::slice(x.as_slice::<T>()?, x.dims(), &first, &step, &out_dims, out.as_mut_slice::<T>()?).map_err(OpError::from))?;
    Ok(out)
}

/// Expand: bidirectional (NumPy) broadcast of the input with the requested shape.
fn expand(x: &Tensor, shape: &Tensor, ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let want = read_sizes(shape, "Expand's shape input")?;
    let out_dims = broadcast_shape(&[x.dims(), &want]).ok_or_else(|| {
        OpError::shape(format!(
            "input shape {} cannot broadcast to {want:?}",
            x.shape()
        ))
    })?;
    checked_numel(&out_dims)?;
    let mut out = ctx.alloc(x.dtype(), out_dims.as_slice())?;
    dispatch_any!(x.dtype(), T => layout::expand(x.as_slice::<T>()?, x.dims(), &out_dims, out.as_mut_slice::<T>()?).map_err(OpError::from))?;
    Ok(out)
}

fn tile(x: &Tensor, repeats: &Tensor, ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let reps = read_sizes(repeats, "Tile's repeats input")?;
    if reps.len() != x.rank() {
        return Err(OpError::shape(format!(
            "Tile repeats {reps:?} has {} entries for input rank {}",
            reps.len(),
            x.rank()
        )));
    }
    let out_dims: Small<usize> = x
        .dims()
        .iter()
        .zip(&reps)
        .map(|(&d, &r)| d.checked_mul(r))
        .collect::<Option<_>>()
        .ok_or_else(|| {
            OpError::shape(format!("Tile output of {} x {reps:?} overflows", x.shape()))
        })?;
    checked_numel(&out_dims)?;
    let mut out = ctx.alloc(x.dtype(), out_dims)?;
    dispatch_any!(x.dtype(), T => layout::tile(x.as_slice::<T>()?, x.dims(), &reps, out.as_mut_slice::<T>()?).map_err(OpError::from))?;
    Ok(out)
}

fn scalar_of<T: Element>(t: &Tensor, what: &str) -> Result<T, OpError> {
    match t.as_slice::<T>()? {
        [v] => Ok(*v),
        _ => Err(OpError::shape(format!(
            "Range's {what} must be a scalar, got shape {}",
            t.shape()
        ))),
    }
}

/// Range's element count, `max(ceil((limit - start) / delta), 0)`.
fn range_count(count: f64) -> Result<usize, OpError> {
    if count.is_nan() || count == f64::INFINITY {
        return Err(OpError::value(format!(
            "Range would produce {count} elements"
        )));
    }
    let n = count.ceil().max(0.0);
    if n > isize::MAX as f64 {
        return Err(OpError::value(format!("Range would produce {n} elements")));
    }
    Ok(n as usize)
}

fn range_typed<T: Scalar + Element>(
    start: &Tensor,
    limit: &Tensor,
    delta: &Tensor,
    ctx: &mut OpCtx,
    int: Option<fn(T) -> i128>,
) -> Result<Tensor, OpError> {
    let (s, l, d) = (
        scalar_of::<T>(start, "start")?,
        scalar_of::<T>(limit, "limit")?,
        scalar_of::<T>(delta, "delta")?,
    );
    if d == T::ZERO {
        return Err(OpError::value("Range's delta is 0"));
    }
    let n = match int {
        // Exact integer count: ceil division in i128.
        Some(wide) => {
            let (s, l, d) = (wide(s), wide(l), wide(d));
            let (num, den) = if d > 0 { (l - s, d) } else { (s - l, -d) };
            range_count(if num <= 0 {
                0.0
            } else {
                ((num + den - 1) / den) as f64
            })?
        }
        // As onnxruntime: the difference in T, the division in f64.
        None => range_count(l.sub(s).to_f64() / d.to_f64())?,
    };
    let mut out = ctx.alloc(T::DTYPE, [n])?;
    layout::range(s, d, out.as_mut_slice::<T>()?);
    Ok(out)
}

fn range(
    start: &Tensor,
    limit: &Tensor,
    delta: &Tensor,
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let dt = start.dtype();
    if let Some(t) = [limit, delta].into_iter().find(|t| t.dtype() != dt) {
        return Err(OpError::DType {
            dtype: t.dtype(),
            detail: format!(" for Range: start, limit and delta must all be {dt}"),
        });
    }
    match dt {
        DType::I64 => range_typed::<i64>(start, limit, delta, ctx, Some(|v| v as i128)),
        DType::I32 => range_typed::<i32>(start, limit, delta, ctx, Some(|v| v as i128)),
        DType::I16 => range_typed::<i16>(start, limit, delta, ctx, Some(|v| v as i128)),
        DType::I8 => range_typed::<i8>(start, limit, delta, ctx, Some(|v| v as i128)),
        DType::U64 => range_typed::<u64>(start, limit, delta, ctx, Some(|v| v as i128)),
        DType::U32 => range_typed::<u32>(start, limit, delta, ctx, Some(|v| v as i128)),
        DType::U16 => range_typed::<u16>(start, limit, delta, ctx, Some(|v| v as i128)),
        DType::U8 => range_typed::<u8>(start, limit, delta, ctx, Some(|v| v as i128)),
        _ => dispatch_float!(dt, T => range_typed::<T>(start, limit, delta, ctx, None)),
    }
}

fn gather_op(
    data: &Tensor,
    indices: &Tensor,
    axis: i64,
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let axis = norm_axis(axis, data.rank())?;
    let idx = read_i64s(indices, "Gather indices")?;
    let dd = data.dims();
    let out_dims: Small<usize> = dd[..axis]
        .iter()
        .chain(indices.dims())
        .chain(&dd[axis + 1..])
        .copied()
        .collect();
    checked_numel(&out_dims)?;
    let mut out = ctx.alloc(data.dtype(), out_dims)?;
    dispatch_any!(data.dtype(), T => gather::gather(data.as_slice::<T>()?, dd, axis, &idx, out.as_mut_slice::<T>()?).map_err(OpError::from))?;
    Ok(out)
}

fn gather_elements(
    data: &Tensor,
    indices: &Tensor,
    axis: i64,
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let axis = norm_axis(axis, data.rank())?;
    let idx = read_i64s(indices, "GatherElements indices")?;
    if indices.rank() != data.rank() {
        return Err(OpError::shape(format!(
            "GatherElements indices have shape {} but data has shape {}; ranks must match",
            indices.shape(),
            data.shape()
        )));
    }
    let mut out = ctx.alloc(data.dtype(), indices.shape().clone())?;
    dispatch_any!(data.dtype(), T => {
        gather::gather_elements(data.as_slice::<T>()?, data.dims(), axis, &idx, indices.dims(), out.as_mut_slice::<T>()?).map_err(OpError::from)
    })?;
    Ok(out)
}

fn scatter_typed<T: Scalar + Element>(
    out: &mut Tensor,
    data: &Tensor,
    idx: &[i64],
    indices: &Tensor,
    updates: &Tensor,
    reduction: ScatterReduction,
) -> Result<(), OpError> {
    let f: fn(T, T) -> T = match reduction {
        ScatterReduction::None => |_, u| u,
        ScatterReduction::Add => T::add,
        ScatterReduction::Mul => T::mul,
        ScatterReduction::Max => |a, u| if u > a { u } else { a },
        ScatterReduction::Min => |a, u| if u < a { u } else { a },
    };
    gather::scatter_nd(
        out.as_mut_slice::<T>()?,
        data.dims(),
        idx,
        indices.dims(),
        updates.as_slice::<T>()?,
        f,
    )
    .map_err(OpError::from)
}

fn scatter_nd(
    s: &ScatterND,
    data: &Tensor,
    indices: &Tensor,
    updates: &Tensor,
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    if updates.dtype() != data.dtype() {
        return Err(OpError::DType {
            dtype: updates.dtype(),
            detail: format!(
                " for ScatterND updates: must match the data's {}",
                data.dtype()
            ),
        });
    }
    let idx = read_i64s(indices, "ScatterND indices")?;
    let (&k, batch) = indices
        .dims()
        .split_last()
        .ok_or_else(|| OpError::shape("ScatterND indices must have rank >= 1"))?;
    if k > data.rank() {
        return Err(OpError::shape(format!(
            "ScatterND indices shape {} addresses {k} axes of data shape {}",
            indices.shape(),
            data.shape()
        )));
    }
    let want: Small<usize> = batch.iter().chain(&data.dims()[k..]).copied().collect();
    if updates.dims() != want.as_slice() {
        return Err(OpError::shape(format!(
            "ScatterND updates have shape {} but indices {} and data {} need {want:?}",
            updates.shape(),
            indices.shape(),
            data.shape()
        )));
    }
    let mut out = ctx.alloc(data.dtype(), data.shape().clone())?;
    out.as_mut_bytes().copy_from_slice(data.as_bytes());
    match s.reduction {
        ScatterReduction::None => dispatch_any!(data.dtype(), T => {
            gather::scatter_nd(out.as_mut_slice::<T>()?, data.dims(), &idx, indices.dims(), updates.as_slice::<T>()?, |_, u| u).map_err(OpError::from)
        })?,
        r => {
            dispatch_num!(data.dtype(), T => scatter_typed::<T>(&mut out, data, &idx, indices, updates, r))?
        }
    }
    Ok(out)
}

fn trilu(x: &Tensor, k: Option<&Tensor>, upper: bool, ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let r = x.rank();
    if r < 2 {
        return Err(OpError::shape(format!(
            "Trilu needs rank >= 2, got shape {}",
            x.shape()
        )));
    }
    let k = match k {
        Some(t) => read_scalar_i64(t, "Trilu's k input")?,
        None => 0,
    };
    let (rows, cols) = (x.dims()[r - 2], x.dims()[r - 1]);
    let mut out = ctx.alloc(x.dtype(), x.shape().clone())?;
    dispatch_any!(x.dtype(), T => layout::trilu(x.as_slice::<T>()?, rows, cols, k, upper, T::default(), out.as_mut_slice::<T>()?).map_err(OpError::from))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_axis_clamps_like_the_spec() {
        // x[1:1000] on 10 -> start 1, len 9
        assert_eq!(slice_axis(1, 1000, 1, 10), (1, 1, 9));
        // x[-1:-1000:-1] on 10 -> start 9, all 10 reversed
        assert_eq!(slice_axis(-1, i64::MIN, -1, 10), (9, -1, 10));
        // INT64 max sentinel end with a negative start
        assert_eq!(slice_axis(-3, i64::MAX, 1, 10), (7, 1, 3));
        // x[20:0:-3] on 10 -> 9, 6, 3
        assert_eq!(slice_axis(20, 0, -3, 10), (9, -3, 3));
        // a huge step takes one element and is not carried into stride arithmetic
        assert_eq!(slice_axis(2, i64::MAX, i64::MAX, 10), (2, 1, 1));
        // empty ranges and empty axes
        assert_eq!(slice_axis(5, 2, 1, 10).2, 0);
        assert_eq!(slice_axis(0, -1, -1, 0).2, 0);
        assert_eq!(slice_axis(0, 5, 1, 0).2, 0);
    }
}
