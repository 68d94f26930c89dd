//! The OpenAPI 3.1 document of the signed internal API, generated from the handlers and the
//! [`crate::contract`] types; served at `/v1/internal/openapi.json` and committed as
//! `docs/openapi.json`.

use axum::Json;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::contract;
use crate::routes;

/// The document's source.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "shardkeep internal API",
        description = "Dead letters, admin cleanup and audit reads. Every request is signed: \
            `x-shardkeep-key-id`, `x-shardkeep-timestamp` (unix seconds, within the skew \
            window), `x-shardkeep-nonce` (16-64 of [A-Za-z0-9_-], single use) and \
            `x-shardkeep-signature` (hex HMAC-SHA256 of the canonical request); see \
            docs/signing/README.md. Bodies are at most 64 KiB."
    ),
    paths(
        routes::retry::list,
        routes::retry::detail,
        routes::retry::requeue,
        routes::journal::list,
        routes::journal::detail,
        routes::journal::requeue,
        routes::admin::targets,
        routes::admin::cleanup,
        routes::audit::character,
        routes::audit::staff,
    ),
    modifiers(&SignedRequests),
    security(("signed_request" = [])),
    components(schemas(
        contract::ErrorBody,
        contract::ErrorDetail,
        contract::OperatorChecks,
        contract::RetryDeadLetter,
        contract::RetryDeadLetterList,
        contract::RetryDeadLetterDetail,
        contract::JournalDeadLetter,
        contract::JournalDeadLetterList,
        contract::JournalDeadLetterDetail,
        contract::RequeueRequest,
        contract::RetryRequeueResponse,
        contract::JournalRequeueResponse,
        contract::CleanupTarget,
        contract::CleanupTargetList,
        contract::CleanupMode,
        contract::CleanupRequest,
        contract::CleanupReport,
        contract::AuditRow,
        contract::AuditCursor,
        contract::AuditPage,
    ))
)]
pub struct ApiDoc;

/// Declares the signed-request scheme (the four headers; see `docs/signing/README.md`).
struct SignedRequests;

impl Modify for SignedRequests {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let scheme = SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
            "x-shardkeep-signature",
            "Lowercase hex HMAC-SHA256, under the secret of `x-shardkeep-key-id`, of \
             METHOD\\nPATH_AND_QUERY\\nTIMESTAMP\\nNONCE\\nhex(SHA256(body)); sent with \
             `x-shardkeep-key-id`, `x-shardkeep-timestamp` and `x-shardkeep-nonce`.",
        )));
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme("signed_request", scheme);
    }
}

/// The document as pretty JSON (what `docs/openapi.json` holds).
pub fn document() -> String {
    ApiDoc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// `GET /v1/internal/openapi.json` (signed like every internal route).
pub async fn serve() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
