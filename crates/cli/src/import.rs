//! `oxgen import FILE.gguf OUT_DIR`: converts a GGUF model into an onnxruntime-genai-style
//! package folder (`oxgen_import::import_gguf`); `oxgen import FOLDER OUT_DIR` converts a
//! Hugging Face folder: a causal LM's checkpoint (`config.json`, safetensors, tokenizer) into a
//! package at `--precision` (`oxgen_import::import_hf`), or an encoder (sentence-transformers'
//! or transformers' safetensors, config and tokenizer) into an encoder package
//! (`oxgen_import::import_encoder`). Progress goes to stderr, and only when stderr is a
//! terminal; a one-line summary follows.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use oxgen_import::{ImportOptions, Precision, Progress, Stage, import_gguf};

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file (llama, mistral, qwen2, qwen3, granite, phi3, gemma2, gemma3, smollm3,
    /// gpt-oss; Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4 experts, F16, BF16, F32 tensors),
    /// a Hugging Face causal-LM folder (Llama, Mistral, Qwen2/2.5, Qwen3, Granite,
    /// Phi-3/3.5/4-mini, Gemma 2/3, SmolLM3, gpt-oss, ERNIE 4.5: `config.json`, `*.safetensors` (sharded or
    /// not; F32, F16, BF16), `tokenizer.json`), or a Hugging Face encoder folder (BERT,
    /// RoBERTa, XLM-RoBERTa: `config.json`, `model.safetensors`, `tokenizer.json`,
    /// sentence-transformers' pooling files).
    file: PathBuf,
    /// The package folder to create (written to a temporary sibling, then renamed).
    out_dir: PathBuf,
    /// MatMulNBits (and MXFP4 experts') accuracy_level: 4 lets kernels quantize activations
    /// to int8 (faster), 0 keeps them f32 (exact, what onnxruntime runs bit-comparably).
    #[arg(long, env = "OXGEN_ACCURACY_LEVEL", default_value_t = oxgen_import::DEFAULT_ACCURACY_LEVEL,
          value_parser = parse_accuracy_level)]
    accuracy_level: u8,
    /// Replace OUT_DIR if it already holds a package.
    #[arg(long, env = "OXGEN_FORCE")]
    force: bool,
    /// The weights' precision when importing a Hugging Face causal LM: int4 (MatMulNBits,
    /// blocks of 32, as onnxruntime-genai's builder), int8, fp16 (f16 throughout, as the
    /// builder's fp16 packages), or fp32 (the checkpoint's values).
    #[arg(long, value_parser = parse_precision)]
    precision: Option<Precision>,
}

fn parse_precision(s: &str) -> Result<Precision, String> {
    Precision::parse(s).ok_or_else(|| format!("'{s}' is not int4, int8, fp16 or fp32"))
}

fn parse_accuracy_level(s: &str) -> Result<u8, String> {
    match s {
        "0" => Ok(0),
        "4" => Ok(4),
        _ => Err(format!(
            "'{s}' is not 0 (f32 activations) or 4 (int8 activations)"
        )),
    }
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let causal_lm = args.file.is_dir() && oxgen_import::hf::is_causal_lm(&args.file);
    if let Some(p) = args.precision.filter(|_| !causal_lm) {
        anyhow::bail!(
            "--precision {} applies to a Hugging Face causal-LM folder; {} is a GGUF file \
             (which keeps its own quantization) or an encoder folder",
            p.name(),
            args.file.display()
        );
    }
    if causal_lm {
        let precision = args.precision.unwrap_or_default();
        return import_checkpoint(
            &args.file,
            &args.out_dir,
            precision,
            args.accuracy_level,
            args.force,
        );
    }
    if args.file.is_dir() {
        return import_folder(&args.file, &args.out_dir, args.force);
    }
    import(&args.file, &args.out_dir, args.accuracy_level, args.force)
}

/// Imports a Hugging Face encoder folder into `out`, with a summary on stderr.
pub fn import_folder(src: &Path, out: &Path, overwrite: bool) -> anyhow::Result<()> {
    let start = Instant::now();
    let options = ImportOptions {
        overwrite,
        ..ImportOptions::default()
    };
    let imported = oxgen_import::import_encoder(src, out, &options)
        .with_context(|| format!("importing {} into {}", src.display(), out.display()))?;
    let s = &imported.spec;
    let head = match s.head {
        oxgen_import::EncoderHead::Features => "embeddings".to_string(),
        oxgen_import::EncoderHead::Classifier { labels } => format!("{labels}-label classifier"),
    };
    eprintln!(
        "imported a {:?} encoder ({head}; {} layers, hidden {}, {} heads, vocab {}) into {}: \
         {:.1} MB in {:.2}s",
        s.arch,
        s.layers,
        s.hidden,
        s.heads,
        s.vocab,
        out.display(),
        imported.bytes as f64 / 1e6,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Imports `gguf` into `out`, with progress on a terminal and a summary on stderr.
pub fn import(gguf: &Path, out: &Path, accuracy_level: u8, overwrite: bool) -> anyhow::Result<()> {
    let imported = with_progress(gguf, out, accuracy_level, overwrite, |options| {
        import_gguf(gguf, out, options)
    })?;
    if let Some((name, worst)) =
        (imported.requantized.iter()).max_by(|a, b| relative(&a.1).total_cmp(&relative(&b.1)))
    {
        eprintln!(
            "requantized {} K-quant tensors to int8 blocks of 32: the largest change is {:.3}% \
             of its tensor's largest weight ({name})",
            imported.requantized.len(),
            100.0 * relative(worst)
        );
    }
    Ok(())
}

/// Imports the Hugging Face causal-LM folder `src` into `out` at `precision`, reported as
/// [`import`] reports.
pub fn import_checkpoint(
    src: &Path,
    out: &Path,
    precision: Precision,
    accuracy_level: u8,
    overwrite: bool,
) -> anyhow::Result<()> {
    with_progress(src, out, accuracy_level, overwrite, |options| {
        oxgen_import::import_hf(src, out, precision, options)
    })?;
    Ok(())
}

/// Runs `import` with a progress bar over the tensors on a terminal, then prints a summary.
fn with_progress(
    src: &Path,
    out: &Path,
    accuracy_level: u8,
    overwrite: bool,
    import: impl FnOnce(&ImportOptions) -> Result<oxgen_import::Imported, oxgen_import::ImportError>,
) -> anyhow::Result<oxgen_import::Imported> {
    let start = Instant::now();
    // indicatif draws nothing when stderr is not a terminal.
    let bar = ProgressBar::new(0);
    if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} tensors {msg} {elapsed}")
    {
        bar.set_style(style);
    }
    let show = |p: &Progress| match p.stage {
        Stage::Tensors => {
            bar.set_length(p.total as u64);
            bar.set_position(p.done as u64);
            bar.set_message(p.item.to_string());
        }
        Stage::Writing => bar.set_message(format!("writing {}", p.item)),
    };
    let options = ImportOptions {
        accuracy_level,
        overwrite,
        progress: if std::io::stderr().is_terminal() {
            Some(&show)
        } else {
            None
        },
    };
    let result = import(&options);
    bar.finish_and_clear();
    let imported =
        result.with_context(|| format!("importing {} into {}", src.display(), out.display()))?;
    let s = &imported.spec;
    eprintln!(
        "imported {} ({} layers, hidden {}, {} heads / {} KV heads, vocab {}) into {}: {:.1} MB in {:.2}s",
        imported.architecture,
        s.layers,
        s.hidden,
        s.heads,
        s.kv_heads,
        s.vocab,
        out.display(),
        imported.bytes as f64 / 1e6,
        start.elapsed().as_secs_f64()
    );
    Ok(imported)
}

/// A requantization's largest change relative to the tensor's largest weight.
fn relative(r: &oxgen_import::Requantized) -> f32 {
    if r.max_abs > 0.0 {
        r.max_abs_error / r.max_abs
    } else {
        0.0
    }
}
