//! `oxgen import` on a tiny synthetic GGUF (written by oxgen-import's gguf-py test script):
//! the package it writes, its exit codes and one-line errors, flags from the environment.
//!
//! Needs `OXGEN_PYTHON` (a Python with gguf 0.19.0 and numpy; `scripts/test.sh` sets it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn oxgen(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oxgen"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("oxgen runs")
}

fn synthetic_gguf(dir: &Path) -> PathBuf {
    let python = std::env::var_os("OXGEN_PYTHON").unwrap_or_else(|| {
        panic!("OXGEN_PYTHON is not set: scripts/test.sh sets it to .cache/venv/bin/python")
    });
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../import/tests/python/make_gguf.py");
    let path = dir.join("tiny.gguf");
    let out = Command::new(python)
        .arg(script)
        .args(["llama", path.to_str().unwrap()])
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn import_writes_a_package_that_generate_runs() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = synthetic_gguf(dir.path());
    let (g, pkg) = (gguf.to_str().unwrap(), dir.path().join("pkg"));
    let p = pkg.to_str().unwrap();

    let o = oxgen(&["import", g, p, "--accuracy-level", "0"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "stdout carries no logs");
    assert!(
        stderr(&o).contains("imported llama (2 layers"),
        "{}",
        stderr(&o)
    );
    for f in [
        "model.onnx",
        "model.onnx.data",
        "genai_config.json",
        "tokenizer.json",
    ] {
        assert!(pkg.join(f).is_file(), "{f} missing");
    }

    let o = oxgen(&["import", g, p], &[]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.starts_with("error: ") && e.contains("already exists"),
        "{e}"
    );
    assert_eq!(e.trim_end().lines().count(), 1, "one-line error: {e}");
    let o = oxgen(&["import", g, p], &[("OXGEN_FORCE", "true")]);
    assert!(o.status.success(), "{}", stderr(&o));

    let o = oxgen(&["import", g, p, "--force", "--accuracy-level", "3"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = oxgen(
        &["import", g, p, "--force"],
        &[("OXGEN_ACCURACY_LEVEL", "7")],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));

    let o = oxgen(
        &["generate", p, "the cat", "--raw", "--max-new-tokens", "3"],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_file_that_is_not_gguf_fails_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"not a gguf file at all").unwrap();
    let out = dir.path().join("out");
    let o = oxgen(
        &["import", bad.to_str().unwrap(), out.to_str().unwrap()],
        &[],
    );
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("bad.gguf") && e.contains("GGUF magic"), "{e}");
    assert!(!out.exists());
}
