//! Structured output that always parses, on the fixture package (random weights: left to
//! itself it runs on in strings and invents properties): a JSON schema reply is closed
//! before `max_tokens` cuts it and says `length` when the limit closed it; strict schemas
//! and tool parameters get their objects closed; `close_structured_output: false` and
//! `close_objects: false` turn each off.

mod common;

use common::fixture::{MODEL, config};
use common::{post, start};
use oxgen_testkit::fixtures::{FixtureConfig, write_package};
use serde_json::{Value, json};

const CHAT: &str = "/v1/chat/completions";

/// An object schema that says nothing of `additionalProperties`, with unbounded strings.
fn open_schema() -> Value {
    json!({"type": "object",
           "properties": {"title": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
           "required": ["title"]})
}

fn ask(extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "max_tokens": 24, "temperature": 1, "seed": 0,
                          "messages": [{"role": "user", "content": "the cat and the dog"}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn schema_format(schema: Value, strict: bool) -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": strict}})
}

#[test]
fn constrained_replies_parse_at_any_limit_and_objects_close_where_asked() {
    // Context for the tools' description in the prompt.
    let dir = tempfile::tempdir().unwrap();
    let package = FixtureConfig {
        context: 1024,
        ..FixtureConfig::default()
    };
    write_package(dir.path(), &package).unwrap();
    let server = start(dir.path(), 1, config());
    let addr = server.addr();
    let (mut closed_by_limit, mut cut_when_off) = (0, 0);
    for seed in 0..6 {
        for max_tokens in [12, 24, 40] {
            let body = ask(json!({"seed": seed, "max_tokens": max_tokens,
                                  "response_format": schema_format(open_schema(), false)}));
            let r = post(addr, CHAT, &body).json();
            let choice = &r["choices"][0];
            let text = choice["message"]["content"].as_str().unwrap();
            let v: Value = serde_json::from_str(text)
                .unwrap_or_else(|e| panic!("seed {seed}, max_tokens {max_tokens}: {e}: {text:?}"));
            assert!(v["title"].is_string(), "{v}");
            closed_by_limit += (choice["finish_reason"] == "length") as usize;
        }
        let mut off = ask(json!({"seed": seed, "close_structured_output": false,
                                 "response_format": schema_format(open_schema(), false)}));
        off["max_tokens"] = json!(12);
        let r = post(addr, CHAT, &off).json();
        let text = r["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
        cut_when_off += serde_json::from_str::<Value>(&text).is_err() as usize;
    }
    assert!(
        closed_by_limit >= 6,
        "{closed_by_limit} replies closed by the limit"
    );
    assert!(
        cut_when_off >= 3,
        "{cut_when_off} of 6 cut with closing off"
    );

    // A grammar whose end the closing search cannot reach (400 bytes away, past its bound) is
    // not closed early, and the response says so; a JSON schema's is.
    let regex = json!({"structured_outputs": {"regex": "(ab){200}"}});
    let r = post(addr, CHAT, &ask(regex));
    assert!(
        r.header("x-oxgen-constraint-unclosable").is_some(),
        "{:?}",
        r.headers
    );
    let json = ask(json!({"response_format": schema_format(open_schema(), false)}));
    assert_eq!(
        post(addr, CHAT, &json).header("x-oxgen-constraint-unclosable"),
        None
    );

    // Strict: only the declared properties, whatever the model would invent.
    for seed in 0..6 {
        let body = ask(json!({"seed": seed, "max_tokens": 48,
                              "response_format": schema_format(open_schema(), true)}));
        let r = post(addr, CHAT, &body).json();
        let v: Value =
            serde_json::from_str(r["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
        assert!(
            v.as_object()
                .unwrap()
                .keys()
                .all(|k| k == "title" || k == "tags"),
            "{v}"
        );
    }

    // A required call whose parameters say nothing of additionalProperties: its arguments
    // parse and hold only the declared property, at a limit that fits the call.
    let tools =
        json!([{"type": "function", "function": {"name": "f", "parameters": open_schema()}}]);
    for seed in 0..6 {
        let body =
            ask(json!({"seed": seed, "max_tokens": 64, "tools": tools, "tool_choice": "required"}));
        let r = post(addr, CHAT, &body).json();
        let call = &r["choices"][0]["message"]["tool_calls"][0]["function"];
        let args = call["arguments"]
            .as_str()
            .unwrap_or_else(|| panic!("seed {seed}: {r}"));
        let args: Value =
            serde_json::from_str(args).unwrap_or_else(|e| panic!("seed {seed}: {e}: {r}"));
        assert!(
            args.as_object()
                .unwrap()
                .keys()
                .all(|k| k == "title" || k == "tags"),
            "{args}"
        );
    }
    server.shutdown().unwrap();
}

/// On the default model, a required call whose parameters are open (as LangChain's
/// `bind_tools` sends them) gives arguments that parse and validate at every `max_tokens`
/// from the first that holds the call's shortest form, whole and streamed.
#[test]
fn a_required_call_parses_at_every_limit_that_fits_it_on_the_default_model() {
    let server = start(&common::default_model(), 2, oxgen_server::Config::new("m"));
    let addr = server.addr();
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"]}}}]);
    let call = |max_tokens: usize, stream: bool| {
        let body = json!({"model": "m", "max_tokens": max_tokens, "temperature": 0,
            "stream": stream, "tools": tools, "tool_choice": "required",
            "messages": [{"role": "user", "content": "What is the weather like in Paris today?"}]});
        let reply = post(addr, CHAT, &body);
        if !stream {
            let r = reply.json();
            let f = &r["choices"][0]["message"]["tool_calls"][0]["function"];
            return f["arguments"].as_str().map(str::to_string);
        }
        let mut arguments = String::new();
        for event in reply.events().iter().filter(|e| *e != "[DONE]") {
            let chunk: Value = serde_json::from_str(event).unwrap();
            let call = &chunk["choices"][0]["delta"]["tool_calls"][0];
            if call["index"] == 0 {
                arguments.push_str(call["function"]["arguments"].as_str().unwrap_or_default());
            }
        }
        Some(arguments)
    };
    let parses = |args: &Option<String>| {
        (args.as_deref())
            .and_then(|a| serde_json::from_str::<Value>(a).ok())
            .is_some_and(|v| {
                v["city"].is_string()
                    && (v["unit"] == "celsius" || v["unit"] == "fahrenheit")
                    && v.as_object().unwrap().len() == 2
            })
    };
    let least = (8..=64)
        .find(|&m| parses(&call(m, false)))
        .expect("a call fits in 64 tokens");
    for m in (least..least + 24).step_by(3).chain([least + 40, 128]) {
        let args = call(m, false);
        assert!(parses(&args), "max_tokens {m} (least {least}): {args:?}");
        assert_eq!(call(m, true), args, "max_tokens {m}: streamed");
    }
    server.shutdown().unwrap();
}
