//! The signed-request gate in front of every `/v1/internal` route. Checks run in a fixed order
//! — headers present and well-formed, known key, signature, timestamp inside the skew window,
//! nonce never seen — and the nonce is registered before the handler runs, so a replay is
//! refused before anything is read or changed.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use shardkeep::coord::NonceRegistration;

use crate::error::ApiError;
use crate::signing::{
    KEY_ID_HEADER, NONCE_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, canonical, nonce_is_valid,
    verify,
};
use crate::state::AppState;
use crate::telemetry;

fn fail(code: &'static str, message: &str) -> ApiError {
    metrics::counter!(telemetry::AUTH_FAILURES_TOTAL, "code" => code).increment(1);
    tracing::warn!(event = "internal_auth_failed", code, "{message}");
    ApiError::unauthorized(code, message)
}

/// Most bytes of an oversized body read and dropped before its 413 goes out, so a client still
/// sending reads the answer instead of a reset; a longer body is cut off.
const DRAIN_BYTES: usize = 4 << 20;
/// Longest the drain of an oversized body waits for its bytes.
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// Reads a whole body of at most `limit` bytes. A longer one is a 413 (its connection closed,
/// see [`ApiError`]'s response), once up to [`DRAIN_BYTES`] of it have been read and dropped;
/// one that breaks off is a 400.
pub(crate) async fn read_body(body: Body, limit: usize) -> Result<axum::body::Bytes, ApiError> {
    use futures::StreamExt as _;
    let unreadable = || ApiError::bad_request("the body could not be read");
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| unreadable())?;
        if bytes.len() + chunk.len() > limit {
            let mut seen = bytes.len() + chunk.len();
            let drain = async {
                while seen <= DRAIN_BYTES {
                    match stream.next().await {
                        Some(Ok(more)) => seen += more.len(),
                        _ => break,
                    }
                }
            };
            let _ = tokio::time::timeout(DRAIN_TIME, drain).await;
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("bodies are limited to {limit} bytes"),
            ));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes.into())
}

/// Verifies the request's signature; answers 401 (or 413 for an oversized body) on failure.
pub async fn require_signature(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let bytes = read_body(body, state.settings.max_body_bytes).await?;
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
    };
    let (Some(key_id), Some(timestamp), Some(nonce), Some(signature)) = (
        header(KEY_ID_HEADER),
        header(TIMESTAMP_HEADER),
        header(NONCE_HEADER),
        header(SIGNATURE_HEADER),
    ) else {
        return Err(fail("missing_header", "the signature headers are required"));
    };
    let Ok(timestamp) = timestamp.parse::<i64>() else {
        return Err(fail(
            "malformed_header",
            "the timestamp must be unix seconds",
        ));
    };
    if !nonce_is_valid(nonce) {
        return Err(fail(
            "malformed_header",
            "the nonce must be 16 to 64 characters of [A-Za-z0-9_-]",
        ));
    }
    let Some(secret) = state.keys.secret(key_id) else {
        return Err(fail("unknown_key", "unknown key id"));
    };
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |p| p.as_str());
    let signed = canonical(
        parts.method.as_str(),
        path_and_query,
        timestamp,
        nonce,
        &bytes,
    );
    if !verify(secret, &signed, signature) {
        return Err(fail("bad_signature", "the signature does not match"));
    }
    let now = chrono::Utc::now().timestamp();
    if (now - timestamp).abs() > state.settings.skew_seconds {
        return Err(fail(
            "stale_timestamp",
            "the timestamp is outside the accepted window",
        ));
    }
    let skew = std::time::Duration::from_secs(state.settings.skew_seconds.unsigned_abs());
    match state.coord.nonce_register(key_id, nonce, skew).await {
        Ok(NonceRegistration::Registered) => {}
        Ok(NonceRegistration::Replayed) => {
            return Err(fail("replayed_nonce", "this nonce was already used"));
        }
        Err(err) => {
            tracing::error!(event = "nonce_register_failed", error = %err);
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "replay protection is unavailable",
            ));
        }
    }
    Ok(next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await)
}
