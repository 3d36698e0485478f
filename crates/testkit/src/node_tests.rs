//! One ONNX backend node-test case: load, run, compare.
//!
//! A case folder holds `model.onnx` and one or more `test_data_set_N/` folders with
//! `input_K.pb` / `output_K.pb` TensorProto files. Inputs bind to the model's graph inputs in
//! order (after dropping inputs that are initializers); outputs compare in order.

use std::path::{Path, PathBuf};

use oxgen_runtime::Session;
use serde::{Deserialize, Serialize};

use crate::compare::{Tolerance, mismatch};

/// How a case ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", content = "detail", rename_all = "snake_case")]
pub enum Outcome {
    Pass,
    /// The model loaded but an output was wrong, or the run failed.
    Fail(String),
    /// The model could not be loaded (unsupported op, opset, attribute, dtype).
    Unsupported(String),
}

/// Builds a session for a model file; backends plug in here.
pub type SessionFactory = dyn Fn(&Path) -> Result<Box<dyn Session>, String>;

/// The native backend on one thread.
pub fn native_session(model: &Path) -> Result<Box<dyn Session>, String> {
    let model = oxgen_onnx::Model::load(model).map_err(|e| e.to_string())?;
    let graph = oxgen_graph::Graph::from_model(&model).map_err(|e| e.to_string())?;
    Ok(Box::new(oxgen_exec::NativeSession::new(
        graph,
        &oxgen_exec::ExecOptions {
            threads: 1,
            ..Default::default()
        },
    )))
}

/// ONNX Runtime (the `onnxruntime` wheel's library) on one thread: a check of the runner
/// itself, since ONNX Runtime should pass nearly every case.
pub fn ort_session(model: &Path) -> Result<Box<dyn Session>, String> {
    oxgen_ort::OrtSession::open(model, None, 1)
        .map(|s| Box::new(s) as Box<dyn Session>)
        .map_err(|e| e.to_string())
}

fn numbered(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut files: Vec<(usize, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let n = name
                .strip_prefix(prefix)?
                .strip_suffix(".pb")?
                .parse()
                .ok()?;
            Some((n, e.path()))
        })
        .collect();
    files.sort();
    files.into_iter().map(|(_, p)| p).collect()
}

/// The `test_data_set_N` folders of a case, in order.
pub fn data_sets(case: &Path) -> Vec<PathBuf> {
    let mut sets: Vec<PathBuf> = std::fs::read_dir(case)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_dir()
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("test_data_set_"))
        })
        .collect();
    sets.sort();
    sets
}

/// Runs one case folder with `factory` and compares at `tol`.
pub fn run_case(case: &Path, factory: &SessionFactory, tol: Tolerance) -> Outcome {
    let mut session = match factory(&case.join("model.onnx")) {
        Ok(s) => s,
        Err(e) => return Outcome::Unsupported(e),
    };
    let sets = data_sets(case);
    if sets.is_empty() {
        return Outcome::Fail("no test_data_set_N folder".into());
    }
    for set in sets {
        let set_name = set
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut inputs = Vec::new();
        for (i, file) in numbered(&set, "input_").into_iter().enumerate() {
            let Some(spec) = session.inputs().get(i) else {
                return Outcome::Fail(format!(
                    "{set_name}: {} has no matching model input",
                    file.display()
                ));
            };
            match oxgen_onnx::load_tensor_file(&file) {
                Ok((_, t)) => inputs.push((spec.name.clone(), t)),
                Err(e) => return Outcome::Unsupported(format!("{set_name}: {e}")),
            }
        }
        let mut expected = Vec::new();
        for file in numbered(&set, "output_") {
            match oxgen_onnx::load_tensor_file(&file) {
                Ok((_, t)) => expected.push(t),
                Err(e) => return Outcome::Unsupported(format!("{set_name}: {e}")),
            }
        }
        let outputs = match session.run(inputs) {
            Ok(o) => o,
            Err(e) => return Outcome::Fail(format!("{set_name}: {e}")),
        };
        if outputs.len() != expected.len() {
            return Outcome::Fail(format!(
                "{set_name}: {} outputs, expected {}",
                outputs.len(),
                expected.len()
            ));
        }
        for ((name, actual), expected) in outputs.iter().zip(&expected) {
            if let Some(why) = mismatch(actual, expected, tol) {
                return Outcome::Fail(format!("{set_name}: output '{name}': {why}"));
            }
        }
    }
    Outcome::Pass
}
