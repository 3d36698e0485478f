//! The admin endpoints, behind the API key like every other (and gone with `--no-admin`):
//! `GET /admin/models` lists every model with its state and memory against the budget;
//! `POST /admin/models/{name}/load` loads one (waiting for the load; `{"keep_alive": ...}`
//! optional); `POST /admin/models/{name}/unload` unloads one once no request uses it
//! (waiting up to 10 s for its requests to end, then 409).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;

use super::http::body;
use super::{ModelCard, model_card};
use crate::App;
use crate::error::{ApiError, Protocol};
use crate::models::KeepAlive;

pub(super) fn routes(router: Router<Arc<App>>) -> Router<Arc<App>> {
    router
        .route("/admin/models", get(list))
        .route("/admin/models/{name}/load", post(load))
        .route("/admin/models/{name}/unload", post(unload))
}

#[derive(Serialize)]
struct Resident<'a> {
    /// The memory budget in bytes (`null`: none).
    budget_bytes: Option<u64>,
    /// Bytes held by the models in memory and those loading.
    used_bytes: u64,
    models: Vec<ModelCard<'a>>,
}

async fn list(State(app): State<Arc<App>>) -> Response {
    app.models.rescan();
    let listed = app.models.list();
    axum::Json(Resident {
        budget_bytes: app.models.budget,
        used_bytes: app.models.used(),
        models: listed.iter().map(|l| model_card(&app, l)).collect(),
    })
    .into_response()
}

/// The model's card, once loaded (or found loaded).
async fn load(State(app): State<Arc<App>>, Path(name): Path<String>, request: Request) -> Response {
    let loaded = async {
        let body = body(request, app.config.max_body, app.config.body_timeout).await?;
        let keep_alive = match body.is_empty() {
            true => None,
            false => {
                #[derive(serde::Deserialize)]
                struct Options {
                    keep_alive: Option<serde_json::Value>,
                }
                let options: Options = serde_json::from_slice(&body)
                    .map_err(|e| ApiError::invalid("", format!("the body is not valid: {e}")))?;
                (options.keep_alive.filter(|v| !v.is_null()))
                    .map(|v| {
                        KeepAlive::from_json(&v).map_err(|e| ApiError::invalid("keep_alive", e))
                    })
                    .transpose()?
            }
        };
        let lease = app.lease(Some(&name)).await?;
        if let Some(keep_alive) = keep_alive {
            lease.keep_alive(keep_alive);
        }
        Ok::<_, ApiError>(card(&app, &lease.name))
    };
    loaded
        .await
        .unwrap_or_else(|e| e.response(Protocol::OpenAi))
}

async fn unload(State(app): State<Arc<App>>, Path(name): Path<String>) -> Response {
    let entry = match app.models.find(&name) {
        Ok(entry) => entry,
        Err(e) => return e.into_response(),
    };
    if !entry.is_resident() {
        return card(&app, &entry.spec.name);
    }
    // A request that just ended may still be counted for a moment: wait a little for it.
    let deadline = std::time::Instant::now() + UNLOAD_WAIT;
    while !entry.unload("asked to (/admin/models/{name}/unload)") {
        if std::time::Instant::now() >= deadline || !entry.is_resident() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    if entry.is_resident() {
        let mut e = ApiError::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            format!(
                "'{}' has requests queued or running (or is loading); unload it once they end",
                entry.spec.name
            ),
        );
        e.code = Some("model_busy");
        return e.into_response();
    }
    card(&app, &entry.spec.name)
}

/// How long an unload waits for the model's requests to end before answering 409.
const UNLOAD_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// `/v1/models/{name}`'s card as the admin endpoints answer it.
fn card(app: &App, name: &str) -> Response {
    let listed = app.models.list();
    match listed.iter().find(|l| l.entry.spec.name == name) {
        Some(l) => axum::Json(model_card(app, l)).into_response(),
        None => ApiError::model_not_found(name, &app.models.names()).into_response(),
    }
}
