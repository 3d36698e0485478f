//! Errors, answered in the envelope of the protocol asked: OpenAI's
//! `{"error": {"message", "type", "param", "code"}}`, Anthropic's
//! `{"type": "error", "error": {"type", "message"}}` or Ollama's `{"error": "..."}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// Characters of a message, and of a `param`, an error body carries at most: both may echo
/// what the client sent (a model name, a field name, a value), which may be huge.
const MAX_MESSAGE: usize = 1024;
const MAX_PARAM: usize = 128;

/// `text` cut to `max` characters, saying how much was left out.
fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((end, _)) => format!(
            "{}… ({} more characters)",
            &text[..end],
            text[end..].chars().count()
        ),
    }
}

/// An error answered to a client.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(
        status: StatusCode,
        kind: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400: the request is malformed or a value is out of range.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
        let param = param.into();
        let mut e = ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message);
        e.param = (!param.is_empty()).then_some(param);
        e
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", message);
        e.code = Some("invalid_api_key");
        e
    }

    pub fn model_not_found(asked: &str, served: &[String]) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "the model '{asked}' does not exist here; this server serves {}",
                served
                    .iter()
                    .map(|m| format!("'{m}'"))
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        e
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", message);
        e.code = Some("not_found");
        e
    }

    /// 403: the request may not be made from where it came (a CORS origin not allowed).
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::FORBIDDEN, "permission_error", message);
        e.code = Some("origin_not_allowed");
        e
    }

    /// 405: the endpoint exists but not with this method.
    pub fn method_not_allowed(method: &str, path: &str) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("{path} does not take {method} requests"),
        );
        e.code = Some("method_not_allowed");
        e
    }

    pub fn too_large(limit: usize) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is over this server's limit of {limit} bytes (--max-body)"),
        );
        e.code = Some("request_too_large");
        e
    }

    /// 408: the request body did not arrive in time.
    pub fn body_timeout(limit: std::time::Duration) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!(
                "the request body did not arrive within {} s; send it whole",
                limit.as_secs()
            ),
        );
        e.code = Some("request_timeout");
        e
    }

    /// 422: well-formed, but the model cannot take it (the chat template refused the
    /// conversation).
    pub fn unprocessable(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request_error",
            message,
        )
    }

    /// 429: the queue is full; retry after a second.
    pub fn queue_full(limit: usize) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!(
                "the server is busy: {limit} requests are already waiting (--max-queue); retry shortly"
            ),
        );
        e.code = Some("queue_full");
        e.retry_after = Some(1);
        e
    }

    /// 503: loading, shutting down, failed or timed out.
    pub fn unavailable(code: &'static str, message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message);
        e.code = Some(code);
        e.retry_after = Some(1);
        e
    }

    /// 500: the model failed on this request.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body, also sent as a streaming error chunk. What it echoes of the request is
    /// clipped ([`MAX_MESSAGE`], [`MAX_PARAM`]).
    pub fn body(&self) -> serde_json::Value {
        let error = OpenAiError {
            message: clip(&self.message, MAX_MESSAGE),
            kind: self.kind,
            param: self.param.as_deref().map(|p| clip(p, MAX_PARAM)),
            code: self.code,
        };
        to_value(Envelope { error })
    }
}

impl From<oxgen::prepare::PrepareError> for ApiError {
    fn from(e: oxgen::prepare::PrepareError) -> ApiError {
        match e {
            oxgen::prepare::PrepareError::Template(m) => {
                ApiError::unprocessable(format!("the chat template refused the messages: {m}"))
            }
            oxgen::prepare::PrepareError::Invalid { param, message } => {
                ApiError::invalid(param, message)
            }
        }
    }
}

/// The engine's errors in the server's words: the request fields and flags that fix them.
impl From<oxgen::EngineError> for ApiError {
    fn from(e: oxgen::EngineError) -> ApiError {
        use oxgen::EngineError as E;
        let (code, message) = match e {
            E::QueueFull { max_queue } => return ApiError::queue_full(max_queue),
            E::Failed(message) => return ApiError::internal(message),
            E::KvFull {
                need,
                total,
                sequences,
                positions,
            } => (
                "kv_cache_full",
                format!(
                    "the request needs {need} KV blocks ({sequences} sequences of {positions} \
                     positions in all) and the pool has {total}; lower max_tokens or n, or \
                     raise --kv-blocks"
                ),
            ),
            E::Timeout { secs } => (
                "timeout",
                format!("the request took longer than {secs} s (--request-timeout)"),
            ),
            E::ShuttingDown => ("shutting_down", "the server is shutting down".into()),
            E::Stopped => ("engine_failed", e.to_string()),
        };
        ApiError::unavailable(code, message)
    }
}

/// `{"error": ...}`: OpenAI's envelope of an error object, Ollama's of a message.
#[derive(Serialize)]
struct Envelope<T> {
    error: T,
}

#[derive(Serialize)]
struct OpenAiError {
    message: String,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<String>,
    code: Option<&'static str>,
}

/// Anthropic's: `{"type": "error", "error": {"type": ..., "message": ...}}`.
#[derive(Serialize)]
struct Tagged<T> {
    #[serde(rename = "type")]
    kind: &'static str,
    error: T,
}

#[derive(Serialize)]
struct AnthropicError {
    #[serde(rename = "type")]
    kind: &'static str,
    message: String,
}

fn to_value(v: impl Serialize) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or_default()
}

/// The API a request speaks, which shapes its errors (and names it in `/metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    OpenAi,
    Anthropic,
    Ollama,
}

impl Protocol {
    /// The protocol of a request to `path`.
    pub fn of_path(path: &str) -> Protocol {
        if path.starts_with("/v1/messages") {
            Protocol::Anthropic
        } else if path.starts_with("/api/") {
            Protocol::Ollama
        } else {
            Protocol::OpenAi
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Protocol::OpenAi => "openai",
            Protocol::Anthropic => "anthropic",
            Protocol::Ollama => "ollama",
        }
    }
}

impl ApiError {
    /// Anthropic's error type and status for this error: the server being busy, loading or
    /// shutting down is 529 `overloaded_error` (its clients retry it).
    fn anthropic(&self) -> (StatusCode, &'static str) {
        let overloaded = StatusCode::from_u16(529).expect("529 is a valid status code");
        match self.status.as_u16() {
            400 | 405 | 408 | 422 => (self.status, "invalid_request_error"),
            401 => (self.status, "authentication_error"),
            403 => (self.status, "permission_error"),
            404 => (self.status, "not_found_error"),
            413 => (self.status, "request_too_large"),
            429 | 503 => (overloaded, "overloaded_error"),
            _ => (self.status, "api_error"),
        }
    }

    /// The status and body of this error in `protocol`'s envelope.
    pub fn shaped(&self, protocol: Protocol) -> (StatusCode, serde_json::Value) {
        match protocol {
            Protocol::OpenAi => (self.status, self.body()),
            Protocol::Anthropic => {
                let (status, kind) = self.anthropic();
                let message = clip(&self.message, MAX_MESSAGE);
                let error = AnthropicError { kind, message };
                (
                    status,
                    to_value(Tagged {
                        kind: "error",
                        error,
                    }),
                )
            }
            Protocol::Ollama => {
                let error = clip(&self.message, MAX_MESSAGE);
                (self.status, to_value(Envelope { error }))
            }
        }
    }

    /// The response in `protocol`'s envelope, with `Retry-After` where it applies.
    pub fn response(&self, protocol: Protocol) -> Response {
        let (status, body) = self.shaped(protocol);
        let mut response = (status, axum::Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.response(Protocol::OpenAi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Anthropic's clients read `error.type` and retry 529: the server being busy or not
    /// ready is `overloaded_error` there; Ollama's errors are a bare string.
    #[test]
    fn errors_take_each_protocols_shape() {
        let busy = ApiError::queue_full(4);
        let (status, body) = busy.shaped(Protocol::Anthropic);
        assert_eq!(status.as_u16(), 529);
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "overloaded_error");
        let loading = ApiError::unavailable("loading", "the model is still loading");
        assert_eq!(loading.shaped(Protocol::Anthropic).0.as_u16(), 529);
        assert_eq!(loading.shaped(Protocol::OpenAi).0.as_u16(), 503);
        let bad = ApiError::invalid("max_tokens", "max_tokens is required");
        let (status, body) = bad.shaped(Protocol::Anthropic);
        assert_eq!(
            (status.as_u16(), &body["error"]["type"]),
            (400, &json!("invalid_request_error"))
        );
        let (status, body) = bad.shaped(Protocol::Ollama);
        assert_eq!(
            (status.as_u16(), body),
            (400, json!({"error": "max_tokens is required"}))
        );
        let missing = ApiError::not_found("no such endpoint")
            .shaped(Protocol::Anthropic)
            .1;
        assert_eq!(missing["error"]["type"], "not_found_error");
        assert_eq!(
            Protocol::of_path("/v1/messages/count_tokens"),
            Protocol::Anthropic
        );
        assert_eq!(Protocol::of_path("/api/tags"), Protocol::Ollama);
        assert_eq!(Protocol::of_path("/v1/responses"), Protocol::OpenAi);
    }
}
