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

/// A disk that fills up mid-import: the import fails with one line naming the file and the
/// cause, and leaves nothing behind, neither the package nor its staging folder. The full disk
/// is a 4 MiB tmpfs mounted in a private mount namespace (`unshare`, as an unprivileged user
/// mapped to root), and the package the default GGUF makes is about 150 MB.
#[test]
fn a_full_disk_fails_the_import_and_leaves_nothing_behind() {
    let gguf = std::env::var("OXGEN_DEFAULT_GGUF").unwrap_or_else(|_| {
        panic!("OXGEN_DEFAULT_GGUF is not set: scripts/test.sh sets it to the default model's GGUF")
    });
    let dir = tempfile::tempdir().unwrap();
    let script = r#"mount -t tmpfs -o size=4m tmpfs "$0" || exit 90
"$1" import "$2" "$0/pkg"
echo "exit=$?" >&2
echo "left: $(ls -A "$0")" >&2"#;
    let o = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c", script])
        .arg(dir.path())
        .arg(env!("CARGO_BIN_EXE_oxgen"))
        .arg(&gguf)
        .output()
        .expect("unshare (util-linux) runs");
    let err = stderr(&o);
    assert!(o.status.success(), "the tmpfs could not be mounted: {err}");
    assert!(err.contains("exit=1"), "{err}");
    let error = err.lines().find(|l| l.starts_with("error:")).unwrap_or("");
    assert!(
        error.contains("No space left on device") && error.contains("model.onnx.data"),
        "{err}"
    );
    assert!(err.contains("left: \n") || err.ends_with("left: "), "{err}");
}
