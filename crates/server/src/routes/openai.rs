//! OpenAI's completion objects as types: a `chat.completion`, its stream's
//! `chat.completion.chunk`s and a `text_completion`, with their choices, messages, deltas,
//! log-probabilities and usage. `response.rs` fills them from the engine's events.

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use oxgen::engine::Counts;

/// A whole response or one chunk of a stream.
#[derive(Serialize)]
pub(super) struct Completion<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    /// Always `null`: no fingerprint is kept.
    pub system_fingerprint: Option<&'static str>,
    pub choices: Vec<Choice>,
    #[serde(skip_serializing_if = "UsageField::is_absent")]
    pub usage: UsageField,
}

/// `usage` as a response has it: absent (a chunk of a stream that did not ask for usage),
/// `null` (every other chunk of one that did), or the counts.
pub(super) enum UsageField {
    Absent,
    Null,
    Counts(Usage),
}

impl UsageField {
    fn is_absent(&self) -> bool {
        matches!(self, UsageField::Absent)
    }
}

impl Serialize for UsageField {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            UsageField::Counts(u) => u.serialize(s),
            _ => s.serialize_none(),
        }
    }
}

/// One choice: its message (a whole chat reply), delta (a chat chunk) or text (completions).
#[derive(Serialize)]
pub(super) struct Choice {
    pub index: usize,
    #[serde(flatten)]
    pub body: Body,
    pub logprobs: Logprobs,
    pub finish_reason: Option<&'static str>,
    /// vLLM's: `null` for the first prompt id, then each id's and the likeliest ones', keyed
    /// by id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<Option<Keyed<PromptLogprob>>>>,
}

#[derive(Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Body {
    Message(Message),
    Delta(Delta),
    Text(String),
}

/// A whole chat reply.
#[derive(Serialize)]
pub(super) struct Message {
    pub role: &'static str,
    /// `null` only when the reply is all tool calls.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// A call of a whole reply.
#[derive(Serialize)]
pub(super) struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: Function,
}

#[derive(Serialize)]
pub(super) struct Function {
    pub name: String,
    /// JSON text.
    pub arguments: String,
}

/// A piece of a streamed chat reply: the role first, then content, reasoning or a call's
/// start and arguments; empty in a finish chunk.
#[derive(Serialize, Default)]
pub(super) struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<DeltaCall>,
}

/// A call's start (index, id, type, name, empty arguments) or more of its arguments (index
/// and arguments alone).
#[derive(Serialize)]
pub(super) struct DeltaCall {
    pub index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: DeltaFunction,
}

#[derive(Serialize)]
pub(super) struct DeltaFunction {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

/// A choice's `logprobs`: `null` unless asked for, then in its endpoint's shape.
#[derive(Serialize, Default)]
#[serde(untagged)]
pub(super) enum Logprobs {
    #[default]
    None,
    Chat {
        content: Vec<TokenLogprob>,
    },
    Completion(CompletionLogprobs),
}

impl Logprobs {
    pub fn is_none(&self) -> bool {
        matches!(self, Logprobs::None)
    }

    /// Two completions `logprobs` objects as one: `more`'s entries after these.
    pub fn then(self, more: Logprobs) -> Logprobs {
        match (self, more) {
            (Logprobs::Completion(mut a), Logprobs::Completion(b)) => {
                a.tokens.extend(b.tokens);
                a.token_logprobs.extend(b.token_logprobs);
                a.top_logprobs.extend(b.top_logprobs);
                a.text_offset.extend(b.text_offset);
                Logprobs::Completion(a)
            }
            (a, _) => a,
        }
    }
}

/// A chat token's log-probability, with its likeliest alternatives (which have none of
/// their own).
#[derive(Serialize)]
pub(super) struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Vec<TokenLogprob>>,
}

/// Completions' log-probabilities, one entry per token in each array (`null` for a
/// prompt's first id, which has none); `top_logprobs` keyed by token text.
#[derive(Serialize, Default)]
pub(super) struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<Option<f32>>,
    pub top_logprobs: Vec<Option<Keyed<f32>>>,
    pub text_offset: Vec<usize>,
}

/// `usage`, with the prompt tokens the prefix cache served and, for chat, the tokens spent
/// reasoning and a prediction's.
#[derive(Serialize)]
pub(super) struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptDetails,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Serialize)]
pub(super) struct PromptDetails {
    pub cached_tokens: usize,
}

#[derive(Serialize)]
pub(super) struct CompletionDetails {
    pub reasoning_tokens: usize,
    pub accepted_prediction_tokens: usize,
    pub rejected_prediction_tokens: usize,
}

impl Usage {
    /// The counts of a finished request; `reasoning_tokens` for chat.
    pub fn new(counts: Counts, reasoning_tokens: Option<usize>) -> Usage {
        Usage {
            prompt_tokens: counts.prompt_tokens,
            completion_tokens: counts.completion_tokens,
            total_tokens: counts.prompt_tokens + counts.completion_tokens,
            prompt_tokens_details: PromptDetails {
                cached_tokens: counts.cached_tokens,
            },
            completion_tokens_details: reasoning_tokens.map(|reasoning_tokens| CompletionDetails {
                reasoning_tokens,
                accepted_prediction_tokens: counts.accepted_prediction_tokens,
                rejected_prediction_tokens: counts.rejected_prediction_tokens,
            }),
        }
    }
}

/// A prompt id's log-probability as vLLM reports it.
#[derive(Serialize)]
pub(super) struct PromptLogprob {
    pub logprob: f32,
    /// Its rank among the likeliest ids, where it is among them.
    pub rank: Option<usize>,
    pub decoded_token: String,
}

/// A JSON object in insertion order whose first value for a key stands.
pub(super) struct Keyed<T>(Vec<(String, T)>);

impl<T> Keyed<T> {
    pub fn new() -> Keyed<T> {
        Keyed(Vec::new())
    }

    /// Adds `key` unless it is there already (the value is made only then).
    pub fn first(&mut self, key: String, value: impl FnOnce() -> T) {
        if !self.0.iter().any(|(k, _)| *k == key) {
            self.0.push((key, value()));
        }
    }
}

impl<T: Serialize> Serialize for Keyed<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}
