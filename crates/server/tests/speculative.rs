//! Speculative decoding in the server, inside continuous batching: concurrent requests
//! (greedy, seeded sampling, streamed or not, `n` > 1) get the same text from a server that
//! speculates as from one that does not, and `/metrics` counts the proposals.

mod common;

use common::fixture::{MODEL, config, fixture};
use common::{metric, post, start_with};
use oxgen::{KvBudget, ModelOptions, PromptLookup, Speculative};
use serde_json::{Value, json};

fn options(speculative: Option<Speculative>) -> ModelOptions {
    ModelOptions {
        threads: 1,
        memory: oxgen::MemoryOptions {
            kv: KvBudget::Sequences(8),
            prefix_cache: true,
            ..Default::default()
        },
        speculative,
        ..ModelOptions::default()
    }
}

/// Each body's choices' texts, requested concurrently.
fn texts(addr: std::net::SocketAddr, bodies: &[Value]) -> Vec<Vec<String>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (bodies.iter())
            .map(|body| s.spawn(move || post(addr, "/v1/completions", body)))
            .collect();
        (handles.into_iter().zip(bodies))
            .map(|(h, body)| {
                let reply = h.join().unwrap();
                if body["stream"] == true {
                    let mut text = String::new();
                    for e in reply.events().iter().filter(|e| *e != "[DONE]") {
                        let v: Value = serde_json::from_str(e).unwrap();
                        text.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
                    }
                    return vec![text];
                }
                let v = reply.json();
                (v["choices"].as_array().unwrap_or_else(|| panic!("{v}")))
                    .iter()
                    .map(|c| c["text"].as_str().unwrap().to_string())
                    .collect()
            })
            .collect()
    })
}

#[test]
fn a_speculating_server_serves_the_same_text_and_counts_its_proposals() {
    let dir = fixture();
    // Repetitive prompts, so prompt lookup finds n-grams to propose.
    let body = |prompt: &str, extra: Value| {
        let mut b = json!({"model": MODEL, "prompt": prompt, "max_tokens": 24,
                           "temperature": 0, "ignore_eos": true});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    let bodies = vec![
        body(
            "the cat and the dog and the cat and the dog and the",
            json!({}),
        ),
        body("a b c a b c a b c a b", json!({"stream": true})),
        body(
            "one two one two one two",
            json!({"temperature": 0.8, "seed": 5, "n": 2}),
        ),
        body("hello hello hello", json!({"max_tokens": 7})),
    ];
    let plain = start_with(dir.path(), options(None), config());
    let want = texts(plain.addr(), &bodies);
    drop(plain);
    let lookup = Speculative::PromptLookup(PromptLookup { min_n: 1, max_n: 3 });
    let draft = Speculative::Draft(dir.path().to_path_buf());
    for mode in [lookup, draft] {
        let server = start_with(dir.path(), options(Some(mode.clone())), config());
        let got = texts(server.addr(), &bodies);
        assert_eq!(got, want, "{mode}");
        let addr = server.addr();
        let proposed = metric(addr, "oxgen_spec_proposed_tokens_total");
        let accepted = metric(addr, "oxgen_spec_accepted_tokens_total");
        assert!(
            proposed > 0.0 && accepted > 0.0,
            "{mode}: {accepted} of {proposed}"
        );
        assert!(accepted <= proposed);
        let rate = metric(addr, "oxgen_spec_accept_rate");
        assert!((rate - accepted / proposed).abs() < 1e-9);
        // Usage counts every token, however many a step gave.
        let reply = post(addr, "/v1/completions", &bodies[0]).json();
        assert_eq!(reply["usage"]["completion_tokens"], 24, "{reply}");
    }
}
