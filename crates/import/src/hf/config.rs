//! A Hugging Face causal LM's `config.json` -> the importer's architecture numbers
//! ([`HParams`]) and what the graph needs besides (rotary factors, which layers rotate, the
//! vocabulary, the special ids).
//!
//! Both spellings of the rotary settings are read: transformers 5's `rope_parameters`
//! (Gemma 3: one per layer type, `full_attention` and `sliding_attention`) and transformers
//! 4's top-level `rope_theta` with `rope_scaling` (and `partial_rotary_factor`,
//! `rope_local_base_freq`). A value of the wrong type, out of range or of a kind the graph
//! cannot express is an error naming the key: importing without it would change the model.

use std::f64::consts::PI;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::ImportError;
use crate::arch::{
    Arch, ExpertParams, Gemma, HParams, LongRope, MAX_CONTEXT, MAX_EXPERTS, MAX_HEADS, MAX_LAYERS,
    MAX_WIDTH, Multipliers, Yarn,
};

/// The `architectures` entries imported, and what each maps to.
pub const ARCHITECTURES: [(&str, Arch); 11] = [
    ("LlamaForCausalLM", Arch::Llama),
    ("MistralForCausalLM", Arch::Mistral),
    ("Qwen2ForCausalLM", Arch::Qwen2),
    ("Qwen3ForCausalLM", Arch::Qwen3),
    ("GraniteForCausalLM", Arch::Granite),
    ("Phi3ForCausalLM", Arch::Phi3),
    ("Gemma2ForCausalLM", Arch::Gemma2),
    ("Gemma3ForCausalLM", Arch::Gemma3),
    ("SmolLM3ForCausalLM", Arch::SmolLM3),
    ("GptOssForCausalLM", Arch::GptOss),
    ("Ernie4_5ForCausalLM", Arch::Ernie45),
];

/// What `config.json` says about the model.
#[derive(Debug, Clone)]
pub struct HfConfig {
    pub hp: HParams,
    /// The `architectures` entry.
    pub class: String,
    pub vocab: usize,
    /// `tie_word_embeddings`, when the file says.
    pub tied: Option<bool>,
    /// Per layer: whether it rotates queries and keys.
    pub rotary_layers: Vec<bool>,
    /// Llama 3's per-frequency divisors.
    pub freq_factors: Option<Vec<f32>>,
    /// LongRoPE's short and long factors.
    pub long_factors: Option<[Vec<f32>; 2]>,
    pub bos: Option<u32>,
    pub eos: Vec<u32>,
    pub pad: Option<u32>,
}

/// The JSON object of a file, with typed getters whose errors name the file and key.
pub(crate) struct Json<'a> {
    pub path: &'a Path,
    pub map: &'a Map<String, Value>,
}

impl<'a> Json<'a> {
    pub fn bad(&self, key: &str, problem: String) -> ImportError {
        ImportError::Metadata {
            file: self.path.to_path_buf(),
            key: key.to_string(),
            problem,
        }
    }

    /// `key`'s value, `None` when absent or `null`.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub fn count(&self, key: &str, max: usize) -> Result<Option<usize>, ImportError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
            Some(n) if (1..=max).contains(&n) => Ok(Some(n)),
            _ => Err(self.bad(key, format!("{v} is not a whole number in 1..={max}"))),
        }
    }

    pub fn required_count(&self, key: &str, max: usize) -> Result<usize, ImportError> {
        self.count(key, max)?
            .ok_or_else(|| self.bad(key, "is missing".into()))
    }

    /// A finite number (`positive`: above zero).
    pub fn number(&self, key: &str, positive: bool) -> Result<Option<f64>, ImportError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        match v.as_f64() {
            Some(x) if x.is_finite() && (!positive || x > 0.0) => Ok(Some(x)),
            _ => Err(self.bad(
                key,
                format!(
                    "{v} is not a finite{} number",
                    if positive { " positive" } else { "" }
                ),
            )),
        }
    }

    pub fn boolean(&self, key: &str) -> Result<Option<bool>, ImportError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.bad(key, format!("{v} is not true or false"))),
        }
    }

    pub fn string(&self, key: &str) -> Result<Option<&'a str>, ImportError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.bad(key, format!("{v} is not a string"))),
        }
    }

    pub fn object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>, ImportError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(v) => Err(self.bad(key, format!("{v} is not an object"))),
        }
    }

    /// A list of `len` numbers.
    pub fn floats(&self, key: &str, len: usize) -> Result<Vec<f32>, ImportError> {
        let list = self.get(key).and_then(Value::as_array);
        let values: Option<Vec<f32>> = list.and_then(|l| {
            l.iter()
                .map(|v| v.as_f64().filter(|x| x.is_finite()).map(|x| x as f32))
                .collect()
        });
        match values {
            Some(v) if v.len() == len => Ok(v),
            _ => Err(self.bad(key, format!("must be a list of {len} finite numbers"))),
        }
    }

    /// A token id or a list of them (`eos_token_id`).
    pub fn ids(&self, key: &str) -> Result<Vec<u32>, ImportError> {
        let one = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(list)) => list
                .iter()
                .map(one)
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| self.bad(key, "must be token ids".into())),
            Some(v) => one(v)
                .map(|id| vec![id])
                .ok_or_else(|| self.bad(key, format!("{v} is not a token id"))),
        }
    }
}

/// Parses `config.json` (its text already read from `path`).
pub fn read(path: &Path, text: &str) -> Result<HfConfig, ImportError> {
    let value: Value = serde_json::from_str(text).map_err(|e| ImportError::Metadata {
        file: path.to_path_buf(),
        key: "(file)".into(),
        problem: format!("is not JSON ({e})"),
    })?;
    let Some(map) = value.as_object() else {
        return Err(ImportError::Metadata {
            file: path.to_path_buf(),
            key: "(file)".into(),
            problem: "is not a JSON object".into(),
        });
    };
    let c = Json { path, map };
    let (class, arch) = architecture(&c)?;
    let layers = c.required_count("num_hidden_layers", MAX_LAYERS)?;
    let hidden = c.required_count("hidden_size", MAX_WIDTH)?;
    let heads = c.required_count("num_attention_heads", MAX_HEADS)?;
    let kv_heads = c.count("num_key_value_heads", MAX_HEADS)?.unwrap_or(heads);
    if heads % kv_heads != 0 {
        return Err(c.bad(
            "num_key_value_heads",
            format!("{kv_heads} KV heads do not divide {heads} attention heads"),
        ));
    }
    let head_size = match c.count("head_dim", MAX_WIDTH)? {
        Some(d) => d,
        None if hidden % heads == 0 => hidden / heads,
        None => {
            return Err(c.bad(
                "num_attention_heads",
                format!(
                    "{heads} heads do not divide hidden_size {hidden} (and head_dim is not given)"
                ),
            ));
        }
    };
    if head_size % 2 != 0 || heads * head_size > MAX_WIDTH {
        return Err(c.bad(
            "head_dim",
            format!("head size {head_size} must be even and heads × head size at most {MAX_WIDTH}"),
        ));
    }
    let intermediate = c.required_count("intermediate_size", MAX_WIDTH)?;
    let context = c.required_count("max_position_embeddings", MAX_CONTEXT)?;
    let vocab = c.required_count("vocab_size", 1 << 24)?;
    let rms_eps = c
        .number("rms_norm_eps", true)?
        .ok_or_else(|| c.bad("rms_norm_eps", "is missing".into()))? as f32;
    activation(&c, arch)?;

    let rope = rope(&c, arch, head_size, context)?;
    let experts = match arch {
        Arch::GptOss => {
            let count = c.required_count("num_local_experts", MAX_EXPERTS)?;
            let used = c.required_count("num_experts_per_tok", count)?;
            if let Some(limit) = c.number("swiglu_limit", true)?
                && limit != 7.0
            {
                return Err(unsupported(
                    &c,
                    format!("swiglu_limit {limit}"),
                    "the graph clamps gpt-oss's SwiGLU at 7, the released models' value",
                ));
            }
            Some(ExpertParams { count, used })
        }
        _ => None,
    };
    let (sliding_window, windowed) = windows(&c, arch, layers)?;
    let gemma = match arch {
        Arch::Gemma2 | Arch::Gemma3 => Some(Gemma {
            attn_softcap: c.number("attn_logit_softcapping", true)?.map(|v| v as f32),
            final_softcap: c.number("final_logit_softcapping", true)?.map(|v| v as f32),
            local_rope_base: rope.local_base,
        }),
        _ => None,
    };
    let granite = |key: &str| -> Result<Option<f32>, ImportError> {
        Ok(match arch {
            Arch::Granite => c.number(key, true)?.map(|v| v as f32),
            _ => None,
        })
    };
    let attention = match arch {
        Arch::Gemma2 | Arch::Gemma3 => c
            .number("query_pre_attn_scalar", true)?
            .filter(|&s| s != head_size as f64)
            .map(|s| s.powf(-0.5) as f32),
        _ => granite("attention_multiplier")?,
    };
    let multipliers = Multipliers {
        embedding: match arch {
            Arch::Gemma2 | Arch::Gemma3 => (hidden as f32).sqrt(),
            _ => granite("embedding_multiplier")?.unwrap_or(1.0),
        },
        residual: granite("residual_multiplier")?.unwrap_or(1.0),
        attention,
        logit: granite("logits_scaling")?.unwrap_or(1.0),
    };
    let rotary_layers = match (arch, c.get("no_rope_layers")) {
        (Arch::SmolLM3, Some(list)) => {
            let flags: Option<Vec<bool>> = list.as_array().and_then(|l| {
                l.iter()
                    .map(|v| v.as_u64().filter(|&f| f <= 1).map(|f| f == 1))
                    .collect()
            });
            flags.filter(|f| f.len() == layers).ok_or_else(|| {
                c.bad(
                    "no_rope_layers",
                    format!("must be {layers} flags, 1 for a layer with rotary and 0 without"),
                )
            })?
        }
        _ => (0..layers).map(|l| arch.rotates(l)).collect(),
    };
    let hp = HParams {
        arch,
        layers,
        hidden,
        heads,
        kv_heads,
        head_size,
        rotary_dim: rope.rotary_dim,
        intermediate,
        context,
        rope_base: rope.base,
        rope_linear_scale: rope.linear_scale,
        rms_eps,
        sliding_window: sliding_window.filter(|&w| w < context),
        windowed,
        multipliers,
        long_rope: rope.long.as_ref().map(|(l, _)| *l),
        yarn: rope.yarn,
        gemma,
        experts,
    };
    Ok(HfConfig {
        hp,
        class: class.to_string(),
        vocab,
        tied: c.boolean("tie_word_embeddings")?,
        rotary_layers,
        freq_factors: rope.freq_factors,
        long_factors: rope.long.map(|(_, f)| f),
        bos: c.ids("bos_token_id")?.first().copied(),
        eos: c.ids("eos_token_id")?,
        pad: c.ids("pad_token_id")?.first().copied(),
    })
}

fn unsupported(c: &Json, what: String, hint: &str) -> ImportError {
    ImportError::Unsupported {
        file: PathBuf::from(c.path),
        what,
        hint: hint.into(),
    }
}

/// The first `architectures` entry, which must be one [`ARCHITECTURES`] names.
fn architecture<'a>(c: &Json<'a>) -> Result<(&'a str, Arch), ImportError> {
    let supported = || {
        ARCHITECTURES
            .iter()
            .map(|(name, _)| *name)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let class = c
        .get("architectures")
        .and_then(Value::as_array)
        .and_then(|l| l.first())
        .and_then(Value::as_str)
        .ok_or_else(|| {
            c.bad(
                "architectures",
                format!(
                    "must be a list naming the model class (one of {})",
                    supported()
                ),
            )
        })?;
    let arch = ARCHITECTURES
        .iter()
        .find(|(name, _)| *name == class)
        .map(|(_, a)| *a)
        .ok_or_else(|| {
            unsupported(
                c,
                format!("architecture '{class}' (config.json 'architectures')"),
                &format!(
                    "oxgen imports these causal LMs: {}; an encoder folder (BERT, RoBERTa) \
                     imports as an encoder",
                    supported()
                ),
            )
        })?;
    Ok((class, arch))
}

/// The MLP's activation must be the one the graph writes for the architecture.
fn activation(c: &Json, arch: Arch) -> Result<(), ImportError> {
    let (key, expected): (&str, &[&str]) = match arch {
        Arch::Gemma2 | Arch::Gemma3 => (
            "hidden_activation",
            &["gelu_pytorch_tanh", "gelu_new", "gelu_fast"],
        ),
        Arch::GptOss => return Ok(()),
        _ => ("hidden_act", &["silu", "swish"]),
    };
    match c.string(key)? {
        Some(act) if !expected.contains(&act) => Err(unsupported(
            c,
            format!("{key} '{act}'"),
            &format!("the graph of this architecture uses {}", expected[0]),
        )),
        _ => Ok(()),
    }
}

/// The rotary settings.
struct RopeConfig {
    base: f64,
    rotary_dim: usize,
    linear_scale: f64,
    freq_factors: Option<Vec<f32>>,
    long: Option<(LongRope, [Vec<f32>; 2])>,
    yarn: Option<Yarn>,
    /// Gemma 3's windowed layers' base.
    local_base: Option<f64>,
}

fn rope(c: &Json, arch: Arch, head_size: usize, context: usize) -> Result<RopeConfig, ImportError> {
    // transformers 5: `rope_parameters` (Gemma 3: per layer type); transformers 4:
    // `rope_scaling` beside a top-level `rope_theta`.
    let (key, params) = match c.object("rope_parameters")? {
        Some(p) => ("rope_parameters", p.clone()),
        None => {
            let mut p = c.object("rope_scaling")?.cloned().unwrap_or_default();
            for k in ["rope_theta", "partial_rotary_factor"] {
                if let Some(v) = c.get(k) {
                    p.entry(k).or_insert(v.clone());
                }
            }
            ("rope_scaling", p)
        }
    };
    let (params, local_base) = match (params.get("full_attention"), arch) {
        (Some(Value::Object(full)), Arch::Gemma3) => {
            let local = params.get("sliding_attention").and_then(Value::as_object);
            let local = local.map(|m| Json {
                path: c.path,
                map: m,
            });
            let base = match local {
                Some(l) => l.number("rope_theta", true)?,
                None => None,
            };
            (full.clone(), base)
        }
        _ => {
            let local = match arch {
                Arch::Gemma3 => Some(c.number("rope_local_base_freq", true)?.unwrap_or(10_000.0)),
                _ => None,
            };
            (params, local)
        }
    };
    let p = Json {
        path: c.path,
        map: &params,
    };
    let at = |k: &str| format!("{key}.{k}");
    let number = |k: &str| {
        p.number(k, true)
            .map_err(|_| c.bad(&at(k), "must be a finite positive number".into()))
    };
    let base = number("rope_theta")?
        .or(c.number("rope_theta", true)?)
        .unwrap_or(10_000.0);
    let partial = number("partial_rotary_factor")?.or(c.number("partial_rotary_factor", true)?);
    let rotary_dim = match partial {
        None => head_size,
        Some(f) => {
            let dim = (head_size as f64 * f).round() as usize;
            if (arch != Arch::Phi3 && dim != head_size)
                || dim == 0
                || !dim.is_multiple_of(2)
                || dim > head_size
            {
                return Err(unsupported(
                    c,
                    format!("partial_rotary_factor {f} (head size {head_size})"),
                    "only Phi-3 (Phi-4-mini) may rotate part of each head, an even number of its \
                     dimensions",
                ));
            }
            dim
        }
    };
    let kind = p
        .string("rope_type")
        .ok()
        .flatten()
        .or(p.string("type").ok().flatten())
        .unwrap_or("default");
    let factor = || -> Result<f64, ImportError> {
        number("factor")?.ok_or_else(|| c.bad(&at("factor"), "is missing".into()))
    };
    let original = || -> Result<usize, ImportError> {
        match p.count("original_max_position_embeddings", MAX_CONTEXT) {
            Ok(Some(n)) => Ok(n),
            Ok(None) => c.required_count("original_max_position_embeddings", MAX_CONTEXT),
            Err(_) => Err(c.bad(
                &at("original_max_position_embeddings"),
                "must be a whole number of positions".into(),
            )),
        }
    };
    let mut rope = RopeConfig {
        base,
        rotary_dim,
        linear_scale: 1.0,
        freq_factors: None,
        long: None,
        yarn: None,
        local_base,
    };
    match kind {
        "default" => {}
        "linear" => rope.linear_scale = factor()?,
        "llama3" => {
            let (factor, old) = (factor()?, original()? as f64);
            let low = number("low_freq_factor")?.unwrap_or(1.0);
            let high = number("high_freq_factor")?.unwrap_or(4.0);
            if high <= low {
                return Err(c.bad(
                    &at("high_freq_factor"),
                    format!("{high} must exceed low_freq_factor {low}"),
                ));
            }
            rope.freq_factors = Some(llama3_factors(base, rotary_dim, factor, low, high, old));
        }
        "longrope" | "su" => {
            let original = original()?;
            let half = rotary_dim / 2;
            let short = p.floats("short_factor", half).map_err(|_| {
                c.bad(
                    &at("short_factor"),
                    format!("must be a list of {half} numbers"),
                )
            })?;
            let long = p.floats("long_factor", half).map_err(|_| {
                c.bad(
                    &at("long_factor"),
                    format!("must be a list of {half} numbers"),
                )
            })?;
            let scale = context as f64 / original as f64;
            let attn_factor = match number("attention_factor")? {
                Some(f) => f,
                None if scale <= 1.0 => 1.0,
                None => (1.0 + scale.ln() / (original as f64).ln()).sqrt(),
            };
            if original < context {
                rope.long = Some((
                    LongRope {
                        original_context: original,
                        attn_factor: attn_factor as f32,
                    },
                    [short, long],
                ));
            } else {
                // Never longer than the original context: the short factors always apply.
                rope.freq_factors = Some(short);
            }
        }
        "yarn" => {
            let factor = factor()?;
            if factor < 1.0 {
                return Err(c.bad(&at("factor"), format!("YaRN's factor {factor} is below 1")));
            }
            if p.boolean("truncate").ok().flatten() != Some(false) {
                return Err(unsupported(
                    c,
                    format!(
                        "YaRN with truncated correction dimensions ({key}.truncate is not false)"
                    ),
                    "the graph writes gpt-oss's YaRN, whose config says \"truncate\": false",
                ));
            }
            for k in ["attention_factor", "mscale", "mscale_all_dim"] {
                if p.get(k).is_some() {
                    return Err(unsupported(
                        c,
                        format!("YaRN's {key}.{k}"),
                        "the graph scales YaRN's caches by 0.1 ln(factor) + 1 only",
                    ));
                }
            }
            rope.yarn = Some(Yarn {
                factor,
                original_context: original()?,
                beta_fast: number("beta_fast")?.unwrap_or(32.0),
                beta_slow: number("beta_slow")?.unwrap_or(1.0),
            });
        }
        other => {
            return Err(unsupported(
                c,
                format!("rope type '{other}' ({key})"),
                "the graph writes default, linear, llama3, longrope and yarn rotary",
            ));
        }
    }
    Ok(rope)
}

/// Llama 3's rotary scaling as one divisor per frequency (what llama.cpp's converter stores as
/// `rope_freqs`): long wavelengths divided by `factor`, short ones kept, those between blended.
fn llama3_factors(base: f64, dim: usize, factor: f64, low: f64, high: f64, old: f64) -> Vec<f32> {
    let (low_wavelen, high_wavelen) = (old / low, old / high);
    (0..dim / 2)
        .map(|i| {
            let freq = 1.0 / (base as f32).powf((2 * i) as f32 / dim as f32);
            let wavelen = 2.0 * PI / f64::from(freq);
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor as f32
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect()
}

/// The sliding window and which layers it applies to.
fn windows(
    c: &Json,
    arch: Arch,
    layers: usize,
) -> Result<(Option<usize>, Option<Vec<bool>>), ImportError> {
    if c.boolean("use_sliding_window")? == Some(true) {
        return Err(unsupported(
            c,
            "use_sliding_window true".into(),
            "Qwen's per-layer windows (max_window_layers) are not written; the released \
             models run without them",
        ));
    }
    let window = match arch {
        Arch::Qwen2 | Arch::Qwen3 | Arch::SmolLM3 | Arch::Llama | Arch::Granite | Arch::Ernie45 => {
            None
        }
        _ => c.count("sliding_window", usize::MAX)?,
    };
    let types = match c.get("layer_types") {
        None => None,
        Some(list) => {
            let kinds: Option<Vec<bool>> = list.as_array().and_then(|l| {
                l.iter()
                    .map(|v| match v.as_str() {
                        Some("sliding_attention") => Some(true),
                        Some("full_attention") => Some(false),
                        _ => None,
                    })
                    .collect()
            });
            Some(kinds.filter(|k| k.len() == layers).ok_or_else(|| {
                c.bad(
                    "layer_types",
                    format!(
                        "must be {layers} entries of \"sliding_attention\" or \"full_attention\""
                    ),
                )
            })?)
        }
    };
    let period = |n: usize| -> Vec<bool> { (0..layers).map(|l| (l + 1) % n != 0).collect() };
    let windowed = match arch {
        Arch::Gemma2 | Arch::GptOss => Some(types.unwrap_or_else(|| period(2))),
        Arch::Gemma3 => Some(match types {
            Some(t) => t,
            None => period(c.count("sliding_window_pattern", MAX_LAYERS)?.unwrap_or(6)),
        }),
        _ => None,
    };
    Ok((window, windowed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<HfConfig, ImportError> {
        read(Path::new("config.json"), json)
    }

    const LLAMA: &str = r#""architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2,
        "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "max_position_embeddings": 256, "vocab_size": 291,
        "rms_norm_eps": 1e-5, "hidden_act": "silu""#;

    #[test]
    fn both_spellings_of_the_rotary_settings_give_the_same_numbers() {
        let v5 = parse(&format!(
            r#"{{{LLAMA}, "rope_parameters": {{"rope_type": "llama3", "rope_theta": 500000.0,
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}}}}"#
        ))
        .unwrap();
        let v4 = parse(&format!(
            r#"{{{LLAMA}, "rope_theta": 500000.0, "rope_scaling": {{"rope_type": "llama3",
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}}}}"#
        ))
        .unwrap();
        assert_eq!(v5.hp, v4.hp);
        assert_eq!(v5.freq_factors, v4.freq_factors);
        assert_eq!(v5.hp.rope_base, 500000.0);
        let f = v5.freq_factors.unwrap();
        assert_eq!((f[0], f[7]), (1.0, 8.0), "{f:?}");
    }

    #[test]
    fn gemma3s_bases_per_layer_type_in_either_spelling() {
        let common = r#""architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 2,
            "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "intermediate_size": 128, "max_position_embeddings": 256,
            "vocab_size": 291, "rms_norm_eps": 1e-6, "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"]"#;
        let v5 = parse(&format!(
            r#"{{{common}, "rope_parameters": {{
               "full_attention": {{"rope_type": "default", "rope_theta": 1000000.0}},
               "sliding_attention": {{"rope_type": "default", "rope_theta": 10000.0}}}}}}"#
        ))
        .unwrap();
        let v4 = parse(&format!(
            r#"{{{common}, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0}}"#
        ))
        .unwrap();
        assert_eq!(v5.hp, v4.hp);
        assert_eq!(v5.hp.rope_base, 1e6);
        assert_eq!(v5.hp.gemma.unwrap().local_rope_base, Some(1e4));
        assert_eq!(v5.hp.windowed, Some(vec![true, false]));
        assert_eq!(v5.hp.multipliers.embedding, 8.0);
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_key() {
        for (bad, key) in [
            (r#""hidden_size": "64""#, "hidden_size"),
            (r#""rms_norm_eps": -1"#, "rms_norm_eps"),
            (r#""num_key_value_heads": 3"#, "num_key_value_heads"),
            (r#""tie_word_embeddings": "yes""#, "tie_word_embeddings"),
            (
                r#""rope_scaling": {"rope_type": "linear"}"#,
                "rope_scaling.factor",
            ),
        ] {
            // A repeated key's last value wins, so `bad` overrides LLAMA's.
            let err = parse(&format!("{{{LLAMA}, {bad}}}"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(&format!("'{key}'")), "{bad}: {err}");
        }
        let err = parse(&format!(
            "{{{}}}",
            LLAMA.replace("LlamaForCausalLM", "MambaForCausalLM")
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("MambaForCausalLM") && err.contains("Qwen2ForCausalLM"),
            "{err}"
        );
    }
}
