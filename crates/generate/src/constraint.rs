//! Structured output: grammars that constrain a sequence's tokens, enforced as the first
//! logits processor of its sampling chain.
//!
//! Built on llguidance (an Earley parser over a lexer of derivative-based regexes) and its
//! token trie, `toktrie`. A [`Grammars`] is made once per tokenizer: the trie of every token's
//! bytes, and llguidance's parser factory over it. [`Grammars::compile`] turns a
//! [`Constraint`] (a JSON schema, any JSON object, a regex, a Lark grammar, a list of choices)
//! into a [`Grammar`], cached by its text; each sequence gets its own matcher from it
//! ([`GrammarMask`]), which masks the logits row before every other processor, so no later
//! step (bias, penalties, sampling) can pick a token the grammar forbids.
//!
//! **Fail closed.** A constraint that does not compile is an error before any token is
//! generated; a matcher that reaches an error state ends the sequence with an error, never
//! with unconstrained text. End-of-sequence ids are allowed only where the grammar accepts.
//!
//! References: llguidance's `Matcher` (the server-side API) and its syntax docs
//! (`docs/syntax.md`: the Lark dialect, `%json` and regex forms).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{self, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory, TokenParser};

use crate::closing::Closer;
use crate::processors::{History, LogitsProcessor, ProcessorState};
use crate::{GenerateError, Tokenizer};

/// Compiled grammars kept for reuse, most recent last.
const CACHE_SIZE: usize = 64;

/// What a constrained sequence must produce.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Text valid against a JSON schema (the draft 2020-12 subset llguidance supports:
    /// `$ref`, `enum`, `anyOf`, `pattern`, numeric bounds, `additionalProperties`, ...).
    JsonSchema(serde_json::Value),
    /// Any JSON object.
    JsonObject,
    /// Text matching a regular expression (Rust `regex` syntax), whole.
    Regex(String),
    /// A grammar in llguidance's Lark dialect (`start: ...`).
    Lark(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
}

/// Whitespace a JSON constraint allows between tokens: one space, or a line break and up to
/// 20 blanks of indentation (compact and pretty-printed JSON both fit). Unbounded whitespace
/// would let a model stall in blanks until `max_tokens`.
const JSON_WHITESPACE: &str = r"( |\r?\n[ \t]{0,20})";

/// `schema` as oxgen compiles it: the `format`s llguidance does not enforce dropped (they
/// are annotations; see [`crate::schema::drop_unknown_formats`]), a `oneOf` of distinct
/// types as the `anyOf` it equals ([`crate::schema::exclusive_one_of`]), and oxgen's whitespace
/// rule unless it sets its own llguidance options (`x-guidance`).
pub fn for_grammar(schema: &serde_json::Value) -> serde_json::Value {
    let (mut schema, _) = crate::schema::drop_unknown_formats(schema);
    crate::schema::exclusive_one_of(&mut schema);
    if let Some(map) = schema.as_object_mut() {
        map.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_pattern": JSON_WHITESPACE}));
    }
    schema
}

impl Constraint {
    /// The JSON schema of a JSON constraint, with its whitespace bounded.
    pub(crate) fn json_schema(&self) -> Option<serde_json::Value> {
        match self {
            Constraint::JsonSchema(schema) => Some(for_grammar(schema)),
            Constraint::JsonObject => Some(for_grammar(&serde_json::json!({"type": "object"}))),
            _ => None,
        }
    }

    /// llguidance's grammar for it, and the text it is cached by.
    fn grammar(&self) -> Result<(TopLevelGrammar, String), GenerateError> {
        Ok(match self {
            Constraint::JsonSchema(schema) => {
                let key = format!("json_schema:{schema}");
                let schema = self.json_schema().expect("a JSON constraint");
                (TopLevelGrammar::from_json_schema(schema), key)
            }
            Constraint::JsonObject => {
                let schema = self.json_schema().expect("a JSON constraint");
                (
                    TopLevelGrammar::from_json_schema(schema),
                    "json_object".into(),
                )
            }
            Constraint::Regex(rx) => (TopLevelGrammar::from_regex(rx), format!("regex:{rx}")),
            Constraint::Lark(lark) => (
                TopLevelGrammar::from_lark(lark.clone()),
                format!("lark:{lark}"),
            ),
            Constraint::Choice(choices) => {
                if choices.is_empty() {
                    return Err(GenerateError::Constraint(
                        "a choice constraint needs at least one choice".into(),
                    ));
                }
                // Lark string literals take JSON's escapes.
                let alternatives: Vec<String> = (choices.iter())
                    .map(|c| serde_json::Value::String(c.clone()).to_string())
                    .collect();
                let lark = format!("start: {}", alternatives.join(" | "));
                let key = format!("choice:{lark}");
                (TopLevelGrammar::from_lark(lark), key)
            }
        })
    }
}

/// oxgen's tokenizer as llguidance sees it: the trie of every token's bytes (special tokens
/// as `0xFF` then their text, toktrie's convention) and tokenization of bytes.
struct TokenizerAdapter {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for TokenizerAdapter {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<toktrie::TokenId> {
        // Only whole characters reach the tokenizer; a trailing partial one is left to the
        // trie's greedy split.
        let text = String::from_utf8_lossy(s);
        self.tokenizer.encode(&text, false).unwrap_or_default()
    }
}

/// The grammar compiler of one tokenizer: its token trie and parser factory (built once, at
/// model load), and an LRU of compiled grammars shared by every sequence.
pub struct Grammars {
    factory: ParserFactory,
    /// The vocabulary's single-byte tokens, for closing a text early.
    closer: Arc<Closer>,
    /// The package's end-of-sequence ids; the trie knows the first.
    eos: Vec<u32>,
    vocab: usize,
    /// By text: the parser, and whether its text can be closed early from the start.
    cache: Mutex<VecDeque<(String, Arc<TokenParser>, bool)>>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars")
            .field("vocab", &self.vocab)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl Grammars {
    /// Builds the token trie of `tokenizer` for logits rows of `vocab` ids (at least the
    /// tokenizer's; ids past it can never be chosen) whose end-of-sequence ids are `eos`.
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        vocab: usize,
        eos: &[u32],
    ) -> Result<Grammars, GenerateError> {
        let vocab = vocab.max(tokenizer.vocab_size());
        let Some(&first_eos) = eos.first() else {
            return Err(GenerateError::Constraint(
                "the package names no end-of-sequence token, so a grammar cannot end".into(),
            ));
        };
        let words: Vec<Vec<u8>> = (0..vocab as u32)
            .map(|id| match tokenizer.special_token(id) {
                Some(text) => [&[TokTrie::SPECIAL_TOKEN_MARKER], text.as_bytes()].concat(),
                None if (id as usize) < tokenizer.vocab_size() => tokenizer.token_bytes(id),
                None => Vec::new(),
            })
            .collect();
        let info = TokRxInfo::new(vocab as u32, first_eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(TokenizerAdapter { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env).map_err(constraint_error)?;
        factory.quiet();
        let closer = Arc::new(Closer::new(env.tok_trie()));
        Ok(Grammars {
            closer,
            factory,
            eos: eos.to_vec(),
            vocab,
            cache: Mutex::new(VecDeque::new()),
        })
    }

    /// Compiles `constraint`, or takes it from the cache. Fails with llguidance's message
    /// when it does not compile (an invalid schema or regex, an unsupported keyword, an
    /// empty language).
    pub fn compile(&self, constraint: &Constraint) -> Result<Grammar, GenerateError> {
        let (grammar, key) = constraint.grammar()?;
        {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = cache.iter().position(|(k, _, _)| *k == key) {
                let entry = cache.remove(i).expect("the index was just found");
                let (parser, closable) = (entry.1.clone(), entry.2);
                cache.push_back(entry);
                return Ok(self.grammar(parser, closable));
            }
        }
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(constraint_error)?;
        // A grammar whose language is empty compiles but can never produce anything.
        let mut probe = Matcher::new(Ok(parser.clone()));
        let mask = probe.compute_mask().map_err(constraint_error)?;
        if mask.is_zero() && !probe.is_accepting().unwrap_or(false) {
            return Err(GenerateError::Constraint(
                "the grammar accepts no text at all".into(),
            ));
        }
        // Whether a reply can be closed early: a closing is found from the start.
        let closable = self.closer.find(&probe, &mut Vec::new());
        let parser = Arc::new(parser);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_SIZE {
            cache.pop_front();
        }
        cache.push_back((key, parser.clone(), closable));
        Ok(self.grammar(parser, closable))
    }

    fn grammar(&self, parser: Arc<TokenParser>, closable: bool) -> Grammar {
        Grammar {
            parser,
            closable,
            eos: self.eos.clone().into(),
            trie_eos: self.factory.tok_env().tok_trie().info().tok_eos,
            env: self.factory.tok_env().clone(),
            closer: self.closer.clone(),
            close: true,
        }
    }
}

/// llguidance's message on one line (its regex errors draw a caret under the text).
fn constraint_error(e: impl std::fmt::Display) -> GenerateError {
    let text = e.to_string();
    GenerateError::Constraint(text.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// A compiled grammar: cheap to clone, one matcher per sequence from it.
#[derive(Clone)]
pub struct Grammar {
    parser: Arc<TokenParser>,
    eos: Arc<[u32]>,
    trie_eos: u32,
    env: TokEnv,
    closer: Arc<Closer>,
    /// Close the text before the sequence's room runs out ([`Grammar::closing`]).
    close: bool,
    /// A closing can be found from the start ([`Grammar::closable`]).
    closable: bool,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").finish_non_exhaustive()
    }
}

impl Grammar {
    /// A fresh matcher, at the start of the grammar.
    pub fn mask(&self) -> GrammarMask {
        GrammarMask {
            grammar: self.clone(),
            matcher: Matcher::new(Ok((*self.parser).clone())),
            room: None,
            need: None,
            // The first choice looks for the closing.
            unchecked: CHECK_EVERY,
            closing: false,
            closed: false,
            close: Vec::new(),
            kept: Vec::new(),
        }
    }

    /// Whether a sequence's text is closed (the grammar completed by the shortest text
    /// found) when the ids it may still generate come down to what that takes; on by
    /// default. The sequence then ends with [`ProcessorState::Closed`]: its finish reason
    /// says the limit ended it.
    pub fn closing(mut self, close: bool) -> Grammar {
        self.close = close;
        self
    }

    /// Whether a reply under it can be closed early: found at compile time by looking for
    /// the closing from the grammar's start (`false` for a grammar whose end single-byte
    /// tokens cannot reach within the search's 256 bytes, such as markers that are special
    /// tokens or a regex like `(ab){200}`: its replies are cut where the limit falls).
    pub fn closable(&self) -> bool {
        self.closable
    }
}

/// While a sequence has more room than its last closing needs and this much more, the
/// closing is looked for only every [`CHECK_EVERY`] ids; within it, at every id, with the
/// choice narrowed to the [`TOP`] likeliest tokens that leave room to close.
const NEAR: usize = 32;
const CHECK_EVERY: usize = 16;
const TOP: usize = 8;

/// The `k` ids with the largest finite logits, largest first, into `out`.
fn top_finite(logits: &[f32], k: usize, out: &mut Vec<(u32, f32)>) {
    out.clear();
    for (id, &v) in logits.iter().enumerate() {
        if !v.is_finite() || (out.len() == k && v <= out[k - 1].1) {
            continue;
        }
        let at = out.partition_point(|&(_, w)| w >= v);
        if out.len() == k {
            out.pop();
        }
        out.insert(at, (id as u32, v));
    }
}

/// The processor that enforces a grammar on one sequence: ids the grammar does not allow
/// next become −inf; end-of-sequence ids only where the grammar accepts.
pub struct GrammarMask {
    grammar: Grammar,
    matcher: Matcher,
    /// Ids the sequence may still generate, this one's choice included (set before each
    /// choice by [`LogitsProcessor::room`]).
    room: Option<usize>,
    /// The last closing's length in tokens (`None`: none found, or not looked for yet).
    need: Option<usize>,
    /// Choices since it was looked for.
    unchecked: usize,
    /// The room is down to the closing: only tokens that spell a prefix of it are allowed.
    closing: bool,
    /// The grammar was completed while closing.
    closed: bool,
    /// The closing text, and the logits kept while restricting a row to it (scratch).
    close: Vec<u8>,
    kept: Vec<(u32, f32)>,
}

impl std::fmt::Debug for GrammarMask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarMask")
            .field("error", &self.matcher.get_error())
            .finish_non_exhaustive()
    }
}

impl LogitsProcessor for GrammarMask {
    fn apply(&mut self, logits: &mut [f32], _: &History) {
        let mut mask = match self.matcher.compute_mask_or_eos() {
            Ok(mask) => mask,
            // The error is kept by the matcher: the sequence ends with it (`state`). Until
            // then nothing may be chosen.
            Err(_) => {
                logits.fill(f32::NEG_INFINITY);
                return;
            }
        };
        // Every end-of-sequence id where the grammar accepts (the trie knows only one).
        let eos_ok = mask.is_allowed(self.grammar.trie_eos);
        for &id in self.grammar.eos.iter() {
            if (id as usize) < mask.len() {
                mask.set(id as usize, eos_ok);
            }
        }
        // 32 ids per mask word: most words are all forbidden or all allowed.
        for (&word, chunk) in mask.as_slice().iter().zip(logits.chunks_mut(32)) {
            match word {
                u32::MAX => {}
                0 => chunk.fill(f32::NEG_INFINITY),
                _ => {
                    for (bit, v) in chunk.iter_mut().enumerate() {
                        if word & (1 << bit) == 0 {
                            *v = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
        // Ids past the trie (a logits row wider than the vocabulary) are never allowed.
        if let Some(tail) = logits.get_mut(mask.len()..) {
            tail.fill(f32::NEG_INFINITY);
        }
        self.close_within_room(logits);
    }

    fn room(&mut self, left: usize) {
        if self.grammar.close {
            self.room = Some(left);
        }
    }

    fn accept(&mut self, id: u32) {
        if self.grammar.eos.contains(&id) {
            self.closed |= self.closing;
            return;
        }
        // A refused token puts the matcher in its error state, which `state` reports.
        let _ = self.matcher.consume_token(id);
    }

    fn reset(&mut self, _: &[u32]) {
        self.matcher = Matcher::new(Ok((*self.grammar.parser).clone()));
    }

    fn state(&self) -> ProcessorState {
        if let Some(e) = self.matcher.get_error() {
            ProcessorState::Failed(e)
        } else if self.closed || (self.closing && self.matcher.is_stopped()) {
            ProcessorState::Closed
        } else if self.matcher.is_stopped() {
            ProcessorState::Complete
        } else {
            ProcessorState::Running
        }
    }
}

impl GrammarMask {
    /// Keeps the text closable within the room left. The shortest closing is looked for at
    /// the first choice and every [`CHECK_EVERY`] after (also where none was found), and at
    /// every choice once the room is within [`NEAR`] tokens of it; there the choice is
    /// narrowed to the [`TOP`] likeliest tokens that leave room to close after them (an
    /// end-of-sequence id always does), and when none does, to the closing text itself, to
    /// the end.
    fn close_within_room(&mut self, logits: &mut [f32]) {
        let Some(room) = self.room else {
            return;
        };
        if self.matcher.is_stopped() {
            return;
        }
        let near = self.closing || self.need.is_some_and(|need| room <= need + 1 + NEAR);
        if !near && self.unchecked < CHECK_EVERY {
            self.unchecked += 1;
            return;
        }
        self.unchecked = 0;
        let found = self.grammar.closer.find(&self.matcher, &mut self.close);
        // In tokens: the closing as its longest tokens spell it (what `restrict` writes).
        let trie = self.grammar.env.tok_trie();
        self.need = found.then(|| trie.greedy_tokenize(&self.close).len());
        let Some(need) = self.need else {
            return;
        };
        if !self.closing && room > need + 1 + NEAR {
            return;
        }
        if !self.closing && self.keep_safe(logits, room) {
            return;
        }
        self.closing = true;
        self.restrict(logits);
    }

    /// Leaves allowed the likeliest tokens after which the text can still close within the
    /// room (the token, its closing, an end-of-sequence id); `false` when none can.
    fn keep_safe(&mut self, logits: &mut [f32], room: usize) -> bool {
        top_finite(logits, TOP, &mut self.kept);
        let mut after = Vec::new();
        let (eos, closer) = (&self.grammar.eos, &self.grammar.closer);
        let trie = self.grammar.env.tok_trie();
        let matcher = &self.matcher;
        self.kept.retain(|&(id, _)| {
            if eos.contains(&id) {
                return true;
            }
            let mut m = matcher.clone();
            m.consume_token(id).is_ok()
                && closer.find(&m, &mut after)
                && trie.greedy_tokenize(&after).len() + 2 <= room
        });
        if self.kept.is_empty() {
            return false;
        }
        logits.fill(f32::NEG_INFINITY);
        for &(id, v) in &self.kept {
            logits[id as usize] = v;
        }
        true
    }

    /// Leaves allowed only the longest token that spells a prefix of the closing text (an
    /// end-of-sequence id where the grammar already accepts): the text that follows is the
    /// closing either way, in as few tokens as the vocabulary spells it.
    fn restrict(&mut self, logits: &mut [f32]) {
        self.kept.clear();
        let trie = self.grammar.env.tok_trie();
        let keep = |id: u32, kept: &mut Vec<(u32, f32)>| {
            if let Some(&v) = logits.get(id as usize).filter(|v| v.is_finite()) {
                kept.push((id, v));
            }
        };
        if self.close.is_empty() {
            for &id in self.grammar.eos.iter() {
                keep(id, &mut self.kept);
            }
        }
        if let Some(id) = (1..=self.close.len()).rev().find_map(|end| {
            trie.token_id(&self.close[..end])
                .filter(|&id| logits[id as usize].is_finite())
        }) {
            keep(id, &mut self.kept);
        }
        if self.kept.is_empty() {
            // Nothing of the closing is allowed as a token (a tokenizer without the byte):
            // the row stays as the grammar masked it.
            return;
        }
        logits.fill(f32::NEG_INFINITY);
        for &(id, v) in &self.kept {
            logits[id as usize] = v;
        }
    }
}
