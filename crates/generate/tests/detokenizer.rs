//! The incremental detokenizer on the two tokenizer families LLMs ship: byte-level BPE
//! (GPT-2's ByteLevel pre-tokenizer and decoder: SmolLM, Qwen, Llama 3) and SentencePiece-
//! style BPE with `byte_fallback` (`<0xE2>` byte tokens and the Replace/ByteFallback/Fuse/Strip
//! decoder sequence: Llama 2, Mistral, Phi-3; Gemma without the Strip).
//!
//! The tokenizer files are written here, small but in the real `tokenizer.json` format, so
//! each test controls exactly which ids exist.

use oxgen_generate::{Detokenizer, Tokenizer};
use oxgen_testkit::fixtures::tokenizer::byte_chars;
use serde_json::{Value, json};

const REPLACEMENT: char = '\u{FFFD}';

fn load(json: &Value) -> (tempfile::TempDir, Tokenizer) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, serde_json::to_string_pretty(json).unwrap()).unwrap();
    let tok = Tokenizer::from_file(&path).unwrap();
    (dir, tok)
}

fn special(id: u32, content: &str) -> Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false,
        "rstrip": false, "normalized": false, "special": true})
}

fn bpe(vocab: serde_json::Map<String, Value>, merges: Vec<String>, byte_fallback: bool) -> Value {
    json!({"type": "BPE", "dropout": null,
        "unk_token": if byte_fallback { json!("<unk>") } else { Value::Null },
        "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": byte_fallback,
        "byte_fallback": byte_fallback, "ignore_merges": false, "vocab": vocab, "merges": merges})
}

// ---------------------------------------------------------------- byte-level BPE

/// Id of byte `b` in the byte-level vocabulary: `<|end|>` is 0, bytes are 1..=256.
fn byte_id(b: u8) -> u32 {
    1 + b as u32
}

/// GPT-2's printable spelling of `bytes`.
fn spell(bytes: &[u8]) -> String {
    let chars = byte_chars();
    bytes.iter().map(|&b| chars[b as usize]).collect()
}

/// Merges, in rank order, as byte strings; the last two cut "€" (E2 82 AC) after its first
/// byte, so " €" is two tokens: " \xE2" and "\x82\xAC".
const BYTE_LEVEL_MERGES: [(&[u8], &[u8]); 8] = [
    (b" ", b"t"),
    (b"h", b"e"),
    (b" t", b"he"),
    (b" ", b"w"),
    (b"o", b"r"),
    (b"l", b"d"),
    (b" ", b"\xE2"),
    (b"\x82", b"\xAC"),
];

fn byte_level() -> (tempfile::TempDir, Tokenizer) {
    let mut vocab = serde_json::Map::new();
    vocab.insert("<|end|>".into(), 0.into());
    for b in 0..=255u8 {
        vocab.insert(spell(&[b]), byte_id(b).into());
    }
    let mut merges = Vec::new();
    for (a, b) in BYTE_LEVEL_MERGES {
        let id = vocab.len();
        vocab.insert(spell(&[a, b].concat()), id.into());
        merges.push(format!("{} {}", spell(a), spell(b)));
    }
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    load(&json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(0, "<|end|>")],
        "normalizer": null, "pre_tokenizer": byte_level, "post_processor": byte_level,
        "decoder": byte_level, "model": bpe(vocab, merges, false)
    }))
}

// ---------------------------------------------------------------- SentencePiece-style BPE

/// Which SentencePiece decoder sequence to write.
#[derive(Clone, Copy, Debug)]
enum Sp {
    /// Llama 2 / Mistral: prepend "▁" when encoding; decoder Replace("▁", " "), ByteFallback,
    /// Fuse, Strip(" ", 1, 0).
    Llama,
    /// Gemma: no prefix space; decoder Replace, ByteFallback, Fuse.
    Gemma,
}

/// `<unk> <s> </s>`, then `<0x00>`..`<0xFF>` (ids 3..=258), then pieces.
fn sp_byte_id(b: u8) -> u32 {
    3 + b as u32
}

const SP_PIECES: [&str; 21] = [
    "▁", "H", "e", "l", "o", "w", "r", "d", "h", "i", "t", "!", "▁H", "▁He", "He", "ll", "llo",
    "▁w", "or", "ld", "▁Hello",
];
const SP_MERGES: [(&str, &str); 7] = [
    ("l", "l"),
    ("ll", "o"),
    ("▁", "H"),
    ("▁", "w"),
    ("o", "r"),
    ("l", "d"),
    ("▁H", "e"),
];

fn sentencepiece(style: Sp) -> (tempfile::TempDir, Tokenizer) {
    let mut vocab = serde_json::Map::new();
    for (i, s) in ["<unk>", "<s>", "</s>"].iter().enumerate() {
        vocab.insert(s.to_string(), i.into());
    }
    for b in 0..=255u8 {
        vocab.insert(format!("<0x{b:02X}>"), sp_byte_id(b).into());
    }
    for piece in SP_PIECES {
        let id = vocab.len();
        vocab.insert(piece.into(), id.into());
    }
    // "▁He" + "llo" is not a merge: "▁Hello" only exists as a vocabulary entry, so encoding
    // never produces it, but decoding it must work.
    let merges = SP_MERGES.iter().map(|(a, b)| format!("{a} {b}")).collect();
    let replace_space = json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"});
    let normalizer = match style {
        Sp::Llama => json!({"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, replace_space]}),
        Sp::Gemma => replace_space,
    };
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if let Sp::Llama = style {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    load(&json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": normalizer, "pre_tokenizer": null, "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": bpe(vocab, merges, true)
    }))
}

// ---------------------------------------------------------------- helpers

/// Streams `ids`: the piece returned by each push, then what `flush` returns.
fn stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> (Vec<String>, String) {
    let mut detok = Detokenizer::new(skip_special);
    let pieces = ids.iter().map(|&id| detok.push(tok, id).unwrap()).collect();
    (pieces, detok.flush(tok).unwrap())
}

fn streamed_text(tok: &Tokenizer, ids: &[u32], skip_special: bool) -> String {
    let (pieces, rest) = stream(tok, ids, skip_special);
    pieces.concat() + &rest
}

/// A deterministic pseudo-random sequence of `n` ids below `vocab`.
fn random_ids(seed: u64, n: usize, vocab: u32) -> Vec<u32> {
    let mut rng = oxgen_testkit::Rng::new(seed);
    (0..n).map(|_| rng.below(u64::from(vocab)) as u32).collect()
}

const TEXTS: [&str; 6] = [
    "Hello world",
    "the weather, the world",
    "café 🙂 ok",
    "€ costs €€ — ünïcödé",
    "日本語のテキスト\nnew line\ttab",
    "  leading and trailing spaces  ",
];

// ---------------------------------------------------------------- byte-level tests

#[test]
fn byte_level_holds_a_split_character_until_its_last_byte() {
    let (_dir, tok) = byte_level();
    // "🙂" is F0 9F 99 82, four single-byte tokens.
    let ids: Vec<u32> = "🙂".bytes().map(byte_id).collect();
    let (pieces, rest) = stream(&tok, &ids, false);
    assert_eq!(pieces, ["", "", "", "🙂"]);
    assert_eq!(rest, "");

    // A token holding a space and the first byte of "€", then one with the other two.
    let ids = tok.encode("ab €", false).unwrap();
    assert_eq!(ids.len(), 4, "a, b, ' \\xE2', '\\x82\\xAC': {ids:?}");
    let (pieces, rest) = stream(&tok, &ids, false);
    assert_eq!(
        pieces,
        ["a", "b", "", " €"],
        "the space waits for the character"
    );
    assert_eq!(rest, "");
}

#[test]
fn byte_level_flushes_an_incomplete_character_as_one_replacement() {
    let (_dir, tok) = byte_level();
    // "ok" then E2 82: the first two bytes of "€", never completed. ByteLevel decodes with
    // `String::from_utf8_lossy`: one U+FFFD for the incomplete sequence.
    let ids = [byte_id(b'o'), byte_id(b'k'), byte_id(0xE2), byte_id(0x82)];
    let (pieces, rest) = stream(&tok, &ids, false);
    assert_eq!(pieces, ["o", "k", "", ""]);
    assert_eq!(rest, REPLACEMENT.to_string());
    assert_eq!(tok.decode(&ids, false).unwrap(), "ok\u{FFFD}");
}

#[test]
fn byte_level_stream_concatenates_to_the_whole_decode() {
    let (_dir, tok) = byte_level();
    for text in TEXTS {
        let ids = tok.encode(text, false).unwrap();
        let (pieces, rest) = stream(&tok, &ids, false);
        for p in &pieces {
            assert!(!p.contains(REPLACEMENT), "{text:?}: broken piece {p:?}");
        }
        assert_eq!(pieces.concat() + &rest, text);
    }
    // Arbitrary ids, invalid byte sequences and the special token included.
    for seed in 0..50 {
        let ids = random_ids(seed, 40, 1 + 256 + BYTE_LEVEL_MERGES.len() as u32);
        for skip in [false, true] {
            assert_eq!(
                streamed_text(&tok, &ids, skip),
                tok.decode(&ids, skip).unwrap(),
                "seed {seed}, skip_special {skip}: {ids:?}"
            );
        }
    }
}

#[test]
fn byte_level_skips_special_tokens_when_asked() {
    let (_dir, tok) = byte_level();
    let mut ids = tok.encode("the", false).unwrap();
    ids.push(0);
    ids.extend(tok.encode(" world", false).unwrap());
    ids.push(0);
    assert_eq!(streamed_text(&tok, &ids, true), "the world");
    assert_eq!(streamed_text(&tok, &ids, false), "the<|end|> world<|end|>");
}

// ---------------------------------------------------------------- SentencePiece tests

fn piece_id(tok: &Tokenizer, piece: &str) -> u32 {
    tok.token_id(piece).unwrap()
}

#[test]
fn byte_fallback_holds_a_split_character_until_its_last_byte_token() {
    for style in [Sp::Llama, Sp::Gemma] {
        let (_dir, tok) = sentencepiece(style);
        // "é" is not a piece: it encodes as <0xC3> <0xA9>. "€" as <0xE2> <0x82> <0xAC>.
        let ids = tok.encode("Hé€!", false).unwrap();
        let bytes: Vec<u32> = "é€".bytes().map(sp_byte_id).collect();
        assert_eq!(
            &ids[ids.len() - 6..ids.len() - 1],
            &bytes,
            "{style:?}: {ids:?}"
        );
        let (pieces, rest) = stream(&tok, &ids, false);
        let tail: Vec<&str> = pieces[ids.len() - 6..].iter().map(String::as_str).collect();
        assert_eq!(tail, ["", "é", "", "", "€", "!"], "{style:?}");
        assert_eq!(rest, "");
    }
}

#[test]
fn byte_fallback_flushes_each_unfinished_byte_as_a_replacement() {
    for style in [Sp::Llama, Sp::Gemma] {
        let (_dir, tok) = sentencepiece(style);
        // ByteFallback turns a byte run that is not valid UTF-8 into one U+FFFD per byte.
        let ids = [piece_id(&tok, "▁Hello"), sp_byte_id(0xE2), sp_byte_id(0x82)];
        let (pieces, rest) = stream(&tok, &ids, false);
        let hello = match style {
            Sp::Llama => "Hello", // Strip removes the first token's leading space
            Sp::Gemma => " Hello",
        };
        assert_eq!(pieces, [hello, "", ""], "{style:?}");
        assert_eq!(rest, "\u{FFFD}\u{FFFD}", "{style:?}");
        assert_eq!(
            tok.decode(&ids, false).unwrap(),
            format!("{hello}\u{FFFD}\u{FFFD}")
        );
    }
}

#[test]
fn byte_fallback_stream_concatenates_to_the_whole_decode() {
    for style in [Sp::Llama, Sp::Gemma] {
        let (_dir, tok) = sentencepiece(style);
        for text in TEXTS {
            let ids = tok.encode(text, false).unwrap();
            let whole = tok.decode(&ids, false).unwrap();
            let (pieces, rest) = stream(&tok, &ids, false);
            for p in &pieces {
                assert!(
                    !p.contains(REPLACEMENT),
                    "{style:?} {text:?}: broken piece {p:?}"
                );
            }
            assert_eq!(pieces.concat() + &rest, whole, "{style:?} {text:?}");
        }
        // Pieces and specials in any order, with whole characters as byte runs: what a model
        // emits. "▁Hello" is never produced by encoding but must decode the same streamed.
        let words = ["▁Hello", "▁", "▁w", "or", "ld", "!", "He", "</s>", "<s>"];
        for seed in 0..50 {
            let mut ids = Vec::new();
            for (i, pick) in random_ids(seed, 20, 12).into_iter().enumerate() {
                match words.get(pick as usize) {
                    Some(w) => ids.push(piece_id(&tok, w)),
                    None => {
                        let c = ["é", "€", "🙂"][i % 3];
                        ids.extend(c.bytes().map(sp_byte_id));
                    }
                }
            }
            for skip in [false, true] {
                assert_eq!(
                    streamed_text(&tok, &ids, skip),
                    tok.decode(&ids, skip).unwrap(),
                    "{style:?}, seed {seed}, skip_special {skip}: {ids:?}"
                );
            }
        }
    }
}

/// A model can emit a stray byte token. ByteFallback decodes a byte run that is not valid
/// UTF-8 as one U+FFFD per byte, valid characters in the run included, so the text of a
/// window that ends in "é" is not a prefix of the text once a stray byte follows: "é" (2
/// bytes) becomes "\u{FFFD}\u{FFFD}\u{FFFD}" (9 bytes). The detokenizer must still emit
/// the text that comes after.
#[test]
fn byte_fallback_text_after_a_stray_byte_is_not_lost() {
    for style in [Sp::Llama, Sp::Gemma] {
        let (_dir, tok) = sentencepiece(style);
        let mut ids: Vec<u32> = "é".bytes().map(sp_byte_id).collect();
        ids.push(sp_byte_id(0xFF)); // never valid in UTF-8
        ids.extend(["▁w", "or", "ld", "!"].map(|p| piece_id(&tok, p)));
        let out = streamed_text(&tok, &ids, false);
        assert!(out.starts_with('é'), "{style:?}: {out:?}");
        assert!(
            out.ends_with(" world!"),
            "{style:?}: the text after the stray byte was lost: {out:?}"
        );
        assert!(out.contains(REPLACEMENT), "{style:?}: {out:?}");
    }
}
