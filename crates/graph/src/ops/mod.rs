//! Typed ops: one variant per operator family, with validated attributes.
//!
//! Each family file holds its attribute structs and the builders the registry calls. Input
//! tensors (including ONNX's newer "attributes as inputs" like Reshape's shape) are read by
//! the executor at run time; what is fixed per node lives here.

mod attention;
mod control;
mod elementwise;
mod moe;
mod nn;
mod quant;
mod reduce;
mod shape;

pub use attention::{
    Attention, EncoderAttention, GroupQueryAttention, HEAD_SINK_INPUT, LONG_ROPE_INPUTS, Rotary,
    RotaryKind, ScoreScale,
};
pub use control::{If, Loop, Scan, Subgraph};
pub use elementwise::{BinaryOp, Cast, Clip, ErfGelu, UnaryOp, VariadicOp};
pub use moe::{Moe, MoeActivation, MoeFormat, MoeInputs, MoeQuant, MoeRouting, QMOE_GLOBAL_SCALES};
pub use nn::{EmbedNorm, Gemm, Norm, NormKind, SkipNorm};
pub use quant::{Dequantize, GatherBlockQuantized, MatMulNBits};
pub use reduce::{ArgReduce, CumSum, Reduce, ReduceKind, Softmax, TopK};
pub use shape::{Gather, ScatterND, ScatterReduction, Slice, Split, Squeeze};

use oxgen_tensor::Tensor;

use crate::OpSpec;

/// A typed operator.
#[derive(Debug, Clone)]
pub enum Op {
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// N-ary broadcasting ops (Max, Min, Sum, Mean).
    Variadic(VariadicOp),
    Where,
    Clip(Clip),
    Cast(Cast),
    Identity,
    Constant(Tensor),
    ConstantOfShape(Tensor),
    Shape {
        start: i64,
        end: Option<i64>,
    },
    Size,
    Reshape {
        allowzero: bool,
    },
    Flatten {
        axis: i64,
    },
    Squeeze(Squeeze),
    Unsqueeze(Squeeze),
    Transpose {
        perm: Option<Vec<i64>>,
    },
    Concat {
        axis: i64,
    },
    Split(Split),
    Slice(Slice),
    Expand,
    Tile,
    Range,
    Gather(Gather),
    GatherElements {
        axis: i64,
    },
    ScatterND(ScatterND),
    Trilu {
        upper: bool,
    },
    CumSum(CumSum),
    Reduce(Reduce),
    ArgReduce(ArgReduce),
    TopK(TopK),
    Softmax(Softmax),
    MatMul,
    Gemm(Gemm),
    Norm(Norm),
    /// com.microsoft::SkipSimplifiedLayerNormalization (and its LayerNorm sibling).
    SkipNorm(SkipNorm),
    /// com.microsoft::EmbedLayerNormalization.
    EmbedNorm(EmbedNorm),
    /// com.microsoft::Attention (an encoder's fused self-attention).
    Attention(Attention),
    /// com.microsoft::BiasGelu (`tanh` false) and FastGelu (`tanh`): GELU of `x + bias`.
    BiasGelu {
        tanh: bool,
    },
    /// The erf GELU spelled out (inputs `x` and an optional bias), made by
    /// [`crate::passes::gelu`] (same bits).
    ErfGelu(ErfGelu),
    /// An encoder's spelled-out self-attention (inputs `q`, `k`, `v` and an optional mask),
    /// made by [`crate::passes::heads`] (same bits).
    EncoderAttention(EncoderAttention),
    MatMulNBits(MatMulNBits),
    /// `MatMulNBits` nodes that read one input, joined by [`crate::passes::group`]: inputs A,
    /// then B, scales and zero points (or none) per part; one output per part.
    MatMulNBitsGroup(Vec<MatMulNBits>),
    /// A gated MLP's gate and up projections (a two-part `MatMulNBitsGroup`, gate first) and
    /// the `SiluMul` over them, joined by [`crate::passes::silu::fuse_glu`]: inputs as the
    /// group's; one output, `silu(gate) * up`, with the bits of the ops it replaces.
    MatMulNBitsGlu([MatMulNBits; 2]),
    GatherBlockQuantized(GatherBlockQuantized),
    /// ONNX DequantizeLinear.
    Dequantize(Dequantize),
    /// ONNX DynamicQuantizeLinear: uint8 codes, their scale and zero point.
    DynamicQuantize,
    /// ONNX MatMulInteger: int32 products of (u)int8 matrices less their zero points.
    MatMulInteger,
    /// com.microsoft::MatMulIntegerToFloat: `MatMulInteger`'s int32 products as float32,
    /// times `a_scale · b_scale`, plus an optional bias (inputs A, B, a_scale, b_scale,
    /// a_zero_point, b_zero_point, bias); also made by [`crate::passes::integer`] from the
    /// ops that spell it out (same bits).
    MatMulIntegerToFloat,
    /// `g * sigmoid(g) * u` on float32 tensors of one shape, made by [`crate::passes::silu`]
    /// from the ops that spell it out (same bits).
    SiluMul,
    GroupQueryAttention(GroupQueryAttention),
    Moe(Moe),
    /// com.microsoft::RotaryEmbedding and ONNX (opset 23) RotaryEmbedding.
    Rotary(Rotary),
    If(Box<If>),
    Loop(Box<Loop>),
    Scan(Box<Scan>),
}

impl Op {
    /// Input positions the op may update in place and return as an output (KV caches). The
    /// executor hands such an input over, instead of lending it, when this node is its last
    /// reader; otherwise the op copies it.
    pub fn inplace_inputs(&self) -> &'static [usize] {
        match self {
            // past_key, past_value: with a shared past/present buffer they become present.
            Op::GroupQueryAttention(_) => &[3, 4],
            // View ops: the output is the input's buffer under another shape.
            Op::Identity
            | Op::Reshape { .. }
            | Op::Flatten { .. }
            | Op::Squeeze(_)
            | Op::Unsqueeze(_) => &[0],
            _ => &[],
        }
    }
}

/// Every op spec the native backend registers.
pub fn specs() -> Vec<OpSpec> {
    let mut specs = Vec::new();
    specs.extend(elementwise::specs());
    specs.extend(shape::specs());
    specs.extend(reduce::specs());
    specs.extend(nn::specs());
    specs.extend(quant::specs());
    specs.extend(attention::specs());
    specs.extend(moe::specs());
    specs.extend(control::specs());
    specs
}
