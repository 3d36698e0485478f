//! Small random-weight encoders as Hugging Face saves them (`config.json`,
//! `model.safetensors`, a WordPiece `tokenizer.json`, sentence-transformers' `modules.json`
//! and `1_Pooling/config.json`), and the package `oxgen import` makes of one: BERT and
//! RoBERTa, as feature extractors or `...ForSequenceClassification` cross-encoders.

use std::path::Path;

use oxgen_import::safetensors::write_f32;
use oxgen_import::{EncoderArch, ImportOptions};
use serde_json::json;

use crate::Rng;

/// What fixture to write.
#[derive(Debug, Clone, Copy)]
pub struct EncoderFixture {
    pub arch: EncoderArch,
    /// `None`: a feature extractor (`last_hidden_state`); `Some(n)`: a classifier of n labels.
    pub labels: Option<usize>,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub intermediate: usize,
    pub max_positions: usize,
    /// The pooling `1_Pooling/config.json` names (`cls`, `mean`, `max`), with `Normalize`.
    pub pooling: &'static str,
    pub seed: u64,
}

impl Default for EncoderFixture {
    fn default() -> Self {
        EncoderFixture {
            arch: EncoderArch::Bert,
            labels: None,
            layers: 3,
            hidden: 64,
            heads: 4,
            intermediate: 128,
            max_positions: 40,
            pooling: "mean",
            seed: 11,
        }
    }
}

/// Words of the fixture's vocabulary (after the special tokens, the letters and `##`
/// letters).
const WORDS: &[&str] = &[
    "the", "a", "an", "is", "are", "of", "in", "on", "to", "and", "how", "many", "people", "live",
    "berlin", "paris", "city", "capital", "france", "germany", "quick", "brown", "fox", "jumps",
    "over", "lazy", "dog", "cat", "eats", "food", "man", "woman", "horse", "music", "play",
    "##ing", "##ed", ".", ",", "?", "!",
];

/// The vocabulary: `[PAD] [UNK] [CLS] [SEP] [MASK]`, the letters, the `##` letters, the
/// digits, then [`WORDS`].
fn vocab() -> Vec<String> {
    let mut v: Vec<String> = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        .map(String::from)
        .to_vec();
    v.extend(('a'..='z').map(|c| c.to_string()));
    v.extend(('a'..='z').map(|c| format!("##{c}")));
    v.extend(('0'..='9').map(|c| c.to_string()));
    v.extend(WORDS.iter().map(|w| w.to_string()));
    v
}

/// BERT's `tokenizer.json` over [`vocab`]: lowercasing normalizer, WordPiece,
/// `[CLS] A [SEP] (B [SEP])`.
pub fn tokenizer_json() -> String {
    let vocab: serde_json::Map<String, serde_json::Value> = vocab()
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, json!(i)))
        .collect();
    let special = |t: &str, id: usize| {
        json!({"id": id, "content": t, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special("[PAD]", 0), special("[UNK]", 1), special("[CLS]", 2),
                         special("[SEP]", 3), special("[MASK]", 4)],
        "normalizer": {"type": "BertNormalizer", "clean_text": true,
                       "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "special_tokens": {
                "[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}
            }
        },
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab}
    })
    .to_string()
}

/// Writes the Hugging Face folder of `f` into `dir`.
pub fn write_hf_folder(dir: &Path, f: &EncoderFixture) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("1_Pooling"))?;
    let vocab = vocab().len();
    let (h, inter) = (f.hidden, f.intermediate);
    assert!(
        f.arch != EncoderArch::ModernBert,
        "ModernBERT's fixture is committed (thirdparty/embeddings/modernbert), not generated"
    );
    // RoBERTa's positions start after the padding id (1 there; 0 for BERT).
    let (pad, type_vocab) = match f.arch {
        EncoderArch::Roberta => (1, 1),
        _ => (0, 2),
    };
    let (prefix, model_type) = match (f.arch, f.labels) {
        (EncoderArch::Roberta, None) => ("", "roberta"),
        (EncoderArch::Roberta, Some(_)) => ("roberta.", "roberta"),
        (_, None) => ("", "bert"),
        (_, Some(_)) => ("bert.", "bert"),
    };
    let architecture = match (f.arch, f.labels) {
        (EncoderArch::Roberta, None) => "RobertaModel",
        (EncoderArch::Roberta, Some(_)) => "RobertaForSequenceClassification",
        (_, None) => "BertModel",
        (_, Some(_)) => "BertForSequenceClassification",
    };
    let mut config = json!({
        "architectures": [architecture], "model_type": model_type, "hidden_act": "gelu",
        "hidden_size": h, "intermediate_size": inter, "layer_norm_eps": 1e-12,
        "max_position_embeddings": f.max_positions, "num_attention_heads": f.heads,
        "num_hidden_layers": f.layers, "pad_token_id": pad, "type_vocab_size": type_vocab,
        "vocab_size": vocab, "position_embedding_type": "absolute",
    });
    if let Some(labels) = f.labels {
        config["num_labels"] = json!(labels);
    }
    std::fs::write(dir.join("config.json"), config.to_string())?;
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json())?;
    std::fs::write(
        dir.join("modules.json"),
        json!([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        ])
        .to_string(),
    )?;
    std::fs::write(
        dir.join("1_Pooling/config.json"),
        json!({
            "word_embedding_dimension": h,
            "pooling_mode_cls_token": f.pooling == "cls",
            "pooling_mode_mean_tokens": f.pooling == "mean",
            "pooling_mode_max_tokens": f.pooling == "max",
        })
        .to_string(),
    )?;
    std::fs::write(
        dir.join("sentence_bert_config.json"),
        json!({"max_seq_length": f.max_positions - pad - 1}).to_string(),
    )?;

    let mut w = Weights {
        rng: Rng::new(f.seed),
        tensors: Vec::new(),
    };
    let e = format!("{prefix}embeddings");
    w.add(format!("{e}.word_embeddings.weight"), &[vocab, h], 0.5, 0.0);
    w.add(
        format!("{e}.position_embeddings.weight"),
        &[f.max_positions, h],
        0.5,
        0.0,
    );
    w.add(
        format!("{e}.token_type_embeddings.weight"),
        &[type_vocab, h],
        0.5,
        0.0,
    );
    w.norm(format!("{e}.LayerNorm"), h);
    let scale = 1.0 / (h as f32).sqrt();
    let down = 1.0 / (inter as f32).sqrt();
    for l in 0..f.layers {
        let p = format!("{prefix}encoder.layer.{l}");
        for which in ["query", "key", "value"] {
            w.linear(format!("{p}.attention.self.{which}"), h, h, scale);
        }
        w.linear(format!("{p}.attention.output.dense"), h, h, scale);
        w.norm(format!("{p}.attention.output.LayerNorm"), h);
        w.linear(format!("{p}.intermediate.dense"), inter, h, scale);
        w.linear(format!("{p}.output.dense"), h, inter, down);
        w.norm(format!("{p}.output.LayerNorm"), h);
    }
    if let Some(labels) = f.labels {
        let (dense, out) = match f.arch {
            EncoderArch::Roberta => ("classifier.dense".into(), "classifier.out_proj".into()),
            _ => (format!("{prefix}pooler.dense"), "classifier".to_string()),
        };
        w.linear(dense, h, h, scale);
        w.linear(out, labels, h, 3.0 * scale);
    }
    let views: Vec<(&str, &[usize], &[f32])> = (w.tensors.iter())
        .map(|(n, s, v)| (n.as_str(), s.as_slice(), v.as_slice()))
        .collect();
    write_f32(&dir.join("model.safetensors"), &views)
}

/// The fixture's tensors as they are drawn.
struct Weights {
    rng: Rng,
    tensors: Vec<(String, Vec<usize>, Vec<f32>)>,
}

impl Weights {
    /// Values uniform in `offset ± scale`.
    fn add(&mut self, name: String, shape: &[usize], scale: f32, offset: f32) {
        let n = shape.iter().product();
        let values = (self.rng.values(n, scale).into_iter())
            .map(|v| v + offset)
            .collect();
        self.tensors.push((name, shape.to_vec(), values));
    }

    /// torch's `Linear(input, out)`: `weight` `[out, input]` and `bias`.
    fn linear(&mut self, name: String, out: usize, input: usize, scale: f32) {
        self.add(format!("{name}.weight"), &[out, input], scale, 0.0);
        self.add(format!("{name}.bias"), &[out], 0.1, 0.0);
    }

    fn norm(&mut self, name: String, h: usize) {
        self.add(format!("{name}.weight"), &[h], 0.2, 1.0);
        self.add(format!("{name}.bias"), &[h], 0.1, 0.0);
    }
}

/// Writes the fixture's Hugging Face folder under `work` and imports it into `package`.
pub fn write_package(work: &Path, package: &Path, f: &EncoderFixture) {
    let hf = work.join("hf");
    write_hf_folder(&hf, f).expect("writing the encoder fixture");
    oxgen_import::import_encoder(&hf, package, &ImportOptions::default())
        .unwrap_or_else(|e| panic!("importing the encoder fixture: {e}"));
}
