//! Closing a constrained reply within its limit: the shortest text that completes the
//! grammar from a matcher's state, found by walking single-byte tokens, so that a JSON
//! schema, a tool call or a bounded grammar always ends complete when `max_tokens` (or the
//! context) runs out.
//!
//! The walk takes, at each step, the first byte of a fixed preference order the grammar
//! allows: `"` while a string is open (it is allowed where a closing bracket is too, which
//! only happens inside a string), else closing brackets before anything that opens, the
//! shortest values (`0`, `""`, `false`, `null`), then letters (a key or an enum member the
//! grammar asks for), then the other printable bytes; a byte taken [`MAX_RUN`] times
//! running is passed over (a number's digits could go on). For JSON this walks straight to
//! the end: strings close, objects and arrays close once their required members are there,
//! and required members get the shortest values. A grammar whose end this order cannot
//! reach within [`MAX_CLOSE`] bytes (markers that are special tokens, a regex like
//! `(ab){200}`) has no closing found, and its reply is not closed early.
//!
//! What a close needs is that text in tokens, each the longest token that spells the next of
//! it (every byte has one of its own, so it always can). [`crate::GrammarMask`] checks it
//! as the room left shrinks and, once the room is down to it, writes the closing text so.

use llguidance::Matcher;
use llguidance::toktrie::TokTrie;

/// Bytes of closing text searched at most.
pub(crate) const MAX_CLOSE: usize = 256;

/// The preference order of bytes, after the rule for `"` (module doc).
const ORDER: &[u8] = b"}])\"0:,ftnlrueasbcdghijkmopqvwxyz1-.>/<_ \nABCDEFGHIJKLMNOPQRSTUVWXYZ23456789[{!#$%&'(*+;=?@\\^`|~\t";

/// A byte taken this many times in a row is passed over for the next the grammar allows
/// (a number's digits, say, which could go on without end).
const MAX_RUN: usize = 8;

/// The single-byte tokens of a vocabulary in the preference order.
#[derive(Debug, Clone)]
pub(crate) struct Closer {
    /// (byte, its token), in [`ORDER`].
    alphabet: Vec<(u8, u32)>,
}

impl Closer {
    pub(crate) fn new(trie: &TokTrie) -> Closer {
        let alphabet = (ORDER.iter())
            .filter_map(|&b| trie.token_id(&[b]).map(|t| (b, t)))
            .collect();
        Closer { alphabet }
    }

    fn token(&self, byte: u8) -> Option<u32> {
        self.alphabet
            .iter()
            .find(|(b, _)| *b == byte)
            .map(|(_, t)| *t)
    }

    /// Writes to `out` the closing text found from `matcher`'s state (empty where the grammar
    /// already accepts); `false` when none was found within [`MAX_CLOSE`] bytes.
    pub(crate) fn find(&self, matcher: &Matcher, out: &mut Vec<u8>) -> bool {
        out.clear();
        let mut m = matcher.clone();
        let allows = |m: &mut Matcher, t: Option<u32>| {
            t.is_some_and(|t| m.validate_tokens(&[t]).is_ok_and(|n| n == 1))
        };
        let (quote, brace, bracket) = (self.token(b'"'), self.token(b'}'), self.token(b']'));
        while out.len() < MAX_CLOSE {
            if m.is_accepting().unwrap_or(false) {
                return true;
            }
            let in_string =
                allows(&mut m, quote) && (allows(&mut m, brace) || allows(&mut m, bracket));
            let last = out.last().copied();
            let run = out.iter().rev().take_while(|&&b| Some(b) == last).count();
            let next = if in_string && (last != Some(b'"') || run < MAX_RUN) {
                quote.map(|t| (b'"', t))
            } else {
                (self.alphabet.iter().copied())
                    .filter(|&(b, _)| run < MAX_RUN || Some(b) != last)
                    .find(|&(_, t)| allows(&mut m, Some(t)))
            };
            let Some((byte, token)) = next else {
                return false;
            };
            if m.consume_token(token).is_err() {
                return false;
            }
            out.push(byte);
        }
        false
    }
}
