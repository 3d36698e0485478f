//! Grammar constraints on a real (small) byte-level BPE tokenizer: whatever the logits say,
//! and whether selection is greedy or sampled, a constrained sequence produces text its
//! grammar accepts; what does not compile fails before anything is generated; a matcher that
//! is fed a forbidden token reports it.

mod common;

use common::{decode, decode_grammar, grammars};
use oxgen_generate::{
    Constraint, DecodeOptions, Decoding, FinishReason, Grammar, LogitsProcessor, ProcessorState,
    SamplingParams, Tokenizer,
};
use oxgen_testkit::fixtures::tokenizer;
use serde_json::{Value, json};

fn check_person(v: &Value) {
    let o = v.as_object().expect("an object");
    let keys: Vec<&str> = o.keys().map(String::as_str).collect();
    assert!(
        keys.iter()
            .all(|k| ["name", "age", "tags", "pet"].contains(k)),
        "no other keys: {v}"
    );
    let name = o["name"].as_str().expect("name is a string");
    assert!(name.chars().count() <= 8, "{v}");
    let age = o["age"].as_i64().expect("age is an integer");
    assert!((0..=120).contains(&age), "{v}");
    if let Some(tags) = o.get("tags") {
        let tags = tags.as_array().expect("tags is an array");
        assert!(tags.len() <= 3, "{v}");
        assert!(
            tags.iter()
                .all(|t| ["a", "b", "c"].contains(&t.as_str().unwrap())),
            "{v}"
        );
    }
    if let Some(pet) = o.get("pet") {
        assert!(pet["kind"] == "cat" || pet["kind"] == "dog", "{v}");
    }
}

#[test]
fn sequences_follow_their_grammar_whatever_the_logits() {
    let (tok, grammars) = grammars();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            "pet": {"$ref": "#/$defs/pet"}
        },
        "required": ["name", "age"],
        "additionalProperties": false,
        "$defs": {"pet": {
            "type": "object",
            "properties": {"kind": {"enum": ["cat", "dog"]}},
            "required": ["kind"],
            "additionalProperties": false
        }}
    });
    let mut objects = 0;
    for seed in 0..6 {
        for greedy in [true, false] {
            let what = format!("seed {seed}, greedy {greedy}");
            let (text, finish) = decode(
                &tok,
                &grammars,
                &Constraint::JsonSchema(schema.clone()),
                seed,
                greedy,
            );
            assert_ne!(finish, FinishReason::Length, "{what}: {text}");
            let v: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
            check_person(&v);

            // Any object is unbounded: random logits may run it to max_new_tokens (then the
            // text is cut short); an object that ends must parse.
            let (text, finish) = decode(&tok, &grammars, &Constraint::JsonObject, seed, greedy);
            if finish != FinishReason::Length {
                let v: Value =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
                assert!(v.is_object(), "{what}: {text}");
                objects += 1;
            } else {
                assert!(text.starts_with('{'), "{what}: {text}");
            }

            let (text, _) = decode(
                &tok,
                &grammars,
                &Constraint::Regex("[a-c]{3}-[0-9]{2}".into()),
                seed,
                greedy,
            );
            let b = text.as_bytes();
            assert!(
                b.len() == 6
                    && b[..3].iter().all(|c| (b'a'..=b'c').contains(c))
                    && b[3] == b'-'
                    && b[4..].iter().all(u8::is_ascii_digit),
                "{what}: {text:?}"
            );

            let lark = r#"start: "(" num ("," num)* ")"
num: /[0-9]{1,3}/"#;
            let (text, finish) = decode(
                &tok,
                &grammars,
                &Constraint::Lark(lark.into()),
                seed,
                greedy,
            );
            let inner = text
                .strip_prefix('(')
                .and_then(|t| t.strip_suffix(')'))
                .unwrap_or_else(|| panic!("{what}: {text:?} ({finish:?})"));
            assert!(
                inner
                    .split(',')
                    .all(|n| (1..=3).contains(&n.len()) && n.bytes().all(|c| c.is_ascii_digit())),
                "{what}: {text:?}"
            );

            let choices = vec!["yes".to_string(), "no".into(), "it \"depends\"".into()];
            let (text, finish) = decode(
                &tok,
                &grammars,
                &Constraint::Choice(choices.clone()),
                seed,
                greedy,
            );
            assert!(choices.contains(&text), "{what}: {text:?}");
            assert_eq!(finish, FinishReason::Grammar, "nothing may follow a choice");
        }
    }
    assert!(objects > 0, "no JSON object ended within 400 tokens");
}

#[test]
fn what_does_not_compile_fails_before_any_token() {
    let (_, grammars) = grammars();
    for (what, c) in [
        (
            "not a schema type",
            Constraint::JsonSchema(json!({"type": "nonsense"})),
        ),
        ("a bad regex", Constraint::Regex("[".into())),
        ("a bad Lark grammar", Constraint::Lark("start: (".into())),
        ("no choices", Constraint::Choice(Vec::new())),
        (
            "an empty language",
            Constraint::JsonSchema(json!({"type": "integer", "minimum": 5, "maximum": 1})),
        ),
    ] {
        let e = grammars.compile(&c).expect_err(what).to_string();
        assert!(e.starts_with("constraint: "), "{what}: {e}");
        assert!(!e.contains('\n'), "{what}: one line: {e}");
    }
}

#[test]
fn a_forbidden_token_fails_the_matcher_and_eos_waits_for_acceptance() {
    let (tok, grammars) = grammars();
    let grammar = grammars.compile(&Constraint::Regex("ab".into())).unwrap();
    let a = tok.encode("a", false).unwrap()[0];
    let b = tok.encode("b", false).unwrap()[0];
    let eos = tokenizer::EOS;

    let mut m = grammar.mask();
    let history = Default::default();
    let mut row = vec![0.0f32; tokenizer::VOCAB_SIZE];
    m.apply(&mut row, &history);
    let allowed: Vec<usize> = (0..row.len()).filter(|&i| row[i] == 0.0).collect();
    assert_eq!(allowed, [a as usize], "only 'a' first, not EOS");
    m.accept(a);
    let mut row = vec![0.0f32; tokenizer::VOCAB_SIZE];
    m.apply(&mut row, &history);
    assert!(row[eos] == f32::NEG_INFINITY && row[b as usize] == 0.0);
    m.accept(b);
    assert_eq!(m.state(), ProcessorState::Complete);

    let mut m = grammar.mask();
    m.accept(b);
    assert!(
        matches!(m.state(), ProcessorState::Failed(_)),
        "'b' first is outside the grammar: {:?}",
        m.state()
    );
    // A decoding whose matcher fails ends with an error, not with unconstrained text.
    let options = DecodeOptions {
        max_new_tokens: 10,
        eos: vec![eos as u32],
        ignore_eos: false,
        stop: Vec::new(),
        stop_ids: Vec::new(),
        min_new_tokens: 0,
        include_stop: false,
        reasoning_budget: None,
        sampling: SamplingParams::default(),
        constraint: Some(grammar),
        keep_special: false,
    };
    let mut d = Decoding::new(&[1], 0, 64, options).unwrap();
    // Every id -inf: the mask leaves nothing, the fallback id is not 'a'.
    let row = vec![f32::NEG_INFINITY; tokenizer::VOCAB_SIZE];
    let e = d.on_logits(&row, &tok).expect_err("the grammar refuses");
    assert!(e.to_string().contains("left the grammar"), "{e}");
}

/// `ignore_eos` masks the end-of-sequence ids, which a grammar allows only where it accepts:
/// a grammar that is complete still ends the sequence (nothing may follow), and one that may
/// go on goes on, never out of its language.
#[test]
fn ignore_eos_with_a_grammar_ends_where_the_grammar_is_complete() {
    let (tok, grammars) = grammars();
    for constraint in [
        Constraint::Choice(vec!["yes".into(), "no".into()]),
        Constraint::JsonObject,
        Constraint::Regex("[0-9]+".into()),
    ] {
        for seed in 0..4 {
            let options = DecodeOptions {
                max_new_tokens: 60,
                eos: vec![tokenizer::EOS as u32],
                ignore_eos: true,
                stop: Vec::new(),
                stop_ids: Vec::new(),
                min_new_tokens: 0,
                include_stop: false,
                reasoning_budget: None,
                sampling: SamplingParams {
                    seed,
                    ..SamplingParams::default()
                },
                constraint: Some(grammars.compile(&constraint).unwrap()),
                keep_special: false,
            };
            let mut d = Decoding::new(&[1, 40], 0, 1024, options).unwrap();
            let mut rng = oxgen_testkit::fixtures::Rng::new(seed);
            let mut text = String::new();
            let finish = loop {
                let mut row: Vec<f32> = (0..tokenizer::VOCAB_SIZE)
                    .map(|_| rng.uniform() * 8.0)
                    .collect();
                row[tokenizer::EOS] = 30.0;
                let emitted = d.on_logits(&row, &tok).expect("never leaves the grammar");
                text.push_str(&d.take_text());
                if let Some(f) = emitted.finish {
                    break f;
                }
            };
            match (&constraint, finish) {
                (Constraint::Choice(_), FinishReason::Grammar) => {
                    assert!(text == "yes" || text == "no", "{text:?}")
                }
                // A closed object is complete; one still open runs to the limit.
                (Constraint::JsonObject, FinishReason::Grammar) => {
                    assert!(serde_json::from_str::<Value>(&text).unwrap().is_object())
                }
                (Constraint::JsonObject, FinishReason::Length) => assert!(text.starts_with('{')),
                (Constraint::Regex(_), FinishReason::Length) => {
                    assert!(text.chars().all(|c| c.is_ascii_digit()), "{text:?}")
                }
                other => panic!("{other:?}: {text:?}"),
            }
        }
    }
}

/// JSON whitespace is bounded (a space, or a line break and up to 20 blanks), so logits that
/// love blanks cannot stall a document: it still closes, well within the token limit.
#[test]
fn json_whitespace_is_bounded() {
    let (tok, grammars) = grammars();
    let blanks: Vec<u32> = [" ", "\n", "\t", "\r"]
        .iter()
        .map(|b| tok.encode(b, false).unwrap()[0])
        .collect();
    let schema = json!({
        "type": "object",
        "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                       "b": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2}},
        "required": ["a", "b"], "additionalProperties": false,
    });
    let grammar = grammars.compile(&Constraint::JsonSchema(schema)).unwrap();
    let options = DecodeOptions {
        max_new_tokens: 300,
        eos: vec![tokenizer::EOS as u32],
        ignore_eos: false,
        stop: Vec::new(),
        stop_ids: Vec::new(),
        min_new_tokens: 0,
        include_stop: false,
        reasoning_budget: None,
        sampling: SamplingParams::default(),
        constraint: Some(grammar),
        keep_special: false,
    };
    let mut d = Decoding::new(&[1], 0, 1024, options).unwrap();
    let mut text = String::new();
    let finish = loop {
        let mut row = vec![0.0f32; tokenizer::VOCAB_SIZE];
        for &b in &blanks {
            row[b as usize] = 10.0;
        }
        let emitted = d.on_logits(&row, &tok).unwrap();
        text.push_str(&d.take_text());
        if let Some(f) = emitted.finish {
            break f;
        }
    };
    assert_ne!(finish, FinishReason::Length, "{text:?}");
    let longest = text
        .split(|c: char| !c.is_whitespace())
        .map(str::len)
        .max()
        .unwrap_or(0);
    assert!(longest <= 22, "a run of {longest} blanks: {text:?}");
    serde_json::from_str::<Value>(&text).unwrap();
}

/// Decodes under `grammar` from seeded random logits that never favour ending, within
/// `limit` ids; the text and why it finished.
fn decode_within(
    tok: &Tokenizer,
    grammar: Grammar,
    limit: usize,
    seed: u64,
) -> (String, FinishReason) {
    decode_grammar(tok, grammar, limit, seed, false, -10.0)
}

/// A constrained reply always parses, whatever the limit: logits that would run on (open
/// objects, long strings) are turned towards the end once the ids left come down to the
/// shortest completion, and the reply says `length` when the limit closed it. Turned off,
/// the same logits leave most replies cut.
#[test]
fn constrained_replies_close_within_their_limit() {
    let (tok, grammars) = grammars();
    let person = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        },
        "required": ["name", "age"],
        "additionalProperties": false,
    });
    // Open: the model may invent properties, and strings have no end.
    let open = json!({
        "type": "object",
        "properties": {"title": {"type": "string"}, "items": {"type": "array",
            "items": {"type": "object", "properties": {"id": {"type": "integer"}},
                      "required": ["id"]}}},
        "required": ["title", "items"],
    });
    let mut closed_by_limit = 0;
    for (schema, least) in [(&person, 24), (&open, 32)] {
        let grammar = grammars
            .compile(&Constraint::JsonSchema(schema.clone()))
            .unwrap();
        for limit in [least, least + 7, least + 20, 120] {
            for seed in 0..6 {
                let (text, finish) = decode_within(&tok, grammar.clone(), limit, seed);
                let v: Value = serde_json::from_str(&text)
                    .unwrap_or_else(|e| panic!("limit {limit}, seed {seed}: {e}: {text:?}"));
                if schema == &open {
                    assert!(v["title"].is_string() && v["items"].is_array(), "{v}");
                } else {
                    check_person(&v);
                }
                match finish {
                    FinishReason::Length => closed_by_limit += 1,
                    FinishReason::Eos | FinishReason::Grammar => {}
                    other => panic!("{other:?}: {text:?}"),
                }
            }
        }
    }
    assert!(
        closed_by_limit > 20,
        "the limit closed {closed_by_limit} replies"
    );
    let object = grammars.compile(&Constraint::JsonObject).unwrap();
    for seed in 0..6 {
        let (text, _) = decode_within(&tok, object.clone(), 12, seed);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(v.is_object());
    }
    // A Lark grammar and a regex close too (parentheses balanced, the address finished).
    let arithmetic = Constraint::Lark(
        "start: expr\nexpr: term ((\"+\" | \"-\") term)*\nterm: NUMBER | \"(\" expr \")\"\nNUMBER: /[0-9]+/"
            .into(),
    );
    let address = Constraint::Regex("[a-z]+@[a-z]+\\.(com|org)".into());
    for (constraint, limit) in [(arithmetic, 10), (address, 12)] {
        let grammar = grammars.compile(&constraint).unwrap();
        for seed in 0..6 {
            let (text, _) = decode_within(&tok, grammar.clone(), limit, seed);
            let balanced = text.matches('(').count() == text.matches(')').count();
            let finished = !text.ends_with(['(', '+', '-', '@', '.']) && !text.is_empty();
            assert!(
                balanced && finished,
                "{constraint:?}, seed {seed}: {text:?}"
            );
        }
    }
    let unclosed = grammars
        .compile(&Constraint::JsonSchema(open))
        .unwrap()
        .closing(false);
    let cut = (0..6)
        .filter(|&seed| {
            let (text, _) = decode_within(&tok, unclosed.clone(), 32, seed);
            serde_json::from_str::<Value>(&text).is_err()
        })
        .count();
    assert!(cut > 3, "without closing, {cut} of 6 replies were cut");
}
