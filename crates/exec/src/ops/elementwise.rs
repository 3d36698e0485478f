//! Element-wise ops: unary math, broadcasting binary ops, variadic Max/Min/Sum/Mean, Where,
//! Clip and Cast.

use oxgen_graph::Op;
use oxgen_graph::ops::{BinaryOp, Cast, Clip, UnaryOp, VariadicOp};
use oxgen_kernels::broadcast::{self, broadcast_shape};
use oxgen_kernels::{Float, Scalar, erf, par, sigmoid};
use oxgen_tensor::{DType, Element, Tensor};
use smallvec::SmallVec;

use super::{OpCtx, Small, input, opt_input};
use crate::OpError;

pub(super) fn run(op: &Op, inputs: &[Option<&Tensor>], ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    match op {
        Op::Unary(u) => unary(*u, input(inputs, 0)?, ctx),
        Op::Binary(b) => binary(*b, input(inputs, 0)?, input(inputs, 1)?, ctx),
        Op::Variadic(v) => variadic(*v, inputs, ctx),
        Op::Where => where_(input(inputs, 0)?, input(inputs, 1)?, input(inputs, 2)?, ctx),
        Op::SiluMul => silu_mul(input(inputs, 0)?, input(inputs, 1)?, ctx),
        Op::Clip(c) => clip(c, inputs, ctx),
        Op::Cast(c) => cast(c, inputs, ctx),
        _ => unreachable!("ops::run routes only element-wise ops here"),
    }
}

fn map<T: Element, O: Element>(
    x: &Tensor,
    out_dtype: DType,
    ctx: &mut OpCtx,
    f: impl Fn(T) -> O,
) -> Result<Tensor, OpError> {
    let mut out = ctx.alloc(out_dtype, x.shape().clone())?;
    for (o, &v) in out.as_mut_slice::<O>()?.iter_mut().zip(x.as_slice::<T>()?) {
        *o = f(v);
    }
    Ok(out)
}

/// Transcendental maps (f64 `exp`, `erf`, ...) cost tens of simple operations per element:
/// worth splitting over the pool from a few thousand elements.
const TRANSCENDENTAL_WORK: usize = 32;

/// Elements per task when a float map is split.
pub(super) const FLOAT_MAP_CHUNK: usize = 512;

fn float_map<T: Float + Element + Send + Sync>(
    x: &Tensor,
    ctx: &mut OpCtx,
    f32_fn: impl Fn(f32) -> f32 + Sync,
    f64_fn: impl Fn(f64) -> f64 + Sync,
) -> Result<Tensor, OpError> {
    let n = x.numel();
    if par::parts_for(
        ctx.pool,
        n.div_ceil(FLOAT_MAP_CHUNK),
        FLOAT_MAP_CHUNK * TRANSCENDENTAL_WORK,
    ) <= 1
    {
        return map::<T, T>(x, x.dtype(), ctx, |v| v.map(&f32_fn, &f64_fn));
    }
    // Each element's value does not depend on the split: the same bits on any thread count.
    let mut out = ctx.alloc(x.dtype(), x.shape().clone())?;
    let src = x.as_slice::<T>()?;
    par::par_chunks(
        ctx.pool,
        out.as_mut_slice::<T>()?,
        FLOAT_MAP_CHUNK,
        |start, part| {
            for (o, &v) in part.iter_mut().zip(&src[start..]) {
                *o = v.map(&f32_fn, &f64_fn);
            }
        },
    );
    Ok(out)
}

pub(super) fn gelu(x: f64, tanh: bool) -> f64 {
    if tanh {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
    } else {
        0.5 * x * (1.0 + erf::erf_f64(x / std::f64::consts::SQRT_2))
    }
}

/// A new f32 tensor shaped like `like`, filled by `f(start, part)` over chunks of it, in
/// parallel when there are enough elements (each element's value never depends on the
/// split).
fn f32_chunks(
    like: &Tensor,
    ctx: &mut OpCtx,
    f: impl Fn(usize, &mut [f32]) + Sync,
) -> Result<Tensor, OpError> {
    let mut out = ctx.alloc(DType::F32, like.shape().clone())?;
    let dst = out.as_mut_slice::<f32>()?;
    // The vectorized sigmoid costs about eight simple operations per element.
    if par::parts_for(
        ctx.pool,
        dst.len().div_ceil(FLOAT_MAP_CHUNK),
        FLOAT_MAP_CHUNK * 8,
    ) <= 1
    {
        f(0, dst);
    } else {
        par::par_chunks(ctx.pool, dst, FLOAT_MAP_CHUNK, f);
    }
    Ok(out)
}

/// `oxgen::SiluMul`: `g * sigmoid(g) * u` for float32 `g` and `u` of one shape.
pub(super) fn silu_mul(g: &Tensor, u: &Tensor, ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    for (t, what) in [(g, "g"), (u, "u")] {
        if t.dtype() != DType::F32 {
            return Err(OpError::DType {
                dtype: t.dtype(),
                detail: format!(" for SiluMul input {what}: expected float32"),
            });
        }
    }
    if g.dims() != u.dims() {
        return Err(OpError::shape(format!(
            "SiluMul takes two inputs of one shape, got {} and {}",
            g.shape(),
            u.shape()
        )));
    }
    let (gs, us) = (g.as_slice::<f32>()?, u.as_slice::<f32>()?);
    f32_chunks(g, ctx, |start, part| {
        sigmoid::silu_mul(&gs[start..], &us[start..], part)
    })
}

/// The logistic sigmoid of f64 values, through libm (f32 values go through
/// [`sigmoid::sigmoid`]).
fn sigmoid_f64(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        x.exp() / (1.0 + x.exp())
    }
}

fn float_unary(op: UnaryOp) -> Option<fn(f64) -> f64> {
    Some(match op {
        UnaryOp::Sqrt => f64::sqrt,
        UnaryOp::Reciprocal => |x| 1.0 / x,
        UnaryOp::Exp => f64::exp,
        UnaryOp::Log => f64::ln,
        UnaryOp::Erf => erf::erf_f64,
        UnaryOp::Tanh => f64::tanh,
        UnaryOp::Sin => f64::sin,
        UnaryOp::Cos => f64::cos,
        UnaryOp::Floor => f64::floor,
        UnaryOp::Ceil => f64::ceil,
        UnaryOp::Round => f64::round_ties_even,
        UnaryOp::Softplus => |x| {
            if x > 0.0 {
                x + (-x).exp().ln_1p()
            } else {
                x.exp().ln_1p()
            }
        },
        UnaryOp::Softsign => |x| x / (1.0 + x.abs()),
        _ => return None,
    })
}

fn unary_float<T: Float + Element>(
    op: UnaryOp,
    x: &Tensor,
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    // f32 math goes through f64 and rounds once: at least as accurate as the f32 libm
    // onnxruntime calls, and identical across platforms.
    let to32 = |f: fn(f64) -> f64| move |v: f32| f(v as f64) as f32;
    if op == UnaryOp::Sigmoid {
        // f32 (and narrower) through the kernel's own f64 exponential, vectorized for f32.
        if x.dtype() == DType::F32 {
            let src = x.as_slice::<f32>()?;
            return f32_chunks(x, ctx, |start, part| {
                sigmoid::sigmoid_slice(&src[start..], part)
            });
        }
        return float_map::<T>(x, ctx, sigmoid::sigmoid, sigmoid_f64);
    }
    if op == UnaryOp::Erf && x.dtype() == DType::F32 {
        // f32 through the kernel's vectorized f32 erf (within two ulps of the exact one).
        let src = x.as_slice::<f32>()?;
        return f32_chunks(x, ctx, |start, part| erf::erf_slice(&src[start..], part));
    }
    if let Some(f) = float_unary(op) {
        return float_map::<T>(x, ctx, to32(f), f);
    }
    match op {
        UnaryOp::Gelu { tanh } => float_map::<T>(
            x,
            ctx,
            move |v| gelu(v as f64, tanh) as f32,
            move |v| gelu(v, tanh),
        ),
        UnaryOp::LeakyRelu { alpha } => float_map::<T>(
            x,
            ctx,
            move |v| if v < 0.0 { alpha * v } else { v },
            move |v| if v < 0.0 { alpha as f64 * v } else { v },
        ),
        UnaryOp::Elu { alpha } => {
            let a = alpha as f64;
            float_map::<T>(
                x,
                ctx,
                move |v| {
                    if v < 0.0 {
                        (a * (v as f64).exp_m1()) as f32
                    } else {
                        v
                    }
                },
                move |v| if v < 0.0 { a * v.exp_m1() } else { v },
            )
        }
        UnaryOp::Selu { alpha, gamma } => {
            let (a, g) = (alpha as f64, gamma as f64);
            let f = move |v: f64| {
                if v <= 0.0 {
                    g * (a * v.exp() - a)
                } else {
                    g * v
                }
            };
            float_map::<T>(x, ctx, move |v| f(v as f64) as f32, f)
        }
        UnaryOp::HardSigmoid { alpha, beta } => {
            let f = move |v: f64| (alpha as f64 * v + beta as f64).clamp(0.0, 1.0);
            float_map::<T>(x, ctx, move |v| f(v as f64) as f32, f)
        }
        UnaryOp::IsNaN => map::<T, u8>(x, DType::Bool, ctx, |v| v.is_nan() as u8),
        UnaryOp::IsInf {
            detect_positive,
            detect_negative,
        } => map::<T, u8>(x, DType::Bool, ctx, |v| {
            let f = v.to_f64();
            ((f == f64::INFINITY && detect_positive) || (f == f64::NEG_INFINITY && detect_negative))
                as u8
        }),
        _ => signed_unary::<T>(op, x, ctx),
    }
}

/// Abs, Neg, Sign, Relu: defined for every signed type.
fn signed_unary<T: Scalar + Element>(
    op: UnaryOp,
    x: &Tensor,
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let dtype = x.dtype();
    match op {
        UnaryOp::Abs => map::<T, T>(
            x,
            dtype,
            ctx,
            |v| if v < T::ZERO { T::ZERO.sub(v) } else { v },
        ),
        UnaryOp::Neg => map::<T, T>(x, dtype, ctx, |v| T::ZERO.sub(v)),
        UnaryOp::Relu => map::<T, T>(x, dtype, ctx, |v| if v < T::ZERO { T::ZERO } else { v }),
        UnaryOp::Sign => map::<T, T>(x, dtype, ctx, |v| {
            if v > T::ZERO {
                T::ONE
            } else if v < T::ZERO {
                T::ZERO.sub(T::ONE)
            } else {
                v
            }
        }),
        _ => Err(OpError::DType {
            dtype,
            detail: format!(" for {op:?}"),
        }),
    }
}

pub(super) fn unary(op: UnaryOp, x: &Tensor, ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let dtype = x.dtype();
    if op == UnaryOp::Not {
        return match dtype {
            DType::Bool => map::<u8, u8>(x, DType::Bool, ctx, |v| (v == 0) as u8),
            other => Err(OpError::DType {
                dtype: other,
                detail: " for Not: expected bool".into(),
            }),
        };
    }
    if dtype.is_float() {
        return dispatch_float!(dtype, T => unary_float::<T>(op, x, ctx));
    }
    dispatch!(dtype, T => signed_unary::<T>(op, x, ctx); [I64, I32, I16, I8, U64, U32, U16, U8])
}

fn broadcast_out(a: &Tensor, b: &Tensor) -> Result<Small<usize>, OpError> {
    broadcast_shape(&[a.dims(), b.dims()]).ok_or_else(|| {
        OpError::shape(format!(
            "input shapes {} and {} cannot broadcast",
            a.shape(),
            b.shape()
        ))
    })
}

fn zip<A: Element, B: Element, O: Element>(
    a: &Tensor,
    b: &Tensor,
    out_dtype: DType,
    ctx: &mut OpCtx,
    f: impl Fn(A, B) -> O,
) -> Result<Tensor, OpError> {
    let shape = broadcast_out(a, b)?;
    let mut out = ctx.alloc(out_dtype, shape.as_slice())?;
    broadcast::binary(
        a.as_slice::<A>()?,
        a.dims(),
        b.as_slice::<B>()?,
        b.dims(),
        out.as_mut_slice::<O>()?,
        &shape,
        f,
    );
    Ok(out)
}

fn python_mod<T: Scalar>(a: T, b: T) -> T {
    if b == T::ZERO {
        return T::ZERO;
    }
    let r = a.sub(a.div(b).mul(b));
    if r != T::ZERO && ((r < T::ZERO) != (b < T::ZERO)) {
        r.add(b)
    } else {
        r
    }
}

fn arith<T: Scalar + Element>(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let d = a.dtype();
    match op {
        BinaryOp::Add => zip::<T, T, T>(a, b, d, ctx, T::add),
        BinaryOp::Sub => zip::<T, T, T>(a, b, d, ctx, T::sub),
        BinaryOp::Mul => zip::<T, T, T>(a, b, d, ctx, T::mul),
        BinaryOp::Div => zip::<T, T, T>(a, b, d, ctx, T::div),
        BinaryOp::Mod { fmod } => {
            if T::IS_FLOAT {
                let f = move |x: T, y: T| {
                    let (x, y) = (x.to_f64(), y.to_f64());
                    let r = x % y;
                    let r = if !fmod && r != 0.0 && ((r < 0.0) != (y < 0.0)) {
                        r + y
                    } else {
                        r
                    };
                    T::from_f64(r)
                };
                zip::<T, T, T>(a, b, d, ctx, f)
            } else if fmod {
                zip::<T, T, T>(a, b, d, ctx, |x, y| {
                    if y == T::ZERO {
                        T::ZERO
                    } else {
                        x.sub(x.div(y).mul(y))
                    }
                })
            } else {
                zip::<T, T, T>(a, b, d, ctx, python_mod)
            }
        }
        BinaryOp::Equal => zip::<T, T, u8>(a, b, DType::Bool, ctx, |x, y| (x == y) as u8),
        BinaryOp::Less => zip::<T, T, u8>(a, b, DType::Bool, ctx, |x, y| (x < y) as u8),
        BinaryOp::Greater => zip::<T, T, u8>(a, b, DType::Bool, ctx, |x, y| (x > y) as u8),
        BinaryOp::LessOrEqual => zip::<T, T, u8>(a, b, DType::Bool, ctx, |x, y| (x <= y) as u8),
        BinaryOp::GreaterOrEqual => zip::<T, T, u8>(a, b, DType::Bool, ctx, |x, y| (x >= y) as u8),
        _ => Err(OpError::DType {
            dtype: d,
            detail: format!(" for {op:?}"),
        }),
    }
}

/// `x^e` by squaring, wrapping like repeated multiplication would.
fn int_pow<T: Scalar>(mut base: T, mut e: u64) -> T {
    let mut acc = T::ONE;
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.mul(base);
        }
        base = base.mul(base);
        e >>= 1;
    }
    acc
}

fn pow<T: Scalar + Element>(a: &Tensor, b: &Tensor, ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    let pow_f = |x: f64, y: f64| x.powf(y);
    dispatch_num!(b.dtype(), E => zip::<T, E, T>(a, b, a.dtype(), ctx, |x, y| {
        if T::IS_FLOAT {
            T::from_f64(pow_f(x.to_f64(), y.to_f64()))
        } else {
            // Integer powers: repeated multiplication keeps exact wrapping semantics.
            let e = y.to_f64();
            if e < 0.0 { T::from_f64(pow_f(x.to_f64(), e)) } else { int_pow(x, e as u64) }
        }
    }))
}

/// Bitwise ops through i128: and/or/xor commute with sign extension and truncation, and
/// shifts (unsigned types only) are exact there before wrapping back to the type's width.
fn bitwise<T: Scalar + Element>(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let d = a.dtype();
    let width = (std::mem::size_of::<T>() * 8) as i128;
    let f: fn(i128, i128, i128) -> i128 = match op {
        BinaryOp::BitwiseAnd => |x, y, _| x & y,
        BinaryOp::BitwiseOr => |x, y, _| x | y,
        BinaryOp::BitwiseXor => |x, y, _| x ^ y,
        BinaryOp::BitShiftLeft | BinaryOp::BitShiftRight if d.is_signed_int() => {
            return Err(OpError::DType {
                dtype: d,
                detail: " for BitShift: bit shifts take unsigned integers".into(),
            });
        }
        BinaryOp::BitShiftLeft => |x, y, w| if y >= w { 0 } else { x.wrapping_shl(y as u32) },
        BinaryOp::BitShiftRight => |x, y, w| if y >= w { 0 } else { x >> y },
        _ => unreachable!("only bitwise ops reach bitwise()"),
    };
    zip::<T, T, T>(a, b, d, ctx, move |x, y| {
        T::wrap_from_i128(f(x.to_i128(), y.to_i128(), width))
    })
}

pub(super) fn binary(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let d = a.dtype();
    if op != BinaryOp::Pow && b.dtype() != d {
        return Err(OpError::DType {
            dtype: b.dtype(),
            detail: format!(" for the second input: both inputs must be {d}"),
        });
    }
    match op {
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => {
            if d != DType::Bool {
                return Err(OpError::DType {
                    dtype: d,
                    detail: format!(" for {op:?}: expected bool"),
                });
            }
            let f = match op {
                BinaryOp::And => |x: u8, y: u8| x & y,
                BinaryOp::Or => |x: u8, y: u8| x | y,
                _ => |x: u8, y: u8| x ^ y,
            };
            zip::<u8, u8, u8>(a, b, DType::Bool, ctx, f)
        }
        BinaryOp::Pow => dispatch_num!(d, T => pow::<T>(a, b, ctx)),
        BinaryOp::BitwiseAnd
        | BinaryOp::BitwiseOr
        | BinaryOp::BitwiseXor
        | BinaryOp::BitShiftLeft
        | BinaryOp::BitShiftRight => {
            dispatch!(d, T => bitwise::<T>(op, a, b, ctx); [U8, U16, U32, U64, I8, I16, I32, I64])
        }
        BinaryOp::Equal if d == DType::Bool => {
            zip::<u8, u8, u8>(a, b, DType::Bool, ctx, |x, y| (x == y) as u8)
        }
        _ => dispatch_num!(d, T => arith::<T>(op, a, b, ctx)),
    }
}

fn fold<T: Scalar + Element>(
    op: VariadicOp,
    ts: &[&Tensor],
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let dims: SmallVec<[&[usize]; 4]> = ts.iter().map(|t| t.dims()).collect();
    let shape = broadcast_shape(&dims)
        .ok_or_else(|| OpError::shape(format!("input shapes {dims:?} cannot broadcast")))?;
    let f = match op {
        VariadicOp::Max => |x: T, y: T| {
            if y > x || x.is_nan() {
                if x.is_nan() { x } else { y }
            } else {
                x
            }
        },
        VariadicOp::Min => |x: T, y: T| {
            if y < x || x.is_nan() {
                if x.is_nan() { x } else { y }
            } else {
                x
            }
        },
        VariadicOp::Sum | VariadicOp::Mean => T::add,
    };
    // Accumulate left to right: out = f(f(t0, t1), t2) ..., starting from t0 broadcast.
    let mut acc = ctx.alloc(ts[0].dtype(), shape.as_slice())?;
    let zero = [T::ZERO];
    broadcast::binary(
        ts[0].as_slice::<T>()?,
        ts[0].dims(),
        &zero,
        &[],
        acc.as_mut_slice::<T>()?,
        &shape,
        |x, _| x,
    );
    for t in &ts[1..] {
        let prev = acc.as_slice::<T>()?.to_vec();
        broadcast::binary(
            &prev,
            &shape,
            t.as_slice::<T>()?,
            t.dims(),
            acc.as_mut_slice::<T>()?,
            &shape,
            f,
        );
    }
    if op == VariadicOp::Mean {
        let n = T::from_f64(ts.len() as f64);
        for v in acc.as_mut_slice::<T>()? {
            *v = v.div(n);
        }
    }
    Ok(acc)
}

pub(super) fn variadic(
    op: VariadicOp,
    inputs: &[Option<&Tensor>],
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let ts: SmallVec<[&Tensor; 4]> = inputs.iter().flatten().copied().collect();
    let first = ts
        .first()
        .ok_or_else(|| OpError::value("needs at least one input"))?;
    if let Some(t) = ts.iter().find(|t| t.dtype() != first.dtype()) {
        return Err(OpError::DType {
            dtype: t.dtype(),
            detail: format!(": all inputs must be {}", first.dtype()),
        });
    }
    dispatch_num!(first.dtype(), T => fold::<T>(op, &ts, ctx))
}

pub(super) fn where_(
    cond: &Tensor,
    x: &Tensor,
    y: &Tensor,
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    if cond.dtype() != DType::Bool {
        return Err(OpError::DType {
            dtype: cond.dtype(),
            detail: " for the condition: expected bool".into(),
        });
    }
    if x.dtype() != y.dtype() {
        return Err(OpError::DType {
            dtype: y.dtype(),
            detail: format!(": both branches must be {}", x.dtype()),
        });
    }
    let shape = broadcast_shape(&[cond.dims(), x.dims(), y.dims()]).ok_or_else(|| {
        OpError::shape(format!(
            "shapes {}, {} and {} cannot broadcast",
            cond.shape(),
            x.shape(),
            y.shape()
        ))
    })?;
    let mut out = ctx.alloc(x.dtype(), shape.as_slice())?;
    dispatch_any!(x.dtype(), T => {
        broadcast::ternary((cond.as_slice::<u8>()?, cond.dims()), (x.as_slice::<T>()?, x.dims()), (y.as_slice::<T>()?, y.dims()), out.as_mut_slice::<T>()?, &shape, |c, a, b| if c != 0 { a } else { b });
        Ok::<(), OpError>(())
    })?;
    Ok(out)
}

fn clip_typed<T: Scalar + Element>(
    c: &Clip,
    inputs: &[Option<&Tensor>],
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let x = input(inputs, 0)?;
    let bound = |i: usize, attr: Option<f32>, default: T| -> Result<T, OpError> {
        match opt_input(inputs, i) {
            Some(t) if t.numel() == 1 => Ok(t.as_slice::<T>()?[0]),
            Some(t) => Err(OpError::shape(format!(
                "clip bound (input {i}) must be a scalar, got shape {}",
                t.shape()
            ))),
            None => Ok(attr.map_or(default, T::from_f32)),
        }
    };
    let lo = bound(1, c.min, T::min_value())?;
    let hi = bound(2, c.max, T::max_value())?;
    map::<T, T>(x, x.dtype(), ctx, |v| {
        let v = if v < lo { lo } else { v };
        if v > hi { hi } else { v }
    })
}

pub(super) fn clip(
    c: &Clip,
    inputs: &[Option<&Tensor>],
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    dispatch_num!(input(inputs, 0)?.dtype(), T => clip_typed::<T>(c, inputs, ctx))
}

fn cast_to<S: Scalar + Element>(x: &Tensor, to: DType, ctx: &mut OpCtx) -> Result<Tensor, OpError> {
    if to == DType::Bool {
        return map::<S, u8>(x, DType::Bool, ctx, |v| (v != S::ZERO) as u8);
    }
    dispatch_num!(to, D => {
        // To a float: through f64, which holds every value of every source type except
        // 64-bit integers beyond 2^53 (rounded once, as a direct conversion would).
        map::<S, D>(x, to, ctx, |v| if D::IS_FLOAT { D::from_f64(v.to_f64()) } else { int_cast::<S, D>(v) })
    })
}

/// Casts to an integer type: floats truncate toward zero (saturating, NaN → 0); integers
/// keep their low bits (two's-complement wrap), as C++ `static_cast` does in onnxruntime.
fn int_cast<S: Scalar, D: Scalar>(v: S) -> D {
    if S::IS_FLOAT {
        D::from_f64(v.to_f64().trunc())
    } else {
        D::wrap_from_i128(v.to_i128())
    }
}

pub(super) fn cast(
    c: &Cast,
    inputs: &[Option<&Tensor>],
    ctx: &mut OpCtx,
) -> Result<Tensor, OpError> {
    let x = input(inputs, 0)?;
    let to = match c.to {
        Some(to) => to,
        None => input(inputs, 1)?.dtype(),
    };
    if x.dtype() == to {
        return Ok(x.clone());
    }
    if matches!(x.dtype(), DType::I4 | DType::U4) {
        return cast(
            &Cast {
                to: Some(to),
                saturate: c.saturate,
            },
            &[Some(&unpack_4bit(x)?)],
            ctx,
        );
    }
    if matches!(to, DType::I4 | DType::U4) {
        let wide = cast(
            &Cast {
                to: Some(DType::I64),
                saturate: c.saturate,
            },
            &[Some(x)],
            ctx,
        )?;
        return pack_4bit(&wide, to);
    }
    if x.dtype() == DType::Bool {
        return dispatch_num!(to, D => map::<u8, D>(x, to, ctx, |v| if v != 0 { D::ONE } else { D::ZERO }));
    }
    dispatch_num!(x.dtype(), S => cast_to::<S>(x, to, ctx))
}

/// Widens packed int4/uint4 (element `2i` in the low nibble of byte `i`) to int8/uint8.
fn unpack_4bit(x: &Tensor) -> Result<Tensor, OpError> {
    let signed = x.dtype() == DType::I4;
    let bytes = x.as_bytes();
    let values: Vec<u8> = (0..x.numel())
        .map(|i| {
            let nibble = (bytes[i / 2] >> (4 * (i % 2))) & 0xF;
            if signed && nibble >= 8 {
                nibble | 0xF0
            } else {
                nibble
            }
        })
        .collect();
    if signed {
        let values: Vec<i8> = values.iter().map(|&b| b as i8).collect();
        return Ok(Tensor::from_slice(x.shape().clone(), &values)?);
    }
    Ok(Tensor::from_slice(x.shape().clone(), &values)?)
}

/// Packs int64 values into int4/uint4, keeping the low four bits (ONNX Cast wraps).
fn pack_4bit(wide: &Tensor, to: DType) -> Result<Tensor, OpError> {
    let values = wide.as_slice::<i64>()?;
    let mut packed = vec![0u8; values.len().div_ceil(2)];
    for (i, &v) in values.iter().enumerate() {
        packed[i / 2] |= ((v as u8) & 0xF) << (4 * (i % 2));
    }
    Ok(Tensor::from_buf(
        to,
        wide.shape().clone(),
        oxgen_tensor::AlignedBuf::from_bytes(&packed),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_casts_wrap() {
        assert_eq!(int_cast::<i32, u8>(300), 44u8);
        assert_eq!(int_cast::<i32, i8>(200), -56i8);
        assert_eq!(int_cast::<f32, i32>(-2.7), -2);
        assert_eq!(
            int_cast::<i64, i32>((1 << 40) + 3),
            3,
            "wide integers wrap exactly"
        );
        assert_eq!(int_cast::<u64, i64>(u64::MAX), -1);
    }
}
