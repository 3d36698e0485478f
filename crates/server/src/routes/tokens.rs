//! The tokenizer's endpoints: `/tokenize`, `/detokenize` and `/tokenizer_info` (vLLM's,
//! which lm-evaluation-harness's remote tokenizer uses).

use std::sync::Arc;

use axum::extract::{RawQuery, Request, State};
use axum::response::Response;
use serde::Serialize;
use serde_json::{Map, Value};

use super::http::{body, reply};
use super::{PrepareRequest, prepare};
use crate::App;
use crate::api::{self, Unknown};
use crate::error::{ApiError, Protocol};
use oxgen::Prompt;

/// `POST /tokenize`: `{"prompt": "..."}` (with `add_special_tokens`, default false: the
/// tokenizer's own special tokens, a BOS say, around the text) or `{"messages": [...]}`
/// (rendered with the chat template, with `tools` when given, as a chat request renders
/// them) → `{"tokens": [...], "count": n, "max_model_len": context}`.
pub(super) async fn tokenize(State(app): State<Arc<App>>, request: Request) -> Response {
    let result = async {
        app.accepting()?;
        let body = body(request, app.config.max_body, app.config.body_timeout).await?;
        let map = api::object(&body)?;
        let lease = app.lease_for(&body).await?;
        let (loaded, _) = lease.lm()?;
        let mut unknown = Unknown::new(app.config.strict_api);
        unknown.check(
            &map,
            "",
            &[&[
                "model",
                "prompt",
                "messages",
                "tools",
                "tool_choice",
                "chat_template_kwargs",
                "add_special_tokens",
                "add_generation_prompt",
                "continue_final_message",
            ]],
        )?;
        let has = |k: &str| map.get(k).is_some_and(|v| !v.is_null());
        let ids = match (map.get("prompt"), has("messages")) {
            (Some(Value::String(text)), false) if !has("tools") && !has("chat_template_kwargs") => {
                let special =
                    api::boolean("add_special_tokens", map.get("add_special_tokens"), false)?;
                let (encoder, text) = (loaded.encoder.clone(), text.clone());
                tokio::task::spawn_blocking(move || encoder.tokenizer().encode(&text, special))
                    .await
                    .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))?
                    .map_err(|e| ApiError::invalid("prompt", e.to_string()))?
            }
            (None, true) => {
                #[derive(serde::Deserialize)]
                struct Messages {
                    messages: Vec<Map<String, Value>>,
                    add_generation_prompt: Option<bool>,
                    continue_final_message: Option<bool>,
                }
                let value = Value::Object(map);
                let tools = api::tools(&value)?.map(|t| t.with_format(loaded.tool_format));
                let kwargs = api::template_kwargs(&value)?;
                let m: Messages = api::typed(&value)?;
                let messages = api::chat_messages(m.messages, &mut unknown)?;
                let mut request = PrepareRequest::new(vec![Prompt::Chat(messages)], "messages");
                request.tools = tools;
                request.template_kwargs = kwargs;
                request.add_generation_prompt = m.add_generation_prompt.unwrap_or(true);
                request.continue_final_message = m.continue_final_message.unwrap_or(false);
                let mut prepared = prepare(loaded, request, false).await?;
                prepared.prompts.swap_remove(0).0
            }
            _ => {
                return Err(ApiError::invalid(
                    "prompt",
                    "give either 'prompt' (a string) or 'messages' (with 'tools' if any)",
                ));
            }
        };
        Ok(to_value(Tokenized {
            count: ids.len(),
            tokens: ids,
            max_model_len: loaded.limit.max(),
        }))
    };
    reply(result.await, Protocol::OpenAi)
}

/// `GET /tokenizer_info`: what a client needs to tokenize as the server does (vLLM's
/// endpoint, lm-evaluation-harness's remote tokenizer): the special tokens, the chat
/// template, the context.
pub(super) async fn tokenizer_info(
    State(app): State<Arc<App>>,
    RawQuery(query): RawQuery,
) -> Response {
    // `?model=NAME` picks one of several models.
    let model = (query.as_deref().unwrap_or_default().split('&'))
        .find_map(|pair| pair.strip_prefix("model="));
    let result = async {
        let lease = app.lease(model).await?;
        let (loaded, _) = lease.lm()?;
        Ok(to_value(TokenizerInfo {
            tokenizer_class: "PreTrainedTokenizerFast",
            eos_token: loaded.eos_token.as_deref(),
            bos_token: loaded.bos_token.as_deref(),
            pad_token: None,
            chat_template: loaded.encoder.template().map(|t| t.source()),
            model_max_length: loaded.limit.max(),
            vocab_size: loaded.vocab,
        }))
    };
    reply(result.await, Protocol::OpenAi)
}

/// `POST /detokenize`: `{"tokens": [ids]}` → `{"prompt": "text"}`.
pub(super) async fn detokenize(State(app): State<Arc<App>>, request: Request) -> Response {
    let result = async {
        app.accepting()?;
        let body = body(request, app.config.max_body, app.config.body_timeout).await?;
        let map = api::object(&body)?;
        Unknown::new(app.config.strict_api).check(&map, "", &[&["model", "tokens"]])?;
        let lease = app.lease_for(&body).await?;
        let (loaded, _) = lease.lm()?;
        #[derive(serde::Deserialize)]
        struct Tokens {
            tokens: Vec<u32>,
        }
        let value = Value::Object(map);
        let Tokens { tokens } = api::typed(&value)?;
        api::token_ids("tokens", &tokens, loaded.vocab)?;
        let text = loaded
            .encoder
            .decode(&tokens, false)
            .map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
        Ok(to_value(Detokenized { prompt: text }))
    };
    reply(result.await, Protocol::OpenAi)
}

#[derive(Serialize)]
struct Tokenized {
    tokens: Vec<u32>,
    count: usize,
    max_model_len: usize,
}

#[derive(Serialize)]
struct TokenizerInfo<'a> {
    tokenizer_class: &'static str,
    eos_token: Option<&'a str>,
    bos_token: Option<&'a str>,
    pad_token: Option<&'a str>,
    chat_template: Option<&'a str>,
    model_max_length: usize,
    vocab_size: usize,
}

#[derive(Serialize)]
struct Detokenized {
    prompt: String,
}

/// An object as the JSON `reply` sends.
fn to_value(v: impl Serialize) -> Value {
    serde_json::to_value(v).unwrap_or_default()
}
