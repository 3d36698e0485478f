//! The other protocols over the same engine, on the fixture package: OpenAI's Responses,
//! Anthropic's Messages and Ollama's API give the text chat completions gives for the same
//! greedy request, whole or streamed in their own event shapes; Responses are stored and
//! continued by id; each protocol's errors come in its own envelope; `/metrics` counts each;
//! a client that leaves mid-stream frees its KV on all of them.

mod common;

use common::fixture::{MODEL, config, fixture};
use common::{get, metric, open, post, request, start, wait_idle};
use oxgen_testkit::fixtures::{FixtureConfig, write_package};
use serde_json::{Value, json};

const SYSTEM: &str = "be brief";
const USER: &str = "the cat and the dog";

fn chat_body() -> Value {
    json!({"model": MODEL, "max_tokens": 8, "temperature": 0,
           "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]})
}

fn responses_body() -> Value {
    json!({"model": MODEL, "instructions": SYSTEM, "input": USER, "max_output_tokens": 8,
           "temperature": 0})
}

fn messages_body() -> Value {
    json!({"model": MODEL, "system": SYSTEM, "max_tokens": 8, "temperature": 0,
           "messages": [{"role": "user", "content": [{"type": "text", "text": USER}]}]})
}

fn ollama_body() -> Value {
    json!({"model": format!("{MODEL}:latest"), "stream": false,
           "options": {"num_predict": 8, "temperature": 0},
           "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]})
}

fn with(mut body: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// The text of a Responses object's message items.
fn responses_text(r: &Value) -> String {
    let items = r["output"].as_array().unwrap();
    (items.iter())
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap())
        .map(|p| p["text"].as_str().unwrap())
        .collect()
}

/// The `event:` names and `data:` payloads of an SSE body.
fn named_events(body: &[u8]) -> Vec<(String, Value)> {
    (String::from_utf8_lossy(body).split("\n\n"))
        .filter_map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = e.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((name.to_string(), serde_json::from_str(data).unwrap()))
        })
        .collect()
}

/// One greedy request on all four protocols gives the same text and counts the same
/// prompt, whole and streamed; each stream has its protocol's shape: Responses' typed
/// events from `response.created` to `response.completed` numbered in order, Anthropic's
/// named events from `message_start` to `message_stop`, Ollama's JSON lines ending in one
/// with `done` and its timings.
#[test]
fn one_greedy_request_gives_the_same_text_on_every_protocol() {
    let dir = fixture();
    let server = start(dir.path(), 1, config());
    let addr = server.addr();
    let chat = post(addr, "/v1/chat/completions", &chat_body()).json();
    let want = chat["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let prompt_tokens = chat["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(!want.is_empty());

    let r = post(addr, "/v1/responses", &responses_body());
    assert_eq!(r.status, 200, "{}", r.json());
    let r = r.json();
    assert_eq!(responses_text(&r), want, "{r}");
    assert_eq!(r["object"], "response");
    assert!(r["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(r["usage"]["input_tokens"], prompt_tokens);
    assert_eq!(r["instructions"], SYSTEM);

    let m = post(addr, "/v1/messages", &messages_body());
    assert_eq!(m.status, 200, "{}", m.json());
    let m = m.json();
    assert_eq!(m["type"], "message");
    assert_eq!(m["content"][0]["type"], "text");
    assert_eq!(m["content"][0]["text"], want.as_str());
    let u = &m["usage"];
    // Anthropic's split: the prompt is what was read from the cache, what was written to
    // it (its whole blocks) and the rest.
    let field = |k: &str| u[k].as_u64().unwrap();
    assert_eq!(
        field("input_tokens")
            + field("cache_read_input_tokens")
            + field("cache_creation_input_tokens"),
        prompt_tokens
    );
    assert!(
        field("input_tokens") < 16,
        "{u}: only the last partial block is neither"
    );
    let counted = post(addr, "/v1/messages/count_tokens", &messages_body()).json();
    assert_eq!(counted["input_tokens"], prompt_tokens);

    let o = post(addr, "/api/chat", &ollama_body());
    assert_eq!(o.status, 200, "{}", o.json());
    let o = o.json();
    assert_eq!(o["message"]["content"], want.as_str());
    assert_eq!(o["done"], true);
    assert_eq!(o["prompt_eval_count"], prompt_tokens);
    for key in ["total_duration", "prompt_eval_duration", "eval_count"] {
        assert!(o[key].as_u64().unwrap() > 0, "{key}: {o}");
    }

    // Streamed.
    let s = post(
        addr,
        "/v1/responses",
        &with(responses_body(), json!({"stream": true})),
    );
    let events = named_events(&s.body);
    assert_eq!(events.first().unwrap().0, "response.created");
    // Cut at max_output_tokens: incomplete, said in the response's status (the last event
    // is `response.completed` all the same: the SDK accumulates only that one).
    assert_eq!(events.last().unwrap().0, "response.completed");
    assert_eq!(events.last().unwrap().1["response"]["status"], "incomplete");
    assert_eq!(r["status"], "incomplete");
    assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(&data["type"], name);
        assert_eq!(data["sequence_number"], i as u64);
    }
    let deltas: String = (events.iter())
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, want);
    assert_eq!(responses_text(&events.last().unwrap().1["response"]), want);

    let s = post(
        addr,
        "/v1/messages",
        &with(messages_body(), json!({"stream": true})),
    );
    let events = named_events(&s.body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[0], "message_start");
    assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"]);
    assert!(names.contains(&"content_block_start") && names.contains(&"content_block_stop"));
    let deltas: String = (events.iter())
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, want);

    let s = post(
        addr,
        "/api/chat",
        &with(ollama_body(), json!({"stream": true})),
    );
    assert_eq!(s.header("content-type"), Some("application/x-ndjson"));
    let lines: Vec<Value> = (String::from_utf8_lossy(&s.body).lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let text: String = lines
        .iter()
        .map(|l| l["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, want);
    let last = lines.last().unwrap();
    assert_eq!(last["done"], true);
    assert!(last["eval_count"].as_u64().unwrap() > 0);
    assert!(lines[..lines.len() - 1].iter().all(|l| l["done"] == false));

    // A stop sequence from the reply ends it there, and Anthropic names it.
    let word = want.split_whitespace().nth(1).unwrap_or(&want).to_string();
    let stopped = post(
        addr,
        "/v1/messages",
        &with(messages_body(), json!({"stop_sequences": ["zzz", word]})),
    )
    .json();
    assert_eq!(stopped["stop_reason"], "stop_sequence", "{stopped}");
    assert_eq!(stopped["stop_sequence"], word.as_str(), "{stopped}");
    let before = &want[..want.find(&word).unwrap()];
    assert_eq!(stopped["content"][0]["text"], before, "{stopped}");

    // /api/generate renders its prompt with the template as a user message.
    let g = json!({"model": MODEL, "system": SYSTEM, "prompt": USER, "stream": false,
                   "options": {"num_predict": 8, "temperature": 0}});
    assert_eq!(
        post(addr, "/api/generate", &g).json()["response"],
        want.as_str()
    );

    for (protocol, endpoint) in [
        ("openai", "/v1/responses"),
        ("anthropic", "/v1/messages"),
        ("anthropic", "/v1/messages/count_tokens"),
        ("ollama", "/api/chat"),
        ("ollama", "/api/generate"),
    ] {
        let series = format!(
            "oxgen_requests_total{{protocol=\"{protocol}\",endpoint=\"{endpoint}\",status=\"200\"}}"
        );
        assert!(metric(addr, &series) >= 1.0, "{series}");
    }
    server.shutdown().unwrap();
}

/// A stored response is fetched by id and continued with `previous_response_id` (its
/// conversation and reply become the prompt's prefix, instructions not carried over); one
/// not stored, deleted or evicted is a 404 naming the id.
#[test]
fn responses_are_stored_continued_and_evicted() {
    let dir = fixture();
    let mut cfg = config();
    cfg.responses_store = 2;
    cfg.max_body = 1 << 16;
    let server = start(dir.path(), 1, cfg);
    let addr = server.addr();
    let first = post(addr, "/v1/responses", &responses_body()).json();
    let id = first["id"].as_str().unwrap();
    let fetched = get(addr, &format!("/v1/responses/{id}")).json();
    assert_eq!(fetched, first);

    let next = json!({"model": MODEL, "input": "and then?", "previous_response_id": id,
                      "max_output_tokens": 4, "temperature": 0});
    let second = post(addr, "/v1/responses", &next);
    assert_eq!(second.status, 200, "{}", second.json());
    let second = second.json();
    assert_eq!(second["previous_response_id"], id);
    // The same conversation sent whole through chat completions.
    let reply = responses_text(&first);
    let whole = json!({"model": MODEL, "max_tokens": 4, "temperature": 0, "messages": [
        {"role": "user", "content": USER}, {"role": "assistant", "content": reply},
        {"role": "user", "content": "and then?"}]});
    let whole = post(addr, "/v1/chat/completions", &whole).json();
    assert_eq!(
        second["usage"]["input_tokens"],
        whole["usage"]["prompt_tokens"]
    );
    assert_eq!(
        responses_text(&second),
        whole["choices"][0]["message"]["content"].as_str().unwrap()
    );

    // Not stored.
    let unstored = post(
        addr,
        "/v1/responses",
        &with(responses_body(), json!({"store": false})),
    )
    .json();
    let missing = get(
        addr,
        &format!("/v1/responses/{}", unstored["id"].as_str().unwrap()),
    );
    assert_eq!(missing.status, 404);
    assert!(
        missing.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("store: false")
    );
    // A third stored response evicts the first of a store of two.
    post(addr, "/v1/responses", &responses_body());
    let evicted = post(addr, "/v1/responses", &with(next.clone(), json!({})));
    assert_eq!(evicted.status, 404, "{}", evicted.json());
    let e = evicted.json();
    assert_eq!(e["error"]["param"], "previous_response_id");
    assert!(e["error"]["message"].as_str().unwrap().contains(id));
    // Deleted.
    let second_id = second["id"].as_str().unwrap();
    let path = format!("/v1/responses/{second_id}");
    let deleted = request(addr, "DELETE", &path, &[], b"").json();
    assert_eq!(deleted["deleted"], true);
    assert_eq!(get(addr, &path).status, 404);
    server.shutdown().unwrap();
}

/// Bad requests get each protocol's error shape and status: OpenAI's envelope on
/// Responses, Anthropic's `{"type": "error", ...}` (an API key by `x-api-key` too), Ollama's
/// `{"error": "..."}`; none takes the server down.
#[test]
fn each_protocol_answers_errors_in_its_own_shape() {
    let dir = fixture();
    let mut cfg = config();
    cfg.api_key = Some("sekrit".into());
    let server = start(dir.path(), 1, cfg);
    let addr = server.addr();
    let key = [("authorization", "Bearer sekrit")];
    let call =
        |path: &str, body: &Value| request(addr, "POST", path, &key, body.to_string().as_bytes());

    // Anthropic: the key by x-api-key; missing, a 401 in its envelope.
    let ok = request(
        addr,
        "POST",
        "/v1/messages",
        &[("x-api-key", "sekrit")],
        messages_body().to_string().as_bytes(),
    );
    assert_eq!(ok.status, 200);
    let denied = post(addr, "/v1/messages", &messages_body());
    assert_eq!(denied.status, 401);
    assert_eq!(denied.json()["type"], "error");
    assert_eq!(denied.json()["error"]["type"], "authentication_error");
    let denied = post(addr, "/api/chat", &ollama_body());
    assert_eq!(denied.status, 401);
    assert!(denied.json()["error"].as_str().unwrap().contains("API key"));

    for (path, body, status, fragment) in [
        (
            "/v1/messages",
            with(messages_body(), json!({"max_tokens": null})),
            400,
            "max_tokens is required",
        ),
        (
            "/v1/messages",
            with(messages_body(), json!({"model": "claude-x"})),
            404,
            "claude-x",
        ),
        (
            "/v1/messages",
            with(
                messages_body(),
                json!({"tools": [{"type": "bash_20250124", "name": "bash"}]}),
            ),
            400,
            "tools[0]",
        ),
        (
            "/v1/messages",
            with(
                messages_body(),
                json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
            ),
            400,
            "image",
        ),
        (
            "/v1/messages",
            with(
                messages_body(),
                json!({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [{"name": "f", "input_schema": {"type": "object"}}]}),
            ),
            400,
            "nope",
        ),
    ] {
        let r = call(path, &body);
        assert_eq!(r.status, status, "{body}: {}", r.json());
        let e = r.json();
        assert_eq!(e["type"], "error", "{e}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(message.contains(fragment), "{fragment} not in {message}");
    }
    for (body, status, fragment) in [
        (
            with(ollama_body(), json!({"options": {"temperature": "hot"}})),
            400,
            "options.temperature",
        ),
        (
            with(ollama_body(), json!({"options": {"num_predict": 0}})),
            400,
            "options.num_predict",
        ),
        (
            with(ollama_body(), json!({"options": {"num_ctx": 4}})),
            400,
            "options.num_ctx",
        ),
        (
            with(ollama_body(), json!({"model": "llama3:latest"})),
            404,
            "llama3",
        ),
        (with(ollama_body(), json!({"format": 7})), 400, "format"),
    ] {
        let r = call("/api/chat", &body);
        assert_eq!(r.status, status, "{body}: {}", r.json());
        let message = r.json()["error"].as_str().unwrap().to_string();
        assert!(message.contains(fragment), "{fragment} not in {message}");
    }
    for (body, param) in [
        (
            with(responses_body(), json!({"tools": [{"type": "web_search"}]})),
            "tools[0].type",
        ),
        (
            with(
                responses_body(),
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            ),
            "input[0].content[0]",
        ),
        (
            with(
                responses_body(),
                json!({"text": {"format": {"type": "json_schema"}}}),
            ),
            "text.format.schema",
        ),
        (
            with(responses_body(), json!({"background": true})),
            "background",
        ),
        (
            with(responses_body(), json!({"max_output_tokens": 0})),
            "max_output_tokens",
        ),
    ] {
        let r = call("/v1/responses", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.json());
        assert_eq!(r.json()["error"]["param"], param, "{}", r.json());
    }
    assert_eq!(call("/v1/responses", &responses_body()).status, 200);
    server.shutdown().unwrap();
}

/// A client that leaves mid-stream, on any protocol, cancels its request and frees its KV:
/// the same greedy conversation runs to its limit whole (it meets no end of sequence), and
/// streamed and dropped after its first event it generates far fewer.
#[test]
fn leaving_mid_stream_frees_the_kv_on_every_protocol() {
    const LONG: usize = 2000;
    let dir = tempfile::tempdir().unwrap();
    let package = FixtureConfig {
        context: 4096,
        ..FixtureConfig::default()
    };
    write_package(dir.path(), &package).unwrap();
    let mut cfg = config();
    cfg.max_tokens_limit = LONG;
    let server = start(dir.path(), 1, cfg);
    let addr = server.addr();
    let whole = post(
        addr,
        "/v1/chat/completions",
        &with(chat_body(), json!({"max_tokens": LONG})),
    );
    assert_eq!(
        whole.json()["usage"]["completion_tokens"],
        LONG,
        "the greedy reply runs to its limit"
    );
    let mut ollama = with(ollama_body(), json!({"stream": true}));
    ollama["options"]["num_predict"] = json!(LONG);
    for (path, body) in [
        (
            "/v1/responses",
            with(
                responses_body(),
                json!({"stream": true, "max_output_tokens": LONG}),
            ),
        ),
        (
            "/v1/messages",
            with(messages_body(), json!({"stream": true, "max_tokens": LONG})),
        ),
        ("/api/chat", ollama),
    ] {
        let before = metric(addr, "oxgen_generation_tokens_total");
        let mut conn = open(addr, "POST", path, &[], body.to_string().as_bytes());
        assert_eq!(conn.status, 200, "{path}");
        assert!(conn.next_line().is_some(), "{path}");
        drop(conn);
        wait_idle(addr);
        let generated = metric(addr, "oxgen_generation_tokens_total") - before;
        assert!(
            generated < LONG as f64 / 2.0,
            "{path}: {generated} tokens after the client left"
        );
    }
    server.shutdown().unwrap();
}

/// Each protocol's committed fuzz seed parses on its endpoint; every prefix of every seed,
/// on every endpoint, is an error or a request, never a panic.
#[test]
fn every_endpoint_parses_its_seed_and_refuses_broken_bodies() {
    let seeds = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/seeds/request_json");
    let mut bodies = Vec::new();
    for (seed, endpoint) in [
        ("chat.json", "/v1/chat/completions"),
        ("completion.json", "/v1/completions"),
        ("responses.json", "/v1/responses"),
        ("messages.json", "/v1/messages"),
        ("ollama_chat.json", "/api/chat"),
        ("ollama_generate.json", "/api/generate"),
    ] {
        let body = std::fs::read(format!("{seeds}/{seed}")).unwrap();
        if let Err(e) = oxgen_server::validate_request(endpoint, &body) {
            panic!("{seed} on {endpoint}: {e:?}");
        }
        bodies.push(body);
    }
    for body in &bodies {
        for end in 0..body.len() {
            for endpoint in oxgen_server::REQUEST_ENDPOINTS {
                let _ = oxgen_server::validate_request(endpoint, &body[..end]);
            }
        }
    }
}
