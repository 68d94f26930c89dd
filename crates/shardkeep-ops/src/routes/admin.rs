//! Admin cleanup of Redis targets: the descriptors, and dry runs or bounded deletes.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use shardkeep::coord::{CleanupMode, CoordError};

use crate::error::ApiError;
use crate::state::AppState;

/// `GET /v1/internal/admin/cleanup-targets`
pub async fn targets(State(state): State<AppState>) -> Json<Value> {
    Json(json!({ "targets": state.coord.keys().cleanup_targets() }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CleanupBody {
    target: String,
    mode: CleanupMode,
    limit: Option<usize>,
}

/// `POST /v1/internal/admin/cleanup` with `{"target", "mode": "dry_run" | "delete", "limit"?}`
pub async fn cleanup(State(state): State<AppState>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let body: CleanupBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            format!("invalid cleanup request: {e}"),
        )
    })?;
    if state.coord.keys().cleanup_target(&body.target).is_none() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "unknown_target",
            format!("no cleanup target {:?}", body.target),
        ));
    }
    let limit = body
        .limit
        .unwrap_or(shardkeep::coord::cleanup::MAX_DELETE_PER_CALL);
    match state
        .coord
        .cleanup_run(&body.target, body.mode, limit)
        .await
    {
        Ok(report) => Ok(Json(json!(report))),
        Err(CoordError::InvalidInput(message)) => Err(ApiError::bad_request(message)),
        Err(e) => Err(ApiError::internal(&e)),
    }
}
