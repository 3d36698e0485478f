//! Fixture packages shaped like optimum's `text-generation-with-past` export of a Llama model
//! (transformers 4.4x, eager attention, float32, `torch.onnx` at opset 14): the graph spelled
//! out in small standard ops, as the graph passes meet it in the wild.
//!
//! `model.onnx` takes `input_ids`, `attention_mask`, `position_ids` (int64) and
//! `past_key_values.N.{key,value}` `[batch, kv_heads, past, head_size]`, and returns `logits`
//! and `present.N.{key,value}`. Per layer:
//!
//! ```text
//! RMSNorm: Pow(x, 2) -> ReduceMean(-1) -> Add(eps) -> Sqrt -> Reciprocal | Div(1, .) -> Mul(x, .)
//!          -> Mul(weight, .)              (the final norm adds float32 Casts around, as torch)
//! q/k/v:   MatMul -> Reshape(Concat(Shape(h)[:-1], [-1, d])) -> Transpose(0,2,1,3)
//! rotary:  q * cos + Concat(Neg(q[..., d/2:]), q[..., :d/2]) * sin, cos/sin computed from
//!          position_ids through inv_freq MatMul, Concat, Cos/Sin, scaling, Cast, Unsqueeze
//! KV:      Concat(past, new, axis=2) -> present; repeat_kv: Unsqueeze/Expand/Reshape
//! scores:  MatMul(q, Transpose(k)) * scale (or / sqrt(d)) + mask[..., :t] -> Softmax, with a
//!          Cast after (or before) -> MatMul(., v) -> Transpose -> Reshape -> o_proj MatMul
//!          -> residual Add
//! MLP:     RMSNorm -> gate MatMul -> Sigmoid * gate, * up MatMul -> down MatMul -> residual Add
//! ```
//!
//! The mask is built once from `attention_mask` and the cache length the way transformers'
//! `_update_causal_mask` does (`ConstantOfShape(min)`, `Trilu`, `Range`/`Greater`, `Where`
//! over padding). Half sizes in `rotate_half` and the shapes of reshapes come from `Shape`
//! arithmetic, not constants. Weights are random float32 (the fixture config's
//! `block_size` and `accuracy_level` do not apply). Next to it: `config.json`,
//! `generation_config.json` and the test tokenizer.

use std::path::Path;

use oxgen_onnx::proto::AttributeProto;
use oxgen_onnx::writer::{Dim, ModelBuilder, attr};
use oxgen_tensor::{DType, Tensor};

use crate::fixtures::{FixtureConfig, Rng, tokenizer};

/// ONNX's float type code, for `Cast`.
const FLOAT: i64 = 1;

/// A graph under construction with automatic, export-like names.
struct G {
    b: ModelBuilder,
    count: usize,
}

impl G {
    fn fresh(&mut self, hint: &str) -> String {
        self.count += 1;
        format!("/{hint}_{}", self.count)
    }

    /// A default-domain node with one output.
    fn op(&mut self, op_type: &str, inputs: &[&str], attrs: Vec<AttributeProto>) -> String {
        let out = self.fresh(op_type);
        self.b.node(op_type, "", &out, inputs, &[&out], attrs);
        out
    }

    /// A `Constant` node, as torch writes small tensors.
    fn constant(&mut self, t: Tensor) -> String {
        let out = self.fresh("Constant");
        self.b.node(
            "Constant",
            "",
            &out,
            &[],
            &[&out],
            vec![attr::tensor("value", &t)],
        );
        out
    }

    fn ints(&mut self, v: &[i64]) -> String {
        self.constant(Tensor::from_slice([v.len()], v).expect("a vector"))
    }

    fn int(&mut self, v: i64) -> String {
        self.constant(Tensor::scalar(v))
    }

    fn float(&mut self, v: f32) -> String {
        self.constant(Tensor::scalar(v))
    }

    fn weight(&mut self, name: &str, t: Tensor) -> String {
        self.b.initializer(name, t);
        name.to_string()
    }

    /// `Shape(x)[axis]` as a 0-D int64.
    fn dim(&mut self, x: &str, axis: i64) -> String {
        let shape = self.op("Shape", &[x], vec![]);
        let i = self.int(axis);
        self.op("Gather", &[&shape, &i], vec![attr::int("axis", 0)])
    }

    fn unsqueeze(&mut self, x: &str, axes: &[i64]) -> String {
        let axes = self.ints(axes);
        self.op("Unsqueeze", &[x, &axes], vec![])
    }

    fn cast_f32(&mut self, x: &str) -> String {
        self.op("Cast", &[x], vec![attr::int("to", FLOAT)])
    }

    /// `LlamaRMSNorm`; `torch_casts` adds the float32 casts torch writes around it, and
    /// `divide` spells `rsqrt` as `Div(1, Sqrt)` instead of `Reciprocal(Sqrt)`.
    fn rms_norm(
        &mut self,
        x: &str,
        weight: &str,
        eps: f32,
        torch_casts: bool,
        divide: bool,
    ) -> String {
        let xf = if torch_casts {
            self.cast_f32(x)
        } else {
            x.to_string()
        };
        let two = self.float(2.0);
        let sq = self.op("Pow", &[&xf, &two], vec![]);
        let mean = self.op(
            "ReduceMean",
            &[&sq],
            vec![attr::ints("axes", &[-1]), attr::int("keepdims", 1)],
        );
        let eps = self.float(eps);
        let var = self.op("Add", &[&mean, &eps], vec![]);
        let std = self.op("Sqrt", &[&var], vec![]);
        let inv = if divide {
            let one = self.float(1.0);
            self.op("Div", &[&one, &std], vec![])
        } else {
            self.op("Reciprocal", &[&std], vec![])
        };
        let normed = self.op("Mul", &[&xf, &inv], vec![]);
        let normed = if torch_casts {
            self.cast_f32(&normed)
        } else {
            normed
        };
        self.op("Mul", &[weight, &normed], vec![])
    }

    /// `x[..., :d/2]` and `x[..., d/2:]` with `d/2` from `Shape(x)[-1] / 2`, then
    /// `q * cos + rotate_half(q) * sin`.
    fn rotary(&mut self, x: &str, cos: &str, sin: &str) -> String {
        let d = self.dim(x, 3);
        let two = self.int(2);
        let half = self.op("Div", &[&d, &two], vec![]);
        let half = self.unsqueeze(&half, &[0]);
        let (zero, end, last) = (self.ints(&[0]), self.ints(&[i64::MAX]), self.ints(&[-1]));
        let x1 = self.op("Slice", &[x, &zero, &half, &last], vec![]);
        let x2 = self.op("Slice", &[x, &half, &end, &last], vec![]);
        let neg = self.op("Neg", &[&x2], vec![]);
        let rotated = self.op("Concat", &[&neg, &x1], vec![attr::int("axis", -1)]);
        let a = self.op("Mul", &[x, cos], vec![]);
        let b = self.op("Mul", &[&rotated, sin], vec![]);
        self.op("Add", &[&a, &b], vec![])
    }

    /// `[b, s, hidden]` -> `[b, heads, s, d]` with the shape from `Shape(h)[:-1] + [-1, d]`.
    fn split_heads(&mut self, x: &str, input_shape: &str, head_size: usize) -> String {
        let tail = self.ints(&[-1, head_size as i64]);
        let shape = self.op("Concat", &[input_shape, &tail], vec![attr::int("axis", 0)]);
        let r = self.op("Reshape", &[x, &shape], vec![]);
        self.op("Transpose", &[&r], vec![attr::ints("perm", &[0, 2, 1, 3])])
    }

    /// transformers' `repeat_kv`: `[b, kv, t, d]` -> `[b, kv * n_rep, t, d]`.
    fn repeat_kv(&mut self, x: &str, kv_heads: usize, n_rep: usize, head_size: usize) -> String {
        if n_rep == 1 {
            return x.to_string();
        }
        let b = self.dim(x, 0);
        let t = self.dim(x, 2);
        let (b, t) = (self.unsqueeze(&b, &[0]), self.unsqueeze(&t, &[0]));
        let mid = self.ints(&[kv_heads as i64, n_rep as i64]);
        let d = self.ints(&[head_size as i64]);
        let expand_to = self.op("Concat", &[&b, &mid, &t, &d], vec![attr::int("axis", 0)]);
        let u = self.unsqueeze(x, &[2]);
        let e = self.op("Expand", &[&u, &expand_to], vec![]);
        let heads = self.ints(&[(kv_heads * n_rep) as i64]);
        let shape = self.op("Concat", &[&b, &heads, &t, &d], vec![attr::int("axis", 0)]);
        self.op("Reshape", &[&e, &shape], vec![])
    }
}

/// A random `[rows, cols]` f32 matrix with entries of variance ~1/rows, so activations stay
/// O(1) through a `MatMul` with it.
fn matrix(rng: &mut Rng, rows: usize, cols: usize) -> Tensor {
    let scale = (3.0 / rows as f32).sqrt();
    let v: Vec<f32> = (0..rows * cols).map(|_| scale * rng.uniform()).collect();
    Tensor::from_slice([rows, cols], &v).expect("sizes match")
}

fn norm_weight(rng: &mut Rng, n: usize) -> Tensor {
    let v: Vec<f32> = (0..n).map(|_| 1.0 + 0.1 * rng.uniform()).collect();
    Tensor::from_slice([n], &v).expect("sizes match")
}

/// The model, with random weights drawn from `Rng::new(cfg.seed)`.
pub fn build_model(cfg: &FixtureConfig) -> ModelBuilder {
    let (h, heads, kv, d) = (cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_size());
    let vocab = tokenizer::VOCAB_SIZE;
    let eps = 1e-5f32;
    let mut rng = Rng::new(cfg.seed);
    let mut g = G {
        b: ModelBuilder::new("oxgen-testkit optimum-style fixture"),
        count: 0,
    };
    g.b.opset("", 14);
    let batch = Dim::from("batch_size");
    let seq = Dim::from("sequence_length");
    let past = Dim::from("past_sequence_length");
    let total = Dim::from("past_sequence_length + sequence_length");
    g.b.input("input_ids", DType::I64, &[batch.clone(), seq.clone()]);
    g.b.input(
        "attention_mask",
        DType::I64,
        &[batch.clone(), total.clone()],
    );
    g.b.input("position_ids", DType::I64, &[batch.clone(), seq.clone()]);
    for l in 0..cfg.layers {
        for kind in ["key", "value"] {
            let dims = [batch.clone(), Dim::Fixed(kv), past.clone(), Dim::Fixed(d)];
            g.b.input(&format!("past_key_values.{l}.{kind}"), DType::F32, &dims);
        }
    }
    g.b.output(
        "logits",
        DType::F32,
        &[batch.clone(), seq.clone(), Dim::Fixed(vocab)],
    );
    for l in 0..cfg.layers {
        for kind in ["key", "value"] {
            let dims = [batch.clone(), Dim::Fixed(kv), total.clone(), Dim::Fixed(d)];
            g.b.output(&format!("present.{l}.{kind}"), DType::F32, &dims);
        }
    }

    let table = matrix(&mut rng, vocab, h);
    let embed = g.weight("model.embed_tokens.weight", table);
    let mut x = g.op("Gather", &[&embed, "input_ids"], vec![attr::int("axis", 0)]);

    // Rotary tables from position_ids (LlamaRotaryEmbedding), once for all layers.
    let inv_freq: Vec<f32> = (0..d / 2)
        .map(|i| 1.0 / cfg.rope_theta.powf(2.0 * i as f32 / d as f32))
        .collect();
    let inv_freq = g.weight(
        "model.rotary_emb.inv_freq",
        Tensor::from_slice([d / 2], &inv_freq).expect("sizes"),
    );
    let inv3 = g.unsqueeze(&inv_freq, &[0, 2]);
    let pos_batch = g.dim("position_ids", 0);
    let pos_batch = g.unsqueeze(&pos_batch, &[0]);
    let ones = g.ints(&[1, 1]);
    let expand_to = g.op("Concat", &[&pos_batch, &ones], vec![attr::int("axis", 0)]);
    let inv_expanded = g.op("Expand", &[&inv3, &expand_to], vec![]);
    let pos = g.unsqueeze("position_ids", &[1]);
    let pos = g.cast_f32(&pos);
    let freqs = g.op("MatMul", &[&inv_expanded, &pos], vec![]);
    let freqs = g.op("Transpose", &[&freqs], vec![attr::ints("perm", &[0, 2, 1])]);
    let emb = g.op("Concat", &[&freqs, &freqs], vec![attr::int("axis", -1)]);
    let attention_scaling = g.float(1.0);
    let cos = g.op("Cos", &[&emb], vec![]);
    let cos = g.op("Mul", &[&cos, &attention_scaling], vec![]);
    let cos = g.cast_f32(&cos);
    let sin = g.op("Sin", &[&emb], vec![]);
    let sin = g.op("Mul", &[&sin, &attention_scaling], vec![]);
    let sin = g.cast_f32(&sin);

    // The causal + padding mask (_update_causal_mask), [b, 1, s, t].
    let b = g.dim(&x, 0);
    let s = g.dim(&x, 1);
    let cached = g.dim("past_key_values.0.key", 2);
    let end = g.op("Add", &[&cached, &s], vec![]);
    let step = g.int(1);
    let cache_position = g.op("Range", &[&cached, &end, &step], vec![]);
    let target = g.dim("attention_mask", 1);
    let (s1, t1) = (g.unsqueeze(&s, &[0]), g.unsqueeze(&target, &[0]));
    let full_shape = g.op("Concat", &[&s1, &t1], vec![attr::int("axis", 0)]);
    let min = Tensor::from_slice([1], &[f32::MIN]).expect("one value");
    let full = g.op(
        "ConstantOfShape",
        &[&full_shape],
        vec![attr::tensor("value", &min)],
    );
    let diagonal = g.int(1);
    let upper = g.op("Trilu", &[&full, &diagonal], vec![attr::int("upper", 1)]);
    let zero = g.int(0);
    let keys = g.op("Range", &[&zero, &target, &step], vec![]);
    let column = g.ints(&[-1, 1]);
    let rows = g.op("Reshape", &[&cache_position, &column], vec![]);
    let after = g.op("Greater", &[&keys, &rows], vec![]);
    let after = g.cast_f32(&after);
    let causal = g.op("Mul", &[&upper, &after], vec![]);
    let causal = g.unsqueeze(&causal, &[0, 1]);
    let b1 = g.unsqueeze(&b, &[0]);
    let one = g.ints(&[1]);
    let to4 = g.op("Concat", &[&b1, &one, &s1, &t1], vec![attr::int("axis", 0)]);
    let causal = g.op("Expand", &[&causal, &to4], vec![]);
    let padding = g.unsqueeze("attention_mask", &[1, 2]);
    let padding = g.cast_f32(&padding);
    let sum = g.op("Add", &[&causal, &padding], vec![]);
    let zero_f = g.float(0.0);
    let padded = g.op("Equal", &[&sum, &zero_f], vec![]);
    let min_scalar = g.float(f32::MIN);
    let mask = g.op("Where", &[&padded, &min_scalar, &causal], vec![]);

    let n_rep = heads / kv;
    let scale = 1.0 / (d as f32).sqrt();
    for l in 0..cfg.layers {
        let p = format!("model.layers.{l}");
        let w = |rng: &mut Rng, g: &mut G, name: &str, rows: usize, cols: usize| {
            g.weight(&format!("{p}.{name}"), matrix(rng, rows, cols))
        };
        let input_norm = g.weight(
            &format!("{p}.input_layernorm.weight"),
            norm_weight(&mut rng, h),
        );
        let wq = w(&mut rng, &mut g, "self_attn.q_proj.weight", h, heads * d);
        let wk = w(&mut rng, &mut g, "self_attn.k_proj.weight", h, kv * d);
        let wv = w(&mut rng, &mut g, "self_attn.v_proj.weight", h, kv * d);
        let wo = w(&mut rng, &mut g, "self_attn.o_proj.weight", heads * d, h);
        let post_norm = g.weight(
            &format!("{p}.post_attention_layernorm.weight"),
            norm_weight(&mut rng, h),
        );
        let wg = w(
            &mut rng,
            &mut g,
            "mlp.gate_proj.weight",
            h,
            cfg.intermediate,
        );
        let wu = w(&mut rng, &mut g, "mlp.up_proj.weight", h, cfg.intermediate);
        let wd = w(
            &mut rng,
            &mut g,
            "mlp.down_proj.weight",
            cfg.intermediate,
            h,
        );

        let normed = g.rms_norm(&x, &input_norm, eps, false, l % 2 == 1);
        let shape = g.op("Shape", &[&normed], vec![]);
        let (start, stop, axis0) = (g.ints(&[0]), g.ints(&[-1]), g.ints(&[0]));
        let input_shape = g.op("Slice", &[&shape, &start, &stop, &axis0], vec![]);
        let q = g.op("MatMul", &[&normed, &wq], vec![]);
        let k = g.op("MatMul", &[&normed, &wk], vec![]);
        let v = g.op("MatMul", &[&normed, &wv], vec![]);
        let q = g.split_heads(&q, &input_shape, d);
        let k = g.split_heads(&k, &input_shape, d);
        let v = g.split_heads(&v, &input_shape, d);
        let cos4 = g.unsqueeze(&cos, &[1]);
        let sin4 = g.unsqueeze(&sin, &[1]);
        let q = g.rotary(&q, &cos4, &sin4);
        let k = g.rotary(&k, &cos4, &sin4);
        let (pk, pv) = (
            format!("past_key_values.{l}.key"),
            format!("past_key_values.{l}.value"),
        );
        let (ok, ov) = (format!("present.{l}.key"), format!("present.{l}.value"));
        g.b.node(
            "Concat",
            "",
            &ok,
            &[&pk, &k],
            &[&ok],
            vec![attr::int("axis", -2)],
        );
        g.b.node(
            "Concat",
            "",
            &ov,
            &[&pv, &v],
            &[&ov],
            vec![attr::int("axis", -2)],
        );
        let keys = g.repeat_kv(&ok, kv, n_rep, d);
        let values = g.repeat_kv(&ov, kv, n_rep, d);
        let kt = g.op(
            "Transpose",
            &[&keys],
            vec![attr::ints("perm", &[0, 1, 3, 2])],
        );
        let scores = g.op("MatMul", &[&q, &kt], vec![]);
        // Newer transformers multiply by `scaling`, older ones divide by sqrt(head_dim).
        let scores = if l % 2 == 0 {
            let scale = g.float(scale);
            g.op("Mul", &[&scores, &scale], vec![])
        } else {
            let root = g.float((d as f32).sqrt());
            g.op("Div", &[&scores, &root], vec![])
        };
        let t = g.dim(&ok, 2);
        let t = g.unsqueeze(&t, &[0]);
        let (zero, three) = (g.ints(&[0]), g.ints(&[3]));
        let layer_mask = g.op("Slice", &[&mask, &zero, &t, &three], vec![]);
        let scores = g.op("Add", &[&scores, &layer_mask], vec![]);
        // `softmax(x, dtype=float32).to(dtype)`: the cast lands before or after the Softmax.
        let probs = if l % 2 == 0 {
            let probs = g.op("Softmax", &[&scores], vec![attr::int("axis", -1)]);
            g.cast_f32(&probs)
        } else {
            let scores = g.cast_f32(&scores);
            g.op("Softmax", &[&scores], vec![attr::int("axis", -1)])
        };
        let out = g.op("MatMul", &[&probs, &values], vec![]);
        let out = g.op(
            "Transpose",
            &[&out],
            vec![attr::ints("perm", &[0, 2, 1, 3])],
        );
        let minus_one = g.ints(&[-1]);
        let merged = g.op(
            "Concat",
            &[&input_shape, &minus_one],
            vec![attr::int("axis", 0)],
        );
        let out = g.op("Reshape", &[&out, &merged], vec![]);
        let out = g.op("MatMul", &[&out, &wo], vec![]);
        let hidden = g.op("Add", &[&x, &out], vec![]);

        let normed = g.rms_norm(&hidden, &post_norm, eps, false, l % 2 == 0);
        let gate = g.op("MatMul", &[&normed, &wg], vec![]);
        let sig = g.op("Sigmoid", &[&gate], vec![]);
        let act = g.op("Mul", &[&gate, &sig], vec![]);
        let up = g.op("MatMul", &[&normed, &wu], vec![]);
        let gated = g.op("Mul", &[&act, &up], vec![]);
        let down = g.op("MatMul", &[&gated, &wd], vec![]);
        x = g.op("Add", &[&hidden, &down], vec![]);
    }
    let final_norm = g.weight("model.norm.weight", norm_weight(&mut rng, h));
    let normed = g.rms_norm(&x, &final_norm, eps, true, false);
    let head = g.weight("lm_head.weight", matrix(&mut rng, h, vocab));
    g.b.node(
        "MatMul",
        "",
        "/lm_head/MatMul",
        &[&normed, &head],
        &["logits"],
        vec![],
    );
    g.b
}

/// `config.json` of the fixture (transformers' `LlamaConfig` fields the runtime reads).
pub fn config_json(cfg: &FixtureConfig) -> String {
    serde_json::to_string_pretty(&serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.hidden,
        "intermediate_size": cfg.intermediate,
        "num_hidden_layers": cfg.layers,
        "num_attention_heads": cfg.heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.head_size(),
        "max_position_embeddings": cfg.context,
        "rms_norm_eps": 1e-5,
        "rope_theta": cfg.rope_theta,
        "bos_token_id": tokenizer::BOS,
        "eos_token_id": tokenizer::EOS,
        "vocab_size": tokenizer::VOCAB_SIZE,
        "tie_word_embeddings": false,
        "torch_dtype": "float32",
        "use_cache": true
    }))
    .expect("a JSON value serializes")
}

/// `generation_config.json`, with the EOS ids as a list (as recent exports write them).
pub fn generation_config_json() -> String {
    serde_json::to_string_pretty(&serde_json::json!({
        "bos_token_id": tokenizer::BOS,
        "eos_token_id": [tokenizer::EOS],
        "pad_token_id": tokenizer::EOS
    }))
    .expect("a JSON value serializes")
}

/// Writes an optimum-style package into `dir`: `model.onnx`, `config.json`,
/// `generation_config.json`, `tokenizer.json`, `tokenizer_config.json`.
pub fn write_optimum_package(dir: &Path, cfg: &FixtureConfig) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    build_model(cfg)
        .save(&dir.join("model.onnx"), None)
        .map_err(std::io::Error::other)?;
    std::fs::write(dir.join("config.json"), config_json(cfg))?;
    std::fs::write(dir.join("generation_config.json"), generation_config_json())?;
    std::fs::write(dir.join("tokenizer.json"), tokenizer::json())?;
    std::fs::write(dir.join("tokenizer_config.json"), tokenizer::config_json())?;
    Ok(())
}
