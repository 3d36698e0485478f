//! onnxruntime as an oracle: runs a model file through the `onnxruntime` Python wheel and
//! returns its outputs, for tests that compare native kernels with onnxruntime's.
//!
//! The interpreter comes from `$OXGEN_PYTHON`, which `scripts/test.sh` points at a virtual
//! environment holding the pinned `onnxruntime`, `onnx` and `numpy`. A test that needs the
//! oracle fails (never skips) when it is missing.

use std::path::Path;
use std::process::Command;

use oxgen_tensor::Tensor;

/// The Python interpreter with onnxruntime, or a panic telling how to get one.
pub fn python() -> String {
    std::env::var("OXGEN_PYTHON").unwrap_or_else(|_| {
        panic!("OXGEN_PYTHON is not set: run the tests with scripts/test.sh, which installs onnxruntime into .cache/venv")
    })
}

/// Runs `crates/testkit/python/SCRIPT MODEL DIR` with the oracle's interpreter.
fn run_script(script: &str, model: &Path, dir: &Path) -> Result<(), String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("python")
        .join(script);
    let out = Command::new(python())
        .arg(&script)
        .arg(model)
        .arg(dir)
        .output()
        .map_err(|e| format!("starting {}: {e}", python()))?;
    if !out.status.success() {
        return Err(format!(
            "onnxruntime failed on {}: {}",
            model.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Runs `model` on onnxruntime's CPU provider (one thread, graph optimizations off) and
/// returns its outputs in order.
pub fn run(model: &Path, inputs: &[(String, Tensor)]) -> Result<Vec<Tensor>, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    for (k, (name, t)) in inputs.iter().enumerate() {
        oxgen_onnx::save_tensor_file(&dir.path().join(format!("input_{k}.pb")), name, t)
            .map_err(|e| e.to_string())?;
    }
    run_script("ort_run.py", model, dir.path())?;
    let mut outputs = Vec::new();
    for k in 0.. {
        let path = dir.path().join(format!("output_{k}.pb"));
        if !path.exists() {
            break;
        }
        outputs.push(
            oxgen_onnx::load_tensor_file(&path)
                .map_err(|e| e.to_string())?
                .1,
        );
    }
    Ok(outputs)
}

/// Steps a language-model package through onnxruntime: `steps[0]` is the prompt, each later
/// span continues the sequence (KV fed back at its exact length). Returns every logits row of
/// every span, `[rows, vocab]`.
pub fn step_lm(model: &Path, steps: &[Vec<u32>]) -> Result<Tensor, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let spec = serde_json::json!({ "steps": steps });
    std::fs::write(dir.path().join("steps.json"), spec.to_string()).map_err(|e| e.to_string())?;
    run_script("ort_lm.py", model, dir.path())?;
    oxgen_onnx::load_tensor_file(&dir.path().join("logits.pb"))
        .map(|(_, t)| t)
        .map_err(|e| e.to_string())
}
