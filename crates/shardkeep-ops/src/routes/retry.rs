//! Persistence retry dead letters: list, detail with the operator checks, requeue.

use std::collections::HashMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};

use crate::contract::{
    ErrorBody, OperatorChecks, RequeueRequest, RetryDeadLetterDetail, RetryDeadLetterList,
    RetryRequeueResponse,
};
use crate::error::ApiError;
use crate::state::AppState;

/// `GET /v1/internal/persistence-retry/dead-letters?limit&offset&character`
#[utoipa::path(get, operation_id = "retry_list", path = "/v1/internal/persistence-retry/dead-letters", tag = "retry",
    params(
        ("limit" = Option<i64>, Query, description = "page size, 1..=500 (50)"),
        ("offset" = Option<i64>, Query, description = "dead letters to skip (0)"),
        ("character" = Option<String>, Query, description = "a character id or name"),
    ),
    responses((status = 401, description = "the signature was refused", body = ErrorBody),
              (status = 503, description = "replay protection is unavailable", body = ErrorBody),
              (status = 200, description = "OK", body = RetryDeadLetterList), (status = 400, description = "malformed input", body = ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<RetryDeadLetterList>, ApiError> {
    let page = super::page(&query)?;
    let inspection = state
        .retry
        .dead_letters_page(page.offset, page.limit, page.character.as_ref())
        .await?;
    Ok(Json(RetryDeadLetterList {
        pending_retry_jobs: inspection.pending_retry_jobs,
        active_dead_letters: inspection.active_dead_letters,
        dead_letters: inspection
            .dead_letters
            .into_iter()
            .map(Into::into)
            .collect(),
    }))
}

/// `GET /v1/internal/persistence-retry/dead-letters/{id}`
#[utoipa::path(get, operation_id = "retry_detail", path = "/v1/internal/persistence-retry/dead-letters/{id}", tag = "retry",
    params(("id" = String, Path, description = "dead letter id")),
    responses((status = 401, description = "the signature was refused", body = ErrorBody),
              (status = 503, description = "replay protection is unavailable", body = ErrorBody),
              (status = 200, description = "OK", body = RetryDeadLetterDetail), (status = 400, description = "malformed input", body = ErrorBody),
              (status = 404, description = "no such item", body = ErrorBody)))]
pub async fn detail(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<RetryDeadLetterDetail>, ApiError> {
    detail_of(&state, super::dead_letter_id(&id)?)
        .await
        .map(Json)
}

/// The whole retry dead letter `id` with the operator checks (shared with the console).
pub async fn detail_of(
    state: &AppState,
    id: uuid::Uuid,
) -> Result<RetryDeadLetterDetail, ApiError> {
    let detail = state
        .retry
        .dead_letter_detail(id)
        .await?
        .ok_or_else(|| ApiError::not_found("no active retry dead letter with that id"))?;
    let token = detail.summary.session_token.clone();
    let checks = OperatorChecks {
        session_impact: detail.summary.session_impact.clone(),
        session_active_again: super::session_active(state, token.as_deref()).await?,
        session_token: token,
        // Retry jobs write character rows and transfer activations; none deletes a ledger.
        deletes_resume_ledger: Some(false),
        transfer_already_confirmed: Some(detail.transfer_already_recorded),
    };
    Ok(RetryDeadLetterDetail {
        kind: "retry".into(),
        dead_letter: detail.summary.into(),
        payload: detail.payload,
        checks,
    })
}

/// `POST /v1/internal/persistence-retry/dead-letters/requeue`
#[utoipa::path(post, operation_id = "retry_requeue", path = "/v1/internal/persistence-retry/dead-letters/requeue", tag = "retry",
    request_body = RequeueRequest,
    responses((status = 401, description = "the signature was refused", body = ErrorBody),
              (status = 413, description = "the body is over 64 KiB", body = ErrorBody),
              (status = 503, description = "replay protection is unavailable", body = ErrorBody),
              (status = 200, description = "OK", body = RetryRequeueResponse), (status = 400, description = "malformed input", body = ErrorBody),
              (status = 409, description = "wrong rpc_version", body = ErrorBody), (status = 422, description = "the stored work cannot be decoded", body = ErrorBody)))]
pub async fn requeue(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<RetryRequeueResponse>, ApiError> {
    let request = super::requeue_request(&body)?;
    requeue_id(&state, request.dead_letter_id).await
}

/// Requeues one retry dead letter (shared with the console).
pub async fn requeue_id(
    state: &AppState,
    id: uuid::Uuid,
) -> Result<Json<RetryRequeueResponse>, ApiError> {
    use shardkeep::retry::RequeueOutcome;
    let refused = |reason: &str, detail: String| RetryRequeueResponse {
        requeued: false,
        retry_job_id: None,
        reason: Some(reason.to_owned()),
        detail: Some(detail),
    };
    let answer = match state.retry.dead_letters_requeue(id).await? {
        RequeueOutcome::Requeued { retry_job_id } => RetryRequeueResponse {
            requeued: true,
            retry_job_id: Some(retry_job_id),
            reason: None,
            detail: None,
        },
        RequeueOutcome::NotRequeued => RetryRequeueResponse {
            requeued: false,
            retry_job_id: None,
            reason: None,
            detail: None,
        },
        RequeueOutcome::Superseded {
            job_epoch,
            owner_epoch,
        } => refused(
            "superseded",
            format!(
                "the job was issued by the character's copy at epoch {job_epoch}; a newer copy \
                 (epoch {owner_epoch}) owns it now and the worker would drop the job unapplied. \
                 The copy that issued it played it and saved it unless it was lost first; to \
                 grant it again, issue an offline grant"
            ),
        ),
    };
    Ok(Json(answer))
}
