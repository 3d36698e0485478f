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
        let inner =
            tokenizers::Tokenizer::from_file(path).map_err(|e| GenerateError::Tokenizer {
                path: shown.clone(),
                reason: format!("{e} (is it a Hugging Face tokenizer.json?)"),
            })?;
        Ok(Tokenizer { inner, path: shown })
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

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
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
