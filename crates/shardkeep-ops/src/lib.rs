//! shardkeep's operator surface: the HTTP app that `shardkeep serve` runs.
//!
//! # Layout
//!
//! - [`signing`] — the signed-request scheme (pure): canonical string, HMAC, key sets.
//! - [`auth`] — the middleware in front of every `/v1/internal` route.
//! - [`routes`] — handlers: retry and journal dead letters, admin cleanup, audit reads, health.
//! - [`console`] — the operator console and its session login.
//! - [`telemetry`] — the Prometheus exporter and per-route HTTP metrics.
//! - [`client`] — a signing client of the internal API (used by the CLI).
//! - [`contract`] — every internal route's request and response bodies; [`openapi`] — the
//!   OpenAPI document generated from them.
//! - [`state`], [`error`] — shared handler state and the JSON error shape.

pub mod auth;
pub mod client;
pub mod console;
pub mod contract;
pub mod error;
pub mod openapi;
pub mod routes;
pub mod signing;
pub mod state;
pub mod telemetry;

use axum::Router;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{get, post};

pub use state::{ApiSettings, AppState, WorkerWatch};

/// The whole app: signed internal routes, the console, health and metrics.
pub fn router(state: AppState) -> Router {
    let internal = Router::new()
        .route(
            "/v1/internal/persistence-retry/dead-letters",
            get(routes::retry::list),
        )
        .route(
            "/v1/internal/persistence-retry/dead-letters/requeue",
            post(routes::retry::requeue),
        )
        .route(
            "/v1/internal/persistence-retry/dead-letters/{id}",
            get(routes::retry::detail),
        )
        .route(
            "/v1/internal/session-lifecycle-journal/dead-letters",
            get(routes::journal::list),
        )
        .route(
            "/v1/internal/session-lifecycle-journal/dead-letters/requeue",
            post(routes::journal::requeue),
        )
        .route(
            "/v1/internal/session-lifecycle-journal/dead-letters/{id}",
            get(routes::journal::detail),
        )
        .route("/v1/internal/openapi.json", get(openapi::serve))
        .route(
            "/v1/internal/admin/cleanup-targets",
            get(routes::admin::targets),
        )
        .route("/v1/internal/admin/cleanup", post(routes::admin::cleanup))
        .route(
            "/v1/internal/audit/characters/{character_id}",
            get(routes::audit::character),
        )
        .route("/v1/internal/audit/staff", get(routes::audit::staff))
        .route_layer(from_fn_with_state(state.clone(), auth::require_signature));
    let console_api = Router::new()
        .route("/console/api/depths", get(console::depths))
        .route("/console/api/dead-letters", get(console::dead_letters))
        .route(
            "/console/api/dead-letters/{kind}/{id}",
            get(console::detail),
        )
        .route(
            "/console/api/retry/{id}/requeue",
            post(console::requeue_retry),
        )
        .route(
            "/console/api/journal/{id}/requeue",
            post(console::requeue_journal),
        )
        .route_layer(from_fn_with_state(state.clone(), console::require_session));
    Router::new()
        .merge(internal)
        .merge(console_api)
        .route("/console", get(console::page))
        .route("/console/login", post(console::login))
        .route("/console/logout", post(console::logout))
        .route("/healthz", get(routes::health::healthz))
        .route("/readyz", get(routes::health::readyz))
        .route("/metrics", get(routes::health::metrics))
        .fallback(no_route)
        .method_not_allowed_fallback(no_method)
        .layer(from_fn(telemetry::track))
        .with_state(state)
}

/// Answers a path no route serves, with the API's JSON error body.
async fn no_route() -> error::ApiError {
    error::ApiError::not_found("no route serves this path")
}

/// Answers a method a route does not take, with the API's JSON error body.
async fn no_method() -> error::ApiError {
    error::ApiError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method",
    )
}
