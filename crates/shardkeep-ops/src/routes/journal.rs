//! Session lifecycle journal dead letters: inspect and requeue.

use std::collections::HashMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Query, State};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::state::AppState;

/// `GET /v1/internal/session-lifecycle-journal/dead-letters?limit=N`
pub async fn list(
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<Value>, ApiError> {
    let limit = super::limit(&query)?;
    let (depths, letters) = state
        .journal
        .inspect(usize::try_from(limit).unwrap_or(50))
        .await
        .map_err(|e| ApiError::internal(&e))?;
    let letters: Vec<Value> = letters
        .iter()
        .map(|l| {
            json!({
                "dead_letter_id": l.dead_letter_id,
                "entry_id": l.entry_id,
                "attempts": l.attempts,
                "error": l.error,
                "failed_at": l.failed_at,
                "session_token": l.session_token,
                "character_id": l.character_id,
                "character_name": l.character_name,
            })
        })
        .collect();
    Ok(Json(json!({
        "pending": depths.pending,
        "processing": depths.processing,
        "dead": depths.dead,
        "dead_letters": letters,
    })))
}

/// `POST /v1/internal/session-lifecycle-journal/dead-letters/requeue`
pub async fn requeue(State(state): State<AppState>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let id = super::requeue_request(&body)?;
    requeue_id(&state, id).await
}

/// Requeues one journal dead letter (shared with the console).
pub async fn requeue_id(state: &AppState, id: uuid::Uuid) -> Result<Json<Value>, ApiError> {
    match state.journal.requeue(id).await {
        Ok(Some(entry_id)) => Ok(Json(json!({ "requeued": true, "entry_id": entry_id }))),
        Ok(None) => Ok(Json(json!({ "requeued": false }))),
        Err(shardkeep::queue::QueueError::Undecodable(_)) => Err(ApiError::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "undecodable_entry",
            "the dead letter's item cannot be decoded",
        )),
        Err(e) => Err(ApiError::internal(&e)),
    }
}
