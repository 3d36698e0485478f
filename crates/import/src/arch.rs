//! The architectures the importer maps and their numbers, read from GGUF metadata
//! (`<arch>.block_count`, `<arch>.embedding_length`, ...; key names from gguf-py
//! `gguf/constants.py`, `Keys.LLM` / `Keys.Attention` / `Keys.Rope`).
//!
//! Every number is checked for consistency (heads divide evenly, the head size is even, ...)
//! and against generous absolute limits before anything is sized from it; the tensors are
//! then checked against these numbers ([`crate::weights`]).

use std::path::PathBuf;

use oxgen_gguf::GgufFile;

use crate::ImportError;

/// Architectures the importer maps, all Llama-shaped decoders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Mistral,
    /// Llama with Q/K/V biases and Hugging Face (NeoX) rotary order in the file.
    Qwen2,
    /// Qwen2's layout without biases, with an RMSNorm over each Q and K head (`attn_q_norm`,
    /// `attn_k_norm`) before the rotary.
    Qwen3,
    /// Llama with four multipliers ([`Multipliers`]).
    Granite,
    /// Phi-3 / 3.5 / 4-mini: fused QKV and gate/up projections, LongRoPE ([`LongRope`]).
    Phi3,
    /// Gemma 2 ([`Gemma`]): norms after attention and MLP too, GELU-tanh, softcaps, an
    /// embedding scale of `sqrt(hidden)`, windowed and global layers alternating.
    Gemma2,
    /// Gemma 3 (text): Gemma 2's layout with Q/K norms, no softcaps, windowed layers by
    /// `<arch>.attention.sliding_window_pattern` and their own rotary base.
    Gemma3,
    /// SmolLM3: Llama whose every fourth layer has no rotary (llama.cpp's fixed
    /// `n_no_rope_layer_step`; GGUF has no key for it).
    SmolLM3,
    /// gpt-oss: biased projections, attention sinks (`attn_sinks`), windowed and global
    /// layers alternating, YaRN rotary, and a mixture of MXFP4 experts ([`ExpertParams`]).
    GptOss,
    /// ERNIE 4.5 (dense): Llama's layout rotating interleaved pairs `(2i, 2i + 1)`. Imported
    /// from Hugging Face checkpoints only (not in [`Arch::ALL`], the GGUF architectures).
    Ernie45,
}

impl Arch {
    /// The architectures GGUF files import from (`general.architecture`).
    pub const ALL: [Arch; 10] = [
        Arch::Llama,
        Arch::Mistral,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Granite,
        Arch::Phi3,
        Arch::Gemma2,
        Arch::Gemma3,
        Arch::SmolLM3,
        Arch::GptOss,
    ];

    /// onnxruntime-genai's `model.type` for the architecture.
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::GptOss => "gptoss",
            other => other.name(),
        }
    }

    /// The `general.architecture` value, also the metadata key prefix.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Granite => "granite",
            Arch::Phi3 => "phi3",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
            Arch::SmolLM3 => "smollm3",
            Arch::GptOss => "gpt-oss",
            Arch::Ernie45 => "ernie4_5",
        }
    }

    /// Whether rotary pairs interleaved dimensions `(2i, 2i + 1)` rather than Hugging Face's
    /// halves `(i, i + d / 2)`.
    pub fn rotary_interleaved(self) -> bool {
        matches!(self, Arch::Ernie45)
    }

    /// Whether layer `l` rotates its queries and keys.
    pub fn rotates(self, l: usize) -> bool {
        !matches!(self, Arch::SmolLM3) || !(l + 1).is_multiple_of(4)
    }

    /// Whether Q, K and V come as one projection (`attn_qkv`), and gate and up as one
    /// (`ffn_up`, gate rows first).
    pub fn fused_projections(self) -> bool {
        matches!(self, Arch::Phi3)
    }

    /// Whether each layer normalizes its Q and K heads (RMSNorm over the head size).
    pub fn qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3 | Arch::Gemma3)
    }

    /// Whether llama.cpp's converter permuted the Q and K projection rows for its
    /// interleaved rotary (`LlamaModel.permute` in `convert_hf_to_gguf.py`); Qwen2 and Qwen3
    /// are converted unpermuted and rotated in NeoX order.
    pub fn permutes_qk(self) -> bool {
        matches!(
            self,
            Arch::Llama | Arch::Mistral | Arch::Granite | Arch::SmolLM3
        )
    }
}

/// Limits far above any real model, so a corrupt count fails here rather than as a huge
/// allocation later.
pub(crate) const MAX_LAYERS: usize = 4096;
pub(crate) const MAX_WIDTH: usize = 1 << 20;
pub(crate) const MAX_HEADS: usize = 4096;
/// Experts per layer (llama.cpp allows 512).
pub(crate) const MAX_EXPERTS: usize = 512;
/// Positions the rotary caches are written for: 1M positions of a 128-wide head take 512 MiB.
pub(crate) const MAX_CONTEXT: usize = 1 << 20;

/// The numbers of a model, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct HParams {
    pub arch: Arch,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_size: usize,
    /// Dimensions of each head that rotate (the first ones; all but Phi-4-mini's rotate the
    /// whole head).
    pub rotary_dim: usize,
    pub intermediate: usize,
    pub context: usize,
    pub rope_base: f64,
    pub rope_linear_scale: f64,
    pub rms_eps: f32,
    pub sliding_window: Option<usize>,
    /// Per layer: whether it is windowed (Gemma's and gpt-oss's alternation); `None` windows
    /// every layer when there is a window.
    pub windowed: Option<Vec<bool>>,
    pub multipliers: Multipliers,
    pub long_rope: Option<LongRope>,
    pub yarn: Option<Yarn>,
    pub gemma: Option<Gemma>,
    pub experts: Option<ExpertParams>,
}

/// A mixture of experts (`<arch>.expert_count`, `.expert_used_count`; each expert's width is
/// `.expert_feed_forward_length`, the model's `intermediate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertParams {
    pub count: usize,
    pub used: usize,
}

/// YaRN rotary scaling (`<arch>.rope.scaling.type = yarn`): frequencies between the two
/// correction dimensions blend from extrapolated to interpolated by `factor`, as Hugging
/// Face's `_compute_yarn_parameters` with `truncate = false` (gpt-oss's), and the caches are
/// scaled by `0.1 ln(factor) + 1`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_context: usize,
    pub beta_fast: f64,
    pub beta_slow: f64,
}

/// What Gemma 2 and 3 add to the Llama layout: RMSNorms on the attention and MLP outputs
/// (`post_attention_norm`, `post_ffw_norm`), GELU (tanh) instead of SiLU, optional tanh
/// softcaps on attention scores and logits (`<arch>.attn_logit_softcapping`,
/// `.final_logit_softcapping`), and the sliding window on some layers only (Gemma 2: the
/// even ones; Gemma 3: `<arch>.attention.sliding_window_pattern`, an array of one bool per
/// layer or a period `n` whose every `n`-th layer is global), which Gemma 3 rotates with a base
/// of their own (`<arch>.rope.freq_base_swa`, else llama.cpp's 10000). llama.cpp's converter
/// stores Gemma's `(1 + w)` norm weights with the 1 added, so they are plain here.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma {
    pub attn_softcap: Option<f32>,
    pub final_softcap: Option<f32>,
    /// The windowed layers' rotary base, when it differs from the others'.
    pub local_rope_base: Option<f64>,
}

/// LongRoPE (`<arch>.rope.scaling.original_context_length` present, with the tensors
/// `rope_factors_short` and `rope_factors_long`): sequences up to `original_context` positions
/// rotate with the short factors, longer ones with the long factors, both caches scaled by
/// `attn_factor` (`<arch>.rope.scaling.attn_factor`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LongRope {
    pub original_context: usize,
    pub attn_factor: f32,
}

/// Granite's scalars (`<arch>.embedding_scale`, `.residual_scale`, `.attention.scale`,
/// `.logit_scale`; 1, 1, `None` and 1 elsewhere): the embedding is multiplied by `embedding`,
/// each attention and MLP output by `residual` before it joins the residual stream, scores use
/// `attention` instead of `1 / sqrt(head size)`, and logits are divided by `logit`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Multipliers {
    pub embedding: f32,
    pub residual: f32,
    pub attention: Option<f32>,
    pub logit: f32,
}

impl Default for Multipliers {
    fn default() -> Self {
        Multipliers {
            embedding: 1.0,
            residual: 1.0,
            attention: None,
            logit: 1.0,
        }
    }
}

struct Meta<'a> {
    file: &'a GgufFile,
    prefix: &'static str,
}

impl Meta<'_> {
    fn path(&self) -> PathBuf {
        self.file.path().to_path_buf()
    }

    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.prefix)
    }

    fn bad(&self, key: &str, problem: String) -> ImportError {
        ImportError::Metadata {
            file: self.path(),
            key: key.to_string(),
            problem,
        }
    }

    /// A required count in `1..=max`.
    fn count(&self, suffix: &str, max: usize) -> Result<usize, ImportError> {
        let key = self.key(suffix);
        let v = self.file.get_u64(&key)?;
        self.in_range(&key, v, max)
    }

    fn optional_count(&self, suffix: &str, max: usize) -> Result<Option<usize>, ImportError> {
        let key = self.key(suffix);
        if self.file.get(&key).is_none() {
            return Ok(None);
        }
        let v = self.file.get_u64(&key)?;
        self.in_range(&key, v, max).map(Some)
    }

    fn in_range(&self, key: &str, v: u64, max: usize) -> Result<usize, ImportError> {
        match usize::try_from(v) {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(self.bad(key, format!("{v} is outside 1..={max}"))),
        }
    }

    fn optional_f64(&self, suffix: &str) -> Result<Option<f64>, ImportError> {
        let key = self.key(suffix);
        if self.file.get(&key).is_none() {
            return Ok(None);
        }
        let v = self.file.get_f64(&key)?;
        if !v.is_finite() || v <= 0.0 {
            return Err(self.bad(&key, format!("{v} must be finite and positive")));
        }
        Ok(Some(v))
    }
}

/// `general.architecture`, checked to be one the importer maps.
pub fn architecture(file: &GgufFile) -> Result<Arch, ImportError> {
    let name = file.get_str("general.architecture")?;
    Arch::ALL
        .into_iter()
        .find(|a| a.name() == name)
        .ok_or_else(|| ImportError::UnsupportedArchitecture {
            file: file.path().to_path_buf(),
            arch: name.to_string(),
            supported: Arch::ALL.map(Arch::name).join(", "),
        })
}

/// Reads and checks the architecture numbers.
pub fn read(file: &GgufFile) -> Result<HParams, ImportError> {
    let arch = architecture(file)?;
    let m = Meta {
        file,
        prefix: arch.name(),
    };
    let layers = m.count("block_count", MAX_LAYERS)?;
    let hidden = m.count("embedding_length", MAX_WIDTH)?;
    let experts = match arch {
        Arch::GptOss => {
            let count = m.count("expert_count", MAX_EXPERTS)?;
            let used = m.count("expert_used_count", count)?;
            Some(ExpertParams { count, used })
        }
        _ => None,
    };
    // A mixture's width is its experts'.
    let intermediate = m.count(
        if experts.is_some() {
            "expert_feed_forward_length"
        } else {
            "feed_forward_length"
        },
        MAX_WIDTH,
    )?;
    let heads = m.count("attention.head_count", MAX_HEADS)?;
    let kv_heads = m
        .optional_count("attention.head_count_kv", MAX_HEADS)?
        .unwrap_or(heads);
    if heads % kv_heads != 0 {
        return Err(m.bad(
            &m.key("attention.head_count_kv"),
            format!("{kv_heads} KV heads do not divide {heads} attention heads"),
        ));
    }
    let key_length = m.optional_count("attention.key_length", MAX_WIDTH)?;
    let value_length = m.optional_count("attention.value_length", MAX_WIDTH)?;
    let head_size = match key_length {
        Some(k) => k,
        None if hidden % heads == 0 => hidden / heads,
        None => {
            return Err(m.bad(
                &m.key("attention.head_count"),
                format!("{heads} heads do not divide the embedding length {hidden}"),
            ));
        }
    };
    if value_length.is_some_and(|v| v != head_size) {
        return Err(ImportError::Unsupported {
            file: m.path(),
            what: format!(
                "a value head size ({}) different from the key head size ({head_size})",
                value_length.unwrap_or_default()
            ),
            hint: "GroupQueryAttention needs equal Q, K and V head sizes".into(),
        });
    }
    if head_size % 2 != 0 || heads * head_size > MAX_WIDTH {
        return Err(m.bad(
            &m.key("attention.key_length"),
            format!("head size {head_size} must be even and heads × head size at most {MAX_WIDTH}"),
        ));
    }
    // Phi-3's layout rotates the first dimensions of each head as they are (Phi-4-mini: 3/4);
    // llama's converter permutes Q/K rows for a whole-head rotation, so only phi3 takes a part.
    let rotary_dim = match m.optional_count("rope.dimension_count", MAX_WIDTH)? {
        None => head_size,
        Some(rot) if rot == head_size => rot,
        Some(rot) if arch == Arch::Phi3 && rot > 0 && rot < head_size && rot % 2 == 0 => rot,
        Some(rot) => {
            return Err(ImportError::Unsupported {
                file: m.path(),
                what: format!(
                    "partial rotary ({} = {rot}, head size {head_size})",
                    m.key("rope.dimension_count")
                ),
                hint: "only phi3 (Phi-4-mini) may rotate part of each head, an even number of \
                       its dimensions; other architectures must rotate the whole head"
                    .into(),
            });
        }
    };
    let context = m.count("context_length", MAX_CONTEXT)?;
    let rope_base = m.optional_f64("rope.freq_base")?.unwrap_or(10_000.0);
    let (rope_linear_scale, yarn) = rope_scaling(&m)?;
    let eps_key = m.key("attention.layer_norm_rms_epsilon");
    let rms_eps = file.get_f32(&eps_key)?;
    if !rms_eps.is_finite() || rms_eps <= 0.0 {
        return Err(m.bad(&eps_key, format!("{rms_eps} must be finite and positive")));
    }
    let sliding_window = m.optional_count("attention.sliding_window", usize::MAX)?;
    let scale = |suffix: &str| -> Result<Option<f32>, ImportError> {
        Ok(m.optional_f64(suffix)?.map(|v| v as f32))
    };
    let long_rope = match m.optional_count("rope.scaling.original_context_length", MAX_CONTEXT)? {
        Some(original_context) if original_context < context && arch == Arch::Phi3 => {
            Some(LongRope {
                original_context,
                attn_factor: m.optional_f64("rope.scaling.attn_factor")?.unwrap_or(1.0) as f32,
            })
        }
        _ => None,
    };
    let gemma = match arch {
        Arch::Gemma2 | Arch::Gemma3 => Some(Gemma {
            attn_softcap: m.optional_f64("attn_logit_softcapping")?.map(|v| v as f32),
            final_softcap: m.optional_f64("final_logit_softcapping")?.map(|v| v as f32),
            local_rope_base: match arch {
                Arch::Gemma3 => Some(m.optional_f64("rope.freq_base_swa")?.unwrap_or(10_000.0)),
                _ => None,
            },
        }),
        _ => None,
    };
    let multipliers = Multipliers {
        // Gemma scales its embeddings by sqrt(hidden), a constant of the architecture.
        embedding: match arch {
            Arch::Gemma2 | Arch::Gemma3 => (hidden as f32).sqrt(),
            _ => scale("embedding_scale")?.unwrap_or(1.0),
        },
        residual: scale("residual_scale")?.unwrap_or(1.0),
        attention: scale("attention.scale")?,
        logit: scale("logit_scale")?.unwrap_or(1.0),
    };
    Ok(HParams {
        arch,
        layers,
        hidden,
        heads,
        kv_heads,
        head_size,
        rotary_dim,
        intermediate,
        context,
        rope_base,
        rope_linear_scale,
        rms_eps,
        // A window covering the whole context is no window.
        sliding_window: sliding_window.filter(|&w| w < context),
        windowed: match arch {
            Arch::Gemma2 | Arch::Gemma3 | Arch::GptOss => Some(windowed_layers(&m, arch, layers)?),
            _ => None,
        },
        multipliers,
        long_rope,
        yarn,
        gemma,
        experts,
    })
}

/// Which layers of a Gemma or gpt-oss are windowed (see [`Gemma`]; gpt-oss as Gemma 2: the
/// even ones, llama.cpp's default period of 2).
fn windowed_layers(m: &Meta, arch: Arch, layers: usize) -> Result<Vec<bool>, ImportError> {
    let key = m.key("attention.sliding_window_pattern");
    let period = |n: usize| (0..layers).map(|l| n == 0 || l % n < n - 1).collect();
    match m.file.get(&key) {
        None if matches!(arch, Arch::Gemma2 | Arch::GptOss) => Ok(period(2)),
        // llama.cpp's default for Gemma 3: five windowed layers, then a global one.
        None => Ok(period(6)),
        Some(oxgen_gguf::Value::Array(oxgen_gguf::Array::Bool(v))) if v.len() == layers => {
            Ok(v.clone())
        }
        Some(_) => match m.file.get_u64(&key) {
            Ok(n) => Ok(period(usize::try_from(n).unwrap_or(usize::MAX))),
            Err(_) => Err(m.bad(
                &key,
                format!("must be a period or an array of {layers} bools (one per layer)"),
            )),
        },
    }
}

/// `<arch>.rope.scaling.type`: the linear position scale (1 when absent, `none` or `yarn`)
/// and YaRN's settings.
fn rope_scaling(m: &Meta) -> Result<(f64, Option<Yarn>), ImportError> {
    let type_key = m.key("rope.scaling.type");
    let kind = match m.file.get(&type_key) {
        None => return Ok((1.0, None)),
        Some(_) => m.file.get_str(&type_key)?,
    };
    match kind {
        "none" => Ok((1.0, None)),
        "linear" => Ok((m.optional_f64("rope.scaling.factor")?.unwrap_or(1.0), None)),
        "yarn" => {
            let factor_key = m.key("rope.scaling.factor");
            let factor = m.optional_f64("rope.scaling.factor")?.unwrap_or(1.0);
            if factor < 1.0 {
                return Err(m.bad(&factor_key, format!("YaRN's factor {factor} is below 1")));
            }
            let original_context = m.count("rope.scaling.original_context_length", MAX_CONTEXT)?;
            Ok((
                1.0,
                Some(Yarn {
                    factor,
                    original_context,
                    // llama.cpp's defaults, gpt-oss's values.
                    beta_fast: m
                        .optional_f64("rope.scaling.yarn_beta_fast")?
                        .unwrap_or(32.0),
                    beta_slow: m
                        .optional_f64("rope.scaling.yarn_beta_slow")?
                        .unwrap_or(1.0),
                }),
            ))
        }
        other => Err(ImportError::Unsupported {
            file: m.path(),
            what: format!("rope scaling '{other}' ({type_key})"),
            hint: "only 'none', 'linear' and 'yarn' rope scaling are mapped".into(),
        }),
    }
}
