//! `--speculative` and `--spec-tokens` as the CLI parses them: the same greedy text on the
//! native and ONNX Runtime backends with every proposer, what `--json` and `bench --json`
//! report, and one-line usage errors for bad values.

use std::process::Command;

use oxgen_testkit::fixtures::{FixtureConfig, write_package};

fn oxgen() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_oxgen"));
    for (key, _) in std::env::vars() {
        if key.starts_with("OXGEN_") && key != "OXGEN_PYTHON" {
            cmd.env_remove(key);
        }
    }
    cmd
}

fn run(args: &[&str]) -> (i32, serde_json::Value, String) {
    let out = oxgen().args(args).output().expect("oxgen runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json = serde_json::from_str(stdout.trim()).unwrap_or(serde_json::Value::Null);
    (out.status.code().unwrap_or(-1), json, stderr)
}

#[test]
fn speculative_generation_keeps_the_text_on_both_backends() {
    let dir = tempfile::tempdir().unwrap();
    write_package(dir.path(), &FixtureConfig::default()).unwrap();
    let p = dir.path().to_str().unwrap();
    let draft = format!("draft:{p}");
    let generate = |backend: &str, extra: &[&str]| {
        let mut args = vec![
            "generate",
            p,
            "the cat and the dog and the cat and the dog and the",
            "--raw",
            "--max-new-tokens",
            "24",
            "--ignore-eos",
            "--json",
            "--threads",
            "1",
            "--backend",
            backend,
        ];
        args.extend_from_slice(extra);
        let (code, json, stderr) = run(&args);
        assert_eq!(code, 0, "{backend} {extra:?}: {stderr}");
        json
    };
    let plain = generate("native", &[]);
    assert_eq!(plain["speculation"]["proposed"], 0);
    for backend in ["native", "ort"] {
        for mode in ["prompt-lookup:1-3", draft.as_str()] {
            let spec = generate(backend, &["--speculative", mode, "--spec-tokens", "4"]);
            assert_eq!(spec["token_ids"], plain["token_ids"], "{backend} {mode}");
            assert_eq!(spec["text"], plain["text"], "{backend} {mode}");
            let s = &spec["speculation"];
            assert!(
                s["accepted"].as_u64().unwrap() > 0,
                "{backend} {mode}: {spec}"
            );
            assert!(s["tokens_per_step"].as_f64().unwrap() > 1.0, "{spec}");
        }
    }
    // The self draft runs the model's first layers natively; ONNX Runtime is refused.
    let spec = generate("native", &["--speculative", "self:1"]);
    assert_eq!(spec["token_ids"], plain["token_ids"]);
    let (code, _, stderr) = run(&[
        "generate",
        p,
        "hi",
        "--backend",
        "ort",
        "--speculative",
        "self:1",
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("native backend"), "{stderr}");

    // bench --json reports what speculation did.
    let (code, bench, stderr) = run(&[
        "bench",
        p,
        "--prompt",
        "fixed",
        "--prompt-len",
        "32",
        "--gen-len",
        "16",
        "--runs",
        "2",
        "--threads",
        "1",
        "--json",
        "--speculative",
        "prompt-lookup:1-2",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(bench["speculative"], "prompt-lookup");
    let rate = bench["spec_accept_rate"]["median"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&rate), "{bench}");
    assert!(bench["spec_tokens_per_step"]["median"].as_f64().unwrap() >= 1.0);
    assert_eq!(bench["generated_tokens"]["median"], 16.0);
}

#[test]
fn bad_speculative_values_are_usage_errors() {
    for args in [
        &["--speculative", "lookup"][..],
        &["--speculative", "self:0"],
        &["--speculative", "prompt-lookup:3-1"],
        &["--spec-tokens", "0"],
        &["--spec-tokens", "33"],
    ] {
        let mut all = vec!["generate", "/nonexistent", "hi"];
        all.extend_from_slice(args);
        let (code, _, stderr) = run(&all);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(args[0]), "{args:?}: {stderr}");
    }
    // A draft that is not there: one line naming it.
    let dir = tempfile::tempdir().unwrap();
    write_package(dir.path(), &FixtureConfig::default()).unwrap();
    let p = dir.path().to_str().unwrap();
    let (code, _, stderr) = run(&[
        "generate",
        p,
        "hi",
        "--speculative",
        "draft:/nonexistent-draft",
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("/nonexistent-draft"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}
