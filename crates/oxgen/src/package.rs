//! The package's own configuration, in either layout DESIGN.md §2 accepts:
//!
//! - **onnxruntime-genai**: `genai_config.json` names the graph file, the KV input/output
//!   name templates, the context length and the EOS/BOS ids.
//! - **optimum** (`optimum-cli export onnx --task text-generation-with-past`): `config.json`
//!   (transformers' model config) next to one `model.onnx` with `past_key_values.N.{key,value}`
//!   inputs and `present.N.{key,value}` outputs; EOS/BOS come from `generation_config.json`
//!   when it has them, else from `config.json`; the context is `max_position_embeddings`.
//!
//! A folder is one or the other by which config file it holds, never by a model's name. Layer
//! count, KV heads and head size are read from the graph (`LmContract`); what the config
//! files declare about them is kept so [`PackageConfig::check_contract`] can catch a config
//! and a graph that come from different exports.

use std::path::Path;

use oxgen_runtime::{KvTemplates, LmContract};
use serde_json::Value;

use crate::Error;

/// Which exporter's layout a package folder has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackageFormat {
    /// `genai_config.json` (onnxruntime-genai's model builder, `oxgen import`).
    Genai,
    /// `config.json` + `model.onnx` (Hugging Face optimum).
    Optimum,
}

/// What the config files declare about the graph's shape (absent keys are `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeclaredShape {
    pub layers: Option<usize>,
    pub kv_heads: Option<usize>,
    pub head_size: Option<usize>,
    /// The key(s) `head_size` came from, for messages.
    pub head_size_key: &'static str,
}

/// What oxgen reads from a package's config files.
#[derive(Debug, Clone)]
pub struct PackageConfig {
    pub format: PackageFormat,
    /// The graph file, relative to the package folder.
    pub model_file: String,
    pub context_length: usize,
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub kv: KvTemplates,
    /// The config file the other fields came from (for messages), relative to the folder.
    pub config_file: &'static str,
    pub declared: DeclaredShape,
}

const GENAI_CONFIG: &str = "genai_config.json";
const OPTIMUM_CONFIG: &str = "config.json";
const GENERATION_CONFIG: &str = "generation_config.json";
/// The single-graph file `--task text-generation-with-past` writes.
const OPTIMUM_MODEL: &str = "model.onnx";
/// Files of optimum's older split exports (and of `--task text-generation`), which oxgen
/// does not run: they say which export to make instead.
const OPTIMUM_SPLIT_MODELS: [&str; 3] = [
    "decoder_model_merged.onnx",
    "decoder_with_past_model.onnx",
    "decoder_model.onnx",
];

/// Fields of `genai_config.json` read as counts, and as token ids (a number or a list).
const GENAI_COUNTS: &[&str] = &[
    "model.context_length",
    "model.decoder.num_hidden_layers",
    "model.decoder.num_key_value_heads",
    "model.decoder.num_attention_heads",
    "model.decoder.head_size",
    "model.decoder.hidden_size",
    "search.max_length",
];
const GENAI_IDS: &[&str] = &[
    "model.eos_token_id",
    "model.bos_token_id",
    "model.pad_token_id",
];
/// The same of optimum's `config.json` (`generation_config.json`'s ids are read alike).
const OPTIMUM_COUNTS: &[&str] = &[
    "max_position_embeddings",
    "num_hidden_layers",
    "num_key_value_heads",
    "num_attention_heads",
    "head_dim",
    "hidden_size",
];
const OPTIMUM_IDS: &[&str] = &["eos_token_id", "bos_token_id", "pad_token_id"];

/// Checks that each dotted `counts` key holds a non-negative integer and each `ids` key a
/// token id or a list of them, where present (and not null): a value of the wrong type is an
/// error naming the key, not a field silently left unread.
fn check_fields(config: &Value, counts: &[&str], ids: &[&str]) -> Result<(), String> {
    let at = |key: &str| {
        key.split('.')
            .try_fold(config, |v, k| v.get(k))
            .filter(|v| !v.is_null())
    };
    let id = |v: &Value| v.as_u64().is_some_and(|n| u32::try_from(n).is_ok());
    for key in counts {
        if let Some(v) = at(key).filter(|v| v.as_u64().is_none()) {
            return Err(format!("{key} must be a non-negative integer, got {v}"));
        }
    }
    for key in ids {
        let ok = match at(key) {
            None => true,
            Some(Value::Array(list)) => list.iter().all(id),
            Some(v) => id(v),
        };
        if !ok {
            return Err(format!(
                "{key} must be a token id or a list of them, got {}",
                at(key).expect("present")
            ));
        }
    }
    Ok(())
}

/// Token ids from a JSON number or list of numbers; ids that do not fit are dropped.
fn ids(v: Option<&Value>) -> Vec<u32> {
    let one = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    match v {
        Some(Value::Array(a)) => a.iter().filter_map(one).collect(),
        Some(v) => one(v).into_iter().collect(),
        None => Vec::new(),
    }
}

fn count(v: Option<&Value>) -> Option<usize> {
    v.and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
}

/// Reads and parses a JSON file; `Ok(None)` when it does not exist.
fn read_json(path: &Path) -> Result<Option<Value>, Error> {
    let err = |reason: String| Error::Package {
        path: path.display().to_string(),
        reason,
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(e.to_string())),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| err(format!("invalid JSON: {e}")))
}

impl PackageConfig {
    /// Reads the package config in `dir`: `genai_config.json` when present, else optimum's
    /// `config.json`. Fails naming the file and key that is missing or wrong.
    pub fn read(dir: &Path) -> Result<PackageConfig, Error> {
        if let Some(config) = read_json(&dir.join(GENAI_CONFIG))? {
            return Self::genai(dir, &config);
        }
        if let Some(config) = read_json(&dir.join(OPTIMUM_CONFIG))? {
            return Self::optimum(dir, &config);
        }
        Err(Error::Package {
            path: dir.display().to_string(),
            reason: format!(
                "no {GENAI_CONFIG} (an onnxruntime-genai package) or {OPTIMUM_CONFIG} (an optimum \
                 export) here; a package folder holds one of them next to its model.onnx"
            ),
        })
    }

    fn genai(dir: &Path, config: &Value) -> Result<PackageConfig, Error> {
        let err = |reason: String| Error::Package {
            path: dir.join(GENAI_CONFIG).display().to_string(),
            reason,
        };
        check_fields(config, GENAI_COUNTS, GENAI_IDS).map_err(err)?;
        let model = config
            .get("model")
            .ok_or_else(|| err("no \"model\" section".into()))?;
        let decoder = model
            .get("decoder")
            .ok_or_else(|| err("no \"model.decoder\" section".into()))?;
        let s = |v: Option<&Value>, default: &str| {
            v.and_then(Value::as_str).unwrap_or(default).to_string()
        };
        let defaults = KvTemplates::default();
        let inputs = decoder.get("inputs");
        let outputs = decoder.get("outputs");
        let kv = KvTemplates {
            past_key: s(
                inputs.and_then(|i| i.get("past_key_names")),
                &defaults.past_key,
            ),
            past_value: s(
                inputs.and_then(|i| i.get("past_value_names")),
                &defaults.past_value,
            ),
            present_key: s(
                outputs.and_then(|o| o.get("present_key_names")),
                &defaults.present_key,
            ),
            present_value: s(
                outputs.and_then(|o| o.get("present_value_names")),
                &defaults.present_value,
            ),
            kv_heads: count(decoder.get("num_key_value_heads")),
            head_size: count(decoder.get("head_size")),
        };
        let context_length = count(model.get("context_length"))
            .or_else(|| count(config.get("search").and_then(|s| s.get("max_length"))))
            .ok_or_else(|| err("no model.context_length (or search.max_length)".into()))?;
        if context_length < 2 {
            return Err(err(format!(
                "model.context_length is {context_length}; a model needs at least 2 positions \
                 (a prompt token and a generated one)"
            )));
        }
        let eos_token_ids = ids(model.get("eos_token_id"));
        if eos_token_ids.is_empty() {
            return Err(err("no model.eos_token_id".into()));
        }
        Ok(PackageConfig {
            format: PackageFormat::Genai,
            model_file: s(decoder.get("filename"), OPTIMUM_MODEL),
            context_length,
            eos_token_ids,
            bos_token_id: ids(model.get("bos_token_id")).first().copied(),
            kv,
            config_file: GENAI_CONFIG,
            declared: DeclaredShape {
                layers: count(decoder.get("num_hidden_layers")),
                kv_heads: count(decoder.get("num_key_value_heads")),
                head_size: count(decoder.get("head_size")),
                head_size_key: "model.decoder.head_size",
            },
        })
    }

    fn optimum(dir: &Path, config: &Value) -> Result<PackageConfig, Error> {
        let err = |reason: String| Error::Package {
            path: dir.join(OPTIMUM_CONFIG).display().to_string(),
            reason,
        };
        if !dir.join(OPTIMUM_MODEL).is_file() {
            let split: Vec<&str> = OPTIMUM_SPLIT_MODELS
                .into_iter()
                .filter(|f| dir.join(f).is_file())
                .collect();
            let reason = if split.is_empty() {
                format!(
                    "an optimum export needs {OPTIMUM_MODEL} next to {OPTIMUM_CONFIG}; none is here"
                )
            } else {
                format!(
                    "found {} but no {OPTIMUM_MODEL}: oxgen runs the single-graph export; re-export \
                     with `optimum-cli export onnx --task text-generation-with-past --model <model> <dir>`, \
                     which writes {OPTIMUM_MODEL}",
                    split.join(", ")
                )
            };
            return Err(err(reason));
        }
        check_fields(config, OPTIMUM_COUNTS, OPTIMUM_IDS).map_err(err)?;
        let context_length = count(config.get("max_position_embeddings")).ok_or_else(|| {
            err(
                "no max_position_embeddings: the context length must be given by the model config"
                    .into(),
            )
        })?;
        if context_length < 2 {
            return Err(err(format!(
                "max_position_embeddings is {context_length}; a model needs at least 2 positions"
            )));
        }
        let generation = read_json(&dir.join(GENERATION_CONFIG))?;
        if let Some(g) = &generation {
            check_fields(g, &[], OPTIMUM_IDS).map_err(|reason| Error::Package {
                path: dir.join(GENERATION_CONFIG).display().to_string(),
                reason,
            })?;
        }
        let token = |key: &str| {
            let from_generation = generation
                .as_ref()
                .map(|g| ids(g.get(key)))
                .unwrap_or_default();
            if from_generation.is_empty() {
                ids(config.get(key))
            } else {
                from_generation
            }
        };
        let eos_token_ids = token("eos_token_id");
        if eos_token_ids.is_empty() {
            return Err(err(format!(
                "no eos_token_id in {GENERATION_CONFIG} or {OPTIMUM_CONFIG}: generation would never stop; \
                 add \"eos_token_id\" to one of them"
            )));
        }
        let heads = count(config.get("num_attention_heads"));
        let (head_size, head_size_key) = match count(config.get("head_dim")) {
            Some(d) => (Some(d), "head_dim"),
            None => {
                let hidden = count(config.get("hidden_size"));
                let derived = hidden
                    .zip(heads)
                    .and_then(|(hidden, h)| (h > 0 && hidden % h == 0).then_some(hidden / h));
                (derived, "hidden_size / num_attention_heads")
            }
        };
        Ok(PackageConfig {
            format: PackageFormat::Optimum,
            model_file: OPTIMUM_MODEL.to_string(),
            context_length,
            eos_token_ids,
            bos_token_id: token("bos_token_id").first().copied(),
            kv: KvTemplates {
                kv_heads: count(config.get("num_key_value_heads")).or(heads),
                head_size,
                ..KvTemplates::default()
            },
            config_file: OPTIMUM_CONFIG,
            declared: DeclaredShape {
                layers: count(config.get("num_hidden_layers")),
                kv_heads: count(config.get("num_key_value_heads")).or(heads),
                head_size,
                head_size_key,
            },
        })
    }

    /// Checks what the config declares against the contract read from the graph: a config
    /// and a model.onnx from different exports fail here, naming both numbers.
    pub fn check_contract(&self, contract: &LmContract) -> Result<(), Error> {
        let (layer_key, kv_key) = match self.format {
            PackageFormat::Genai => (
                "model.decoder.num_hidden_layers",
                "model.decoder.num_key_value_heads",
            ),
            PackageFormat::Optimum => ("num_hidden_layers", "num_key_value_heads"),
        };
        let head_key = self.declared.head_size_key;
        let first = contract.layers.first().map_or("", |l| l.past_key.as_str());
        let file = &self.model_file;
        let checks = [
            (
                layer_key,
                self.declared.layers,
                contract.layers.len(),
                format!(
                    "{file} has KV inputs for {} layers ({first}, ...)",
                    contract.layers.len()
                ),
            ),
            (
                kv_key,
                self.declared.kv_heads,
                contract.kv_heads,
                format!(
                    "{file} declares {first} with {} KV heads (dimension 1)",
                    contract.kv_heads
                ),
            ),
            (
                head_key,
                self.declared.head_size,
                contract.head_size,
                format!(
                    "{file} declares {first} with head size {} (dimension 3)",
                    contract.head_size
                ),
            ),
        ];
        for (key, declared, found, graph_says) in checks {
            if let Some(declared) = declared.filter(|&d| d != found) {
                return Err(Error::Package {
                    path: self.config_file.to_string(),
                    reason: format!(
                        "{key} is {declared} but {graph_says}; the config and the graph come from \
                         different exports"
                    ),
                });
            }
        }
        Ok(())
    }
}
