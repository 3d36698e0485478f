//! Requests over their lifetime on the default model (its generations are long enough to
//! interrupt): clients that leave mid-stream, while queued or while waiting for a whole
//! response free everything they held (sequences and KV blocks); a full queue answers 429;
//! a full KV pool makes requests wait; a step that fails for one request fails only that one;
//! shutdown drains.

mod common;

use std::time::{Duration, Instant};

use common::{default_model, get, live, metric, open, post, start, start_with, wait_idle};
use oxgen::{KvBudget, ModelOptions};
use oxgen_server::Config;
use serde_json::{Value, json};

const MODEL: &str = "smollm2";

fn body(max_tokens: usize, stream: bool) -> Vec<u8> {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": true,
        "stream": stream,
    })
    .to_string()
    .into_bytes()
}

const CHAT: &str = "/v1/chat/completions";

/// Polls `/health` until `pred` holds for (queued, running, kv sequences).
fn wait_for(addr: std::net::SocketAddr, what: &str, pred: impl Fn((u64, u64, u64)) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pred(live(addr)) {
        assert!(
            Instant::now() < deadline,
            "{what}: still {:?} after 60 s",
            live(addr)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn clients_that_leave_free_what_they_held_and_a_full_queue_answers_429() {
    let mut config = Config::new(MODEL);
    config.max_batch = 1;
    config.max_queue = 1;
    let server = start(&default_model(), 2, config);
    let addr = server.addr();

    // A runs; B waits in the queue; C finds the queue full.
    let mut a = open(addr, "POST", CHAT, &[], &body(4000, true));
    assert_eq!(a.status, 200);
    let role = a.next_event().unwrap();
    assert!(role.contains("\"role\":\"assistant\""), "{role}");
    let first: Value = serde_json::from_str(&a.next_event().unwrap()).unwrap();
    assert!(first["choices"][0]["delta"]["content"].is_string());
    let b = open(addr, "POST", CHAT, &[], &body(4000, true));
    assert_eq!(b.status, 200);
    wait_for(addr, "B queued", |(q, r, _)| q == 1 && r == 1);
    let c = post(
        addr,
        CHAT,
        &serde_json::from_slice(&body(4, false)).unwrap(),
    );
    assert_eq!(c.status, 429, "{}", String::from_utf8_lossy(&c.body));
    assert_eq!(c.header("retry-after"), Some("1"));
    assert_eq!(c.json()["error"]["code"], "queue_full");

    // B leaves while queued: the queue empties, A keeps running.
    drop(b);
    wait_for(addr, "B gone from the queue", |(q, r, k)| {
        q == 0 && r == 1 && k == 1
    });
    // A leaves mid-stream: its sequence and KV are freed.
    drop(a);
    wait_idle(addr);

    // D waits for a whole (non-streaming) response, then leaves.
    let d = common::send(addr, "POST", CHAT, &[], &body(4000, false));
    wait_for(addr, "D running", |(_, r, _)| r == 1);
    drop(d);
    wait_idle(addr);

    // Everything freed, and the server still answers.
    let ok = post(
        addr,
        CHAT,
        &serde_json::from_slice(&body(3, false)).unwrap(),
    );
    assert_eq!(ok.status, 200);
    assert_eq!(ok.json()["usage"]["completion_tokens"], 3);
    wait_idle(addr);
    server.shutdown().unwrap();
}

fn kv_blocks(addr: std::net::SocketAddr, state: &str) -> f64 {
    metric(addr, &format!("oxgen_kv_blocks{{state=\"{state}\"}}"))
}

fn chat(prompt: &str, max_tokens: usize) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": true,
    })
}

#[test]
fn cancelled_and_finished_requests_return_every_kv_block() {
    let mut config = Config::new(MODEL);
    config.max_batch = 4;
    let server = start(&default_model(), 2, config);
    let addr = server.addr();
    let models = get(addr, "/v1/models").json();
    let meta = &models["data"][0]["meta"];
    assert_eq!(meta["fused_decode"], true, "{meta}");
    assert_eq!(meta["kv_cache"]["paged"], true, "{meta}");
    assert_eq!(meta["kv_cache"]["prefix_cache"], true, "{meta}");
    assert_eq!(meta["kv_dtype"], "f32", "the package's own, as resolved");
    assert!(meta["batching"].as_str().unwrap().starts_with("continuous"));
    let total = kv_blocks(addr, "total");
    assert_eq!(total, (4 * 8192 / 16) as f64, "--max-batch whole contexts");
    assert_eq!(
        (kv_blocks(addr, "used"), kv_blocks(addr, "reserved")),
        (0.0, 0.0)
    );

    // Cancelled: a stream dropped mid-way, while another request runs beside it.
    let mut a = open(addr, "POST", CHAT, &[], &body(4000, true));
    a.next_event().unwrap();
    a.next_event().unwrap();
    let beside = std::thread::spawn(move || post(addr, CHAT, &chat("Name three colors.", 12)));
    wait_for(addr, "both running", |(_, r, _)| r == 2);
    assert!(
        kv_blocks(addr, "reserved") > 250.0,
        "A reserved its 4000 tokens"
    );
    drop(a);
    assert_eq!(beside.join().unwrap().status, 200);
    wait_idle(addr);
    assert_eq!(
        (kv_blocks(addr, "used"), kv_blocks(addr, "reserved")),
        (0.0, 0.0),
        "every block is back after cancelled and finished requests"
    );
    assert_eq!(kv_blocks(addr, "free"), total);

    // A second request with the same long system prompt prefills only what differs.
    let system = "You are a careful assistant. Answer briefly and plainly. ".repeat(8);
    let ask = |q: &str| {
        json!({
            "model": MODEL,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
            "max_tokens": 4,
            "temperature": 0,
        })
    };
    let hits = metric(addr, "oxgen_prefix_cache_hits_total");
    assert_eq!(post(addr, CHAT, &ask("What is 2 + 2?")).status, 200);
    assert_eq!(post(addr, CHAT, &ask("Name a planet.")).status, 200);
    assert!(
        metric(addr, "oxgen_prefix_cache_hits_total") >= hits + 5.0,
        "the shared system prompt's blocks were reused"
    );
    assert!(metric(addr, "oxgen_prefix_cache_hit_rate") > 0.0);
    // The same greedy request again and again: its answer fills the blocks the first run
    // cached, which it shares instead of caching them once more.
    let long = |q: &str| {
        let mut request = ask(q);
        request["max_tokens"] = json!(80);
        request["ignore_eos"] = json!(true);
        request
    };
    assert_eq!(post(addr, CHAT, &long("Tell me a story.")).status, 200);
    let cached = kv_blocks(addr, "cached");
    for _ in 0..3 {
        assert_eq!(post(addr, CHAT, &long("Tell me a story.")).status, 200);
        assert_eq!(
            kv_blocks(addr, "cached"),
            cached,
            "a repeat cached blocks again"
        );
    }
    assert!(metric(addr, "oxgen_weight_bytes_per_step") > 0.0);
    assert!(metric(addr, "oxgen_weight_bytes_per_token") > 0.0);
    wait_idle(addr);
    server.shutdown().unwrap();
}

#[test]
fn a_failed_request_returns_every_kv_block() {
    let mut config = Config::new(MODEL);
    config.request_timeout = Some(Duration::from_secs(1));
    let server = start(&default_model(), 2, config);
    let addr = server.addr();
    // Fails by running past --request-timeout (4000 tokens take far longer than a second).
    let failed = post(addr, CHAT, &chat("Tell me a long story.", 4000));
    assert_eq!(
        failed.status,
        503,
        "{}",
        String::from_utf8_lossy(&failed.body)
    );
    assert_eq!(failed.json()["error"]["code"], "timeout");
    wait_idle(addr);
    assert_eq!(
        (kv_blocks(addr, "used"), kv_blocks(addr, "reserved")),
        (0.0, 0.0),
        "every block is back after a failed request"
    );
    assert_eq!(kv_blocks(addr, "free"), kv_blocks(addr, "total"));
    server.shutdown().unwrap();
}

/// A burst into an idle server: the running set's free slots take requests before the queue
/// limit counts them, so --max-batch plus --max-queue requests get in and the next gets 429.
#[test]
fn a_burst_fills_the_free_slots_then_the_queue() {
    let mut config = Config::new(MODEL);
    config.max_batch = 2;
    config.max_queue = 1;
    let server = start(&default_model(), 2, config);
    let addr = server.addr();
    let streams: Vec<_> = (0..3)
        .map(|_| open(addr, "POST", CHAT, &[], &body(4000, true)))
        .collect();
    for s in &streams {
        assert_eq!(s.status, 200);
    }
    wait_for(addr, "two running, one queued", |(q, r, _)| {
        q == 1 && r == 2
    });
    let over = post(
        addr,
        CHAT,
        &serde_json::from_slice(&body(4, false)).unwrap(),
    );
    assert_eq!(over.status, 429, "{}", String::from_utf8_lossy(&over.body));
    // What an inference gateway's endpoint picker reads: the same counts, and the share of
    // the KV pool the two running requests reserved (4000 tokens each, of 2 x 8192).
    let total = kv_blocks(addr, "total");
    assert_eq!(metric(addr, "oxgen_num_requests_waiting"), 1.0);
    assert_eq!(metric(addr, "oxgen_num_requests_running"), 2.0);
    // Both reservations show once the second request is admitted (its admission and the
    // gauge's update are not one atomic step, hence the wait).
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(addr, "oxgen_kv_cache_usage_perc") < 0.45 {
        assert!(Instant::now() < deadline, "KV usage stayed under 0.45");
        std::thread::sleep(Duration::from_millis(10));
    }
    let usage = metric(addr, "oxgen_kv_cache_usage_perc");
    assert_eq!(usage, kv_blocks(addr, "reserved") / total);
    let info = format!("oxgen_cache_config_info{{block_size=\"16\",num_gpu_blocks=\"{total}\"}}");
    assert_eq!(metric(addr, &info), 1.0);
    drop(streams);
    wait_idle(addr);
    assert_eq!(metric(addr, "oxgen_kv_cache_usage_perc"), 0.0);
    assert_eq!(metric(addr, "oxgen_num_requests_running"), 0.0);
    server.shutdown().unwrap();
}

#[test]
fn requests_wait_for_kv_blocks_and_one_too_big_for_the_pool_is_refused() {
    let mut config = Config::new(MODEL);
    config.max_batch = 4;
    let options = ModelOptions {
        threads: 2,
        memory: oxgen::MemoryOptions {
            kv: KvBudget::Blocks(20),
            ..Default::default()
        },
        ..ModelOptions::default()
    };
    let server = start_with(&default_model(), options, config);
    let addr = server.addr();
    // 4000 tokens need ~250 blocks: never fits.
    let big = post(addr, CHAT, &chat("Hello.", 4000));
    assert_eq!(big.status, 503, "{}", String::from_utf8_lossy(&big.body));
    assert_eq!(big.json()["error"]["code"], "kv_cache_full");
    assert!(
        big.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--kv-blocks")
    );
    // Two requests of ~12 blocks each: the second waits for the first's blocks, then runs.
    let (steps, tokens) = (
        metric(addr, "oxgen_steps_total"),
        metric(addr, "oxgen_generation_tokens_total"),
    );
    let first = std::thread::spawn(move || post(addr, CHAT, &chat("Count to five.", 150)));
    wait_for(addr, "the first running", |(_, r, _)| r == 1);
    // One that can never fit is refused on arrival, not after waiting for the pool.
    let big = post(addr, CHAT, &chat("Hello.", 4000));
    assert_eq!(big.json()["error"]["code"], "kv_cache_full");
    assert!(
        !first.is_finished(),
        "refused while the pool was still held"
    );
    let second = post(addr, CHAT, &chat("Count to five.", 150));
    assert_eq!(second.status, 200);
    let first = first.join().unwrap();
    assert_eq!(first.status, 200);
    assert_eq!(
        first.json()["choices"],
        second.json()["choices"],
        "same prompt, same text"
    );
    // They never ran together: every step generated one token (a step over both would
    // have made two).
    wait_idle(addr);
    assert_eq!(
        metric(addr, "oxgen_steps_total") - steps,
        metric(addr, "oxgen_generation_tokens_total") - tokens,
    );
    assert_eq!(
        metric(addr, "oxgen_generation_tokens_total") - tokens,
        300.0
    );
    assert_eq!(kv_blocks(addr, "reserved"), 0.0);
    server.shutdown().unwrap();
}

#[test]
fn shutdown_drains_running_requests_and_refuses_new_ones() {
    let server = start(&default_model(), 2, Config::new(MODEL));
    let addr = server.addr();
    let mut a = open(addr, "POST", CHAT, &[], &body(48, true));
    a.next_event().unwrap();
    a.next_event().unwrap();
    let stopping = std::thread::spawn(move || server.shutdown());
    // While A runs, the server is draining: health and new requests answer 503.
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(addr, "/health").status != 503 {
        assert!(Instant::now() < deadline, "health never went 503");
        std::thread::sleep(Duration::from_millis(5));
    }
    let refused = post(
        addr,
        CHAT,
        &serde_json::from_slice(&body(4, false)).unwrap(),
    );
    assert_eq!(refused.status, 503);
    assert_eq!(refused.json()["error"]["code"], "shutting_down");
    // A finishes normally.
    let rest = a.finish().events();
    assert_eq!(rest.last().map(String::as_str), Some("[DONE]"));
    let finish: Value = serde_json::from_str(&rest[rest.len() - 2]).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    stopping.join().unwrap().unwrap();
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "still listening after shutdown"
    );
}

#[test]
fn requests_still_running_at_the_shutdown_timeout_get_an_error() {
    let mut config = Config::new(MODEL);
    config.shutdown_timeout = Duration::from_millis(300);
    let server = start(&default_model(), 2, config);
    let addr = server.addr();
    let mut a = open(addr, "POST", CHAT, &[], &body(4000, true));
    a.next_event().unwrap();
    server.shutdown().unwrap();
    let rest = a.finish().events();
    assert_eq!(rest.last().map(String::as_str), Some("[DONE]"));
    let error: Value = serde_json::from_str(&rest[rest.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "shutting_down", "{error}");
}

#[test]
fn the_same_seed_gives_the_same_text_and_others_differ() {
    let server = start(&default_model(), 2, Config::new(MODEL));
    let addr = server.addr();
    let sample = |seed: u64| {
        let body = json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": "Write a sentence about the sea."}],
            "max_tokens": 12, "temperature": 1.0, "seed": seed,
        });
        post(addr, CHAT, &body).json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(sample(42), sample(42));
    let texts: std::collections::BTreeSet<String> = (0..4).map(sample).collect();
    assert!(texts.len() > 1, "four seeds gave one text: {texts:?}");
    server.shutdown().unwrap();
}

/// Logprob `bytes` are each token's raw bytes: an emoji spans several byte-level tokens, each
/// of whose text alone is U+FFFD, yet their bytes joined are the content's UTF-8.
#[test]
fn logprob_bytes_join_into_the_content() {
    let server = start(&default_model(), 2, Config::new(MODEL));
    let addr = server.addr();
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Reply with just this emoji and nothing else: 🐉"}],
        // 🐉 is three tokens here (F0 9F, 90, 89); six end on a character boundary.
        "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 2,
    });
    let v = post(addr, CHAT, &body).json();
    let choice = &v["choices"][0];
    let content = choice["message"]["content"].as_str().unwrap();
    assert!(
        content.contains('🐉'),
        "the model did not answer with the emoji: {content:?}"
    );
    let mut entries = choice["logprobs"]["content"].as_array().unwrap().clone();
    if choice["finish_reason"] == "stop" {
        // The end-of-sequence token has a log-probability but no text.
        entries.pop();
    }
    let bytes = |e: &Value| -> Vec<u8> { serde_json::from_value(e["bytes"].clone()).unwrap() };
    let joined: Vec<u8> = entries.iter().flat_map(bytes).collect();
    assert_eq!(String::from_utf8_lossy(&joined), content);
    assert_eq!(joined, content.as_bytes());
    assert!(
        entries.iter().any(|e| e["token"] == "\u{FFFD}"),
        "no token held part of a character: {entries:?}"
    );
    for e in &entries {
        assert_eq!(e["token"], json!(String::from_utf8_lossy(&bytes(e))));
        for top in e["top_logprobs"].as_array().unwrap() {
            assert_eq!(top["token"], json!(String::from_utf8_lossy(&bytes(top))));
        }
    }
    server.shutdown().unwrap();
}

/// A step that fails for one request only: its prompt holds a token the tokenizer has and the
/// model's embedding lacks (a package whose tokenizer gained a token), so its embedding gather
/// is out of range. The fused step fails, the engine steps each sequence alone, and only that
/// request fails; the stream beside it runs to the end with the text it has alone, and every
/// KV block comes back.
#[test]
fn a_step_that_fails_for_one_request_fails_only_that_one() {
    let src = default_model();
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        // Linked, not symlinked (the loader refuses weights outside the model's folder);
        // copied across file systems.
        let path = entry.unwrap().path();
        let to = dir.path().join(path.file_name().unwrap());
        std::fs::hard_link(&path, &to)
            .or_else(|_| std::fs::copy(&path, &to).map(drop))
            .unwrap();
    }
    let tokenizer = dir.path().join("tokenizer.json");
    let mut json: Value = serde_json::from_slice(&std::fs::read(&tokenizer).unwrap()).unwrap();
    let vocab = json["model"]["vocab"].as_object().unwrap().len();
    json["added_tokens"].as_array_mut().unwrap().push(json!({
        "id": vocab, "content": "<|not_in_the_model|>", "single_word": false, "lstrip": false,
        "rstrip": false, "normalized": false, "special": true,
    }));
    std::fs::remove_file(&tokenizer).unwrap();
    std::fs::write(&tokenizer, json.to_string()).unwrap();

    let mut config = Config::new(MODEL);
    config.max_batch = 4;
    let server = start(dir.path(), 2, config);
    let addr = server.addr();
    let alone = post(addr, CHAT, &chat("Tell me a story.", 120));
    assert_eq!(alone.status, 200);
    let alone = alone.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();

    let mut request = chat("Tell me a story.", 120);
    request["stream"] = json!(true);
    let mut a = open(addr, "POST", CHAT, &[], request.to_string().as_bytes());
    let mut events = vec![a.next_event().unwrap(), a.next_event().unwrap()];
    let bad = post(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": [1, vocab, 2], "max_tokens": 4}),
    );
    assert_eq!(bad.status, 500, "{}", String::from_utf8_lossy(&bad.body));
    let message = bad.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("generation failed"), "{message}");

    events.extend(a.finish().events());
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let text: String = events[..events.len() - 1]
        .iter()
        .filter_map(|e| {
            let v: Value = serde_json::from_str(e).ok()?;
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(
        text, alone,
        "the stream beside the failure differs from its text alone"
    );
    wait_idle(addr);
    assert_eq!(
        (kv_blocks(addr, "used"), kv_blocks(addr, "reserved")),
        (0.0, 0.0)
    );
    server.shutdown().unwrap();
}

/// The prefix cache's disk tier across a restart: the second server reads the prompt's
/// blocks back instead of prefilling them (`cached_tokens`, the disk metrics), and answers
/// with the same text; Anthropic's usage splits the prompt into read, written and the rest.
#[test]
fn a_restarted_server_reads_a_prompt_back_from_its_disk_cache() {
    let disk = tempfile::tempdir().unwrap();
    let options = || ModelOptions {
        threads: 2,
        memory: oxgen::MemoryOptions {
            kv: KvBudget::Sequences(2),
            prefix_cache: true,
            ..Default::default()
        },
        kv_disk_cache: Some(disk.path().to_path_buf()),
        ..ModelOptions::default()
    };
    let prompt = "Describe the water cycle: evaporation, condensation, rain. ".repeat(6);
    let mut body = chat(&prompt, 12);
    body["prompt_cache_key"] = json!("water");
    let server = start_with(&default_model(), options(), Config::new(MODEL));
    let cold = post(server.addr(), "/v1/chat/completions", &body).json();
    assert_eq!(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let writes = metric(server.addr(), "oxgen_kv_disk_writes_total");
    assert!(writes >= 6.0, "{writes} blocks written");
    server.shutdown().unwrap();

    let server = start_with(&default_model(), options(), Config::new(MODEL));
    let addr = server.addr();
    let warm = post(addr, "/v1/chat/completions", &body).json();
    let text = |v: &Value| v["choices"][0]["message"]["content"].clone();
    assert_eq!(text(&warm), text(&cold));
    let prompt_tokens = warm["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(
        cached,
        prompt_tokens / 16 * 16,
        "every whole block from disk"
    );
    assert_eq!(
        metric(addr, "oxgen_prefix_cache_disk_hits_total"),
        (cached / 16) as f64
    );
    assert!(metric(addr, "oxgen_kv_disk_read_bytes_total") > 0.0);
    assert_eq!(metric(addr, "oxgen_kv_disk_writable"), 1.0);

    // Anthropic's split of a prompt marked to be cached, on a prompt new to the cache.
    let messages = json!({
        "model": MODEL,
        "max_tokens": 4,
        "system": [{"type": "text", "text": "You summarize. ".repeat(20),
                    "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": "Summarize the tides."}],
    });
    let first = post(addr, "/v1/messages", &messages).json();
    let u = &first["usage"];
    assert_eq!(u["cache_read_input_tokens"], 0);
    let written = u["cache_creation_input_tokens"].as_u64().unwrap();
    assert!(written >= 32, "{u}");
    let again = post(addr, "/v1/messages", &messages).json();
    assert_eq!(again["usage"]["cache_read_input_tokens"], written);
    assert_eq!(again["usage"]["cache_creation_input_tokens"], 0);
    server.shutdown().unwrap();
}

/// LoRA adapters served as models: one given at start, one loaded and unloaded through
/// vLLM's endpoints; each answers with onnxruntime-genai's ids for it (the fixtures of
/// `crates/testkit/thirdparty/lora/`), the base model with the base's; the resident bound,
/// duplicate and unknown names; the gateway's LoRA metric.
#[test]
fn lora_adapters_are_served_by_name_and_loaded_at_run_time() {
    let lora =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testkit/thirdparty/lora");
    let oracle: Value =
        serde_json::from_str(&std::fs::read_to_string(lora.join("lora.json")).unwrap()).unwrap();
    let options = ModelOptions {
        threads: 2,
        lora: vec![("a".into(), lora.join("a.onnx_adapter"))],
        max_loras: 2,
        ..ModelOptions::default()
    };
    let server = start_with(
        &lora.join("llama3-lora-fp32"),
        options,
        Config::new("llama3"),
    );
    let addr = server.addr();
    let listed = get(addr, "/v1/models").json();
    let card = (listed["data"].as_array().unwrap().iter())
        .find(|m| m["id"] == "a")
        .unwrap_or_else(|| panic!("no adapter in {listed}"));
    assert_eq!(card["parent"], "llama3");
    assert_eq!(card["meta"]["rank"], 4);
    let text_of =
        |ids: &Value| post(addr, "/detokenize", &json!({"tokens": ids})).json()["prompt"].clone();
    let complete = |model: &str| {
        let body = json!({"model": model, "prompt": oracle["prompt"], "max_tokens": 24,
                          "temperature": 0, "ignore_eos": true});
        post(addr, "/v1/completions", &body)
    };
    let text = |r: common::Reply| r.json()["choices"][0]["text"].clone();
    let genai = &oracle["genai"]["fp32"];
    assert_eq!(text(complete("a")), text_of(&genai["a"]));
    assert_eq!(text(complete("llama3")), text_of(&genai["base"]));

    let load = |name: &str, path: &std::path::Path| {
        let body = json!({"lora_name": name, "lora_path": path});
        post(addr, "/v1/load_lora_adapter", &body)
    };
    let b = lora.join("b.onnx_adapter");
    let loaded = load("b", &b);
    assert_eq!(
        loaded.status,
        200,
        "{}",
        String::from_utf8_lossy(&loaded.body)
    );
    assert_eq!(text(complete("b")), text_of(&genai["b"]));
    let again = load("b", &b);
    assert_eq!(again.status, 400);
    assert!(
        again.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already")
    );
    let full = load("c", &b);
    assert_eq!(full.status, 400);
    assert!(
        full.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-loras")
    );
    let series = "oxgen_lora_requests_info{running_lora_adapters=\"\",\
                  waiting_lora_adapters=\"\",max_lora=\"2\"}";
    assert!(metric(addr, series) > 0.0);

    let unload = |name: &str| post(addr, "/v1/unload_lora_adapter", &json!({"lora_name": name}));
    assert_eq!(unload("b").status, 200);
    assert_eq!(complete("b").status, 404);
    assert_eq!(unload("b").status, 404);
    // A file that is no adapter is refused, and what is served stays served.
    let foreign = load("c", &lora.join("../families/llama3-int4/model.onnx"));
    assert_eq!(foreign.status, 400);
    assert_eq!(text(complete("a")), text_of(&genai["a"]));
    server.shutdown().unwrap();
}
