//! Unauthenticated health, readiness and metrics.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::state::AppState;

/// `GET /healthz`: the process is up.
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// Checks readiness (Postgres and Redis answer, migrations current) and exports it as
/// `shardkeep_ready`; returns `(ready, postgres, redis, migrations)`.
pub async fn check(state: &AppState) -> (bool, bool, bool, bool) {
    let postgres = state.pg.ping().await.is_ok();
    let migrations = postgres && state.pg.migrations_current().await.unwrap_or(false);
    let redis = state.coord.ping().await.is_ok();
    let ready = postgres && redis && migrations;
    metrics::gauge!(crate::telemetry::READY).set(if ready { 1.0 } else { 0.0 });
    (ready, postgres, redis, migrations)
}

/// `GET /readyz`: Postgres and Redis answer and the migrations are current.
pub async fn readyz(State(state): State<AppState>) -> Response {
    let (ready, postgres, redis, migrations) = check(&state).await;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(json!({ "ready": ready, "postgres": postgres, "redis": redis, "migrations_current": migrations }))).into_response()
}

/// `GET /metrics`: Prometheus text format.
pub async fn metrics(State(state): State<AppState>) -> Response {
    match &state.metrics {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "metrics exporter not installed").into_response(),
    }
}
