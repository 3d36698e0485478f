//! Tool calls through each family's template on a random-weight fixture model whose
//! tokenizer has the families' markers as special tokens (Phi-4-mini's `<|tool_call|>`,
//! Mistral's `[TOOL_CALLS]`, gpt-oss's harmony tokens): a required or named call is enforced
//! by the grammar (markers by token id), comes back through the special tokens the text
//! keeps, parses and validates, streamed or not; a second turn renders the call and its
//! result.

mod common;

use std::path::{Path, PathBuf};

use common::{open, post, start_with};
use oxgen::ModelOptions;
use oxgen_server::Config;
use oxgen_testkit::fixtures::{FixtureConfig, tokenizer, write_package};
use serde_json::{Value, json};

fn template(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../generate/tests/templates/{name}"))
}

/// A family's own template, as committed for the template test.
fn family_template(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!(
        "../testkit/thirdparty/chat_templates/templates/{name}"
    ))
}

fn package(dir: &Path) {
    let cfg = FixtureConfig {
        context: 4096,
        ..FixtureConfig::default()
    };
    write_package(dir, &cfg).unwrap();
    std::fs::write(
        dir.join("tokenizer.json"),
        tokenizer::json_with_tool_markers(),
    )
    .unwrap();
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8},
                           "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "add", "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                           "b": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["a", "b"], "additionalProperties": false}}},
    ])
}

/// The arguments follow the tool's schema.
fn check(name: &str, arguments: &str) {
    let v: Value = serde_json::from_str(arguments)
        .unwrap_or_else(|e| panic!("{name} arguments {arguments:?}: {e}"));
    let o = v.as_object().unwrap();
    match name {
        "get_weather" => {
            assert_eq!(o.len(), 2, "{v}");
            assert!(o["city"].as_str().unwrap().chars().count() <= 8, "{v}");
            assert!(o["unit"] == "c" || o["unit"] == "f", "{v}");
        }
        "add" => {
            assert_eq!(o.len(), 2, "{v}");
            for k in ["a", "b"] {
                assert!((0..=9).contains(&o[k].as_i64().unwrap()), "{v}");
            }
        }
        other => panic!("no tool {other}"),
    }
}

fn request(choice: Value, stream: bool) -> Value {
    // "/no_think": a template that thinks first (Nemotron's) then closes its thought block in
    // the prompt, where a random-weight model would think until max_tokens.
    json!({
        "model": "m",
        "messages": [{"role": "system", "content": "Use the tools. /no_think"},
                     {"role": "user", "content": "Add 2 and 3."}],
        "tools": tools(), "tool_choice": choice, "parallel_tool_calls": false,
        "temperature": 0, "max_tokens": 300, "stream": stream,
    })
}

/// (name, arguments, finish reason) of a streamed reply, from its deltas.
fn streamed(addr: std::net::SocketAddr, body: &Value) -> (String, String, String) {
    let events = open(
        addr,
        "POST",
        "/v1/chat/completions",
        &[],
        body.to_string().as_bytes(),
    )
    .finish()
    .events();
    let (mut name, mut arguments, mut finish) = (String::new(), String::new(), String::new());
    let mut first = true;
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        let choice = &v["choices"][0];
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.into();
        }
        for call in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            assert_eq!(call["index"], 0);
            if first {
                assert!(
                    call["id"].is_string() && call["function"]["name"].is_string(),
                    "{call}"
                );
                first = false;
            } else {
                assert!(call.get("id").is_none(), "the id only comes first: {call}");
            }
            name += call["function"]["name"].as_str().unwrap_or_default();
            arguments += call["function"]["arguments"].as_str().unwrap_or_default();
        }
    }
    (name, arguments, finish)
}

fn family(template_file: PathBuf, format: &str) {
    let dir = tempfile::tempdir().unwrap();
    package(dir.path());
    let options = ModelOptions {
        threads: 2,
        chat_template: Some(template_file),
        ..ModelOptions::default()
    };
    let server = start_with(dir.path(), options, Config::new("m"));
    let addr = server.addr();
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "add"}}),
    ] {
        let r = post(
            addr,
            "/v1/chat/completions",
            &request(choice.clone(), false),
        );
        assert_eq!(
            r.status,
            200,
            "{format}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let v = r.json();
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{format} {choice}: {v}");
        let calls = c["message"]["tool_calls"].as_array().expect("tool_calls");
        assert_eq!(calls.len(), 1, "{format}: {v}");
        let name = calls[0]["function"]["name"].as_str().unwrap();
        let arguments = calls[0]["function"]["arguments"].as_str().unwrap();
        check(name, arguments);
        if choice != "required" {
            assert_eq!(name, "add");
        }
        let content = c["message"]["content"].as_str().unwrap_or_default();
        assert!(
            !content.contains("<|") && !content.contains("[TOOL"),
            "{format}: markers in {content:?}"
        );
        let (s_name, s_arguments, finish) = streamed(addr, &request(choice.clone(), true));
        assert_eq!(
            (s_name.as_str(), s_arguments.as_str(), finish.as_str()),
            (name, arguments, "tool_calls"),
            "{format}"
        );

        // The call and its result go back through the template.
        let mut turn = request(json!("none"), false);
        turn["max_tokens"] = json!(4);
        let messages = turn["messages"].as_array_mut().unwrap();
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
        messages.push(json!({"role": "tool", "tool_call_id": calls[0]["id"], "content": "5"}));
        let r = post(addr, "/v1/chat/completions", &turn);
        assert_eq!(
            r.status,
            200,
            "{format}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    server.shutdown().unwrap();
}

#[test]
fn phi4_mini_calls_come_between_special_tokens() {
    family(template("phi4-mini.jinja"), "phi4-mini");
}

/// Nemotron Nano 2's own template: calls between `<TOOLCALL>` and `</TOOLCALL>`.
#[test]
fn nemotron_calls_come_between_toolcall_tags() {
    family(family_template("nemotron-nano2.jinja"), "nemotron");
}

#[test]
fn mistral_calls_follow_the_tool_calls_token() {
    family(template("mistral.jinja"), "mistral");
}

#[test]
fn harmony_calls_come_on_the_commentary_channel() {
    family(template("harmony.jinja"), "harmony");
}

#[test]
fn hermes_calls_come_in_tool_call_blocks() {
    family(template("hermes.jinja"), "hermes");
}
