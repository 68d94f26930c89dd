//! The metrics exporter, HTTP metrics labelled by matched route, and this crate's metric names.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Internal-auth failures, labelled `code`.
pub const AUTH_FAILURES_TOTAL: &str = "shardkeep_auth_failures_total";
/// 1 when the last readiness check passed, else 0.
pub const READY: &str = "shardkeep_ready";
/// HTTP requests, labelled `route` (the matched pattern, never the raw path), `method`, `status`.
pub const HTTP_REQUESTS_TOTAL: &str = "shardkeep_http_requests_total";
/// HTTP request durations, labelled `route` and `method`.
pub const HTTP_REQUEST_SECONDS: &str = "shardkeep_http_request_seconds";

/// Installs the Prometheus recorder (once per process) and describes every metric.
pub fn install() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| e.to_string())?;
    shardkeep::telemetry::describe();
    shardkeep::telemetry::register_all(&[shardkeep::journal::JOURNAL_QUEUE]);
    metrics::describe_counter!(AUTH_FAILURES_TOTAL, "Internal-auth failures by code.");
    metrics::describe_gauge!(READY, "1 when the last readiness check passed, else 0.");
    metrics::describe_counter!(HTTP_REQUESTS_TOTAL, "HTTP requests by matched route.");
    metrics::describe_histogram!(
        HTTP_REQUEST_SECONDS,
        metrics::Unit::Seconds,
        "HTTP request durations."
    );
    Ok(handle)
}

/// Records every request under its matched route.
pub async fn track(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = request.method().as_str().to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!(HTTP_REQUESTS_TOTAL, "route" => route.clone(), "method" => method.clone(), "status" => status)
        .increment(1);
    metrics::histogram!(HTTP_REQUEST_SECONDS, "route" => route, "method" => method)
        .record(started.elapsed().as_secs_f64());
    response
}
