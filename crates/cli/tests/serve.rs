//! `oxgen serve` as a process on the default model: the official `openai` Python client runs
//! its checks against it, and SIGTERM drains running requests then exits 0.

#[path = "../../server/tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const MODEL: &str = "SmolLM2-135M-Instruct";

/// A running `oxgen serve`, killed if a test fails before it stops it.
struct Served {
    child: Option<Child>,
    addr: SocketAddr,
    /// What it wrote to stderr after "listening".
    log: Arc<Mutex<String>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Served {
    /// SIGTERM, then the exit code once it has exited.
    fn stop(&mut self, within: Duration) -> Option<i32> {
        let mut child = self.child.take().expect("still running");
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("oxgen serve did not exit within {within:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Starts `oxgen serve` on the default model on a free port and waits until it is ready.
fn serve(extra: &[&str]) -> Served {
    serve_at(&common::default_model(), extra)
}

/// [`serve`] on the package in `model`.
fn serve_at(model: &Path, extra: &[&str]) -> Served {
    let mut args = vec![model.as_os_str()];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    serve_with(&args)
}

/// `oxgen serve ARGS --port 0 --threads 2`, once it is ready.
fn serve_with<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_oxgen"))
        .arg("serve")
        .args(args)
        .args(["--port", "0", "--threads", "2"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut served = Served {
        child: Some(child),
        addr: ([127, 0, 0, 1], 0).into(),
        log: Arc::default(),
    };
    let mut line = String::new();
    served.addr = loop {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "oxgen serve exited before listening"
        );
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    let log = served.log.clone();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let mut log = log.lock().unwrap();
            log.push_str(&line);
            log.push('\n');
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    while common::get(served.addr, "/health").status != 200 {
        assert!(Instant::now() < deadline, "the server never became ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    served
}

/// Runs `script` (under `crates/server/tests/python/`) with `python`, `args` and `envs`;
/// fails the test, showing its report, unless it exits 0.
fn run_script(python: PathBuf, script: &str, args: &[String], envs: &[(&str, &str)]) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../server/tests/python")
        .join(script);
    let mut command = Command::new(python);
    command.arg(&script).args(args).envs(envs.iter().copied());
    println!("{}", succeed(&mut command));
}

/// Runs `command`; its stdout and stderr, or a failed test showing them unless it exits 0.
fn succeed(command: &mut Command) -> String {
    let out = command.output().unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{command:?} failed:\n{report}");
    report
}

/// Runs the `openai` client's checks (those whose name starts with `only`) against `addr`.
fn client_checks(addr: SocketAddr, model: &str, key: Option<&str>, only: &str) {
    let python = std::env::var_os("OXGEN_PYTHON").expect(
        "OXGEN_PYTHON is not set: run scripts/test.sh (it makes a venv with the openai client)",
    );
    let mut args = vec![format!("http://{addr}/v1"), model.to_string()];
    args.extend(key.map(str::to_string));
    run_script(
        python.into(),
        "openai_client.py",
        &args,
        &[("OXGEN_CHECKS", only)],
    );
}

#[test]
fn the_openai_python_client_works_against_oxgen_serve() {
    let mut served = serve(&["--api-key", "test-key", "--alias", "default"]);
    client_checks(served.addr, MODEL, Some("test-key"), "");
    assert_eq!(served.stop(Duration::from_secs(60)), Some(0));
}

/// A family's tool template (Hermes, as Qwen's): the calls the client gets are parsed from
/// `<tool_call>` blocks the template taught, and the history renders through it.
#[test]
fn tool_calls_work_through_a_hermes_template() {
    let template =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../generate/tests/templates/hermes.jinja");
    let mut served = serve(&["--chat-template", template.to_str().unwrap()]);
    client_checks(served.addr, MODEL, None, "tools");
    assert_eq!(served.stop(Duration::from_secs(60)), Some(0));
}

/// `--chat-template-kwargs` reaches every render, a request's `chat_template_kwargs` take
/// precedence, and one that would set the render's own variables is a 400 naming it. Qwen3's
/// template (the committed fixture) opens the reply with an empty thought block when thinking
/// is off.
#[test]
fn chat_template_kwargs_reach_the_template() {
    let template = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testkit/thirdparty/chat_templates/templates/qwen3.jinja");
    let served = serve(&[
        "--chat-template",
        template.to_str().unwrap(),
        "--chat-template-kwargs",
        r#"{"enable_thinking": false}"#,
    ]);
    let rendered = |kwargs: Value| {
        let mut body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]});
        if !kwargs.is_null() {
            body["chat_template_kwargs"] = kwargs;
        }
        let reply = common::post(served.addr, "/tokenize", &body);
        assert_eq!(reply.status, 200, "{}", reply.json());
        let ids = reply.json()["tokens"].clone();
        let text = common::post(served.addr, "/detokenize", &json!({"tokens": ids}));
        text.json()["prompt"].as_str().unwrap().to_string()
    };
    let empty_thought = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    assert!(rendered(Value::Null).ends_with(empty_thought));
    let thinking = rendered(json!({"enable_thinking": true}));
    assert!(thinking.ends_with("<|im_start|>assistant\n"), "{thinking}");
    // reasoning_effort reaches the template's switch: "none" turns thinking off (the empty
    // thought block is in the prompt), "high" on, over the server's default.
    let prompt_tokens = |effort: Value| {
        let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                          "max_tokens": 1, "reasoning_effort": effort});
        let reply = common::post(served.addr, "/v1/chat/completions", &body);
        assert_eq!(reply.status, 200, "{}", reply.json());
        reply.json()["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    assert!(prompt_tokens(json!("none")) > prompt_tokens(json!("high")));
    let bad = common::post(
        served.addr,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                "chat_template_kwargs": {"messages": []}}),
    );
    assert_eq!(bad.status, 400);
    assert_eq!(
        bad.json()["error"]["param"],
        "chat_template_kwargs.messages"
    );
}

/// The client venv's Python (`OXGEN_CLIENTS_PYTHON`, set by scripts/test.sh: LangChain,
/// LlamaIndex, litellm, lm-evaluation-harness, the Anthropic and Ollama SDKs, with their own
/// `openai`).
fn clients_python() -> PathBuf {
    std::env::var_os("OXGEN_CLIENTS_PYTHON")
        .expect("OXGEN_CLIENTS_PYTHON is not set: run scripts/test.sh (it makes the client venv)")
        .into()
}

/// LangChain (`reasoning_effort`, streaming, `bind_tools(tool_choice="required")`,
/// `with_structured_output`), LlamaIndex's `OpenAILike` and litellm's `openai/` provider (a
/// chat and a tool call each), as their users call them, against `oxgen serve`.
#[test]
fn langchain_llamaindex_and_litellm_work_against_oxgen_serve() {
    let served = serve(&[]);
    let args = [format!("http://{}/v1", served.addr), MODEL.to_string()];
    let offline = [
        ("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
        ("HF_HUB_OFFLINE", "1"),
    ];
    run_script(clients_python(), "clients.py", &args, &offline);
}

/// The official clients of the other protocols, as their users call them: the `openai`
/// SDK's Responses (text, streaming accumulated by the SDK, `parse` with a schema, a required
/// call then its output, `previous_response_id` served from the prefix cache, retrieve and
/// delete), the `anthropic` SDK's Messages (create, stream, `count_tokens`, a `tool_use` →
/// `tool_result` round trip, errors as its exception types) and the `ollama` client (chat
/// streamed and not, generate, list, show, ps, a schema as `format`, a tool call).
#[test]
fn responses_anthropic_and_ollama_clients_work_against_oxgen_serve() {
    let served = serve(&[]);
    let args = [format!("http://{}", served.addr), MODEL.to_string()];
    run_script(clients_python(), "protocols.py", &args, &[]);
}

/// The chat page at `/` in headless Chromium (Debian's, driven by Selenium offline): on a
/// server with an API key it asks for the key and works once given it; it loads with no
/// console errors and no request leaving the server, streams the API's greedy
/// answer, keeps the conversation over a reload, parses in JSON mode, shows model markup as
/// text, stops mid-answer with the KV returned, says so on a 429 (one running slot and one
/// queue slot, both held) and when the server went away (the script stops it). The
/// screenshot it takes is `target/tmp/webui.png`.
#[test]
fn the_chat_page_works_in_a_real_browser() {
    let mut served = serve(&[
        "--max-batch",
        "1",
        "--max-queue",
        "1",
        "--api-key",
        "pagekey",
    ]);
    let screenshot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("webui.png");
    let pid = served.child.as_ref().unwrap().id();
    let args = [
        format!("http://{}", served.addr),
        MODEL.to_string(),
        screenshot.display().to_string(),
        pid.to_string(),
    ];
    run_script(
        clients_python(),
        "webui.py",
        &args,
        &[("OXGEN_API_KEY", "pagekey")],
    );
    assert!(std::fs::metadata(&screenshot).unwrap().len() > 10_000);
    assert_eq!(
        served.stop(Duration::from_secs(30)),
        Some(0),
        "the page's SIGTERM exits 0"
    );
}

/// lm-evaluation-harness's `local-completions` model with its remote tokenizer runs a small
/// multiple-choice task (a YAML task over the committed `lm_eval/mc.jsonl`) to the end, and
/// the loglikelihood it logs for every choice equals the sum computed here from the model's
/// own logits (`Model::logits`, float64 log-softmax) for the same context and continuation
/// ids, so an echo off by one position cannot pass.
#[test]
fn lm_evaluation_harness_scores_a_task_against_oxgen_serve() {
    let served = serve(&[]);
    let work = tempfile::tempdir().unwrap();
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../server/tests/python/lm_eval/mc.jsonl")
        .canonicalize()
        .unwrap();
    let task = format!(
        "task: oxgen_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {}\n\
         test_split: test\noutput_type: multiple_choice\n\
         doc_to_text: \"Question: {{{{question}}}}\\nAnswer:\"\n\
         doc_to_choice: \"{{{{choices}}}}\"\ndoc_to_target: \"{{{{answer}}}}\"\n\
         metric_list:\n  - metric: acc\n",
        data.display()
    );
    std::fs::write(work.path().join("oxgen_mc.yaml"), task).unwrap();
    let output = work.path().join("out");
    let model_args = format!(
        "model={MODEL},base_url=http://{}/v1/completions,tokenizer_backend=remote,\
         num_concurrent=1,max_retries=1",
        served.addr
    );
    succeed(
        Command::new(clients_python())
            .args([
                "-m",
                "lm_eval",
                "run",
                "--model",
                "local-completions",
                "--model_args",
            ])
            .arg(&model_args)
            .args(["--tasks", "oxgen_mc", "--include_path"])
            .arg(work.path())
            .arg("--output_path")
            .arg(&output)
            .args(["--log_samples", "--batch_size", "1"])
            .env("HF_DATASETS_OFFLINE", "1")
            .env("HF_HUB_OFFLINE", "1")
            .env("HF_HOME", work.path().join("hf"))
            .current_dir(work.path()),
    );
    let samples = find_file(&output, "samples_oxgen_mc").expect("lm_eval wrote no samples");
    let mut model = oxgen::Model::open(common::default_model(), &Default::default()).unwrap();
    let mut checked = 0;
    for line in std::fs::read_to_string(&samples).unwrap().lines() {
        let sample: Value = serde_json::from_str(line).unwrap();
        for (arguments, response) in (sample["arguments"].as_object().unwrap().values())
            .zip(sample["filtered_resps"].as_array().unwrap())
        {
            let context = arguments["arg_0"].as_str().unwrap();
            let continuation = arguments["arg_1"].as_str().unwrap();
            // As lm-eval splits them: the whole text's ids, the context's count.
            let whole = model_ids(served.addr, &format!("{context}{continuation}"));
            let context_len = model_ids(served.addr, context).len();
            let (logits, vocab) = model.logits(&whole).unwrap();
            let want: f64 = (context_len..whole.len())
                .map(|i| {
                    let row = &logits[(i - 1) * vocab..i * vocab];
                    oxgen_testkit::log_softmax(row)[whole[i] as usize]
                })
                .sum();
            // Logged as a number or as its text, by lm-eval version.
            let got = (response[0].as_f64())
                .or_else(|| response[0].as_str()?.parse().ok())
                .unwrap_or_else(|| panic!("no loglikelihood in {response}"));
            assert!(
                (got - want).abs() < 1e-3,
                "{context:?} + {continuation:?}: lm-eval {got}, Model::logits {want}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 8 * 3, "every choice of every question");
}

/// The ids the server's tokenizer gives `text` (no special tokens), as lm-eval's remote
/// tokenizer asks for them.
fn model_ids(addr: SocketAddr, text: &str) -> Vec<u32> {
    let reply = common::post(
        addr,
        "/tokenize",
        &json!({"prompt": text, "add_special_tokens": false}),
    );
    serde_json::from_value(reply.json()["tokens"].clone()).unwrap()
}

/// The first file under `dir` whose name starts with `prefix`.
fn find_file(dir: &Path, prefix: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_file(&path, prefix) {
                return Some(found);
            }
        } else if path.file_name()?.to_string_lossy().starts_with(prefix) {
            return Some(path);
        }
    }
    None
}

#[test]
fn sigterm_lets_running_requests_finish_then_exits_0() {
    let mut served = serve(&[]);
    let addr = served.addr;
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": 40, "temperature": 0, "ignore_eos": true, "stream": true,
    });
    let mut stream = common::open(
        addr,
        "POST",
        "/v1/chat/completions",
        &[],
        body.to_string().as_bytes(),
    );
    stream.next_event().unwrap();
    stream.next_event().unwrap();
    let stopping = std::thread::spawn(move || served.stop(Duration::from_secs(60)));
    let events = stream.finish().events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let finish: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "length", "{finish}");
    assert_eq!(stopping.join().unwrap(), Some(0));
}

/// Weights are read from the mapped model files: truncating one under a running server makes
/// the next read fault (SIGBUS). The server still dies of it, but says why first.
#[test]
fn a_model_file_truncated_under_the_server_is_a_clear_fatal_error() {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(common::default_model()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let mut served = serve_at(dir.path(), &["--model-id", "m"]);
    let chat = |content: &str| {
        json!({
            "model": "m",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 4,
        })
    };
    let before = common::post(served.addr, "/v1/chat/completions", &chat("Hi"));
    assert_eq!(before.status, 200);
    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("model.onnx.data"))
        .unwrap()
        .set_len(0)
        .unwrap();
    let _pending = common::send(
        served.addr,
        "POST",
        "/v1/chat/completions",
        &[],
        chat("Hello there").to_string().as_bytes(),
    );
    let mut child = served.child.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the server outlived its model file"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.signal(), Some(7), "died of SIGBUS: {status}");
    // The stderr reader may still be copying the last line.
    std::thread::sleep(Duration::from_millis(200));
    let log = served.log.lock().unwrap().clone();
    assert!(
        log.contains("oxgen: fatal: SIGBUS") && log.contains("truncated or replaced"),
        "{log}"
    );
}

/// SIGTERM while a long prompt is being prefilled (a chunk per step): with a 1 s drain the
/// request gets the `shutting_down` error, not a hang or a dropped connection, and the server
/// exits 0 well within the drain plus its engine and connection graces.
#[test]
fn sigterm_during_a_long_prefill_fails_the_request_cleanly_and_exits_0() {
    let mut served = serve(&["--shutdown-timeout", "1", "--prefill-chunk", "32"]);
    let addr = served.addr;
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about the sea. ".repeat(700)}],
        "max_tokens": 3000, "temperature": 0, "ignore_eos": true,
    });
    let request = std::thread::spawn(move || common::post(addr, "/v1/chat/completions", &body));
    let deadline = Instant::now() + Duration::from_secs(60);
    while common::live(addr).1 != 1 {
        assert!(Instant::now() < deadline, "the request never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    let stopping = Instant::now();
    assert_eq!(served.stop(Duration::from_secs(30)), Some(0));
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "took {:?} to stop",
        stopping.elapsed()
    );
    let reply = request.join().unwrap();
    assert_eq!(
        reply.status,
        503,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(reply.json()["error"]["code"], "shutting_down");
}

/// A fixture package (hidden 64, 2 layers: KV of 512 bytes a position) in a temporary folder.
fn fixture() -> tempfile::TempDir {
    use oxgen_testkit::fixtures::{FixtureConfig, write_package};
    let dir = tempfile::tempdir().unwrap();
    write_package(dir.path(), &FixtureConfig::default()).unwrap();
    dir
}

/// `serve`'s flags as the CLI parses them reach the server: the key from a file, the host,
/// the model id, the KV budget, the KV dtype and the prefix cache switch.
#[test]
fn serve_flags_reach_the_server() {
    let dir = fixture();
    let key = dir.path().join("key.txt");
    std::fs::write(&key, "s3cret\nthe first line is the key\n").unwrap();
    let served = serve_at(
        dir.path(),
        &[
            "--api-key-file",
            key.to_str().unwrap(),
            "--host",
            "0.0.0.0",
            "--model-id",
            "tiny",
            "--kv-memory",
            "1",
            "--kv-dtype",
            "int8",
            "--no-prefix-cache",
        ],
    );
    assert!(served.addr.ip().is_unspecified(), "{}", served.addr);
    let get = |path: &str, key: Option<&str>| {
        let auth = key.map(|k| format!("Bearer {k}"));
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("Authorization", a.as_str())).collect();
        common::request(served.addr, "GET", path, &headers, b"")
    };
    assert_eq!(get("/v1/models", None).status, 401);
    assert_eq!(
        get("/v1/models", Some("the first line is the key")).status,
        401
    );
    let models = get("/v1/models", Some("s3cret"));
    assert_eq!(models.status, 200);
    let card = &models.json()["data"][0];
    assert_eq!(card["id"], "tiny");
    assert_eq!(card["meta"]["kv_cache"]["prefix_cache"], false, "{card}");
    assert_eq!(card["meta"]["kv_dtype"], "int8", "{card}");
    // 1 MiB of int8 KV at 16 positions x 160 bytes a block (8 head vectors a position, each
    // 16 values and a 4-byte scale): 409 blocks (f32 would fit 128).
    let metrics = String::from_utf8(get("/metrics", Some("s3cret")).body).unwrap();
    assert!(
        metrics.contains("oxgen_kv_blocks{state=\"total\"} 409\n"),
        "{metrics}"
    );
}

/// Serving on ONNX Runtime, its library given as the onnxruntime wheel's folder (as
/// `--ort-lib` documents), answers chat requests the way native does.
#[test]
fn serve_runs_on_the_ort_backend_with_the_wheel_folder_as_ort_lib() {
    let python = std::env::var("OXGEN_PYTHON").expect("OXGEN_PYTHON is set by scripts/test.sh");
    let out = Command::new(python)
        .args([
            "-c",
            "import onnxruntime, os; print(os.path.dirname(onnxruntime.__file__))",
        ])
        .output()
        .unwrap();
    let wheel_folder = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let dir = fixture();
    let chat = json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": "the cat"}],
        "max_tokens": 6, "temperature": 0, "ignore_eos": true,
    });
    let mut answers = Vec::new();
    for backend in ["native", "ort"] {
        let mut served = serve_at(
            dir.path(),
            &[
                "--model-id",
                "tiny",
                "--backend",
                backend,
                "--ort-lib",
                &wheel_folder,
            ],
        );
        let card = common::get(served.addr, "/v1/models").json();
        assert_eq!(card["data"][0]["meta"]["backend"], backend, "{card}");
        let reply = common::post(served.addr, "/v1/chat/completions", &chat);
        assert_eq!(
            reply.status,
            200,
            "{backend}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        answers.push(reply.json()["choices"][0]["message"]["content"].clone());
        assert_eq!(served.stop(Duration::from_secs(30)), Some(0));
    }
    assert_eq!(
        answers[0], answers[1],
        "native and ort disagree on the greedy answer"
    );
}

/// A KV pool the machine cannot hold (100 TB) fails the load with a clear error and exit 1,
/// not an abort or a server that dies at its first request.
#[test]
fn a_kv_pool_too_big_for_the_machine_fails_the_load_clearly() {
    let out = Command::new(env!("CARGO_BIN_EXE_oxgen"))
        .arg("serve")
        .arg(common::default_model())
        .args(["--port", "0", "--kv-memory", "100000000"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("could not allocate") && stderr.contains("--kv-memory"),
        "{stderr}"
    );
}

#[test]
fn serve_refuses_an_empty_queue() {
    let out = Command::new(env!("CARGO_BIN_EXE_oxgen"))
        .args(["serve", "--max-queue", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "clap's usage error");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--max-queue"), "{stderr}");
}

#[test]
fn a_thread_count_past_the_bound_is_a_usage_error() {
    for command in ["serve", "generate", "bench"] {
        let out = Command::new(env!("CARGO_BIN_EXE_oxgen"))
            .args([command, "--threads", "100000", "x"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{command}: clap's usage error");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--threads") && stderr.contains("1024"),
            "{stderr}"
        );
    }
}

/// An encoder package served: the `openai` client's `embeddings.create` works unchanged
/// (floats, base64, ids, dimensions), rerank orders documents, bad inputs are 400s naming
/// the field; `/v1/models` and `/metrics` say what ran; SIGTERM exits 0.
#[test]
fn an_encoder_package_serves_embeddings_and_rerank() {
    let model = oxgen_testkit::embed_model_dir();
    let mut served = serve_at(&model, &[]);
    let python = std::env::var_os("OXGEN_PYTHON").expect("OXGEN_PYTHON is not set");
    let args = [
        format!("http://{}/v1", served.addr),
        "all-MiniLM-L6-v2".into(),
    ];
    run_script(python.into(), "embeddings_client.py", &args, &[]);
    let card = common::get(served.addr, "/v1/models").json();
    let meta = &card["data"][0]["meta"];
    assert_eq!(
        (meta["kind"].as_str(), meta["dimensions"].as_u64()),
        (Some("embedding"), Some(384))
    );
    assert_eq!(meta["context_length"], 256);
    let metrics = String::from_utf8(common::get(served.addr, "/metrics").body).unwrap();
    let counter = |name: &str| -> u64 {
        let line = metrics.lines().find(|l| l.starts_with(name)).unwrap();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(
        counter("oxgen_embedded_sequences_total ") >= 40,
        "{metrics}"
    );
    assert!(counter("oxgen_embedded_tokens_total ") >= 400, "{metrics}");
    assert_eq!(served.stop(Duration::from_secs(60)), Some(0));
}

/// `--embedding` serves a decoder package as an embedding model: `/v1/embeddings` answers
/// with its final hidden states (576 values for the default model, mean pooled as asked,
/// unit length), chat requests are refused with a 400.
#[test]
fn a_decoder_package_serves_embeddings_with_embedding() {
    let mut served = serve(&["--embedding", "--pooling", "mean"]);
    let reply = common::post(
        served.addr,
        "/v1/embeddings",
        &json!({"input": ["A man is eating food.", "A dog runs."]}),
    );
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let body = reply.json();
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    let first: Vec<f64> = serde_json::from_value(data[0]["embedding"].clone()).unwrap();
    assert_eq!(first.len(), 576);
    let norm = first.iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
    assert_ne!(data[0]["embedding"], data[1]["embedding"]);
    let chat = common::post(
        served.addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}]}),
    );
    assert_eq!(chat.status, 400);
    assert_eq!(served.stop(Duration::from_secs(60)), Some(0));
}

/// A family fixture package (`crates/testkit/thirdparty/families/NAME`).
fn family(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testkit/thirdparty/families")
        .join(name)
}

/// Copies the package in `from` to `to`.
fn copy_package(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
}

/// A greedy chat reply's text from the model `model`.
fn greedy(addr: SocketAddr, model: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": model,
        "messages": [{"role": "user", "content": "Name three colors."}],
        "max_tokens": 12, "temperature": 0,
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let reply = common::post(addr, "/v1/chat/completions", &body);
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    assert_eq!(reply.status, 200, "{model}: {text}");
    reply.json()["choices"][0]["message"]["content"].clone()
}

/// Each model's `meta.state` in `/v1/models` (`unloaded`, `loading`, `loaded`, `failed`).
fn states(addr: SocketAddr) -> std::collections::BTreeMap<String, String> {
    let list = common::get(addr, "/v1/models").json();
    (list["data"].as_array().unwrap().iter())
        .map(|m| {
            let state = m["meta"]["state"].as_str().unwrap().to_string();
            (m["id"].as_str().unwrap().to_string(), state)
        })
        .collect()
}

/// A folder of three packages (the default model, the Qwen3 family fixture and
/// all-MiniLM-L6-v2) served under a budget that holds two of them: each answers by name
/// through the `openai` client; the third to load unloads the least recently used idle one;
/// requests arriving during a load wait for it; greedy replies are the same from a fresh
/// load, after an unload, and from a server of that model alone; a package that fails to
/// load, or whose folder went away, answers clearly while the others serve; SIGTERM drains
/// every model's requests.
#[test]
fn a_models_folder_serves_each_model_by_name_under_a_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    let link = |from: &Path, name: &str| std::os::unix::fs::symlink(from, dir.path().join(name));
    link(&common::default_model(), MODEL).unwrap();
    link(&family("qwen3-int4"), "qwen3").unwrap();
    link(&oxgen_testkit::embed_model_dir(), "minilm").unwrap();
    link(&family("qwen3-int4"), "gone").unwrap();
    copy_package(&family("qwen3-int4"), &dir.path().join("broken"));
    std::fs::write(dir.path().join("broken/model.onnx"), b"not an onnx file").unwrap();
    // The default model holds 144 MiB of weights and 8 MiB of KV, the fixture 8 MiB of KV,
    // the encoder 87 MiB: a budget of 200 MiB holds the default model with one other.
    let models = dir.path().to_str().unwrap();
    let mut served = serve_with(&[
        "--models",
        models,
        "--memory-budget",
        "200",
        "--kv-memory",
        "8",
        "--keep-alive",
        "-1",
    ]);
    let addr = served.addr;
    let all = states(addr);
    assert_eq!(all.len(), 5, "{all:?}");
    assert!(all.values().all(|s| s == "unloaded"), "{all:?}");
    // Two requests at once for the default model, which takes a few hundred milliseconds to
    // load: the second waits for the first one's load.
    let other = std::thread::spawn(move || greedy(addr, MODEL, json!({})));
    let fresh = greedy(addr, MODEL, json!({}));
    assert_eq!(other.join().unwrap(), fresh);

    let python = std::env::var_os("OXGEN_PYTHON").expect("OXGEN_PYTHON is not set");
    let args = [
        format!("http://{addr}/v1"),
        MODEL.into(),
        "qwen3".into(),
        "minilm".into(),
    ];
    run_script(python.into(), "models_client.py", &args, &[]);
    let after = states(addr);
    assert_eq!(
        (
            after[MODEL].as_str(),
            after["qwen3"].as_str(),
            after["minilm"].as_str()
        ),
        ("unloaded", "loaded", "loaded"),
        "the least recently used idle model makes room"
    );
    let metric = |series: &str| common::metric(addr, series);
    assert_eq!(
        metric(&format!("oxgen_model_unloads_total{{model=\"{MODEL}\"}}")),
        1.0
    );
    // Each model loaded once for the requests that came together.
    assert_eq!(metric("oxgen_model_loads_total{model=\"qwen3\"}"), 1.0);
    assert_eq!(
        metric(&format!("oxgen_model_loads_total{{model=\"{MODEL}\"}}")),
        1.0
    );
    let miss = format!("oxgen_model_requests_total{{model=\"{MODEL}\",cache=\"miss\"}}");
    assert_eq!(metric(&miss), 2.0);
    assert!(metric("oxgen_models_resident_bytes") <= 200.0 * 1048576.0);
    let card = common::get(addr, &format!("/v1/models/{MODEL}")).json();
    assert!(
        card["meta"]["load_seconds"].as_f64().unwrap() > 0.0,
        "{card}"
    );

    // Loaded again after its unload: the same greedy reply.
    assert_eq!(greedy(addr, MODEL, json!({})), fresh);

    // A package that fails to load is a 503 naming it, the others keep serving.
    let broken = common::post(
        addr,
        "/v1/chat/completions",
        &json!({"model": "broken", "messages": [{"role": "user", "content": "hi"}]}),
    );
    let error = broken.json()["error"].clone();
    assert_eq!(
        (broken.status, error["code"].as_str()),
        (503, Some("model_load_failed"))
    );
    assert!(
        error["message"].as_str().unwrap().contains("'broken'"),
        "{error}"
    );
    assert_eq!(states(addr)["broken"], "failed");
    greedy(addr, "qwen3", json!({}));

    // A model whose folder went away while unloaded is a plain 404.
    std::fs::remove_file(dir.path().join("gone")).unwrap();
    let gone = common::post(
        addr,
        "/v1/chat/completions",
        &json!({"model": "gone", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(gone.status, 404, "{}", String::from_utf8_lossy(&gone.body));
    assert_eq!(gone.json()["error"]["code"], "model_not_found");
    assert!(!states(addr).contains_key("gone"));

    // SIGTERM lets both models' streams finish.
    let stream = |model: &str| {
        let body = json!({
            "model": model, "messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": 24, "temperature": 0, "ignore_eos": true, "stream": true,
        });
        let mut s = common::open(
            addr,
            "POST",
            "/v1/chat/completions",
            &[],
            body.to_string().as_bytes(),
        );
        s.next_event().unwrap();
        s
    };
    let streams = [stream(MODEL), stream("qwen3")];
    let stopping = std::thread::spawn(move || served.stop(Duration::from_secs(60)));
    for s in streams {
        let events = s.finish().events();
        assert_eq!(
            events.last().map(String::as_str),
            Some("[DONE]"),
            "{events:?}"
        );
    }
    assert_eq!(stopping.join().unwrap(), Some(0));

    // The same reply from a server of that model alone.
    let mut alone = serve(&["--kv-memory", "8"]);
    assert_eq!(greedy(alone.addr, MODEL, json!({})), fresh);
    assert_eq!(alone.stop(Duration::from_secs(60)), Some(0));
}

/// `keep_alive` as ollama has it (0: unload after the request; a duration: when it lapses;
/// -1: never), the per-model settings file against the flags, the admin endpoints behind
/// the API key (and gone with --no-admin), `oxgen list`, `oxgen rm` and a model by name.
#[test]
fn keep_alive_settings_admin_list_and_rm() {
    let dir = tempfile::tempdir().unwrap();
    copy_package(&family("qwen3-int4"), &dir.path().join("qwen3"));
    copy_package(&family("qwen3-int4"), &dir.path().join("plain"));
    std::fs::write(
        dir.path().join("oxgen.json"),
        r#"{"models": {"qwen3": {"ctx_size": 64, "aliases": ["q"]}}}"#,
    )
    .unwrap();
    let models = dir.path().to_str().unwrap();
    let served = serve_with(&[
        "--models",
        models,
        "--keep-alive",
        "0",
        "--ctx-size",
        "128",
        "--api-key",
        "k",
    ]);
    let addr = served.addr;
    let auth = [("Authorization", "Bearer k")];
    let call = |method: &str, path: &str, body: Value| {
        common::request(addr, method, path, &auth, body.to_string().as_bytes())
    };
    let chat = |model: &str, keep_alive: Value| {
        let reply = call(
            "POST",
            "/v1/chat/completions",
            json!({"model": model, "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 2, "keep_alive": keep_alive}),
        );
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(reply.header("x-oxgen-ignored-fields"), None);
    };
    let state = |model: &str| {
        let card = call("GET", &format!("/v1/models/{model}"), Value::Null).json();
        (card["meta"]["state"].as_str().unwrap().to_string(), card)
    };
    let wait = |model: &str, want: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while state(model).0 != want {
            assert!(Instant::now() < deadline, "{model} never got {want}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // Before any load, each model's context as it will load (oxgen.json's ctx_size beats the
    // flag's).
    let context = |model: &str| state(model).1["meta"]["context_length"].as_u64();
    assert_eq!((context("qwen3"), context("plain")), (Some(64), Some(128)));
    // The server's --keep-alive 0: unloaded once the request ends. By alias.
    chat("q", Value::Null);
    wait("qwen3", "unloaded");
    // -1: kept.
    chat("qwen3", json!(-1));
    std::thread::sleep(Duration::from_millis(1500));
    let (now, card) = state("qwen3");
    assert_eq!(now, "loaded");
    // oxgen.json's ctx_size beats the flag's, which the other model gets.
    assert_eq!(card["meta"]["context_length"], 64, "{card}");
    assert_eq!(card["meta"]["expires_at"], Value::Null);
    // A duration: loaded until it lapses.
    chat("plain", json!("2s"));
    let (now, card) = state("plain");
    assert_eq!(now, "loaded");
    assert_eq!(card["meta"]["context_length"], 128, "{card}");
    assert!(card["meta"]["expires_at"].as_u64().is_some(), "{card}");
    wait("plain", "unloaded");

    // Ollama's way: a request with nothing to generate loads; with keep_alive 0, unloads.
    for (keep_alive, reason, after) in [
        (Value::Null, "load", "loaded"),
        (json!(0), "unload", "unloaded"),
    ] {
        let body = json!({"model": "plain:latest", "keep_alive": keep_alive});
        let done = call("POST", "/api/generate", body).json();
        assert_eq!(
            (done["done"].as_bool(), done["done_reason"].as_str()),
            (Some(true), Some(reason))
        );
        assert_eq!(state("plain").0, after);
    }

    // The admin endpoints want the key.
    let unauthorized = common::get(addr, "/admin/models");
    assert_eq!(unauthorized.status, 401);
    let listed = call("GET", "/admin/models", Value::Null).json();
    assert_eq!(listed["models"].as_array().unwrap().len(), 2, "{listed}");
    let loaded = call(
        "POST",
        "/admin/models/plain/load",
        json!({"keep_alive": -1}),
    );
    assert_eq!(
        loaded.status,
        200,
        "{}",
        String::from_utf8_lossy(&loaded.body)
    );
    assert_eq!(state("plain").0, "loaded");
    let ps = call("GET", "/api/ps", Value::Null).json();
    let names: Vec<&str> = (ps["models"].as_array().unwrap().iter())
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["plain", "qwen3"], "{ps}");
    assert!(ps["models"][0]["size"].as_u64().unwrap() > 0, "{ps}");
    let unloaded = call("POST", "/admin/models/plain/unload", Value::Null);
    assert_eq!(unloaded.status, 200);
    assert_eq!(state("plain").0, "unloaded");
    drop(served);
    // Without admin endpoints; a budget no model fits is a 503 naming it.
    let locked = serve_with(&["--models", models, "--no-admin", "--memory-budget", "1"]);
    assert_eq!(common::get(locked.addr, "/admin/models").status, 404);
    let body = json!({"model": "qwen3", "messages": [{"role": "user", "content": "hi"}]});
    let refused = common::post(locked.addr, "/v1/chat/completions", &body);
    let message = refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(refused.status, 503, "{message}");
    assert!(
        message.contains("--memory-budget") && message.contains("1 MiB"),
        "{message}"
    );
    drop(locked);

    // `oxgen list`, a model by name, `oxgen rm`.
    let oxgen = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_oxgen"));
        c.env("OXGEN_CACHE", dir.path().join("cache"))
            .env("OXGEN_MODELS", dir.path());
        c
    };
    let listed = succeed(oxgen().args(["list", "--json"]));
    let rows: Vec<Value> = listed
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["plain", "qwen3"], "{listed}");
    assert_eq!(rows[0]["kind"], "generate");
    assert_eq!(rows[0]["family"], "qwen3");
    assert!(
        rows[0]["quantization"].as_str().unwrap().starts_with("q4/"),
        "{listed}"
    );
    assert!(rows[0]["bytes"].as_u64().unwrap() > 100_000, "{listed}");
    let generated =
        succeed(oxgen().args(["generate", "plain", "hi", "--max-new-tokens", "2", "--json"]));
    assert!(generated.contains("\"token_ids\""), "{generated}");
    succeed(oxgen().args(["rm", "plain"]));
    assert!(!dir.path().join("plain").exists());
    let missing = oxgen().args(["rm", "plain"]).output().unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no model 'plain'"));
}

/// LoRA adapters in a models folder: one given in `oxgen.json` (listed with its parent
/// before the model has loaded), one loaded through `/v1/load_lora_adapter`; after the base
/// model is unloaded (keep_alive 0), a request naming the second loads the model with it
/// again, and the first, unloaded through the API, stays gone. Each answers with onnxruntime-genai's ids for it (`thirdparty/lora/lora.json`).
/// `--lora` with several models is refused.
#[test]
fn lora_adapters_in_a_models_folder_survive_the_base_models_unload() {
    let lora = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testkit/thirdparty/lora");
    let oracle: Value =
        serde_json::from_str(&std::fs::read_to_string(lora.join("lora.json")).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    copy_package(&lora.join("llama3-lora-fp32"), &dir.path().join("llama3"));
    std::fs::copy(
        lora.join("a.onnx_adapter"),
        dir.path().join("a.onnx_adapter"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("oxgen.json"),
        r#"{"models": {"llama3": {"lora": {"a": "a.onnx_adapter"}, "max_loras": 2}}}"#,
    )
    .unwrap();
    let models = dir.path().to_str().unwrap();
    let served = serve_with(&["--models", models, "--keep-alive", "0"]);
    let addr = served.addr;
    let card = common::get(addr, "/v1/models/a").json();
    assert_eq!(
        (card["parent"].as_str(), card["meta"]["rank"].as_u64()),
        (Some("llama3"), None)
    );
    let text_of = |ids: &Value| {
        let body = json!({"model": "llama3", "tokens": ids});
        common::post(addr, "/detokenize", &body).json()["prompt"].clone()
    };
    let ok = |path: &str, body: &Value| {
        let reply = common::post(addr, path, body);
        let text = String::from_utf8_lossy(&reply.body).into_owned();
        assert_eq!(reply.status, 200, "{path}: {text}");
        reply
    };
    let complete = |model: &str| {
        let body = json!({"model": model, "prompt": oracle["prompt"], "max_tokens": 24,
                          "temperature": 0, "ignore_eos": true});
        ok("/v1/completions", &body).json()["choices"][0]["text"].clone()
    };
    let genai = &oracle["genai"]["fp32"];
    assert_eq!(complete("a"), text_of(&genai["a"]));
    let unloaded = || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while common::get(addr, "/v1/models/llama3").json()["meta"]["state"] != "unloaded" {
            assert!(Instant::now() < deadline, "the base model never unloaded");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    unloaded();
    let body = json!({"lora_name": "b", "lora_path": lora.join("b.onnx_adapter")});
    ok("/v1/load_lora_adapter", &body);
    unloaded();
    assert_eq!(complete("b"), text_of(&genai["b"]));
    assert_eq!(common::get(addr, "/v1/models/b").json()["meta"]["rank"], 8);
    // The adapter of oxgen.json unloaded through the API stays gone, the model's next load
    // included; the one loaded through it stays served.
    ok("/v1/unload_lora_adapter", &json!({"lora_name": "a"}));
    unloaded();
    assert_eq!(complete("b"), text_of(&genai["b"]));
    assert_eq!(common::get(addr, "/v1/models/a").status, 404);
    let body = json!({"model": "a", "prompt": "x", "max_tokens": 1});
    assert_eq!(common::post(addr, "/v1/completions", &body).status, 404);
    drop(served);

    let refused = Command::new(env!("CARGO_BIN_EXE_oxgen"))
        .args(["serve", "--models", models, "--lora"])
        .arg(format!("x={}", lora.join("a.onnx_adapter").display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("oxgen.json"),
        "{stderr}"
    );
}
