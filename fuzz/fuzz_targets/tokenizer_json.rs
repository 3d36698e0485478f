//! `tokenizer.json` loading, then encoding and decoding: the input's first line is text to
//! encode, the rest the tokenizer file. Anything may fail; nothing may panic.
#![no_main]

use oxgen_generate::{Detokenizer, Tokenizer};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // The tokenizers crate panics on some malformed files and oxgen catches that
    // (`Tokenizer::from_bytes`); libFuzzer's hook would abort on the caught panic, so the
    // default hook is put back. A panic that escapes still ends the run as a crash.
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| drop(std::panic::take_hook()));
    let split = data.iter().position(|&b| b == b'\n').unwrap_or(data.len());
    let (text, json) = data.split_at(split);
    let Ok(tok) = Tokenizer::from_bytes(json, "tokenizer.json") else {
        return;
    };
    let text = String::from_utf8_lossy(text);
    let Ok(ids) = tok.encode(&text, true) else {
        return;
    };
    let _ = tok.decode(&ids, false);
    let mut detok = Detokenizer::new(true);
    for &id in ids.iter().take(256) {
        let _ = detok.push(&tok, id);
        let _ = tok.token_bytes(id);
    }
    let _ = detok.flush(&tok);
});
