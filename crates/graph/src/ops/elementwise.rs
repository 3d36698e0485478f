//! Element-wise ops: unary math, broadcasting binary arithmetic/comparison/logic, variadic
//! Max/Min/Sum/Mean, Where, Clip and Cast; onnxruntime's GELU ops (com.microsoft `Gelu`,
//! `BiasGelu`, `FastGelu`).

use oxgen_tensor::DType;

use super::Op;
use crate::{GraphError, NodeCtx, OpSpec};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UnaryOp {
    Abs,
    Neg,
    Sqrt,
    Reciprocal,
    Exp,
    Log,
    Erf,
    Tanh,
    Sigmoid,
    Relu,
    Sin,
    Cos,
    Floor,
    Ceil,
    Round,
    Sign,
    IsNaN,
    IsInf {
        detect_positive: bool,
        detect_negative: bool,
    },
    Not,
    /// `approximate = "tanh"` selects the tanh form.
    Gelu {
        tanh: bool,
    },
    LeakyRelu {
        alpha: f32,
    },
    Elu {
        alpha: f32,
    },
    Selu {
        alpha: f32,
        gamma: f32,
    },
    HardSigmoid {
        alpha: f32,
        beta: f32,
    },
    Softplus,
    Softsign,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    /// `fmod = 1`: the sign follows the dividend (C fmod); otherwise it follows the divisor.
    Mod {
        fmod: bool,
    },
    Equal,
    Less,
    Greater,
    LessOrEqual,
    GreaterOrEqual,
    And,
    Or,
    Xor,
    BitShiftLeft,
    BitShiftRight,
    BitwiseAnd,
    BitwiseOr,
    BitwiseXor,
}

impl BinaryOp {
    /// Comparison ops produce bool whatever their input type.
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Equal
                | BinaryOp::Less
                | BinaryOp::Greater
                | BinaryOp::LessOrEqual
                | BinaryOp::GreaterOrEqual
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VariadicOp {
    Max,
    Min,
    Sum,
    Mean,
}

/// Clip bounds given as attributes (opset < 11); later opsets take them as inputs 1 and 2.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clip {
    pub min: Option<f32>,
    pub max: Option<f32>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cast {
    /// Target dtype; `None` for CastLike (the dtype of input 1).
    pub to: Option<DType>,
    /// Float → float8 saturation; kept for completeness, no float8 dtype is supported.
    pub saturate: bool,
}

fn unary(ctx: &mut NodeCtx, op: UnaryOp) -> Result<Op, GraphError> {
    ctx.inputs(1, 1)?;
    ctx.outputs(1)?;
    Ok(Op::Unary(op))
}

macro_rules! unary_specs {
    ($($name:literal => $op:expr, since $since:literal;)*) => {
        vec![$(OpSpec::new("", $name, $since, |ctx| unary(ctx, $op)),)*]
    };
}

fn binary(ctx: &mut NodeCtx, op: BinaryOp) -> Result<Op, GraphError> {
    if ctx.opset() < 7 && (ctx.has_attr("broadcast") || ctx.has_attr("axis")) {
        return Err(ctx.attr_error("broadcast", "legacy (opset < 7) broadcasting is not supported; re-export the model with opset 7 or later"));
    }
    ctx.inputs(2, 2)?;
    ctx.outputs(1)?;
    Ok(Op::Binary(op))
}

macro_rules! binary_specs {
    ($($name:literal => $op:expr, since $since:literal;)*) => {
        vec![$(OpSpec::new("", $name, $since, |ctx| binary(ctx, $op)),)*]
    };
}

fn variadic(ctx: &mut NodeCtx, op: VariadicOp) -> Result<Op, GraphError> {
    ctx.inputs(1, usize::MAX)?;
    ctx.outputs(1)?;
    Ok(Op::Variadic(op))
}

fn gelu(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    let approximate = ctx.string("approximate", "none")?;
    let tanh = match approximate.as_str() {
        "none" => false,
        "tanh" => true,
        other => {
            return Err(ctx.attr_error(
                "approximate",
                format!("must be \"none\" or \"tanh\", got \"{other}\""),
            ));
        }
    };
    unary(ctx, UnaryOp::Gelu { tanh })
}

/// The erf GELU as exporters spell it out, `Mul(Mul(x, Add(Erf(Div(x, divisor)), add)), half)`
/// (or `Mul(Mul(x, half), Add(..))` when `half_first`), of `x = input + bias` where the node
/// has a bias (one value per element of the last axis): made by [`crate::passes::gelu`] and
/// run with the same operations in the same order, so with the same bits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErfGelu {
    pub divisor: f32,
    pub add: f32,
    pub half: f32,
    pub half_first: bool,
}

/// com.microsoft::BiasGelu (`bias` required, erf GELU) and FastGelu (`bias` optional, tanh
/// GELU): the GELU of `x + bias`, `bias` one value per element of the last axis.
fn bias_gelu(ctx: &mut NodeCtx, tanh: bool) -> Result<Op, GraphError> {
    ctx.inputs(if tanh { 1 } else { 2 }, 2)?;
    ctx.outputs(1)?;
    Ok(Op::BiasGelu { tanh })
}

fn modulo(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    let fmod = ctx.bool("fmod", false)?;
    binary(ctx, BinaryOp::Mod { fmod })
}

fn bit_shift(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    let op = match ctx.string_opt("direction")?.as_deref() {
        Some("LEFT") => BinaryOp::BitShiftLeft,
        Some("RIGHT") => BinaryOp::BitShiftRight,
        other => {
            return Err(ctx.attr_error(
                "direction",
                format!("must be \"LEFT\" or \"RIGHT\", got {other:?}"),
            ));
        }
    };
    binary(ctx, op)
}

fn clip(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    if ctx.opset() < 11 {
        ctx.inputs(1, 1)?;
        let min = ctx.float("min", f32::NEG_INFINITY)?;
        let max = ctx.float("max", f32::INFINITY)?;
        return Ok(Op::Clip(Clip {
            min: Some(min),
            max: Some(max),
        }));
    }
    ctx.inputs(1, 3)?;
    ctx.outputs(1)?;
    Ok(Op::Clip(Clip {
        min: None,
        max: None,
    }))
}

fn cast(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    ctx.inputs(1, 1)?;
    ctx.outputs(1)?;
    let code = ctx
        .int_opt("to")?
        .ok_or_else(|| ctx.attr_error("to", "is required"))?;
    let to = i32::try_from(code)
        .ok()
        .and_then(DType::from_onnx)
        .ok_or_else(|| {
            ctx.attr_error(
                "to",
                format!(
                    "casting to {} is not supported",
                    DType::onnx_name(code as i32)
                ),
            )
        })?;
    let saturate = ctx.bool("saturate", true)?;
    Ok(Op::Cast(Cast {
        to: Some(to),
        saturate,
    }))
}

fn cast_like(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    ctx.inputs(2, 2)?;
    ctx.outputs(1)?;
    let saturate = ctx.bool("saturate", true)?;
    Ok(Op::Cast(Cast { to: None, saturate }))
}

fn where_(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    ctx.inputs(3, 3)?;
    ctx.outputs(1)?;
    Ok(Op::Where)
}

pub(super) fn specs() -> Vec<OpSpec> {
    let mut specs = unary_specs! {
        "Abs" => UnaryOp::Abs, since 6;
        "Neg" => UnaryOp::Neg, since 6;
        "Sqrt" => UnaryOp::Sqrt, since 6;
        "Reciprocal" => UnaryOp::Reciprocal, since 6;
        "Exp" => UnaryOp::Exp, since 6;
        "Log" => UnaryOp::Log, since 6;
        "Erf" => UnaryOp::Erf, since 9;
        "Tanh" => UnaryOp::Tanh, since 6;
        "Sigmoid" => UnaryOp::Sigmoid, since 6;
        "Relu" => UnaryOp::Relu, since 6;
        "Sin" => UnaryOp::Sin, since 7;
        "Cos" => UnaryOp::Cos, since 7;
        "Floor" => UnaryOp::Floor, since 6;
        "Ceil" => UnaryOp::Ceil, since 6;
        "Round" => UnaryOp::Round, since 11;
        "Sign" => UnaryOp::Sign, since 9;
        "IsNaN" => UnaryOp::IsNaN, since 9;
        "Not" => UnaryOp::Not, since 1;
        "Softplus" => UnaryOp::Softplus, since 1;
        "Softsign" => UnaryOp::Softsign, since 1;
    };
    specs.extend(binary_specs! {
        "Add" => BinaryOp::Add, since 1;
        "Sub" => BinaryOp::Sub, since 1;
        "Mul" => BinaryOp::Mul, since 1;
        "Div" => BinaryOp::Div, since 1;
        "Pow" => BinaryOp::Pow, since 7;
        "Equal" => BinaryOp::Equal, since 7;
        "Less" => BinaryOp::Less, since 7;
        "Greater" => BinaryOp::Greater, since 7;
        "LessOrEqual" => BinaryOp::LessOrEqual, since 12;
        "GreaterOrEqual" => BinaryOp::GreaterOrEqual, since 12;
        "And" => BinaryOp::And, since 7;
        "Or" => BinaryOp::Or, since 7;
        "Xor" => BinaryOp::Xor, since 7;
        "BitwiseAnd" => BinaryOp::BitwiseAnd, since 18;
        "BitwiseOr" => BinaryOp::BitwiseOr, since 18;
        "BitwiseXor" => BinaryOp::BitwiseXor, since 18;
    });
    specs.extend([
        OpSpec::new("", "Gelu", 20, gelu),
        // onnxruntime's erf GELU, from before ONNX had one.
        OpSpec::new("com.microsoft", "Gelu", 1, |ctx| {
            unary(ctx, UnaryOp::Gelu { tanh: false })
        }),
        OpSpec::new("com.microsoft", "BiasGelu", 1, |ctx| bias_gelu(ctx, false)),
        OpSpec::new("com.microsoft", "FastGelu", 1, |ctx| bias_gelu(ctx, true)),
        OpSpec::new("", "Mod", 10, modulo),
        OpSpec::new("", "BitShift", 11, bit_shift),
        OpSpec::new("", "Max", 8, |ctx| variadic(ctx, VariadicOp::Max)),
        OpSpec::new("", "Min", 8, |ctx| variadic(ctx, VariadicOp::Min)),
        OpSpec::new("", "Sum", 8, |ctx| variadic(ctx, VariadicOp::Sum)),
        OpSpec::new("", "Mean", 8, |ctx| variadic(ctx, VariadicOp::Mean)),
        OpSpec::new("", "Where", 9, where_),
        OpSpec::new("", "Clip", 6, clip),
        OpSpec::new("", "Cast", 6, cast),
        OpSpec::new("", "CastLike", 15, cast_like),
        OpSpec::new("", "IsInf", 10, |ctx| {
            let detect_positive = ctx.bool("detect_positive", true)?;
            let detect_negative = ctx.bool("detect_negative", true)?;
            unary(
                ctx,
                UnaryOp::IsInf {
                    detect_positive,
                    detect_negative,
                },
            )
        }),
        OpSpec::new("", "LeakyRelu", 6, |ctx| {
            let alpha = ctx.float("alpha", 0.01)?;
            unary(ctx, UnaryOp::LeakyRelu { alpha })
        }),
        OpSpec::new("", "Elu", 6, |ctx| {
            let alpha = ctx.float("alpha", 1.0)?;
            unary(ctx, UnaryOp::Elu { alpha })
        }),
        OpSpec::new("", "Selu", 6, |ctx| {
            let alpha = ctx.float("alpha", 1.673_263_2)?;
            let gamma = ctx.float("gamma", 1.050_701)?;
            unary(ctx, UnaryOp::Selu { alpha, gamma })
        }),
        OpSpec::new("", "HardSigmoid", 6, |ctx| {
            let alpha = ctx.float("alpha", 0.2)?;
            let beta = ctx.float("beta", 0.5)?;
            unary(ctx, UnaryOp::HardSigmoid { alpha, beta })
        }),
    ]);
    specs
}
