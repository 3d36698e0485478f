//! The package's own configuration: `genai_config.json` (onnxruntime-genai's format).

use std::path::Path;

use oxgen_runtime::KvTemplates;
use serde_json::Value;

use crate::Error;

/// What oxgen reads from a package's config files.
#[derive(Debug, Clone)]
pub struct PackageConfig {
    /// The graph file, relative to the package folder.
    pub model_file: String,
    pub context_length: usize,
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: Option<u32>,
    pub kv: KvTemplates,
}

fn ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_u64())
            .map(|n| n as u32)
            .collect(),
        _ => Vec::new(),
    }
}

impl PackageConfig {
    /// Reads `genai_config.json` in `dir`.
    pub fn read(dir: &Path) -> Result<PackageConfig, Error> {
        let path = dir.join("genai_config.json");
        let shown = path.display().to_string();
        let err = |reason: String| Error::Package {
            path: shown.clone(),
            reason,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| {
            err(format!(
                "{e}; a package folder needs genai_config.json next to model.onnx"
            ))
        })?;
        let config: Value =
            serde_json::from_str(&text).map_err(|e| err(format!("invalid JSON: {e}")))?;
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
        };
        let context_length = model
            .get("context_length")
            .and_then(Value::as_u64)
            .or_else(|| {
                config
                    .get("search")
                    .and_then(|s| s.get("max_length"))
                    .and_then(Value::as_u64)
            })
            .ok_or_else(|| err("no model.context_length".into()))?
            as usize;
        let eos_token_ids = ids(model.get("eos_token_id"));
        if eos_token_ids.is_empty() {
            return Err(err("no model.eos_token_id".into()));
        }
        Ok(PackageConfig {
            model_file: s(decoder.get("filename"), "model.onnx"),
            context_length,
            eos_token_ids,
            bos_token_id: ids(model.get("bos_token_id")).first().copied(),
            kv,
        })
    }
}
