//! Session lifecycle journal dead letters: list, detail with the operator checks, requeue.

use std::collections::HashMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};

use crate::contract::{
    ErrorBody, JournalDeadLetterDetail, JournalDeadLetterList, JournalRequeueResponse,
    OperatorChecks, RequeueRequest,
};
use crate::error::ApiError;
use crate::state::AppState;

/// `GET /v1/internal/session-lifecycle-journal/dead-letters?limit&offset&character`
#[utoipa::path(get, operation_id = "journal_list", path = "/v1/internal/session-lifecycle-journal/dead-letters", tag = "journal",
    params(
        ("limit" = Option<i64>, Query, description = "page size, 1..=500 (50)"),
        ("offset" = Option<i64>, Query, description = "dead letters to skip (0)"),
        ("character" = Option<String>, Query, description = "a character id or name"),
    ),
    responses((status = 401, description = "the signature was refused", body = ErrorBody),
              (status = 503, description = "replay protection is unavailable", body = ErrorBody),
              (status = 200, description = "OK", body = JournalDeadLetterList), (status = 400, description = "malformed input", body = ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<JournalDeadLetterList>, ApiError> {
    let page = super::page(&query)?;
    let depths = state.journal.queue().depths().await?;
    let letters = state
        .journal
        .dead_letters_page(
            usize::try_from(page.offset).unwrap_or(0),
            usize::try_from(page.limit).unwrap_or(50),
            page.character.as_ref(),
        )
        .await?;
    Ok(Json(JournalDeadLetterList {
        pending: depths.pending,
        processing: depths.processing,
        dead: depths.dead,
        dead_letters: letters.into_iter().map(Into::into).collect(),
    }))
}

/// `GET /v1/internal/session-lifecycle-journal/dead-letters/{id}`
#[utoipa::path(get, operation_id = "journal_detail", path = "/v1/internal/session-lifecycle-journal/dead-letters/{id}", tag = "journal",
    params(("id" = String, Path, description = "dead letter id")),
    responses((status = 401, description = "the signature was refused", body = ErrorBody),
              (status = 503, description = "replay protection is unavailable", body = ErrorBody),
              (status = 200, description = "OK", body = JournalDeadLetterDetail), (status = 400, description = "malformed input", body = ErrorBody),
              (status = 404, description = "no such item", body = ErrorBody)))]
pub async fn detail(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<JournalDeadLetterDetail>, ApiError> {
    detail_of(&state, super::dead_letter_id(&id)?)
        .await
        .map(Json)
}

/// The whole journal dead letter `id` with the operator checks (shared with the console).
pub async fn detail_of(
    state: &AppState,
    id: uuid::Uuid,
) -> Result<JournalDeadLetterDetail, ApiError> {
    let (letter, payload) = state
        .journal
        .dead_letter(id)
        .await?
        .ok_or_else(|| ApiError::not_found("no journal dead letter with that id"))?;
    let token = letter.session_token.clone();
    let deletes = letter.plan.map(|plan| {
        plan.effects(letter.transfer_confirmed.unwrap_or(false))
            .delete_resume_ledger
    });
    let checks = OperatorChecks {
        // Journal work runs after the stream closed: it holds no session up.
        session_impact: "none".into(),
        session_active_again: super::session_active(state, token.as_deref()).await?,
        session_token: token,
        deletes_resume_ledger: deletes,
        transfer_already_confirmed: letter.transfer_confirmed,
    };
    Ok(JournalDeadLetterDetail {
        kind: "journal".into(),
        dead_letter: letter.into(),
        payload,
        checks,
    })
}

/// `POST /v1/internal/session-lifecycle-journal/dead-letters/requeue`
#[utoipa::path(post, operation_id = "journal_requeue", path = "/v1/internal/session-lifecycle-journal/dead-letters/requeue", tag = "journal",
    request_body = RequeueRequest,
    responses((status = 401, description = "the signature was refused", body = ErrorBody),
              (status = 413, description = "the body is over 64 KiB", body = ErrorBody),
              (status = 503, description = "replay protection is unavailable", body = ErrorBody),
              (status = 200, description = "OK", body = JournalRequeueResponse), (status = 400, description = "malformed input", body = ErrorBody),
              (status = 409, description = "wrong rpc_version", body = ErrorBody), (status = 422, description = "the stored work cannot be decoded", body = ErrorBody)))]
pub async fn requeue(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<JournalRequeueResponse>, ApiError> {
    let request = super::requeue_request(&body)?;
    requeue_id(&state, request.dead_letter_id).await
}

/// Requeues one journal dead letter (shared with the console).
pub async fn requeue_id(
    state: &AppState,
    id: uuid::Uuid,
) -> Result<Json<JournalRequeueResponse>, ApiError> {
    let entry_id = state.journal.requeue(id).await?;
    Ok(Json(JournalRequeueResponse {
        requeued: entry_id.is_some(),
        entry_id,
    }))
}
