//! What [`super::build`] writes a graph from: the architecture numbers ([`DecoderSpec`]),
//! the rotary settings and the weights, with the checks that they agree.

use oxgen_tensor::{DType, Tensor};

/// The architecture numbers of a decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderSpec {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_size: usize,
    pub intermediate: usize,
    pub vocab: usize,
    /// Positions the rotary caches cover (the model's context length).
    pub context: usize,
    pub rope: Rope,
    /// RMS norm epsilon.
    pub rms_eps: f32,
    /// `MatMulNBits` (and MXFP4 `QMoE`) `accuracy_level`: 0 keeps activations f32, 4 allows
    /// int8.
    pub accuracy_level: i64,
    /// `GroupQueryAttention` `local_window_size`: each query sees this many keys, itself
    /// included; `None` attends to the whole past.
    pub sliding_window: Option<usize>,
    /// Granite's multipliers (all neutral for the other architectures).
    pub multipliers: crate::arch::Multipliers,
    /// Per layer: whether it is windowed (Gemma's and gpt-oss's alternation); `None` windows
    /// every layer when there is a window.
    pub windowed_layers: Option<Vec<bool>>,
    /// Gemma 2's and 3's softcaps, GELU and windowed layers' rotary base (see
    /// [`crate::arch::Gemma`]).
    pub gemma: Option<crate::arch::Gemma>,
    /// Per layer: whether it rotates queries and keys (SmolLM3 skips every fourth).
    pub rotary_layers: Vec<bool>,
    /// A mixture of experts in every layer's MLP ([`Mlp::Experts`]).
    pub experts: Option<crate::arch::ExpertParams>,
    /// The activations', KV cache's, logits' and float weights' type: `F32`, or `F16` as
    /// onnxruntime-genai's fp16 packages (weights are given in f32 and rounded when written).
    pub io: DType,
}

/// Rotary frequencies: `θ_i = base^(-2i / dim) / factors[i] / linear_scale`, over the first
/// `dim` dimensions of each head.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    pub base: f64,
    /// Dimensions of each head that rotate (`None`: all of them); the caches are `dim / 2`
    /// wide, which tells `GroupQueryAttention` how much to rotate.
    pub dim: Option<usize>,
    /// Per-frequency divisors (llama.cpp's `rope_freqs.weight`), `head_size / 2` of them.
    pub freq_factors: Option<Vec<f32>>,
    /// Linear position scaling (positions divided by it); 1 is none.
    pub linear_scale: f64,
    /// LongRoPE: two pairs of caches, chosen by the sequence's length (see [`LongRopeCaches`]).
    pub long: Option<LongRopeCaches>,
    /// YaRN: frequencies blended by [`crate::arch::Yarn`], caches scaled.
    pub yarn: Option<crate::arch::Yarn>,
    /// Rotate interleaved pairs `(2i, 2i + 1)` (`rotary_interleaved = 1`) instead of halves.
    pub interleaved: bool,
}

/// LongRoPE's caches as onnxruntime-genai's builder writes them: `If` the mask's length
/// exceeds `original_context`, caches of `context` rows made with `long_factors`, else of
/// `original_context` rows with `short_factors` (divisors of each frequency, as
/// `freq_factors`); both scaled by `attn_factor`.
#[derive(Debug, Clone, PartialEq)]
pub struct LongRopeCaches {
    pub original_context: usize,
    pub short_factors: Vec<f32>,
    pub long_factors: Vec<f32>,
    pub attn_factor: f32,
}

impl Rope {
    pub fn new(base: f64) -> Rope {
        Rope {
            base,
            dim: None,
            freq_factors: None,
            linear_scale: 1.0,
            long: None,
            yarn: None,
            interleaved: false,
        }
    }
}

/// A projection `y = x · Wᵀ (+ bias)` with `W` of shape `[n, k]`.
// A model has a few hundred of these, each owning megabytes: the variant size is irrelevant.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Linear {
    NBits(NBitsLinear),
    /// f32 weight `[n, k]` (written transposed, `[k, n]`, for `MatMul`) and f32 bias `[n]`.
    Float {
        weight: Tensor,
        bias: Option<Tensor>,
    },
}

/// A `com.microsoft::MatMulNBits` weight (see the operator's docs for the layouts).
#[derive(Debug, Clone)]
pub struct NBitsLinear {
    pub k: usize,
    pub n: usize,
    pub bits: u32,
    pub block_size: usize,
    /// uint8 `[n, k / block_size, block_size * bits / 8]`.
    pub b: Tensor,
    /// f32 `[n * k / block_size]`.
    pub scales: Tensor,
    /// `None` (the default `2^(bits - 1)`), uint8 packed, or f32 `[n * k / block_size]`.
    pub zero_points: Option<Tensor>,
    /// f32 `[n]`.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// `(k, n)`.
    pub fn dims(&self) -> (usize, usize) {
        match self {
            Linear::NBits(w) => (w.k, w.n),
            Linear::Float { weight, .. } => {
                let d = weight.dims();
                (
                    d.get(1).copied().unwrap_or(0),
                    d.first().copied().unwrap_or(0),
                )
            }
        }
    }
}

/// The token embedding table.
#[derive(Debug, Clone)]
pub enum Embedding {
    /// `com.microsoft::GatherBlockQuantized` with default zero points: uint8 data
    /// `[vocab, hidden * bits / 8]`, f32 scales `[vocab, hidden / block_size]`.
    BlockQuantized {
        data: Tensor,
        scales: Tensor,
        bits: u32,
        block_size: usize,
    },
    /// A plain `Gather` over an f32 `[vocab, hidden]` table.
    Float(Tensor),
    /// `GatherBlockQuantized` over the tied head's own `MatMulNBits` blocks, stored once as
    /// the builder stores them: the head's codes `[vocab, blocks, block_size · bits / 8]` read
    /// as `[vocab, hidden · bits / 8]` through a `Reshape`, and its scales `[vocab, blocks]`.
    HeadBlocks,
}

/// One decoder layer's weights; norms are f32 `[hidden]`.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub input_norm: Tensor,
    /// RMSNorm weights `[head_size]` over each Q and K head (Qwen3), applied before rotary.
    pub qk_norm: Option<[Tensor; 2]>,
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    /// Attention sinks, one logit per query head (gpt-oss; `GroupQueryAttention`'s
    /// `head_sink`).
    pub sinks: Option<Tensor>,
    pub post_norm: Tensor,
    pub mlp: Mlp,
    /// Gemma 2's RMSNorms of the attention output and of the MLP output, `[hidden]`, each
    /// applied before it joins the residual stream.
    pub out_norms: Option<[Tensor; 2]>,
}

/// A layer's MLP.
// One per layer, each owning megabytes: the variant size is irrelevant.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Mlp {
    /// `down(act(gate(x)) · up(x))`.
    Dense {
        gate: Linear,
        up: Linear,
        down: Linear,
    },
    /// gpt-oss's mixture: a router (`hidden -> experts` logits), then `com.microsoft::QMoE`
    /// over MXFP4 experts, each `down(swiglu(gate_up(x)))` with SwiGLU's (gate, up) pairs
    /// interleaved in the first projection.
    Experts(ExpertWeights),
}

/// A mixture's weights (see [`Mlp::Experts`]).
#[derive(Debug, Clone)]
pub struct ExpertWeights {
    pub router: Linear,
    /// `experts x (2 · intermediate) x hidden`, (gate, up) rows interleaved.
    pub gate_up: Mxfp4Experts,
    /// `experts x hidden x intermediate`.
    pub down: Mxfp4Experts,
}

/// One projection of every expert in QMoE's MXFP4 layout (`oxgen_gguf::repack::QMoeMxfp4`):
/// uint8 codes `[experts, k, n / 2]`, float8e8m0 scales `[experts, n, k / 32]`, f32 bias
/// `[experts, n]`.
#[derive(Debug, Clone)]
pub struct Mxfp4Experts {
    pub codes: Tensor,
    pub scales: Tensor,
    pub bias: Tensor,
}

/// All weights of a decoder. A tied head is a `Linear` over the embedding's bytes.
#[derive(Debug, Clone)]
pub struct DecoderWeights {
    pub embedding: Embedding,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Tensor,
    pub head: Linear,
}

/// The weights of a decoder outside its layers (which [`super::write_model_streamed`] takes
/// one at a time).
#[derive(Debug, Clone)]
pub struct EndWeights {
    pub embedding: Embedding,
    pub final_norm: Tensor,
    pub head: Linear,
}

/// Token ids for `genai_config.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigTokens {
    pub bos: Option<u32>,
    pub eos: Vec<u32>,
    pub pad: Option<u32>,
}

/// A weight whose shape does not fit the spec: the caller's bug or a bad input file.
#[derive(Debug, thiserror::Error)]
#[error("weight '{name}' has shape {found:?}, the graph needs {expected:?}")]
pub struct ShapeMismatch {
    pub name: String,
    pub found: Vec<usize>,
    pub expected: Vec<usize>,
}

fn check(name: &str, t: &Tensor, expected: &[usize]) -> Result<(), ShapeMismatch> {
    if t.dims() == expected && t.dtype() == DType::F32 {
        return Ok(());
    }
    Err(ShapeMismatch {
        name: format!("{name} ({})", t.dtype().name()),
        found: t.dims().to_vec(),
        expected: expected.to_vec(),
    })
}

fn check_experts(
    name: &str,
    x: &Mxfp4Experts,
    experts: usize,
    n: usize,
    k: usize,
) -> Result<(), ShapeMismatch> {
    for (what, t, dtype, dims) in [
        ("codes", &x.codes, DType::U8, vec![experts, k, n / 2]),
        ("scales", &x.scales, DType::F8E8M0, vec![experts, n, k / 32]),
        ("bias", &x.bias, DType::F32, vec![experts, n]),
    ] {
        if t.dtype() != dtype || t.dims() != dims {
            return Err(ShapeMismatch {
                name: format!("{name}.{what} ({})", t.dtype().name()),
                found: t.dims().to_vec(),
                expected: dims,
            });
        }
    }
    Ok(())
}

fn check_linear(name: &str, w: &Linear, k: usize, n: usize) -> Result<(), ShapeMismatch> {
    let (wk, wn) = w.dims();
    if (wk, wn) != (k, n) {
        return Err(ShapeMismatch {
            name: name.to_string(),
            found: vec![wn, wk],
            expected: vec![n, k],
        });
    }
    let bias = match w {
        Linear::NBits(w) => w.bias.as_ref(),
        Linear::Float { weight, bias } => {
            check(name, weight, &[n, k])?;
            bias.as_ref()
        }
    };
    match bias {
        Some(b) => check(&format!("{name}.bias"), b, &[n]),
        None => Ok(()),
    }
}

impl DecoderWeights {
    /// Checks every weight's shape against `spec` (the layouts inside `MatMulNBits` weights
    /// are the producer's contract; their `k` and `n` are checked here).
    pub fn check(&self, spec: &DecoderSpec) -> Result<(), ShapeMismatch> {
        if self.layers.len() != spec.layers || spec.layers == 0 {
            return Err(ShapeMismatch {
                name: "layers".into(),
                found: vec![self.layers.len()],
                expected: vec![spec.layers.max(1)],
            });
        }
        for (l, w) in self.layers.iter().enumerate() {
            w.check(spec, l)?;
        }
        check_ends(spec, &self.embedding, &self.final_norm, &self.head)
    }
}

impl EndWeights {
    /// Checks the embedding, final norm and head against `spec`.
    pub fn check(&self, spec: &DecoderSpec) -> Result<(), ShapeMismatch> {
        check_ends(spec, &self.embedding, &self.final_norm, &self.head)
    }
}

fn check_ends(
    spec: &DecoderSpec,
    embedding: &Embedding,
    final_norm: &Tensor,
    head: &Linear,
) -> Result<(), ShapeMismatch> {
    match (embedding, head) {
        (Embedding::Float(t), _) => check("embed.weight", t, &[spec.vocab, spec.hidden])?,
        (Embedding::HeadBlocks, Linear::NBits(w)) => {
            let blocks = spec.hidden / w.block_size.max(1);
            if blocks * w.block_size != spec.hidden || w.scales.dims() != [spec.vocab, blocks] {
                return Err(ShapeMismatch {
                    name: "lm_head.scales (the embedding gathers from them)".into(),
                    found: w.scales.dims().to_vec(),
                    expected: vec![spec.vocab, blocks],
                });
            }
        }
        (Embedding::HeadBlocks, Linear::Float { weight, .. }) => {
            return Err(ShapeMismatch {
                name: "lm_head (an f32 head has no blocks to gather from)".into(),
                found: weight.dims().to_vec(),
                expected: vec![],
            });
        }
        (Embedding::BlockQuantized { .. }, _) => {}
    }
    check("final_norm", final_norm, &[spec.hidden])?;
    check_linear("lm_head", head, spec.hidden, spec.vocab)
}

impl LayerWeights {
    /// Checks layer `l`'s weights against `spec`.
    pub fn check(&self, spec: &DecoderSpec, l: usize) -> Result<(), ShapeMismatch> {
        let (h, q, kv, ff) = (
            spec.hidden,
            spec.heads * spec.head_size,
            spec.kv_heads * spec.head_size,
            spec.intermediate,
        );
        let w = self;
        let p = format!("layers.{l}");
        check(&format!("{p}.input_norm"), &w.input_norm, &[h])?;
        if let Some([qn, kn]) = &w.qk_norm {
            check(&format!("{p}.q_norm"), qn, &[spec.head_size])?;
            check(&format!("{p}.k_norm"), kn, &[spec.head_size])?;
        }
        if let Some([an, mn]) = &w.out_norms {
            check(&format!("{p}.attn_out_norm"), an, &[h])?;
            check(&format!("{p}.mlp_out_norm"), mn, &[h])?;
        }
        check_linear(&format!("{p}.q"), &w.q, h, q)?;
        check_linear(&format!("{p}.k"), &w.k, h, kv)?;
        check_linear(&format!("{p}.v"), &w.v, h, kv)?;
        check_linear(&format!("{p}.o"), &w.o, q, h)?;
        check(&format!("{p}.post_norm"), &w.post_norm, &[h])?;
        if let Some(t) = &w.sinks {
            check(&format!("{p}.sinks"), t, &[spec.heads])?;
        }
        match (&w.mlp, spec.experts) {
            (Mlp::Dense { gate, up, down }, None) => {
                check_linear(&format!("{p}.gate"), gate, h, ff)?;
                check_linear(&format!("{p}.up"), up, h, ff)?;
                check_linear(&format!("{p}.down"), down, ff, h)
            }
            (Mlp::Experts(x), Some(e)) => {
                check_linear(&format!("{p}.router"), &x.router, h, e.count)?;
                check_experts(&format!("{p}.gate_up"), &x.gate_up, e.count, 2 * ff, h)?;
                check_experts(&format!("{p}.down"), &x.down, e.count, h, ff)
            }
            (_, experts) => Err(ShapeMismatch {
                name: format!("{p}.mlp"),
                found: vec![usize::from(matches!(w.mlp, Mlp::Experts(_)))],
                expected: vec![usize::from(experts.is_some())],
            }),
        }
    }
}
