//! Mixture of experts: com.microsoft::MoE and QMoE. Validates the inputs against
//! onnxruntime's shapes (`moe_helper.h`), maps QMoE's expert matrices onto the
//! `MatMulNBits` layout (they are the same bytes when K is a whole number of blocks), and
//! runs `oxgen_kernels::moe` on the tensors as they are: nothing is dequantized ahead of time.
//! The exception to "as they are": without a weight budget the session repacks at load
//! ([`prepack`]; the same bytes reordered, the same bits) the experts whose kernel would
//! otherwise gather them at every run: integer experts that take f32 activations
//! (interleaved) and MXFP4 experts that take int8 activations (in tiles).

use oxgen_graph::ops::{Moe, MoeActivation, MoeFormat, MoeQuant, MoeRouting, QMOE_GLOBAL_SCALES};
use oxgen_kernels::moe::{
    self as km, Activation, ExpertMatrix, Experts, Projection, Repacked, Routing,
};
use oxgen_kernels::mxfp4;
use oxgen_kernels::nbits::NBitsLayout;
use oxgen_tensor::{DType, Tensor};

use super::{OpCtx, input, opt_input};
use crate::OpError;
use smallvec::SmallVec;

/// The `accuracy_level` that selects int8 activations (as for MatMulNBits).
const INT8_ACCURACY_LEVEL: u8 = 4;

pub(super) fn run(
    op: &Moe,
    inputs: &[Option<&Tensor>],
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let x = input(inputs, 0)?;
    let logits = input(inputs, 1)?;
    for (t, what) in [(x, "input"), (logits, "router_probs")] {
        if t.dtype() != DType::F32 {
            return Err(OpError::DType {
                dtype: t.dtype(),
                detail: format!(
                    " for {what}: the native MoE computes float32; use the ort backend for \
                     other types"
                ),
            });
        }
    }
    let (hidden, tokens) = match *x.dims() {
        [t, h] => (h, t),
        [b, s, h] => (h, b * s),
        _ => {
            return Err(OpError::shape(format!(
                "input must be (tokens, hidden) or (batch, sequence, hidden), got {}",
                x.shape()
            )));
        }
    };
    let &[rows, count] = logits.dims() else {
        return Err(OpError::shape(format!(
            "router_probs must be (tokens, experts), got {}",
            logits.shape()
        )));
    };
    if rows != tokens || count == 0 {
        return Err(OpError::shape(format!(
            "router_probs {} must have one row per token ({tokens}) and at least one expert",
            logits.shape()
        )));
    }
    let int8 = int8_activations(op, ctx.exact);
    let (mut fc1, mut fc2) = projections(op, inputs, (count, hidden), int8)?;
    if let Some(packed) = ctx.lowered.experts() {
        fc1.weights = fc1.weights.with_repacked(&packed.fc1);
        fc2.weights = fc2.weights.with_repacked(&packed.fc2);
    }
    let activation = match op.activation {
        MoeActivation::Relu => Activation::Relu,
        MoeActivation::Gelu => Activation::Gelu,
        MoeActivation::Silu => Activation::Silu,
        MoeActivation::Identity => Activation::Identity,
        MoeActivation::SwiGlu { alpha, beta, limit } => Activation::SwiGlu { alpha, beta, limit },
    };
    let experts = Experts {
        count,
        fc1,
        fc2,
        activation,
    };
    if op.k > count {
        return Err(OpError::value(format!(
            "k = {} experts per token, but the router has {count} experts",
            op.k
        )));
    }
    let given = (op.inputs().router_weights).and_then(|i| opt_input(inputs, i));
    if let Some(g) = given
        && (g.dtype() != DType::F32 || g.dims() != logits.dims())
    {
        return Err(OpError::shape(format!(
            "router_weights must be float32 {} like router_probs, got {} {}",
            logits.shape(),
            g.dtype(),
            g.shape()
        )));
    }
    let routing = match (op.routing, given) {
        (MoeRouting::SoftmaxTopK { normalize }, _) => Routing::SoftmaxTopK { normalize },
        (MoeRouting::TopKSoftmax { .. }, None) => Routing::TopKSoftmax,
        (MoeRouting::TopKSoftmax { normalize_given }, Some(_)) => Routing::Given {
            normalize: normalize_given,
        },
    };
    let (nv, ni) = km::scratch_len(tokens, op.k, &experts);
    let mut values = ctx.alloc(DType::F32, [nv])?;
    let mut indices = ctx.alloc(DType::U32, [ni])?;
    let mut out = ctx.alloc(DType::F32, x.dims())?;
    let residency = &mut ctx.weights.residency;
    let stats = km::moe(
        x.as_slice::<f32>()?,
        km::Router {
            tokens,
            logits: logits.as_slice::<f32>()?,
            given: given.map(|g| g.as_slice::<f32>()).transpose()?,
            k: op.k,
            routing,
        },
        &experts,
        out.as_mut_slice::<f32>()?,
        (
            values.as_mut_slice::<f32>()?,
            indices.as_mut_slice::<u32>()?,
        ),
        ctx.pool,
        &mut |e| {
            // An expert is its two projections' bytes, keyed by where they start.
            let ranges: SmallVec<[&[u8]; 6]> = (fc1.expert_ranges(e).into_iter())
                .chain(fc2.expert_ranges(e))
                .collect();
            let key = ranges.first().map_or(0, |r| r.as_ptr() as usize);
            residency.touch((key, e), &ranges);
        },
    )?;
    let c = &mut ctx.weights.counters;
    c.streamed += stats.bytes as u64;
    c.moe_layers += 1;
    c.moe_experts += stats.experts as u64;
    c.moe_routes += stats.routes as u64;
    ctx.arena.release(values);
    ctx.arena.release(indices);
    Ok(out)
}

/// Whether `op`'s quantized (integer or MXFP4) experts take int8 activations: its
/// `accuracy_level` allows them and the session is not exact.
fn int8_activations(op: &Moe, exact: bool) -> bool {
    op.quant
        .is_some_and(|q| q.accuracy_level == INT8_ACCURACY_LEVEL && !exact)
}

/// The node's two expert projections, checked against `count` experts of `hidden` features;
/// `int8`: integer experts take int8 activations.
fn projections<'a>(
    op: &Moe,
    inputs: &[Option<&'a Tensor>],
    (count, hidden): (usize, usize),
    int8: bool,
) -> Result<(Projection<'a>, Projection<'a>), OpError> {
    let at = op.inputs();
    let factor = match op.activation {
        MoeActivation::SwiGlu { .. } => 2,
        _ => 1,
    };
    let w2 = input(inputs, at.fc2.0)?;
    let pack = op.quant.map_or(1, |q| 8 / q.bits as usize);
    let mxfp4 = op.quant.is_some_and(|q| q.format == MoeFormat::Mxfp4);
    let inter = match *w2.dims() {
        // MXFP4: (experts, inputs, outputs / 2).
        [e, i, h] if mxfp4 && e == count && 2 * h == hidden => i,
        [e, h, i] if !mxfp4 && e == count && h == hidden => i * pack,
        _ => {
            return Err(OpError::shape(format!(
                "fc2_experts_weights must be {}, got {}",
                if mxfp4 {
                    format!("({count}, inter, {hidden} / 2)")
                } else if pack > 1 {
                    format!("({count}, {hidden}, inter / {pack})")
                } else {
                    format!("({count}, {hidden}, inter)")
                },
                w2.shape()
            )));
        }
    };
    let zp = |slot: usize| {
        at.zero_points
            .and_then(|z| opt_input(inputs, [z.0, z.1][slot]))
    };
    let fc1 = projection(
        op.quant,
        int8,
        inputs,
        at.fc1,
        zp(0),
        (count, inter * factor, hidden),
        "fc1",
    )?;
    let fc2 = projection(
        op.quant,
        int8,
        inputs,
        at.fc2,
        zp(1),
        (count, hidden, inter),
        "fc2",
    )?;
    Ok((fc1, fc2))
}

/// A QMoE node's experts repacked at load for their kernel ([`Repacked`]): the same bits,
/// without gathering each block at every run.
#[derive(Debug)]
pub struct PackedExperts {
    fc1: Repacked,
    fc2: Repacked,
}

/// `op`'s experts repacked, where its weights (in `inputs`, as at load) are integer experts
/// that take f32 activations (`exact`, or no `accuracy_level` of 4) and the f32 kernel runs
/// them, or MXFP4 experts that take int8 activations; `None` otherwise, or on any
/// inconsistency (running the node reports it).
pub(crate) fn prepack(op: &Moe, inputs: &[Option<&Tensor>], exact: bool) -> Option<PackedExperts> {
    let int8 = int8_activations(op, exact);
    let mxfp4 = op.quant?.format == MoeFormat::Mxfp4;
    let w2 = input(inputs, op.inputs().fc2.0).ok()?;
    let (count, hidden) = match *w2.dims() {
        // MXFP4: (experts, inputs, outputs / 2).
        [count, _, half] if mxfp4 && int8 => (count, 2 * half),
        [count, hidden, _] if !mxfp4 && !int8 => (count, hidden),
        _ => return None,
    };
    let (fc1, fc2) = projections(op, inputs, (count, hidden), int8).ok()?;
    Some(PackedExperts {
        fc1: fc1.repack(count).ok()??,
        fc2: fc2.repack(count).ok()??,
    })
}

/// An MXFP4 projection (QMoE `fp4`): codes `(count, k, n / 2)` uint8, e8m0 scales
/// `(count, n, k / 32)` (float8e8m0 or uint8), and global scales of 1 if any; `int8`: it
/// takes int8 activations.
fn mxfp4_projection<'a>(
    inputs: &[Option<&'a Tensor>],
    (w, s, bias): (usize, Option<usize>, Option<&'a [f32]>),
    (count, n, k): (usize, usize, usize),
    int8: bool,
    name: &str,
) -> Result<Projection<'a>, OpError> {
    let codes = input(inputs, w)?;
    if codes.dtype() != DType::U8 || codes.dims() != [count, k, n / 2] || n % 2 != 0 {
        return Err(OpError::shape(format!(
            "{name}_experts_weights must be uint8 ({count}, {k}, {}) for MXFP4 experts of {n} \
             outputs and {k} inputs, got {} {}",
            n / 2,
            codes.dtype(),
            codes.shape()
        )));
    }
    let scales = input(inputs, s.unwrap_or(w + 1))?;
    let blocks = k / mxfp4::BLOCK;
    if !matches!(scales.dtype(), DType::F8E8M0 | DType::U8)
        || k % mxfp4::BLOCK != 0
        || scales.dims() != [count, n, blocks]
    {
        return Err(OpError::shape(format!(
            "{name}_scales must be float8e8m0 ({count}, {n}, {blocks}) (one per {} inputs), \
             got {} {}",
            mxfp4::BLOCK,
            scales.dtype(),
            scales.shape()
        )));
    }
    let slot = QMOE_GLOBAL_SCALES[usize::from(name == "fc2")];
    if let Some(g) = opt_input(inputs, slot) {
        let ones = g.dtype() == DType::F32
            && g.dims() == [count]
            && g.as_slice::<f32>()?.iter().all(|&v| v == 1.0);
        if !ones {
            return Err(OpError::value(format!(
                "{name}_global_scale (input {slot}) must be float32 ({count}) ones: MXFP4 experts \
                 have no global scale, got {} {}",
                g.dtype(),
                g.shape()
            )));
        }
    }
    Ok(Projection {
        n,
        k,
        weights: ExpertMatrix::Mxfp4 {
            codes: codes.as_slice::<u8>()?,
            scales: scales.as_slice::<u8>()?,
            int8,
            packed: None,
        },
        bias,
    })
}

/// One projection's weights, scales, zero points and bias, checked: `(count, n, k)` are its
/// experts, outputs and inputs; `(weights, scales, bias)` the inputs that hold them.
fn projection<'a>(
    quant: Option<MoeQuant>,
    int8: bool,
    inputs: &[Option<&'a Tensor>],
    (w, s, b): (usize, Option<usize>, usize),
    zero_points: Option<&'a Tensor>,
    (count, n, k): (usize, usize, usize),
    name: &str,
) -> Result<Projection<'a>, OpError> {
    let weights = input(inputs, w)?;
    let bias = match opt_input(inputs, b) {
        None => None,
        Some(t) if t.dtype() == DType::F32 && t.dims() == [count, n] => Some(t.as_slice::<f32>()?),
        Some(t) => {
            return Err(OpError::shape(format!(
                "{name}_experts_bias must be float32 ({count}, {n}), got {} {}",
                t.dtype(),
                t.shape()
            )));
        }
    };
    if let Some(MoeQuant {
        format: MoeFormat::Mxfp4,
        ..
    }) = quant
    {
        return mxfp4_projection(inputs, (w, s, bias), (count, n, k), int8, name);
    }
    let Some(q) = quant else {
        if weights.dtype() != DType::F32 || weights.dims() != [count, n, k] {
            return Err(OpError::shape(format!(
                "{name}_experts_weights must be float32 ({count}, {n}, {k}) (experts, outputs, \
                 inputs), got {} {}",
                weights.dtype(),
                weights.shape()
            )));
        }
        return Ok(Projection {
            n,
            k,
            weights: ExpertMatrix::F32(weights.as_slice::<f32>()?),
            bias,
        });
    };
    let pack = 8 / q.bits as usize;
    let row_bytes = k.div_ceil(pack);
    if weights.dtype() != DType::U8 || weights.dims() != [count, n, row_bytes] {
        return Err(OpError::shape(format!(
            "{name}_experts_weights must be uint8 ({count}, {n}, {row_bytes}) for {}-bit codes \
             of {k} inputs, got {} {}",
            q.bits,
            weights.dtype(),
            weights.shape()
        )));
    }
    let scales = input(inputs, s.unwrap_or(w + 1))?;
    if scales.dtype() != DType::F32 {
        return Err(OpError::DType {
            dtype: scales.dtype(),
            detail: format!(" for {name}_scales: expected float32"),
        });
    }
    // onnxruntime reads the scales per block only when they have a block axis longer than 1.
    let block = match (q.block_size, scales.dims()) {
        (Some(bs), &[e, r, blocks])
            if e == count && r == n && blocks == k.div_ceil(bs) && blocks > 1 =>
        {
            bs
        }
        (_, &[e, r]) | (_, &[e, r, 1]) if e == count && r == n => k,
        _ => {
            return Err(OpError::shape(format!(
                "{name}_scales must be ({count}, {n}) (one per row) or ({count}, {n}, blocks), \
                 got {}",
                scales.shape()
            )));
        }
    };
    if k % block != 0 || block < 16 || !block.is_power_of_two() {
        return Err(OpError::shape(format!(
            "{name}: {k} inputs in blocks of {block} are not supported natively: K must be a \
             whole number of blocks of a power of two >= 16 (one scale per row needs K itself \
             to be one); use the ort backend"
        )));
    }
    let layout = NBitsLayout::new(n, k, q.bits, block)?;
    let zero_points = match zero_points {
        None => None,
        Some(z) if block == k => {
            return Err(OpError::shape(format!(
                "{name}_zero_points {}: zero points with one scale per row are not supported \
                 natively; use block_size, or the ort backend",
                z.shape()
            )));
        }
        Some(z) if z.dtype() == DType::U8 && z.dims() == [count, n, layout.zp_row_bytes] => {
            Some(z.as_slice::<u8>()?)
        }
        Some(z) => {
            return Err(OpError::shape(format!(
                "{name}_zero_points must be uint8 ({count}, {n}, {}), got {} {}",
                layout.zp_row_bytes,
                z.dtype(),
                z.shape()
            )));
        }
    };
    Ok(Projection {
        n,
        k,
        weights: ExpertMatrix::Quant {
            layout,
            data: weights.as_slice::<u8>()?,
            scales: scales.as_slice::<f32>()?,
            zero_points,
            int8,
            interleaved: None,
        },
        bias,
    })
}
