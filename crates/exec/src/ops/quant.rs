//! Block-quantized weight ops: com.microsoft::MatMulNBits and GatherBlockQuantized.
//!
//! Validates shapes and dtypes against onnxruntime's rules (`matmul_nbits_helper.h`,
//! `gather_block_quantized.cc`), then runs the reference kernels
//! (`oxgen_kernels::nbits`, `oxgen_kernels::quant`) directly on the tensors' bytes:
//! nothing is dequantized ahead of time and nothing but the output is allocated.

use oxgen_graph::Op;
use oxgen_graph::ops::{Dequantize, GatherBlockQuantized, MatMulNBits};
use oxgen_kernels::int8::Variant;
use oxgen_kernels::nbits::{self, NBitsLayout, PackedNBits, QuantWeights, ZeroPoints};

/// The `accuracy_level` that selects int8 activations.
const INT8_ACCURACY_LEVEL: u8 = 4;
use oxgen_kernels::quant::{self, QuantRows};
use oxgen_tensor::{DType, Tensor};

use super::{OpCtx, input, norm_axis, opt_input};
use smallvec::{SmallVec, smallvec};

use super::{Outputs, Small};
use crate::OpError;

pub(super) fn run(
    op: &Op,
    inputs: &[Option<&Tensor>],
    _n_outputs: usize,
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError> {
    match op {
        Op::MatMulNBits(q) => matmul_nbits(q, inputs, ctx).map(|t| smallvec![t]),
        Op::MatMulNBitsGroup(parts) => matmul_nbits_group(parts, inputs, ctx),
        Op::MatMulNBitsGlu(parts) => matmul_nbits_glu(parts, inputs, ctx).map(|t| smallvec![t]),
        Op::GatherBlockQuantized(g) => gather_block_quantized(g, inputs, ctx).map(|t| smallvec![t]),
        Op::Dequantize(d) => dequantize(d, inputs, ctx).map(|t| smallvec![t]),
        _ => unreachable!("ops::run routes only quantized ops here"),
    }
}

pub(super) fn expect_dtype(t: &Tensor, want: DType, what: &str) -> Result<(), OpError> {
    if t.dtype() == want {
        Ok(())
    } else {
        Err(OpError::DType {
            dtype: t.dtype(),
            detail: format!(" for {what}: expected {want}"),
        })
    }
}

/// Checks `t` is `[count]` or `[rows, count / rows]` (onnxruntime accepts both for scales and
/// zero points, the 1-D form for older exports).
fn expect_flat_or_2d(t: &Tensor, rows: usize, per_row: usize, what: &str) -> Result<(), OpError> {
    let ok = match *t.dims() {
        [len] => Some(len) == rows.checked_mul(per_row),
        [r, c] => r == rows && c == per_row,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(OpError::shape(format!(
            "{what} must have shape [{rows}, {per_row}] (or [{rows} * {per_row}]), got {}",
            t.shape()
        )))
    }
}

fn matmul_nbits(
    op: &MatMulNBits,
    inputs: &[Option<&Tensor>],
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    if let Some(packed) = ctx.lowered.nbits() {
        return matmul_prepacked(op, packed, inputs, ctx);
    }
    let (a, b, scales) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    if opt_input(inputs, 4).is_some() {
        return Err(OpError::value("input g_idx is not supported"));
    }
    let layout = NBitsLayout::new(op.n, op.k, op.bits, op.block_size).map_err(OpError::from)?;
    let (n, k) = (op.n, op.k);
    let Some((&a_k, batch)) = a.dims().split_last() else {
        return Err(OpError::shape(
            "input A must have rank 1 or more, got a scalar",
        ));
    };
    if a_k != k {
        return Err(OpError::shape(format!(
            "input A's last dimension must equal attribute K = {k}, got shape {}",
            a.shape()
        )));
    }
    expect_dtype(b, DType::U8, "input B")?;
    let b_dims = [n, layout.k_blocks, layout.blob_size];
    if b.dims() != b_dims {
        return Err(OpError::shape(format!(
            "input B must have shape {b_dims:?} ([N, ceil(K / block_size), block_size * bits / 8] \
             for K {k}, N {n}, block_size {}, bits {}), got {}",
            op.block_size,
            op.bits,
            b.shape()
        )));
    }
    expect_dtype(scales, a.dtype(), "scales (like input A)")?;
    expect_flat_or_2d(scales, n, layout.k_blocks, "scales")?;
    let zp = opt_input(inputs, 3);
    if let Some(z) = zp {
        if z.dtype() == DType::U8 {
            expect_flat_or_2d(z, n, layout.zp_row_bytes, "packed zero_points")?;
        } else {
            expect_dtype(z, a.dtype(), "zero_points (uint8, or the scales' type)")?;
            expect_flat_or_2d(z, n, layout.k_blocks, "zero_points")?;
        }
    }
    let bias = opt_input(inputs, 5);
    if let Some(bias) = bias {
        expect_dtype(bias, a.dtype(), "bias (like input A)")?;
        if bias.dims() != [n] {
            return Err(OpError::shape(format!(
                "bias must have shape [{n}], got {}",
                bias.shape()
            )));
        }
    }
    let m: usize = batch.iter().product();
    let mut out_dims: Small<usize> = Small::from_slice(batch);
    out_dims.push(n);
    let mut out = ctx.alloc(a.dtype(), out_dims)?;
    // accuracy_level 4 asks for int8 activations (onnxruntime's "compute type int8"); it
    // applies to f32 activations unless the session is exact. Other levels compute in f32.
    if op.accuracy_level == INT8_ACCURACY_LEVEL && a.dtype() == DType::F32 && !ctx.exact {
        let w = QuantWeights {
            layout,
            data: b.as_slice::<u8>()?,
            scales: scales.as_slice::<f32>()?,
            zero_points: zero_points(zp)?,
        };
        let bias = bias.map(|t| t.as_slice::<f32>()).transpose()?;
        nbits::matmul_nbits_int8(
            a.as_slice::<f32>()?,
            m,
            &w,
            bias,
            out.as_mut_slice::<f32>()?,
            ctx.pool,
        )?;
        return Ok(out);
    }
    if a.dtype() == DType::F32 {
        let w = QuantWeights {
            layout,
            data: b.as_slice::<u8>()?,
            scales: scales.as_slice::<f32>()?,
            zero_points: zero_points(zp)?,
        };
        let bias = bias.map(|t| t.as_slice::<f32>()).transpose()?;
        let (a, out_f32) = (a.as_slice::<f32>()?, out.as_mut_slice::<f32>()?);
        nbits::matmul_nbits_f32(a, m, &w, bias, out_f32, ctx.pool)?;
        return Ok(out);
    }
    dispatch!(a.dtype(), T => {
        let w = QuantWeights { layout, data: b.as_slice::<u8>()?, scales: scales.as_slice::<T>()?, zero_points: zero_points(zp)? };
        let bias = bias.map(|t| t.as_slice::<T>()).transpose()?;
        nbits::matmul_nbits(a.as_slice::<T>()?, m, &w, bias, out.as_mut_slice::<T>()?, ctx.pool).map_err(OpError::from)
    }; [F32, F16, BF16])?;
    Ok(out)
}

/// Whether `op` computes with int8 activations in a session that is `exact` or not.
pub(crate) fn int8_activations(op: &MatMulNBits, exact: bool) -> bool {
    op.accuracy_level == INT8_ACCURACY_LEVEL && !exact
}

/// Repacks the weights of a `MatMulNBits` node, or of a group's parts side by side, for the
/// int8 kernel: `parts` pairs each part's attributes with its `b`, `scales` and optional
/// `zero_points` initializers. Anything unusual (a layout the kernel does not run on this
/// CPU, unexpected dtypes or sizes) returns `None`: the node then checks and runs its inputs
/// as they are.
pub(crate) fn prepack(
    parts: &[(&MatMulNBits, &Tensor, &Tensor, Option<&Tensor>)],
) -> Option<PackedNBits> {
    let weights = parts
        .iter()
        .map(|&(op, b, scales, zero_points)| quant_weights(op, b, scales, zero_points))
        .collect::<Option<Vec<_>>>()?;
    PackedNBits::pack_parts(&weights).ok().flatten()
}

/// [`prepack`] for a `MatMulNBitsGlu` node: its gate and up projections in turn, tile by tile.
pub(crate) fn prepack_glu(
    [gate, up]: [(&MatMulNBits, &Tensor, &Tensor, Option<&Tensor>); 2],
) -> Option<PackedNBits> {
    let gate = quant_weights(gate.0, gate.1, gate.2, gate.3)?;
    let up = quant_weights(up.0, up.1, up.2, up.3)?;
    PackedNBits::pack_glu(&gate, &up).ok().flatten()
}

fn quant_weights<'a>(
    op: &MatMulNBits,
    b: &'a Tensor,
    scales: &'a Tensor,
    zero_points: Option<&'a Tensor>,
) -> Option<QuantWeights<'a, f32>> {
    let layout = NBitsLayout::new(op.n, op.k, op.bits, op.block_size).ok()?;
    if b.dtype() != DType::U8 || scales.dtype() != DType::F32 {
        return None;
    }
    let zero_points = match zero_points {
        None => ZeroPoints::Default,
        Some(z) if z.dtype() == DType::U8 => ZeroPoints::Packed(z.as_slice::<u8>().ok()?),
        Some(z) if z.dtype() == DType::F32 => ZeroPoints::Float(z.as_slice::<f32>().ok()?),
        Some(_) => return None,
    };
    let w = QuantWeights {
        layout,
        data: b.as_slice::<u8>().ok()?,
        scales: scales.as_slice::<f32>().ok()?,
        zero_points,
    };
    Some(w)
}

/// A grouped node (`oxgen::MatMulNBitsGroup`): one call over the parts packed side by side,
/// or each part as its own `MatMulNBits` when they were not packed.
fn matmul_nbits_group(
    parts: &[MatMulNBits],
    inputs: &[Option<&Tensor>],
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError> {
    let Some(packed) = ctx.lowered.nbits() else {
        return parts
            .iter()
            .enumerate()
            .map(|(p, q)| {
                let at = |k: usize| inputs.get(k).copied().flatten();
                let own = [at(0), at(1 + 3 * p), at(2 + 3 * p), at(3 + 3 * p)];
                matmul_nbits(q, &own, ctx)
            })
            .collect();
    };
    let Some(first) = parts.first() else {
        return Err(OpError::value("a MatMulNBitsGroup needs at least one part"));
    };
    let a = input(inputs, 0)?;
    let (m, batch) = rows_of_a(a, first.k)?;
    let mut outs = Outputs::new();
    for q in parts {
        let mut dims: Small<usize> = Small::from_slice(batch);
        dims.push(q.n);
        outs.push(ctx.alloc(DType::F32, dims)?);
    }
    let mut slices: SmallVec<[&mut [f32]; 4]> = outs
        .iter_mut()
        .map(|t| t.as_mut_slice::<f32>())
        .collect::<Result<_, _>>()?;
    nbits::matmul_packed_parts(
        a.as_slice::<f32>()?,
        m,
        packed,
        &mut slices,
        ctx.pool,
        Variant::best(),
    )?;
    drop(slices);
    Ok(outs)
}

/// A gate and up projection with the gated SiLU over them (`oxgen::MatMulNBitsGlu`): one
/// call over the pair packed in turn, or the two products as a group followed by `SiluMul`
/// when they were not packed (the same bits either way).
fn matmul_nbits_glu(
    parts: &[MatMulNBits; 2],
    inputs: &[Option<&Tensor>],
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let Some(packed) = ctx.lowered.nbits() else {
        let mut products = matmul_nbits_group(parts, inputs, ctx)?.into_iter();
        let (Some(gate), Some(up)) = (products.next(), products.next()) else {
            unreachable!("a group of two parts has two outputs");
        };
        let out = super::elementwise::silu_mul(&gate, &up, ctx);
        ctx.arena.recycle(gate);
        ctx.arena.recycle(up);
        return out;
    };
    let a = input(inputs, 0)?;
    let (m, batch) = rows_of_a(a, parts[0].k)?;
    let mut dims: Small<usize> = Small::from_slice(batch);
    dims.push(parts[0].n);
    let mut out = ctx.alloc(DType::F32, dims)?;
    nbits::matmul_packed_glu(
        a.as_slice::<f32>()?,
        m,
        packed,
        out.as_mut_slice::<f32>()?,
        ctx.pool,
        Variant::best(),
    )?;
    Ok(out)
}

/// Checks A is float32 with last dimension `k`; returns its row count and leading dims.
fn rows_of_a(a: &Tensor, k: usize) -> Result<(usize, &[usize]), OpError> {
    expect_dtype(a, DType::F32, "input A (float32 for int8 activations)")?;
    let Some((&a_k, batch)) = a.dims().split_last() else {
        return Err(OpError::shape(
            "input A must have rank 1 or more, got a scalar",
        ));
    };
    if a_k != k {
        return Err(OpError::shape(format!(
            "input A's last dimension must equal attribute K = {k}, got shape {}",
            a.shape()
        )));
    }
    Ok((batch.iter().product(), batch))
}

/// `MatMulNBits` on weights repacked at load: only A and the bias are checked here.
fn matmul_prepacked(
    op: &MatMulNBits,
    packed: &PackedNBits,
    inputs: &[Option<&Tensor>],
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let a = input(inputs, 0)?;
    let (m, batch) = rows_of_a(a, op.k)?;
    let bias = opt_input(inputs, 5);
    if let Some(bias) = bias {
        expect_dtype(bias, DType::F32, "bias (like input A)")?;
        if bias.dims() != [op.n] {
            return Err(OpError::shape(format!(
                "bias must have shape [{}], got {}",
                op.n,
                bias.shape()
            )));
        }
    }
    let mut out_dims: Small<usize> = Small::from_slice(batch);
    out_dims.push(op.n);
    let mut out = ctx.alloc(DType::F32, out_dims)?;
    let bias = bias.map(|t| t.as_slice::<f32>()).transpose()?;
    nbits::matmul_packed(
        a.as_slice::<f32>()?,
        m,
        packed,
        bias,
        out.as_mut_slice::<f32>()?,
        ctx.pool,
        Variant::best(),
    )?;
    Ok(out)
}

/// Packed uint8 zero points, or float ones in the scales' type `T`.
fn zero_points<T: oxgen_tensor::Element>(
    zp: Option<&Tensor>,
) -> Result<ZeroPoints<'_, T>, OpError> {
    Ok(match zp {
        None => ZeroPoints::Default,
        Some(z) if z.dtype() == DType::U8 => ZeroPoints::Packed(z.as_slice::<u8>()?),
        Some(z) => ZeroPoints::Float(z.as_slice::<T>()?),
    })
}

fn gather_block_quantized(
    op: &GatherBlockQuantized,
    inputs: &[Option<&Tensor>],
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let (data, indices, scales) = (input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?);
    expect_dtype(data, DType::U8, "data")?;
    let dims = data.dims();
    let rank = dims.len();
    if rank < 2 {
        return Err(OpError::shape(format!(
            "data must have rank 2 or more (rows to gather, then the quantized axis), got shape {}",
            data.shape()
        )));
    }
    if norm_axis(op.quantize_axis, rank)? != rank - 1 {
        return Err(OpError::value(format!(
            "quantize_axis {} is not the last axis of data {}: only the last axis is supported",
            op.quantize_axis,
            data.shape()
        )));
    }
    let codes_per_byte = 8 / op.bits as usize;
    let cols = dims[rank - 1]
        .checked_mul(codes_per_byte)
        .ok_or_else(|| OpError::shape("data's last dimension overflows"))?;
    let blocks = cols.div_ceil(op.block_size);
    let lead = &dims[..rank - 1];
    let mut scale_dims: Small<usize> = Small::from_slice(lead);
    scale_dims.push(blocks);
    if scales.dims() != &scale_dims[..] {
        return Err(OpError::shape(format!(
            "scales must have shape {scale_dims:?} (data {} holds {cols} {}-bit codes per row, \
             {blocks} blocks of {}), got {}",
            data.shape(),
            op.bits,
            op.block_size,
            scales.shape()
        )));
    }
    let zp = opt_input(inputs, 3);
    if let Some(z) = zp {
        expect_dtype(z, DType::U8, "zero_points (like data)")?;
        let mut zp_dims: Small<usize> = Small::from_slice(lead);
        zp_dims.push(blocks.div_ceil(codes_per_byte));
        if z.dims() != &zp_dims[..] {
            return Err(OpError::shape(format!(
                "zero_points must have shape {zp_dims:?} ({codes_per_byte} per byte), got {}",
                z.shape()
            )));
        }
    }
    let mut out_dims: Small<usize> = Small::from_slice(indices.dims());
    out_dims.extend_from_slice(&lead[1..]);
    out_dims.push(cols);
    let mut out = ctx.alloc(scales.dtype(), out_dims)?;
    let rows: usize = lead.iter().product();
    let group: usize = lead[1..].iter().product();
    let zero_points = zp.map(|z| z.as_slice::<u8>()).transpose()?;
    dispatch!(scales.dtype(), T => {
        let src = QuantRows {
            data: data.as_slice::<u8>()?,
            scales: scales.as_slice::<T>()?,
            zero_points,
            rows,
            cols,
            bits: op.bits,
            block_size: op.block_size,
        };
        let out_slice = out.as_mut_slice::<T>()?;
        match indices.dtype() {
            DType::I64 => quant::gather_block_quantized(&src, group, indices.as_slice::<i64>()?, out_slice, ctx.pool),
            DType::I32 => quant::gather_block_quantized(&src, group, indices.as_slice::<i32>()?, out_slice, ctx.pool),
            other => return Err(OpError::DType { dtype: other, detail: " for indices: expected int32 or int64".into() }),
        }
        .map_err(OpError::from)
    }; [F32, F16, BF16])?;
    Ok(out)
}

/// An (u)int8 or int32 tensor's values as i64, for the zero-point arithmetic.
pub(super) fn integers(t: &Tensor, what: &str) -> Result<Vec<i64>, OpError> {
    Ok(match t.dtype() {
        DType::U8 => t.as_slice::<u8>()?.iter().map(|&v| i64::from(v)).collect(),
        DType::I8 => t.as_slice::<i8>()?.iter().map(|&v| i64::from(v)).collect(),
        DType::I32 => t.as_slice::<i32>()?.iter().map(|&v| i64::from(v)).collect(),
        other => {
            return Err(OpError::DType {
                dtype: other,
                detail: format!(" for {what}: expected uint8, int8 or int32"),
            });
        }
    })
}

/// ONNX DequantizeLinear: `(x - zero_point) · scale` in f32, the scale and zero point per
/// tensor (one value) or per slice along `axis` (one value per index).
fn dequantize(
    d: &Dequantize,
    inputs: &[Option<&Tensor>],
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let (x, scale) = (input(inputs, 0)?, input(inputs, 1)?);
    expect_dtype(scale, DType::F32, "DequantizeLinear's scale")?;
    let values = integers(x, "DequantizeLinear's input")?;
    let scales = scale.as_slice::<f32>()?;
    let zeros = match opt_input(inputs, 2) {
        Some(z) if z.dtype() != x.dtype() => {
            return Err(OpError::DType {
                dtype: z.dtype(),
                detail: format!(" for DequantizeLinear's zero point: expected {}", x.dtype()),
            });
        }
        Some(z) => integers(z, "DequantizeLinear's zero point")?,
        None => vec![0; scales.len()],
    };
    if zeros.len() != scales.len() {
        return Err(OpError::shape(format!(
            "DequantizeLinear's zero point has {} values and its scale {}",
            zeros.len(),
            scales.len()
        )));
    }
    let dims = x.dims();
    // Elements per index of the axis, and how many indices: per tensor, one of each.
    let (inner, count) = if scales.len() == 1 && scale.rank() <= 1 {
        (values.len().max(1), 1)
    } else {
        let axis = norm_axis(d.axis, dims.len())?;
        if scale.rank() != 1 || scales.len() != dims[axis] {
            return Err(OpError::shape(format!(
                "DequantizeLinear's scale {} is neither one value nor one per index of axis {} \
                 of the input {}",
                scale.shape(),
                d.axis,
                x.shape()
            )));
        }
        (
            dims[axis + 1..].iter().product::<usize>().max(1),
            dims[axis],
        )
    };
    let mut out = ctx.alloc(DType::F32, dims)?;
    // A run of `inner` elements shares one scale and zero point.
    let runs = out.as_mut_slice::<f32>()?.chunks_mut(inner);
    for (r, (run, values)) in runs.zip(values.chunks(inner)).enumerate() {
        let (zero, scale) = (zeros[r % count], scales[r % count]);
        for (o, &v) in run.iter_mut().zip(values) {
            *o = (v - zero) as f32 * scale;
        }
    }
    Ok(out)
}
