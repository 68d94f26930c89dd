//! Persistence retry dead letters: inspect and requeue.

use std::collections::HashMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Query, State};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::state::AppState;

/// `GET /v1/internal/persistence-retry/dead-letters?limit=N`
pub async fn list(
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let limit = super::limit(&query)?;
    let inspection = state
        .retry
        .dead_letters_inspect(limit)
        .await
        .map_err(|e| ApiError::internal(&e))?;
    Ok(Json(json!({
        "pending_retry_jobs": inspection.pending_retry_jobs,
        "active_dead_letters": inspection.active_dead_letters,
        "dead_letters": inspection.dead_letters,
    })))
}

/// `POST /v1/internal/persistence-retry/dead-letters/requeue`
pub async fn requeue(State(state): State<AppState>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let id = super::requeue_request(&body)?;
    requeue_id(&state, id).await
}

/// Requeues one retry dead letter (shared with the console).
pub async fn requeue_id(state: &AppState, id: uuid::Uuid) -> Result<Json<Value>, ApiError> {
    match state.retry.dead_letters_requeue(id).await {
        Ok(shardkeep::retry::RequeueOutcome::Requeued { retry_job_id }) => Ok(Json(
            json!({ "requeued": true, "retry_job_id": retry_job_id }),
        )),
        Ok(shardkeep::retry::RequeueOutcome::NotRequeued) => Ok(Json(json!({ "requeued": false }))),
        Err(shardkeep::retry::RetryError::Requeue(
            shardkeep::retry::RequeueError::Undecodable(reason),
        )) => Err(ApiError::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "undecodable_job",
            format!("the saved job cannot be restored: {reason}"),
        )),
        Err(e) => Err(ApiError::internal(&e)),
    }
}
