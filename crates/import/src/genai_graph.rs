//! The decoder graph onnxruntime-genai's model builder writes for Llama-style models
//! (`onnxruntime-genai/src/python/py/models/builder.py`, int4 CPU), built from given weights,
//! plus the package's `genai_config.json`. The GGUF importer and the test fixtures
//! (`oxgen-testkit`) both write their graphs here, so there is one graph shape to support.
//!
//! ```text
//! input_ids -> embedding (GatherBlockQuantized, or Gather over an f32 table)
//! per layer:
//!   SimplifiedLayerNormalization (layer 0) | SkipSimplifiedLayerNormalization (later layers)
//!   -> q / k / v projections -> GroupQueryAttention (rotary inside, rotary_interleaved = 0,
//!      KV in past_key_values.N.* / present.N.*, shared buffers)
//!   -> o projection -> SkipSimplifiedLayerNormalization
//!   -> gate / up projections -> SiLU (Sigmoid, Mul) * up -> down projection
//! SkipSimplifiedLayerNormalization -> head projection -> logits
//! ```
//!
//! A projection is `MatMulNBits` (4 or 8 bits, optional zero points and bias) or, for float
//! weights, `MatMul` (+ `Add`). `seqlens_k` and `total_sequence_length` are computed from
//! `attention_mask` as the builder does. The rotary caches are `cos`/`sin` of
//! `position · θ_i`, `θ_i = base^(-2i / head_size)` (divided by per-dimension factors and a
//! linear scale when given), `[context, head_size / 2]`, for the non-interleaved
//! (`rotate_half`) convention of Hugging Face models.
//!
//! Names are stable (`layers.{l}.q`, `embed.qweight`, `lm_head.scales`, ...) and the output is
//! deterministic: the same weights give the same bytes.

use std::path::Path;

use oxgen_onnx::OnnxError;
use oxgen_onnx::proto::AttributeProto;
use oxgen_onnx::writer::{Dim, ModelBuilder, attr};
use oxgen_tensor::{DType, Tensor};

/// Initializers of at least this many bytes go to `model.onnx.data`.
pub const EXTERNAL_THRESHOLD: usize = 1024;

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
    /// `MatMulNBits` `accuracy_level`: 0 keeps activations f32, 4 allows int8.
    pub accuracy_level: i64,
    /// `GroupQueryAttention` `local_window_size`: each query sees this many keys, itself
    /// included; `None` attends to the whole past.
    pub sliding_window: Option<usize>,
    /// Granite's multipliers (all neutral for the other architectures).
    pub multipliers: crate::arch::Multipliers,
    /// Gemma 2's and 3's softcaps, GELU, windowed layers and their rotary base (see
    /// [`crate::arch::Gemma`]).
    pub gemma: Option<crate::arch::Gemma>,
    /// Per layer: whether it rotates queries and keys (SmolLM3 skips every fourth).
    pub rotary_layers: Vec<bool>,
}

/// Rotary frequencies: `θ_i = base^(-2i / head_size) / factors[i] / linear_scale`.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    pub base: f64,
    /// Per-frequency divisors (llama.cpp's `rope_freqs.weight`), `head_size / 2` of them.
    pub freq_factors: Option<Vec<f32>>,
    /// Linear position scaling (positions divided by it); 1 is none.
    pub linear_scale: f64,
    /// LongRoPE: two pairs of caches, chosen by the sequence's length (see [`LongRopeCaches`]).
    pub long: Option<LongRopeCaches>,
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
            freq_factors: None,
            linear_scale: 1.0,
            long: None,
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
    pub post_norm: Tensor,
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
    /// Gemma 2's RMSNorms of the attention output and of the MLP output, `[hidden]`, each
    /// applied before it joins the residual stream.
    pub out_norms: Option<[Tensor; 2]>,
}

/// All weights of a decoder. A tied head is a `Linear` over the embedding's bytes.
#[derive(Debug, Clone)]
pub struct DecoderWeights {
    pub embedding: Embedding,
    pub layers: Vec<LayerWeights>,
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
        let (h, q, kv, ff) = (
            spec.hidden,
            spec.heads * spec.head_size,
            spec.kv_heads * spec.head_size,
            spec.intermediate,
        );
        if let Embedding::Float(t) = &self.embedding {
            check("embed.weight", t, &[spec.vocab, h])?;
        }
        if self.layers.len() != spec.layers || spec.layers == 0 {
            return Err(ShapeMismatch {
                name: "layers".into(),
                found: vec![self.layers.len()],
                expected: vec![spec.layers.max(1)],
            });
        }
        for (l, w) in self.layers.iter().enumerate() {
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
            check_linear(&format!("{p}.gate"), &w.gate, h, ff)?;
            check_linear(&format!("{p}.up"), &w.up, h, ff)?;
            check_linear(&format!("{p}.down"), &w.down, ff, h)?;
        }
        check("final_norm", &self.final_norm, &[h])?;
        check_linear("lm_head", &self.head, h, spec.vocab)
    }
}

/// `[rows, head_size / 2]` cos and sin caches for rotary base `base`, each frequency divided
/// by `factors[i]` when given, values multiplied by `scale`.
fn rotary_caches(
    spec: &DecoderSpec,
    base: f64,
    rows: usize,
    factors: Option<&[f32]>,
    scale: f64,
) -> (Tensor, Tensor) {
    let (hd, half) = (spec.head_size, spec.head_size / 2);
    let rope = &spec.rope;
    let mut cos = Vec::with_capacity(rows * half);
    let mut sin = Vec::with_capacity(rows * half);
    for p in 0..rows {
        for i in 0..half {
            let mut angle = p as f64 * base.powf(-2.0 * i as f64 / hd as f64);
            if let Some(f) = factors.and_then(|f| f.get(i)) {
                angle /= f64::from(*f);
            }
            if rope.linear_scale != 1.0 {
                angle /= rope.linear_scale;
            }
            cos.push((angle.cos() * scale) as f32);
            sin.push((angle.sin() * scale) as f32);
        }
    }
    let t = |v: Vec<f32>| Tensor::from_slice([rows, half], &v).expect("sizes match");
    (t(cos), t(sin))
}

struct Writer<'a> {
    b: ModelBuilder,
    spec: &'a DecoderSpec,
}

impl Writer<'_> {
    fn node(
        &mut self,
        op: &str,
        domain: &str,
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: Vec<AttributeProto>,
    ) {
        self.b.node(op, domain, name, inputs, outputs, attrs);
    }

    /// Adds the initializers of projection `name`.
    fn linear_initializers(&mut self, name: &str, w: Linear) {
        match w {
            Linear::NBits(w) => {
                self.b
                    .initializer(&format!("{name}.qweight"), w.b)
                    .initializer(&format!("{name}.scales"), w.scales);
                if let Some(z) = w.zero_points {
                    self.b.initializer(&format!("{name}.qzeros"), z);
                }
                if let Some(bias) = w.bias {
                    self.b.initializer(&format!("{name}.bias"), bias);
                }
            }
            Linear::Float { weight, bias } => {
                self.b
                    .initializer(&format!("{name}.weight"), transpose(&weight));
                if let Some(bias) = bias {
                    self.b.initializer(&format!("{name}.bias"), bias);
                }
            }
        }
    }

    /// The node(s) of projection `name`, whose initializers were added with `shape`.
    fn linear_node(&mut self, name: &str, shape: &LinearShape, input: &str, output: &str) {
        let bias = format!("{name}.bias");
        match shape {
            LinearShape::NBits {
                k,
                n,
                bits,
                block_size,
                zero_points,
                bias: has_bias,
            } => {
                let (qw, sc, zp) = (
                    format!("{name}.qweight"),
                    format!("{name}.scales"),
                    format!("{name}.qzeros"),
                );
                // Inputs: A, B, scales, zero_points, g_idx, bias; trailing absent ones omitted.
                let mut inputs = vec![input, qw.as_str(), sc.as_str()];
                if *zero_points || *has_bias {
                    inputs.push(if *zero_points { &zp } else { "" });
                }
                if *has_bias {
                    inputs.extend(["", bias.as_str()]);
                }
                let attrs = vec![
                    attr::int("K", *k as i64),
                    attr::int("N", *n as i64),
                    attr::int("bits", i64::from(*bits)),
                    attr::int("block_size", *block_size as i64),
                    attr::int("accuracy_level", self.spec.accuracy_level),
                ];
                self.node(
                    "MatMulNBits",
                    "com.microsoft",
                    name,
                    &inputs,
                    &[output],
                    attrs,
                );
            }
            LinearShape::Float { bias: has_bias } => {
                let weight = format!("{name}.weight");
                if *has_bias {
                    let product = format!("{name}.matmul");
                    self.node(
                        "MatMul",
                        "",
                        &product,
                        &[input, &weight],
                        &[&product],
                        vec![],
                    );
                    let add = format!("{name}.bias_add");
                    self.node("Add", "", &add, &[&product, &bias], &[output], vec![]);
                } else {
                    self.node("MatMul", "", name, &[input, &weight], &[output], vec![]);
                }
            }
        }
    }

    /// A projection: initializers, then its node.
    fn linear(&mut self, name: &str, w: Linear, input: &str, output: &str) {
        let shape = LinearShape::of(&w);
        self.linear_initializers(name, w);
        self.linear_node(name, &shape, input, output);
    }

    fn norm_weight(&mut self, name: &str, w: Tensor) -> String {
        self.b.initializer(name, w);
        name.to_string()
    }

    /// RMSNorm over each head of `x` (`[batch, seq, heads * head_size]`), as onnxruntime-genai's
    /// builder writes Qwen3's: reshape to `[batch, seq * heads, head_size]`, normalize, reshape
    /// back. Returns the output's name.
    fn head_norm(&mut self, x: &str, w: Tensor, heads: usize) -> String {
        let hd = self.spec.head_size;
        let weight = self.norm_weight(&format!("{x}_norm.weight"), w);
        let (split, back) = (
            format!("{x}_norm.split_shape"),
            format!("{x}_norm.join_shape"),
        );
        let shape = |dims: [i64; 3]| Tensor::from_slice([3], &dims).expect("three dims");
        self.b
            .initializer(&split, shape([0, -1, hd as i64]))
            .initializer(&back, shape([0, -1, (heads * hd) as i64]));
        let (heads_in, normed, out) = (
            format!("{x}_norm.heads"),
            format!("{x}_norm.normed"),
            format!("{x}_norm"),
        );
        self.node("Reshape", "", &heads_in, &[x, &split], &[&heads_in], vec![]);
        self.node(
            "SimplifiedLayerNormalization",
            "",
            &normed,
            &[&heads_in, &weight],
            &[&normed],
            vec![
                attr::float("epsilon", self.spec.rms_eps),
                attr::int("axis", -1),
            ],
        );
        self.node("Reshape", "", &out, &[&normed, &back], &[&out], vec![]);
        out
    }

    /// LongRoPE's `cos_cache` and `sin_cache` as the builder writes them:
    /// `If(total_len > original_context)` with the long caches in the then branch and the short
    /// ones in the else branch, each a `Constant`.
    fn long_rope_caches(&mut self, long: &LongRopeCaches) {
        let spec = self.spec;
        let scale = f64::from(long.attn_factor);
        let branch = |name: &str, rows: usize, factors: &[f32]| {
            let (cos, sin) = rotary_caches(spec, spec.rope.base, rows, Some(factors), scale);
            let mut b = ModelBuilder::new("oxgen-import");
            for (out, t) in [(format!("{name}_cos"), cos), (format!("{name}_sin"), sin)] {
                let dims = [Dim::Fixed(rows), Dim::Fixed(spec.head_size / 2)];
                b.node(
                    "Constant",
                    "",
                    &out,
                    &[],
                    &[&out],
                    vec![attr::tensor("value", &t)],
                );
                b.output(&out, DType::F32, &dims);
            }
            b.subgraph(name)
        };
        let then_branch = branch("long_rope", spec.context, &long.long_factors);
        let else_branch = branch("short_rope", long.original_context, &long.short_factors);
        self.b.initializer(
            "original_context",
            Tensor::scalar(long.original_context as i64),
        );
        self.node(
            "Greater",
            "",
            "beyond_original_context",
            &["total_len_i64", "original_context"],
            &["beyond_original_context"],
            vec![],
        );
        self.node(
            "If",
            "",
            "rope_caches",
            &["beyond_original_context"],
            &["cos_cache", "sin_cache"],
            vec![
                attr::graph("then_branch", then_branch),
                attr::graph("else_branch", else_branch),
            ],
        );
    }

    /// `SimplifiedLayerNormalization(x)` with weight `w` as `name`; returns the output's name.
    fn rms_norm(&mut self, name: &str, x: &str, w: Tensor) -> String {
        let weight = self.norm_weight(&format!("{name}.weight"), w);
        self.node(
            "SimplifiedLayerNormalization",
            "",
            name,
            &[x, &weight],
            &[name],
            vec![attr::float("epsilon", self.spec.rms_eps)],
        );
        name.to_string()
    }

    /// `x · scalar` (an f32 scalar initializer); returns the output's name.
    fn scaled(&mut self, x: &str, scalar: &str) -> String {
        let out = format!("{x}_scaled");
        self.node("Mul", "", &out, &[x, scalar], &[&out], vec![]);
        out
    }

    /// `SkipSimplifiedLayerNormalization(input, skip)` -> (normed, residual sum).
    fn skip_norm(&mut self, name: &str, w: Tensor, io: [&str; 4]) {
        let [input, skip, out, residual] = io;
        let w = self.norm_weight(&format!("{name}.weight"), w);
        self.node(
            "SkipSimplifiedLayerNormalization",
            "com.microsoft",
            name,
            &[input, skip, &w],
            &[out, "", "", residual],
            vec![attr::float("epsilon", self.spec.rms_eps)],
        );
    }
}

/// What a projection's node needs once its tensors are moved into the builder.
enum LinearShape {
    NBits {
        k: usize,
        n: usize,
        bits: u32,
        block_size: usize,
        zero_points: bool,
        bias: bool,
    },
    Float {
        bias: bool,
    },
}

impl LinearShape {
    fn of(w: &Linear) -> LinearShape {
        match w {
            Linear::NBits(w) => LinearShape::NBits {
                k: w.k,
                n: w.n,
                bits: w.bits,
                block_size: w.block_size,
                zero_points: w.zero_points.is_some(),
                bias: w.bias.is_some(),
            },
            Linear::Float { bias, .. } => LinearShape::Float {
                bias: bias.is_some(),
            },
        }
    }
}

/// `[n, k]` f32 -> `[k, n]`.
fn transpose(w: &Tensor) -> Tensor {
    let (n, k) = (w.dims()[0], w.dims()[1]);
    let src = w.as_slice::<f32>().expect("checked to be f32");
    let mut out = vec![0f32; n * k];
    for (r, row) in src.chunks_exact(k).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            out[c * n + r] = v;
        }
    }
    Tensor::from_slice([k, n], &out).expect("sizes match")
}

/// Writes `model.onnx` (+ `model.onnx.data`) for `spec` and `weights` into `dir`.
pub fn write_model(
    dir: &Path,
    producer: &str,
    spec: &DecoderSpec,
    weights: DecoderWeights,
) -> Result<(), WriteError> {
    weights.check(spec)?;
    build(producer, spec, weights)
        .save(&dir.join("model.onnx"), Some(EXTERNAL_THRESHOLD))
        .map_err(|e| WriteError::Save(Box::new(e)))
}

/// Why [`write_model`] failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Shape(#[from] ShapeMismatch),
    #[error("saving the model: {0}")]
    Save(Box<OnnxError>),
}

/// The model, built in memory (weights already checked).
pub fn build(producer: &str, spec: &DecoderSpec, weights: DecoderWeights) -> ModelBuilder {
    let (hd, vocab) = (spec.head_size, spec.vocab);
    let mut g = Writer {
        b: ModelBuilder::new(producer),
        spec,
    };
    g.b.opset("", 21).opset("com.microsoft", 1);
    let batch = Dim::Symbolic("batch_size".into());
    g.b.input(
        "input_ids",
        DType::I64,
        &[batch.clone(), "sequence_length".into()],
    );
    g.b.input(
        "attention_mask",
        DType::I64,
        &[batch.clone(), "total_sequence_length".into()],
    );
    let kv_dims = |len: &str| {
        [
            batch.clone(),
            Dim::Fixed(spec.kv_heads),
            len.into(),
            Dim::Fixed(hd),
        ]
    };
    for l in 0..spec.layers {
        for kind in ["key", "value"] {
            let dims = kv_dims("past_sequence_length");
            g.b.input(&format!("past_key_values.{l}.{kind}"), DType::F32, &dims);
        }
    }
    g.b.output(
        "logits",
        DType::F32,
        &[batch.clone(), "sequence_length".into(), Dim::Fixed(vocab)],
    );
    for l in 0..spec.layers {
        for kind in ["key", "value"] {
            let dims = kv_dims("total_sequence_length");
            g.b.output(&format!("present.{l}.{kind}"), DType::F32, &dims);
        }
    }

    // seqlens_k = sum(attention_mask, 1) - 1 (int32); total_sequence_length = shape(mask)[1].
    g.b.initializer("one_i64", Tensor::scalar(1i64))
        .initializer(
            "axes_1",
            Tensor::from_slice([1], &[1i64]).expect("one axis"),
        );
    g.node(
        "ReduceSum",
        "",
        "mask_sum",
        &["attention_mask", "axes_1"],
        &["mask_sum"],
        vec![attr::int("keepdims", 0)],
    );
    g.node(
        "Sub",
        "",
        "mask_sum_minus_1",
        &["mask_sum", "one_i64"],
        &["seqlens_k_i64"],
        vec![],
    );
    let to_i32 = || vec![attr::int("to", 6)];
    g.node(
        "Cast",
        "",
        "seqlens_k",
        &["seqlens_k_i64"],
        &["seqlens_k"],
        to_i32(),
    );
    g.node(
        "Shape",
        "",
        "mask_shape",
        &["attention_mask"],
        &["mask_shape"],
        vec![],
    );
    g.node(
        "Gather",
        "",
        "total_len_i64",
        &["mask_shape", "one_i64"],
        &["total_len_i64"],
        vec![attr::int("axis", 0)],
    );
    g.node(
        "Cast",
        "",
        "total_len",
        &["total_len_i64"],
        &["total_len"],
        to_i32(),
    );

    match &spec.rope.long {
        None => {
            let factors = spec.rope.freq_factors.as_deref();
            let (cos, sin) = rotary_caches(spec, spec.rope.base, spec.context, factors, 1.0);
            g.b.initializer("cos_cache", cos)
                .initializer("sin_cache", sin);
            if let Some(base) = spec.gemma.as_ref().and_then(|g| g.local_rope_base) {
                let (cos, sin) = rotary_caches(spec, base, spec.context, factors, 1.0);
                g.b.initializer("cos_cache_local", cos)
                    .initializer("sin_cache_local", sin);
            }
        }
        Some(long) => g.long_rope_caches(long),
    }

    let DecoderWeights {
        embedding,
        layers,
        final_norm,
        head,
    } = weights;
    // The head's tensors sit next to the embedding's (a tied pair shares its source bytes).
    let head_shape = LinearShape::of(&head);
    match embedding {
        Embedding::BlockQuantized {
            data,
            scales,
            bits,
            block_size,
        } => {
            g.b.initializer("embed.qweight", data)
                .initializer("embed.scales", scales);
            g.linear_initializers("lm_head", head);
            let gbq = vec![
                attr::int("bits", i64::from(bits)),
                attr::int("block_size", block_size as i64),
                attr::int("gather_axis", 0),
                attr::int("quantize_axis", 1),
            ];
            g.node(
                "GatherBlockQuantized",
                "com.microsoft",
                "embed",
                &["embed.qweight", "input_ids", "embed.scales"],
                &["embeddings"],
                gbq,
            );
        }
        Embedding::Float(table) => {
            g.b.initializer("embed.weight", table);
            g.linear_initializers("lm_head", head);
            g.node(
                "Gather",
                "",
                "embed",
                &["embed.weight", "input_ids"],
                &["embeddings"],
                vec![attr::int("axis", 0)],
            );
        }
    }

    // Granite's multipliers, as scalar initializers where they are not 1.
    let mult = spec.multipliers;
    for (name, value) in [
        ("embedding_scale", mult.embedding),
        ("residual_scale", mult.residual),
        ("logit_scale", mult.logit),
    ] {
        if value != 1.0 {
            g.b.initializer(name, Tensor::scalar(value));
        }
    }
    let mut residual = "embeddings".to_string();
    if mult.embedding != 1.0 {
        residual = g.scaled("embeddings", "embedding_scale");
    }
    let mut pending: Option<String> = None;
    for (l, w) in layers.into_iter().enumerate() {
        let p = format!("layers.{l}");
        let normed = format!("{p}.input_norm");
        match pending.take() {
            None => {
                let nw = g.norm_weight(&format!("{p}.input_norm.weight"), w.input_norm);
                g.node(
                    "SimplifiedLayerNormalization",
                    "",
                    &normed,
                    &[&residual, &nw],
                    &[&normed],
                    vec![attr::float("epsilon", spec.rms_eps)],
                );
            }
            Some(mlp_out) => {
                let sum = format!("{p}.input_residual");
                g.skip_norm(&normed, w.input_norm, [&mlp_out, &residual, &normed, &sum]);
                residual = sum;
            }
        }
        let (mut q, mut k, v) = (format!("{p}.q"), format!("{p}.k"), format!("{p}.v"));
        g.linear(&q, w.q, &normed, &q);
        g.linear(&k, w.k, &normed, &k);
        g.linear(&v, w.v, &normed, &v);
        if let Some([qn, kn]) = w.qk_norm {
            q = g.head_norm(&q, qn, spec.heads);
            k = g.head_norm(&k, kn, spec.kv_heads);
        }
        let attn = format!("{p}.attn");
        let (pk, pv) = (
            format!("past_key_values.{l}.key"),
            format!("past_key_values.{l}.value"),
        );
        let (ok, ov) = (format!("present.{l}.key"), format!("present.{l}.value"));
        // A Gemma windows some layers only, and Gemma 3 rotates those with caches of their own.
        let windowed = spec.gemma.as_ref().is_none_or(|g| g.windowed[l]);
        let window = spec
            .sliding_window
            .filter(|_| windowed)
            .map_or(-1, |w| w as i64);
        let local_rope =
            windowed && (spec.gemma.as_ref()).is_some_and(|g| g.local_rope_base.is_some());
        let (cos, sin) = if local_rope {
            ("cos_cache_local", "sin_cache_local")
        } else {
            ("cos_cache", "sin_cache")
        };
        let mut gqa = vec![
            attr::int("num_heads", spec.heads as i64),
            attr::int("kv_num_heads", spec.kv_heads as i64),
            attr::int("rotary_interleaved", 0),
            attr::int("local_window_size", window),
        ];
        let rotates = spec.rotary_layers.get(l).copied().unwrap_or(true);
        gqa.push(attr::int("do_rotary", i64::from(rotates)));
        // Without rotary the cos and sin inputs are left off.
        let inputs = if rotates { 9 } else { 7 };
        if let Some(scale) = mult.attention {
            gqa.push(attr::float("scale", scale));
        }
        if let Some(cap) = spec.gemma.as_ref().and_then(|g| g.attn_softcap) {
            gqa.push(attr::float("softcap", cap));
        }
        let [attn_out_norm, mlp_out_norm] = match w.out_norms {
            Some([a, m]) => [Some(a), Some(m)],
            None => [None, None],
        };
        g.node(
            "GroupQueryAttention",
            "com.microsoft",
            &attn,
            &[&q, &k, &v, &pk, &pv, "seqlens_k", "total_len", cos, sin][..inputs],
            &[&attn, &ok, &ov],
            gqa,
        );
        let mut o = format!("{p}.o");
        g.linear(&o, w.o, &attn, &o);
        if mult.residual != 1.0 {
            o = g.scaled(&o, "residual_scale");
        }
        if let Some(norm) = attn_out_norm {
            o = g.rms_norm(&format!("{p}.attn_out_norm"), &o, norm);
        }
        let (post, sum) = (format!("{p}.post_norm"), format!("{p}.post_residual"));
        g.skip_norm(&post, w.post_norm, [&o, &residual, &post, &sum]);
        residual = sum;
        let (gate, up, down) = (format!("{p}.gate"), format!("{p}.up"), format!("{p}.down"));
        g.linear(&gate, w.gate, &post, &gate);
        g.linear(&up, w.up, &post, &up);
        let (sig, act, prod) = (
            format!("{p}.gate_sigmoid"),
            format!("{p}.silu"),
            format!("{p}.gated"),
        );
        if spec.gemma.is_some() {
            let tanh = vec![attr::string("approximate", "tanh")];
            g.node("Gelu", "", &act, &[&gate], &[&act], tanh);
        } else {
            g.node("Sigmoid", "", &sig, &[&gate], &[&sig], vec![]);
            g.node("Mul", "", &act, &[&gate, &sig], &[&act], vec![]);
        }
        g.node("Mul", "", &prod, &[&act, &up], &[&prod], vec![]);
        g.linear(&down, w.down, &prod, &down);
        let mut mlp_out = if mult.residual != 1.0 {
            g.scaled(&down, "residual_scale")
        } else {
            down
        };
        if let Some(norm) = mlp_out_norm {
            mlp_out = g.rms_norm(&format!("{p}.mlp_out_norm"), &mlp_out, norm);
        }
        pending = Some(mlp_out);
    }
    let last = pending.expect("DecoderWeights::check requires at least one layer");
    g.skip_norm(
        "final_norm",
        final_norm,
        [&last, &residual, "final_norm", "final_residual"],
    );
    let softcap = spec.gemma.as_ref().and_then(|g| g.final_softcap);
    if mult.logit != 1.0 {
        g.linear_node("lm_head", &head_shape, "final_norm", "logits_unscaled");
        g.node(
            "Div",
            "",
            "logits",
            &["logits_unscaled", "logit_scale"],
            &["logits"],
            vec![],
        );
    } else if let Some(cap) = softcap {
        // `cap · tanh(logits / cap)`.
        g.linear_node("lm_head", &head_shape, "final_norm", "logits_uncapped");
        g.b.initializer("final_softcap", Tensor::scalar(cap));
        g.node(
            "Div",
            "",
            "logits_over_cap",
            &["logits_uncapped", "final_softcap"],
            &["logits_over_cap"],
            vec![],
        );
        g.node(
            "Tanh",
            "",
            "logits_tanh",
            &["logits_over_cap"],
            &["logits_tanh"],
            vec![],
        );
        g.node(
            "Mul",
            "",
            "logits",
            &["logits_tanh", "final_softcap"],
            &["logits"],
            vec![],
        );
    } else {
        g.linear_node("lm_head", &head_shape, "final_norm", "logits");
    }
    g.b
}

/// `genai_config.json` for a package written by [`write_model`]; `model_type` is
/// onnxruntime-genai's model type (`llama`, `mistral`, `qwen2`).
pub fn genai_config(spec: &DecoderSpec, model_type: &str, tokens: &ConfigTokens) -> String {
    // Keys in a fixed order whether or not serde_json preserves insertion order.
    let mut model = serde_json::Map::new();
    if let Some(bos) = tokens.bos {
        model.insert("bos_token_id".into(), bos.into());
    }
    model.insert("context_length".into(), spec.context.into());
    model.insert("eos_token_id".into(), tokens.eos.clone().into());
    if let Some(pad) = tokens.pad {
        model.insert("pad_token_id".into(), pad.into());
    }
    model.insert("type".into(), model_type.into());
    model.insert("vocab_size".into(), spec.vocab.into());
    model.insert(
        "decoder".into(),
        serde_json::json!({
            "filename": "model.onnx",
            "head_size": spec.head_size,
            "hidden_size": spec.hidden,
            "num_attention_heads": spec.heads,
            "num_hidden_layers": spec.layers,
            "num_key_value_heads": spec.kv_heads,
            "inputs": {
                "input_ids": "input_ids",
                "attention_mask": "attention_mask",
                "past_key_names": "past_key_values.%d.key",
                "past_value_names": "past_key_values.%d.value"
            },
            "outputs": {
                "logits": "logits",
                "present_key_names": "present.%d.key",
                "present_value_names": "present.%d.value"
            },
            "session_options": { "log_id": "onnxruntime-genai", "provider_options": [] }
        }),
    );
    serde_json::to_string_pretty(&serde_json::json!({
        "model": model,
        "search": {
            "do_sample": false,
            "max_length": spec.context,
            "past_present_share_buffer": true,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
            "repetition_penalty": 1.0
        }
    }))
    .expect("a JSON value serializes")
}
