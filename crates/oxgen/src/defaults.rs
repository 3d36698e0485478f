//! The package's own generation defaults: `generation_config.json` (Hugging Face) and the
//! `search` section of `genai_config.json` (onnxruntime-genai). Flags and API options
//! override them; built-in defaults fill what neither says.

use std::path::Path;

use oxgen_generate::SamplingParams;
use serde_json::Value;

use crate::Error;

/// Defaults for generating with one package.
#[derive(Debug, Clone, PartialEq)]
pub struct PackageDefaults {
    pub sampling: SamplingParams,
    /// `max_new_tokens` from generation_config.json, when it sets one.
    pub max_new_tokens: Option<usize>,
}

fn read_json(path: &Path) -> Result<Option<Value>, Error> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(Error::Package {
                path: path.display().to_string(),
                reason: e.to_string(),
            });
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::Package {
            path: path.display().to_string(),
            reason: format!("invalid JSON: {e}"),
        })
}

/// Applies one config object's sampling keys. `top_k_when_sampling` is what a sampling
/// config without `top_k` means (Hugging Face's `GenerationConfig` defaults it to 50).
fn apply(section: &Value, params: &mut SamplingParams, top_k_when_sampling: Option<usize>) {
    let f = |key: &str| section.get(key).and_then(Value::as_f64).map(|v| v as f32);
    if let Some(sample) = section.get("do_sample").and_then(Value::as_bool) {
        params.greedy = !sample;
        if sample
            && section.get("top_k").is_none()
            && let Some(k) = top_k_when_sampling
        {
            params.top_k = k;
        }
    }
    if let Some(t) = f("temperature") {
        params.temperature = t;
    }
    if let Some(k) = section.get("top_k").and_then(Value::as_u64) {
        params.top_k = k as usize;
    }
    if let Some(p) = f("top_p") {
        params.top_p = p;
    }
    if let Some(p) = f("min_p") {
        params.min_p = p;
    }
    if let Some(p) = f("repetition_penalty") {
        params.repetition_penalty = p;
    }
}

impl PackageDefaults {
    /// Reads `generation_config.json`, then the `search` section of `genai_config.json` (what
    /// onnxruntime-genai itself uses, so it wins). Greedy unless a file says `do_sample`.
    pub fn read(dir: &Path) -> Result<PackageDefaults, Error> {
        let mut sampling = SamplingParams {
            greedy: true,
            ..SamplingParams::default()
        };
        let mut max_new_tokens = None;
        if let Some(generation) = read_json(&dir.join("generation_config.json"))? {
            apply(&generation, &mut sampling, Some(50));
            max_new_tokens = generation
                .get("max_new_tokens")
                .and_then(Value::as_u64)
                .map(|n| n as usize);
        }
        if let Some(search) = read_json(&dir.join("genai_config.json"))?
            .as_ref()
            .and_then(|c| c.get("search"))
        {
            apply(search, &mut sampling, None);
        }
        // A greedy package's `top_k: 1` (onnxruntime-genai's builder writes it) spells greedy
        // out; kept, it would make every sampled request greedy too.
        if sampling.greedy && sampling.top_k == 1 {
            sampling.top_k = 0;
        }
        sampling.validate().map_err(|e| Error::Package {
            path: dir.display().to_string(),
            reason: format!("the package's generation defaults are invalid: {e}"),
        })?;
        Ok(PackageDefaults {
            sampling,
            max_new_tokens,
        })
    }
}
