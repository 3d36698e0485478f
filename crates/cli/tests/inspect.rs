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

#[test]
fn inspect_names_ops_without_a_native_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let mut b = ModelBuilder::new("oxgen-test");
    b.opset("", 21).opset("com.microsoft", 1);
    b.input("x", DType::F32, &[Dim::Fixed(4)]);
    b.output("y", DType::F32, &[Dim::Fixed(4)]);
    b.node("FancyOp", "com.microsoft", "f", &["x"], &["y"], vec![]);
    let path = dir.path().join("m.onnx");
    b.save(&path, None).unwrap();
    let out = oxgen(&["inspect", path.to_str().unwrap(), "--json"]);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        r["native_unsupported"],
        serde_json::json!(["com.microsoft::FancyOp"])
    );
    assert_eq!(r["auto_backend"]["backend"], "ort");
    assert!(
        r["auto_backend"]["why"]
            .as_str()
            .unwrap()
            .contains("com.microsoft::FancyOp")
    );
}
