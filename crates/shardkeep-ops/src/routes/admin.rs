//! Admin cleanup of Redis targets: the descriptors, and dry runs or bounded deletes.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;

use crate::contract::{
    CleanupMode, CleanupReport, CleanupRequest, CleanupTarget, CleanupTargetList, ErrorBody,
};
use crate::error::ApiError;
use crate::state::AppState;

/// `GET /v1/internal/admin/cleanup-targets`
#[utoipa::path(get, operation_id = "admin_targets", path = "/v1/internal/admin/cleanup-targets", tag = "admin",
    responses((status = 401, description = "the signature was refused", body = ErrorBody),
              (status = 503, description = "replay protection is unavailable", body = ErrorBody),
              (status = 200, description = "OK", body = CleanupTargetList)))]
pub async fn targets(State(state): State<AppState>) -> Json<CleanupTargetList> {
    let targets = state
        .coord
        .keys()
        .cleanup_targets()
        .into_iter()
        .map(|t| CleanupTarget {
            name: t.name.to_owned(),
            // The wire name (`game_server`), as before the typed contract.
            owner: serde_json::to_value(t.owner)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            description: t.description.to_owned(),
            exact_keys: t.exact_keys,
            scan_patterns: t.scan_patterns,
        })
        .collect();
    Json(CleanupTargetList { targets })
}

/// `POST /v1/internal/admin/cleanup` with `{"target", "mode": "dry_run" | "delete", "limit"?}`
#[utoipa::path(post, operation_id = "admin_cleanup", path = "/v1/internal/admin/cleanup", tag = "admin",
    request_body = CleanupRequest,
    responses((status = 401, description = "the signature was refused", body = ErrorBody),
              (status = 413, description = "the body is over 64 KiB", body = ErrorBody),
              (status = 503, description = "replay protection is unavailable", body = ErrorBody),
              (status = 200, description = "OK", body = CleanupReport), (status = 400, description = "malformed input", body = ErrorBody)))]
pub async fn cleanup(
    State(state): State<AppState>,
    body: Bytes,
) -> Result<Json<CleanupReport>, ApiError> {
    let body: CleanupRequest = serde_json::from_slice(&body).map_err(|e| {
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
    let mode = match body.mode {
        CleanupMode::DryRun => shardkeep::coord::CleanupMode::DryRun,
        CleanupMode::Delete => shardkeep::coord::CleanupMode::Delete,
    };
    let report = state.coord.cleanup_run(&body.target, mode, limit).await?;
    Ok(Json(CleanupReport {
        target: report.target,
        mode: body.mode,
        matched: report.matched,
        deleted: report.deleted,
        deleted_keys: report.deleted_keys,
        complete: report.complete,
    }))
}
