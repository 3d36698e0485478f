//! Sentence encoders and cross-encoders from a Hugging Face folder (`config.json` +
//! `model.safetensors` + `tokenizer.json`, as sentence-transformers saves them) into the ONNX
//! graph `optimum-cli export onnx --task feature-extraction` (or `text-classification`) writes
//! for BERT, RoBERTa and XLM-RoBERTa, so an imported package and an optimum export load the
//! same way:
//!
//! ```text
//! input_ids, attention_mask[, token_type_ids]            [batch, sequence] int64
//! word + position (+ token type) embeddings -> LayerNormalization
//! per layer:
//!   q, k, v = MatMul + Add -> Reshape [b, s, heads, d] -> Transpose
//!   softmax(q·kᵀ / √d + (1 - mask) · f32::MIN) · v -> Transpose -> Reshape
//!   -> MatMul + Add, + residual -> LayerNormalization
//!   -> MatMul + Add -> GELU (erf, or tanh for gelu_new) -> MatMul + Add, + residual
//!   -> LayerNormalization
//! last_hidden_state                                       [batch, sequence, hidden]
//! or, for a ...ForSequenceClassification model, the head on the first token:
//!   BERT: pooler (MatMul + Add -> Tanh) -> classifier;  RoBERTa: dense -> Tanh -> out_proj
//! logits                                                  [batch, labels]
//! ```
//!
//! RoBERTa's positions count only the non-padding tokens from `pad_token_id + 1` (a `CumSum`
//! over `input_ids != pad`, as transformers computes them). ModernBERT, a rotary encoder,
//! has a graph of its own ([`modernbert`]). Weights are transposed to `[in, out]` and stored
//! as f32 whatever the file held.

mod modernbert;

use std::path::Path;

use oxgen_onnx::proto::AttributeProto;
use oxgen_onnx::writer::{Dim, ModelBuilder, attr};
use oxgen_tensor::{DType, Tensor};
use serde_json::Value;

use crate::ImportError;
use crate::genai_graph::EXTERNAL_THRESHOLD;
use crate::safetensors::SafeTensors;

/// Which family's embeddings the graph computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncoderArch {
    /// BERT (and MiniLM, BGE, E5, GTE exports of it): positions from 0, token type ids.
    Bert,
    /// RoBERTa / XLM-RoBERTa: positions from `pad_token_id + 1` over the non-padding tokens.
    Roberta,
    /// ModernBERT: rotary positions, global attention every few layers and a sliding window
    /// between, a GeGLU MLP ([`ModernSpec`]).
    ModernBert,
}

/// What ModernBERT adds to an encoder's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModernSpec {
    /// Per layer: whether it attends only within [`ModernSpec::window`] tokens each side
    /// (else to every token).
    pub local: Vec<bool>,
    /// Tokens a local layer sees on each side (`local_attention / 2`).
    pub window: usize,
    /// Rotary bases of the global and the local layers.
    pub global_theta: f64,
    pub local_theta: f64,
    /// Whether the layer norms, the attention projections and the MLP have biases.
    pub norm_bias: bool,
    pub attention_bias: bool,
    pub mlp_bias: bool,
    /// The classification head's form (read, and used, for a classifier only).
    pub classifier: ModernClassifier,
}

/// `ModernBertForSequenceClassification`'s head: the pooled states → `head.dense` → GELU →
/// `head.norm` → `classifier`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModernClassifier {
    /// Pooled by the mean of the tokens' states, else the first token's.
    pub mean: bool,
    /// Whether `head.dense` has a bias (`classifier_bias`).
    pub bias: bool,
    /// `classifier_activation` by its tanh approximation.
    pub gelu_tanh: bool,
}

/// What the graph puts out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncoderHead {
    /// `last_hidden_state` (pooled by the runtime, as sentence-transformers' config says).
    Features,
    /// `logits` of a sequence-classification head over the first token.
    Classifier { labels: usize },
}

/// The shape of an encoder, read from `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderSpec {
    pub arch: EncoderArch,
    pub head: EncoderHead,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub max_positions: usize,
    /// Rows of the token-type table; the graph takes `token_type_ids` when it is above 1.
    pub type_vocab: usize,
    pub pad: usize,
    pub layer_norm_eps: f32,
    /// GELU by its tanh approximation (`gelu_new`, `gelu_pytorch_tanh`) instead of erf.
    pub gelu_tanh: bool,
    /// ModernBERT's layout (with [`EncoderArch::ModernBert`]).
    pub modern: Option<ModernSpec>,
}

impl EncoderSpec {
    /// Reads `config.json`'s text (the path is for messages).
    pub fn from_config(path: &Path, text: &str) -> Result<EncoderSpec, ImportError> {
        let config: Value = serde_json::from_str(text).map_err(|e| ImportError::Metadata {
            file: path.to_path_buf(),
            key: "(file)".into(),
            problem: format!("is not JSON ({e})"),
        })?;
        let keys = Keys {
            path,
            config: &config,
        };
        let usize_of = |key: &str, lo: usize, hi: usize| keys.usize(key, lo, hi);
        let model_type = config
            .get("model_type")
            .and_then(Value::as_str)
            .unwrap_or("");
        let arch = match model_type {
            "bert" => EncoderArch::Bert,
            "roberta" | "xlm-roberta" | "camembert" => EncoderArch::Roberta,
            "modernbert" => return modernbert::spec(&keys),
            other => {
                return Err(ImportError::UnsupportedArchitecture {
                    file: path.to_path_buf(),
                    arch: other.to_string(),
                    supported: "bert, roberta, xlm-roberta, camembert, modernbert (encoders)"
                        .into(),
                });
            }
        };
        if let Some(kind) = config
            .get("position_embedding_type")
            .and_then(Value::as_str)
            .filter(|k| *k != "absolute")
        {
            return Err(ImportError::Unsupported {
                file: path.to_path_buf(),
                what: format!("position_embedding_type '{kind}'"),
                hint: "only absolute position embeddings are imported".into(),
            });
        }
        let gelu_tanh = keys.gelu_tanh("hidden_act")?;
        let head = keys.head()?;
        let (hidden, heads) = keys.heads()?;
        let eps = keys.eps("layer_norm_eps", 1e-12)?;
        Ok(EncoderSpec {
            arch,
            head,
            layers: usize_of("num_hidden_layers", 1, 1 << 10)?,
            hidden,
            heads,
            intermediate: usize_of("intermediate_size", 1, 1 << 20)?,
            vocab: usize_of("vocab_size", 1, 1 << 24)?,
            max_positions: usize_of("max_position_embeddings", 1, 1 << 20)?,
            type_vocab: usize_of("type_vocab_size", 0, 1 << 10).unwrap_or(0),
            pad: usize_of("pad_token_id", 0, 1 << 24).unwrap_or(0),
            layer_norm_eps: eps,
            gelu_tanh,
            modern: None,
        })
    }

    /// The tokens a sequence may hold: RoBERTa's positions start after the padding id.
    pub fn max_tokens(&self) -> usize {
        match self.arch {
            EncoderArch::Bert | EncoderArch::ModernBert => self.max_positions,
            EncoderArch::Roberta => self.max_positions.saturating_sub(self.pad + 1),
        }
    }

    fn takes_token_types(&self) -> bool {
        self.arch == EncoderArch::Bert && self.type_vocab > 1
    }
}

/// `config.json`'s values, checked, with errors that name the file and the key.
struct Keys<'a> {
    path: &'a Path,
    config: &'a Value,
}

impl Keys<'_> {
    fn error(&self, key: &str, problem: String) -> ImportError {
        ImportError::Metadata {
            file: self.path.to_path_buf(),
            key: key.into(),
            problem,
        }
    }

    fn usize(&self, key: &str, lo: usize, hi: usize) -> Result<usize, ImportError> {
        let v = (self.config.get(key))
            .and_then(Value::as_u64)
            .ok_or_else(|| self.error(key, "is missing or not a non-negative integer".into()))?;
        usize::try_from(v)
            .ok()
            .filter(|v| (lo..=hi).contains(v))
            .ok_or_else(|| self.error(key, format!("is {v}, outside {lo}..={hi}")))
    }

    /// [`Keys::usize`], `default` when the key is absent.
    fn usize_or(
        &self,
        key: &str,
        default: usize,
        lo: usize,
        hi: usize,
    ) -> Result<usize, ImportError> {
        match self.config.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(_) => self.usize(key, lo, hi),
        }
    }

    /// `hidden_size` and `num_attention_heads`, the second dividing the first.
    fn heads(&self) -> Result<(usize, usize), ImportError> {
        let hidden = self.usize("hidden_size", 1, 1 << 16)?;
        let heads = self.usize("num_attention_heads", 1, 1 << 10)?;
        if hidden % heads != 0 {
            return Err(self.error(
                "num_attention_heads",
                format!("is {heads}, which does not divide hidden_size {hidden}"),
            ));
        }
        Ok((hidden, heads))
    }

    /// A layer norm's epsilon in (0, 1), `default` when absent.
    fn eps(&self, key: &str, default: f64) -> Result<f32, ImportError> {
        let eps = (self.config.get(key))
            .and_then(Value::as_f64)
            .unwrap_or(default);
        if !(eps > 0.0 && eps < 1.0) {
            return Err(self.error(key, format!("is {eps}, outside (0, 1)")));
        }
        Ok(eps as f32)
    }

    fn bool(&self, key: &str, default: bool) -> bool {
        (self.config.get(key))
            .and_then(Value::as_bool)
            .unwrap_or(default)
    }

    /// A classifier's labels (`id2label`'s entries, else `num_labels`) when `architectures`
    /// names a `...ForSequenceClassification` head, else features.
    fn head(&self) -> Result<EncoderHead, ImportError> {
        if !self.classifies() {
            return Ok(EncoderHead::Features);
        }
        let labels = match self.config.get("id2label").and_then(Value::as_object) {
            Some(map) => map.len(),
            None => self.usize("num_labels", 1, 1 << 16)?,
        };
        Ok(EncoderHead::Classifier { labels })
    }

    /// Whether a GELU `key` (default `gelu`) is its tanh approximation; other activations
    /// are refused.
    fn gelu_tanh(&self, key: &str) -> Result<bool, ImportError> {
        match self.config.get(key).and_then(Value::as_str) {
            None | Some("gelu") => Ok(false),
            Some("gelu_new" | "gelu_pytorch_tanh") => Ok(true),
            Some(other) => Err(ImportError::Unsupported {
                file: self.path.to_path_buf(),
                what: format!("{key} '{other}'"),
                hint: "gelu, gelu_new and gelu_pytorch_tanh are imported".into(),
            }),
        }
    }

    /// Whether `architectures` names a `...ForSequenceClassification` head.
    fn classifies(&self) -> bool {
        (self.config.get("architectures"))
            .and_then(Value::as_array)
            .is_some_and(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .any(|n| n.ends_with("ForSequenceClassification"))
            })
    }
}

struct Writer<'a> {
    b: ModelBuilder,
    st: &'a SafeTensors,
    /// The prefix of the encoder's own weights (`""`, `bert.`, `roberta.`).
    prefix: String,
    spec: &'a EncoderSpec,
    constants: usize,
}

impl Writer<'_> {
    fn node(&mut self, op: &str, inputs: &[&str], output: &str, attrs: Vec<AttributeProto>) {
        self.b.node(op, "", output, inputs, &[output], attrs);
    }

    /// A new constant initializer; returns its name.
    fn constant(&mut self, tensor: Tensor) -> String {
        self.constants += 1;
        let name = format!("const.{}", self.constants);
        self.b.initializer(&name, tensor);
        name
    }

    /// Copies `{prefix}{name}` (f32) with `shape` into an initializer of that name.
    fn weight(&mut self, name: &str, shape: &[usize]) -> Result<String, ImportError> {
        self.weight_at(&format!("{}{name}", self.prefix), shape)
    }

    /// Copies `name` (f32, outside the encoder's prefix) into an initializer of that name.
    fn weight_at(&mut self, name: &str, shape: &[usize]) -> Result<String, ImportError> {
        let t = self.st.f32(name, shape)?;
        self.b.initializer(name, t);
        Ok(name.to_string())
    }

    /// `x · Wᵀ + b` for torch's `Linear` `{name}.weight` `[out, in]` and `{name}.bias`.
    fn linear(
        &mut self,
        name: &str,
        input: &str,
        output: &str,
        in_dim: usize,
        out_dim: usize,
    ) -> Result<(), ImportError> {
        self.product(name, input, output, [in_dim, out_dim], true)
    }

    /// `x · Wᵀ`, `+ b` when `bias`, for torch's `Linear` `{name}` of `[in, out]` features.
    fn product(
        &mut self,
        name: &str,
        input: &str,
        output: &str,
        [in_dim, out_dim]: [usize; 2],
        bias: bool,
    ) -> Result<(), ImportError> {
        let w_name = format!("{name}.weight");
        let w = self.st.linear(&w_name, out_dim, in_dim)?;
        self.b.initializer(&w_name, w);
        if !bias {
            self.node("MatMul", &[input, &w_name], output, vec![]);
            return Ok(());
        }
        let bias_name = format!("{name}.bias");
        let bias = self.st.f32(&bias_name, &[out_dim])?;
        self.b.initializer(&bias_name, bias);
        let product = format!("{output}.matmul");
        self.node("MatMul", &[input, &w_name], &product, vec![]);
        self.node("Add", &[&product, &bias_name], output, vec![]);
        Ok(())
    }

    fn layer_norm(&mut self, name: &str, input: &str, output: &str) -> Result<(), ImportError> {
        self.norm(name, input, output, true)
    }

    /// `LayerNormalization` of `{prefix}{name}.weight` (and `.bias` when `bias`).
    fn norm(
        &mut self,
        name: &str,
        input: &str,
        output: &str,
        bias: bool,
    ) -> Result<(), ImportError> {
        self.norm_at(&format!("{}{name}", self.prefix), input, output, bias)
    }

    /// [`Self::norm`] of weights named outside the encoder's prefix.
    fn norm_at(
        &mut self,
        name: &str,
        input: &str,
        output: &str,
        bias: bool,
    ) -> Result<(), ImportError> {
        let h = self.spec.hidden;
        let gamma = self.weight_at(&format!("{name}.weight"), &[h])?;
        let beta = match bias {
            true => self.weight_at(&format!("{name}.bias"), &[h])?,
            false => String::new(),
        };
        let inputs: &[&str] = if bias {
            &[input, &gamma, &beta]
        } else {
            &[input, &gamma]
        };
        self.node(
            "LayerNormalization",
            inputs,
            output,
            vec![
                attr::int("axis", -1),
                attr::float("epsilon", self.spec.layer_norm_eps),
            ],
        );
        Ok(())
    }

    /// `[b, s, hidden]` → `[b, heads, s, d]` (or `[b, heads, d, s]` with `keys_t`).
    fn split_heads(&mut self, input: &str, output: &str, keys_t: bool) {
        let (heads, d) = (self.spec.heads, self.spec.hidden / self.spec.heads);
        let shape = self.constant(ints(&[0, 0, heads as i64, d as i64]));
        let split = format!("{output}.split");
        self.node("Reshape", &[input, &shape], &split, vec![]);
        let perm = if keys_t { [0, 2, 3, 1] } else { [0, 2, 1, 3] };
        self.node(
            "Transpose",
            &[&split],
            output,
            vec![attr::ints("perm", &perm)],
        );
    }

    /// `softmax({n}.scaled + mask) · values` with the heads merged back (`[b, s, hidden]`)
    /// into `{n}.merged`.
    fn attend(&mut self, n: &str, mask: &str, values: &str) {
        self.node(
            "Add",
            &[&format!("{n}.scaled"), mask],
            &format!("{n}.masked"),
            vec![],
        );
        self.node(
            "Softmax",
            &[&format!("{n}.masked")],
            &format!("{n}.probs"),
            vec![attr::int("axis", -1)],
        );
        self.node(
            "MatMul",
            &[&format!("{n}.probs"), values],
            &format!("{n}.context"),
            vec![],
        );
        self.node(
            "Transpose",
            &[&format!("{n}.context")],
            &format!("{n}.context_t"),
            vec![attr::ints("perm", &[0, 2, 1, 3])],
        );
        let merged = self.constant(ints(&[0, 0, self.spec.hidden as i64]));
        self.node(
            "Reshape",
            &[&format!("{n}.context_t"), &merged],
            &format!("{n}.merged"),
            vec![],
        );
    }

    /// GELU by erf, or by its tanh approximation when `tanh`.
    fn gelu(&mut self, input: &str, output: &str, tanh: bool) {
        let half = self.constant(Tensor::scalar(0.5f32));
        let one = self.constant(Tensor::scalar(1f32));
        let inner = format!("{output}.inner");
        if tanh {
            // 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
            let c = self.constant(Tensor::scalar(0.044715f32));
            let k = self.constant(Tensor::scalar((2.0f64 / std::f64::consts::PI).sqrt() as f32));
            let three = self.constant(Tensor::scalar(3f32));
            let cube = format!("{output}.cube");
            self.node("Pow", &[input, &three], &cube, vec![]);
            let scaled = format!("{output}.cube_scaled");
            self.node("Mul", &[&cube, &c], &scaled, vec![]);
            let sum = format!("{output}.sum");
            self.node("Add", &[input, &scaled], &sum, vec![]);
            let arg = format!("{output}.arg");
            self.node("Mul", &[&sum, &k], &arg, vec![]);
            self.node("Tanh", &[&arg], &inner, vec![]);
        } else {
            // x·0.5·(1 + erf(x / √2)), as torch exports F.gelu.
            let root2 = self.constant(Tensor::scalar(std::f32::consts::SQRT_2));
            let div = format!("{output}.div");
            self.node("Div", &[input, &root2], &div, vec![]);
            self.node("Erf", &[&div], &inner, vec![]);
        }
        let plus = format!("{output}.plus1");
        self.node("Add", &[&inner, &one], &plus, vec![]);
        let times = format!("{output}.times_x");
        self.node("Mul", &[input, &plus], &times, vec![]);
        self.node("Mul", &[&times, &half], output, vec![]);
    }

    fn embeddings(&mut self) -> Result<String, ImportError> {
        let spec = self.spec;
        let h = spec.hidden;
        let words = self.weight("embeddings.word_embeddings.weight", &[spec.vocab, h])?;
        self.node("Gather", &[&words, "input_ids"], "emb.words", vec![]);

        let positions = match spec.arch {
            // ModernBERT has no position table (its graph is `modernbert`'s).
            EncoderArch::Bert | EncoderArch::ModernBert => {
                // Range(0, sequence) as a [1, s] row.
                let shape = "emb.shape";
                self.node("Shape", &["input_ids"], shape, vec![]);
                let front = self.constant(ints(&[0]));
                let zero = self.constant(Tensor::scalar(0i64));
                let step = self.constant(Tensor::scalar(1i64));
                let idx = self.constant(Tensor::scalar(1i64));
                self.node(
                    "Gather",
                    &[shape, &idx],
                    "emb.seq",
                    vec![attr::int("axis", 0)],
                );
                self.node("Range", &[&zero, "emb.seq", &step], "emb.range", vec![]);
                self.node("Unsqueeze", &["emb.range", &front], "emb.positions", vec![]);
                "emb.positions"
            }
            EncoderArch::Roberta => {
                // cumsum(ids != pad) · (ids != pad) + pad
                let pad = self.constant(Tensor::scalar(spec.pad as i64));
                let axis = self.constant(Tensor::scalar(1i64));
                self.node("Equal", &["input_ids", &pad], "emb.is_pad", vec![]);
                self.node("Not", &["emb.is_pad"], "emb.not_pad", vec![]);
                self.node(
                    "Cast",
                    &["emb.not_pad"],
                    "emb.mask",
                    vec![attr::int("to", DType::I64.to_onnx() as i64)],
                );
                self.node("CumSum", &["emb.mask", &axis], "emb.count", vec![]);
                self.node("Mul", &["emb.count", "emb.mask"], "emb.counted", vec![]);
                self.node("Add", &["emb.counted", &pad], "emb.positions", vec![]);
                "emb.positions"
            }
        };
        let table = self.weight(
            "embeddings.position_embeddings.weight",
            &[spec.max_positions, h],
        )?;
        self.node("Gather", &[&table, positions], "emb.pos", vec![]);
        self.node("Add", &["emb.words", "emb.pos"], "emb.sum", vec![]);

        let mut sum = "emb.sum".to_string();
        if spec.type_vocab > 0 {
            let types = self.weight(
                "embeddings.token_type_embeddings.weight",
                &[spec.type_vocab, h],
            )?;
            if spec.takes_token_types() {
                self.node("Gather", &[&types, "token_type_ids"], "emb.types", vec![]);
            } else {
                // One type: its row is added to every token (what Gather of zeros gives).
                let zero = self.constant(Tensor::scalar(0i64));
                self.node(
                    "Gather",
                    &[&types, &zero],
                    "emb.types",
                    vec![attr::int("axis", 0)],
                );
            }
            self.node("Add", &[&sum, "emb.types"], "emb.typed", vec![]);
            sum = "emb.typed".into();
        }
        self.layer_norm("embeddings.LayerNorm", &sum, "emb.out")?;
        Ok("emb.out".into())
    }

    /// The additive mask `(1 - mask) · f32::MIN` as `[b, 1, 1, s]`.
    fn mask(&mut self) {
        let axes = self.constant(ints(&[1, 2]));
        self.node("Unsqueeze", &["attention_mask", &axes], "mask.4d", vec![]);
        self.node(
            "Cast",
            &["mask.4d"],
            "mask.f32",
            vec![attr::int("to", DType::F32.to_onnx() as i64)],
        );
        let one = self.constant(Tensor::scalar(1f32));
        let min = self.constant(Tensor::scalar(f32::MIN));
        self.node("Sub", &[&one, "mask.f32"], "mask.inverted", vec![]);
        self.node("Mul", &["mask.inverted", &min], "mask.add", vec![]);
    }

    fn layer(&mut self, l: usize, input: &str) -> Result<String, ImportError> {
        let spec = self.spec;
        let (h, heads) = (spec.hidden, spec.heads);
        let p = format!("{}encoder.layer.{l}", self.prefix);
        let n = format!("l{l}");
        for (which, keys_t) in [("query", false), ("key", true), ("value", false)] {
            let proj = format!("{n}.{which}");
            self.linear(&format!("{p}.attention.self.{which}"), input, &proj, h, h)?;
            self.split_heads(&proj, &format!("{n}.{which}.heads"), keys_t);
        }
        let scores = format!("{n}.scores");
        self.node(
            "MatMul",
            &[&format!("{n}.query.heads"), &format!("{n}.key.heads")],
            &scores,
            vec![],
        );
        let scale = self.constant(Tensor::scalar(((h / heads) as f32).sqrt()));
        self.node("Div", &[&scores, &scale], &format!("{n}.scaled"), vec![]);
        self.attend(&n, "mask.add", &format!("{n}.value.heads"));
        self.linear(
            &format!("{p}.attention.output.dense"),
            &format!("{n}.merged"),
            &format!("{n}.attn_out"),
            h,
            h,
        )?;
        self.node(
            "Add",
            &[&format!("{n}.attn_out"), input],
            &format!("{n}.attn_res"),
            vec![],
        );
        self.layer_norm_abs(
            &format!("{p}.attention.output.LayerNorm"),
            &format!("{n}.attn_res"),
            &format!("{n}.attn_norm"),
        )?;
        let inter = spec.intermediate;
        self.linear(
            &format!("{p}.intermediate.dense"),
            &format!("{n}.attn_norm"),
            &format!("{n}.up"),
            h,
            inter,
        )?;
        self.gelu(&format!("{n}.up"), &format!("{n}.act"), spec.gelu_tanh);
        self.linear(
            &format!("{p}.output.dense"),
            &format!("{n}.act"),
            &format!("{n}.down"),
            inter,
            h,
        )?;
        self.node(
            "Add",
            &[&format!("{n}.down"), &format!("{n}.attn_norm")],
            &format!("{n}.res"),
            vec![],
        );
        let out = format!("{n}.out");
        self.layer_norm_abs(&format!("{p}.output.LayerNorm"), &format!("{n}.res"), &out)?;
        Ok(out)
    }

    /// [`Self::layer_norm`] for a weight name that already carries the prefix.
    fn layer_norm_abs(&mut self, name: &str, input: &str, output: &str) -> Result<(), ImportError> {
        self.norm_at(name, input, output, true)
    }

    /// The first token's state of each sequence (`[batch, hidden]`).
    fn first_token(&mut self, states: &str, output: &str) {
        let first = self.constant(Tensor::scalar(0i64));
        self.node(
            "Gather",
            &[states, &first],
            output,
            vec![attr::int("axis", 1)],
        );
    }

    /// The classification head over the first token's state.
    fn classifier(&mut self, states: &str, labels: usize) -> Result<(), ImportError> {
        let h = self.spec.hidden;
        self.first_token(states, "head.first");
        let (dense, out) = match self.spec.arch {
            EncoderArch::Bert | EncoderArch::ModernBert => (
                format!("{}pooler.dense", self.prefix),
                "classifier".to_string(),
            ),
            EncoderArch::Roberta => (
                "classifier.dense".to_string(),
                "classifier.out_proj".to_string(),
            ),
        };
        self.linear(&dense, "head.first", "head.dense", h, h)?;
        self.node("Tanh", &["head.dense"], "head.pooled", vec![]);
        self.linear(&out, "head.pooled", "logits", h, labels)
    }
}

fn ints(values: &[i64]) -> Tensor {
    Tensor::from_slice([values.len()].as_slice(), values).expect("a vector")
}

/// The prefix of the encoder's weights in `st`: `""` for a bare `BertModel`, else the
/// model-type attribute a `...ForSequenceClassification` keeps it under.
fn weight_prefix(st: &SafeTensors, arch: EncoderArch) -> Result<String, ImportError> {
    let words = match arch {
        EncoderArch::ModernBert => "embeddings.tok_embeddings.weight",
        _ => "embeddings.word_embeddings.weight",
    };
    for prefix in ["", "bert.", "roberta.", "model."] {
        if st.contains(&format!("{prefix}{words}")) {
            return Ok(prefix.to_string());
        }
    }
    Err(ImportError::Tensor {
        file: st.path().to_path_buf(),
        tensor: words.into(),
        problem: format!(
            "is missing (also under bert., roberta. and model.); the file is not a {arch:?} \
             encoder"
        ),
    })
}

/// Builds the encoder graph of `spec` from the weights in `st`.
pub fn build(
    producer: &str,
    spec: &EncoderSpec,
    st: &SafeTensors,
) -> Result<ModelBuilder, ImportError> {
    let mut w = Writer {
        b: ModelBuilder::new(producer),
        st,
        prefix: weight_prefix(st, spec.arch)?,
        spec,
        constants: 0,
    };
    w.b.opset("", 17);
    let batch = Dim::Symbolic("batch_size".into());
    let seq = Dim::Symbolic("sequence_length".into());
    w.b.input("input_ids", DType::I64, &[batch.clone(), seq.clone()]);
    w.b.input("attention_mask", DType::I64, &[batch.clone(), seq.clone()]);
    if spec.takes_token_types() {
        w.b.input("token_type_ids", DType::I64, &[batch.clone(), seq.clone()]);
    }
    let x = match &spec.modern {
        Some(modern) => w.modernbert(modern)?,
        None => {
            let mut x = w.embeddings()?;
            w.mask();
            for l in 0..spec.layers {
                x = w.layer(l, &x)?;
            }
            x
        }
    };
    match spec.head {
        EncoderHead::Features => {
            w.node("Identity", &[&x], "last_hidden_state", vec![]);
            w.b.output(
                "last_hidden_state",
                DType::F32,
                &[batch, seq, Dim::Fixed(spec.hidden)],
            );
        }
        EncoderHead::Classifier { labels } => {
            match &spec.modern {
                Some(modern) => w.modern_classifier(&x, labels, modern)?,
                None => w.classifier(&x, labels)?,
            }
            w.b.output("logits", DType::F32, &[batch, Dim::Fixed(labels)]);
        }
    }
    Ok(w.b)
}

/// Writes `model.onnx` (+ `model.onnx.data`) into `dir`.
pub fn write_model(
    dir: &Path,
    producer: &str,
    spec: &EncoderSpec,
    st: &SafeTensors,
) -> Result<(), ImportError> {
    build(producer, spec, st)?
        .save(&dir.join("model.onnx"), Some(EXTERNAL_THRESHOLD))
        .map_err(|e| ImportError::Write {
            dir: dir.to_path_buf(),
            source: Box::new(crate::genai_graph::WriteError::Save(Box::new(e))),
        })
}

/// The module folders sentence-transformers' `modules.json` in `src` lists (empty without
/// the file).
pub fn module_paths(src: &Path) -> Result<Vec<String>, ImportError> {
    let path = src.join("modules.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(Vec::new());
    };
    let modules: Vec<Value> = serde_json::from_str(&text).map_err(|e| ImportError::Metadata {
        file: path.clone(),
        key: "(file)".into(),
        problem: format!("is not a JSON list of modules ({e})"),
    })?;
    Ok(modules
        .iter()
        .filter_map(|m| m.get("path")?.as_str())
        .filter(|p| !p.contains("..") && !p.starts_with('/'))
        .map(str::to_string)
        .collect())
}
