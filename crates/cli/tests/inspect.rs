//! `oxgen inspect` on a model with external data written by oxgen's own writer.

use std::process::Command;

use oxgen_onnx::writer::{Dim, ModelBuilder, attr};
use oxgen_tensor::{DType, Tensor};

fn oxgen(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_oxgen"))
        .args(args)
        .output()
        .expect("oxgen runs")
}

fn write_model(dir: &std::path::Path) -> std::path::PathBuf {
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 21);
    b.input(
        "x",
        DType::F32,
        &[Dim::Symbolic("batch".into()), Dim::Fixed(64)],
    );
    b.output(
        "y",
        DType::F32,
        &[Dim::Symbolic("batch".into()), Dim::Fixed(32)],
    );
    let w: Vec<f32> = (0..64 * 32).map(|i| i as f32).collect();
    b.initializer("w", Tensor::from_slice([64, 32], &w).unwrap());
    b.initializer("bias", Tensor::from_slice([32], &[0.5f32; 32]).unwrap());
    b.node("MatMul", "", "mm", &["x", "w"], &["h"], vec![]);
    b.node("Add", "", "add", &["h", "bias"], &["y"], vec![]);
    b.node(
        "Softmax",
        "",
        "sm",
        &["y"],
        &["p"],
        vec![attr::int("axis", -1)],
    );
    let path = dir.join("model.onnx");
    b.save(&path, Some(1024)).unwrap();
    path
}

#[test]
fn inspect_reports_io_ops_and_external_data() {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path());
    let out = oxgen(&["inspect", dir.path().to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["opsets"]["ai.onnx"], 21);
    assert_eq!(r["ops"]["ai.onnx"]["MatMul"], 1);
    assert_eq!(r["inputs"][0]["shape"], serde_json::json!(["batch", "64"]));
    assert_eq!(r["initializers"], 2);
    assert_eq!(r["initializer_bytes"], 64 * 32 * 4 + 32 * 4);
    let ext = &r["external_files"][0];
    assert_eq!(ext["referenced_bytes"], 64 * 32 * 4);
    assert!(ext["warning"].is_null());
    assert_eq!(r["native_unsupported"], serde_json::json!([]));
    assert_eq!(r["auto_backend"]["backend"], "native");

    let text = oxgen(&["inspect", dir.path().join("model.onnx").to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(
        stdout.contains("MatMul 1") && stdout.contains("external data"),
        "{stdout}"
    );
}

#[test]
fn inspect_warns_when_the_data_file_is_mostly_unused() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_model(dir.path());
    let data = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p != &path)
        .unwrap();
    let f = std::fs::OpenOptions::new()
        .append(true)
        .open(&data)
        .unwrap();
    f.set_len(8 << 20).unwrap();
    let out = oxgen(&["inspect", path.to_str().unwrap()]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning") && stderr.contains("unused"),
        "{stderr}"
    );
}

#[test]
fn inspect_errors_are_one_line_with_exit_code_1() {
    let out = oxgen(&["inspect", "/nonexistent/model.onnx"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("/nonexistent/model.onnx"), "{stderr}");
    assert_eq!(
        oxgen(&["inspect"]).status.code(),
        Some(2),
        "usage errors exit 2"
    );
}

/// A one-node model of `op_type` in `domain`.
fn one_op_model(dir: &std::path::Path, domain: &str, op_type: &str) -> std::path::PathBuf {
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 21);
    if !domain.is_empty() {
        b.opset(domain, 1);
    }
    b.input("x", DType::F32, &[Dim::Fixed(2), Dim::Fixed(2)]);
    b.output("y", DType::F32, &[]);
    b.node(op_type, domain, "f", &["x"], &["y"], vec![]);
    let path = dir.join(format!("{op_type}.onnx"));
    b.save(&path, None).unwrap();
    path
}

/// Needs ONNX Runtime (found through `OXGEN_PYTHON`'s onnxruntime, as scripts/test.sh sets it).
#[test]
fn inspect_says_which_backend_runs_an_op_native_lacks_and_fails_when_none_can() {
    let dir = tempfile::tempdir().unwrap();
    let ort_lib = || {
        let python = std::env::var("OXGEN_PYTHON").expect("OXGEN_PYTHON is set by scripts/test.sh");
        let out = Command::new(python)
            .args(["-c", "import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), 'capi'))"])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let lib = ort_lib();
    // Det: ONNX Runtime has a kernel, native does not; auto runs it on ort.
    let det = one_op_model(dir.path(), "", "Det");
    let out = oxgen(&[
        "inspect",
        det.to_str().unwrap(),
        "--json",
        "--ort-lib",
        &lib,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["native_unsupported"], serde_json::json!(["ai.onnx::Det"]));
    assert_eq!(r["auto_backend"]["backend"], "ort");

    // An op neither has: the report still prints, then one error line and exit 1.
    let fancy = one_op_model(dir.path(), "com.microsoft", "FancyOp");
    let out = oxgen(&[
        "inspect",
        fancy.to_str().unwrap(),
        "--json",
        "--ort-lib",
        &lib,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        r["native_unsupported"],
        serde_json::json!(["com.microsoft::FancyOp"])
    );
    assert_eq!(r["auto_backend"]["backend"], "none");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: no backend can run")
            && stderr.contains("com.microsoft::FancyOp")
            && stderr.contains("ONNX Runtime cannot load it"),
        "{stderr}"
    );
}
