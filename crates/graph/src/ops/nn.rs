//! Linear algebra and normalization: MatMul, Gemm, LayerNormalization, RMSNormalization.

use super::Op;
use crate::{GraphError, NodeCtx, OpSpec};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemm {
    pub alpha: f32,
    pub beta: f32,
    pub trans_a: bool,
    pub trans_b: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormKind {
    /// `(x - mean) / sqrt(var + eps) * scale + bias`
    Layer,
    /// `x / sqrt(mean(x^2) + eps) * scale`
    Rms,
}

/// LayerNormalization / RMSNormalization over the axes from `axis` to the last.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Norm {
    pub kind: NormKind,
    pub axis: i64,
    pub epsilon: f32,
    /// The statistics are computed in f32 (`stash_type` 1); f64 stash is not supported.
    pub outputs: usize,
}

fn gemm(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    ctx.inputs(2, 3)?;
    ctx.outputs(1)?;
    if ctx.opset() < 7 && ctx.has_attr("broadcast") {
        ctx.ignore("broadcast");
    }
    let alpha = ctx.float("alpha", 1.0)?;
    let beta = ctx.float("beta", 1.0)?;
    let trans_a = ctx.bool("transA", false)?;
    let trans_b = ctx.bool("transB", false)?;
    Ok(Op::Gemm(Gemm {
        alpha,
        beta,
        trans_a,
        trans_b,
    }))
}

fn norm(ctx: &mut NodeCtx, kind: NormKind) -> Result<Op, GraphError> {
    let max_inputs = if kind == NormKind::Layer { 3 } else { 2 };
    ctx.inputs(2, max_inputs)?;
    let max_outputs = if kind == NormKind::Layer { 3 } else { 1 };
    ctx.outputs(max_outputs)?;
    let axis = ctx.int("axis", -1)?;
    let epsilon = ctx.float("epsilon", 1e-5)?;
    let stash = ctx.int("stash_type", 1)?;
    if stash != 1 {
        return Err(ctx.attr_error(
            "stash_type",
            format!("only 1 (float32) is supported, got {stash}"),
        ));
    }
    Ok(Op::Norm(Norm {
        kind,
        axis,
        epsilon,
        outputs: ctx.output_count(),
    }))
}

pub(super) fn specs() -> Vec<OpSpec> {
    vec![
        OpSpec::new("", "MatMul", 1, |ctx| {
            ctx.inputs(2, 2)?;
            ctx.outputs(1)?;
            Ok(Op::MatMul)
        }),
        OpSpec::new("", "Gemm", 6, gemm),
        OpSpec::new("", "LayerNormalization", 17, |ctx| {
            norm(ctx, NormKind::Layer)
        }),
        OpSpec::new("", "RMSNormalization", 23, |ctx| norm(ctx, NormKind::Rms)),
    ]
}

/// com.microsoft::SkipSimplifiedLayerNormalization attributes (placeholder: being implemented).
#[derive(Debug, Clone, PartialEq)]
pub struct SkipNorm {}
