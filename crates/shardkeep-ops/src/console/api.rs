//! The console's data calls: overview, requeue previews (what an operator must check first),
//! and requeue.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::error::ApiError;
use crate::routes;
use crate::state::AppState;

fn parse_id(raw: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_dead_letter_id",
            "not a UUID",
        )
    })
}

/// `GET /console/api/overview`: both queues' depths and dead letters.
pub async fn overview(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let retry = state
        .retry
        .dead_letters_inspect(100)
        .await
        .map_err(|e| ApiError::internal(&e))?;
    let (depths, journal) = state
        .journal
        .inspect(100)
        .await
        .map_err(|e| ApiError::internal(&e))?;
    Ok(Json(json!({
        "retry": retry,
        "journal": { "pending": depths.pending, "processing": depths.processing, "dead": depths.dead, "dead_letters": journal },
    })))
}

async fn session_active(state: &AppState, token: Option<&str>) -> Result<bool, ApiError> {
    match token {
        Some(token) => state
            .coord
            .session_is_active(token)
            .await
            .map_err(|e| ApiError::internal(&e)),
        None => Ok(false),
    }
}

/// `GET /console/api/retry/{id}/preview`
pub async fn preview_retry(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = parse_id(&id)?;
    let detail = state
        .retry
        .dead_letter_detail(id)
        .await
        .map_err(|e| ApiError::internal(&e))?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no active dead letter with that id",
            )
        })?;
    let active = session_active(&state, detail.summary.session_token.as_deref()).await?;
    Ok(Json(json!({
        "kind": "retry",
        "dead_letter_id": id,
        "job_kind": detail.summary.job_kind,
        "error": detail.summary.error,
        "session_impact": detail.summary.session_impact,
        "session_token": detail.summary.session_token,
        "session_active_again": active,
        "deletes_resume_ledger": false,
        "transfer_already_confirmed": detail.transfer_already_recorded,
    })))
}

/// `GET /console/api/journal/{id}/preview`
pub async fn preview_journal(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = parse_id(&id)?;
    let (_, letters) = state
        .journal
        .inspect(500)
        .await
        .map_err(|e| ApiError::internal(&e))?;
    let letter = letters
        .into_iter()
        .find(|l| l.dead_letter_id == id)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_found",
                "no dead letter with that id",
            )
        })?;
    let active = session_active(&state, letter.session_token.as_deref()).await?;
    let deletes = letter.plan.map(|p| {
        p.effects(letter.transfer_confirmed.unwrap_or(false))
            .delete_resume_ledger
    });
    Ok(Json(json!({
        "kind": "journal",
        "dead_letter_id": id,
        "plan": letter.plan.map(|p| p.as_str()),
        "error": letter.error,
        "session_impact": "none",
        "session_token": letter.session_token,
        "session_active_again": active,
        "deletes_resume_ledger": deletes,
        "transfer_already_confirmed": letter.transfer_confirmed,
    })))
}

/// `POST /console/api/retry/{id}/requeue`
pub async fn requeue_retry(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    routes::retry::requeue_id(&state, parse_id(&id)?).await
}

/// `POST /console/api/journal/{id}/requeue`
pub async fn requeue_journal(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    routes::journal::requeue_id(&state, parse_id(&id)?).await
}
