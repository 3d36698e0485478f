//! vLLM's endpoints for LoRA adapters at run time, behind the API key and gone with
//! `--no-admin`: `POST /v1/load_lora_adapter` (`{"lora_name", "lora_path"}`, and
//! `base_model_name` when the server serves several models) loads an adapter on its base
//! model's engine thread between steps, after which requests name it in `model`;
//! `POST /v1/unload_lora_adapter` (`{"lora_name"}`) drops it (requests running under it
//! finish under it). Both answer plain text as vLLM does; errors are OpenAI's JSON (404 for
//! an adapter not loaded).

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;

use super::http::body;
use crate::App;
use crate::adapters::Lora;
use crate::error::{ApiError, Protocol};
use crate::models::{Served, State as ModelState};

pub(super) fn routes(router: Router<Arc<App>>) -> Router<Arc<App>> {
    router
        .route("/v1/load_lora_adapter", post(load))
        .route("/v1/unload_lora_adapter", post(unload))
}

#[derive(serde::Deserialize)]
struct LoadBody {
    lora_name: String,
    lora_path: String,
    /// The model to adapt (oxgen's addition; the served model when there is one).
    base_model_name: Option<String>,
}

#[derive(serde::Deserialize)]
struct UnloadBody {
    lora_name: String,
}

/// The body as `T`, or a 400 saying what is wrong with it.
async fn parse<T: serde::de::DeserializeOwned>(app: &App, request: Request) -> Result<T, ApiError> {
    let body = body(request, app.config.max_body, app.config.body_timeout).await?;
    serde_json::from_slice(&body).map_err(|e| {
        ApiError::invalid(
            "",
            format!("the body is not valid: {e} (give lora_name and lora_path)"),
        )
    })
}

async fn load(State(app): State<Arc<App>>, request: Request) -> Response {
    let loaded = async {
        let asked: LoadBody = parse(&app, request).await?;
        let name = asked.lora_name;
        if name.is_empty() {
            return Err(ApiError::invalid("lora_name", "lora_name is empty"));
        }
        if app.models.find(&name).is_ok() {
            return Err(ApiError::invalid(
                "lora_name",
                format!("a model is named '{name}'; give the adapter another name"),
            ));
        }
        if app.adapter(&name).is_some() {
            return Err(ApiError::invalid(
                "lora_name",
                format!("the LoRA adapter '{name}' has already been loaded; unload it first"),
            ));
        }
        let lease = app.lease(asked.base_model_name.as_deref()).await?;
        let (_, queue) = lease.lm()?;
        let path = PathBuf::from(asked.lora_path);
        // Read here; only handing it to the model waits for the engine's thread.
        let (task_name, task_path) = (name.clone(), path.clone());
        let adapter =
            tokio::task::spawn_blocking(move || oxgen::read_adapter(&task_name, &task_path))
                .await
                .map_err(|e| ApiError::internal(format!("reading the adapter failed: {e}")))?
                .map_err(|e| ApiError::invalid("lora_path", e.to_string()))?;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (task_name, task_path) = (name.clone(), path.clone());
        let sent = queue.run(Box::new(move |model: &mut oxgen::Model| {
            let _ = tx.send(model.add_adapter(&task_name, &task_path, adapter));
        }));
        let stopped = || ApiError::unavailable("model_unloaded", "the base model stopped");
        if !sent {
            return Err(stopped());
        }
        let info = (rx.await)
            .map_err(|_| stopped())?
            .map_err(|e| ApiError::invalid("lora_path", e.to_string()))?;
        let lora = Lora {
            base: lease.name.clone(),
            path,
            info: Some(info),
        };
        app.adapters.insert(&name, lora);
        Ok(format!(
            "Success: LoRA adapter '{name}' added successfully."
        ))
    };
    match loaded.await {
        Ok(text) => text.into_response(),
        Err(e) => e.response(Protocol::OpenAi),
    }
}

async fn unload(State(app): State<Arc<App>>, request: Request) -> Response {
    let unloaded = async {
        let asked: UnloadBody = parse(&app, request).await?;
        let name = asked.lora_name;
        let lora = app.adapter(&name).ok_or_else(|| {
            ApiError::not_found(format!("the LoRA adapter '{name}' cannot be found"))
        })?;
        app.adapters.remove(&name);
        // A resident base model drops it now; one not in memory loads without it.
        if let Ok(entry) = app.models.find(&lora.base)
            && let ModelState::Ready(resident) = &*entry.lock()
            && let Served::Lm { queue, .. } = &resident.served
        {
            let task_name = name.clone();
            queue.run(Box::new(move |model: &mut oxgen::Model| {
                let _ = model.unload_adapter(&task_name);
            }));
        }
        Ok::<_, ApiError>(format!(
            "Success: LoRA adapter '{name}' removed successfully."
        ))
    };
    match unloaded.await {
        Ok(text) => text.into_response(),
        Err(e) => e.response(Protocol::OpenAi),
    }
}
