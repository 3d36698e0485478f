//! A Hugging Face causal-LM folder (`config.json`, `*.safetensors`, tokenizer files) ->
//! an onnxruntime-genai-style package, with no Python: the decoder graph of
//! [`crate::genai_graph`] (the one GGUF imports write), its weights converted to the chosen
//! [`Precision`] one layer at a time and streamed into `model.onnx.data`, so the checkpoint is
//! never held in memory; `genai_config.json` with the search defaults of
//! `generation_config.json`; the tokenizer files and chat template copied as they are; and
//! `oxgen_import.json`, saying what wrote the package from what.

pub mod config;
mod weights;

use std::path::Path;

use serde_json::Value;

use crate::genai_graph::{self, ConfigTokens, WriteError};
use crate::safetensors::Checkpoint;
use crate::{ImportError, ImportOptions, Imported, Precision, Progress, Staging, start_writing};
pub use weights::BLOCK_SIZE;

/// The tokenizer and generation files a package keeps from the folder, when present
/// (`tokenizer.json` is required).
const COPIED: [&str; 5] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
];

/// Whether `dir` holds a causal LM this module imports (its `config.json` names a
/// `*ForCausalLM` class), rather than an encoder.
pub fn is_causal_lm(dir: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join("config.json")) else {
        return false;
    };
    let Ok(v) = serde_json::from_str::<Value>(&text) else {
        return false;
    };
    v.get("architectures")
        .and_then(Value::as_array)
        .and_then(|l| l.first())
        .and_then(Value::as_str)
        .is_some_and(|c| c.ends_with("ForCausalLM"))
}

/// Why writing failed: reading a layer, or writing the graph.
enum Failure {
    Read(ImportError),
    Write(WriteError),
}

impl From<WriteError> for Failure {
    fn from(e: WriteError) -> Failure {
        Failure::Write(e)
    }
}

/// Imports the Hugging Face folder `src` into the package folder `out_dir` at `precision`.
pub fn import(
    src: &Path,
    out_dir: &Path,
    precision: Precision,
    options: &ImportOptions,
) -> Result<Imported, ImportError> {
    crate::check_accuracy_level(options.accuracy_level)?;
    let no_progress = |_: &Progress| {};
    let progress = options.progress.unwrap_or(&no_progress);
    crate::check_replaceable(out_dir, options.overwrite)?;
    let config_path = src.join("config.json");
    let text = std::fs::read_to_string(&config_path)
        .map_err(|e| ImportError::io(&config_path, "read", e))?;
    let cfg = config::read(&config_path, &text)?;
    if !src.join("tokenizer.json").is_file() {
        return Err(ImportError::Folder {
            dir: src.to_path_buf(),
            problem: "tokenizer.json is missing; save the tokenizer with transformers (a \
                      fast tokenizer writes it) beside the weights"
                .into(),
        });
    }
    let generation = read_generation_config(src)?;
    let ck = Checkpoint::open(src)?;
    let hp = &cfg.hp;
    let tied = cfg.tied.unwrap_or(!ck.contains("lm_head.weight"));
    let mut spec = crate::decoder_spec(
        hp,
        cfg.vocab,
        cfg.freq_factors.clone(),
        cfg.long_factors.clone(),
        cfg.rotary_layers.clone(),
        options.accuracy_level,
    );
    if precision == Precision::Fp16 {
        if hp.experts.is_some() {
            return Err(ImportError::Unsupported {
                file: config_path,
                what: "--precision fp16 for a mixture of experts".into(),
                hint: "its MXFP4 experts run with f32 activations; import it at int4 (the \
                       experts stay MXFP4) or fp32"
                    .into(),
            });
        }
        spec.io = oxgen_tensor::DType::F16;
    }
    let eos = if generation.eos.is_empty() {
        cfg.eos.clone()
    } else {
        generation.eos.clone()
    };
    let tokens = ConfigTokens {
        bos: generation.bos.or(cfg.bos),
        pad: generation.pad.or(cfg.pad).or(eos.first().copied()),
        eos,
    };
    let genai = with_search_defaults(
        &genai_graph::genai_config(&spec, hp.arch.model_type(), &tokens),
        &generation.search,
    );

    let mut reader = weights::Reader::new(&ck, &cfg, precision, progress);
    if tied && ck.contains("lm_head.weight") {
        // transformers ignores a tied checkpoint's stored head too.
        reader.skip("lm_head.weight");
    }
    let ends = reader.ends(tied)?;
    let (staging, producer) = start_writing(out_dir, progress)?;
    let written = genai_graph::write_model_streamed(&staging.dir, &producer, &spec, ends, |l| {
        reader.layer(l).map_err(Failure::Read)
    });
    match written {
        Ok(()) => {}
        Err(Failure::Read(e)) => return Err(e),
        Err(Failure::Write(e)) => {
            return Err(ImportError::Write {
                dir: staging.dir.clone(),
                source: Box::new(e),
            });
        }
    }
    reader.check_all_used()?;
    write_package_files(src, &staging, &genai, &cfg.class, precision, options)?;
    staging.finish(options.overwrite, hp.arch.name(), spec, Vec::new())
}

/// `genai_config.json`, the copied tokenizer files and the import note, into the staging
/// folder.
fn write_package_files(
    src: &Path,
    staging: &Staging,
    genai: &str,
    class: &str,
    precision: Precision,
    options: &ImportOptions,
) -> Result<(), ImportError> {
    let write = |name: &str, text: &str| {
        let path = staging.dir.join(name);
        std::fs::write(&path, text).map_err(|e| ImportError::io(&path, "write", e))
    };
    write("genai_config.json", genai)?;
    for name in COPIED {
        let from = src.join(name);
        if from.is_file() {
            let to = staging.dir.join(name);
            std::fs::copy(&from, &to).map_err(|e| ImportError::io(&from, "copy", e))?;
        }
    }
    let note = serde_json::json!({
        "written_by": format!("oxgen-import {}", env!("CARGO_PKG_VERSION")),
        "source": src.file_name().map(|n| n.to_string_lossy().into_owned()),
        "architecture": class,
        "precision": precision.name(),
        "accuracy_level": options.accuracy_level,
    });
    let mut note = note;
    if precision.bits().is_some() {
        note["block_size"] = BLOCK_SIZE.into();
        note["quantizer"] =
            "symmetric round-to-nearest, as onnxruntime's MatMulNBits quantizer".into();
    }
    write(
        "oxgen_import.json",
        &serde_json::to_string_pretty(&note).expect("a JSON value serializes"),
    )
}

/// What `generation_config.json` says, when the folder has one.
#[derive(Default)]
struct Generation {
    bos: Option<u32>,
    eos: Vec<u32>,
    pad: Option<u32>,
    /// `search` entries of `genai_config.json` it sets.
    search: Vec<(&'static str, Value)>,
}

fn read_generation_config(src: &Path) -> Result<Generation, ImportError> {
    let path = src.join("generation_config.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(Generation::default());
    };
    let value: Value = serde_json::from_str(&text).map_err(|e| ImportError::Metadata {
        file: path.clone(),
        key: "(file)".into(),
        problem: format!("is not JSON ({e})"),
    })?;
    let empty = serde_json::Map::new();
    let g = config::Json {
        path: &path,
        map: value.as_object().unwrap_or(&empty),
    };
    let mut search = Vec::new();
    if let Some(sample) = g.boolean("do_sample")? {
        search.push(("do_sample", Value::from(sample)));
    }
    for key in ["temperature", "top_p", "repetition_penalty"] {
        if let Some(v) = g.number(key, true)? {
            search.push((key, Value::from(v)));
        }
    }
    if let Some(k) = g.count("top_k", usize::MAX)? {
        search.push(("top_k", Value::from(k)));
    }
    Ok(Generation {
        bos: g.ids("bos_token_id")?.first().copied(),
        eos: g.ids("eos_token_id")?,
        pad: g.ids("pad_token_id")?.first().copied(),
        search,
    })
}

/// `genai_config.json` text with `search` entries replaced by `overrides`.
fn with_search_defaults(config: &str, overrides: &[(&'static str, Value)]) -> String {
    let mut value: Value = serde_json::from_str(config).expect("genai_config writes JSON");
    if let Some(search) = value.get_mut("search").and_then(Value::as_object_mut) {
        for (key, v) in overrides {
            search.insert((*key).to_string(), v.clone());
        }
    }
    serde_json::to_string_pretty(&value).expect("a JSON value serializes")
}
