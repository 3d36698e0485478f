//! RotaryEmbedding (com.microsoft and ONNX opset 23) over `oxgen_kernels::rotary`. f32, f16
//! and bf16 (math in f32).

use half::{bf16, f16};
use oxgen_graph::Op;
use oxgen_graph::ops::{Rotary, RotaryKind};
use oxgen_kernels::acc::Accum;
use oxgen_kernels::rotary::{self as kr, HeadsShape, Positions, Rope};
use oxgen_tensor::{DType, Element, Tensor};
use smallvec::smallvec;

use super::attention::{expect_dims, same_dtype};
use super::{OpCtx, Outputs, input, opt_input, read_i64s};
use crate::OpError;

pub(super) fn run(
    op: &Op,
    inputs: &[Option<&Tensor>],
    ctx: &mut OpCtx,
) -> Result<Outputs, OpError> {
    let Op::Rotary(r) = op else {
        unreachable!("ops::run routes only RotaryEmbedding here")
    };
    let out = match input(inputs, 0)?.dtype() {
        DType::F32 => rotary::<f32>(r, inputs, ctx),
        DType::F16 => rotary::<f16>(r, inputs, ctx),
        DType::BF16 => rotary::<bf16>(r, inputs, ctx),
        other => Err(OpError::DType {
            dtype: other,
            detail: ": expected float32, float16 or bfloat16".into(),
        }),
    };
    out.map(|t| smallvec![t])
}

/// `(batch, seq, heads, head_size, heads_first)` of a RotaryEmbedding input.
fn rotary_layout(r: &Rotary, x: &Tensor, cos_cols: usize) -> Result<HeadsShape, OpError> {
    let shape = match *x.dims() {
        [batch, heads, seq, head_size] => {
            if r.kind == RotaryKind::Contrib && r.num_heads > 0 && r.num_heads != heads {
                return Err(OpError::shape(format!(
                    "num_heads {} does not match input shape {}",
                    r.num_heads,
                    x.shape()
                )));
            }
            HeadsShape {
                batch,
                seq,
                heads,
                head_size,
                heads_first: true,
            }
        }
        [batch, seq, hidden] => {
            // com.microsoft derives the head size from the caches when rotary_embedding_dim
            // is unset; ONNX requires num_heads for 3-D inputs.
            let heads = match (r.kind, r.num_heads, r.rotary_embedding_dim) {
                (_, n, _) if n > 0 => n,
                (RotaryKind::Contrib, _, 0) if cos_cols > 0 => hidden / (2 * cos_cols),
                _ => return Err(OpError::value("num_heads must be set for a 3-D input")),
            };
            if heads == 0 || hidden % heads != 0 {
                return Err(OpError::shape(format!(
                    "hidden size {hidden} is not a multiple of {heads} heads"
                )));
            }
            HeadsShape {
                batch,
                seq,
                heads,
                head_size: hidden / heads,
                heads_first: false,
            }
        }
        _ => {
            return Err(OpError::shape(format!(
                "input must be 3-D (batch, sequence, hidden) or 4-D (batch, heads, sequence, head_size), got {}",
                x.shape()
            )));
        }
    };
    if r.kind == RotaryKind::Contrib
        && r.rotary_embedding_dim == 0
        && 2 * cos_cols != shape.head_size
    {
        return Err(OpError::shape(format!(
            "cos_cache has {cos_cols} columns; without rotary_embedding_dim it must have head_size / 2 = {}",
            shape.head_size / 2
        )));
    }
    Ok(shape)
}

fn rotary<T: Accum<Acc = f32> + Element>(
    r: &Rotary,
    inputs: &[Option<&Tensor>],
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let x = input(inputs, 0)?;
    let (pos, cos, sin) = match r.kind {
        RotaryKind::Contrib => (
            Some(input(inputs, 1)?),
            input(inputs, 2)?,
            input(inputs, 3)?,
        ),
        RotaryKind::Onnx => (opt_input(inputs, 3), input(inputs, 1)?, input(inputs, 2)?),
    };
    same_dtype(x, cos, "cos_cache")?;
    same_dtype(x, sin, "sin_cache")?;
    expect_dims(sin, cos.dims(), "sin_cache", "(the shape of cos_cache)")?;
    let cos_cols = cos.dims().last().copied().unwrap_or(0);
    let shape = rotary_layout(r, x, cos_cols)?;
    let rot_dim = if r.rotary_embedding_dim > 0 {
        r.rotary_embedding_dim
    } else {
        shape.head_size
    };
    if rot_dim > shape.head_size || rot_dim % 2 != 0 || cos_cols * 2 != rot_dim {
        return Err(OpError::shape(format!(
            "rotary_dim {rot_dim} must be even, at most head_size {} and twice the cos_cache width {cos_cols}",
            shape.head_size
        )));
    }
    let ids = pos.map(|p| read_i64s(p, "position_ids")).transpose()?;
    let (b, s) = (shape.batch, shape.seq);
    let positions = match (&ids, pos) {
        (Some(ids), Some(p))
            if r.kind == RotaryKind::Contrib && ids.len() == 1 && p.rank() <= 1 =>
        {
            Positions::Offset(ids[0])
        }
        (Some(ids), Some(p)) if p.dims() == [b, s] => Positions::Ids(ids),
        (Some(_), Some(p)) => {
            return Err(OpError::shape(format!(
                "position_ids must have shape [{b}, {s}], got {}",
                p.shape()
            )));
        }
        _ => Positions::PerToken,
    };
    let cache_dims: &[usize] = if matches!(positions, Positions::PerToken) {
        &[b, s, cos_cols]
    } else {
        &[cos.dims().first().copied().unwrap_or(0), cos_cols]
    };
    if cos.dims() != cache_dims {
        return Err(OpError::shape(format!(
            "cos_cache must have shape {cache_dims:?} ({}), got {}",
            if matches!(positions, Positions::PerToken) {
                "batch, sequence, rotary_dim / 2 without position_ids"
            } else {
                "positions, rotary_dim / 2"
            },
            cos.shape()
        )));
    }
    let rope = Rope::new(
        cos.as_slice::<T>()?,
        sin.as_slice::<T>()?,
        cos_cols,
        r.interleaved,
    )
    .map_err(OpError::from)?;
    let mut out = ctx.alloc(x.dtype(), x.shape().clone())?;
    kr::rotary(
        x.as_slice::<T>()?,
        &shape,
        positions,
        &rope,
        out.as_mut_slice::<T>()?,
        ctx.pool,
    )
    .map_err(OpError::from)?;
    Ok(out)
}
