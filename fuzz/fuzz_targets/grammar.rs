//! Constraint compilation on the fixture tokenizer: the input as a Lark grammar, a regex and
//! (when it parses as JSON) a JSON schema; a grammar that compiles gets a few mask steps.
//! Compilation fails for most inputs; it must not panic.
#![no_main]

use std::sync::{Arc, OnceLock};

use oxgen_generate::{Constraint, Grammars, LogitsProcessor, Tokenizer};
use oxgen_testkit::fixtures::tokenizer;

fn grammars() -> &'static Grammars {
    static G: OnceLock<Grammars> = OnceLock::new();
    G.get_or_init(|| {
        let json = tokenizer::json();
        let tok = Tokenizer::from_bytes(json.as_bytes(), "fixture").expect("the fixture loads");
        Grammars::new(
            Arc::new(tok),
            tokenizer::VOCAB_SIZE,
            &[tokenizer::EOS as u32],
        )
        .expect("a trie")
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut constraints = vec![
        Constraint::Lark(text.into()),
        Constraint::Regex(text.into()),
    ];
    if let Ok(schema) = serde_json::from_str(text) {
        constraints.push(Constraint::JsonSchema(schema));
    }
    for c in constraints {
        let Ok(grammar) = grammars().compile(&c) else {
            continue;
        };
        let mut mask = grammar.mask();
        let mut row = vec![0.0f32; tokenizer::VOCAB_SIZE];
        let history = Default::default();
        for step in 0..4 {
            mask.apply(&mut row, &history);
            let Some(id) = (0..row.len()).find(|&i| row[i] == 0.0) else {
                break;
            };
            mask.accept((id + step) as u32 % tokenizer::VOCAB_SIZE as u32);
            row.fill(0.0);
        }
    }
});
