//! Tool calling: each family's recorded call text parses into the same calls whether it
//! arrives whole or a character at a time; the grammar of `required`, a named function and
//! `auto` makes text (from random logits) that the parser reads back as calls whose
//! arguments follow the tool's schema; templates render tools and the calls of the history.

mod common;

use common::{decode, grammars};
use oxgen_generate::{
    ChatMessage, ChatTemplate, Constraint, FinishReason, Grammars, LogitsProcessor, ProcessorState,
    Reply, ReplyDelta, ReplyParser, ReplySyntax, Tokenizer, Tool, ToolCall, ToolChoice, ToolFormat,
    ToolSet, after_reasoning, tool_grammar,
};
use oxgen_testkit::fixtures::tokenizer;
use serde_json::{Value, json};

fn syntax(format: ToolFormat) -> ReplySyntax {
    ReplySyntax {
        tools: Some(format),
        harmony: format == ToolFormat::Harmony,
        ..ReplySyntax::default()
    }
}

/// The reply and its deltas, with `text` fed in pieces of `step` characters.
fn parse(syntax: ReplySyntax, text: &str, step: usize) -> (Reply, Vec<ReplyDelta>) {
    let mut parser = ReplyParser::new(syntax, 7);
    let mut deltas = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    for piece in chars.chunks(step) {
        parser.push(&piece.iter().collect::<String>(), &mut deltas);
    }
    parser.finish(&mut deltas);
    let mut reply = Reply::default();
    for d in &deltas {
        reply.apply(d);
    }
    (reply, deltas)
}

/// (name, arguments as JSON) of each call.
fn calls(reply: &Reply) -> Vec<(String, Value)> {
    (reply.calls.iter())
        .map(|c| {
            let args = serde_json::from_str(&c.arguments)
                .unwrap_or_else(|e| panic!("arguments {:?} do not parse: {e}", c.arguments));
            (c.name.clone(), args)
        })
        .collect()
}

/// Parses `text` whole and a character at a time; both give the same reply.
fn parse_both(syntax: ReplySyntax, text: &str) -> Reply {
    let (whole, _) = parse(syntax, text, usize::MAX);
    for step in [1, 3] {
        let (pieces, _) = parse(syntax, text, step);
        assert_eq!(
            (&pieces.content, &pieces.reasoning, calls(&pieces)),
            (&whole.content, &whole.reasoning, calls(&whole)),
            "pieces of {step} give another reply for {text:?}"
        );
    }
    whole
}

/// Whether the grammar takes `text` (tokenized as the model would write it) and may end.
fn accepts(tok: &Tokenizer, grammars: &Grammars, c: &Constraint, text: &str) -> bool {
    let mut mask = grammars.compile(c).unwrap().mask();
    for id in tok.encode(text, false).unwrap() {
        mask.accept(id);
        if matches!(mask.state(), ProcessorState::Failed(_)) {
            return false;
        }
    }
    let mut row = vec![0.0f32; tokenizer::VOCAB_SIZE];
    mask.apply(&mut row, &Default::default());
    mask.state() == ProcessorState::Complete || row[tokenizer::EOS] == 0.0
}

fn weather(city: &str) -> (String, Value) {
    ("get_weather".into(), json!({"city": city}))
}

#[test]
fn each_family_format_parses_into_calls() {
    // (format, recorded text, content, calls)
    type Case = (ToolFormat, &'static str, &'static str, Vec<(String, Value)>);
    let cases: &[Case] = &[
        (
            ToolFormat::Hermes,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
            "",
            vec![weather("Paris")],
        ),
        (
            ToolFormat::Hermes,
            "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"arguments\": {\"city\": \"Rome\"}, \"name\": \"get_weather\"}\n</tool_call>",
            "Let me look.",
            vec![weather("Paris"), weather("Rome")],
        ),
        (
            ToolFormat::Llama3,
            "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
            "",
            vec![weather("Paris")],
        ),
        (
            ToolFormat::Llama3,
            "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
            "",
            vec![weather("Paris"), weather("Oslo")],
        ),
        (
            ToolFormat::Mistral,
            "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lima\"}}]",
            "",
            vec![weather("Paris"), weather("Lima")],
        ),
        (
            ToolFormat::Phi4Mini,
            "<|tool_call|>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]<|/tool_call|>",
            "",
            vec![weather("Paris")],
        ),
        (
            ToolFormat::Phi4Mini,
            "functools[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Kyiv\"}}]",
            "",
            vec![weather("Kyiv")],
        ),
        (
            ToolFormat::Nemotron,
            "<TOOLCALL>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]</TOOLCALL>",
            "",
            vec![weather("Paris"), weather("Rome")],
        ),
        (
            ToolFormat::Json,
            " {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
            "",
            vec![weather("Paris")],
        ),
        (
            ToolFormat::Json,
            "The weather is {\"sunny\": true}.",
            "The weather is {\"sunny\": true}.",
            vec![],
        ),
        (
            ToolFormat::Hermes,
            "No call needed: 2 < 3 and <tool is not a marker.",
            "No call needed: 2 < 3 and <tool is not a marker.",
            vec![],
        ),
    ];
    for (format, text, content, expected) in cases {
        let reply = parse_both(syntax(*format), text);
        assert_eq!(calls(&reply), *expected, "{format:?}: {text:?}");
        assert_eq!(reply.content, *content, "{format:?}: {text:?}");
        let ids: std::collections::HashSet<_> = reply.calls.iter().map(|c| &c.id).collect();
        assert_eq!(ids.len(), reply.calls.len(), "ids are distinct");
        if *format == ToolFormat::Mistral {
            assert!(
                reply.calls.iter().all(|c| c.id.len() == 9),
                "Mistral's ids are 9 long"
            );
        }
    }
}

#[test]
fn harmony_channels_split_reasoning_answer_and_calls() {
    let text = "<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";
    let reply = parse_both(syntax(ToolFormat::Harmony), text);
    assert_eq!(reply.reasoning, "The user wants the weather.");
    assert_eq!(reply.content, "");
    assert_eq!(calls(&reply), [weather("Paris")]);

    let answer = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.";
    let reply = parse_both(syntax(ToolFormat::Harmony), answer);
    assert_eq!((&*reply.reasoning, &*reply.content), ("Easy.", "It is 4."));
    assert!(reply.calls.is_empty());
}

#[test]
fn think_blocks_are_reasoning() {
    let qwen3 = ReplySyntax::of_template(
        "{{ '<think>' }}..{{ '</think>' }}",
        "",
        Some(ToolFormat::Hermes),
    );
    assert!(qwen3.think && !qwen3.think_open);
    let text = "<think>\nWeather needs a call.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let reply = parse_both(qwen3, text);
    assert_eq!(reply.reasoning, "\nWeather needs a call.\n");
    assert_eq!(calls(&reply), [weather("Paris")]);
    assert_eq!(reply.content, "");

    // A prompt that opened the block: the reply starts inside it.
    let open = ReplySyntax::of_template("</think>", "<|im_start|>assistant\n<think>\n", None);
    assert!(open.think_open);
    let reply = parse_both(open, "Two plus two.</think>\n\nFour.");
    assert_eq!(
        (&*reply.reasoning, &*reply.content),
        ("Two plus two.", "Four.")
    );
    // No block at all: everything is content.
    let reply = parse_both(qwen3, "Four.");
    assert_eq!((&*reply.reasoning, &*reply.content), ("", "Four."));
    // A prompt that closed the block (thinking off): the reply is all answer, and a
    // constraint binds it from the first token.
    let closed = ReplySyntax::of_template("</think>", "assistant\n<think>\n\n</think>\n\n", None);
    assert!(closed.is_plain());
}

#[test]
fn arguments_stream_as_they_arrive() {
    let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>";
    let (reply, deltas) = parse(syntax(ToolFormat::Hermes), text, 2);
    assert!(
        matches!(&deltas[0], ReplyDelta::CallStart { index: 0, name, .. } if name == "get_weather"),
        "the name comes first: {deltas:?}"
    );
    let fragments = (deltas.iter())
        .filter(|d| matches!(d, ReplyDelta::CallArguments { .. }))
        .count();
    assert!(fragments > 5, "the arguments came in {fragments} pieces");
    assert_eq!(
        reply.calls[0].arguments,
        r#"{"city": "Paris", "days": [1, 2]}"#
    );
    // Cut short: what was read is kept.
    let (cut, _) = parse(syntax(ToolFormat::Hermes), &text[..50], 1);
    assert_eq!(cut.calls.len(), 1);
    assert!(text.contains(&cut.calls[0].arguments));
}

fn tools() -> Vec<Tool> {
    vec![
        Tool {
            name: "get_weather".into(),
            description: Some("Weather of a city".into()),
            parameters: json!({
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 12},
                    "unit": {"enum": ["c", "f"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": false,
            }),
        },
        Tool {
            name: "add".into(),
            description: None,
            parameters: json!({
                "type": "object",
                "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                               "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["a", "b"],
                "additionalProperties": false,
            }),
        },
    ]
}

fn check_call(name: &str, args: &Value) {
    let o = args.as_object().expect("arguments are an object");
    match name {
        "get_weather" => {
            let keys: Vec<&str> = o.keys().map(String::as_str).collect();
            assert_eq!(keys, ["city", "unit"], "{args}");
            assert!(o["city"].as_str().unwrap().chars().count() <= 12, "{args}");
            assert!(o["unit"] == "c" || o["unit"] == "f", "{args}");
        }
        "add" => {
            for k in ["a", "b"] {
                assert!((0..=99).contains(&o[k].as_i64().unwrap()), "{args}");
            }
            assert_eq!(o.len(), 2, "{args}");
        }
        other => panic!("no tool is named {other}"),
    }
}

#[test]
fn enforced_calls_parse_and_validate_whatever_the_logits() {
    let (tok, grammars) = grammars();
    let formats = [
        ToolFormat::Hermes,
        ToolFormat::Json,
        ToolFormat::Llama3,
        ToolFormat::Mistral,
        ToolFormat::Phi4Mini,
        ToolFormat::Nemotron,
        ToolFormat::Harmony,
    ];
    for format in formats {
        for choice in [
            ToolChoice::Required,
            ToolChoice::Function("add".into()),
            ToolChoice::Auto,
        ] {
            for parallel in [false, true] {
                let set = ToolSet {
                    tools: tools(),
                    choice: choice.clone(),
                    parallel,
                    format,
                };
                let Some(grammar) = tool_grammar(&set, None, &tok) else {
                    assert!(
                        choice == ToolChoice::Auto
                            && matches!(format, ToolFormat::Llama3 | ToolFormat::Harmony),
                        "{format:?} {choice:?} enforces nothing"
                    );
                    continue;
                };
                let call = match format {
                    ToolFormat::Hermes | ToolFormat::Json => {
                        "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>"
                    }
                    ToolFormat::Llama3 => {
                        "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}"
                    }
                    ToolFormat::Mistral => {
                        "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}]"
                    }
                    ToolFormat::Phi4Mini => {
                        "<|tool_call|>[{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}]<|/tool_call|>"
                    }
                    ToolFormat::Nemotron => {
                        "<TOOLCALL>[{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}]</TOOLCALL>"
                    }
                    ToolFormat::Harmony => {
                        "<|channel|>commentary to=functions.add <|constrain|>json<|message|>{\"a\": 1, \"b\": 2}"
                    }
                };
                assert!(
                    accepts(&tok, &grammars, &grammar, call),
                    "{format:?} {choice:?}: {call}"
                );
                let bad = call.replace("\"b\": 2", "\"b\": 200");
                assert!(
                    !accepts(&tok, &grammars, &grammar, &bad),
                    "{format:?} {choice:?}: {bad}"
                );
                for seed in 0..6 {
                    let (text, finish) = decode(&tok, &grammars, &grammar, seed, seed % 2 == 0);
                    let reply = parse_both(syntax(format), &text);
                    let made = calls(&reply);
                    // Harmony's free analysis may run to the token limit first.
                    if choice != ToolChoice::Auto && finish != FinishReason::Length {
                        assert!(
                            !made.is_empty(),
                            "{format:?} {choice:?}: no call in {text:?}"
                        );
                        assert!(reply.content.trim().is_empty(), "{text:?}");
                    }
                    if !parallel {
                        assert!(made.len() <= 1, "{format:?}: {text:?}");
                    }
                    for (name, args) in &made {
                        if let ToolChoice::Function(f) = &choice {
                            assert_eq!(name, f);
                        }
                        check_call(name, args);
                    }
                }
            }
        }
    }
}

#[test]
fn auto_beside_a_response_format_keeps_the_answer_to_its_schema() {
    let (tok, grammars) = grammars();
    let set = ToolSet {
        tools: tools(),
        choice: ToolChoice::Auto,
        parallel: false,
        format: ToolFormat::Hermes,
    };
    let answer = Constraint::JsonSchema(json!({
        "type": "object", "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"], "additionalProperties": false,
    }));
    let grammar = tool_grammar(&set, Some(&answer), &tok).unwrap();
    for seed in 0..8 {
        let (text, _) = decode(&tok, &grammars, &grammar, seed, false);
        let reply = parse_both(syntax(ToolFormat::Hermes), &text);
        if reply.calls.is_empty() {
            let v: Value = serde_json::from_str(&reply.content).expect("the answer is JSON");
            assert!(v["ok"].is_boolean(), "{v}");
        } else {
            calls(&reply).iter().for_each(|(n, a)| check_call(n, a));
        }
    }
    // A schema llguidance cannot compile fails the whole grammar.
    let mut bad = tools();
    bad[0].parameters = json!({"type": "object", "properties": {"x": {"type": "strin"}}});
    let set = ToolSet {
        tools: bad,
        choice: ToolChoice::Required,
        ..set
    };
    let grammar = tool_grammar(&set, None, &tok).unwrap();
    assert!(grammars.compile(&grammar).is_err());
}

/// A Hermes-style template like Qwen 2.5's (tools in the system turn, calls as `<tool_call>`
/// blocks, tool results as user turns of `<tool_response>`); the server's tests serve the
/// default model with it.
const HERMES_TEMPLATE: &str = include_str!("templates/hermes.jinja");

const PLAIN_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fn history() -> Vec<ChatMessage> {
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls = vec![ToolCall {
        id: "call_1".into(),
        name: "get_weather".into(),
        arguments: r#"{"city": "Paris", "unit": "c"}"#.into(),
    }];
    let mut result = ChatMessage::new("tool", "18 degrees");
    result.tool_call_id = Some("call_1".into());
    vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Weather in Paris?"),
        call,
        result,
    ]
}

#[test]
fn templates_render_tools_calls_and_results() {
    assert_eq!(
        ToolFormat::detect(Some(HERMES_TEMPLATE)),
        ToolFormat::Hermes
    );
    assert_eq!(ToolFormat::detect(Some(PLAIN_TEMPLATE)), ToolFormat::Json);
    assert_eq!(ToolFormat::detect(None), ToolFormat::Json);
    let set = |format| ToolSet {
        tools: tools(),
        choice: ToolChoice::Auto,
        parallel: true,
        format,
    };
    let hermes = ChatTemplate::new(HERMES_TEMPLATE, "", "").unwrap();
    let text = hermes
        .render_with_tools(&history(), Some(&set(ToolFormat::Hermes)), true)
        .unwrap();
    assert!(text.contains(r#""name": "get_weather""#), "{text}");
    assert!(text.contains("Be brief."), "{text}");
    assert!(
        text.contains(r#"{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}"#),
        "the call, arguments as an object: {text}"
    );
    assert!(
        text.contains("<tool_response>\n18 degrees\n</tool_response>"),
        "{text}"
    );
    assert!(text.ends_with("<|im_start|>assistant\n"));

    // A template without tools: oxgen's own description joins the system message.
    let plain = ChatTemplate::new(PLAIN_TEMPLATE, "", "").unwrap();
    let text = plain
        .render_with_tools(&history(), Some(&set(ToolFormat::Json)), true)
        .unwrap();
    assert!(
        text.starts_with("<|im_start|>system\nBe brief.\n\nYou can call functions."),
        "{text}"
    );
    assert!(text.contains(r#""name":"add""#), "{text}");
    assert!(text.contains("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"unit\":\"c\"}}\n</tool_call><|im_end|>"), "{text}");
    assert!(
        text.contains("<|im_start|>user\n<tool_response>\n18 degrees\n</tool_response>"),
        "{text}"
    );
    assert_eq!(text.matches("<|im_start|>system").count(), 1);
}

#[test]
fn grammars_constrain_only_the_answer_after_reasoning() {
    let (tok, grammars) = grammars();
    let answer = Constraint::JsonSchema(json!({
        "type": "object", "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"], "additionalProperties": false,
    }));
    let think = ReplySyntax::of_template("</think>", "", None);
    let open = ReplySyntax::of_template("</think>", "<think>\n", None);
    let harmony = ReplySyntax::of_template("<|channel|>", "", None);
    let cases = [
        (
            think,
            "<think>\nIt is fine. 1 < 2 </thin.</think>\n\n{\"ok\": true}",
            "{\"ok\": 1}",
        ),
        (think, "{\"ok\": false}", "<think>x</think>no"),
        (
            open,
            "Sure </thi.</think>\n{\"ok\": true}",
            "{\"ok\": true}",
        ),
        (
            harmony,
            "<|channel|>analysis<|message|>Fine.<|end|><|start|>assistant<|channel|>final<|message|>{\"ok\": true}",
            "<|channel|>final<|message|>{\"ok\": 3}",
        ),
    ];
    for (syntax, good, bad) in cases {
        let c = after_reasoning(answer.clone(), &syntax, &tok);
        assert!(accepts(&tok, &grammars, &c, good), "{good}");
        assert!(!accepts(&tok, &grammars, &c, bad), "{bad}");
        let reply = parse_both(syntax, good);
        assert_eq!(
            serde_json::from_str::<Value>(&reply.content).unwrap(),
            json!({"ok": reply.content.contains("true")}),
            "{good}"
        );
        for seed in 0..6 {
            let (text, finish) = decode(&tok, &grammars, &c, seed, seed % 2 == 0);
            if finish == FinishReason::Length {
                continue;
            }
            let reply = parse_both(syntax, &text);
            let v: Value =
                serde_json::from_str(&reply.content).unwrap_or_else(|e| panic!("{e}: {text:?}"));
            assert!(v["ok"].is_boolean(), "{text:?}");
        }
    }
    // A tool grammar nests the same way (Qwen3: think, then call).
    let set = ToolSet {
        tools: tools(),
        choice: ToolChoice::Required,
        parallel: false,
        format: ToolFormat::Hermes,
    };
    let think = ReplySyntax::of_template("</think>", "", Some(ToolFormat::Hermes));
    let c = after_reasoning(tool_grammar(&set, None, &tok).unwrap(), &think, &tok);
    let call = "<think>Need the sum.</think>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>";
    assert!(accepts(&tok, &grammars, &c, call));
    assert!(!accepts(&tok, &grammars, &c, "<think>x</think> 3"));
    let reply = parse_both(think, call);
    assert_eq!(
        (&*reply.reasoning, calls(&reply).len()),
        ("Need the sum.", 1)
    );
}
