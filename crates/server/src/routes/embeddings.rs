//! The encoder's endpoints: OpenAI's `POST /v1/embeddings`, and the rerank endpoint llama.cpp,
//! vLLM, Jina and Cohere share (`POST /v1/rerank`, `/rerank`, `/v2/rerank`). A request is
//! parsed and tokenized here (each input checked against the model's limits, a refusal
//! naming its field), then queued for the encoder's thread
//! ([`oxgen::embed::serve`]), which runs every waiting request's sequences in one turn.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use oxgen::embed::{
    EmbedInput, EmbedJob, EmbedOutput, EmbedQueue, EmbedSink, EmbedTokens, EmbedWork, InputError,
};
use serde::Serialize;
use serde_json::{Map, Value};
use tokio::sync::oneshot;

use super::http::body;
use crate::App;
use crate::api::{self, Unknown};
use crate::error::{ApiError, Protocol};
use crate::models::Lease;

/// The most inputs (or documents) one request may hold (OpenAI's limit for embeddings).
pub const MAX_INPUTS: usize = 2048;

/// `POST /v1/embeddings`: `input` a string, a list of strings, a list of token ids or a list
/// of such lists; `encoding_format` `float` (default) or `base64` (little-endian f32);
/// `dimensions` keeps the first values and renormalizes (Matryoshka models); `truncate`
/// (oxgen's, default false) cuts inputs longer than the model takes instead of refusing them.
pub(super) async fn embeddings(State(app): State<Arc<App>>, request: Request) -> Response {
    let result = async {
        let (lease, map) = body_of(
            &app,
            request,
            &[
                "model",
                "input",
                "encoding_format",
                "dimensions",
                "user",
                "truncate",
                "keep_alive",
            ],
        )
        .await?;
        let (loaded, queue) = lease.encoder()?;
        let inputs = inputs(map.get("input"))?;
        let base64 = match map.get("encoding_format") {
            None | Some(Value::Null) => false,
            Some(Value::String(f)) if f == "float" => false,
            Some(Value::String(f)) if f == "base64" => true,
            Some(other) => {
                return Err(ApiError::invalid(
                    "encoding_format",
                    format!("encoding_format is {other}; use \"float\" or \"base64\""),
                ));
            }
        };
        let dim = loaded.dim;
        let dimensions = match map.get("dimensions") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(d) if (1..=dim as u64).contains(&d) => Some(d as usize),
                _ => {
                    return Err(ApiError::invalid(
                        "dimensions",
                        format!("dimensions is {v}; this model gives 1 to {dim} values"),
                    ));
                }
            },
        };
        let truncate = api::boolean("truncate", map.get("truncate"), false)?;
        if !matches!(loaded.kind, oxgen::EncoderKind::Embedding { .. }) {
            return Err(ApiError::invalid(
                "model",
                format!(
                    "'{}' is a reranker (a cross-encoder): it scores query and document pairs \
                     at /v1/rerank and embeds nothing",
                    lease.name
                ),
            ));
        }
        let tokenizer = loaded.tokenizer.clone();
        let tokens = blocking(move || {
            (inputs.iter().enumerate())
                .map(|(i, input)| tokenizer.input(i, input, truncate))
                .collect::<Result<Vec<_>, _>>()
        })
        .await?
        .map_err(|e| refused("input", e))?;
        let used = token_count(&tokens);
        let EmbedOutput::Embeddings(vectors) = run(&app, queue, EmbedWork::Embed(tokens)).await?
        else {
            return Err(ApiError::internal(
                "the encoder answered an embedding with scores",
            ));
        };
        let data = vectors
            .into_iter()
            .enumerate()
            .map(|(index, mut v)| {
                if let Some(d) = dimensions {
                    v.truncate(d);
                    oxgen::embed::normalize_in_place(&mut v);
                }
                Embedding {
                    object: "embedding",
                    index,
                    embedding: match base64 {
                        true => Values::Base64(base64_f32(&v)),
                        false => Values::Float(v),
                    },
                }
            })
            .collect();
        Ok(EmbeddingList {
            object: "list",
            data,
            model: lease.name.clone(),
            usage: Usage {
                prompt_tokens: used,
                total_tokens: used,
            },
        })
    };
    json_reply(result.await)
}

/// `POST /v1/rerank` (and `/rerank`, `/v2/rerank`): `query`, `documents` (strings, or objects
/// with a `text`), `top_n`, `return_documents` (default true), `truncate` → `results`, each
/// an `index` into `documents` with its `relevance_score`, best first.
pub(super) async fn rerank(State(app): State<Arc<App>>, request: Request) -> Response {
    let result = async {
        let known = [
            "model",
            "query",
            "documents",
            "top_n",
            "return_documents",
            "truncate",
            "max_chunks_per_doc",
            "keep_alive",
        ];
        let (lease, map) = body_of(&app, request, &known).await?;
        let (loaded, queue) = lease.encoder()?;
        let query = match map.get("query") {
            Some(Value::String(q)) if !q.is_empty() => q.clone(),
            Some(Value::String(_)) => return Err(ApiError::invalid("query", "query is empty")),
            _ => {
                return Err(ApiError::invalid(
                    "query",
                    "query is required and must be a string",
                ));
            }
        };
        let documents = documents(map.get("documents"))?;
        let top_n = match map.get("top_n") {
            None | Some(Value::Null) => documents.len(),
            Some(v) => match v.as_u64() {
                Some(n) if n >= 1 => (n as usize).min(documents.len()),
                _ => {
                    return Err(ApiError::invalid(
                        "top_n",
                        format!("top_n is {v}; give a positive count"),
                    ));
                }
            },
        };
        let return_documents = api::boolean("return_documents", map.get("return_documents"), true)?;
        let truncate = api::boolean("truncate", map.get("truncate"), false)?;
        let tokenizer = loaded.tokenizer.clone();
        let docs = documents.clone();
        let tokens = blocking(move || tokenizer.rerank(&query, &docs, truncate))
            .await?
            .map_err(|e| refused("documents", e))?;
        let used = token_count(&tokens);
        let EmbedOutput::Scores(scores) = run(&app, queue, EmbedWork::Rerank(tokens)).await? else {
            return Err(ApiError::internal(
                "the encoder answered a reranking with embeddings",
            ));
        };
        let mut order: Vec<usize> = (0..scores.len()).collect();
        // Best first; equal scores keep the documents' order.
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        let results = order
            .into_iter()
            .take(top_n)
            .map(|index| Ranked {
                index,
                relevance_score: scores[index],
                document: return_documents.then(|| Document {
                    text: documents[index].clone(),
                }),
            })
            .collect();
        Ok(Reranked {
            object: "list",
            model: lease.name.clone(),
            results,
            usage: Usage {
                prompt_tokens: used,
                total_tokens: used,
            },
        })
    };
    json_reply(result.await)
}

/// The model the request names, held for it, and the request's body as an object: its
/// fields checked against `known` (unknown ones noted, or refused under `--strict-api`).
async fn body_of(
    app: &Arc<App>,
    request: Request,
    known: &[&str],
) -> Result<(Lease, Map<String, Value>), ApiError> {
    app.accepting()?;
    let body = body(request, app.config.max_body, app.config.body_timeout).await?;
    let map = api::object(&body)?;
    Unknown::new(app.config.strict_api).check(&map, "", &[known])?;
    Ok((app.lease_for(&body).await?, map))
}

/// The reply serialized straight from its struct (floats at their shortest f32 form, no
/// intermediate JSON tree of a large list), or the error in OpenAI's shape.
fn json_reply(result: Result<impl Serialize, ApiError>) -> Response {
    match result {
        Ok(reply) => axum::Json(reply).into_response(),
        Err(e) => e.response(Protocol::OpenAi),
    }
}

/// Runs `work` on the runtime's blocking thread (tokenizing a long list stalls nothing else).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))
}

fn token_count(tokens: &[EmbedTokens]) -> usize {
    tokens.iter().map(|t| t.ids.len()).sum()
}

/// An input the tokenizer refused, as a 400 naming `field[index]`.
fn refused(field: &str, e: InputError) -> ApiError {
    let index = match &e {
        InputError::Empty { index }
        | InputError::TooLong { index, .. }
        | InputError::BadId { index, .. }
        | InputError::Tokenizer { index, .. } => *index,
    };
    let param = format!("{field}[{index}]");
    let message = match e {
        InputError::TooLong { tokens, max, .. } => format!(
            "{param} has {tokens} tokens, more than the model's {max}; shorten it or send \
             \"truncate\": true"
        ),
        InputError::Empty { .. } => format!("{param} is empty (no tokens)"),
        InputError::BadId { id, vocab, .. } => {
            format!("{param} holds token id {id}, outside the vocabulary of {vocab}")
        }
        InputError::Tokenizer { reason, .. } => format!("{param}: {reason}"),
    };
    ApiError::invalid(param, message)
}

/// Queues `work` for the encoder's thread and waits for its answer.
async fn run(app: &App, queue: &EmbedQueue, work: EmbedWork) -> Result<EmbedOutput, ApiError> {
    let (tx, rx) = oneshot::channel();
    let job = EmbedJob {
        work,
        sink: Box::new(Reply(tx)),
    };
    if queue.submit(job).is_err() {
        return Err(match app.phase() {
            crate::Phase::Ready => ApiError::queue_full(app.config.max_queue),
            _ => ApiError::unavailable("shutting_down", "the server is shutting down"),
        });
    }
    rx.await
        .map_err(|_| ApiError::unavailable("shutting_down", "the encoder stopped"))?
        .map_err(|e| ApiError::internal(format!("the encoder failed: {e}")))
}

struct Reply(oneshot::Sender<Result<EmbedOutput, String>>);

impl EmbedSink for Reply {
    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }

    fn send(self: Box<Self>, result: Result<EmbedOutput, String>) {
        // A client that went away takes nothing.
        let _ = self.0.send(result);
    }
}

/// `input` as OpenAI's embeddings endpoint takes it.
fn inputs(value: Option<&Value>) -> Result<Vec<EmbedInput>, ApiError> {
    let shape = "input must be a string, a list of strings, a list of token ids, or a list \
                 of lists of token ids";
    let items = match value {
        Some(Value::String(s)) => return Ok(vec![EmbedInput::Text(s.clone())]),
        Some(Value::Array(items)) => items,
        None | Some(Value::Null) => return Err(ApiError::invalid("input", "input is required")),
        Some(_) => return Err(ApiError::invalid("input", shape)),
    };
    if items.is_empty() {
        return Err(ApiError::invalid("input", "input is an empty list"));
    }
    if items.len() > MAX_INPUTS {
        return Err(ApiError::invalid(
            "input",
            format!(
                "input holds {} items; send at most {MAX_INPUTS} per request",
                items.len()
            ),
        ));
    }
    if items.iter().all(Value::is_number) {
        return Ok(vec![EmbedInput::Ids(ids("input", items)?)]);
    }
    (items.iter().enumerate())
        .map(|(i, item)| match item {
            Value::String(s) => Ok(EmbedInput::Text(s.clone())),
            Value::Array(ids_list) => Ok(EmbedInput::Ids(ids(&format!("input[{i}]"), ids_list)?)),
            _ => Err(ApiError::invalid(
                format!("input[{i}]"),
                format!("input[{i}] is {item}; {shape}"),
            )),
        })
        .collect()
}

/// A list of token ids (range-checked against the vocabulary later, with the tokenizer).
fn ids(field: &str, items: &[Value]) -> Result<Vec<u32>, ApiError> {
    (items.iter().enumerate())
        .map(|(i, v)| {
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    ApiError::invalid(
                        format!("{field}[{i}]"),
                        format!("{field}[{i}] is {v}, not a token id (a non-negative integer)"),
                    )
                })
        })
        .collect()
}

/// `documents` as the rerank endpoints take them: strings, or objects with a `text`.
fn documents(value: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let Some(Value::Array(items)) = value else {
        return Err(ApiError::invalid(
            "documents",
            "documents is required: a list of strings (or of objects with a \"text\")",
        ));
    };
    if items.is_empty() {
        return Err(ApiError::invalid("documents", "documents is an empty list"));
    }
    if items.len() > MAX_INPUTS {
        return Err(ApiError::invalid(
            "documents",
            format!(
                "documents holds {} items; send at most {MAX_INPUTS} per request",
                items.len()
            ),
        ));
    }
    (items.iter().enumerate())
        .map(|(i, item)| match item {
            Value::String(s) => Ok(s.clone()),
            Value::Object(o) => match o.get("text") {
                Some(Value::String(s)) => Ok(s.clone()),
                _ => Err(ApiError::invalid(
                    format!("documents[{i}].text"),
                    format!("documents[{i}] has no string \"text\""),
                )),
            },
            _ => Err(ApiError::invalid(
                format!("documents[{i}]"),
                format!("documents[{i}] is {item}; give a string or an object with a \"text\""),
            )),
        })
        .collect()
}

/// `values` as little-endian f32 bytes in standard base64 (what OpenAI's clients decode).
fn base64_f32(values: &[f32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> shift & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[derive(Serialize)]
struct EmbeddingList {
    object: &'static str,
    data: Vec<Embedding>,
    model: String,
    usage: Usage,
}

#[derive(Serialize)]
struct Embedding {
    object: &'static str,
    index: usize,
    embedding: Values,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Values {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

#[derive(Serialize)]
struct Reranked {
    object: &'static str,
    model: String,
    results: Vec<Ranked>,
    usage: Usage,
}

#[derive(Serialize)]
struct Ranked {
    index: usize,
    relevance_score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    document: Option<Document>,
}

#[derive(Serialize)]
struct Document {
    text: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_the_standard_encoding_of_the_le_bytes() {
        // 1.0f32 = 00 00 80 3f; 2.5f32 = 00 00 20 40.
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[1.0, 2.5]), "AACAPwAAIEA=");
        assert_eq!(base64_f32(&[]), "");
    }

    #[test]
    fn inputs_name_the_item_they_refuse() {
        let parse = |text: &str| inputs(Some(&serde_json::from_str(text).unwrap()));
        assert_eq!(
            parse(r#""hi""#).unwrap(),
            vec![EmbedInput::Text("hi".into())]
        );
        assert_eq!(parse("[1, 2]").unwrap(), vec![EmbedInput::Ids(vec![1, 2])]);
        assert_eq!(
            parse(r#"["a", [3]]"#).unwrap(),
            vec![EmbedInput::Text("a".into()), EmbedInput::Ids(vec![3])]
        );
        for (body, param) in [
            ("[]", "input"),
            (r#"["a", 3.5]"#, "input[1]"),
            (r#"["a", {"x": 1}]"#, "input[1]"),
            ("[[1, -2]]", "input[0][1]"),
            ("7", "input"),
        ] {
            let e = parse(body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
        }
    }
}
