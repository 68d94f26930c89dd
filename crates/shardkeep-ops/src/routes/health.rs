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

/// What readiness found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Readiness {
    /// Everything below holds.
    pub ready: bool,
    /// The durable store answers (Postgres, or the embedded store's file).
    pub postgres: bool,
    /// The fast tier answers (Redis, or the embedded store's file).
    pub redis: bool,
    /// The migrations are current.
    #[serde(rename = "migrations_current")]
    pub migrations: bool,
    /// Workers of this process that finished no pass for the stall bound with work waiting.
    pub stalled_workers: Vec<&'static str>,
}

/// Checks readiness (Postgres and Redis answer, migrations current, no worker of this process
/// stalled with work waiting) and exports it as `shardkeep_ready`.
pub async fn check(state: &AppState) -> Readiness {
    let (postgres, migrations) = match &state.stores {
        shardkeep::Stores::Servers { pg, .. } => {
            let up = pg.ping().await.is_ok();
            (up, up && pg.migrations_current().await.unwrap_or(false))
        }
        shardkeep::Stores::Embedded(db) => {
            let up = db.ping().await.is_ok();
            (up, up && db.migrations_current().await.unwrap_or(false))
        }
    };
    let redis = state.coord.ping().await.is_ok();
    let stalled_workers = stalled(state).await;
    let ready = postgres && redis && migrations && stalled_workers.is_empty();
    metrics::gauge!(crate::telemetry::READY).set(if ready { 1.0 } else { 0.0 });
    Readiness {
        ready,
        postgres,
        redis,
        migrations,
        stalled_workers,
    }
}

/// The workers that have finished no pass for the stall bound while their queue holds work
/// (the depths are read only for a worker that has been quiet that long).
async fn stalled(state: &AppState) -> Vec<&'static str> {
    let Some(watch) = &state.workers else {
        return Vec::new();
    };
    let bound = state.settings.stall_after;
    let mut stalled = Vec::new();
    if !watch.retry_pause.is_held() && watch.liveness.retry.idle_for() > bound {
        let waiting = state.retry.depths().await.map_or(0, |(rows, _)| rows);
        if watch
            .liveness
            .retry
            .stalled(u64::try_from(waiting).unwrap_or(0), bound)
        {
            stalled.push("retry");
        }
    }
    if watch.liveness.journal.idle_for() > bound {
        let waiting = state
            .journal
            .queue()
            .depths()
            .await
            .map_or(0, |d| d.pending);
        if watch.liveness.journal.stalled(waiting, bound) {
            stalled.push("journal");
        }
    }
    stalled
}

/// `GET /readyz`: Postgres and Redis answer, the migrations are current and no worker is
/// stalled.
pub async fn readyz(State(state): State<AppState>) -> Response {
    let readiness = check(&state).await;
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(readiness)).into_response()
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
