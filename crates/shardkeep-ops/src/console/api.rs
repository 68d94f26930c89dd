//! The console's data calls: queue depths, pages of dead letters (by kind, filtered by
//! character), one dead letter with the checks to make first, and requeue. Details are the
//! signed API's own bodies.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::error::ApiError;
use crate::routes;
use crate::state::AppState;

/// Default console page size.
const CONSOLE_PAGE: i64 = 20;

/// Depth tiles.
#[derive(Debug, Serialize)]
pub struct Depths {
    retry: RetryDepths,
    journal: JournalDepths,
}

#[derive(Debug, Serialize)]
struct RetryDepths {
    pending: i64,
    dead: i64,
}

#[derive(Debug, Serialize)]
struct JournalDepths {
    pending: u64,
    processing: u64,
    dead: u64,
}

/// One row of the console's dead-letter table.
#[derive(Debug, Serialize)]
pub struct Row {
    dead_letter_id: Uuid,
    character_id: Option<Uuid>,
    character_name: Option<String>,
    what: Option<String>,
    error: String,
    attempts: i64,
    failed_at: DateTime<Utc>,
}

/// A page of one kind's dead letters.
#[derive(Debug, Serialize)]
pub struct RowPage {
    kind: &'static str,
    offset: i64,
    limit: i64,
    has_more: bool,
    items: Vec<Row>,
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Retry,
    Journal,
}

fn kind(raw: Option<&str>) -> Result<Kind, ApiError> {
    match raw.map(str::trim) {
        None | Some("retry") => Ok(Kind::Retry),
        Some("journal") => Ok(Kind::Journal),
        Some(_) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_kind",
            "kind must be retry or journal",
        )),
    }
}

/// `GET /console/api/depths`
pub async fn depths(State(state): State<AppState>) -> Result<Json<Depths>, ApiError> {
    let (pending, dead) = state.retry.depths().await?;
    let journal = state.journal.queue().depths().await?;
    Ok(Json(Depths {
        retry: RetryDepths { pending, dead },
        journal: JournalDepths {
            pending: journal.pending,
            processing: journal.processing,
            dead: journal.dead,
        },
    }))
}

/// `GET /console/api/dead-letters?kind&character&offset&limit`
pub async fn dead_letters(
    State(state): State<AppState>,
    Query(mut query): Query<HashMap<String, String>>,
) -> Result<Json<RowPage>, ApiError> {
    let kind = kind(query.get("kind").map(String::as_str))?;
    query
        .entry("limit".into())
        .or_insert_with(|| CONSOLE_PAGE.to_string());
    let mut page = routes::page(&query)?;
    // One more than the page says whether another follows (so a page stays under the cap).
    page.limit = page.limit.min(shardkeep::retry::MAX_INSPECT_LIMIT - 1);
    let probe = page.limit + 1;
    let (name, mut items): (&'static str, Vec<Row>) = match kind {
        Kind::Retry => {
            let found = state
                .retry
                .dead_letters_page(page.offset, probe, page.character.as_ref())
                .await?;
            let rows = found
                .dead_letters
                .into_iter()
                .map(|l| Row {
                    dead_letter_id: l.dead_letter_id,
                    character_id: Some(l.character_id),
                    character_name: l.character_name,
                    what: Some(l.job_kind),
                    error: l.error,
                    attempts: i64::from(l.failed_attempts),
                    failed_at: l.failed_at,
                })
                .collect();
            ("retry", rows)
        }
        Kind::Journal => {
            let found = state
                .journal
                .dead_letters_page(
                    usize::try_from(page.offset).unwrap_or(0),
                    usize::try_from(probe).unwrap_or(21),
                    page.character.as_ref(),
                )
                .await?;
            let rows = found
                .into_iter()
                .map(|l| Row {
                    dead_letter_id: l.dead_letter_id,
                    character_id: l.character_id,
                    character_name: l.character_name,
                    what: l.plan.map(|p| p.as_str().to_owned()),
                    error: l.error,
                    attempts: i64::from(l.attempts),
                    failed_at: l.failed_at,
                })
                .collect();
            ("journal", rows)
        }
    };
    let has_more = items.len() as i64 > page.limit;
    items.truncate(usize::try_from(page.limit).unwrap_or(20));
    Ok(Json(RowPage {
        kind: name,
        offset: page.offset,
        limit: page.limit,
        has_more,
        items,
    }))
}

/// `GET /console/api/dead-letters/{kind}/{id}`: the signed API's detail body.
pub async fn detail(
    State(state): State<AppState>,
    Path((which, id)): Path<(String, String)>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let id = routes::dead_letter_id(&id)?;
    Ok(match kind(Some(&which))? {
        Kind::Retry => Json(routes::retry::detail_of(&state, id).await?).into_response(),
        Kind::Journal => Json(routes::journal::detail_of(&state, id).await?).into_response(),
    })
}

/// `POST /console/api/retry/{id}/requeue`
pub async fn requeue_retry(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<crate::contract::RetryRequeueResponse>, ApiError> {
    routes::retry::requeue_id(&state, routes::dead_letter_id(&id)?).await
}

/// `POST /console/api/journal/{id}/requeue`
pub async fn requeue_journal(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<crate::contract::JournalRequeueResponse>, ApiError> {
    routes::journal::requeue_id(&state, routes::dead_letter_id(&id)?).await
}
