//! Chat templates as untrusted code: the input is a template, a NUL, then message content.
//! Rendering may fail (errors, running out of fuel); it must not panic or run away.
#![no_main]

use oxgen_generate::{ChatMessage, ChatTemplate};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (source, content) = text.split_once('\0').unwrap_or((&text, "hello"));
    let Ok(template) = ChatTemplate::new(source, "<s>", "</s>") else {
        return;
    };
    let messages = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", content),
        ChatMessage::new("assistant", content),
    ];
    let _ = template.render(&messages, true);
});
