//! Finding `libonnxruntime`: an explicit path, `ORT_DYLIB_PATH`, or the Python package.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::OrtError;

/// The library file in `path` when it is a folder (the wheel's `onnxruntime/` or its `capi/`),
/// else `path` itself.
fn library_in(path: &Path) -> Option<PathBuf> {
    if path.is_file() {
        return Some(path.to_path_buf());
    }
    for dir in [path.to_path_buf(), path.join("capi")] {
        let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.starts_with("libonnxruntime.so")
                        || n == "onnxruntime.dll"
                        || n.starts_with("libonnxruntime") && n.ends_with(".dylib")
                })
            })
            .collect();
        // The plain `libonnxruntime.so` before versioned names; then the shortest.
        found.sort_by_key(|p| p.as_os_str().len());
        if let Some(first) = found.into_iter().next() {
            return Some(first);
        }
    }
    None
}

/// Where Python's `onnxruntime` package lives, asking `$OXGEN_PYTHON`, then `python3`.
fn python_package() -> Result<PathBuf, String> {
    let pythons: Vec<String> = std::env::var("OXGEN_PYTHON")
        .ok()
        .into_iter()
        .chain(["python3".to_string()])
        .collect();
    let mut tried = Vec::new();
    for python in pythons {
        let out = Command::new(&python)
            .args([
                "-c",
                "import onnxruntime, os; print(os.path.dirname(onnxruntime.__file__))",
            ])
            .output();
        match out {
            Ok(o) if o.status.success() => {
                return Ok(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
            }
            Ok(_) => tried.push(format!("{python} cannot import onnxruntime")),
            Err(e) => tried.push(format!("{python}: {e}")),
        }
    }
    Err(tried.join("; "))
}

/// The ONNX Runtime library to load: `explicit` (a file or the wheel's folder), else
/// `ORT_DYLIB_PATH`, else the one inside Python's `onnxruntime` package.
pub fn locate_library(explicit: Option<&Path>) -> Result<PathBuf, OrtError> {
    let mut looked = Vec::new();
    if let Some(path) = explicit {
        return library_in(path).ok_or_else(|| OrtError::NotFound {
            looked: format!("--ort-lib {} has no libonnxruntime", path.display()),
        });
    }
    if let Some(path) = std::env::var_os("ORT_DYLIB_PATH") {
        let path = PathBuf::from(path);
        return library_in(&path).ok_or_else(|| OrtError::NotFound {
            looked: format!("ORT_DYLIB_PATH={} has no libonnxruntime", path.display()),
        });
    }
    looked.push("no --ort-lib, no ORT_DYLIB_PATH".to_string());
    match python_package() {
        Ok(dir) => match library_in(&dir) {
            Some(lib) => return Ok(lib),
            None => looked.push(format!("{} holds no libonnxruntime", dir.display())),
        },
        Err(e) => looked.push(e),
    }
    Err(OrtError::NotFound {
        looked: looked.join("; "),
    })
}
