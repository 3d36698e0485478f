//! `oxgen serve` as a process on the default model: the official `openai` Python client runs
//! its checks against it, and SIGTERM drains running requests then exits 0.

#[path = "../../server/tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const MODEL: &str = "SmolLM2-135M-Instruct";

/// Starts `oxgen serve` on a free port and waits until it is ready.
fn serve(extra: &[&str]) -> (Child, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_oxgen"))
        .arg("serve")
        .arg(common::default_model())
        .args(["--port", "0", "--threads", "2"])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
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
    std::thread::spawn(move || for _ in stderr.lines() {});
    let deadline = Instant::now() + Duration::from_secs(120);
    while common::get(addr, "/health").status != 200 {
        assert!(Instant::now() < deadline, "the server never became ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, addr)
}

fn terminate(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Waits for the process to exit and returns its code.
fn exit_code(mut child: Child, within: Duration) -> Option<i32> {
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

#[test]
fn the_openai_python_client_works_against_oxgen_serve() {
    let python = std::env::var("OXGEN_PYTHON").expect(
        "OXGEN_PYTHON is not set: run scripts/test.sh (it makes a venv with the openai client)",
    );
    let (child, addr) = serve(&["--api-key", "test-key", "--alias", "default"]);
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../server/tests/python/openai_client.py");
    let out = Command::new(python)
        .arg(script)
        .arg(format!("http://{addr}/v1"))
        .arg(MODEL)
        .arg("test-key")
        .output()
        .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{report}");
    assert!(
        out.status.success(),
        "openai client checks failed:\n{report}"
    );
    terminate(&child);
    assert_eq!(exit_code(child, Duration::from_secs(60)), Some(0));
}

#[test]
fn sigterm_lets_running_requests_finish_then_exits_0() {
    let (child, addr) = serve(&[]);
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
    terminate(&child);
    let events = stream.finish().events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let finish: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "length", "{finish}");
    assert_eq!(exit_code(child, Duration::from_secs(60)), Some(0));
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
