//! Quantized ops: com.microsoft::MatMulNBits and GatherBlockQuantized (block-quantized
//! weights), and the ONNX ops of onnxruntime's dynamic int8 exports (`quantize_dynamic`:
//! `DynamicQuantizeLinear`, `MatMulInteger`, `MatMulIntegerToFloat`, `DequantizeLinear`).
//!
//! Reference: onnxruntime `docs/ContribOperators.md` and the CPU kernels in
//! `onnxruntime/contrib_ops/cpu/quantization/` (`matmul_nbits.cc`,
//! `gather_block_quantized.cc`), the ONNX operator docs for the standard ones. The weight
//! layouts are documented on the kernels (`oxgen_kernels::nbits`, `oxgen_kernels::quant`).

use super::Op;
use crate::{GraphError, NodeCtx, OpSpec};

/// Code widths the native kernels unpack (the LLM exports use 4, some 8).
const SUPPORTED_BITS: [i64; 2] = [4, 8];

/// com.microsoft::MatMulNBits: `Y = A · dequant(B)ᵀ (+ bias)`, B of shape
/// `[N, ceil(K / block_size), block_size * bits / 8]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatMulNBits {
    /// Input features (A's last dimension).
    pub k: usize,
    /// Output features.
    pub n: usize,
    /// 4 or 8.
    pub bits: u32,
    /// A power of two, at least 16.
    pub block_size: usize,
    /// How far A may be downcast or quantized (0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8). The
    /// reference kernel always computes in f32; fast kernels read this to choose int8 paths.
    pub accuracy_level: u8,
}

/// com.microsoft::GatherBlockQuantized: a Gather over axis 0 of block-quantized uint8 data
/// (the quantized embedding table), dequantized into the scales' type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatherBlockQuantized {
    /// The attribute as written; must resolve to the last axis of the data (checked here
    /// when the data is an initializer, otherwise when the op runs).
    pub quantize_axis: i64,
    /// A power of two, at least 16.
    pub block_size: usize,
    /// 4 or 8: codes per data byte are `8 / bits` (the data's last dimension is packed).
    pub bits: u32,
}

fn bits(ctx: &mut NodeCtx) -> Result<u32, GraphError> {
    let bits = ctx.int("bits", 4)?;
    if !SUPPORTED_BITS.contains(&bits) {
        return Err(ctx.attr_error(
            "bits",
            format!("{bits}-bit weights are not supported (supported: {SUPPORTED_BITS:?})"),
        ));
    }
    Ok(bits as u32)
}

fn block_size(ctx: &mut NodeCtx, default: Option<i64>) -> Result<usize, GraphError> {
    let value = match (ctx.int_opt("block_size")?, default) {
        (Some(v), _) | (None, Some(v)) => v,
        (None, None) => return Err(ctx.attr_error("block_size", "is required")),
    };
    if value < 16 || (value & (value - 1)) != 0 {
        return Err(ctx.attr_error(
            "block_size",
            format!("must be a power of two >= 16, got {value}"),
        ));
    }
    usize::try_from(value).map_err(|_| ctx.attr_error("block_size", "does not fit in memory"))
}

fn positive(ctx: &mut NodeCtx, name: &str) -> Result<usize, GraphError> {
    match ctx.int_opt(name)? {
        None => Err(ctx.attr_error(name, "is required")),
        Some(v) if v <= 0 => Err(ctx.attr_error(name, format!("must be positive, got {v}"))),
        Some(v) => usize::try_from(v).map_err(|_| ctx.attr_error(name, "is too large")),
    }
}

/// The `accuracy_level` attribute (0 unset, 1 fp32, 2 fp16, 3 bf16, 4 int8), shared with QMoE.
pub(super) fn accuracy_level(ctx: &mut NodeCtx) -> Result<u8, GraphError> {
    let level = ctx.int("accuracy_level", 0)?;
    u8::try_from(level)
        .ok()
        .filter(|&l| l <= 4)
        .ok_or_else(|| ctx.attr_error("accuracy_level", format!("must be 0..=4, got {level}")))
}

fn matmul_nbits(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    ctx.inputs(3, 6)?;
    ctx.outputs(1)?;
    if ctx.has_input(4) {
        return Err(ctx.invalid(
            "optional input 4 (g_idx, act-order group indices) is not supported: it is \
             deprecated; re-export the model without g_idx (e.g. onnxruntime's \
             matmul_nbits_quantizer without act-order)",
        ));
    }
    let k = positive(ctx, "K")?;
    let n = positive(ctx, "N")?;
    let bits = bits(ctx)?;
    let block_size = block_size(ctx, None)?;
    let accuracy_level = accuracy_level(ctx)?;
    if ctx.int("weight_prepacked", 0)? != 0 {
        return Err(ctx.attr_error(
            "weight_prepacked",
            "B prepacked for a specific runtime is not supported; use the standard layout",
        ));
    }
    Ok(Op::MatMulNBits(MatMulNBits {
        k,
        n,
        bits,
        block_size,
        accuracy_level,
    }))
}

fn gather_block_quantized(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    ctx.inputs(3, 4)?;
    ctx.outputs(1)?;
    let gather_axis = ctx.int("gather_axis", 0)?;
    let quantize_axis = ctx.int("quantize_axis", 1)?;
    let bits = bits(ctx)?;
    let block_size = block_size(ctx, Some(128))?;
    let rank = ctx.input_rank(0);
    let gather_is_first = gather_axis == 0 || rank.is_some_and(|r| gather_axis == -(r as i64));
    if !gather_is_first {
        return Err(ctx.attr_error(
            "gather_axis",
            format!(
                "only gather_axis 0 (gathering rows of the table) is supported for uint8 data, \
                 got {gather_axis}"
            ),
        ));
    }
    if let Some(rank) = rank {
        let last = rank as i64 - 1;
        if rank < 2 || (quantize_axis != -1 && quantize_axis != last) {
            return Err(ctx.attr_error(
                "quantize_axis",
                format!(
                    "must be the last axis of the data (rank {rank}, so -1 or {last}) and \
                     differ from gather_axis 0, got {quantize_axis}"
                ),
            ));
        }
    } else if quantize_axis == 0 || quantize_axis < -1 {
        return Err(ctx.attr_error(
            "quantize_axis",
            format!("must be the last axis of the data (e.g. -1), got {quantize_axis}"),
        ));
    }
    Ok(Op::GatherBlockQuantized(GatherBlockQuantized {
        quantize_axis,
        block_size,
        bits,
    }))
}

/// ONNX DequantizeLinear: `y = (x - zero_point) · scale`, per tensor or per `axis`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dequantize {
    pub axis: i64,
}

fn dequantize_linear(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    ctx.inputs(2, 3)?;
    ctx.outputs(1)?;
    let axis = ctx.int("axis", 1)?;
    if ctx.int("block_size", 0)? != 0 {
        return Err(ctx.attr_error(
            "block_size",
            "blocked dequantization is not supported; only per-tensor and per-axis scales",
        ));
    }
    if ctx.has_attr("output_dtype") && ctx.int("output_dtype", 0)? != 0 {
        return Err(ctx.attr_error("output_dtype", "only the scale's type is supported"));
    }
    Ok(Op::Dequantize(Dequantize { axis }))
}

fn dynamic_quantize_linear(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    ctx.inputs(1, 1)?;
    ctx.outputs(3)?;
    Ok(Op::DynamicQuantize)
}

fn matmul_integer(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    ctx.inputs(2, 4)?;
    ctx.outputs(1)?;
    Ok(Op::MatMulInteger)
}

fn matmul_integer_to_float(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    ctx.inputs(4, 7)?;
    ctx.outputs(1)?;
    Ok(Op::MatMulIntegerToFloat)
}

pub(super) fn specs() -> Vec<OpSpec> {
    vec![
        OpSpec::new("", "DequantizeLinear", 10, dequantize_linear),
        OpSpec::new("", "DynamicQuantizeLinear", 11, dynamic_quantize_linear),
        OpSpec::new("", "MatMulInteger", 10, matmul_integer),
        OpSpec::new(
            "com.microsoft",
            "MatMulIntegerToFloat",
            1,
            matmul_integer_to_float,
        ),
        OpSpec::new("com.microsoft", "MatMulNBits", 1, matmul_nbits),
        OpSpec::new(
            "com.microsoft",
            "GatherBlockQuantized",
            1,
            gather_block_quantized,
        ),
    ]
}
