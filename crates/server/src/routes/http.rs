//! HTTP concerns every endpoint shares: CORS, the API key and response counting
//! (middleware), reading a body under its size and time limits, and answering JSON or an
//! error in the envelope of the request's protocol.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::Value;

use crate::App;
use crate::error::{ApiError, Protocol};

/// CORS for the origins of `--cors-origin`: a preflight (`OPTIONS` with
/// `Access-Control-Request-Method`) from one is answered here, before the API key is asked
/// for (browsers send none with it); other responses to one carry
/// `Access-Control-Allow-Origin`. Without origins configured, nothing changes.
pub(super) async fn cors(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let origins = &app.config.cors_origins;
    let origin = (request.headers().get(header::ORIGIN).cloned()).filter(|_| !origins.is_empty());
    let Some(origin) = origin else {
        return next.run(request).await;
    };
    let allowed = match origins.iter().any(|o| o == "*") {
        true => Some(HeaderValue::from_static("*")),
        false => (origin.to_str().ok())
            .filter(|o| origins.iter().any(|allowed| allowed == o))
            .map(|_| origin.clone()),
    };
    let preflight = request.method() == Method::OPTIONS
        && (request.headers()).contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut response = match (preflight, &allowed) {
        (true, None) => {
            return ApiError::forbidden(
                "this origin may not call the API: start the server with --cors-origin ORIGIN",
            )
            .into_response();
        }
        (true, Some(_)) => {
            let asked = (request.headers())
                .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
                .cloned()
                .unwrap_or(HeaderValue::from_static("authorization, content-type"));
            let mut r = StatusCode::NO_CONTENT.into_response();
            let h = r.headers_mut();
            h.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
            );
            h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
            h.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("600"),
            );
            r
        }
        (false, _) => next.run(request).await,
    };
    if let Some(allowed) = allowed {
        let h = response.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("x-oxgen-ignored-fields, x-oxgen-constraint-unclosable"),
        );
        h.append(header::VARY, HeaderValue::from_static("origin"));
    }
    response
}

/// Checks the API key (all but `/health` and the chat page) and counts responses by protocol, endpoint and
/// status; an error here is in the envelope of the protocol the path belongs to.
pub(super) async fn guard(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let endpoint = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("other".to_string(), |m| m.as_str().to_string());
    let protocol = Protocol::of_path(request.uri().path());
    let response = match &app.config.api_key {
        Some(key) if !open(&endpoint) && !authorized(request.headers(), key) => {
            ApiError::unauthorized(
                "missing or wrong API key: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY') \
                 with the server's --api-key",
            )
            .response(protocol)
        }
        _ => next.run(request).await,
    };
    app.metrics
        .count_request(protocol.name(), &endpoint, response.status().as_u16());
    response
}

/// Endpoints answered without the API key: health, and the chat page's files (which hold
/// nothing of the server's; the page sends the key with its API calls).
fn open(endpoint: &str) -> bool {
    endpoint == "/health" || super::webui::PATHS.contains(&endpoint)
}

/// `Authorization: Bearer KEY` or Anthropic's `x-api-key: KEY`, compared in constant time.
pub(super) fn authorized(headers: &HeaderMap, key: &str) -> bool {
    let bearer = (headers.get(header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    let same = |given: &str| {
        given.len() == key.len()
            && (given.bytes().zip(key.bytes())).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    };
    bearer.is_some_and(same) || x_api_key.is_some_and(same)
}

/// The body: 413 over the limit, 400 when it cannot be read (the client sent less than it
/// declared, or bad chunked encoding), 408 when it takes over `timeout` (so a client that
/// sends it a byte at a time cannot hold a connection forever).
pub(super) async fn body(
    request: Request,
    limit: usize,
    timeout: Duration,
) -> Result<Vec<u8>, ApiError> {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let read = async {
        let mut data = request.into_body().into_data_stream();
        let mut bytes = Vec::new();
        while let Some(chunk) = data.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::invalid("", format!("could not read the request body: {e}"))
            })?;
            if bytes.len() + chunk.len() > limit {
                return Err(ApiError::too_large(limit));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    };
    tokio::time::timeout(timeout, read)
        .await
        .unwrap_or_else(|_| Err(ApiError::body_timeout(timeout)))
}

/// The header naming the request fields that were ignored.
pub(super) const IGNORED_HEADER: &str = "x-oxgen-ignored-fields";

/// What a response says of its request besides its body: the fields ignored, and whether
/// its constraint cannot be closed early.
#[derive(Debug, Default)]
pub(super) struct Notes {
    pub(super) ignored: Vec<String>,
    pub(super) unclosable: bool,
}

/// The header saying a reply's constraint cannot be closed before the limit cuts it.
pub(super) const UNCLOSABLE_HEADER: &str = "x-oxgen-constraint-unclosable";

impl Notes {
    /// Names the ignored fields in the [`IGNORED_HEADER`] (comma-separated, each escaped to
    /// ASCII and cut to [`MAX_IGNORED_NAME`] characters, `...` where the header would pass
    /// [`MAX_IGNORED_HEADER`] bytes), and sets the [`UNCLOSABLE_HEADER`] where it applies.
    pub(super) fn apply(&self, response: &mut Response) {
        let mut names = String::new();
        for name in &self.ignored {
            let name: String = name.escape_default().take(MAX_IGNORED_NAME).collect();
            if names.len() + name.len() + 2 > MAX_IGNORED_HEADER {
                names.push_str(", ...");
                break;
            }
            if !names.is_empty() {
                names.push_str(", ");
            }
            names.push_str(&name);
        }
        if let Some(v) = HeaderValue::from_str(&names)
            .ok()
            .filter(|_| !names.is_empty())
        {
            response.headers_mut().insert(IGNORED_HEADER, v);
        }
        if self.unclosable {
            let why = "the constraint's end cannot be reached early; the reply is cut where \
                       max_tokens falls";
            (response.headers_mut()).insert(UNCLOSABLE_HEADER, HeaderValue::from_static(why));
        }
    }
}

/// Characters of one ignored field's name the header carries at most.
pub(super) const MAX_IGNORED_NAME: usize = 128;

/// Bytes of field names the header carries at most.
pub(super) const MAX_IGNORED_HEADER: usize = 1024;

/// A JSON body, or the error in `protocol`'s envelope.
pub(super) fn reply(result: Result<Value, ApiError>, protocol: Protocol) -> Response {
    match result {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.response(protocol),
    }
}
