//! Mixture of experts: com.microsoft::MoE (f32 experts) and QMoE (4- or 8-bit experts), as
//! onnxruntime 1.32 defines them for CPU (`docs/ContribOperators.md`; the CPU kernels
//! `moe_cpu.cc` and `moe_quantization_cpu.cc`). The arithmetic is `oxgen_kernels::moe`'s.
//!
//! Supported: inputs input, router_probs (logits), the first and second projections' weights
//! and biases; QMoE's scales, zero points (inputs 11 and 12) and router_weights (input 14);
//! attributes k, activation_type (relu, gelu, silu, identity, swiglu with
//! `swiglu_fusion = 1`, the interleaved form onnxruntime's CPU kernels take), swiglu_limit,
//! activation_alpha, activation_beta, normalize_routing_weights, expert_weight_bits (4 or 8),
//! block_size, accuracy_level (4 computes with int8 activations, as for MatMulNBits).
//!
//! QMoE's `quant_type` is `int` (integer experts) or `fp4` (MXFP4: e2m1 codes with e8m0
//! scales per 32, the layout onnxruntime-genai's builder writes, global scales at inputs 15
//! and 16 of 1).
//!
//! Rejected at load, naming the node: a third projection (fc3 inputs), activation scales and
//! integer experts' global scales, `use_sparse_mixer = 1` (Phi-3.5-MoE's routing), swiglu in
//! the concatenated or separate forms, 2-bit experts, other `quant_type`s (nvfp4) and
//! prepacked weights.

use super::Op;
use crate::{GraphError, NodeCtx, OpSpec};

/// How a token's router logits become its expert routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeRouting {
    /// MoE: softmax over all experts, the `k` most probable, renormalized when asked.
    SoftmaxTopK { normalize: bool },
    /// QMoE: the `k` largest logits, a softmax over them (or the given `router_weights`,
    /// renormalized when asked).
    TopKSoftmax { normalize_given: bool },
}

/// The activation between the two projections.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MoeActivation {
    Relu,
    Gelu,
    Silu,
    Identity,
    /// Interleaved (gate, linear) pairs: `min(g, limit) · sigmoid(alpha · g) ·
    /// (clamp(l, ±limit) + beta)`.
    SwiGlu {
        alpha: f32,
        beta: f32,
        limit: f32,
    },
}

/// How QMoE's expert weights are stored (`quant_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeFormat {
    /// `int`: integer codes with float scales and optional zero points, `[E, N, K / pack]`.
    Int,
    /// `fp4`: MXFP4, e2m1 codes `[E, K, N / 2]` with e8m0 scales `[E, N, K / 32]` (the form
    /// onnxruntime-genai's builder writes for gpt-oss; global scales of 1 only).
    Mxfp4,
}

/// QMoE's expert quantization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeQuant {
    pub format: MoeFormat,
    /// 4 or 8.
    pub bits: u32,
    /// Codes per scale along K; `None` for one scale per row.
    pub block_size: Option<usize>,
    /// 4 computes with int8 activations (unless the session is exact).
    pub accuracy_level: u8,
}

/// com.microsoft::MoE or QMoE.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moe {
    /// Experts per token.
    pub k: usize,
    pub routing: MoeRouting,
    pub activation: MoeActivation,
    /// `None` for MoE's f32 experts.
    pub quant: Option<MoeQuant>,
}

impl Moe {
    /// Where the node's inputs are: `(fc1 weights, fc1 scales, fc1 bias, fc2 weights,
    /// fc2 scales, fc2 bias)` (scales only for QMoE).
    pub fn inputs(&self) -> MoeInputs {
        if self.quant.is_some() {
            MoeInputs {
                fc1: (2, Some(3), 4),
                fc2: (5, Some(6), 7),
                zero_points: Some((11, 12)),
                router_weights: Some(14),
            }
        } else {
            MoeInputs {
                fc1: (2, None, 3),
                fc2: (4, None, 5),
                zero_points: None,
                router_weights: None,
            }
        }
    }
}

/// Input indices of a MoE or QMoE node (see [`Moe::inputs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeInputs {
    /// `(weights, scales, bias)` of the first projection.
    pub fc1: (usize, Option<usize>, usize),
    pub fc2: (usize, Option<usize>, usize),
    pub zero_points: Option<(usize, usize)>,
    pub router_weights: Option<usize>,
}

fn common(ctx: &mut NodeCtx) -> Result<(usize, bool, MoeActivation), GraphError> {
    let k = match ctx.int_opt("k")? {
        None => return Err(ctx.attr_error("k", "is required (experts per token)")),
        Some(k) if k >= 1 => usize::try_from(k).map_err(|_| ctx.attr_error("k", "is too large"))?,
        Some(k) => return Err(ctx.attr_error("k", format!("must be at least 1, got {k}"))),
    };
    let normalize = ctx.bool("normalize_routing_weights", false)?;
    if ctx.int("use_sparse_mixer", 0)? != 0 {
        return Err(ctx.attr_error(
            "use_sparse_mixer",
            "sparse mixer routing (Phi-3.5-MoE) is not implemented; use the ort backend",
        ));
    }
    let alpha = ctx.float("activation_alpha", 1.0)?;
    let beta = ctx.float("activation_beta", 0.0)?;
    let limit = ctx.float("swiglu_limit", f32::INFINITY)?;
    let fusion = ctx.int("swiglu_fusion", 0)?;
    let name = ctx.string("activation_type", "relu")?;
    let activation = match name.as_str() {
        "relu" => MoeActivation::Relu,
        "gelu" => MoeActivation::Gelu,
        "silu" => MoeActivation::Silu,
        "identity" => MoeActivation::Identity,
        "swiglu" => {
            if fusion != 1 {
                return Err(ctx.attr_error(
                    "swiglu_fusion",
                    format!(
                        "{fusion} is not supported: only 1 (interleaved gate and linear \
                         columns in the first projection) is, as on onnxruntime's CPU"
                    ),
                ));
            }
            if !alpha.is_finite() || !beta.is_finite() || limit.is_nan() || limit <= 0.0 {
                return Err(ctx.invalid(format!(
                    "swiglu needs finite activation_alpha and activation_beta and a positive \
                     swiglu_limit, got {alpha}, {beta} and {limit}"
                )));
            }
            MoeActivation::SwiGlu { alpha, beta, limit }
        }
        other => {
            return Err(ctx.attr_error(
                "activation_type",
                format!(
                    "'{other}' is not supported (supported: relu, gelu, silu, identity, swiglu)"
                ),
            ));
        }
    };
    Ok((k, normalize, activation))
}

/// Inputs past the leading required ones that must be present (optional ones lie between).
fn required(ctx: &NodeCtx, inputs: &[(usize, &str)]) -> Result<(), GraphError> {
    match inputs.iter().find(|(i, _)| !ctx.has_input(*i)) {
        Some((i, name)) => Err(ctx.invalid(format!("input {i} ({name}) is required"))),
        None => Ok(()),
    }
}

fn moe(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    for (i, name) in [(6, "fc3_experts_weights"), (7, "fc3_experts_bias")] {
        if ctx.has_input(i) {
            return Err(ctx.invalid(format!(
                "input {i} ({name}): a third expert projection is not supported, as on \
                 onnxruntime's CPU; use swiglu with swiglu_fusion = 1"
            )));
        }
    }
    ctx.inputs(3, 6)?;
    ctx.outputs(1)?;
    required(ctx, &[(4, "fc2_experts_weights")])?;
    let (k, normalize, activation) = common(ctx)?;
    Ok(Op::Moe(Moe {
        k,
        routing: MoeRouting::SoftmaxTopK { normalize },
        activation,
        quant: None,
    }))
}

/// QMoE's inputs from 8 on that are refused, with their names (the global scales only for
/// integer experts: MXFP4 ones may have them, at 1).
const QMOE_REFUSED: [(usize, &str); 10] = [
    (8, "fc3_experts_weights"),
    (9, "fc3_scales"),
    (10, "fc3_experts_bias"),
    (13, "fc3_zero_points"),
    (15, "fc1_global_scale"),
    (16, "fc2_global_scale"),
    (17, "fc3_global_scale"),
    (18, "fc1_activation_scale"),
    (19, "fc2_activation_scale"),
    (20, "fc3_activation_scale"),
];

/// Where MXFP4 QMoE takes its per-expert global scales (fc1, fc2).
pub const QMOE_GLOBAL_SCALES: [usize; 2] = [15, 16];

fn qmoe(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    let quant_type = ctx.string("quant_type", "int")?;
    let format = match quant_type.as_str() {
        "int" => MoeFormat::Int,
        "fp4" => MoeFormat::Mxfp4,
        other => {
            return Err(ctx.attr_error(
                "quant_type",
                format!("'{other}' is not supported (supported: int, fp4 as MXFP4)"),
            ));
        }
    };
    let refused = QMOE_REFUSED.iter().find(|(i, _)| {
        ctx.has_input(*i) && !(format == MoeFormat::Mxfp4 && QMOE_GLOBAL_SCALES.contains(i))
    });
    if let Some((i, name)) = refused {
        return Err(ctx.invalid(format!(
            "input {i} ({name}) is not supported: only integer or MXFP4 experts without a \
             third projection are; use the ort backend"
        )));
    }
    if format == MoeFormat::Mxfp4
        && let Some(i) = [11, 12].into_iter().find(|&i| ctx.has_input(i))
    {
        return Err(ctx.invalid(format!("input {i}: MXFP4 experts have no zero points")));
    }
    ctx.inputs(4, 17)?;
    ctx.outputs(1)?;
    required(ctx, &[(5, "fc2_experts_weights"), (6, "fc2_scales")])?;
    let (k, normalize, activation) = common(ctx)?;
    let bits = ctx.int("expert_weight_bits", 4)?;
    if bits != 4 && bits != 8 {
        return Err(ctx.attr_error(
            "expert_weight_bits",
            format!("{bits}-bit experts are not supported (supported: 4, 8)"),
        ));
    }
    if format == MoeFormat::Mxfp4 && bits != 4 {
        return Err(ctx.attr_error(
            "expert_weight_bits",
            format!("MXFP4 experts are 4-bit, got {bits}"),
        ));
    }
    let block_size = match ctx.int("block_size", 0)? {
        0 | 32 if format == MoeFormat::Mxfp4 => Some(32),
        b if format == MoeFormat::Mxfp4 => {
            return Err(
                ctx.attr_error("block_size", format!("MXFP4 blocks are 32 values, got {b}"))
            );
        }
        0 => None,
        b if b >= 16 && (b & (b - 1)) == 0 => Some(b as usize),
        b => {
            return Err(ctx.attr_error(
                "block_size",
                format!("must be 0 (one scale per row) or a power of two >= 16, got {b}"),
            ));
        }
    };
    let accuracy_level = super::quant::accuracy_level(ctx)?;
    if !matches!(ctx.int("weights_prepacked", -1)?, -1 | 0) {
        return Err(ctx.attr_error(
            "weights_prepacked",
            "weights prepacked for another runtime are not supported; use the standard layout",
        ));
    }
    Ok(Op::Moe(Moe {
        k,
        routing: MoeRouting::TopKSoftmax {
            normalize_given: normalize,
        },
        activation,
        quant: Some(MoeQuant {
            format,
            bits: bits as u32,
            block_size,
            accuracy_level,
        }),
    }))
}

pub(super) fn specs() -> Vec<OpSpec> {
    vec![
        OpSpec::new("com.microsoft", "MoE", 1, moe),
        OpSpec::new("com.microsoft", "QMoE", 1, qmoe),
    ]
}
