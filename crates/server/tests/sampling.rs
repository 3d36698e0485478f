//! Sampling fields and log-probabilities over HTTP on the fixture package: completions by
//! text or ids with their logprobs, logprobs against an independent computation, and the
//! effect of `max_completion_tokens`, penalties, `min_p` and `logit_bias`.

mod common;

use common::fixture::{MODEL, chat, config, fixture};
use common::{post, start};
use serde_json::{Value, json};

/// Log-probabilities against an independent computation: the model's raw logits for the same
/// ids (`Model::logits`, no sampling code involved), log-softmaxed here in f64. Also
/// `max_completion_tokens` (the newer name of `max_tokens`), the penalties, `min_p` and
/// `logit_bias`.
#[test]
fn logprobs_are_the_log_softmax_of_the_models_logits() {
    let dir = fixture();
    let server = start(dir.path(), 1, config());
    let addr = server.addr();
    let prompt: Vec<u32> = vec![0, 75, 104, 263, 290];
    let reply = post(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": prompt, "max_tokens": 5, "temperature": 0,
                "ignore_eos": true, "logprobs": 1}),
    )
    .json();
    let served: Vec<f64> = reply["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(served.len(), 5);

    let mut model = common::fixture::model(dir.path());
    let mut ids = prompt.clone();
    for (step, &got) in served.iter().enumerate() {
        let (logits, vocab) = model.logits(&ids).unwrap();
        let last = &logits[logits.len() - vocab..];
        let best = (0..vocab).fold(0, |b, i| if last[i] > last[b] { i } else { b });
        let want = oxgen_testkit::log_softmax(last)[best];
        assert!(
            (got - want).abs() < 1e-4,
            "step {step}: served {got}, log-softmax {want}"
        );
        ids.push(best as u32);
    }

    let short = post(
        addr,
        "/v1/chat/completions",
        &chat(json!({"max_tokens": null, "max_completion_tokens": 3})),
    )
    .json();
    assert_eq!(short["usage"]["completion_tokens"], 3, "{short}");

    // Penalties and min_p have their effect over HTTP. This random model repeats tokens under
    // greedy decoding; a frequency or presence penalty breaks the repeats. Sampling with
    // min_p 1 keeps only the most likely token: greedy again, whatever the seed.
    let text = |extra: Value| {
        let r = post(addr, "/v1/chat/completions", &chat(extra)).json();
        r["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"))
            .to_string()
    };
    let greedy = text(json!({}));
    for penalty in ["frequency_penalty", "presence_penalty"] {
        assert_ne!(
            text(json!({penalty: 2.0})),
            greedy,
            "{penalty} changed nothing"
        );
    }
    let sampled = json!({"temperature": 1.0, "seed": 5});
    assert_ne!(
        text(sampled.clone()),
        greedy,
        "seed 5 happens to sample the greedy text"
    );
    let mut pinned = sampled;
    pinned["min_p"] = json!(1.0);
    assert_eq!(text(pinned), greedy);
    // logit_bias: +100 on one token makes it the greedy choice every step.
    let forced = post(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0,
                "ignore_eos": true, "logit_bias": {"75": 100}}),
    )
    .json();
    let want = post(addr, "/detokenize", &json!({"tokens": [75, 75, 75, 75]})).json();
    assert_eq!(forced["choices"][0]["text"], want["prompt"], "{forced}");
    server.shutdown().unwrap();
}

#[test]
fn completions_take_text_or_ids_and_report_logprobs() {
    let dir = fixture();
    let server = start(dir.path(), 1, config());
    let addr = server.addr();
    let ids = post(addr, "/tokenize", &json!({"prompt": "the cat and the dog"})).json();
    let tokens = ids["tokens"].clone();
    assert_eq!(ids["count"], tokens.as_array().unwrap().len());
    assert_eq!(ids["max_model_len"], 128);
    let back = post(addr, "/detokenize", &json!({"tokens": tokens})).json();
    assert_eq!(back["prompt"], "the cat and the dog");
    let body = |prompt: Value| {
        json!({"model": MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 0,
               "ignore_eos": true, "logprobs": 3})
    };
    let by_text = post(addr, "/v1/completions", &body(json!("the cat and the dog"))).json();
    let by_ids = post(addr, "/v1/completions", &body(tokens)).json();
    assert_eq!(by_text["object"], "text_completion");
    assert!(by_text["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(by_text["choices"][0]["text"], by_ids["choices"][0]["text"]);
    let lp = &by_text["choices"][0]["logprobs"];
    let token_lps = lp["token_logprobs"].as_array().unwrap();
    assert_eq!(token_lps.len(), 6);
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let values: Vec<f64> = top
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert!(!values.is_empty() && values.len() <= 3);
        // Greedy: the chosen token is the most likely one.
        let best = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        assert!((token_lps[i].as_f64().unwrap() - best).abs() < 1e-6);
        assert!(best <= 0.0);
    }
    let offsets = lp["text_offset"].as_array().unwrap();
    assert_eq!(offsets[0], 0);
    // Chat logprobs: entries sorted, the chosen one first under greedy.
    let chat_lp = post(
        addr,
        "/v1/chat/completions",
        &chat(json!({"logprobs": true, "top_logprobs": 2})),
    )
    .json();
    let content = chat_lp["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    assert_eq!(content.len(), 8);
    for entry in content {
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(entry["token"], top[0]["token"]);
        assert!(top[0]["logprob"].as_f64() >= top[1]["logprob"].as_f64());
        // `token` is the lossy text of `bytes` (which may hold part of a character).
        let bytes: Vec<u8> = serde_json::from_value(entry["bytes"].clone()).unwrap();
        assert_eq!(entry["token"], json!(String::from_utf8_lossy(&bytes)));
    }
    server.shutdown().unwrap();
}
