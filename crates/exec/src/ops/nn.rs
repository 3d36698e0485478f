//! Linear algebra and normalization: MatMul, Gemm, LayerNormalization, RMSNormalization,
//! SimplifiedLayerNormalization and com.microsoft::SkipSimplifiedLayerNormalization (and its
//! LayerNorm sibling).
//!
//! MatMul follows NumPy `matmul`: 1-D operands are promoted (a leading or trailing 1 that is
//! dropped from the result) and batch dimensions broadcast; each batch is a row-major product
//! handed to `oxgen_kernels::matmul` by offset, so broadcast operands are never copied. Gemm
//! materializes transposed operands, then runs the same kernel with its epilogue. The norms
//! view the input as `(rows, n)` with `n` the product of the axes from `axis` on.
//! SkipSimplifiedLayerNormalization normalizes over the last axis; its `skip` may be a suffix
//! of the input's shape (onnxruntime accepts `[seq, hidden]` under `[batch, seq, hidden]`).
//! Reference: ONNX `MatMul`, `Gemm`, `LayerNormalization`, `RMSNormalization` docs;
//! onnxruntime `docs/ContribOperators.md` and `contrib_ops/cpu/skip_layer_norm.cc`.

use std::borrow::Cow;

use oxgen_graph::Op;
use oxgen_graph::ops::{Gemm, Norm, NormKind, SkipNorm};
use oxgen_kernels::acc::Accum;
use oxgen_kernels::broadcast::{self, broadcast_shape, broadcast_strides};
use oxgen_kernels::matmul::{self as km, Bias};
use oxgen_kernels::norm::{self as kn, LayerNormStats, Residual};
use oxgen_tensor::{DType, Element, Tensor};

use super::{OpCtx, input, norm_axis, opt_input};
use smallvec::smallvec;

use super::{Outputs, Small};
use crate::OpError;

pub(super) fn run(
    op: &Op,
    inputs: &[Option<&Tensor>],
    n_outputs: usize,
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError> {
    match op {
        Op::MatMul => matmul(input(inputs, 0)?, input(inputs, 1)?, ctx).map(|t| smallvec![t]),
        Op::Gemm(g) => gemm(g, inputs, ctx).map(|t| smallvec![t]),
        Op::Norm(n) => norm(n, inputs, n_outputs, ctx),
        Op::SkipNorm(s) => skip_norm(s, inputs, n_outputs, ctx),
        _ => unreachable!("ops::run routes only MatMul, Gemm and norms here"),
    }
}

fn same_dtype(a: &Tensor, b: &Tensor, what: &str) -> Result<(), OpError> {
    if a.dtype() == b.dtype() {
        Ok(())
    } else {
        Err(OpError::DType {
            dtype: b.dtype(),
            detail: format!(" for {what}: expected {} like the first input", a.dtype()),
        })
    }
}

/// Batch offsets (in elements) of every broadcast batch of `a` and `b` into their buffers.
fn batch_offsets(
    a_batch: &[usize],
    b_batch: &[usize],
    batch: &[usize],
    a_size: usize,
    b_size: usize,
) -> (Small<usize>, Small<usize>) {
    let (sa, sb) = (
        broadcast_strides(a_batch, batch),
        broadcast_strides(b_batch, batch),
    );
    let count: usize = batch.iter().product();
    let (mut ao, mut bo) = (Small::with_capacity(count), Small::with_capacity(count));
    broadcast::for_each_offset(batch, [&sa, &sb], |_, [ia, ib]| {
        ao.push(ia * a_size);
        bo.push(ib * b_size);
    });
    (ao, bo)
}

/// An f16 or bf16 `A` against f32 tiles widened from its `B` at load: `A` widened, the
/// product accumulated in f32 and rounded once (as the generic path accumulates), through
/// arena buffers.
fn matmul_packed_half<T: Element>(
    a: &Tensor,
    rows: usize,
    tiles: &km::PackedF32,
    dims: Small<usize>,
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError>
where
    [T]: half::slice::HalfFloatSliceExt,
{
    use half::slice::HalfFloatSliceExt;
    let (k, n) = tiles.dims();
    let mut a32 = ctx.alloc(DType::F32, [rows * k])?;
    a.as_slice::<T>()?
        .convert_to_f32_slice(a32.as_mut_slice::<f32>()?);
    let mut out32 = ctx.alloc(DType::F32, [rows * n])?;
    let product = km::matmul_packed_f32(
        a32.as_slice::<f32>()?,
        rows,
        tiles,
        out32.as_mut_slice::<f32>()?,
        ctx.pool,
    );
    let mut out = ctx.alloc(a.dtype(), dims)?;
    out.as_mut_slice::<T>()?
        .convert_from_f32_slice(out32.as_slice::<f32>()?);
    ctx.arena.recycle(a32);
    ctx.arena.recycle(out32);
    product?;
    Ok(out)
}

fn matmul(a: &Tensor, b: &Tensor, ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    same_dtype(a, b, "input B")?;
    if let Some(tiles) = ctx.lowered.tiles()
        && let Some((&k, batch)) = a.dims().split_last()
        && b.dims() == [tiles.dims().0, tiles.dims().1]
        && k == tiles.dims().0
    {
        // B packed at load: every row of A against it, the same bits as below for f32.
        let n = tiles.dims().1;
        let dims: Small<usize> = batch.iter().copied().chain([n]).collect();
        let rows = batch.iter().product();
        match a.dtype() {
            DType::F32 => {
                let mut out = ctx.alloc(DType::F32, dims)?;
                km::matmul_packed_f32(
                    a.as_slice::<f32>()?,
                    rows,
                    tiles,
                    out.as_mut_slice::<f32>()?,
                    ctx.pool,
                )?;
                return Ok(out);
            }
            DType::F16 => return matmul_packed_half::<half::f16>(a, rows, tiles, dims, ctx),
            DType::BF16 => return matmul_packed_half::<half::bf16>(a, rows, tiles, dims, ctx),
            _ => {}
        }
    }
    let (ad, bd) = (a.dims(), b.dims());
    if ad.is_empty() || bd.is_empty() {
        return Err(OpError::shape(format!(
            "MatMul needs inputs of rank 1 or more, got shapes {} and {}",
            a.shape(),
            b.shape()
        )));
    }
    let (ar, br) = (ad.len(), bd.len());
    let (m, k, a_batch) = if ar == 1 {
        (1, ad[0], &[][..])
    } else {
        (ad[ar - 2], ad[ar - 1], &ad[..ar - 2])
    };
    let (k2, n, b_batch) = if br == 1 {
        (bd[0], 1, &[][..])
    } else {
        (bd[br - 2], bd[br - 1], &bd[..br - 2])
    };
    if k != k2 {
        return Err(OpError::shape(format!(
            "MatMul inner dimensions differ: A {} has {k} columns, B {} has {k2} rows",
            a.shape(),
            b.shape()
        )));
    }
    let batch = broadcast_shape(&[a_batch, b_batch]).ok_or_else(|| {
        OpError::shape(format!(
            "MatMul batch dimensions of A {} and B {} cannot broadcast",
            a.shape(),
            b.shape()
        ))
    })?;
    let mut out_dims = batch.clone();
    if ar > 1 {
        out_dims.push(m);
    }
    if br > 1 {
        out_dims.push(n);
    }
    let mut out = ctx.alloc(a.dtype(), out_dims)?;
    let (ao, bo) = batch_offsets(a_batch, b_batch, &batch, m * k, k * n);
    dispatch!(a.dtype(), T => km::matmul_batched(a.as_slice::<T>()?, b.as_slice::<T>()?, out.as_mut_slice::<T>()?, &ao, &bo, (m, k, n), ctx.pool).map_err(OpError::from);
        [F32, F64, F16, BF16, I32, I64, U32, U64])?;
    Ok(out)
}

/// A rank-2 operand, transposed into an arena buffer when `trans` is set.
fn oriented(
    t: &Tensor,
    trans: bool,
    what: &str,
    ctx: &mut OpCtx,
) -> Result<(Option<Tensor>, usize, usize), OpError> {
    let [r, c] = *t.dims() else {
        return Err(OpError::shape(format!(
            "Gemm input {what} must be 2-D, got shape {}",
            t.shape()
        )));
    };
    if !trans {
        return Ok((None, r, c));
    }
    let mut out = ctx.alloc(t.dtype(), [c, r])?;
    dispatch_num!(t.dtype(), T => oxgen_kernels::transpose::transpose(t.as_slice::<T>()?, &[r, c], &[1, 0], out.as_mut_slice::<T>()?).map_err(OpError::from))?;
    Ok((Some(out), c, r))
}

/// Strides that broadcast Gemm's C (rank 0, 1 or 2) to `(m, n)`.
fn bias_strides(c: &Tensor, m: usize, n: usize) -> Result<(usize, usize), OpError> {
    let (rows, cols) = match *c.dims() {
        [] => (1, 1),
        [cols] => (1, cols),
        [rows, cols] => (rows, cols),
        _ => {
            return Err(OpError::shape(format!(
                "Gemm input C must have rank 2 or less, got shape {}",
                c.shape()
            )));
        }
    };
    let rs = if rows == 1 {
        0
    } else if rows == m {
        cols
    } else {
        usize::MAX
    };
    let cs = if cols == 1 {
        0
    } else if cols == n {
        1
    } else {
        usize::MAX
    };
    if rs == usize::MAX || cs == usize::MAX {
        return Err(OpError::shape(format!(
            "Gemm input C of shape {} cannot broadcast to ({m}, {n})",
            c.shape()
        )));
    }
    Ok((rs, cs))
}

fn gemm(g: &Gemm, inputs: &[Option<&Tensor>], ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let (a, b) = (input(inputs, 0)?, input(inputs, 1)?);
    same_dtype(a, b, "input B")?;
    let c = opt_input(inputs, 2);
    if let Some(c) = c {
        same_dtype(a, c, "input C")?;
    }
    let (at, m, k) = oriented(a, g.trans_a, "A", ctx)?;
    let (bt, k2, n) = oriented(b, g.trans_b, "B", ctx)?;
    let result = (|| {
        if k != k2 {
            return Err(OpError::shape(format!(
                "Gemm inner dimensions differ: op(A) is ({m}, {k}), op(B) is ({k2}, {n}) (A {}, B {}, transA {}, transB {})",
                a.shape(),
                b.shape(),
                g.trans_a,
                g.trans_b
            )));
        }
        let strides = c.map(|c| bias_strides(c, m, n)).transpose()?;
        let mut out = ctx.alloc(a.dtype(), [m, n])?;
        let (a_src, b_src) = (at.as_ref().unwrap_or(a), bt.as_ref().unwrap_or(b));
        let (alpha, beta) = (g.alpha as f64, g.beta as f64);
        dispatch!(a.dtype(), T => {
            let bias = match (c, strides) {
                (Some(c), Some((row_stride, col_stride))) => Some(Bias { data: c.as_slice::<T>()?, row_stride, col_stride }),
                _ => None,
            };
            km::gemm(a_src.as_slice::<T>()?, b_src.as_slice::<T>()?, out.as_mut_slice::<T>()?, (m, k, n), (alpha, beta), bias, ctx.pool).map_err(OpError::from)
        }; [F32, F64, F16, BF16, I32, I64, U32, U64])?;
        Ok(out)
    })();
    for t in [at, bt].into_iter().flatten() {
        ctx.arena.release(t);
    }
    result
}

/// `t` as `n` values over the normalized shape `norm_dims`, broadcasting (unidirectionally)
/// when it is smaller; borrowed when it already has `n` elements.
fn expand_param<'a, T: Element + Copy>(
    t: &'a Tensor,
    norm_dims: &[usize],
    what: &str,
) -> Result<Cow<'a, [T]>, OpError> {
    let mut dims = t.dims();
    while dims.len() > norm_dims.len() && dims[0] == 1 {
        dims = &dims[1..];
    }
    if broadcast_shape(&[dims, norm_dims]).as_deref() != Some(norm_dims) {
        return Err(OpError::shape(format!(
            "{what} of shape {} cannot broadcast to the normalized shape {norm_dims:?}",
            t.shape()
        )));
    }
    let values = t.as_slice::<T>()?;
    if dims == norm_dims {
        return Ok(Cow::Borrowed(values));
    }
    let n: usize = norm_dims.iter().product();
    let Some(&first) = values.first() else {
        return Ok(Cow::Owned(Vec::new()));
    };
    let mut out = vec![first; n];
    broadcast::binary(values, dims, &[()], &[], &mut out, norm_dims, |v, ()| v);
    Ok(Cow::Owned(out))
}

fn norm_typed<T: Accum + Element>(
    nm: &Norm,
    x: &Tensor,
    inputs: &[Option<&Tensor>],
    n_outputs: usize,
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError>
where
    T::Acc: Element,
{
    let dims = x.dims();
    let axis = norm_axis(nm.axis, dims.len())?;
    let norm_dims = &dims[axis..];
    let (rows, n) = (dims[..axis].iter().product(), norm_dims.iter().product());
    let scale_t = input(inputs, 1)?;
    same_dtype(x, scale_t, "Scale")?;
    let scale = expand_param::<T>(scale_t, norm_dims, "Scale")?;
    let rows_in = kn::NormRows {
        x: x.as_slice::<T>()?,
        rows,
        n,
        epsilon: nm.epsilon,
    };
    let mut y = ctx.alloc(x.dtype(), x.shape().clone())?;
    // Mean / InvStdDev / inv_std_var keep the normalized axes as 1s, in the statistics type.
    let stat_dims: Small<usize> = dims
        .iter()
        .enumerate()
        .map(|(i, &d)| if i < axis { d } else { 1 })
        .collect();
    if nm.kind == NormKind::Rms {
        // SimplifiedLayerNormalization's optional inv_std_var (RMSNormalization has none).
        let mut inv = (n_outputs >= 2)
            .then(|| ctx.alloc(T::Acc::DTYPE, stat_dims.as_slice()))
            .transpose()?;
        kn::rms_norm_stats(
            rows_in,
            &scale,
            y.as_mut_slice::<T>()?,
            inv.as_mut()
                .map(|t| t.as_mut_slice::<T::Acc>())
                .transpose()?,
            ctx.pool,
        )
        .map_err(OpError::from)?;
        return Ok([y].into_iter().chain(inv).collect());
    }
    let bias = match opt_input(inputs, 2) {
        Some(b) => {
            same_dtype(x, b, "B")?;
            Some(expand_param::<T>(b, norm_dims, "B")?)
        }
        None => None,
    };
    let affine = kn::Affine {
        scale: &scale,
        bias: bias.as_deref(),
    };
    if n_outputs <= 1 {
        kn::layer_norm(rows_in, affine, y.as_mut_slice::<T>()?, None, ctx.pool)
            .map_err(OpError::from)?;
        return Ok(smallvec![y]);
    }
    let mut mean = ctx.alloc(T::Acc::DTYPE, stat_dims.as_slice())?;
    let mut inv = ctx.alloc(T::Acc::DTYPE, stat_dims)?;
    let stats = LayerNormStats {
        mean: mean.as_mut_slice::<T::Acc>()?,
        inv_std_dev: inv.as_mut_slice::<T::Acc>()?,
    };
    kn::layer_norm(
        rows_in,
        affine,
        y.as_mut_slice::<T>()?,
        Some(stats),
        ctx.pool,
    )
    .map_err(OpError::from)?;
    Ok(smallvec![y, mean, inv])
}

fn norm(
    nm: &Norm,
    inputs: &[Option<&Tensor>],
    n_outputs: usize,
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError> {
    let x = input(inputs, 0)?;
    dispatch_float!(x.dtype(), T => norm_typed::<T>(nm, x, inputs, n_outputs, ctx))
}

/// Checks `t` holds exactly `n` values shaped `[n]` (leading 1s allowed).
fn expect_vector(t: &Tensor, n: usize, what: &str) -> Result<(), OpError> {
    let dims = t.dims();
    let trimmed = &dims[dims.iter().position(|&d| d != 1).unwrap_or(dims.len())..];
    if trimmed == [n] || (n == 1 && trimmed.is_empty() && !dims.is_empty()) {
        Ok(())
    } else {
        Err(OpError::shape(format!(
            "{what} must have shape [{n}] (the input's last dimension), got {}",
            t.shape()
        )))
    }
}

fn skip_norm_typed<T: Accum + Element>(
    sn: &SkipNorm,
    x: &Tensor,
    inputs: &[Option<&Tensor>],
    n_outputs: usize,
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError>
where
    T::Acc: Element,
{
    let dims = x.dims();
    let Some((&n, lead)) = dims.split_last() else {
        return Err(OpError::shape(
            "input must have rank 1 or more, got a scalar",
        ));
    };
    let rows: usize = lead.iter().product();
    let (skip, gamma) = (input(inputs, 1)?, input(inputs, 2)?);
    same_dtype(x, skip, "skip")?;
    same_dtype(x, gamma, "gamma")?;
    let skip_dims = skip.dims();
    let skip_dims = &skip_dims[skip_dims
        .iter()
        .position(|&d| d != 1)
        .unwrap_or(skip_dims.len())..];
    if skip_dims.len() > dims.len() || !dims.ends_with(skip_dims) || skip_dims.last() != Some(&n) {
        return Err(OpError::shape(format!(
            "skip of shape {} must match the input {} or a suffix of it ending in the hidden size {n}",
            skip.shape(),
            x.shape()
        )));
    }
    expect_vector(gamma, n, "gamma")?;
    // The layer form has beta before bias.
    let (beta, bias) = match sn.kind {
        NormKind::Layer => (opt_input(inputs, 3), opt_input(inputs, 4)),
        NormKind::Rms => (None, opt_input(inputs, 3)),
    };
    for (t, what) in [(beta, "beta"), (bias, "bias")] {
        if let Some(t) = t {
            same_dtype(x, t, what)?;
            expect_vector(t, n, what)?;
        }
    }
    let mut stat_dims: Small<usize> = Small::from_slice(lead);
    stat_dims.push(1);
    let mut y = ctx.alloc(x.dtype(), x.shape().clone())?;
    let mut mean = (n_outputs >= 2)
        .then(|| ctx.alloc(T::Acc::DTYPE, stat_dims.as_slice()))
        .transpose()?;
    let mut inv = (n_outputs >= 3)
        .then(|| ctx.alloc(T::Acc::DTYPE, stat_dims.as_slice()))
        .transpose()?;
    let mut sum = (n_outputs >= 4)
        .then(|| ctx.alloc(x.dtype(), x.shape().clone()))
        .transpose()?;
    let residual = Residual {
        skip: skip.as_slice::<T>()?,
        bias: bias.map(|b| b.as_slice::<T>()).transpose()?,
    };
    if sn.kind == NormKind::Layer {
        // The statistics are filled when either is read; both come from one pass per row, so
        // a mean asked for without inv_std_var's slot gets a scratch one.
        let want_stats = (n_outputs >= 2 && ctx.wants(1)) || (n_outputs >= 3 && ctx.wants(2));
        let mut scratch = (want_stats && inv.is_none())
            .then(|| ctx.alloc(T::Acc::DTYPE, stat_dims.as_slice()))
            .transpose()?;
        let stats = match (mean.as_mut(), inv.as_mut().or(scratch.as_mut())) {
            (Some(m), Some(i)) if want_stats => Some(kn::LayerNormStats {
                mean: m.as_mut_slice::<T::Acc>()?,
                inv_std_dev: i.as_mut_slice::<T::Acc>()?,
            }),
            _ => None,
        };
        kn::skip_layer_norm(
            kn::NormRows {
                x: x.as_slice::<T>()?,
                rows,
                n,
                epsilon: sn.epsilon,
            },
            residual,
            kn::Affine {
                scale: gamma.as_slice::<T>()?,
                bias: beta.map(|b| b.as_slice::<T>()).transpose()?,
            },
            y.as_mut_slice::<T>()?,
            sum.as_mut().map(|t| t.as_mut_slice::<T>()).transpose()?,
            stats,
            ctx.pool,
        )
        .map_err(OpError::from)?;
        return Ok([Some(y), mean, inv, sum].into_iter().flatten().collect());
    }
    // onnxruntime returns zeros for the mean of this RMS norm.
    if let Some(mean) = mean.as_mut() {
        mean.as_mut_slice::<T::Acc>()?
            .fill(<T::Acc as oxgen_kernels::Scalar>::ZERO);
    }
    // An inv_std_var nobody reads (a decoder layer's usual case) costs a pass over the rows;
    // its tensor is returned unfilled.
    let inv_rms = (inv.as_mut())
        .filter(|_| ctx.wants(2))
        .map(|t| t.as_mut_slice::<T::Acc>())
        .transpose()?;
    kn::skip_rms_norm(
        kn::NormRows {
            x: x.as_slice::<T>()?,
            rows,
            n,
            epsilon: sn.epsilon,
        },
        residual,
        gamma.as_slice::<T>()?,
        y.as_mut_slice::<T>()?,
        sum.as_mut().map(|t| t.as_mut_slice::<T>()).transpose()?,
        inv_rms,
        ctx.pool,
    )
    .map_err(OpError::from)?;
    Ok([Some(y), mean, inv, sum].into_iter().flatten().collect())
}

fn skip_norm(
    sn: &SkipNorm,
    inputs: &[Option<&Tensor>],
    n_outputs: usize,
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError> {
    let x = input(inputs, 0)?;
    dispatch_float!(x.dtype(), T => skip_norm_typed::<T>(sn, x, inputs, n_outputs, ctx))
}
