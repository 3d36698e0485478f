//! The HTTP API on a fixture package: response shapes, streaming, every bad request with its
//! status code (and the server still serving after each), loading and engine failures
//! (sampling fields and log-probabilities are in sampling.rs; keys, limits and timeouts in
//! limits.rs).

mod common;

use std::time::Duration;

use common::fixture::{MODEL, chat, config, fixture};
use common::{get, post, request, start};
use oxgen_testkit::fixtures::tokenizer;
use serde_json::{Value, json};

#[test]
fn chat_completion_has_the_openai_shape() {
    let dir = fixture();
    let server = start(dir.path(), 1, config());
    let addr = server.addr();
    let r = post(addr, "/v1/chat/completions", &chat(json!({})));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    let choice = &v["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["finish_reason"], "length");
    assert!(choice["logprobs"].is_null());
    let text = choice["message"]["content"].as_str().unwrap().to_string();
    let u = &v["usage"];
    assert_eq!(u["completion_tokens"], 8);
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap() + 8)
    );
    // The alias names the same model; greedy is deterministic.
    let again = post(
        addr,
        "/v1/chat/completions",
        &chat(json!({"model": "other-name"})),
    );
    assert_eq!(again.json()["choices"][0]["message"]["content"], text);
    // `developer` is a system message; text parts are concatenated.
    let parts = post(
        addr,
        "/v1/chat/completions",
        &chat(json!({"messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "the cat "},
                                         {"type": "text", "text": "and the dog"}]}]})),
    );
    assert_eq!(parts.json()["choices"][0]["message"]["content"], text);
    // n = 2: two choices, each generating its own 8 tokens.
    let two = post(addr, "/v1/chat/completions", &chat(json!({"n": 2}))).json();
    assert_eq!(two["choices"].as_array().unwrap().len(), 2);
    assert_eq!(two["choices"][1]["index"], 1);
    assert_eq!(two["choices"][1]["message"]["content"], text);
    assert_eq!(two["usage"]["completion_tokens"], 16);
    server.shutdown().unwrap();
}

#[test]
fn streaming_sends_role_first_one_id_usage_and_done() {
    let dir = fixture();
    let server = start(dir.path(), 1, config());
    let addr = server.addr();
    let plain = post(addr, "/v1/chat/completions", &chat(json!({}))).json();
    let want = plain["choices"][0]["message"]["content"].as_str().unwrap();
    let r = post(
        addr,
        "/v1/chat/completions",
        &chat(json!({"stream": true, "stream_options": {"include_usage": true}})),
    );
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(chunks.iter().all(|c| c["id"] == id), "one id across chunks");
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (usage_chunk, rest) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 8);
    assert!(rest.iter().all(|c| c["usage"].is_null()));
    let text: String = rest
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, want, "streamed text equals the whole response");
    let finishes: Vec<&Value> = rest
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, [&json!("length")]);
    server.shutdown().unwrap();
}

/// Every request here is refused with its status code, and the server keeps serving.
#[test]
fn bad_requests_get_their_status_and_the_server_keeps_serving() {
    let dir = fixture();
    let server = start(dir.path(), 1, config());
    let addr = server.addr();
    let chat_path = "/v1/chat/completions";
    let long_prompt = "the cat and the dog ".repeat(60);
    // (what, path, body, status, the `param` the error names)
    type Case<'a> = (&'a str, &'a str, Vec<u8>, u16, Option<&'a str>);
    let cases: Vec<Case> = vec![
        ("malformed JSON", chat_path, b"{\"model\":".to_vec(), 400, None),
        ("not an object", chat_path, b"[1, 2]".to_vec(), 400, None),
        (
            "invalid UTF-8",
            chat_path,
            b"{\"model\":\"fixture\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}"
                .to_vec(),
            400,
            None,
        ),
        (
            "wrong type",
            chat_path,
            chat(json!({"temperature": "hot"})).to_string().into_bytes(),
            400,
            Some("temperature"),
        ),
        (
            "negative temperature",
            chat_path,
            chat(json!({"temperature": -1})).to_string().into_bytes(),
            400,
            Some("temperature"),
        ),
        (
            "negative max_tokens",
            chat_path,
            chat(json!({"max_tokens": -5})).to_string().into_bytes(),
            400,
            Some("max_tokens"),
        ),
        (
            "absurd max_tokens",
            chat_path,
            chat(json!({"max_tokens": 1_000_000_000_000u64}))
                .to_string()
                .into_bytes(),
            400,
            Some("max_tokens"),
        ),
        (
            "n zero",
            chat_path,
            chat(json!({"n": 0})).to_string().into_bytes(),
            400,
            Some("n"),
        ),
        (
            "absurd n",
            chat_path,
            chat(json!({"n": 100000})).to_string().into_bytes(),
            400,
            Some("n"),
        ),
        (
            "absurd top_logprobs",
            chat_path,
            chat(json!({"logprobs": true, "top_logprobs": 99}))
                .to_string()
                .into_bytes(),
            400,
            Some("top_logprobs"),
        ),
        (
            "top_logprobs without logprobs",
            chat_path,
            chat(json!({"top_logprobs": 2})).to_string().into_bytes(),
            400,
            Some("top_logprobs"),
        ),
        (
            "top_p zero",
            chat_path,
            chat(json!({"top_p": 0})).to_string().into_bytes(),
            400,
            Some("top_p"),
        ),
        (
            "audio output (a field that would change the answer)",
            chat_path,
            chat(json!({"audio": {"voice": "alloy", "format": "wav"}}))
                .to_string()
                .into_bytes(),
            400,
            Some("audio"),
        ),
        (
            "audio modality",
            chat_path,
            chat(json!({"modalities": ["text", "audio"]}))
                .to_string()
                .into_bytes(),
            400,
            Some("modalities"),
        ),
        (
            "tool parameters not an object",
            chat_path,
            chat(json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}))
                .to_string()
                .into_bytes(),
            400,
            Some("tools[0].function.parameters"),
        ),
        (
            "tool_choice names no tool",
            chat_path,
            chat(json!({"tools": [{"type": "function", "function": {"name": "f"}}],
                        "tool_choice": {"type": "function", "function": {"name": "g"}}}))
                .to_string()
                .into_bytes(),
            400,
            Some("tool_choice"),
        ),
        (
            "tool_choice without tools",
            chat_path,
            chat(json!({"tool_choice": "required"})).to_string().into_bytes(),
            400,
            Some("tool_choice"),
        ),
        (
            "tool message without its call id",
            chat_path,
            chat(json!({"messages": [{"role": "tool", "content": "x"}]}))
                .to_string()
                .into_bytes(),
            400,
            Some("messages[0].tool_call_id"),
        ),
        (
            "unknown role",
            chat_path,
            chat(json!({"messages": [{"role": "robot", "content": "x"}]}))
                .to_string()
                .into_bytes(),
            400,
            Some("messages[0].role"),
        ),
        (
            "image part",
            chat_path,
            chat(json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}))
                .to_string()
                .into_bytes(),
            400,
            Some("messages[0].content[0].type"),
        ),
        (
            "no messages",
            chat_path,
            chat(json!({"messages": []})).to_string().into_bytes(),
            400,
            Some("messages"),
        ),
        (
            "missing messages",
            chat_path,
            chat(json!({"messages": null})).to_string().into_bytes(),
            400,
            None,
        ),
        (
            "missing model",
            chat_path,
            chat(json!({"model": null})).to_string().into_bytes(),
            400,
            None,
        ),
        (
            "65 stop strings",
            chat_path,
            chat(json!({"stop": (0..65).map(|i| format!("s{i}")).collect::<Vec<_>>()}))
                .to_string()
                .into_bytes(),
            400,
            Some("stop"),
        ),
        (
            "logit_bias key",
            chat_path,
            chat(json!({"logit_bias": {"99999999": 5}}))
                .to_string()
                .into_bytes(),
            400,
            Some("logit_bias"),
        ),
        (
            "unknown response format",
            chat_path,
            chat(json!({"response_format": {"type": "yaml"}}))
                .to_string()
                .into_bytes(),
            400,
            Some("response_format.type"),
        ),
        (
            "a schema that does not compile",
            "/v1/completions",
            json!({"model": MODEL, "prompt": "x", "guided_json": {"type": "nonsense"}})
                .to_string()
                .into_bytes(),
            400,
            Some("guided_json"),
        ),
        (
            "prompt over the context",
            chat_path,
            chat(json!({"messages": [{"role": "user", "content": long_prompt}]}))
                .to_string()
                .into_bytes(),
            400,
            Some("messages"),
        ),
        (
            "unknown model",
            chat_path,
            chat(json!({"model": "gpt-4"})).to_string().into_bytes(),
            404,
            Some("model"),
        ),
        (
            "a batch item that is no prompt",
            "/v1/completions",
            json!({"model": MODEL, "prompt": ["a", {"text": "b"}]})
                .to_string()
                .into_bytes(),
            400,
            Some("prompt[1]"),
        ),
        (
            "a batch over --max-batch",
            "/v1/completions",
            json!({"model": MODEL, "prompt": vec!["a"; 9]})
                .to_string()
                .into_bytes(),
            400,
            Some("prompt"),
        ),
        (
            "token id past the vocabulary",
            "/v1/completions",
            json!({"model": MODEL, "prompt": [1, 999999]})
                .to_string()
                .into_bytes(),
            400,
            Some("prompt"),
        ),
        (
            "detokenize past the vocabulary",
            "/detokenize",
            json!({"tokens": [999999]}).to_string().into_bytes(),
            400,
            Some("tokens"),
        ),
        (
            "body over the limit",
            chat_path,
            chat(json!({"user": "x".repeat(5000)}))
                .to_string()
                .into_bytes(),
            413,
            None,
        ),
        ("no such endpoint", "/v1/audio/speech", b"{}".to_vec(), 404, None),
        (
            "embeddings from a language model",
            "/v1/embeddings",
            json!({"input": "hi"}).to_string().into_bytes(),
            400,
            Some("model"),
        ),
    ];
    for (what, path, body, status, param) in cases {
        let r = request(addr, "POST", path, &[], &body);
        assert_eq!(
            r.status,
            status,
            "{what}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let error = &r.json()["error"];
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {error}"
        );
        assert!(error["type"].is_string(), "{what}: {error}");
        if let Some(param) = param {
            assert_eq!(error["param"], param, "{what}: {error}");
        }
        assert_eq!(get(addr, "/health").status, 200, "{what}: server down");
    }
    let over = post(
        addr,
        chat_path,
        &chat(json!({"messages": [{"role": "user", "content": long_prompt}]})),
    );
    assert_eq!(over.json()["error"]["code"], "context_length_exceeded");
    assert_eq!(
        post(addr, chat_path, &chat(json!({"model": "gpt-4"}))).json()["error"]["code"],
        "model_not_found"
    );
    // What an error echoes of the request is clipped: a 3000-character model name does not
    // come back whole, nor does a 3000-character field name in the header naming it ignored.
    let huge = "m".repeat(3000);
    let r = post(addr, chat_path, &chat(json!({"model": huge})));
    assert!(r.body.len() < 2048, "a {} byte error body", r.body.len());
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("more characters"), "{message}");
    // Still serving, and the refusals were counted by status.
    assert_eq!(post(addr, chat_path, &chat(json!({}))).status, 200);
    common::wait_idle(addr);
    let metrics = String::from_utf8(get(addr, "/metrics").body).unwrap();
    for line in [
        "oxgen_requests_total{protocol=\"openai\",endpoint=\"/v1/chat/completions\",status=\"200\"} 1",
        "oxgen_requests_total{protocol=\"openai\",endpoint=\"/v1/chat/completions\",status=\"413\"} 1",
        "oxgen_requests_total{protocol=\"openai\",endpoint=\"/v1/chat/completions\",status=\"404\"} 3",
        "oxgen_generation_tokens_total 8",
        "oxgen_time_to_first_token_seconds_count 1",
        "oxgen_inter_token_latency_seconds_count 7",
        "oxgen_queue_depth 0",
        "oxgen_running_requests 0",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }
    // An ignored field's name comes back clipped too.
    let r = post(addr, chat_path, &chat(json!({&huge: 1, "x": 2})));
    assert_eq!(r.status, 200);
    let named = r.header("x-oxgen-ignored-fields").unwrap();
    assert_eq!(named, format!("{}, x", &huge[..128]));
    server.shutdown().unwrap();
}

#[test]
fn models_lists_the_served_model() {
    let dir = fixture();
    // Threads 0: every core, and the card says how many that is.
    let server = start(dir.path(), 0, config());
    let addr = server.addr();
    let v = get(addr, "/v1/models").json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(v["data"][0]["meta"]["context_length"], 128);
    let cores = std::thread::available_parallelism().unwrap().get();
    assert_eq!(v["data"][0]["meta"]["threads"], cores);
    assert_eq!(get(addr, "/v1/models/other-name").json()["id"], MODEL);
    assert_eq!(get(addr, "/v1/models/nope").status, 404);
    // Hugging Face style ids hold slashes.
    assert_eq!(get(addr, "/v1/models/org/fixture").json()["id"], MODEL);
    assert_eq!(get(addr, "/v1/models/org/nope").status, 404);
    server.shutdown().unwrap();
}

#[test]
fn the_fixture_vocabulary_is_what_the_server_checks_ids_against() {
    let dir = fixture();
    let server = start(dir.path(), 1, config());
    let addr = server.addr();
    let last = tokenizer::VOCAB_SIZE - 1;
    let ok = post(addr, "/detokenize", &json!({"tokens": [last]}));
    assert_eq!(ok.status, 200);
    let past = post(addr, "/detokenize", &json!({"tokens": [last + 1]}));
    assert_eq!(past.status, 400);
    server.shutdown().unwrap();
}

#[test]
fn health_is_503_while_loading_and_a_failed_load_stops_the_server() {
    let dir = fixture();
    let path = dir.path().to_path_buf();
    let (release, gate) = std::sync::mpsc::channel::<()>();
    let gate = std::sync::Mutex::new(gate);
    let server = oxgen_server::Server::start(
        config(),
        "127.0.0.1:0",
        Box::new(move || {
            // The load blocks until the test has seen the server answer while loading.
            let _ = gate.lock().unwrap().recv();
            oxgen::Model::open(&path, &Default::default()).map_err(|e| e.to_string())
        }),
    )
    .unwrap();
    let addr = server.addr();
    let loading = get(addr, "/health");
    assert_eq!(loading.status, 503);
    assert_eq!(loading.json()["status"], "loading");
    let early = post(addr, "/v1/chat/completions", &chat(json!({})));
    assert_eq!(early.status, 503);
    assert_eq!(early.json()["error"]["code"], "loading");
    release.send(()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while get(addr, "/health").status != 200 {
        assert!(std::time::Instant::now() < deadline, "never loaded");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        post(addr, "/v1/chat/completions", &chat(json!({}))).status,
        200
    );
    server.shutdown().unwrap();

    let failing = oxgen_server::Server::start(
        config(),
        "127.0.0.1:0",
        Box::new(|| Err("no model here".to_string())),
    )
    .unwrap();
    let e = failing.wait().expect_err("a failed load ends the server");
    assert!(e.contains("no model here"), "{e}");
}

/// Without `temperature`, a greedy package samples when a request gives a sampling control,
/// a seed or `n > 1` (the CLI's rule), instead of ignoring them.
#[test]
fn sampling_controls_without_a_temperature_turn_sampling_on() {
    let dir = fixture();
    let server = start(dir.path(), 1, config());
    let addr = server.addr();
    let texts = |extra: Value| -> Vec<String> {
        let r = post(
            addr,
            "/v1/chat/completions",
            &chat(json!({"temperature": null, "max_tokens": 12, "n": 3}).merge(extra)),
        );
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        r.json()["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["message"]["content"].as_str().unwrap().to_string())
            .collect()
    };
    let sampled = texts(json!({"top_p": 0.9, "seed": 3}));
    assert!(
        sampled.iter().any(|t| *t != sampled[0]),
        "n = 3 with top_p and a seed gave three identical choices: {sampled:?}"
    );
    // The same seed gives the same choices.
    assert_eq!(texts(json!({"top_p": 0.9, "seed": 3})), sampled);
    // temperature 0 stays greedy whatever else is given.
    let greedy = texts(json!({"temperature": 0, "top_p": 0.9, "seed": 3}));
    assert!(greedy.iter().all(|t| *t == greedy[0]), "{greedy:?}");
    server.shutdown().unwrap();
}

trait Merge {
    fn merge(self, other: Value) -> Value;
}

impl Merge for Value {
    /// `self` with `other`'s keys laid over it.
    fn merge(mut self, other: Value) -> Value {
        for (k, v) in other.as_object().unwrap() {
            self[k] = v.clone();
        }
        self
    }
}

#[test]
fn completion_text_offsets_are_the_same_streamed_or_not() {
    let dir = fixture();
    let server = start(dir.path(), 1, config());
    let addr = server.addr();
    let body = |stream: bool| {
        json!({"model": MODEL, "prompt": "the cat and the dog", "max_tokens": 10,
               "temperature": 0, "ignore_eos": true, "logprobs": 1, "stream": stream})
    };
    let whole = post(addr, "/v1/completions", &body(false)).json();
    let lp = &whole["choices"][0]["logprobs"];
    let offsets = lp["text_offset"].as_array().unwrap().clone();
    let streamed: Vec<Value> = post(addr, "/v1/completions", &body(true))
        .events()
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| {
            c["choices"][0]["logprobs"]["text_offset"]
                .as_array()
                .cloned()
        })
        .flatten()
        .collect();
    assert_eq!(streamed, offsets);
    // Each offset is the previous one plus that token's text.
    let tokens = lp["tokens"].as_array().unwrap();
    for i in 1..offsets.len() {
        assert_eq!(
            offsets[i].as_u64().unwrap(),
            offsets[i - 1].as_u64().unwrap() + tokens[i - 1].as_str().unwrap().len() as u64
        );
    }
    server.shutdown().unwrap();
}

#[test]
fn wrong_methods_slash_ids_and_unreadable_bodies_get_openai_errors() {
    let dir = fixture();
    let server = start(dir.path(), 1, config());
    let addr = server.addr();
    let wrong = get(addr, "/v1/chat/completions");
    assert_eq!(wrong.status, 405);
    assert_eq!(wrong.json()["error"]["code"], "method_not_allowed");
    assert!(wrong.json()["error"]["message"].is_string());
    // A body shorter than its Content-Length: the client hung up mid-body. The declared
    // length is under the limit, so this is not a 413.
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    use std::io::Write;
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: 1000\r\n\r\n{{\"model\":"
    )
    .unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let short = common::Conn::read_head(stream).finish();
    assert_eq!(
        short.status,
        400,
        "{}",
        String::from_utf8_lossy(&short.body)
    );
    assert!(
        short.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("could not read the request body")
    );
    assert_eq!(
        post(addr, "/v1/chat/completions", &chat(json!({}))).status,
        200
    );
    server.shutdown().unwrap();
}

fn fixture_refusing_system_messages() -> tempfile::TempDir {
    let dir = fixture();
    let path = dir.path().join("tokenizer_config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let template = config["chat_template"].as_str().unwrap();
    config["chat_template"] = json!(format!(
        "{{% for m in messages %}}{{% if m['role'] == 'system' %}}\
         {{{{ raise_exception('no system messages here') }}}}{{% endif %}}{{% endfor %}}{template}"
    ));
    std::fs::write(&path, config.to_string()).unwrap();
    dir
}

#[test]
fn a_template_refusal_is_422_in_chat_and_in_tokenize() {
    let dir = fixture_refusing_system_messages();
    let server = start(dir.path(), 1, config());
    let addr = server.addr();
    let user_only = json!([{"role": "user", "content": "the cat", "name": "ann"}]);
    let with_system = chat(json!({}))["messages"].clone();
    let ok = post(addr, "/tokenize", &json!({"messages": user_only}));
    assert_eq!(ok.status, 200, "{}", String::from_utf8_lossy(&ok.body));
    let chat_ok = post(
        addr,
        "/v1/chat/completions",
        &chat(json!({"messages": user_only})),
    );
    assert_eq!(
        ok.json()["count"],
        chat_ok.json()["usage"]["prompt_tokens"],
        "/tokenize counts what chat completions run"
    );
    for (path, body) in [
        ("/tokenize", json!({"messages": with_system})),
        ("/v1/chat/completions", chat(json!({}))),
    ] {
        let r = post(addr, path, &body);
        assert_eq!(
            r.status,
            422,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let message = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(
            message.contains("no system messages here"),
            "{path}: {message}"
        );
    }
    // Message validation is the chat endpoint's.
    let bad = post(
        addr,
        "/tokenize",
        &json!({"messages": [{"role": "robot", "content": "x"}]}),
    );
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"]["param"], "messages[0].role");
    server.shutdown().unwrap();
}

/// Tokenizing runs off the HTTP worker: while a huge prompt is being tokenized, other
/// connections are answered at once.
#[test]
fn an_engine_that_panics_stops_the_server_with_an_error() {
    let server = oxgen_server::Server::start(
        config(),
        "127.0.0.1:0",
        Box::new(|| panic!("a bug while loading")),
    )
    .unwrap();
    let (done, on_done) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(server.wait()));
    let waited = on_done
        .recv_timeout(Duration::from_secs(60))
        .expect("the server kept running after its engine panicked");
    let e = waited.expect_err("an engine panic is an error");
    assert!(e.contains("panicked"), "{e}");
}

/// The chat page's files are served at `/` without the API key (every API call still needs
/// it), under a policy that lets the page load and call nothing but this server; with the
/// page turned off they are 404s.
#[test]
fn the_chat_page_is_served_without_the_key_and_can_be_turned_off() {
    let dir = fixture();
    let mut cfg = config();
    cfg.api_key = Some("k".into());
    let server = start(dir.path(), 1, cfg.clone());
    let addr = server.addr();
    for (path, kind) in [
        ("/", "text/html"),
        ("/webui/app.js", "text/javascript"),
        ("/webui/style.css", "text/css"),
    ] {
        let r = get(addr, path);
        assert_eq!(r.status, 200, "{path}");
        assert!(
            r.header("content-type").unwrap().starts_with(kind),
            "{path}"
        );
        let csp = r.header("content-security-policy").unwrap();
        assert!(csp.contains("default-src 'self'"), "{csp}");
    }
    let page = String::from_utf8(get(addr, "/").body).unwrap();
    assert!(
        page.contains("/webui/app.js") && !page.contains("http"),
        "only its own files"
    );
    assert_eq!(get(addr, "/v1/models").status, 401);
    server.shutdown().unwrap();

    cfg.webui = false;
    let server = start(dir.path(), 1, cfg);
    for path in ["/", "/webui/app.js"] {
        assert_eq!(get(server.addr(), path).status, 404, "{path}");
    }
    server.shutdown().unwrap();
}
