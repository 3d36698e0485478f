//! Tokenizer, streaming detokenizer and chat template on the fixture package's real files.

use oxgen_generate::{ChatMessage, ChatTemplate, Detokenizer, Tokenizer};
use oxgen_testkit::fixtures::{FixtureConfig, write_package};

fn package() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_package(dir.path(), &FixtureConfig::default()).unwrap();
    dir
}

#[test]
fn byte_level_bpe_round_trips_text_with_merges_and_specials() {
    let dir = package();
    let tok = Tokenizer::from_file(&dir.path().join("tokenizer.json")).unwrap();
    let text = "the cat and the dog<|im_end|>";
    let ids = tok.encode(text, false).unwrap();
    assert_eq!(
        ids.last(),
        Some(&2),
        "special tokens in text map to their ids"
    );
    assert!(
        ids.contains(&tok.token_id("Ġand").unwrap()),
        "merges apply: {ids:?}"
    );
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    assert_eq!(tok.decode(&ids, true).unwrap(), "the cat and the dog");
}

#[test]
fn the_detokenizer_never_splits_a_character() {
    let dir = package();
    let tok = Tokenizer::from_file(&dir.path().join("tokenizer.json")).unwrap();
    // "é" and "🙂" are two and four byte tokens in a byte-level vocabulary.
    let text = "café 🙂 ok";
    let ids = tok.encode(text, false).unwrap();
    let mut detok = Detokenizer::new(true);
    let mut pieces = Vec::new();
    for &id in &ids {
        let piece = detok.push(&tok, id).unwrap();
        assert!(
            !piece.contains('\u{FFFD}'),
            "piece {piece:?} holds a broken character"
        );
        pieces.push(piece);
    }
    pieces.push(detok.flush(&tok).unwrap());
    assert_eq!(pieces.concat(), text);
    assert!(
        pieces.iter().filter(|p| p.is_empty()).count() >= 4,
        "partial characters are held back: {pieces:?}"
    );
}

#[test]
fn the_chat_template_renders_messages_and_the_generation_prompt() {
    let dir = package();
    let template = ChatTemplate::from_package(dir.path()).unwrap().unwrap();
    let text = template
        .render(&[ChatMessage::new("user", "Hi")], true)
        .unwrap();
    assert_eq!(
        text,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    // Recent transformers versions save the template as chat_template.jinja instead.
    let config = dir.path().join("tokenizer_config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    json.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(&config, json.to_string()).unwrap();
    assert!(ChatTemplate::from_package(dir.path()).unwrap().is_none());
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "{% for m in messages %}[{{ m['content'] }}]{% endfor %}",
    )
    .unwrap();
    let from_file = ChatTemplate::from_package(dir.path()).unwrap().unwrap();
    assert_eq!(
        from_file
            .render(&[ChatMessage::new("user", "Hi")], true)
            .unwrap(),
        "[Hi]"
    );
}

#[test]
fn templates_get_python_methods_raise_exception_and_strftime_now() {
    let source = "{% if messages[0]['role'] == 'bad' %}{{ raise_exception('roles must alternate') }}{% endif %}\
        {{ messages[0]['content'].strip().upper() }}|{{ strftime_now('%Y') | length }}|{{ bos_token }}";
    let t = ChatTemplate::new(source, "<s>", "</s>").unwrap();
    assert_eq!(
        t.render(&[ChatMessage::new("user", "  hey ")], false)
            .unwrap(),
        "HEY|4|<s>"
    );
    let e = t
        .render(&[ChatMessage::new("bad", "x")], false)
        .unwrap_err();
    assert!(e.to_string().contains("roles must alternate"), "{e}");
    assert!(
        ChatTemplate::new("{% if %}", "", "").is_err(),
        "syntax errors are reported at load"
    );
}

/// A template is untrusted code: a loop nest that would run for hours runs out of fuel and
/// fails the render, quickly; deep recursion fails too.
#[test]
fn a_runaway_template_fails_instead_of_hanging() {
    let started = std::time::Instant::now();
    let loops = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}";
    let t = ChatTemplate::new(loops, "", "").unwrap();
    let e = t
        .render(&[ChatMessage::new("user", "hi")], true)
        .unwrap_err();
    assert!(e.to_string().contains("fuel"), "{e}");
    let recursive = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
    let t = ChatTemplate::new(recursive, "", "").unwrap();
    assert!(t.render(&[ChatMessage::new("user", "hi")], true).is_err());
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

/// Found by fuzzing (`scripts/fuzz.sh`, target `tokenizer_json`): a decoder whose `type` key
/// is misspelled made the tokenizers crate panic while loading; it is the file's error now.
#[test]
fn a_malformed_decoder_is_an_error_not_a_panic() {
    let dir = package();
    let json = std::fs::read_to_string(dir.path().join("tokenizer.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
    v["decoder"] = serde_json::json!({"t}pe": "Byte,Lve"});
    let bad = v.to_string();
    let Err(e) = Tokenizer::from_bytes(bad.as_bytes(), "tokenizer.json") else {
        panic!("a decoder without a type loaded");
    };
    assert!(e.to_string().contains("tokenizer.json"), "{e}");
}
