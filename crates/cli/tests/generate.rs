//! `oxgen generate`, `bench` and `run` (piped and under a pseudo-terminal) on a fixture
//! package, and the one-line errors users get for bad input.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use oxgen_testkit::fixtures::{FixtureConfig, write_package};

mod support;

fn oxgen() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_oxgen"));
    // Flags under test must not be overridden by the environment running the tests.
    for (key, _) in std::env::vars() {
        if key.starts_with("OXGEN_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("oxgen runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `cmd` with `input` on its stdin; its exit status, stdout and stderr.
fn with_stdin(cmd: &mut Command, input: &[u8]) -> std::process::Output {
    let mut child = (cmd.stdin(Stdio::piped()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

fn package() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_package(dir.path(), &FixtureConfig::default()).unwrap();
    dir
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn generate_json_has_every_field() {
    let dir = package();
    let (code, stdout, stderr) = run(oxgen().args([
        "generate",
        path(dir.path()),
        "the cat",
        "--json",
        "--max-new-tokens",
        "7",
        "--ignore-eos",
        "--threads",
        "1",
    ]));
    assert_eq!(code, 0, "{stderr}");
    let v = json(&stdout);
    assert_eq!(v["token_ids"].as_array().unwrap().len(), 7);
    assert_eq!(v["completion_tokens"], 7);
    assert!(v["prompt_tokens"].as_u64().unwrap() > 2);
    assert_eq!(v["finish_reason"], "length");
    assert!(v["text"].is_string());
    for key in ["load_ms", "ttft_ms", "prefill_tok_s", "decode_tok_s"] {
        assert!(v["timings"][key].as_f64().unwrap() > 0.0, "{key}: {v}");
    }
}

#[test]
fn generate_reads_the_prompt_from_stdin_and_flags_from_the_environment() {
    let dir = package();
    let out = with_stdin(
        oxgen()
            .args(["generate", path(dir.path()), "-", "--json", "--raw"])
            .env("OXGEN_MAX_NEW_TOKENS", "3")
            .env("OXGEN_IGNORE_EOS", "true"),
        b"the dog and the cat",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(v["completion_tokens"], 3);
    // --raw: the text alone, no template around it.
    let model = oxgen::Model::open(dir.path(), &oxgen::ModelOptions::default()).unwrap();
    let ids = model
        .encode(&oxgen::Prompt::Text("the dog and the cat".into()))
        .unwrap();
    assert_eq!(v["prompt_tokens"], ids.len(), "{v}");
}

#[test]
fn seeded_sampling_from_the_cli_repeats() {
    let dir = package();
    let args = [
        "generate",
        path(dir.path()),
        "the cat",
        "--json",
        "--max-new-tokens",
        "16",
        "--ignore-eos",
        "--temperature",
        "1.3",
        "--top-k",
        "20",
        "--top-p",
        "0.95",
        "--min-p",
        "0.01",
        "--repetition-penalty",
        "1.1",
        "--frequency-penalty",
        "0.2",
        "--presence-penalty",
        "-0.1",
        "--seed",
        "11",
    ];
    let [
        (a_code, a, a_err),
        (b_code, b, b_err),
        (code, greedy, stderr),
    ] = [
        run(oxgen().args(args)),
        run(oxgen().args(args)),
        run(oxgen().args(args).arg("--greedy")),
    ];
    assert_eq!((a_code, b_code, code), (0, 0, 0), "{a_err}{b_err}{stderr}");
    assert_eq!(json(&a)["token_ids"], json(&b)["token_ids"]);
    assert_ne!(json(&a)["token_ids"], json(&greedy)["token_ids"]);
}

/// One rule everywhere (the server's): a seed alone turns sampling on for a package whose
/// defaults are greedy, at its temperature; `--temperature 0` keeps it greedy.
#[test]
fn a_seed_alone_turns_sampling_on() {
    let dir = package();
    let args = |extra: &[&str]| {
        let mut a = vec![
            "generate",
            path(dir.path()),
            "the cat",
            "--json",
            "--max-new-tokens",
            "16",
            "--ignore-eos",
        ];
        a.extend_from_slice(extra);
        let (code, out, stderr) = run(oxgen().args(a));
        assert_eq!(code, 0, "{stderr}");
        json(&out)["token_ids"].clone()
    };
    let greedy = args(&[]);
    let seeded = args(&["--seed", "11"]);
    assert_ne!(seeded, greedy, "--seed samples");
    assert_eq!(args(&["--seed", "11"]), seeded, "and repeats");
    assert_eq!(args(&["--seed", "11", "--temperature", "0"]), greedy);
}

#[test]
fn generate_profile_reports_the_figures() {
    let dir = package();
    let (code, _, stderr) = run(oxgen().args([
        "generate",
        path(dir.path()),
        "the cat",
        "--max-new-tokens",
        "5",
        "--ignore-eos",
        "--profile",
    ]));
    assert_eq!(code, 0, "{stderr}");
    for needle in [
        "model load",
        "TTFT",
        "prefill",
        "decode",
        "inter-token     p50",
        " threads",
        "prefix reused: 0 tokens",
        "KV cache",
        "peak RSS",
        "com.microsoft::MatMulNBits",
        "share",
    ] {
        assert!(stderr.contains(needle), "no {needle:?} in:\n{stderr}");
    }
}

#[test]
fn bench_json_reports_medians() {
    let dir = package();
    let (code, stdout, stderr) = run(oxgen().args([
        "bench",
        path(dir.path()),
        "--prompt-len",
        "12",
        "--gen-len",
        "6",
        "--runs",
        "3",
        "--warmup",
        "1",
        "--threads",
        "0",
        "--json",
    ]));
    assert_eq!(code, 0, "{stderr}");
    let v = json(&stdout);
    let cores = std::thread::available_parallelism().unwrap().get();
    assert_eq!(
        v["threads"], cores,
        "the count it ran with, not the 0 asked for"
    );
    assert_eq!(v["prompt_len"], 12);
    for key in ["prefill_tok_s", "decode_tok_s", "ttft_ms"] {
        assert_eq!(v[key]["runs"].as_array().unwrap().len(), 3, "{v}");
        assert!(v[key]["median"].as_f64().unwrap() > 0.0, "{v}");
        assert!(v[key]["std"].as_f64().is_some(), "{v}");
    }
    assert!(v["peak_rss_bytes"].as_u64().unwrap() > 0);
    // KV sized to prompt + generated tokens, in the package's own dtype.
    assert!(v["kv_cache_bytes"].as_u64().unwrap() > 0);
    assert_eq!(v["kv_dtype"], "f32");
}

/// `--kv-dtype` (and `OXGEN_KV_DTYPE`) choose what the cache stores: bench reports it and
/// the bytes it takes (int8: a byte per value and a 4-byte scale per head vector).
#[test]
fn kv_dtype_sets_what_the_cache_stores() {
    let dir = package();
    let bench = |kv: &str| {
        let (code, stdout, stderr) = run(oxgen().env("OXGEN_KV_DTYPE", kv).args([
            "bench",
            path(dir.path()),
            "--prompt-len",
            "12",
            "--gen-len",
            "4",
            "--runs",
            "1",
            "--json",
        ]));
        assert_eq!(code, 0, "{kv}: {stderr}");
        json(&stdout)
    };
    let (f32, int8) = (bench("f32"), bench("int8"));
    assert_eq!(int8["kv_dtype"], "int8");
    let bytes = |v: &serde_json::Value| v["kv_cache_bytes"].as_u64().unwrap();
    let head_size = FixtureConfig::default().head_size() as u64;
    assert_eq!(bytes(&int8) * 4 * head_size, bytes(&f32) * (head_size + 4));
}

#[test]
fn run_with_piped_stdin_answers_each_line() {
    let dir = package();
    let out = with_stdin(
        oxgen().args([
            "run",
            path(dir.path()),
            "--max-new-tokens",
            "4",
            "--ignore-eos",
        ]),
        b"the cat\n/set temperature 0\n\nthe dog\n/exit\nnever sent\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 2, "two replies: {stdout:?}");
    assert!(stderr.contains("temperature = 0"), "{stderr}");
}

/// `/save` then `/load` in another process: the conversation resumes with its KV, and the
/// next reply is the one the unsaved conversation gives.
#[test]
fn run_saves_a_conversation_and_another_run_resumes_it() {
    let dir = package();
    let session = dir.path().join("cats.session");
    let chat = |input: String| {
        let out = with_stdin(
            oxgen()
                .args(["run", path(dir.path()), "--max-new-tokens", "4"])
                .args(["--ignore-eos", "--temperature", "0"]),
            input.as_bytes(),
        );
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
    };
    let (whole, _) = chat("the cat\nthe dog\n".into());
    let (_, saved) = chat(format!("the cat\n/save {}\n", session.display()));
    assert!(saved.contains("positions of KV"), "{saved}");
    let (resumed, stderr) = chat(format!("/load {}\nthe dog\n", session.display()));
    assert!(stderr.contains("resumed 2 messages with"), "{stderr}");
    assert_eq!(resumed.lines().last(), whole.lines().last());
    let (_, stderr) = chat("/load nowhere/at-all.session\n".into());
    assert!(
        stderr.contains("/load: ") && stderr.contains("at-all.session"),
        "{stderr}"
    );
}

#[test]
fn run_under_a_terminal_chats_with_commands_and_stats() {
    use expectrl::{Eof, Session};
    let dir = package();
    let history = dir.path().join("history");
    let mut cmd = oxgen();
    cmd.args([
        "run",
        path(dir.path()),
        "--max-new-tokens",
        "6",
        "--ignore-eos",
        "--history",
        path(&history),
    ]);
    let mut s = Session::spawn(cmd).expect("spawning under a pty");
    s.set_expect_timeout(Some(std::time::Duration::from_secs(30)));
    s.expect(">>> ").unwrap();
    s.send_line("/help").unwrap();
    s.expect("/system TEXT").unwrap();
    s.send_line("the cat").unwrap();
    // The stats line after the reply.
    s.expect("tok/s").unwrap();
    s.send_line("the dog").unwrap();
    // The second turn's prompt starts with the first turn's: its KV is reused, not prefilled.
    let stats = s.expect(expectrl::Regex(r"\((\d+) reused\)")).unwrap();
    let reused: usize = std::str::from_utf8(stats.get(1).unwrap())
        .unwrap()
        .parse()
        .unwrap();
    assert!(reused > 0, "the second turn reused nothing");
    s.send_line("/stats").unwrap();
    s.expect("KV cache").unwrap();
    s.send_line("/set top_p 2").unwrap();
    s.expect("must be in (0, 1]").unwrap();
    // /reset forgets the conversation and its KV: the next turn reuses nothing.
    s.send_line("/reset").unwrap();
    s.expect("conversation cleared").unwrap();
    s.send_line("the dog").unwrap();
    let prompt_of = |s: &mut Session| {
        let stats = s
            .expect(expectrl::Regex(r"prompt (\d+) tokens \((\d+) reused\)"))
            .unwrap();
        let n = |i| -> usize {
            std::str::from_utf8(stats.get(i).unwrap())
                .unwrap()
                .parse()
                .unwrap()
        };
        (n(1), n(2))
    };
    let (alone, reused) = prompt_of(&mut s);
    assert_eq!(reused, 0, "after /reset");
    // /system puts a system message first: the same question is a longer prompt.
    s.send_line("/reset").unwrap();
    s.expect("conversation cleared").unwrap();
    s.send_line("/system Answer in one word.").unwrap();
    s.expect("system prompt set").unwrap();
    s.send_line("the dog").unwrap();
    let (with_system, _) = prompt_of(&mut s);
    assert!(
        with_system > alone,
        "{with_system} vs {alone} prompt tokens"
    );
    // Ctrl-C at the prompt warns; a second one quits.
    s.send("\x03").unwrap();
    s.expect("Ctrl-C again").unwrap();
    s.send("\x03").unwrap();
    s.expect(Eof).unwrap();
    let saved = std::fs::read_to_string(&history).expect("the history file is written");
    assert!(saved.contains("the dog"), "{saved}");
}

/// One line on stderr, starting with `error:` or clap's usage error, and the exit code.
fn fails(args: &[&str], code: i32, needles: &[&str]) {
    let (got, stdout, stderr) = run(oxgen().args(args));
    assert_eq!(got, code, "{args:?}: {stderr}");
    assert!(stdout.is_empty(), "{args:?} printed {stdout}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "{args:?}: no {n:?} in {stderr}");
    }
}

#[test]
fn bad_input_is_a_one_line_error_never_a_panic() {
    let dir = package();
    let p = path(dir.path());
    fails(&["generate", p, "x", "--temperature", "-1"], 2, &[">= 0"]);
    fails(&["generate", p, "x", "--top-p", "0"], 2, &["(0, 1]"]);
    fails(&["generate", p, "x", "--top-p", "1.5"], 2, &["(0, 1]"]);
    fails(&["generate", p, "x", "--min-p", "2"], 2, &["[0, 1]"]);
    fails(
        &["generate", p, "x", "--repetition-penalty", "0"],
        2,
        &["> 0"],
    );
    fails(
        &["generate", p, "x", "--frequency-penalty", "3"],
        2,
        &["[-2, 2]"],
    );
    fails(
        &["generate", p, "x", "--temperature", "NaN"],
        2,
        &["finite"],
    );
    fails(&["bench", p, "--runs", "0"], 2, &["--runs"]);
    fails(
        &["generate", p, "x", "--kv-dtype", "q4"],
        2,
        &["f32, f16, bf16 or int8"],
    );
    // A prompt longer than the context says both numbers.
    fails(
        &[
            "generate",
            p,
            "the cat and the dog and the cat",
            "--raw",
            "--ctx-size",
            "4",
        ],
        1,
        &["error:", "13 tokens", "context holds 4"],
    );
    fails(
        &["generate", "/no/such/model", "x"],
        1,
        &["error:", "/no/such/model", "no such file or folder"],
    );
    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    fails(&["generate", p, "x"], 1, &["error:", "tokenizer.json"]);
}

/// `--backend ort` runs the package through ONNX Runtime (the wheel's library, found through
/// `$OXGEN_PYTHON`) with the same greedy text as native on this f32 package.
#[test]
fn generate_runs_on_onnxruntime_with_the_same_greedy_text() {
    let dir = package();
    let python = std::env::var("OXGEN_PYTHON")
        .expect("OXGEN_PYTHON is not set: run scripts/test.sh (its venv has onnxruntime)");
    let text = |backend: &str| {
        let (code, stdout, stderr) = run(oxgen().env("OXGEN_PYTHON", &python).args([
            "generate",
            path(dir.path()),
            "the cat and the dog",
            "--max-new-tokens",
            "12",
            "--ignore-eos",
            "--json",
            "--backend",
            backend,
        ]));
        assert_eq!(code, 0, "{backend}: {stderr}");
        json(&stdout)
    };
    let (native, ort) = (text("native"), text("ort"));
    assert_eq!(native["token_ids"], ort["token_ids"]);
    assert_eq!(native["text"], ort["text"]);

    // ONNX Runtime keeps the graph's KV dtype: another is refused, naming the way out.
    let (code, _, stderr) = run(oxgen().env("OXGEN_PYTHON", &python).args([
        "generate",
        path(dir.path()),
        "hi",
        "--backend",
        "ort",
        "--kv-dtype",
        "int8",
    ]));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("--kv-dtype int8 needs the native backend"),
        "{stderr}"
    );

    // A library that is not there: one line naming what was looked for, exit 1.
    let (code, _, stderr) = run(oxgen().args([
        "generate",
        path(dir.path()),
        "hi",
        "--backend",
        "ort",
        "--ort-lib",
        "/nonexistent/libonnxruntime.so",
    ]));
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("/nonexistent/libonnxruntime.so") && stderr.contains("pip install"),
        "{stderr}"
    );
}

/// `--stop`, `--system`, `--no-stream` and `--exact` as the CLI parses them: each changes what
/// it says it changes, against a plain run of the same greedy prompt.
#[test]
fn generate_flags_do_what_they_say() {
    let dir = package();
    let p = path(dir.path());
    let base = [
        "generate",
        p,
        "the cat",
        "--max-new-tokens",
        "12",
        "--ignore-eos",
    ];
    let go = |extra: &[&str]| {
        let (code, stdout, stderr) = run(oxgen().args(base).args(extra));
        assert_eq!(code, 0, "{extra:?}: {stderr}");
        stdout
    };
    let plain = json(&go(&["--json"]));
    let text = plain["text"].as_str().unwrap().to_string();

    // --stop: cut before the first occurrence of a character the plain text has after its
    // first token, and finish "stop".
    let (at, c) = text
        .char_indices()
        .skip(1)
        .find(|&(_, c)| c != '\u{fffd}' && !c.is_whitespace())
        .expect("a stop character in the plain text");
    let stopped = json(&go(&["--json", "--stop", &c.to_string()]));
    assert_eq!(stopped["text"], text[..at], "stop on {c:?}");
    assert_eq!(stopped["finish_reason"], "stop");

    // --system: a system message goes before the prompt.
    let system = json(&go(&["--json", "--system", "Answer briefly."]));
    assert!(
        system["prompt_tokens"].as_u64() > plain["prompt_tokens"].as_u64(),
        "{system} vs {plain}"
    );

    // --no-stream: the same text, printed once at the end.
    assert_eq!(go(&["--no-stream"]).trim_end_matches('\n'), text);

    // --exact: f32 activations everywhere; this fixture is accuracy_level 0 already, so the
    // same ids.
    assert_eq!(
        json(&go(&["--json", "--exact"]))["token_ids"],
        plain["token_ids"]
    );
}

/// `bench --batch`, `--prompt fixed` and `--profile`: the JSON says what ran, and the profile
/// goes to stderr with time per op type.
#[test]
fn bench_batch_fixed_prompt_and_profile() {
    let dir = package();
    let (code, stdout, stderr) = run(oxgen().args([
        "bench",
        path(dir.path()),
        "--batch",
        "2",
        "--prompt",
        "fixed",
        "--profile",
        "--json",
        "--prompt-len",
        "16",
        "--gen-len",
        "8",
    ]));
    assert_eq!(code, 0, "{stderr}");
    let r = json(&stdout);
    assert_eq!(
        (r["batch"].as_u64(), r["prompt_len"].as_u64()),
        (Some(2), Some(16))
    );
    assert!(r["decode_tok_s"]["median"].as_f64().unwrap() > 0.0, "{r}");
    assert!(
        r["weight_bytes_per_step"]["median"].as_f64().unwrap() > 0.0,
        "{r}"
    );
    assert!(
        stderr.contains("MatMulNBits") || stderr.contains("GroupQueryAttention"),
        "no per-op profile in {stderr}"
    );
}

/// `--backend auto` on a package with an op native lacks (a `Shrink` that passes the logits
/// through unchanged, added with the onnx package): generation falls back to ONNX Runtime,
/// says so once on stderr, and gives the ids native gives for the package without it.
#[test]
fn auto_falls_back_to_onnx_runtime_for_an_op_native_lacks() {
    let dir = package();
    let shrunk = tempfile::tempdir().unwrap();
    let script = r#"
import os, shutil, sys
import onnx
from onnx import helper
src, dst = sys.argv[1], sys.argv[2]
m = onnx.load(os.path.join(src, "model.onnx"), load_external_data=False)
out = m.graph.output[0].name
for n in m.graph.node:
    n.output[:] = [o + "_pre" if o == out else o for o in n.output]
m.graph.node.append(helper.make_node("Shrink", [out + "_pre"], [out], lambd=0.0, bias=0.0))
onnx.save(m, os.path.join(dst, "model.onnx"))
for f in os.listdir(src):
    if f != "model.onnx":
        shutil.copy(os.path.join(src, f), dst)
import onnxruntime
print(os.path.dirname(onnxruntime.__file__))
"#;
    let ort_lib = support::run_python(script, &[dir.path().as_os_str(), shrunk.path().as_os_str()])
        .trim()
        .to_string();
    let generate = |p: &Path| {
        run(oxgen().args([
            "generate",
            path(p),
            "the cat",
            "--json",
            "--max-new-tokens",
            "8",
            "--ignore-eos",
            "--ort-lib",
            &ort_lib,
        ]))
    };
    let (code, native, stderr) = generate(dir.path());
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("ONNX Runtime"), "{stderr}");
    let (code, fallback, stderr) = generate(shrunk.path());
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("no kernel for ai.onnx::Shrink; running it on ONNX Runtime"),
        "{stderr}"
    );
    assert_eq!(json(&fallback)["token_ids"], json(&native)["token_ids"]);
}

/// `--lora NAME=PATH`: generate runs under the adapter (the ids the library gives under it,
/// not the base's); bench --batch spreads its sequences over the adapters; a malformed flag
/// or a file that is no adapter is a one-line error.
#[test]
fn lora_flags_run_generate_and_bench_under_adapters() {
    let lora = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testkit/thirdparty/lora");
    let package = lora.join("llama3-lora-fp32");
    let adapter = |name: &str, file: &str| format!("{name}={}", lora.join(file).display());
    let generate = |extra: &[&str]| {
        let mut cmd = oxgen();
        cmd.args(["generate", path(&package), "--raw", "the cat sat", "--json"]);
        cmd.args(["--max-new-tokens", "12", "--ignore-eos", "--threads", "1"]);
        run(cmd.args(extra))
    };
    let ids = |stdout: &str| json(stdout)["token_ids"].clone();
    let (code, stdout, stderr) = generate(&["--lora", &adapter("a", "a.onnx_adapter")]);
    assert_eq!(code, 0, "{stderr}");
    let options = oxgen::ModelOptions {
        threads: 1,
        lora: vec![("a".into(), lora.join("a-peft"))],
        ..oxgen::ModelOptions::default()
    };
    let mut model = oxgen::Model::open(&package, &options).unwrap();
    let mut want = oxgen::GenerateOptions {
        max_new_tokens: 12,
        ignore_eos: true,
        adapter: Some("a".into()),
        ..oxgen::GenerateOptions::default()
    };
    let prompt = oxgen::Prompt::Text("the cat sat".into());
    let adapted = model.generate(&prompt, &want, |_| {}).unwrap().tokens;
    assert_eq!(ids(&stdout), serde_json::json!(adapted));
    want.adapter = None;
    let base = model.generate(&prompt, &want, |_| {}).unwrap().tokens;
    assert_ne!(adapted, base);

    let (code, stdout, stderr) = run(oxgen().args([
        "bench",
        path(&package),
        "--batch",
        "2",
        "--prompt-len",
        "8",
        "--gen-len",
        "4",
        "--runs",
        "1",
        "--warmup",
        "0",
        "--json",
        "--lora",
        &adapter("a", "a.onnx_adapter"),
        "--lora",
        &adapter("b", "b-peft"),
    ]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json(&stdout)["adapters"], 2);

    let (code, _, stderr) = generate(&["--lora", "a"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("NAME=PATH"), "{stderr}");
    let (code, _, stderr) = generate(&["--lora", &adapter("x", "lora.json")]);
    assert_ne!(code, 0);
    assert!(
        stderr.contains("LoRA adapter 'x'") && stderr.contains("TORT"),
        "{stderr}"
    );
}
