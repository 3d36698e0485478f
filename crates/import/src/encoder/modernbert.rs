//! ModernBERT (transformers' `ModernBertModel`): a rotary encoder. The graph, as
//! transformers computes it:
//!
//! ```text
//! input_ids, attention_mask                               [batch, sequence] int64
//! tok_embeddings[input_ids] -> LayerNorm
//! cos, sin of position · inv_freq (one table per rotary base: global and local layers)
//! per layer (the first without its attention norm):
//!   x + Wo · attention(rotary(q), rotary(k), v) of Wqkv · LayerNorm(x)
//!     (global layers see every token, local ones |i - j| <= local_attention / 2)
//!   x + Wo · (GELU(a) · b) where a, b = halves of Wi · LayerNorm(x)
//! final LayerNorm -> last_hidden_state                    [batch, sequence, hidden]
//! or, for ModernBertForSequenceClassification, over the tokens' mean or the first token:
//!   head.dense -> GELU -> head.norm -> classifier -> logits [batch, labels]
//! ```
//!
//! Masked scores are `f32::MIN` (a row whose keys are all masked, a padding token's far from
//! the text, stays finite). `config.json` is read in both spellings transformers writes: the
//! checkpoints' `global_attn_every_n_layers`, `global_rope_theta` and `local_rope_theta`, and
//! transformers 5's `layer_types` and `rope_parameters`.

use oxgen_onnx::writer::attr;
use oxgen_tensor::{DType, Tensor};
use serde_json::Value;

use super::{EncoderArch, EncoderSpec, Keys, ModernClassifier, ModernSpec, Writer, ints};
use crate::ImportError;

/// Reads a ModernBERT `config.json`.
pub(super) fn spec(keys: &Keys) -> Result<EncoderSpec, ImportError> {
    let unsupported = |what: String, hint: &str| ImportError::Unsupported {
        file: keys.path.to_path_buf(),
        what,
        hint: hint.into(),
    };
    let (hidden, heads) = keys.heads()?;
    let layers = keys.usize("num_hidden_layers", 1, 1 << 10)?;
    let gelu_tanh = keys.gelu_tanh("hidden_activation")?;
    let mean = match keys
        .config
        .get("classifier_pooling")
        .and_then(Value::as_str)
    {
        None | Some("cls") => false,
        Some("mean") => true,
        Some(other) => {
            return Err(unsupported(
                format!("classifier_pooling '{other}'"),
                "cls and mean are imported",
            ));
        }
    };
    let local = match keys.config.get("layer_types").and_then(Value::as_array) {
        Some(types) => {
            let local = (types.iter())
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    _ => Err(keys.error(
                        "layer_types",
                        format!("holds {t}; full_attention and sliding_attention are imported"),
                    )),
                })
                .collect::<Result<Vec<bool>, _>>()?;
            if local.len() != layers {
                return Err(keys.error(
                    "layer_types",
                    format!("names {} layers, num_hidden_layers {layers}", local.len()),
                ));
            }
            local
        }
        None => {
            let every = keys.usize_or("global_attn_every_n_layers", 3, 1, 1 << 10)?;
            (0..layers).map(|l| l % every != 0).collect()
        }
    };
    let theta = |layer_type: &str, legacy: &str, default: f64| -> Result<f64, ImportError> {
        let params = keys
            .config
            .get("rope_parameters")
            .and_then(|p| p.get(layer_type));
        if let Some(kind) = params.and_then(|p| p.get("rope_type")?.as_str())
            && kind != "default"
        {
            return Err(unsupported(
                format!("rope_type '{kind}' of {layer_type} layers"),
                "ModernBERT's default rotary embedding is imported",
            ));
        }
        let (key, value) = match params.and_then(|p| p.get("rope_theta")) {
            Some(v) => ("rope_parameters.rope_theta", Some(v)),
            None => (legacy, keys.config.get(legacy)),
        };
        match value.map(Value::as_f64) {
            None => Ok(default),
            Some(Some(t)) if t > 1.0 && t.is_finite() => Ok(t),
            Some(_) => Err(keys.error(key, "is not a number above 1".into())),
        }
    };
    let modern = ModernSpec {
        window: keys.usize_or("local_attention", 128, 2, 1 << 20)? / 2,
        global_theta: theta("full_attention", "global_rope_theta", 160_000.0)?,
        local_theta: theta("sliding_attention", "local_rope_theta", 10_000.0)?,
        local,
        norm_bias: keys.bool("norm_bias", false),
        attention_bias: keys.bool("attention_bias", false),
        mlp_bias: keys.bool("mlp_bias", false),
        classifier: ModernClassifier {
            mean,
            bias: keys.bool("classifier_bias", false),
            gelu_tanh: keys.gelu_tanh("classifier_activation")?,
        },
    };
    Ok(EncoderSpec {
        arch: EncoderArch::ModernBert,
        head: keys.head()?,
        layers,
        hidden,
        heads,
        intermediate: keys.usize("intermediate_size", 1, 1 << 20)?,
        vocab: keys.usize("vocab_size", 1, 1 << 24)?,
        max_positions: keys.usize("max_position_embeddings", 1, 1 << 20)?,
        type_vocab: 0,
        pad: keys.usize_or("pad_token_id", 0, 0, 1 << 24)?,
        layer_norm_eps: keys.eps("norm_eps", 1e-5)?,
        gelu_tanh,
        modern: Some(modern),
    })
}

/// Rotary tables' names: `cos`, `sin` (`[sequence, head size]`).
struct Rotary {
    cos: String,
    sin: String,
}

impl Writer<'_> {
    /// The embeddings and every layer; returns the final norm's output.
    pub(super) fn modernbert(&mut self, m: &ModernSpec) -> Result<String, ImportError> {
        let words = self.weight(
            "embeddings.tok_embeddings.weight",
            &[self.spec.vocab, self.spec.hidden],
        )?;
        self.node("Gather", &[&words, "input_ids"], "emb.words", vec![]);
        self.norm("embeddings.norm", "emb.words", "emb.out", m.norm_bias)?;

        self.positions();
        let global = self.rotary("rope.global", m.global_theta);
        let local = self.rotary("rope.local", m.local_theta);
        self.masks(m.window);

        let mut x = "emb.out".to_string();
        for (l, &is_local) in m.local.iter().enumerate() {
            let (rotary, mask) = match is_local {
                true => (&local, "mask.local"),
                false => (&global, "mask.global"),
            };
            x = self.modern_layer(l, &x, m, rotary, mask)?;
        }
        self.norm("final_norm", &x, "final.out", m.norm_bias)?;
        Ok("final.out".into())
    }

    /// `ModernBertForSequenceClassification`'s head over the final states: `logits`
    /// (`[batch, labels]`).
    pub(super) fn modern_classifier(
        &mut self,
        states: &str,
        labels: usize,
        m: &ModernSpec,
    ) -> Result<(), ImportError> {
        let head = m.classifier;
        let h = self.spec.hidden;
        if head.mean {
            // Σ states · mask / Σ mask over the sequence, as transformers pools.
            let last = self.constant(ints(&[-1]));
            self.node(
                "Unsqueeze",
                &["attention_mask", &last],
                "head.mask.i64",
                vec![],
            );
            let to_f32 = attr::int("to", DType::F32.to_onnx() as i64);
            self.node("Cast", &["head.mask.i64"], "head.mask", vec![to_f32]);
            self.node("Mul", &[states, "head.mask"], "head.masked", vec![]);
            let sequence = self.constant(ints(&[1]));
            let keep = vec![attr::int("keepdims", 0)];
            self.node(
                "ReduceSum",
                &["head.masked", &sequence],
                "head.sum",
                keep.clone(),
            );
            self.node("ReduceSum", &["head.mask", &sequence], "head.count", keep);
            self.node("Div", &["head.sum", "head.count"], "head.pooled", vec![]);
        } else {
            self.first_token(states, "head.pooled");
        }
        self.product("head.dense", "head.pooled", "head.dense", [h, h], head.bias)?;
        self.gelu("head.dense", "head.act", head.gelu_tanh);
        self.norm_at("head.norm", "head.act", "head.normed", m.norm_bias)?;
        self.product("classifier", "head.normed", "logits", [h, labels], true)
    }

    /// `pos.i64` (`[sequence]`: 0, 1, …) and `pos.f32` (`[sequence, 1]`).
    fn positions(&mut self) {
        self.node("Shape", &["input_ids"], "pos.shape", vec![]);
        let one = self.constant(Tensor::scalar(1i64));
        let zero = self.constant(Tensor::scalar(0i64));
        self.node(
            "Gather",
            &["pos.shape", &one],
            "pos.seq",
            vec![attr::int("axis", 0)],
        );
        self.node("Range", &[&zero, "pos.seq", &one], "pos.i64", vec![]);
        let to_f32 = attr::int("to", DType::F32.to_onnx() as i64);
        self.node("Cast", &["pos.i64"], "pos.f32.row", vec![to_f32]);
        let axis = self.constant(ints(&[1]));
        self.node("Unsqueeze", &["pos.f32.row", &axis], "pos.f32", vec![]);
    }

    /// cos and sin of `position · inv_freq`, the frequencies repeated across both halves, as
    /// transformers computes them in f32.
    fn rotary(&mut self, name: &str, theta: f64) -> Rotary {
        let d = self.spec.hidden / self.spec.heads;
        let inv_freq: Vec<f32> = (0..d / 2)
            .map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / d as f32))
            .collect();
        let inv_freq = Tensor::from_slice([1, d / 2].as_slice(), &inv_freq).expect("[1, d/2]");
        let inv_freq = self.constant(inv_freq);
        let freqs = format!("{name}.freqs");
        self.node("Mul", &["pos.f32", &inv_freq], &freqs, vec![]);
        let both = format!("{name}.angles");
        self.node(
            "Concat",
            &[&freqs, &freqs],
            &both,
            vec![attr::int("axis", -1)],
        );
        let rotary = Rotary {
            cos: format!("{name}.cos"),
            sin: format!("{name}.sin"),
        };
        self.node("Cos", &[&both], &rotary.cos, vec![]);
        self.node("Sin", &[&both], &rotary.sin, vec![]);
        rotary
    }

    /// `mask.global` (`[batch, 1, 1, keys]`: 0 for a token, `f32::MIN` for padding) and
    /// `mask.local` (`[batch, 1, queries, keys]`: also `f32::MIN` past `window` either side).
    fn masks(&mut self, window: usize) {
        let axes = self.constant(ints(&[1, 2]));
        self.node("Unsqueeze", &["attention_mask", &axes], "mask.4d", vec![]);
        let to_bool = attr::int("to", DType::Bool.to_onnx() as i64);
        self.node("Cast", &["mask.4d"], "mask.keys", vec![to_bool]);
        let (rows, cols) = (self.constant(ints(&[1])), self.constant(ints(&[0])));
        self.node("Unsqueeze", &["pos.i64", &rows], "mask.rows", vec![]);
        self.node("Unsqueeze", &["pos.i64", &cols], "mask.cols", vec![]);
        self.node("Sub", &["mask.rows", "mask.cols"], "mask.offset", vec![]);
        self.node("Abs", &["mask.offset"], "mask.distance", vec![]);
        let window = self.constant(Tensor::scalar(window as i64));
        self.node(
            "LessOrEqual",
            &["mask.distance", &window],
            "mask.near",
            vec![],
        );
        self.node(
            "And",
            &["mask.keys", "mask.near"],
            "mask.local.keys",
            vec![],
        );
        let zero = self.constant(Tensor::scalar(0f32));
        let min = self.constant(Tensor::scalar(f32::MIN));
        for (keys, out) in [
            ("mask.keys", "mask.global"),
            ("mask.local.keys", "mask.local"),
        ] {
            self.node("Where", &[keys, &zero, &min], out, vec![]);
        }
    }

    /// `x · cos + rotate_half(x) · sin` over the last axis (`[b, heads, s, d]`).
    fn rotate(&mut self, x: &str, rotary: &Rotary, out: &str) {
        let d = (self.spec.hidden / self.spec.heads) as i64;
        let axis = self.constant(ints(&[3]));
        let (zero, half, end) = (
            self.constant(ints(&[0])),
            self.constant(ints(&[d / 2])),
            self.constant(ints(&[d])),
        );
        let (x1, x2) = (format!("{out}.x1"), format!("{out}.x2"));
        self.node("Slice", &[x, &zero, &half, &axis], &x1, vec![]);
        self.node("Slice", &[x, &half, &end, &axis], &x2, vec![]);
        let neg = format!("{out}.neg");
        self.node("Neg", &[&x2], &neg, vec![]);
        let rotated = format!("{out}.rotated");
        self.node("Concat", &[&neg, &x1], &rotated, vec![attr::int("axis", 3)]);
        let (a, b) = (format!("{out}.cos"), format!("{out}.sin"));
        self.node("Mul", &[x, &rotary.cos], &a, vec![]);
        self.node("Mul", &[&rotated, &rotary.sin], &b, vec![]);
        self.node("Add", &[&a, &b], out, vec![]);
    }

    fn modern_layer(
        &mut self,
        l: usize,
        x: &str,
        m: &ModernSpec,
        rotary: &Rotary,
        mask: &str,
    ) -> Result<String, ImportError> {
        let (h, heads) = (self.spec.hidden, self.spec.heads);
        let d = h / heads;
        let p = format!("{}layers.{l}", self.prefix);
        let n = format!("l{l}");
        let normed = match l {
            0 => x.to_string(),
            _ => {
                let out = format!("{n}.attn_norm");
                self.norm(&format!("layers.{l}.attn_norm"), x, &out, m.norm_bias)?;
                out
            }
        };
        let qkv = format!("{n}.qkv");
        self.product(
            &format!("{p}.attn.Wqkv"),
            &normed,
            &qkv,
            [h, 3 * h],
            m.attention_bias,
        )?;
        let shape = self.constant(ints(&[0, 0, 3, heads as i64, d as i64]));
        self.node("Reshape", &[&qkv, &shape], &format!("{n}.qkv5"), vec![]);
        self.node(
            "Transpose",
            &[&format!("{n}.qkv5")],
            &format!("{n}.qkv_t"),
            vec![attr::ints("perm", &[2, 0, 3, 1, 4])],
        );
        for (i, which) in ["q", "k", "v"].into_iter().enumerate() {
            let index = self.constant(Tensor::scalar(i as i64));
            self.node(
                "Gather",
                &[&format!("{n}.qkv_t"), &index],
                &format!("{n}.{which}"),
                vec![attr::int("axis", 0)],
            );
        }
        self.rotate(&format!("{n}.q"), rotary, &format!("{n}.q_rot"));
        self.rotate(&format!("{n}.k"), rotary, &format!("{n}.k_rot"));
        self.node(
            "Transpose",
            &[&format!("{n}.k_rot")],
            &format!("{n}.k_t"),
            vec![attr::ints("perm", &[0, 1, 3, 2])],
        );
        self.node(
            "MatMul",
            &[&format!("{n}.q_rot"), &format!("{n}.k_t")],
            &format!("{n}.scores"),
            vec![],
        );
        let scale = self.constant(Tensor::scalar((d as f32).powf(-0.5)));
        self.node(
            "Mul",
            &[&format!("{n}.scores"), &scale],
            &format!("{n}.scaled"),
            vec![],
        );
        self.attend(&n, mask, &format!("{n}.v"));
        let attn = format!("{n}.attn_out");
        self.product(
            &format!("{p}.attn.Wo"),
            &format!("{n}.merged"),
            &attn,
            [h, h],
            m.attention_bias,
        )?;
        let after_attn = format!("{n}.attn_res");
        self.node("Add", &[x, &attn], &after_attn, vec![]);

        let inter = self.spec.intermediate;
        let mlp_in = format!("{n}.mlp_norm");
        self.norm(
            &format!("layers.{l}.mlp_norm"),
            &after_attn,
            &mlp_in,
            m.norm_bias,
        )?;
        let wi = format!("{n}.wi");
        self.product(
            &format!("{p}.mlp.Wi"),
            &mlp_in,
            &wi,
            [h, 2 * inter],
            m.mlp_bias,
        )?;
        let axis = self.constant(ints(&[-1]));
        let (zero, mid, end) = (
            self.constant(ints(&[0])),
            self.constant(ints(&[inter as i64])),
            self.constant(ints(&[2 * inter as i64])),
        );
        let (input, gate) = (format!("{n}.input"), format!("{n}.gate"));
        self.node("Slice", &[&wi, &zero, &mid, &axis], &input, vec![]);
        self.node("Slice", &[&wi, &mid, &end, &axis], &gate, vec![]);
        let act = format!("{n}.act");
        self.gelu(&input, &act, self.spec.gelu_tanh);
        let glu = format!("{n}.glu");
        self.node("Mul", &[&act, &gate], &glu, vec![]);
        let down = format!("{n}.down");
        self.product(&format!("{p}.mlp.Wo"), &glu, &down, [inter, h], m.mlp_bias)?;
        let out = format!("{n}.out");
        self.node("Add", &[&after_attn, &down], &out, vec![]);
        Ok(out)
    }
}
