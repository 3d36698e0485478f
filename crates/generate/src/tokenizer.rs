//! Tokenizer and streaming detokenizer.

use std::path::Path;

use crate::GenerateError;

/// A Hugging Face tokenizer loaded from `tokenizer.json`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: String,
}

impl Tokenizer {
    pub fn from_file(path: &Path) -> Result<Tokenizer, GenerateError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| GenerateError::Tokenizer {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        Tokenizer::from_bytes(&bytes, &shown)
    }

    /// A tokenizer from the bytes of a `tokenizer.json`; `name` stands for the file in errors.
    ///
    /// The `tokenizers` crate panics on some malformed files (a `decoder` without a `type`,
    /// found by fuzzing); that is caught here and reported as the file's error.
    pub fn from_bytes(bytes: &[u8], name: &str) -> Result<Tokenizer, GenerateError> {
        let err = |reason: String| GenerateError::Tokenizer {
            path: name.to_string(),
            reason: format!("{reason} (is it a Hugging Face tokenizer.json?)"),
        };
        let parsed = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(bytes))
            .map_err(|panic| {
                let what = (panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                err(format!("the tokenizers library could not read it ({what})"))
            })?;
        let mut inner = parsed.map_err(|e| err(e.to_string()))?;
        // A tokenizer.json may pad or truncate every encoding (sentence-transformers' files
        // pad to 128); lengths are oxgen's to decide, and a prompt is never cut silently.
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| err(e.to_string()))?;
        Ok(Tokenizer {
            inner,
            path: name.to_string(),
        })
    }

    fn err(&self, e: impl std::fmt::Display) -> GenerateError {
        GenerateError::Tokenizer {
            path: self.path.clone(),
            reason: e.to_string(),
        }
    }

    /// Token ids of `text`; special tokens written in the text (`<|im_start|>`) are matched.
    /// `add_special` adds what the tokenizer's post-processor adds (BOS for some models).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, GenerateError> {
        Ok(self
            .inner
            .encode(text, add_special)
            .map_err(|e| self.err(e))?
            .get_ids()
            .to_vec())
    }

    /// Ids and token type ids of `first` (and `second`, as a pair), with the special tokens
    /// the post-processor adds (`[CLS] first [SEP] second [SEP]` for BERT, type ids 0 then 1).
    pub fn encode_typed(
        &self,
        first: &str,
        second: Option<&str>,
    ) -> Result<(Vec<u32>, Vec<u32>), GenerateError> {
        let encoding = match second {
            Some(second) => self.inner.encode((first, second), true),
            None => self.inner.encode(first, true),
        }
        .map_err(|e| self.err(e))?;
        Ok((
            encoding.get_ids().to_vec(),
            encoding.get_type_ids().to_vec(),
        ))
    }

    /// Text of `ids`, special tokens included when `skip_special` is false.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, GenerateError> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| self.err(e))
    }

    /// The id of a token string such as `<|im_end|>`.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary string of `id` (byte-level BPE spells bytes in GPT-2's alphabet:
    /// `Ġ` for a space), before any decoder runs.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The text of `id` when it is a special token (`<|im_end|>`), which decoding skips and
    /// no grammar can spell.
    pub fn special_token(&self, id: u32) -> Option<String> {
        let added = self.inner.get_added_tokens_decoder();
        added
            .get(&id)
            .filter(|t| t.special)
            .map(|t| t.content.clone())
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Fails naming the first difference when `other` does not map every token to the same
    /// id or lacks one of this tokenizer's special tokens (a draft model's tokenizer must be
    /// the target's).
    pub fn check_same_vocab(&self, other: &Tokenizer) -> Result<(), String> {
        let (mine, theirs) = (self.inner.get_vocab(true), other.inner.get_vocab(true));
        if mine.len() != theirs.len() {
            return Err(format!("{} tokens against {}", theirs.len(), mine.len()));
        }
        let mut mine: Vec<(&String, &u32)> = mine.iter().collect();
        mine.sort_unstable_by_key(|&(_, id)| *id);
        for (token, id) in mine {
            if theirs.get(token) != Some(id) {
                return Err(format!(
                    "token {token:?} is id {id} here and {:?} there",
                    theirs.get(token)
                ));
            }
        }
        let specials = self.inner.get_added_tokens_decoder();
        for (id, t) in specials.iter().filter(|(_, t)| t.special) {
            if other.special_token(*id).as_deref() != Some(t.content.as_str()) {
                return Err(format!(
                    "special token {:?} (id {id}) is missing",
                    t.content
                ));
            }
        }
        Ok(())
    }

    /// The raw bytes token `id` stands for, which may be part of a UTF-8 character (what
    /// OpenAI's logprobs `bytes` carry; decoding the id alone gives U+FFFD there instead).
    ///
    /// Byte-level BPE (GPT-2, Llama 3, SmolLM2) spells each byte as one character of GPT-2's
    /// byte-to-unicode alphabet, so the token string maps back byte by byte; sentencepiece's
    /// byte-fallback tokens are spelled `<0xAB>`. A reading is kept only when it decodes to
    /// what the tokenizer itself decodes the id to, so a token of another kind (special
    /// tokens, sentencepiece's `▁` pieces) gets the UTF-8 of its decoded text.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let text = self.decode(&[id], false).unwrap_or_default();
        let raw = self.id_to_token(id).and_then(|token| {
            byte_fallback(&token)
                .map(|b| vec![b])
                .or_else(|| token.chars().map(byte_level_byte).collect())
        });
        match raw {
            Some(bytes) if String::from_utf8_lossy(&bytes) == text => bytes,
            _ => text.into_bytes(),
        }
    }
}

/// The byte of a sentencepiece byte-fallback token `<0xAB>`.
fn byte_fallback(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Bytes GPT-2's `bytes_to_unicode` spells as themselves: printable Latin-1 but for the soft
/// hyphen. Every other byte is spelled U+0100 + its index among the rest, in byte order.
fn spelled_as_itself(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The byte that `c` spells in GPT-2's byte-to-unicode alphabet, if it is one of its 256.
fn byte_level_byte(c: char) -> Option<u8> {
    let code = u32::from(c);
    if let Ok(b) = u8::try_from(code)
        && spelled_as_itself(b)
    {
        return Some(b);
    }
    let index = code.checked_sub(0x100)? as usize;
    (0..=u8::MAX).filter(|&b| !spelled_as_itself(b)).nth(index)
}

/// How GPT-2's byte-to-unicode alphabet spells byte `b` (the inverse of [`byte_level_byte`]).
pub fn byte_level_char(b: u8) -> char {
    if spelled_as_itself(b) {
        return char::from(b);
    }
    let index = (0..b).filter(|&x| !spelled_as_itself(x)).count() as u32;
    char::from_u32(0x100 + index).expect("below U+0200")
}

/// Turns a growing token sequence into text pieces as they become complete.
///
/// Decodes a window of recent tokens and emits only the text past what was already emitted,
/// holding back while the tail ends in an incomplete UTF-8 sequence (decoded as U+FFFD), so a
/// multi-byte character split across tokens is emitted whole.
pub struct Detokenizer {
    ids: Vec<u32>,
    /// Start of the window the last emitted text was decoded from.
    prefix_start: usize,
    /// End of that window: text up to here has been emitted.
    emitted_end: usize,
    skip_special: bool,
}

impl Detokenizer {
    pub fn new(skip_special: bool) -> Detokenizer {
        Detokenizer {
            ids: Vec::new(),
            prefix_start: 0,
            emitted_end: 0,
            skip_special,
        }
    }

    /// Adds `id`; returns the new complete text, possibly empty.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String, GenerateError> {
        self.ids.push(id);
        let mut prefix = tok.decode(
            &self.ids[self.prefix_start..self.emitted_end],
            self.skip_special,
        )?;
        let mut full = tok.decode(&self.ids[self.prefix_start..], self.skip_special)?;
        if !full.starts_with(&prefix) {
            // The new ids changed how the emitted ones decode (byte-fallback decoders turn a
            // whole byte run into one U+FFFD per byte once it stops being valid UTF-8). What
            // was emitted stays emitted: decode the new ids on their own from here on.
            self.prefix_start = self.emitted_end;
            prefix.clear();
            full = tok.decode(&self.ids[self.prefix_start..], self.skip_special)?;
        }
        if full.ends_with('\u{FFFD}')
            || full.len() <= prefix.len()
            || !full.is_char_boundary(prefix.len())
        {
            return Ok(String::new());
        }
        let piece = full[prefix.len()..].to_string();
        self.prefix_start = self.emitted_end;
        self.emitted_end = self.ids.len();
        Ok(piece)
    }

    /// Text still held back (an incomplete character at the end of generation).
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String, GenerateError> {
        let prefix = tok.decode(
            &self.ids[self.prefix_start..self.emitted_end],
            self.skip_special,
        )?;
        let full = tok.decode(&self.ids[self.prefix_start..], self.skip_special)?;
        self.prefix_start = self.ids.len();
        self.emitted_end = self.ids.len();
        Ok(full.get(prefix.len()..).unwrap_or_default().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::{byte_fallback, byte_level_byte, byte_level_char};

    #[test]
    fn gpt2_byte_alphabet_maps_back_to_bytes() {
        assert_eq!(byte_level_byte('a'), Some(b'a'));
        // Space, newline and the soft hyphen are spelled past U+00FF.
        assert_eq!(byte_level_byte('Ġ'), Some(b' '));
        assert_eq!(byte_level_byte('Ċ'), Some(b'\n'));
        assert_eq!(byte_level_byte('\u{100}'), Some(0));
        assert_eq!(byte_level_byte('\u{143}'), Some(0xAD));
        assert_eq!(byte_level_byte('\u{144}'), None);
        assert_eq!(byte_level_byte(' '), None);
        assert_eq!(byte_level_byte('▁'), None);
        // 'ð' 'Ł' 'Ĳ' 'ī' is how byte-level BPE spells 🐉 (F0 9F 90 89).
        let dragon: Option<Vec<u8>> = "ðŁĲī".chars().map(byte_level_byte).collect();
        assert_eq!(dragon.as_deref(), Some("🐉".as_bytes()));
        // All 256 bytes have exactly one spelling.
        let mut seen = [false; 256];
        for code in 0..0x200u32 {
            if let Some(b) = char::from_u32(code).and_then(byte_level_byte) {
                assert!(!seen[b as usize], "byte {b} spelled twice");
                seen[b as usize] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
        for b in 0..=u8::MAX {
            assert_eq!(byte_level_byte(byte_level_char(b)), Some(b));
        }
    }

    #[test]
    fn byte_fallback_tokens_name_their_byte() {
        assert_eq!(byte_fallback("<0xE2>"), Some(0xE2));
        assert_eq!(byte_fallback("<0x0A>"), Some(b'\n'));
        assert_eq!(byte_fallback("<0xE2"), None);
        assert_eq!(byte_fallback("<0x123>"), None);
        assert_eq!(byte_fallback("<|im_end|>"), None);
    }
}
