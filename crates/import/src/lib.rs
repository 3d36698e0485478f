//! oxgen-import: turns a GGUF model (llama.cpp's format) into an onnxruntime-genai-style
//! package oxgen (and onnxruntime, and onnxruntime-genai) can run, and holds the one writer
//! of that package's decoder graph ([`genai_graph`]), which test fixtures share.
//!
//! [`import_gguf`] maps `general.architecture` `llama`, `mistral`, `qwen2`, `qwen3` (an
//! RMSNorm over each Q and K head), `granite` (its four multipliers, [`arch::Multipliers`])
//! `phi3` (fused QKV and gate/up projections split by rows; LongRoPE as an `If` between
//! short and long rotary caches, [`arch::LongRope`]), `gemma2` and `gemma3`
//! ([`arch::Gemma`]), `smollm3` (no rotary on every fourth layer) and `gpt-oss` (attention
//! sinks, YaRN ([`arch::Yarn`]), alternating windows, and MXFP4 experts moved as they are into
//! a `com.microsoft::QMoE` of `quant_type` fp4, which oxgen's native backend runs; onnxruntime
//! has that form on CUDA only):
//!
//! - `model.onnx` + `model.onnx.data`: the decoder graph of [`genai_graph`]. Q4_0, Q4_1,
//!   Q8_0 and Q4_K projections become `MatMulNBits` without requantization
//!   (`oxgen_gguf::repack`; Q4_1 and Q4_K with float zero points), Q5_K and Q6_K ones int8
//!   `MatMulNBits` requantized (reported in [`Imported::requantized`]), F32/F16/BF16 ones f32
//!   `MatMul`s; Q/K/V(/O) biases become
//!   the projection's bias; llama.cpp's Q/K row permutation is undone ([`weights`]) so
//!   `GroupQueryAttention` rotates in Hugging Face order. A Q4_0/Q8_0 embedding becomes
//!   `GatherBlockQuantized`, a K-quant one too after requantization to int8, any other a plain
//!   f32 `Gather`; without `output.weight` the
//!   head is tied to (reads the bytes of) the embedding.
//! - `genai_config.json`, `tokenizer.json`, `tokenizer_config.json` (with the chat
//!   template), `generation_config.json` ([`tokenizer`]).
//!
//! Files are untrusted (DESIGN.md §5.3): every metadata number is range-checked
//! ([`arch`]) and every tensor's shape checked against it, and each failure names the file,
//! key or tensor and what to do. The package is written into a temporary sibling folder and
//! renamed into place (§5.5): a failed import leaves nothing half-written.
//!
//! This crate must never execute a model or know about a backend; it reads GGUF
//! (`oxgen-gguf`) and writes ONNX (`oxgen-onnx`).

pub mod arch;
pub mod encoder;
mod error;
pub mod genai_graph;
pub mod hf;
pub mod lora;
mod quantize;
pub mod safetensors;
pub mod tokenizer;
pub mod weights;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use oxgen_gguf::GgufFile;

pub use encoder::{EncoderArch, EncoderHead, EncoderSpec};
pub use error::ImportError;
use genai_graph::{ConfigTokens, DecoderSpec, Rope};
pub use lora::read_adapter;
pub use oxgen_gguf::Requantized;
use safetensors::SafeTensors;

/// `MatMulNBits` `accuracy_level` onnxruntime-genai's builder writes for int4 on CPU.
pub const DEFAULT_ACCURACY_LEVEL: u8 = 4;

/// The weights' precision of a package imported from a Hugging Face checkpoint
/// ([`import_hf`]); GGUF imports keep the file's own quantization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// `MatMulNBits` of 4 bits, blocks of 32, symmetric (onnxruntime-genai's `-p int4`).
    #[default]
    Int4,
    /// `MatMulNBits` of 8 bits, blocks of 32, symmetric.
    Int8,
    /// f16 weights, activations, KV cache and logits throughout (onnxruntime-genai's `-p
    /// fp16`): `MatMul` weights rounded to f16.
    Fp16,
    /// f32 `MatMul` weights, exactly the checkpoint's values.
    Fp32,
}

impl Precision {
    pub const ALL: [Precision; 4] = [
        Precision::Int4,
        Precision::Int8,
        Precision::Fp16,
        Precision::Fp32,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Precision::Int4 => "int4",
            Precision::Int8 => "int8",
            Precision::Fp16 => "fp16",
            Precision::Fp32 => "fp32",
        }
    }

    /// The `MatMulNBits` bits of a quantized precision.
    pub fn bits(self) -> Option<u32> {
        match self {
            Precision::Int4 => Some(4),
            Precision::Int8 => Some(8),
            Precision::Fp16 | Precision::Fp32 => None,
        }
    }

    /// `int4`, `int8`, `fp16` or `fp32`.
    pub fn parse(s: &str) -> Option<Precision> {
        Precision::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// Imports the Hugging Face causal-LM folder `src` into a package folder `out_dir` (see
/// [`hf`]).
pub fn import_hf(
    src: &Path,
    out_dir: &Path,
    precision: Precision,
    options: &ImportOptions,
) -> Result<Imported, ImportError> {
    hf::import(src, out_dir, precision, options)
}

/// How to import.
#[derive(Clone, Copy)]
pub struct ImportOptions<'a> {
    /// `MatMulNBits` `accuracy_level`: 4 (default) lets kernels quantize activations to
    /// int8; 0 keeps them f32 (exact path, and what onnxruntime runs bit-comparably).
    pub accuracy_level: u8,
    /// Replace an existing output folder (only one holding a package, or an empty one).
    pub overwrite: bool,
    /// Called as the import advances.
    pub progress: Option<&'a dyn Fn(&Progress)>,
}

impl Default for ImportOptions<'_> {
    fn default() -> Self {
        ImportOptions {
            accuracy_level: DEFAULT_ACCURACY_LEVEL,
            overwrite: false,
            progress: None,
        }
    }
}

impl std::fmt::Debug for ImportOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImportOptions")
            .field("accuracy_level", &self.accuracy_level)
            .field("overwrite", &self.overwrite)
            .field("progress", &self.progress.is_some())
            .finish()
    }
}

/// What the import is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Converting tensor `item` (`done` of `total` tensors).
    Tensors,
    /// Writing the package files into the temporary folder.
    Writing,
}

/// A progress report.
#[derive(Debug, Clone, Copy)]
pub struct Progress<'a> {
    pub stage: Stage,
    pub done: usize,
    pub total: usize,
    pub item: &'a str,
}

/// The graph's spec from checked numbers, with the rotary frequency divisors and LongRoPE's
/// short and long factors when the model has them.
fn decoder_spec(
    hp: &arch::HParams,
    vocab: usize,
    freq_factors: Option<Vec<f32>>,
    long_factors: Option<[Vec<f32>; 2]>,
    rotary_layers: Vec<bool>,
    accuracy_level: u8,
) -> DecoderSpec {
    let long =
        hp.long_rope
            .zip(long_factors)
            .map(|(l, [short, long])| genai_graph::LongRopeCaches {
                original_context: l.original_context,
                short_factors: short,
                long_factors: long,
                attn_factor: l.attn_factor,
            });
    DecoderSpec {
        layers: hp.layers,
        hidden: hp.hidden,
        heads: hp.heads,
        kv_heads: hp.kv_heads,
        head_size: hp.head_size,
        intermediate: hp.intermediate,
        vocab,
        context: hp.context,
        rope: Rope {
            base: hp.rope_base,
            dim: (hp.rotary_dim < hp.head_size).then_some(hp.rotary_dim),
            freq_factors,
            linear_scale: hp.rope_linear_scale,
            long,
            yarn: hp.yarn,
            interleaved: hp.arch.rotary_interleaved(),
        },
        rms_eps: hp.rms_eps,
        accuracy_level: i64::from(accuracy_level),
        sliding_window: hp.sliding_window,
        multipliers: hp.multipliers,
        windowed_layers: hp.windowed.clone(),
        gemma: hp.gemma.clone(),
        rotary_layers,
        experts: hp.experts,
        io: oxgen_tensor::DType::F32,
    }
}

fn check_accuracy_level(level: u8) -> Result<(), ImportError> {
    if level > 4 {
        return Err(ImportError::Options(format!(
            "accuracy_level {level} is not one of 0 (f32), 1 (f32), 2 (f16), 3 (bf16), 4 (int8)"
        )));
    }
    Ok(())
}

/// What was imported.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    pub architecture: &'static str,
    pub spec: DecoderSpec,
    /// Bytes of all files written.
    pub bytes: u64,
    /// Tensors requantized on the way (Q5_K and Q6_K projections, K-quant embedding tables, to
    /// int8 blocks of 32), with how far they moved.
    pub requantized: Vec<(String, Requantized)>,
}

/// Imports `gguf_path` into a package folder `out_dir` (see the crate docs).
pub fn import_gguf(
    gguf_path: &Path,
    out_dir: &Path,
    options: &ImportOptions,
) -> Result<Imported, ImportError> {
    check_accuracy_level(options.accuracy_level)?;
    let no_progress = |_: &Progress| {};
    let progress = options.progress.unwrap_or(&no_progress);
    check_replaceable(out_dir, options.overwrite)?;

    let file = GgufFile::open(gguf_path)?;
    let hp = arch::read(&file)?;
    let tok = tokenizer::build(&file, hp.context)?;
    let weights::Read {
        weights,
        rope_freqs: freq_factors,
        long_rope_factors,
        requantized,
    } = weights::read(&file, &hp, tok.vocab, progress)?;
    let rotary_layers = (0..hp.layers).map(|l| hp.arch.rotates(l)).collect();
    let spec = decoder_spec(
        &hp,
        tok.vocab,
        freq_factors,
        long_rope_factors,
        rotary_layers,
        options.accuracy_level,
    );
    let config = genai_graph::genai_config(
        &spec,
        hp.arch.model_type(),
        &ConfigTokens {
            bos: tok.bos,
            eos: tok.eos.clone(),
            pad: tok.pad.or(tok.eos.first().copied()),
        },
    );

    let (staging, producer) = start_writing(out_dir, progress)?;
    genai_graph::write_model(&staging.dir, &producer, &spec, weights).map_err(|e| {
        ImportError::Write {
            dir: staging.dir.clone(),
            source: Box::new(e),
        }
    })?;
    for (name, text) in [
        ("genai_config.json", &config),
        ("tokenizer.json", &tok.tokenizer_json),
        ("tokenizer_config.json", &tok.tokenizer_config_json),
        ("generation_config.json", &tok.generation_config_json),
    ] {
        let path = staging.dir.join(name);
        std::fs::write(&path, text).map_err(|e| ImportError::io(&path, "write", e))?;
    }
    staging.finish(options.overwrite, hp.arch.name(), spec, requantized)
}

/// What [`import_encoder`] imported.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportedEncoder {
    pub spec: EncoderSpec,
    /// Bytes of all files written.
    pub bytes: u64,
    /// The package files copied beside the graph (tokenizer, pooling, configs).
    pub copied: Vec<String>,
}

/// The files of a sentence-transformers (or transformers) folder an encoder package keeps
/// beside its graph, when present.
const ENCODER_FILES: [&str; 9] = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "README.md",
];

/// Imports a Hugging Face encoder folder (`config.json`, `model.safetensors`,
/// `tokenizer.json`, and sentence-transformers' `modules.json` and pooling folders when
/// present) into a package folder `out_dir`: the graph [`encoder`] writes, and the folder's
/// tokenizer and pooling files as they are.
pub fn import_encoder(
    src: &Path,
    out_dir: &Path,
    options: &ImportOptions,
) -> Result<ImportedEncoder, ImportError> {
    let no_progress = |_: &Progress| {};
    let progress = options.progress.unwrap_or(&no_progress);
    check_replaceable(out_dir, options.overwrite)?;
    let config_path = src.join("config.json");
    let text = std::fs::read_to_string(&config_path)
        .map_err(|e| ImportError::io(&config_path, "read", e))?;
    let spec = EncoderSpec::from_config(&config_path, &text)?;
    for needed in ["tokenizer.json", "model.safetensors"] {
        if !src.join(needed).is_file() {
            return Err(ImportError::Options(format!(
                "{} has no {needed}; import a folder as transformers' save_pretrained (or \
                 sentence-transformers' save) writes it",
                src.display()
            )));
        }
    }
    let weights = SafeTensors::open(&src.join("model.safetensors"))?;

    let (staging, producer) = start_writing(out_dir, progress)?;
    encoder::write_model(&staging.dir, &producer, &spec, &weights)?;
    let mut copied = Vec::new();
    let mut copy = |rel: &str| -> Result<(), ImportError> {
        let from = src.join(rel);
        let to = staging.dir.join(rel);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| ImportError::io(parent, "create folder", e))?;
        }
        std::fs::copy(&from, &to).map_err(|e| ImportError::io(&from, "copy", e))?;
        copied.push(rel.to_string());
        Ok(())
    };
    for name in ENCODER_FILES {
        if src.join(name).is_file() {
            copy(name)?;
        }
    }
    // sentence-transformers' module folders (`1_Pooling/config.json`, ...).
    for module in encoder::module_paths(src)? {
        if module.is_empty() {
            continue;
        }
        let dir = src.join(&module);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue; // `2_Normalize` is listed without a folder: it has no files.
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_file() && name.ends_with(".json") {
                copy(&format!("{module}/{name}"))?;
            }
        }
    }
    let bytes = folder_bytes(&staging.dir)?;
    staging.commit(options.overwrite)?;
    Ok(ImportedEncoder {
        spec,
        bytes,
        copied,
    })
}

/// The temporary folder the package is written into, once the graph is about to be written
/// (reported), and the graph's producer name.
fn start_writing(
    out_dir: &Path,
    progress: &dyn Fn(&Progress),
) -> Result<(Staging, String), ImportError> {
    let staging = Staging::new(out_dir)?;
    progress(&Progress {
        stage: Stage::Writing,
        done: 0,
        total: 1,
        item: "model.onnx",
    });
    Ok((
        staging,
        format!("oxgen-import {}", env!("CARGO_PKG_VERSION")),
    ))
}

fn folder_bytes(dir: &Path) -> Result<u64, ImportError> {
    let mut total = 0;
    let entries = std::fs::read_dir(dir).map_err(|e| ImportError::io(dir, "list", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| ImportError::io(dir, "list", e))?;
        let meta = entry
            .metadata()
            .map_err(|e| ImportError::io(&entry.path(), "stat", e))?;
        total += if meta.is_dir() {
            folder_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// Fails unless `out_dir` is absent, or `overwrite` is set and it is safe to replace: an
/// empty folder or one holding a package (`genai_config.json`), never an arbitrary folder.
fn check_replaceable(out_dir: &Path, overwrite: bool) -> Result<(), ImportError> {
    let Ok(meta) = std::fs::symlink_metadata(out_dir) else {
        return Ok(());
    };
    if !overwrite {
        return Err(ImportError::Exists {
            path: out_dir.to_path_buf(),
        });
    }
    let is_package_or_empty = meta.is_dir()
        && (out_dir.join("genai_config.json").is_file()
            || out_dir.join("model.onnx").is_file()
            || std::fs::read_dir(out_dir).is_ok_and(|mut d| d.next().is_none()));
    if !is_package_or_empty {
        return Err(ImportError::Options(format!(
            "refusing to replace {}: it is not a package folder (no genai_config.json or \
             model.onnx) nor empty; remove it yourself or choose another folder",
            out_dir.display()
        )));
    }
    Ok(())
}

/// A temporary folder next to the destination, removed on drop unless committed.
struct Staging {
    dir: PathBuf,
    dest: PathBuf,
    committed: bool,
}

static STAGING_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A hidden sibling of `dest` with a process- and call-unique suffix.
fn sibling(dest: &Path, tag: &str) -> Result<PathBuf, ImportError> {
    let name = dest.file_name().ok_or_else(|| {
        ImportError::Options(format!(
            "{} names no folder (it ends in '..' or is a root)",
            dest.display()
        ))
    })?;
    let unique = format!(
        ".{}.{tag}-{}-{}",
        name.to_string_lossy(),
        std::process::id(),
        STAGING_COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    Ok(dest.with_file_name(unique))
}

impl Staging {
    fn new(dest: &Path) -> Result<Staging, ImportError> {
        let dir = sibling(dest, "importing")?;
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|e| ImportError::io(parent, "create folder", e))?;
        }
        std::fs::create_dir(&dir).map_err(|e| ImportError::io(&dir, "create folder", e))?;
        Ok(Staging {
            dir,
            dest: dest.to_path_buf(),
            committed: false,
        })
    }

    /// Renames the decoder package into place ([`Staging::commit`]) and reports it.
    fn finish(
        self,
        overwrite: bool,
        architecture: &'static str,
        spec: DecoderSpec,
        requantized: Vec<(String, Requantized)>,
    ) -> Result<Imported, ImportError> {
        let bytes = folder_bytes(&self.dir)?;
        self.commit(overwrite)?;
        Ok(Imported {
            architecture,
            spec,
            bytes,
            requantized,
        })
    }

    /// Renames the folder into place, first moving an existing destination aside (checked
    /// replaceable) and removing it once the new one is in.
    fn commit(mut self, overwrite: bool) -> Result<(), ImportError> {
        check_replaceable(&self.dest, overwrite)?;
        let old = if std::fs::symlink_metadata(&self.dest).is_ok() {
            let old = sibling(&self.dest, "replaced")?;
            std::fs::rename(&self.dest, &old)
                .map_err(|e| ImportError::io(&self.dest, "move aside", e))?;
            Some(old)
        } else {
            None
        };
        if let Err(e) = std::fs::rename(&self.dir, &self.dest) {
            if let Some(old) = &old {
                // Put the previous package back; the new one is removed on drop.
                let _ = std::fs::rename(old, &self.dest);
            }
            return Err(ImportError::io(
                &self.dest,
                "rename the imported folder to",
                e,
            ));
        }
        self.committed = true;
        if let Some(old) = old {
            std::fs::remove_dir_all(&old).map_err(|e| ImportError::io(&old, "remove", e))?;
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
