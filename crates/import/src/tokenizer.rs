//! The package's tokenizer files from GGUF tokenizer metadata: `tokenizer.json` (Hugging
//! Face format), `tokenizer_config.json` and `generation_config.json`.
//!
//! Only byte-level BPE vocabularies (`tokenizer.ggml.model = "gpt2"`) are mapped. The
//! vocabulary is `tokenizer.ggml.tokens` (already in GPT-2's byte-to-unicode alphabet), the
//! merges `tokenizer.ggml.merges` (`"left right"`, by rank). `tokenizer.ggml.token_type`
//! marks added tokens: 3 (control) become special added tokens, 4 (user-defined) non-special
//! added tokens — the inverse of `convert_hf_to_gguf.py`, which writes an HF added token as
//! control when it is special and user-defined otherwise. Both kinds are matched whole in
//! the text before BPE, as llama.cpp does.
//!
//! # Pre-tokenizers
//!
//! `tokenizer.ggml.pre` names the split llama.cpp applies before BPE
//! (`src/llama-vocab.cpp`, `llm_tokenizer_bpe`); each supported name maps to the Hugging Face
//! pre-tokenizer that splits the same way (the one the original `tokenizer.json` carries):
//!
//! | pre | llama.cpp regexes | Hugging Face |
//! |---|---|---|
//! | `gpt-2`, `gpt2` | GPT-2's | `ByteLevel(use_regex)` |
//! | `smollm`, `starcoder` | `\p{N}`, then GPT-2's | `Digits(individual_digits)`, `ByteLevel(use_regex)` |
//! | `llama-bpe`, `llama3`, `llama-v3` | Llama 3's (`\p{N}{1,3}`, ...) | `Split(Llama 3 regex, Isolated)`, `ByteLevel` (merges ignored for whole-vocab words) |
//! | `qwen2` | Qwen2's (`\p{N}`, ...) | `Split(Qwen2 regex, Isolated)`, `ByteLevel` |
//!
//! llama.cpp spells `(?i:'s|...)` as `'[sS]|...` for its own regex engine; the Hugging Face
//! regexes below are the originals. Any other name is an error that names it: guessing
//! would silently change token ids.

use std::collections::HashMap;
use std::path::PathBuf;

use oxgen_gguf::GgufFile;
use serde_json::{Value, json};

use crate::ImportError;

/// `tokenizer.ggml.token_type` values (llama.cpp `llama_token_type`).
const TOKEN_CONTROL: i32 = 3;
const TOKEN_USER_DEFINED: i32 = 4;

const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The supported `tokenizer.ggml.pre` names.
pub const SUPPORTED_PRE: &[&str] = &[
    "gpt-2",
    "gpt2",
    "smollm",
    "starcoder",
    "llama-bpe",
    "llama3",
    "llama-v3",
    "qwen2",
];

/// The pre-tokenizer JSON for `pre`, whether BPE ignores merges for words already in the
/// vocabulary, and whether llama.cpp adds BOS by default for it.
fn pre_tokenizer(pre: &str) -> Option<(Value, bool, bool)> {
    let byte_level = |use_regex: bool, trim_offsets: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": trim_offsets, "use_regex": use_regex});
    let split = |regex: &str, trim_offsets: bool| {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
            byte_level(false, trim_offsets)
        ]})
    };
    Some(match pre {
        "gpt-2" | "gpt2" => (byte_level(true, true), false, false),
        "smollm" | "starcoder" => (
            json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                byte_level(true, true)
            ]}),
            false,
            false,
        ),
        "llama-bpe" | "llama3" | "llama-v3" => (split(LLAMA3_REGEX, true), true, true),
        "qwen2" => (split(QWEN2_REGEX, false), false, false),
        _ => return None,
    })
}

/// The tokenizer files' contents.
#[derive(Debug, Clone)]
pub struct TokenizerFiles {
    pub tokenizer_json: String,
    pub tokenizer_config_json: String,
    pub generation_config_json: String,
    /// Vocabulary size (`tokenizer.ggml.tokens`).
    pub vocab: usize,
    pub bos: Option<u32>,
    pub eos: Vec<u32>,
    pub pad: Option<u32>,
}

struct Meta<'a> {
    file: &'a GgufFile,
}

impl Meta<'_> {
    fn err(&self, problem: String) -> ImportError {
        ImportError::Tokenizer {
            file: self.file.path().to_path_buf(),
            problem,
        }
    }

    /// An optional token id, checked to be in the vocabulary.
    fn id(&self, key: &str, vocab: usize) -> Result<Option<u32>, ImportError> {
        if self.file.get(key).is_none() {
            return Ok(None);
        }
        let id = self.file.get_u32(key)?;
        if id as usize >= vocab {
            return Err(self.err(format!(
                "{key} = {id} is not a token id (the vocabulary has {vocab} tokens)"
            )));
        }
        Ok(Some(id))
    }

    fn optional_bool(&self, key: &str) -> Result<Option<bool>, ImportError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(_) => Ok(Some(self.file.get_bool(key)?)),
        }
    }
}

/// Builds the tokenizer files; `context` is the model's context length.
pub fn build(file: &GgufFile, context: usize) -> Result<TokenizerFiles, ImportError> {
    let m = Meta { file };
    let path = || -> PathBuf { file.path().to_path_buf() };
    let model = file.get_str("tokenizer.ggml.model")?;
    if model != "gpt2" {
        return Err(ImportError::Unsupported {
            file: path(),
            what: format!("tokenizer.ggml.model '{model}'"),
            hint: "only byte-level BPE vocabularies ('gpt2') are mapped to tokenizer.json; \
                   SentencePiece ('llama') vocabularies come later"
                .into(),
        });
    }
    let pre = match file.get("tokenizer.ggml.pre") {
        Some(_) => file.get_str("tokenizer.ggml.pre")?,
        None => {
            return Err(m.err(
                "tokenizer.ggml.pre is missing, so the pre-tokenizer is unknown; re-convert \
                 the model with a current llama.cpp convert_hf_to_gguf.py"
                    .into(),
            ));
        }
    };
    let (pre_tokenizer, ignore_merges, default_add_bos) =
        pre_tokenizer(pre).ok_or_else(|| ImportError::Unsupported {
            file: path(),
            what: format!("pre-tokenizer '{pre}' (tokenizer.ggml.pre)"),
            hint: format!(
                "supported: {}; another split would silently change token ids",
                SUPPORTED_PRE.join(", ")
            ),
        })?;

    let tokens = file.get_str_array("tokenizer.ggml.tokens")?;
    let vocab_size = tokens.len();
    if vocab_size == 0 || vocab_size > u32::MAX as usize {
        return Err(m.err(format!("tokenizer.ggml.tokens has {vocab_size} tokens")));
    }
    let types: Option<&[i32]> = match file.get("tokenizer.ggml.token_type") {
        None => None,
        Some(_) => Some(file.get_i32_array("tokenizer.ggml.token_type")?),
    };
    if let Some(t) = types
        && t.len() != vocab_size
    {
        return Err(m.err(format!(
            "tokenizer.ggml.token_type has {} entries for {vocab_size} tokens",
            t.len()
        )));
    }
    let mut vocab = serde_json::Map::new();
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(vocab_size);
    for (i, tok) in tokens.iter().enumerate() {
        if tok.is_empty() {
            return Err(m.err(format!("token {i} is the empty string")));
        }
        if let Some(first) = ids.insert(tok, i) {
            return Err(m.err(format!(
                "token {i} {tok:?} repeats token {first}; a tokenizer.json vocabulary maps each \
                 string to one id"
            )));
        }
        vocab.insert(tok.clone(), i.into());
    }

    let merges = file.get_str_array("tokenizer.ggml.merges")?;
    let mut pairs = Vec::with_capacity(merges.len());
    for (rank, merge) in merges.iter().enumerate() {
        let pair = merge
            .split_once(' ')
            .filter(|(a, b)| !a.is_empty() && !b.is_empty() && !b.contains(' '));
        let Some((a, b)) = pair else {
            return Err(m.err(format!(
                "merge {rank} {merge:?} is not two tokens separated by one space"
            )));
        };
        for part in [a, b, &format!("{a}{b}")] {
            if !ids.contains_key(part) {
                return Err(m.err(format!(
                    "merge {rank} {merge:?} refers to {part:?}, which is not in the vocabulary"
                )));
            }
        }
        pairs.push(json!([a, b]));
    }

    let added: Vec<Value> = types
        .into_iter()
        .flatten()
        .enumerate()
        .filter(|(_, t)| matches!(**t, TOKEN_CONTROL | TOKEN_USER_DEFINED))
        .map(|(i, t)| {
            json!({"id": i, "content": tokens[i], "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": *t == TOKEN_CONTROL})
        })
        .collect();

    let bos = m.id("tokenizer.ggml.bos_token_id", vocab_size)?;
    let eos_id = m.id("tokenizer.ggml.eos_token_id", vocab_size)?;
    let eot = m.id("tokenizer.ggml.eot_token_id", vocab_size)?;
    let pad = m.id("tokenizer.ggml.padding_token_id", vocab_size)?;
    let unk = m.id("tokenizer.ggml.unknown_token_id", vocab_size)?;
    let Some(eos_id) = eos_id else {
        return Err(
            m.err("tokenizer.ggml.eos_token_id is missing: generation would never stop".into())
        );
    };
    let mut eos = vec![eos_id];
    if let Some(e) = eot.filter(|&e| e != eos_id) {
        eos.push(e);
    }
    let add_bos = m
        .optional_bool("tokenizer.ggml.add_bos_token")?
        .unwrap_or(default_add_bos);
    let add_eos = m
        .optional_bool("tokenizer.ggml.add_eos_token")?
        .unwrap_or(false);
    if add_bos && bos.is_none() {
        return Err(m.err(
            "tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is missing"
                .into(),
        ));
    }
    let text = |id: Option<u32>| id.map(|i| tokens[i as usize].clone());

    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    let post_processor = post_processor(
        add_bos.then_some(bos).flatten(),
        add_eos.then_some(eos_id),
        tokens,
    );
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor.unwrap_or_else(|| byte_level.clone()),
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": text(unk), "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": ignore_merges,
            "vocab": vocab,
            "merges": pairs
        }
    });

    let mut config = serde_json::Map::new();
    config.insert("add_bos_token".into(), add_bos.into());
    config.insert("add_eos_token".into(), add_eos.into());
    for (key, id) in [
        ("bos_token", bos),
        ("eos_token", Some(eos_id)),
        ("pad_token", pad),
        ("unk_token", unk),
    ] {
        if let Some(t) = text(id) {
            config.insert(key.into(), t.into());
        }
    }
    if file.get("tokenizer.chat_template").is_some() {
        let template = file.get_str("tokenizer.chat_template")?;
        config.insert("chat_template".into(), template.into());
    }
    config.insert("clean_up_tokenization_spaces".into(), false.into());
    config.insert("model_max_length".into(), context.into());
    config.insert("tokenizer_class".into(), "PreTrainedTokenizerFast".into());

    let mut generation = serde_json::Map::new();
    if let Some(b) = bos {
        generation.insert("bos_token_id".into(), b.into());
    }
    generation.insert(
        "eos_token_id".into(),
        if eos.len() == 1 {
            eos[0].into()
        } else {
            eos.clone().into()
        },
    );
    if let Some(p) = pad {
        generation.insert("pad_token_id".into(), p.into());
    }

    let pretty = |v: &Value| serde_json::to_string_pretty(v).expect("a JSON value serializes");
    Ok(TokenizerFiles {
        tokenizer_json: pretty(&tokenizer),
        tokenizer_config_json: pretty(&Value::Object(config)),
        generation_config_json: pretty(&Value::Object(generation)),
        vocab: vocab_size,
        bos,
        eos,
        pad,
    })
}

/// A `TemplateProcessing` adding BOS and/or EOS around each sequence, or `None`.
fn post_processor(bos: Option<u32>, eos: Option<u32>, tokens: &[String]) -> Option<Value> {
    if bos.is_none() && eos.is_none() {
        return None;
    }
    let special = |id: u32| json!({"SpecialToken": {"id": tokens[id as usize], "type_id": 0}});
    let sequence = |name: &str| json!({"Sequence": {"id": name, "type_id": 0}});
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials = serde_json::Map::new();
    for (ids, seq) in [(&mut single, vec!["A"]), (&mut pair, vec!["A", "B"])] {
        for name in seq {
            ids.extend(bos.map(special));
            ids.push(sequence(name));
            ids.extend(eos.map(special));
        }
    }
    for id in bos.into_iter().chain(eos) {
        let t = &tokens[id as usize];
        specials.insert(t.clone(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    Some(
        json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials}),
    )
}
