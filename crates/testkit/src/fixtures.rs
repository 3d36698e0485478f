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
//! The graph is written by `oxgen_import::genai_graph`, the writer the GGUF importer uses;
//! this module only draws the random weights.

use std::path::Path;

use oxgen_import::genai_graph::{
    self, ConfigTokens, DecoderSpec, DecoderWeights, Embedding, LayerWeights, Linear, Mlp,
    NBitsLinear, Rope,
};
pub use oxgen_kernels::rng::Rng;
use oxgen_tensor::Tensor;

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

/// A random 4-bit projection (no zero points, no bias).
fn q4_linear(rng: &mut Rng, k: usize, n: usize, block: usize) -> Linear {
    let (b, scales) = q4_weights(rng, n, k, block);
    Linear::NBits(NBitsLinear {
        k,
        n,
        bits: 4,
        block_size: block,
        b,
        scales,
        zero_points: None,
        bias: None,
    })
}

fn norm_weight(rng: &mut Rng, hidden: usize) -> Tensor {
    let w: Vec<f32> = (0..hidden).map(|_| 1.0 + 0.1 * rng.uniform()).collect();
    Tensor::from_slice([hidden], &w).expect("sizes match")
}

/// The decoder's numbers for `cfg`.
pub fn decoder_spec(cfg: &FixtureConfig) -> DecoderSpec {
    DecoderSpec {
        layers: cfg.layers,
        hidden: cfg.hidden,
        heads: cfg.heads,
        kv_heads: cfg.kv_heads,
        head_size: cfg.head_size(),
        intermediate: cfg.intermediate,
        vocab: tokenizer::VOCAB_SIZE,
        context: cfg.context,
        rope: Rope::new(f64::from(cfg.rope_theta)),
        rms_eps: 1e-5,
        accuracy_level: cfg.accuracy_level,
        sliding_window: None,
        windowed_layers: None,
        multipliers: Default::default(),
        gemma: None,
        rotary_layers: Vec::new(),
        experts: None,
        io: oxgen_tensor::DType::F32,
    }
}

/// Random weights for `cfg`, drawn in a fixed order from `Rng::new(cfg.seed)`.
fn random_weights(cfg: &FixtureConfig) -> DecoderWeights {
    let mut rng = Rng::new(cfg.seed);
    let (h, hd, vocab, block) = (
        cfg.hidden,
        cfg.head_size(),
        tokenizer::VOCAB_SIZE,
        cfg.block_size,
    );
    // Tied 4-bit embedding: the same bytes serve GatherBlockQuantized and the MatMulNBits head.
    let (w, s) = q4_weights(&mut rng, vocab, h, block);
    let blocks = h / block;
    let embedding = Embedding::BlockQuantized {
        data: w.clone().reshape([vocab, h / 2]).expect("same bytes"),
        scales: s.clone().reshape([vocab, blocks]).expect("same count"),
        bits: 4,
        block_size: block,
    };
    let head = Linear::NBits(NBitsLinear {
        k: h,
        n: vocab,
        bits: 4,
        block_size: block,
        b: w,
        scales: s,
        zero_points: None,
        bias: None,
    });
    let layers = (0..cfg.layers)
        .map(|_| LayerWeights {
            qk_norm: None,
            out_norms: None,
            input_norm: norm_weight(&mut rng, h),
            q: q4_linear(&mut rng, h, h, block),
            k: q4_linear(&mut rng, h, cfg.kv_heads * hd, block),
            v: q4_linear(&mut rng, h, cfg.kv_heads * hd, block),
            o: q4_linear(&mut rng, h, h, block),
            sinks: None,
            post_norm: norm_weight(&mut rng, h),
            mlp: Mlp::Dense {
                gate: q4_linear(&mut rng, h, cfg.intermediate, block),
                up: q4_linear(&mut rng, h, cfg.intermediate, block),
                down: q4_linear(&mut rng, cfg.intermediate, h, block),
            },
        })
        .collect();
    DecoderWeights {
        embedding,
        layers,
        final_norm: norm_weight(&mut rng, h),
        head,
    }
}

/// Writes the model, config and tokenizer files of a fixture package into `dir`.
pub fn write_package(dir: &Path, cfg: &FixtureConfig) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let spec = decoder_spec(cfg);
    genai_graph::write_model(dir, "oxgen-testkit fixture", &spec, random_weights(cfg))
        .map_err(std::io::Error::other)?;
    let tokens = ConfigTokens {
        bos: Some(tokenizer::BOS as u32),
        eos: vec![tokenizer::EOS as u32],
        pad: Some(tokenizer::EOS as u32),
    };
    std::fs::write(
        dir.join("genai_config.json"),
        genai_graph::genai_config(&spec, "llama", &tokens),
    )?;
    std::fs::write(dir.join("tokenizer.json"), tokenizer::json())?;
    std::fs::write(dir.join("tokenizer_config.json"), tokenizer::config_json())?;
    Ok(())
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
        (0..=u8::MAX).map(oxgen_generate::byte_level_char).collect()
    }

    /// The markers of the tool-call families, special tokens in [`json_with_tool_markers`].
    pub const TOOL_MARKERS: [&str; 8] = [
        "<|tool_call|>",
        "<|/tool_call|>",
        "[TOOL_CALLS]",
        "<|start|>",
        "<|channel|>",
        "<|message|>",
        "<|constrain|>",
        "<|end|>",
    ];

    pub fn json() -> String {
        json_with_specials(&[])
    }

    /// The tokenizer with the last merges' ids given to the tool-call families' markers as
    /// special tokens (as Phi-4-mini's, Mistral's and gpt-oss's tokenizers have them); the
    /// vocabulary keeps its size, so every fixture model takes it.
    pub fn json_with_tool_markers() -> String {
        json_with_specials(&TOOL_MARKERS)
    }

    fn json_with_specials(extra: &[&str]) -> String {
        let merges = &MERGES[..MERGES.len() - extra.len()];
        let mut vocab = serde_json::Map::new();
        for (i, s) in SPECIAL.iter().enumerate() {
            vocab.insert(s.to_string(), i.into());
        }
        for (b, c) in byte_chars().into_iter().enumerate() {
            vocab.insert(c.to_string(), (SPECIAL.len() + b).into());
        }
        for (a, b) in merges {
            let id = vocab.len();
            vocab.insert(format!("{a}{b}"), id.into());
        }
        let specials = (SPECIAL.iter().enumerate())
            .chain((extra.iter().enumerate()).map(|(i, s)| (VOCAB_SIZE - extra.len() + i, s)));
        let mut added = Vec::new();
        for (i, s) in specials {
            vocab.insert(s.to_string(), i.into());
            added.push(
                serde_json::json!({"id": i, "content": s, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true}),
            );
        }
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
                "merges": merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>()
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
