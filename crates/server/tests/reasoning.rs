//! Reasoning on the default model served with a template whose generation prompt opens
//! `<think>` (as thinking templates do): the reply comes back as `reasoning_content`, whole
//! or streamed as its own deltas, and both say the same thing; usage counts its tokens; a
//! `thinking_token_budget` closes the block where it runs out, and the answer follows; the
//! Responses, Anthropic and Ollama endpoints return the same reasoning in their shapes.

mod common;

use std::path::PathBuf;

use common::{default_model, open, post, start_with};
use oxgen::ModelOptions;
use oxgen_server::Config;
use serde_json::{Value, json};

#[test]
fn a_thinking_template_returns_reasoning_content_whole_and_streamed() {
    let template =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../generate/tests/templates/think.jinja");
    let options = ModelOptions {
        threads: 2,
        chat_template: Some(template),
        ..ModelOptions::default()
    };
    let server = start_with(&default_model(), options, Config::new("m"));
    let addr = server.addr();
    let body = |stream: bool| {
        json!({
            "model": "m",
            "messages": [{"role": "user", "content": "Is 17 a prime number?"}],
            "max_tokens": 24, "temperature": 0, "stream": stream,
        })
    };
    let whole = post(addr, "/v1/chat/completions", &body(false)).json();
    let message = &whole["choices"][0]["message"];
    let reasoning = message["reasoning_content"]
        .as_str()
        .expect("reasoning_content");
    assert!(!reasoning.is_empty(), "{whole}");
    // The model never closed the block within 24 tokens: all of it is reasoning.
    assert_eq!(whole["choices"][0]["finish_reason"], "length", "{whole}");
    assert_eq!(message["content"], "", "{whole}");
    let details = &whole["usage"]["completion_tokens_details"];
    assert_eq!(details["reasoning_tokens"], 24, "{whole}");

    // A budget of 6: the block is closed after the reasoning's first 6 tokens (the same as
    // unbounded: greedy), and the rest of the reply is the answer (EOS masked, so there is
    // one: this small model ends its reply as soon as the block closes).
    let mut bounded = body(false);
    bounded["thinking_token_budget"] = json!(6);
    bounded["ignore_eos"] = json!(true);
    let cut = post(addr, "/v1/chat/completions", &bounded).json();
    let m = &cut["choices"][0]["message"];
    let thought = m["reasoning_content"].as_str().expect("reasoning_content");
    assert!(
        reasoning.starts_with(thought.trim_end()),
        "{thought:?} / {reasoning:?}"
    );
    assert!(thought.len() < reasoning.len(), "{cut}");
    assert!(!m["content"].as_str().unwrap().is_empty(), "{cut}");
    let spent = cut["usage"]["completion_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap();
    // The closing marker's tokens count as reasoning too.
    assert!((6..=10).contains(&spent), "{cut}");

    let streamed = open(
        addr,
        "POST",
        "/v1/chat/completions",
        &[],
        body(true).to_string().as_bytes(),
    )
    .finish()
    .events();
    let deltas: Vec<Value> = (streamed.iter())
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["delta"].clone())
        .collect();
    let joined: String = (deltas.iter())
        .filter_map(|d| d["reasoning_content"].as_str())
        .collect();
    assert_eq!(joined, reasoning);
    let content: String = deltas
        .iter()
        .filter_map(|d| d["content"].as_str())
        .collect();
    assert_eq!(content, "", "only the role chunk's empty content");

    // The same reasoning in each other protocol's shape: a Responses `reasoning` item (its
    // tokens counted), an Anthropic `thinking` block (streamed as thinking deltas), Ollama's
    // `thinking`.
    let question = "Is 17 a prime number?";
    let r = json!({"model": "m", "input": question, "max_output_tokens": 24, "temperature": 0});
    let r = post(addr, "/v1/responses", &r).json();
    assert_eq!(r["output"][0]["type"], "reasoning", "{r}");
    assert_eq!(r["output"][0]["content"][0]["text"], reasoning, "{r}");
    assert_eq!(
        r["usage"]["output_tokens_details"]["reasoning_tokens"], 24,
        "{r}"
    );
    let m = |stream: bool| {
        json!({"model": "m", "max_tokens": 24, "temperature": 0, "stream": stream,
               "messages": [{"role": "user", "content": question}]})
    };
    let whole = post(addr, "/v1/messages", &m(false)).json();
    assert_eq!(whole["content"][0]["type"], "thinking", "{whole}");
    assert_eq!(whole["content"][0]["thinking"], reasoning, "{whole}");
    assert_eq!(whole["stop_reason"], "max_tokens");
    let streamed = post(addr, "/v1/messages", &m(true)).events();
    let thinking: String = (streamed.iter())
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter(|e| e["delta"]["type"] == "thinking_delta")
        .map(|e| e["delta"]["thinking"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(thinking, reasoning);
    let o = json!({"model": "m", "stream": false, "options": {"num_predict": 24, "temperature": 0},
                   "messages": [{"role": "user", "content": question}]});
    let o = post(addr, "/api/chat", &o).json();
    assert_eq!(o["message"]["thinking"], reasoning, "{o}");
    assert_eq!(o["message"]["content"], "", "{o}");
    server.shutdown().unwrap();
}
