//! Prompts to token ids and back, shareable across threads (a server tokenizes requests on
//! its HTTP threads while the model runs elsewhere).

use std::sync::Arc;

use oxgen_generate::{ChatTemplate, Tokenizer};

use crate::{Error, Prompt};

/// A package's tokenizer and chat template; cloning shares them.
#[derive(Clone)]
pub struct Encoder {
    tokenizer: Arc<Tokenizer>,
    template: Option<Arc<ChatTemplate>>,
}

impl Encoder {
    pub(crate) fn new(tokenizer: Tokenizer, template: Option<ChatTemplate>) -> Encoder {
        Encoder {
            tokenizer: Arc::new(tokenizer),
            template: template.map(Arc::new),
        }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The token ids a prompt becomes.
    pub fn encode(&self, prompt: &Prompt) -> Result<Vec<u32>, Error> {
        match prompt {
            Prompt::Tokens(ids) => Ok(ids.clone()),
            Prompt::Text(text) => Ok(self.tokenizer.encode(text, false)?),
            Prompt::Chat(messages) => {
                let template = self.template.as_ref().ok_or_else(|| Error::Package {
                    path: "tokenizer_config.json".into(),
                    reason: "the package has no chat_template; send the prompt as raw text".into(),
                })?;
                let text = template.render(messages, true)?;
                Ok(self.tokenizer.encode(&text, false)?)
            }
        }
    }

    /// The text of `ids`, special tokens included unless `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, Error> {
        Ok(self.tokenizer.decode(ids, skip_special)?)
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
        let text = self.tokenizer.decode(&[id], false).unwrap_or_default();
        let raw = self.tokenizer.id_to_token(id).and_then(|token| {
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

#[cfg(test)]
mod tests {
    use super::{byte_fallback, byte_level_byte};

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
