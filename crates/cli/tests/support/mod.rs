//! What several of the CLI's test binaries share.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;

/// The test venv's Python (`OXGEN_PYTHON`, set by scripts/test.sh).
pub fn python() -> PathBuf {
    std::env::var_os("OXGEN_PYTHON")
        .unwrap_or_else(|| {
            panic!("OXGEN_PYTHON is not set: scripts/test.sh sets it to .cache/venv/bin/python")
        })
        .into()
}

/// Runs `script` (`python -c`) with `args`; fails the test on an error, else its stdout.
pub fn run_python(script: &str, args: &[&OsStr]) -> String {
    let out = stdout_of(Command::new(python()).arg("-c").arg(script).args(args));
    String::from_utf8(out).unwrap()
}

/// Runs `command`; its stdout, or a failed test showing its stderr.
pub fn stdout_of(command: &mut Command) -> Vec<u8> {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}
