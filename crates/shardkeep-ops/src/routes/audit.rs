//! The audit read surface: a character's own trail by id, and the staff view by name.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use shardkeep::audit::{AuditCursor, Tier, Viewer};
use uuid::Uuid;

use crate::contract::{AuditPage, ErrorBody};
use crate::error::ApiError;
use crate::state::AppState;

fn cursor(query: &HashMap<String, String>) -> Result<Option<AuditCursor>, ApiError> {
    match (query.get("before_at"), query.get("before_seq")) {
        (None, None) => Ok(None),
        (Some(at), Some(seq)) => {
            let at: DateTime<Utc> = at.parse().map_err(|_| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_cursor",
                    "before_at must be an RFC 3339 time",
                )
            })?;
            let seq: i64 = seq.parse().map_err(|_| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_cursor",
                    "before_seq must be an integer",
                )
            })?;
            Ok(Some(AuditCursor { at, seq }))
        }
        _ => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_cursor",
            "before_at and before_seq come together",
        )),
    }
}

/// `GET /v1/internal/audit/characters/{character_id}?limit&before_at&before_seq`
#[utoipa::path(get, operation_id = "audit_character", path = "/v1/internal/audit/characters/{character_id}", tag = "audit",
    params(
        ("character_id" = String, Path, description = "the character"),
        ("limit" = Option<i64>, Query, description = "page size, 1..=500 (50)"),
        ("before_at" = Option<String>, Query, description = "cursor: RFC 3339 time"),
        ("before_seq" = Option<i64>, Query, description = "cursor: sequence"),
    ),
    responses((status = 401, description = "the signature was refused", body = ErrorBody),
              (status = 503, description = "replay protection is unavailable", body = ErrorBody),
              (status = 200, description = "OK", body = AuditPage), (status = 400, description = "malformed input", body = ErrorBody),
              (status = 404, description = "no such item", body = ErrorBody)))]
pub async fn character(
    State(state): State<AppState>,
    Path(character_id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<AuditPage>, ApiError> {
    let id = Uuid::parse_str(&character_id).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_character_id",
            "character id must be a UUID",
        )
    })?;
    let limit = super::limit(&query)?;
    let before = cursor(&query)?;
    state
        .audit
        .self_view(id, before, limit)
        .await
        .map(|page| Json(page.into()))
        .map_err(Into::into)
}

/// `GET /v1/internal/audit/staff?name&viewer_account_id&viewer_tier&limit&before_at&before_seq`
#[utoipa::path(get, operation_id = "audit_staff", path = "/v1/internal/audit/staff", tag = "audit",
    params(
        ("name" = String, Query, description = "the character's name"),
        ("viewer_account_id" = String, Query, description = "who is looking"),
        ("viewer_tier" = String, Query, description = "player, moderator or admin"),
        ("limit" = Option<i64>, Query, description = "page size, 1..=500 (50)"),
        ("before_at" = Option<String>, Query, description = "cursor: RFC 3339 time"),
        ("before_seq" = Option<i64>, Query, description = "cursor: sequence"),
    ),
    responses((status = 401, description = "the signature was refused", body = ErrorBody),
              (status = 503, description = "replay protection is unavailable", body = ErrorBody),
              (status = 200, description = "OK", body = AuditPage), (status = 400, description = "malformed input", body = ErrorBody),
              (status = 403, description = "not allowed for this viewer", body = ErrorBody), (status = 429, description = "rate limited", body = ErrorBody)))]
pub async fn staff(
    State(state): State<AppState>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<AuditPage>, ApiError> {
    let name = query
        .get("name")
        .map(|n| n.trim())
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::bad_request("name is required"))?;
    let account_id = query
        .get("viewer_account_id")
        .and_then(|v| Uuid::parse_str(v).ok())
        .ok_or_else(|| ApiError::bad_request("viewer_account_id must be a UUID"))?;
    let tier = query
        .get("viewer_tier")
        .and_then(|t| Tier::parse(t))
        .ok_or_else(|| ApiError::bad_request("viewer_tier must be player, moderator or admin"))?;
    let limit = super::limit(&query)?;
    let before = cursor(&query)?;
    state
        .audit
        .staff_view(Viewer { account_id, tier }, name, before, limit)
        .await
        .map(|page| Json(page.into()))
        .map_err(Into::into)
}
