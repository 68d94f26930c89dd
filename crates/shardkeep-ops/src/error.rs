//! The API's errors: every failure answers `{"error":{"code":…,"message":…}}` with a stable code.
//! Store errors display as a generic internal error so internals never leak.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An API failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// Human-readable message.
    pub message: String,
}

impl ApiError {
    /// An error with `status`, `code` and `message`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    /// 400 with code `bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 401 for an authentication failure with `code`.
    pub fn unauthorized(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, code, message)
    }

    /// 500 that says nothing about the cause (which is logged).
    pub fn internal(cause: &dyn std::fmt::Display) -> Self {
        tracing::error!(event = "api_internal_error", error = %cause);
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "an internal error occurred",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": { "code": self.code, "message": self.message } });
        (self.status, Json(body)).into_response()
    }
}
