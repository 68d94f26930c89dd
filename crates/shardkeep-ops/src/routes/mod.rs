//! Route handlers, one module per area; shared request parsing lives here.

pub mod admin;
pub mod audit;
pub mod health;
pub mod journal;
pub mod retry;

use std::collections::HashMap;

use axum::http::StatusCode;
use serde::Deserialize;
use uuid::Uuid;

use shardkeep::operator::CharacterFilter;

use crate::contract::RequeueRequest;
use crate::error::ApiError;
use crate::state::AppState;

/// The internal RPC version requeue requests must carry.
pub const RPC_VERSION: i64 = 1;
/// Default page size of listings.
pub const DEFAULT_LIMIT: i64 = 50;
/// Largest page size of listings.
pub const MAX_LIMIT: i64 = 500;

/// Parses `limit` from a query: absent → 50; otherwise an integer clamped to 1..=500; anything
/// else is a 400.
pub fn limit(query: &HashMap<String, String>) -> Result<i64, ApiError> {
    match query.get("limit") {
        None => Ok(DEFAULT_LIMIT),
        Some(raw) => raw
            .trim()
            .parse::<i64>()
            .map(|n| n.clamp(1, MAX_LIMIT))
            .map_err(|_| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_limit",
                    "limit must be an integer",
                )
            }),
    }
}

/// A page of a dead-letter listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// Entries to skip.
    pub offset: i64,
    /// Page size.
    pub limit: i64,
    /// Only this character's.
    pub character: Option<CharacterFilter>,
}

/// Parses `limit`, `offset` (a non-negative integer, 0 when absent) and `character` (an id or
/// a name; blank means all).
pub fn page(query: &HashMap<String, String>) -> Result<Page, ApiError> {
    let offset = match query.get("offset") {
        None => 0,
        Some(raw) => raw
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_offset",
                    "offset must be a non-negative integer",
                )
            })?,
    };
    Ok(Page {
        offset,
        limit: limit(query)?,
        character: query
            .get("character")
            .and_then(|c| CharacterFilter::parse(c)),
    })
}

/// Parses a dead letter id from a path.
pub fn dead_letter_id(raw: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw.trim()).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_dead_letter_id",
            "dead letter id must be a UUID",
        )
    })
}

/// Whether session `token` is active again.
pub async fn session_active(state: &AppState, token: Option<&str>) -> Result<bool, ApiError> {
    match token {
        Some(token) => Ok(state.coord.session_is_active(token).await?),
        None => Ok(false),
    }
}

#[derive(Debug, Deserialize)]
struct RequeueBody {
    rpc_version: Option<serde_json::Value>,
    dead_letter_id: Option<serde_json::Value>,
}

/// Parses a requeue body: a wrong or missing `rpc_version` is a 409; a missing, empty or
/// non-UUID `dead_letter_id` is a 400.
pub fn requeue_request(body: &[u8]) -> Result<RequeueRequest, ApiError> {
    let parsed: RequeueBody = serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            format!("the body is not valid JSON: {e}"),
        )
    })?;
    if parsed
        .rpc_version
        .as_ref()
        .and_then(serde_json::Value::as_i64)
        != Some(RPC_VERSION)
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "rpc_version_mismatch",
            format!("rpc_version must be {RPC_VERSION}"),
        ));
    }
    let id = parsed
        .dead_letter_id
        .as_ref()
        .and_then(serde_json::Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_dead_letter_id",
                "dead_letter_id is required",
            )
        })?;
    let dead_letter_id = Uuid::parse_str(id).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_dead_letter_id",
            "dead_letter_id must be a UUID",
        )
    })?;
    Ok(RequeueRequest {
        rpc_version: RPC_VERSION,
        dead_letter_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn limits_default_clamp_and_reject_garbage() {
        assert_eq!(limit(&q(&[])), Ok(50));
        assert_eq!(limit(&q(&[("limit", "0")])), Ok(1));
        assert_eq!(limit(&q(&[("limit", "9999")])), Ok(500));
        assert_eq!(limit(&q(&[("limit", "-4")])), Ok(1));
        assert_eq!(
            limit(&q(&[("limit", "ten")])).unwrap_err().code,
            "invalid_limit"
        );
        assert_eq!(
            limit(&q(&[("limit", "")])).unwrap_err().code,
            "invalid_limit"
        );
    }

    #[test]
    fn requeue_bodies_are_checked_in_order() {
        let id = Uuid::now_v7();
        let ok = format!(r#"{{"rpc_version": 1, "dead_letter_id": "{id}"}}"#);
        assert_eq!(
            requeue_request(ok.as_bytes()).map(|r| r.dead_letter_id),
            Ok(id)
        );
        let code = |body: &str| requeue_request(body.as_bytes()).unwrap_err().code;
        assert_eq!(
            code(r#"{"rpc_version": 2, "dead_letter_id": "x"}"#),
            "rpc_version_mismatch"
        );
        assert_eq!(code(r#"{"dead_letter_id": "x"}"#), "rpc_version_mismatch");
        assert_eq!(code(r#"{"rpc_version": 1}"#), "invalid_dead_letter_id");
        assert_eq!(
            code(r#"{"rpc_version": 1, "dead_letter_id": "  "}"#),
            "invalid_dead_letter_id"
        );
        assert_eq!(
            code(r#"{"rpc_version": 1, "dead_letter_id": "not-a-uuid"}"#),
            "invalid_dead_letter_id"
        );
        assert_eq!(
            code(r#"{"rpc_version": 1, "dead_letter_id": 7}"#),
            "invalid_dead_letter_id"
        );
        assert_eq!(code("{nope"), "invalid_body");
    }

    #[test]
    fn pages_parse_offset_and_character() {
        let id = Uuid::now_v7();
        let page_of = |pairs: &[(&str, &str)]| page(&q(pairs));
        assert_eq!(
            page_of(&[]),
            Ok(Page {
                offset: 0,
                limit: 50,
                character: None
            })
        );
        let idtext = id.to_string();
        let parsed = page_of(&[("offset", "40"), ("character", &idtext)]).unwrap();
        assert_eq!(parsed.offset, 40);
        assert_eq!(parsed.character, Some(CharacterFilter::Id(id)));
        assert_eq!(
            page_of(&[("character", " Aria ")]).unwrap().character,
            Some(CharacterFilter::Name("Aria".into()))
        );
        assert_eq!(page_of(&[("character", "")]).unwrap().character, None);
        for bad in ["-1", "x", "1.5", ""] {
            assert_eq!(
                page_of(&[("offset", bad)]).unwrap_err().code,
                "invalid_offset",
                "{bad}"
            );
        }
        assert_eq!(
            dead_letter_id("nope").unwrap_err().code,
            "invalid_dead_letter_id"
        );
    }
}
