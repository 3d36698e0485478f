//! The chat page at `/`: three files embedded in the binary (`src/webui/`), served without
//! the API key (the page asks for it and sends it with its API calls), under a content
//! security policy that lets the page load nothing but its own files and call nothing but
//! this server. `--no-webui` leaves these routes out.

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// The page's paths; the API key guard lets them through.
pub(super) const PATHS: [&str; 3] = ["/", "/webui/app.js", "/webui/style.css"];

const CSP: &str = "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; \
                   form-action 'none'; frame-ancestors 'none'";

fn file(content_type: &'static str, body: &'static str) -> Response {
    let headers = [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CACHE_CONTROL, "no-cache"),
    ];
    (headers, body).into_response()
}

pub(super) fn routes<S: Clone + Send + Sync + 'static>(router: Router<S>) -> Router<S> {
    let page = || async {
        file(
            "text/html; charset=utf-8",
            include_str!("../webui/index.html"),
        )
    };
    let script = || async {
        file(
            "text/javascript; charset=utf-8",
            include_str!("../webui/app.js"),
        )
    };
    let style = || async {
        file(
            "text/css; charset=utf-8",
            include_str!("../webui/style.css"),
        )
    };
    router
        .route(PATHS[0], get(page))
        .route(PATHS[1], get(script))
        .route(PATHS[2], get(style))
}
