//! Linear algebra and normalization: MatMul, Gemm, LayerNormalization, RMSNormalization,
//! onnxruntime's SimplifiedLayerNormalization (default domain, the RMS norm of its LLM
//! exports), com.microsoft::SkipSimplifiedLayerNormalization and
//! com.microsoft::SkipLayerNormalization; com.microsoft::EmbedLayerNormalization (a BERT's
//! embeddings and their LayerNorm).

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

/// LayerNormalization (Y, Mean, InvStdDev), RMSNormalization (Y) and onnxruntime's
/// SimplifiedLayerNormalization (Y, inv_std_var): `max_outputs` tells the last two apart.
fn norm(ctx: &mut NodeCtx, kind: NormKind, max_outputs: usize) -> Result<Op, GraphError> {
    let max_inputs = if kind == NormKind::Layer { 3 } else { 2 };
    ctx.inputs(2, max_inputs)?;
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
            norm(ctx, NormKind::Layer, 3)
        }),
        OpSpec::new("", "RMSNormalization", 23, |ctx| {
            norm(ctx, NormKind::Rms, 1)
        }),
        // onnxruntime registers it in the default domain from opset 1 on (an extension of
        // the ONNX domain); Y and the optional per-row inv_std_var.
        OpSpec::new("", "SimplifiedLayerNormalization", 1, |ctx| {
            norm(ctx, NormKind::Rms, 2)
        }),
        OpSpec::new(
            "com.microsoft",
            "SkipSimplifiedLayerNormalization",
            1,
            |ctx| skip_norm(ctx, NormKind::Rms),
        ),
        OpSpec::new("com.microsoft", "SkipLayerNormalization", 1, |ctx| {
            skip_norm(ctx, NormKind::Layer)
        }),
        OpSpec::new("com.microsoft", "EmbedLayerNormalization", 1, embed_norm),
    ]
}

/// com.microsoft::EmbedLayerNormalization: `output = LayerNorm(word[input_ids] +
/// position[position_ids] + segment[segment_ids]) * gamma + beta` over the hidden axis.
/// Inputs `input_ids, segment_ids?, word_embedding, position_embedding, segment_embedding?,
/// gamma, beta, mask?, position_ids?` (ids int32; positions `0..seq` when `position_ids` is
/// absent, which may also be `[1, seq]`); outputs `output, mask_index?, embedding_sum?`
/// (`mask_index[b]`: the ones in row `b` of `mask`, or 0 without one; the sum: before the
/// norm).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EmbedNorm {
    pub epsilon: f32,
}

fn embed_norm(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    // Inputs 1 and 4 (the segments) are optional inside the seven the schema lists.
    ctx.inputs(1, 9)?;
    if let Some(index) = [2, 3, 5, 6].into_iter().find(|&i| !ctx.has_input(i)) {
        return Err(GraphError::MissingInput {
            node: Box::new(ctx.node_ref().clone()),
            index,
        });
    }
    ctx.outputs(3)?;
    let epsilon = ctx.float("epsilon", SKIP_NORM_EPSILON)?;
    if !(epsilon >= 0.0 && epsilon.is_finite()) {
        return Err(ctx.attr_error("epsilon", format!("must be finite and >= 0, got {epsilon}")));
    }
    // 1 (the default) computes `mask_index`; 0 leaves it out (its output is then unused).
    ctx.ignore("mask_index_type");
    if ctx.has_input(1) != ctx.has_input(4) {
        return Err(ctx.invalid(
            "segment_ids (input 1) and segment_embedding (input 4) come together: give both or \
             neither",
        ));
    }
    Ok(Op::EmbedNorm(EmbedNorm { epsilon }))
}

/// com.microsoft::SkipSimplifiedLayerNormalization (`kind` Rms) and SkipLayerNormalization
/// (`kind` Layer): the norm of `input + skip (+ bias)` over the last axis. Inputs `input,
/// skip, gamma, bias?` for the RMS form and `input, skip, gamma, beta?, bias?` for the layer
/// form (`output = (v - mean) / sqrt(var + eps) * gamma + beta`); outputs `output, mean?,
/// inv_std_var?, input_skip_bias_sum?` (the sum is the residual stream for the next layer;
/// the RMS form's `mean` is all zeros, as onnxruntime returns it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SkipNorm {
    pub kind: NormKind,
    pub epsilon: f32,
}

/// The schema's default epsilon for the Skip*LayerNormalization family.
const SKIP_NORM_EPSILON: f32 = 1e-12;

fn skip_norm(ctx: &mut NodeCtx, kind: NormKind) -> Result<Op, GraphError> {
    ctx.inputs(3, if kind == NormKind::Layer { 5 } else { 4 })?;
    ctx.outputs(4)?;
    let epsilon = ctx.float("epsilon", SKIP_NORM_EPSILON)?;
    if !(epsilon >= 0.0 && epsilon.is_finite()) {
        return Err(ctx.attr_error("epsilon", format!("must be finite and >= 0, got {epsilon}")));
    }
    Ok(Op::SkipNorm(SkipNorm { kind, epsilon }))
}
