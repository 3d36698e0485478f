//! The decoder graph onnxruntime-genai's model builder writes for Llama-style models
//! (`onnxruntime-genai/src/python/py/models/builder.py`, int4 CPU), built from given weights,
//! plus the package's `genai_config.json`. The GGUF importer and the test fixtures
//! (`oxgen-testkit`) both write their graphs here, so there is one graph shape to support.
//!
//! ```text
//! input_ids -> embedding (GatherBlockQuantized, or Gather over an f32 table) [· scale]
//! per layer:
//!   SimplifiedLayerNormalization (layer 0) | SkipSimplifiedLayerNormalization (later layers)
//!   -> q / k / v projections [-> RMSNorm per Q and K head]
//!   -> GroupQueryAttention (rotary inside unless the layer has none, halves rotated unless
//!      the spec interleaves (ERNIE 4.5),
//!      window and softcap when set, KV in past_key_values.N.* / present.N.*, shared buffers)
//!   -> o projection [· residual scale] [-> RMSNorm] -> SkipSimplifiedLayerNormalization
//!   -> gate / up projections -> SiLU (Sigmoid, Mul) or GELU (tanh) * up -> down projection
//!      [· residual scale] [-> RMSNorm]
//! SkipSimplifiedLayerNormalization -> head projection -> logits [/ scale | softcap]
//! ```
//!
//! The bracketed steps are the families' additions ([`DecoderSpec`], [`LayerWeights`]): Qwen3's
//! and Gemma 3's Q/K norms, Granite's multipliers, Gemma's norms after attention and MLP, GELU
//! and softcaps, SmolLM3's layers without rotary. A projection is `MatMulNBits` (4 or 8 bits,
//! optional zero points and bias) or, for float weights, `MatMul` (+ `Add`). `seqlens_k` and
//! `total_sequence_length` are computed from `attention_mask` as the builder does. The rotary
//! caches are written by `rope.rs`.
//!
//! Names are stable (`layers.{l}.q`, `embed.qweight`, `lm_head.scales`, ...) and the output is
//! deterministic: the same weights give the same bytes.

mod rope;
mod spec;

use std::path::Path;

use oxgen_onnx::OnnxError;
use oxgen_onnx::proto::AttributeProto;
use oxgen_onnx::writer::{Dim, ModelBuilder, attr};
use oxgen_tensor::{DType, Tensor};

pub use spec::{
    ConfigTokens, DecoderSpec, DecoderWeights, Embedding, EndWeights, ExpertWeights, LayerWeights,
    Linear, LongRopeCaches, Mlp, Mxfp4Experts, NBitsLinear, Rope, ShapeMismatch,
};

/// Initializers of at least this many bytes go to `model.onnx.data`.
pub const EXTERNAL_THRESHOLD: usize = 1024;

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
                self.init(&format!("{name}.qweight"), w.b);
                self.init(&format!("{name}.scales"), w.scales);
                if let Some(z) = w.zero_points {
                    self.init(&format!("{name}.qzeros"), z);
                }
                if let Some(bias) = w.bias {
                    self.init(&format!("{name}.bias"), bias);
                }
            }
            Linear::Float { weight, bias } => {
                self.init(&format!("{name}.weight"), transpose(&weight));
                if let Some(bias) = bias {
                    self.init(&format!("{name}.bias"), bias);
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

    /// The embedding as `GatherBlockQuantized` over `[data, scales]` (rows along axis 0).
    fn gather_block_quantized(&mut self, [data, scales]: [&str; 2], bits: u32, block_size: usize) {
        let attrs = vec![
            attr::int("bits", i64::from(bits)),
            attr::int("block_size", block_size as i64),
            attr::int("gather_axis", 0),
            attr::int("quantize_axis", 1),
        ];
        self.node(
            "GatherBlockQuantized",
            "com.microsoft",
            "embed",
            &[data, "input_ids", scales],
            &["embeddings"],
            attrs,
        );
    }

    /// A projection: initializers, then its node.
    fn linear(&mut self, name: &str, w: Linear, input: &str, output: &str) {
        let shape = LinearShape::of(&w);
        self.linear_initializers(name, w);
        self.linear_node(name, &shape, input, output);
    }

    fn norm_weight(&mut self, name: &str, w: Tensor) -> String {
        self.init(name, w);
        name.to_string()
    }

    /// Adds initializer `name`; a float one in the graph's float type ([`DecoderSpec::io`]).
    fn init(&mut self, name: &str, t: Tensor) {
        let t = match (t.dtype(), self.spec.io) {
            (DType::F32, DType::F16) => to_f16(&t),
            _ => t,
        };
        self.b.initializer(name, t);
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
        self.init(&split, shape([0, -1, hd as i64]));
        self.init(&back, shape([0, -1, (heads * hd) as i64]));
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

impl Writer<'_> {
    /// `down(act(gate(x)) · up(x))` of layer `p` on `x`; returns the output's name.
    fn dense_mlp(&mut self, p: &str, x: &str, [gate_w, up_w, down_w]: [Linear; 3]) -> String {
        let (gate, up, down) = (format!("{p}.gate"), format!("{p}.up"), format!("{p}.down"));
        self.linear(&gate, gate_w, x, &gate);
        self.linear(&up, up_w, x, &up);
        let (sig, act, prod) = (
            format!("{p}.gate_sigmoid"),
            format!("{p}.silu"),
            format!("{p}.gated"),
        );
        if self.spec.gemma.is_some() {
            let tanh = vec![attr::string("approximate", "tanh")];
            self.node("Gelu", "", &act, &[&gate], &[&act], tanh);
        } else {
            self.node("Sigmoid", "", &sig, &[&gate], &[&sig], vec![]);
            self.node("Mul", "", &act, &[&gate, &sig], &[&act], vec![]);
        }
        self.node("Mul", "", &prod, &[&act, &up], &[&prod], vec![]);
        self.linear(&down, down_w, &prod, &down);
        down
    }

    /// gpt-oss's mixture of layer `p` on `x` as onnxruntime-genai's builder writes it: the
    /// router's logits reshaped to `[tokens, experts]`, then `com.microsoft::QMoE` (MXFP4,
    /// `quant_type = fp4`, and the import's `accuracy_level`) with gpt-oss's SwiGLU (interleaved, alpha 1.702, beta 1, clamped at
    /// 7: llama.cpp's constants, which GGUF has no key for) and the top-k softmax routing.
    fn experts(&mut self, p: &str, x: &str, w: ExpertWeights) -> String {
        let e = self
            .spec
            .experts
            .expect("checked: a mixture has its parameters");
        let (router, logits, shape) = (
            format!("{p}.router"),
            format!("{p}.router_logits"),
            format!("{p}.router_shape"),
        );
        self.linear(&router, w.router, x, &router);
        let dims = Tensor::from_slice([2], &[-1i64, e.count as i64]).expect("two dims");
        self.init(&shape, dims);
        self.node(
            "Reshape",
            "",
            &logits,
            &[&router, &shape],
            &[&logits],
            vec![],
        );
        let names = |proj: &str| {
            ["codes", "scales", "bias"].map(|what| format!("{p}.experts.{proj}.{what}"))
        };
        let (fc1, fc2) = (names("gate_up"), names("down"));
        for (names, t) in [(&fc1, w.gate_up), (&fc2, w.down)] {
            self.init(&names[0], t.codes);
            self.init(&names[1], t.scales);
            self.init(&names[2], t.bias);
        }
        let out = format!("{p}.moe");
        let inputs = [
            x, &logits, &fc1[0], &fc1[1], &fc1[2], &fc2[0], &fc2[1], &fc2[2],
        ];
        let attrs = vec![
            attr::int("k", e.used as i64),
            attr::string("activation_type", "swiglu"),
            attr::int("swiglu_fusion", 1),
            attr::float("swiglu_limit", 7.0),
            attr::float("activation_alpha", 1.702),
            attr::float("activation_beta", 1.0),
            attr::int("normalize_routing_weights", 1),
            attr::int("expert_weight_bits", 4),
            attr::int("block_size", 32),
            attr::string("quant_type", "fp4"),
            // oxgen's own: 4 lets the experts take int8 activations, as for MatMulNBits
            // (onnxruntime has no CPU kernel for MXFP4 QMoE to disagree).
            attr::int("accuracy_level", self.spec.accuracy_level),
        ];
        self.node("QMoE", "com.microsoft", &out, &inputs, &[&out], attrs);
        out
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

/// An f32 tensor as f16 (rounded to nearest, ties to even, as torch's `.half()`).
pub(super) fn to_f16(t: &Tensor) -> Tensor {
    let values: Vec<half::f16> = (t.as_slice::<f32>().unwrap_or(&[]).iter())
        .map(|&v| half::f16::from_f32(v))
        .collect();
    Tensor::from_slice(t.dims(), &values).expect("the same shape")
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
    let DecoderWeights {
        embedding,
        layers,
        final_norm,
        head,
    } = weights;
    let ends = EndWeights {
        embedding,
        final_norm,
        head,
    };
    let mut layers = layers.into_iter();
    write_model_streamed(dir, producer, spec, ends, |_| {
        layers.next().ok_or_else(|| {
            WriteError::Shape(ShapeMismatch {
                name: "layers".into(),
                found: vec![],
                expected: vec![spec.layers],
            })
        })
    })
}

/// [`write_model`] taking layer `l`'s weights from `layer(l)` only when the graph reaches
/// it, and writing each weight into `model.onnx.data` as soon as it is added: memory holds
/// the graph and one layer's weights, not the model's.
pub fn write_model_streamed<E: From<WriteError>>(
    dir: &Path,
    producer: &str,
    spec: &DecoderSpec,
    ends: EndWeights,
    layer: impl FnMut(usize) -> Result<LayerWeights, E>,
) -> Result<(), E> {
    ends.check(spec).map_err(WriteError::from)?;
    if spec.layers == 0 {
        return Err(WriteError::Shape(ShapeMismatch {
            name: "layers".into(),
            found: vec![0],
            expected: vec![1],
        })
        .into());
    }
    let path = dir.join("model.onnx");
    let save = |e| WriteError::Save(Box::new(e));
    let mut b = ModelBuilder::new(producer);
    b.stream_external_data(&path, EXTERNAL_THRESHOLD)
        .map_err(save)?;
    build(b, spec, ends, layer)?
        .save(&path, Some(EXTERNAL_THRESHOLD))
        .map_err(|e| save(e).into())
}

/// Why [`write_model`] failed.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Shape(#[from] ShapeMismatch),
    #[error("saving the model: {0}")]
    Save(Box<OnnxError>),
}

/// The model's graph added to `b`, each layer's weights taken from `layer` and checked.
fn build<E: From<WriteError>>(
    b: ModelBuilder,
    spec: &DecoderSpec,
    ends: EndWeights,
    mut layer: impl FnMut(usize) -> Result<LayerWeights, E>,
) -> Result<ModelBuilder, E> {
    let (hd, vocab) = (spec.head_size, spec.vocab);
    let mut g = Writer { b, spec };
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
            g.b.input(&format!("past_key_values.{l}.{kind}"), spec.io, &dims);
        }
    }
    g.b.output(
        "logits",
        spec.io,
        &[batch.clone(), "sequence_length".into(), Dim::Fixed(vocab)],
    );
    for l in 0..spec.layers {
        for kind in ["key", "value"] {
            let dims = kv_dims("total_sequence_length");
            g.b.output(&format!("present.{l}.{kind}"), spec.io, &dims);
        }
    }

    // seqlens_k = sum(attention_mask, 1) - 1 (int32); total_sequence_length = shape(mask)[1].
    g.init("one_i64", Tensor::scalar(1i64));
    g.init(
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

    g.rope_caches();

    let EndWeights {
        embedding,
        final_norm,
        head,
    } = ends;
    // The head's tensors sit next to the embedding's (a tied pair shares its source bytes).
    let head_shape = LinearShape::of(&head);
    match embedding {
        Embedding::BlockQuantized {
            data,
            scales,
            bits,
            block_size,
        } => {
            g.init("embed.qweight", data);
            g.init("embed.scales", scales);
            g.linear_initializers("lm_head", head);
            g.gather_block_quantized(["embed.qweight", "embed.scales"], bits, block_size);
        }
        Embedding::HeadBlocks => {
            let LinearShape::NBits {
                bits, block_size, ..
            } = head_shape
            else {
                return Err(WriteError::Shape(ShapeMismatch {
                    name: "lm_head (an f32 head has no blocks to gather from)".into(),
                    found: vec![],
                    expected: vec![],
                })
                .into());
            };
            g.linear_initializers("lm_head", head);
            let shape = Tensor::from_slice([2], &[vocab as i64, -1]).expect("two dims");
            g.init("embed.shape", shape);
            g.node(
                "Reshape",
                "",
                "embed.qweight",
                &["lm_head.qweight", "embed.shape"],
                &["embed.qweight"],
                vec![],
            );
            g.gather_block_quantized(["embed.qweight", "lm_head.scales"], bits, block_size);
        }
        Embedding::Float(table) => {
            g.init("embed.weight", table);
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
            g.init(name, Tensor::scalar(value));
        }
    }
    let mut residual = "embeddings".to_string();
    if mult.embedding != 1.0 {
        residual = g.scaled("embeddings", "embedding_scale");
    }
    let mut pending: Option<String> = None;
    for l in 0..spec.layers {
        let w = layer(l)?;
        w.check(spec, l).map_err(WriteError::from)?;
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
        let windowed = spec.windowed_layers.as_ref().is_none_or(|w| w[l]);
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
            attr::int("rotary_interleaved", i64::from(spec.rope.interleaved)),
            attr::int("local_window_size", window),
        ];
        let rotates = spec.rotary_layers.get(l).copied().unwrap_or(true);
        gqa.push(attr::int("do_rotary", i64::from(rotates)));
        // Without rotary the cos and sin inputs are left off; sinks are input 11.
        let mut inputs = vec![q.as_str(), &k, &v, &pk, &pv, "seqlens_k", "total_len"];
        if rotates {
            inputs.extend([cos, sin]);
        }
        let sinks = format!("{p}.sinks");
        if let Some(t) = w.sinks {
            g.init(&sinks, t);
            inputs.resize(11, "");
            inputs.push(&sinks);
        }
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
            &inputs,
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
        let down = match w.mlp {
            Mlp::Dense { gate, up, down } => g.dense_mlp(&p, &post, [gate, up, down]),
            Mlp::Experts(x) => g.experts(&p, &post, x),
        };
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
    let last = pending.expect("write_model_streamed requires at least one layer");
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
        g.init("final_softcap", Tensor::scalar(cap));
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
    Ok(g.b)
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
