//! A completion request: its prompts (a string, ids, or a batch of either) and what
//! evaluation harnesses ask of them (`echo`, prompt log-probabilities, `max_tokens: 0`).

use oxgen::Prompt;
use serde::Deserialize;
use serde_json::Value;

use super::{Bounds, MAX_TOP_LOGPROBS, Request, constraint, count, parse};
use crate::error::ApiError;

const COMPLETION_FIELDS: &[&str] = &["prompt", "logprobs", "echo", "prompt_logprobs", "best_of"];

#[derive(Deserialize)]
struct CompletionFields {
    prompt: Value,
    logprobs: Option<i64>,
    echo: Option<bool>,
    prompt_logprobs: Option<i64>,
    best_of: Option<i64>,
}

/// `POST /v1/completions`: the prompt is a string or token ids, or a batch of either (one
/// choice per prompt and `n`). `echo` puts the prompt before each choice's text, with its
/// log-probabilities first when `logprobs` is given; `max_tokens` may be 0.
pub fn completion(body: &[u8], bounds: &Bounds, strict: bool) -> Result<Request, ApiError> {
    let (value, common, fields, mut unknown) =
        parse::<CompletionFields>(body, COMPLETION_FIELDS, strict)?;
    let prompts = completion_prompts(fields.prompt, bounds.vocab)?;
    let top_logprobs = fields
        .logprobs
        .map(|n| count("logprobs", n, 0, MAX_TOP_LOGPROBS))
        .transpose()?;
    let n = common.n.unwrap_or(1);
    if let Some(best_of) = fields.best_of.filter(|&b| b != n) {
        return Err(ApiError::invalid(
            "best_of",
            format!("best_of {best_of} is not supported: only best_of equal to n ({n})"),
        ));
    }
    let echo = fields.echo.unwrap_or(false);
    if fields.prompt_logprobs.is_some() && common.stream == Some(true) {
        return Err(ApiError::invalid(
            "prompt_logprobs",
            "prompt_logprobs is not streamed: send stream: false, or echo with logprobs",
        ));
    }
    let prompt_logprobs = match (fields.prompt_logprobs, echo, top_logprobs) {
        (Some(k), _, _) => Some(count("prompt_logprobs", k, 0, MAX_TOP_LOGPROBS)?),
        (None, true, Some(k)) => Some(k),
        _ => None,
    };
    let max_tokens = (common.max_tokens, 0);
    let mut request =
        common.into_request(prompts, max_tokens, top_logprobs, bounds, &mut unknown)?;
    if request.prompts.len() * request.n > bounds.max_n {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "{} prompts of n = {} are {} choices; this server runs at most {} at once \
                 (--max-batch): send fewer prompts per request",
                request.prompts.len(),
                request.n,
                request.prompts.len() * request.n,
                bounds.max_n
            ),
        ));
    }
    request.constraint = constraint(&value)?;
    request.strict_schema = super::strict_schema(&value);
    request.echo = echo;
    request.prompt_logprobs = prompt_logprobs;
    request.ignored = unknown.names;
    Ok(request)
}

/// A completion's prompts: a string, token ids, or a non-empty list of strings or of
/// token-id lists.
fn completion_prompts(prompt: Value, vocab: usize) -> Result<Vec<Prompt>, ApiError> {
    let ids = |items: &[Value], at: &str| {
        items
            .iter()
            .map(|v| {
                v.as_u64()
                    .filter(|&id| (id as usize) < vocab)
                    .map(|id| id as u32)
            })
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| {
                ApiError::invalid(
                    at,
                    format!("{at}: token ids must be integers below {vocab}"),
                )
            })
    };
    let bad = |at: &str| {
        ApiError::invalid(
            at,
            format!(
                "{at} must be a string, an array of token ids, or a non-empty array of strings \
                 or of token-id arrays"
            ),
        )
    };
    match prompt {
        Value::String(s) => Ok(vec![Prompt::Text(s)]),
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_number) => {
            Ok(vec![Prompt::Tokens(ids(&items, "prompt")?)])
        }
        Value::Array(items) if !items.is_empty() => (items.into_iter().enumerate())
            .map(|(i, item)| {
                let at = format!("prompt[{i}]");
                match item {
                    Value::String(s) => Ok(Prompt::Text(s)),
                    Value::Array(ids_) => Ok(Prompt::Tokens(ids(&ids_, &at)?)),
                    _ => Err(bad(&at)),
                }
            })
            .collect(),
        _ => Err(bad("prompt")),
    }
}
