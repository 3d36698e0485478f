//! Fixture packages: small random-weight language models with the graph shape
//! onnxruntime-genai's model builder writes for Llama-style models, so model-level tests run
//! in milliseconds.
//!
//! A package folder holds `model.onnx` (+ `model.onnx.data`), `genai_config.json`,
//! `tokenizer.json` (a real byte-level BPE tokenizer in the Hugging Face format) and
//! `tokenizer_config.json`. The graph per layer:
//!
//! ```text
//! SkipSimplifiedLayerNormalization (SimplifiedLayerNormalization in layer 0)
//!   -> q/k/v MatMulNBits (4-bit) -> GroupQueryAttention (rotary inside, shared KV buffer)
//!   -> o MatMulNBits -> SkipSimplifiedLayerNormalization
//!   -> gate/up MatMulNBits -> SiLU (Sigmoid, Mul) * up -> down MatMulNBits
//! ```
//!
//! with a 4-bit `GatherBlockQuantized` embedding tied to the 4-bit `MatMulNBits` head, and
//! `seqlens_k` / `total_sequence_length` computed from `attention_mask` as the builder does.

use std::path::Path;

use oxgen_onnx::proto::AttributeProto;
use oxgen_onnx::writer::{Dim, ModelBuilder, attr};
use oxgen_tensor::{DType, Tensor};

/// Shape and quantization of a fixture model.
#[derive(Debug, Clone)]
pub struct FixtureConfig {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub intermediate: usize,
    pub context: usize,
    pub block_size: usize,
    /// MatMulNBits `accuracy_level`: 0 keeps activations f32 (the exact path).
    pub accuracy_level: i64,
    pub rope_theta: f32,
    pub seed: u64,
}

impl Default for FixtureConfig {
    fn default() -> Self {
        FixtureConfig {
            layers: 2,
            hidden: 64,
            heads: 4,
            kv_heads: 2,
            intermediate: 128,
            context: 128,
            block_size: 32,
            accuracy_level: 0,
            rope_theta: 10_000.0,
            seed: 7,
        }
    }
}

impl FixtureConfig {
    pub fn head_size(&self) -> usize {
        self.hidden / self.heads
    }
}

/// xorshift64*: a tiny deterministic generator for fixture weights.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// Random 4-bit weights for an `[n, k]` matrix in MatMulNBits layout (`B: [n, k_blocks,
/// block/2]`, `scales: [n * k_blocks]`, default zero point 8), scaled so outputs stay O(1).
fn q4_weights(rng: &mut Rng, n: usize, k: usize, block: usize) -> (Tensor, Tensor) {
    let blocks = k.div_ceil(block);
    let b = Tensor::from_slice([n, blocks, block / 2], &rng.bytes(n * blocks * block / 2))
        .expect("sizes match");
    // A nibble is in [-8, 7] after the zero point: unit-variance-ish weights at 1/(4 sqrt k).
    let base = 0.25 / (k as f32).sqrt();
    let scales: Vec<f32> = (0..n * blocks)
        .map(|_| base * (1.0 + 0.5 * rng.uniform()))
        .collect();
    (
        b,
        Tensor::from_slice([n * blocks], &scales).expect("sizes match"),
    )
}

struct Graph<'a> {
    b: ModelBuilder,
    cfg: &'a FixtureConfig,
    rng: Rng,
}

impl Graph<'_> {
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

    /// A 4-bit projection with fresh random weights.
    fn linear(&mut self, name: &str, input: &str, output: &str, k: usize, n: usize) {
        let (w, s) = q4_weights(&mut self.rng, n, k, self.cfg.block_size);
        let (wn, sn) = (format!("{name}.qweight"), format!("{name}.scales"));
        self.b.initializer(&wn, w).initializer(&sn, s);
        self.matmul_nbits(name, input, output, k, n, &wn, &sn);
    }

    #[allow(clippy::too_many_arguments)]
    fn matmul_nbits(
        &mut self,
        name: &str,
        input: &str,
        output: &str,
        k: usize,
        n: usize,
        weight: &str,
        scales: &str,
    ) {
        let attrs = vec![
            attr::int("K", k as i64),
            attr::int("N", n as i64),
            attr::int("bits", 4),
            attr::int("block_size", self.cfg.block_size as i64),
            attr::int("accuracy_level", self.cfg.accuracy_level),
        ];
        self.node(
            "MatMulNBits",
            "com.microsoft",
            name,
            &[input, weight, scales],
            &[output],
            attrs,
        );
    }

    fn norm_weight(&mut self, name: &str) -> String {
        let w: Vec<f32> = (0..self.cfg.hidden)
            .map(|_| 1.0 + 0.1 * self.rng.uniform())
            .collect();
        self.b.initializer(
            name,
            Tensor::from_slice([self.cfg.hidden], &w).expect("sizes match"),
        );
        name.to_string()
    }

    /// `SkipSimplifiedLayerNormalization(input, skip)` -> (normed, residual sum).
    fn skip_norm(&mut self, name: &str, input: &str, skip: &str, out: &str, residual: &str) {
        let w = self.norm_weight(&format!("{name}.weight"));
        self.node(
            "SkipSimplifiedLayerNormalization",
            "com.microsoft",
            name,
            &[input, skip, &w],
            &[out, "", "", residual],
            vec![attr::float("epsilon", 1e-5)],
        );
    }
}

/// Writes the model, config and tokenizer files of a fixture package into `dir`.
pub fn write_package(dir: &Path, cfg: &FixtureConfig) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let (h, hd, vocab) = (cfg.hidden, cfg.head_size(), tokenizer::VOCAB_SIZE);
    let mut g = Graph {
        b: ModelBuilder::new("oxgen-testkit fixture"),
        cfg,
        rng: Rng::new(cfg.seed),
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
    for l in 0..cfg.layers {
        for kind in ["key", "value"] {
            let dims = [
                batch.clone(),
                Dim::Fixed(cfg.kv_heads),
                "past_sequence_length".into(),
                Dim::Fixed(hd),
            ];
            g.b.input(&format!("past_key_values.{l}.{kind}"), DType::F32, &dims);
        }
    }
    g.b.output(
        "logits",
        DType::F32,
        &[batch.clone(), "sequence_length".into(), Dim::Fixed(vocab)],
    );
    for l in 0..cfg.layers {
        for kind in ["key", "value"] {
            let dims = [
                batch.clone(),
                Dim::Fixed(cfg.kv_heads),
                "total_sequence_length".into(),
                Dim::Fixed(hd),
            ];
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
    g.node(
        "Cast",
        "",
        "seqlens_k",
        &["seqlens_k_i64"],
        &["seqlens_k"],
        vec![attr::int("to", 6)],
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
        vec![attr::int("to", 6)],
    );

    // Rotary caches: cos/sin of position * theta^(-2i/d), [context, head_size / 2].
    let half = hd / 2;
    let mut cos = Vec::with_capacity(cfg.context * half);
    let mut sin = Vec::with_capacity(cfg.context * half);
    for p in 0..cfg.context {
        for i in 0..half {
            let angle = p as f64 * (cfg.rope_theta as f64).powf(-2.0 * i as f64 / hd as f64);
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    g.b.initializer(
        "cos_cache",
        Tensor::from_slice([cfg.context, half], &cos).expect("sizes match"),
    );
    g.b.initializer(
        "sin_cache",
        Tensor::from_slice([cfg.context, half], &sin).expect("sizes match"),
    );

    // Tied 4-bit embedding: the same bytes serve GatherBlockQuantized and the MatMulNBits head.
    let (w, s) = q4_weights(&mut g.rng, vocab, h, cfg.block_size);
    let blocks = h / cfg.block_size;
    let embed = w.clone().reshape([vocab, h / 2]).expect("same bytes");
    g.b.initializer("embed.qweight", embed).initializer(
        "embed.scales",
        s.clone().reshape([vocab, blocks]).expect("same count"),
    );
    g.b.initializer("lm_head.qweight", w)
        .initializer("lm_head.scales", s);
    let gbq = vec![
        attr::int("bits", 4),
        attr::int("block_size", cfg.block_size as i64),
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

    let mut residual = "embeddings".to_string();
    let mut pending: Option<String> = None;
    for l in 0..cfg.layers {
        let p = format!("layers.{l}");
        let normed = format!("{p}.input_norm");
        match pending.take() {
            None => {
                let w = g.norm_weight(&format!("{p}.input_norm.weight"));
                g.node(
                    "SimplifiedLayerNormalization",
                    "",
                    &normed,
                    &[&residual, &w],
                    &[&normed],
                    vec![attr::float("epsilon", 1e-5)],
                );
            }
            Some(mlp_out) => {
                let sum = format!("{p}.input_residual");
                g.skip_norm(&normed, &mlp_out, &residual, &normed, &sum);
                residual = sum;
            }
        }
        let (q, k, v) = (format!("{p}.q"), format!("{p}.k"), format!("{p}.v"));
        g.linear(&q, &normed, &q, h, h);
        g.linear(&k, &normed, &k, h, cfg.kv_heads * hd);
        g.linear(&v, &normed, &v, h, cfg.kv_heads * hd);
        let attn = format!("{p}.attn");
        let (pk, pv) = (
            format!("past_key_values.{l}.key"),
            format!("past_key_values.{l}.value"),
        );
        let (ok, ov) = (format!("present.{l}.key"), format!("present.{l}.value"));
        let gqa = vec![
            attr::int("num_heads", cfg.heads as i64),
            attr::int("kv_num_heads", cfg.kv_heads as i64),
            attr::int("do_rotary", 1),
            attr::int("rotary_interleaved", 0),
            attr::int("local_window_size", -1),
        ];
        g.node(
            "GroupQueryAttention",
            "com.microsoft",
            &attn,
            &[
                &q,
                &k,
                &v,
                &pk,
                &pv,
                "seqlens_k",
                "total_len",
                "cos_cache",
                "sin_cache",
            ],
            &[&attn, &ok, &ov],
            gqa,
        );
        let o = format!("{p}.o");
        g.linear(&o, &attn, &o, h, h);
        let (post, sum) = (format!("{p}.post_norm"), format!("{p}.post_residual"));
        g.skip_norm(&post, &o, &residual, &post, &sum);
        residual = sum;
        let (gate, up, down) = (format!("{p}.gate"), format!("{p}.up"), format!("{p}.down"));
        g.linear(&gate, &post, &gate, h, cfg.intermediate);
        g.linear(&up, &post, &up, h, cfg.intermediate);
        let (sig, act, prod) = (
            format!("{p}.gate_sigmoid"),
            format!("{p}.silu"),
            format!("{p}.gated"),
        );
        g.node("Sigmoid", "", &sig, &[&gate], &[&sig], vec![]);
        g.node("Mul", "", &act, &[&gate, &sig], &[&act], vec![]);
        g.node("Mul", "", &prod, &[&act, &up], &[&prod], vec![]);
        g.linear(&down, &prod, &down, cfg.intermediate, h);
        pending = Some(down);
    }
    let last = pending.expect("a fixture has at least one layer");
    g.skip_norm(
        "final_norm",
        &last,
        &residual,
        "final_norm",
        "final_residual",
    );
    g.matmul_nbits(
        "lm_head",
        "final_norm",
        "logits",
        h,
        vocab,
        "lm_head.qweight",
        "lm_head.scales",
    );

    g.b.save(&dir.join("model.onnx"), Some(1024))
        .map_err(std::io::Error::other)?;
    std::fs::write(dir.join("genai_config.json"), genai_config(cfg))?;
    std::fs::write(dir.join("tokenizer.json"), tokenizer::json())?;
    std::fs::write(dir.join("tokenizer_config.json"), tokenizer::config_json())?;
    Ok(())
}

fn genai_config(cfg: &FixtureConfig) -> String {
    serde_json::to_string_pretty(&serde_json::json!({
        "model": {
            "bos_token_id": tokenizer::BOS,
            "context_length": cfg.context,
            "eos_token_id": [tokenizer::EOS],
            "pad_token_id": tokenizer::EOS,
            "type": "llama",
            "vocab_size": tokenizer::VOCAB_SIZE,
            "decoder": {
                "filename": "model.onnx",
                "head_size": cfg.head_size(),
                "hidden_size": cfg.hidden,
                "num_attention_heads": cfg.heads,
                "num_hidden_layers": cfg.layers,
                "num_key_value_heads": cfg.kv_heads,
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
            }
        },
        "search": {
            "do_sample": false,
            "max_length": cfg.context,
            "past_present_share_buffer": true,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
            "repetition_penalty": 1.0
        }
    }))
    .expect("a JSON value serializes")
}

pub mod tokenizer {
    //! A real byte-level BPE tokenizer in the Hugging Face `tokenizer.json` format: three
    //! special tokens, the 256 byte tokens (GPT-2's byte-to-unicode alphabet) and a few dozen
    //! merges of common English pieces.

    /// `<|endoftext|>`
    pub const BOS: usize = 0;
    /// `<|im_end|>`
    pub const EOS: usize = 2;
    const SPECIAL: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    const MERGES: [(&str, &str); 32] = [
        ("Ġ", "t"),
        ("h", "e"),
        ("Ġ", "a"),
        ("i", "n"),
        ("Ġt", "he"),
        ("e", "r"),
        ("o", "n"),
        ("Ġ", "s"),
        ("e", "n"),
        ("a", "t"),
        ("o", "r"),
        ("Ġ", "w"),
        ("Ġ", "o"),
        ("i", "s"),
        ("a", "n"),
        ("Ġ", "c"),
        ("e", "s"),
        ("Ġ", "b"),
        ("e", "d"),
        ("i", "t"),
        ("Ġ", "f"),
        ("a", "r"),
        ("Ġ", "p"),
        ("in", "g"),
        ("Ġ", "m"),
        ("o", "u"),
        ("Ġ", "h"),
        ("Ġ", "i"),
        ("l", "l"),
        ("Ġa", "n"),
        ("Ġan", "d"),
        ("Ġ", "d"),
    ];
    /// Specials, bytes, merges.
    pub const VOCAB_SIZE: usize = SPECIAL.len() + 256 + MERGES.len();

    /// GPT-2's reversible byte → printable char table.
    pub fn byte_chars() -> Vec<char> {
        let printable = |b: u32| {
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b)
        };
        let mut extra = 0;
        (0..256u32)
            .map(|b| {
                if printable(b) {
                    char::from_u32(b).expect("printable latin-1")
                } else {
                    extra += 1;
                    char::from_u32(255 + extra).expect("a code point above latin-1")
                }
            })
            .collect()
    }

    pub fn json() -> String {
        let mut vocab = serde_json::Map::new();
        for (i, s) in SPECIAL.iter().enumerate() {
            vocab.insert(s.to_string(), i.into());
        }
        for (b, c) in byte_chars().into_iter().enumerate() {
            vocab.insert(c.to_string(), (SPECIAL.len() + b).into());
        }
        for (a, b) in MERGES {
            let id = vocab.len();
            vocab.insert(format!("{a}{b}"), id.into());
        }
        let added: Vec<serde_json::Value> = SPECIAL
            .iter()
            .enumerate()
            .map(|(i, s)| {
                serde_json::json!({"id": i, "content": s, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true})
            })
            .collect();
        let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        serde_json::to_string_pretty(&serde_json::json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": byte_level,
            "post_processor": byte_level,
            "decoder": byte_level,
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab,
                "merges": MERGES.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>()
            }
        }))
        .expect("a JSON value serializes")
    }

    pub fn config_json() -> String {
        let template = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
        serde_json::to_string_pretty(&serde_json::json!({
            "bos_token": SPECIAL[BOS],
            "eos_token": SPECIAL[EOS],
            "unk_token": SPECIAL[BOS],
            "chat_template": template,
            "model_max_length": 8192,
            "tokenizer_class": "GPT2Tokenizer"
        }))
        .expect("a JSON value serializes")
    }
}
