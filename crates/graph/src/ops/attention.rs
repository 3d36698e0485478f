//! Attention ops: com.microsoft::GroupQueryAttention, RotaryEmbedding (com.microsoft and
//! ONNX opset 23) and com.microsoft::Attention (a BERT's fused self-attention, see
//! [`Attention`]).
//!
//! What is fixed per node is validated here; everything that depends on input shapes (head
//! size, cache lengths, positions) is checked by the executor at run time.
//!
//! Supported subset of GroupQueryAttention (onnxruntime `docs/ContribOperators.md`, checked
//! against onnxruntime 1.32's schema): inputs 0-8 (query or packed QKV, key, value,
//! past_key, past_value, seqlens_k, total_sequence_length, cos_cache, sin_cache); outputs
//! output, present_key, present_value; attributes num_heads, kv_num_heads, scale, softcap,
//! local_window_size, do_rotary, rotary_interleaved, sliding_window_cache (paged only), and
//! attention sinks: input 11 (head_sink, one logit per query head, gpt-oss) or
//! smooth_softmax = 1 (a sink of 0 per head). Rejected at load, naming the node:
//! inputs position_ids, attention_bias, k_scale, v_scale, q_norm_weight,
//! k_norm_weight, query_seqlens; the output_qk output; non-default values of causal (0),
//! qk_output, k_quant_type, v_quant_type and kv_cache_bit_width. The epsilons of the Q/K norms are accepted and unused, since their
//! weight inputs are rejected.

use super::Op;
use crate::{GraphError, NodeCtx, OpSpec};

/// com.microsoft::Attention, the encoder form onnxruntime's transformer optimizer writes:
/// `input · weights + bias` split into Q, K and V (`qkv_sizes`, else three equal thirds),
/// `num_heads` heads, `softmax(q·k * scale + attention_bias + mask) · v`. The mask adds
/// `mask_filter_value` where `mask_index` hides a key (a raw `(batch, total)` or `(batch,
/// seq, total)` 0/1 mask, right-padded lengths `(batch)`, or end and start positions
/// `(2 * batch)`) and, with `unidirectional`, after the query's own position. Inputs `past`
/// and `past_sequence_length`, the `present` output, `do_rotary` and
/// `past_present_share_buffer` (a decoder's cache) are refused at load.
#[derive(Debug, Clone, PartialEq)]
pub struct Attention {
    pub num_heads: usize,
    /// The multiplier of `q · k`; `None`: `1 / sqrt(head_size)`.
    pub scale: Option<f32>,
    pub mask_filter_value: f32,
    pub unidirectional: bool,
    /// Q, K and V widths when they differ (`qkv_hidden_sizes`).
    pub qkv_sizes: Option<[usize; 3]>,
}

/// The self-attention an encoder export spells out: `q`, `k` and `v` (each `(batch, seq,
/// heads · size)`) split into heads, `softmax(q·kᵀ scaled + mask) · v` per head, the heads
/// merged back into `(batch, seq, heads · v size)`. Made by [`crate::passes::heads`] from
/// the graph's own `Reshape`s, `Transpose`s, products, scale, mask `Add` and `Softmax`, and
/// run with the same operations in the same order, so with the same bits. Inputs `q`, `k`,
/// `v`, an optional additive mask that broadcasts to `(batch, heads, seq, seq)`, and optional
/// biases of `q`, `k` and `v` (one value per column, added to each before the heads split).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EncoderAttention {
    pub heads: usize,
    /// How the scores are scaled, as the graph spells it.
    pub scale: ScoreScale,
}

/// A score's scaling: `s / c` or `s · c`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScoreScale {
    Divide(f32),
    Multiply(f32),
}

fn attention(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    ctx.inputs(2, 6)?;
    ctx.outputs(1)?;
    if ctx.has_input(4) {
        return Err(ctx.invalid(
            "input 4 (past) is a decoder's KV cache, which the native Attention does not keep; \
             run this graph with --backend ort",
        ));
    }
    let num_heads = usize::try_from(ctx.int("num_heads", 0)?)
        .ok()
        .filter(|&h| h > 0)
        .ok_or_else(|| ctx.attr_error("num_heads", "must be a positive count"))?;
    let scale = ctx.float_opt("scale")?.filter(|&s| s != 0.0);
    let mask_filter_value = ctx.float("mask_filter_value", -10000.0)?;
    let unidirectional = ctx.bool("unidirectional", false)?;
    for (attr, what) in [
        ("do_rotary", "rotary embeddings inside Attention"),
        (
            "past_present_share_buffer",
            "a shared past and present buffer",
        ),
    ] {
        if ctx.bool(attr, false)? {
            return Err(ctx.attr_error(attr, format!("{what} are not supported natively")));
        }
    }
    ctx.ignore("rotary_embedding_dim");
    let qkv_sizes = match ctx.ints_opt("qkv_hidden_sizes")? {
        None => None,
        Some(v) => {
            let sizes: Option<Vec<usize>> = v
                .iter()
                .map(|&d| {
                    usize::try_from(d)
                        .ok()
                        .filter(|&d| d > 0 && d % num_heads == 0)
                })
                .collect();
            match sizes.as_deref() {
                Some(&[q, k, v]) if q == k => Some([q, k, v]),
                _ => {
                    return Err(ctx.attr_error(
                        "qkv_hidden_sizes",
                        format!(
                            "must be three positive multiples of num_heads ({num_heads}), Q's \
                             equal to K's; got {v:?}"
                        ),
                    ));
                }
            }
        }
    };
    Ok(Op::Attention(Attention {
        num_heads,
        scale,
        mask_filter_value,
        unidirectional,
        qkv_sizes,
    }))
}

/// com.microsoft::GroupQueryAttention attributes.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupQueryAttention {
    pub num_heads: usize,
    pub kv_num_heads: usize,
    /// The multiplier of `q · k`; `None` means `1 / sqrt(head_size)` (the attribute's 0).
    pub scale: Option<f32>,
    /// `softcap * tanh(x / softcap)` on scaled scores when positive; 0 is off.
    pub softcap: f32,
    /// Sliding window: a query at position `p` sees the `w` keys `p + 1 - w ..= p` (as
    /// onnxruntime 1.32 does; 0 sees none and yields zeros). `None` for -1.
    pub local_window_size: Option<usize>,
    pub do_rotary: bool,
    pub rotary_interleaved: bool,
    /// `sliding_window_cache = 1` (Gemma 2/3, gpt-oss as the builder writes them for CPU): the
    /// graph's past and present KV of this layer hold only the window. Natively the paged
    /// cache keeps every position and reads the window, so this is accepted only there.
    pub window_cache: bool,
    /// Attention sinks (see [`HEAD_SINK_INPUT`]): from that input, or 0 per head when only
    /// `smooth_softmax = 1` asks for them.
    pub sinks: bool,
    /// LongRoPE, set by [`crate::passes::longrope`] (no ONNX attribute): a sequence that holds
    /// more than this many positions after a step rotates with the long cos/sin caches at
    /// inputs [`LONG_ROPE_INPUTS`] instead of inputs 7 and 8.
    pub long_rope_after: Option<usize>,
}

/// GroupQueryAttention's `head_sink` input: one logit per query head that joins each row's
/// softmax without a value.
pub const HEAD_SINK_INPUT: usize = 11;

/// Where a LongRoPE `GroupQueryAttention` takes its long cos and sin caches (past every
/// input onnxruntime defines).
pub const LONG_ROPE_INPUTS: [usize; 2] = [17, 18];

/// Which RotaryEmbedding: the input orders and cache shapes differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RotaryKind {
    /// com.microsoft::RotaryEmbedding: (input, position_ids, cos_cache, sin_cache).
    Contrib,
    /// ONNX RotaryEmbedding (opset 23): (X, cos_cache, sin_cache, position_ids?).
    Onnx,
}

/// RotaryEmbedding attributes (both domains).
#[derive(Debug, Clone, PartialEq)]
pub struct Rotary {
    pub kind: RotaryKind,
    pub interleaved: bool,
    /// Rotated leading elements of each head; 0 means the whole head.
    pub rotary_embedding_dim: usize,
    /// Heads of a 3-D input; 0 means unset.
    pub num_heads: usize,
}

fn positive(ctx: &mut NodeCtx, name: &str) -> Result<usize, GraphError> {
    match ctx.int_opt(name)? {
        Some(v) if v > 0 => usize::try_from(v).map_err(|_| ctx.attr_error(name, "is too large")),
        Some(v) => Err(ctx.attr_error(name, format!("must be positive, got {v}"))),
        None => Err(ctx.attr_error(name, "is required")),
    }
}

/// An int attribute that this implementation supports only at `default`.
fn only_default(
    ctx: &mut NodeCtx,
    name: &str,
    allowed: &[i64],
    why: &str,
) -> Result<(), GraphError> {
    match ctx.int_opt(name)? {
        Some(v) if !allowed.contains(&v) => {
            Err(ctx.attr_error(name, format!("value {v} is not supported: {why}")))
        }
        _ => Ok(()),
    }
}

/// GroupQueryAttention's inputs in onnxruntime 1.32; those from index 9 on are not supported,
/// but for head_sink.
const GQA_INPUTS: [&str; 17] = [
    "query",
    "key",
    "value",
    "past_key",
    "past_value",
    "seqlens_k",
    "total_sequence_length",
    "cos_cache",
    "sin_cache",
    "position_ids",
    "attention_bias",
    "head_sink",
    "k_scale",
    "v_scale",
    "q_norm_weight",
    "k_norm_weight",
    "query_seqlens",
];

fn gqa(ctx: &mut NodeCtx) -> Result<Op, GraphError> {
    if let Some(i) = (9..GQA_INPUTS.len()).find(|&i| i != HEAD_SINK_INPUT && ctx.has_input(i)) {
        return Err(ctx.invalid(format!(
            "optional input {i} ({}) is not supported by this implementation; remove it or use the ort backend",
            GQA_INPUTS[i]
        )));
    }
    ctx.inputs(1, HEAD_SINK_INPUT + 1)?;
    ctx.outputs(3)?;
    for (index, name) in [(5, "seqlens_k"), (6, "total_sequence_length")] {
        if !ctx.has_input(index) {
            return Err(ctx.invalid(format!("input {index} ({name}) is required")));
        }
    }
    for (a, b, what) in [
        (1, 2, "key and value"),
        (3, 4, "past_key and past_value"),
        (7, 8, "cos_cache and sin_cache"),
    ] {
        if ctx.has_input(a) != ctx.has_input(b) {
            return Err(ctx.invalid(format!("inputs {what} must be both present or both absent")));
        }
    }
    let num_heads = positive(ctx, "num_heads")?;
    let kv_num_heads = positive(ctx, "kv_num_heads")?;
    if num_heads % kv_num_heads != 0 {
        return Err(ctx.attr_error(
            "num_heads",
            format!("must be a multiple of kv_num_heads ({num_heads} % {kv_num_heads} != 0)"),
        ));
    }
    let scale = ctx.float("scale", 0.0)?;
    if !scale.is_finite() || scale < 0.0 {
        return Err(ctx.attr_error(
            "scale",
            format!("must be finite and non-negative, got {scale}"),
        ));
    }
    let softcap = ctx.float("softcap", 0.0)?;
    if !softcap.is_finite() || softcap < 0.0 {
        return Err(ctx.attr_error(
            "softcap",
            format!("must be finite and non-negative, got {softcap}"),
        ));
    }
    let local_window_size = match ctx.int("local_window_size", -1)? {
        -1 => None,
        w if w >= 0 => Some(
            usize::try_from(w).map_err(|_| ctx.attr_error("local_window_size", "is too large"))?,
        ),
        w => {
            return Err(ctx.attr_error(
                "local_window_size",
                format!("must be -1 (off) or non-negative, got {w}"),
            ));
        }
    };
    let do_rotary = ctx.bool("do_rotary", false)?;
    let rotary_interleaved = ctx.bool("rotary_interleaved", false)?;
    if do_rotary && !ctx.has_input(7) {
        return Err(ctx.invalid("do_rotary is 1 but cos_cache and sin_cache are absent"));
    }
    only_default(ctx, "causal", &[1], "only causal attention is implemented")?;
    let smooth_softmax = match ctx.int("smooth_softmax", -1)? {
        -1 | 0 => false,
        1 => true,
        v => {
            return Err(ctx.attr_error("smooth_softmax", format!("must be -1, 0 or 1, got {v}")));
        }
    };
    only_default(
        ctx,
        "qk_output",
        &[0],
        "the output_qk output is not implemented",
    )?;
    let window_cache = ctx.bool("sliding_window_cache", false)?;
    if window_cache && local_window_size.is_none() {
        return Err(ctx.attr_error(
            "sliding_window_cache",
            "is 1 but local_window_size is -1: a window-sized cache needs a window",
        ));
    }
    only_default(
        ctx,
        "kv_cache_bit_width",
        &[0],
        "quantized KV caches are not implemented",
    )?;
    for name in ["k_quant_type", "v_quant_type"] {
        let v = ctx.string(name, "NONE")?;
        if v != "NONE" {
            return Err(ctx.attr_error(
                name,
                format!("'{v}' is not supported: quantized KV caches are not implemented"),
            ));
        }
    }
    for name in ["qk_norm_epsilon", "q_norm_epsilon", "k_norm_epsilon"] {
        ctx.float_opt(name)?;
    }
    Ok(Op::GroupQueryAttention(GroupQueryAttention {
        num_heads,
        kv_num_heads,
        scale: (scale > 0.0).then_some(scale),
        softcap,
        local_window_size,
        do_rotary,
        rotary_interleaved,
        window_cache,
        sinks: smooth_softmax || ctx.has_input(HEAD_SINK_INPUT),
        long_rope_after: None,
    }))
}

fn rotary(ctx: &mut NodeCtx, kind: RotaryKind) -> Result<Op, GraphError> {
    match kind {
        RotaryKind::Contrib => ctx.inputs(4, 4)?,
        RotaryKind::Onnx => ctx.inputs(3, 4)?,
    }
    ctx.outputs(1)?;
    let interleaved = ctx.bool("interleaved", false)?;
    let mut count = |name: &str| -> Result<usize, GraphError> {
        let v = ctx.int(name, 0)?;
        usize::try_from(v)
            .map_err(|_| ctx.attr_error(name, format!("must be non-negative, got {v}")))
    };
    let rotary_embedding_dim = count("rotary_embedding_dim")?;
    let num_heads = count("num_heads")?;
    if rotary_embedding_dim % 2 != 0 {
        return Err(ctx.attr_error(
            "rotary_embedding_dim",
            format!("must be even, got {rotary_embedding_dim}"),
        ));
    }
    if kind == RotaryKind::Contrib {
        if rotary_embedding_dim > 0 && num_heads == 0 {
            return Err(ctx.attr_error("num_heads", "must be set when rotary_embedding_dim is"));
        }
        if ctx.bool("is_packed_batching", false)? {
            return Err(ctx.attr_error(
                "is_packed_batching",
                "ragged (packed) batches are not supported",
            ));
        }
        // onnxruntime's CPU kernel reads `scale` but only uses it to extend the caches, which
        // it does not implement either; positions past the caches are errors here.
        ctx.float_opt("scale")?;
    }
    Ok(Op::Rotary(Rotary {
        kind,
        interleaved,
        rotary_embedding_dim,
        num_heads,
    }))
}

pub(super) fn specs() -> Vec<OpSpec> {
    vec![
        OpSpec::new("com.microsoft", "GroupQueryAttention", 1, gqa),
        OpSpec::new("com.microsoft", "Attention", 1, attention),
        OpSpec::new("com.microsoft", "RotaryEmbedding", 1, |ctx| {
            rotary(ctx, RotaryKind::Contrib)
        }),
        OpSpec::new("", "RotaryEmbedding", 23, |ctx| {
            rotary(ctx, RotaryKind::Onnx)
        }),
    ]
}
