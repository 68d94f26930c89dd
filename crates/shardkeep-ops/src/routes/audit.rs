//! The audit read surface: a character's own trail by id, and the staff view by name.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use shardkeep::audit::{AuditCursor, AuditPage, AuditReadError, Tier, Viewer};
use uuid::Uuid;

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

fn read_error(err: AuditReadError) -> ApiError {
    match err {
        AuditReadError::Forbidden => {
            ApiError::new(StatusCode::FORBIDDEN, "forbidden", err.to_string())
        }
        AuditReadError::RateLimited { .. } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            err.to_string(),
        ),
        AuditReadError::NotFound(_) => {
            ApiError::new(StatusCode::NOT_FOUND, "not_found", err.to_string())
        }
        AuditReadError::Database(e) => ApiError::internal(&e),
    }
}

/// `GET /v1/internal/audit/characters/{character_id}?limit&before_at&before_seq`
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
        .map(Json)
        .map_err(read_error)
}

/// `GET /v1/internal/audit/staff?name&viewer_account_id&viewer_tier&limit&before_at&before_seq`
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
        .map(Json)
        .map_err(read_error)
}
