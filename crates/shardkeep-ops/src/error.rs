//! The API's errors: every failure answers `{"error":{"code":…,"message":…}}` with a stable code.
//! Store errors display as a generic internal error so internals never leak.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use shardkeep::CoordError;
use shardkeep::audit::AuditReadError;
use shardkeep::queue::QueueError;
use shardkeep::retry::{RequeueError, RetryError};

use crate::contract::{ErrorBody, ErrorDetail};

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

    /// 404 with code `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
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
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_owned(),
                message: self.message,
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body was never read, so the connection cannot carry another
            // request: say so, or a client reuses it and loses its next request.
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        response
    }
}

impl From<RetryError> for ApiError {
    fn from(err: RetryError) -> Self {
        match err {
            RetryError::Requeue(RequeueError::Undecodable(reason)) => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "undecodable_job",
                format!("the saved job cannot be restored: {reason}"),
            ),
            other => Self::internal(&other),
        }
    }
}

impl From<QueueError> for ApiError {
    fn from(err: QueueError) -> Self {
        match err {
            QueueError::Undecodable(_) => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "undecodable_entry",
                "the dead letter's item cannot be decoded",
            ),
            other => Self::internal(&other),
        }
    }
}

impl From<CoordError> for ApiError {
    fn from(err: CoordError) -> Self {
        match err {
            CoordError::InvalidInput(message) => Self::bad_request(message),
            other => Self::internal(&other),
        }
    }
}

impl From<AuditReadError> for ApiError {
    fn from(err: AuditReadError) -> Self {
        match err {
            AuditReadError::Forbidden => {
                Self::new(StatusCode::FORBIDDEN, "forbidden", err.to_string())
            }
            AuditReadError::RateLimited { .. } => Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                err.to_string(),
            ),
            AuditReadError::NotFound(_) => Self::not_found(err.to_string()),
            AuditReadError::Database(e) => Self::internal(&e),
        }
    }
}
