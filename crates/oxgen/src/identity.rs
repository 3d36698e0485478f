//! A model's identity for what outlives a process (the prefix cache's disk tier, saved
//! sessions): SHA-256 of its graph file and the external data files the graph references,
//! so another model, or another version of this one, never reads what this one wrote.
//!
//! Hashing a few gigabytes takes seconds (SHA-256 runs at about 1.5 GB/s with the CPU's SHA
//! instructions), so the result is remembered in the cache folder under the folder's file
//! names, sizes and modification times: a replaced or rewritten file changes them, and the
//! model is hashed again.

use std::fs;
use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::Error;

/// Hex of the first 16 bytes of SHA-256 over the graph at `model_path` and its external
/// data, remembered under `memo_dir` when given (created when missing; a folder that cannot
/// be written only costs the hash next time).
pub fn model_identity(model_path: &Path, memo_dir: Option<&Path>) -> Result<String, Error> {
    let fail = |what: &str, e: &dyn std::fmt::Display| Error::Package {
        path: model_path.display().to_string(),
        reason: format!("cannot {what} to name its cache: {e}"),
    };
    let memo = memo_dir.map(|d| d.join(format!("{:016x}", files_stamp(model_path))));
    if let Some(id) = memo.as_ref().and_then(|m| fs::read_to_string(m).ok())
        && id.len() == 32
        && id.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Ok(id);
    }
    let graph = oxgen_onnx::Model::load(model_path).map_err(|e| fail("read the graph", &e))?;
    let mut sha = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let files = std::iter::once(model_path.to_path_buf())
        .chain(graph.external_files().into_iter().map(|f| f.path));
    for path in files {
        let mut file = fs::File::open(&path).map_err(|e| fail("read the model", &e))?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        sha.update(name.unwrap_or_default().as_bytes());
        sha.update([0]);
        loop {
            let n = file
                .read(&mut buf)
                .map_err(|e| fail("read the model", &e))?;
            if n == 0 {
                break;
            }
            sha.update(&buf[..n]);
        }
    }
    let id = hex(&sha.finalize()[..16]);
    // Written whole or not at all (a temporary file renamed); a failure only costs time.
    if let (Some(memo), Some(dir)) = (memo, memo_dir) {
        let tmp = memo.with_extension(format!("{}.tmp", std::process::id()));
        let saved = fs::create_dir_all(dir)
            .and_then(|()| fs::write(&tmp, &id))
            .and_then(|()| fs::rename(&tmp, &memo));
        if saved.is_err() {
            let _ = fs::remove_file(&tmp);
        }
    }
    Ok(id)
}

/// Bytes as lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A hash of the names, sizes and modification times of the files beside `model_path` (the
/// package folder's), and of its own path.
fn files_stamp(model_path: &Path) -> u64 {
    let path = fs::canonicalize(model_path).unwrap_or_else(|_| model_path.to_path_buf());
    let mut entries: Vec<(String, u64, u128)> = path
        .parent()
        .and_then(|dir| fs::read_dir(dir).ok())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let meta = e.metadata().ok().filter(|m| m.is_file())?;
            let modified = meta.modified().ok()?.duration_since(std::time::UNIX_EPOCH);
            let name = e.file_name().to_string_lossy().into_owned();
            Some((name, meta.len(), modified.ok()?.as_nanos()))
        })
        .collect();
    entries.sort();
    let mut sha = Sha256::new();
    sha.update(path.to_string_lossy().as_bytes());
    for (name, len, modified) in entries {
        sha.update([0]);
        sha.update(name.as_bytes());
        sha.update(len.to_le_bytes());
        sha.update(modified.to_le_bytes());
    }
    u64::from_le_bytes(sha.finalize()[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_weight_changes_the_identity_and_the_memo_is_used_until_then() {
        let dir = tempfile::tempdir().unwrap();
        let memo = dir.path().join("memo");
        let model = dir.path().join("pkg");
        fs::create_dir(&model).unwrap();
        let weights = |w: Vec<f32>| {
            let mut b = oxgen_onnx::ModelBuilder::new("identity");
            let x = [oxgen_onnx::Dim::Fixed(4)];
            b.input("x", oxgen_tensor::DType::F32, &x);
            b.output("y", oxgen_tensor::DType::F32, &x);
            b.initializer("w", oxgen_tensor::Tensor::from_slice([4], &w).unwrap());
            b.node("Add", "", "add", &["x", "w"], &["y"], vec![]);
            b
        };
        let path = model.join("model.onnx");
        weights(vec![1.0, 2.0, 3.0, 4.0])
            .save(&path, Some(0))
            .unwrap();
        assert!(model.join("model.onnx.data").exists());
        let identity = |p: &Path| model_identity(p, Some(&memo)).unwrap();
        let first = identity(&path);
        assert_eq!(first.len(), 32);
        assert_eq!(fs::read_dir(&memo).unwrap().count(), 1, "remembered");
        assert_eq!(identity(&path), first);
        assert_eq!(
            model_identity(&path, None).unwrap(),
            first,
            "the same unremembered"
        );
        // The same bytes elsewhere are the same model.
        let copy = dir.path().join("copy");
        fs::create_dir(&copy).unwrap();
        for f in ["model.onnx", "model.onnx.data"] {
            fs::copy(model.join(f), copy.join(f)).unwrap();
        }
        assert_eq!(identity(&copy.join("model.onnx")), first);
        // Other weights (the graph file unchanged) are another model.
        weights(vec![1.0, 2.0, 3.0, 5.0])
            .save(&path, Some(0))
            .unwrap();
        assert_ne!(identity(&path), first);
    }
}
