//! Retry dead letters in the embedded store's file, as operators see them: the depths, a page
//! filtered by character, one letter with its payload, and retention by age and count — the
//! Postgres reads of `dead_letters`, over the file's representation.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::dead_letters::{DeadLetterDetail, DeadLetterSummary, PRUNE_BATCH};
use super::sqlite_jobs::{instant, json_or_raw};
use crate::backend::SqliteBackend;

/// The summary columns of `persistence_job_dead_letters d LEFT JOIN characters c`.
const SUMMARY_COLUMNS: &str = "d.dead_letter_id, d.retry_job_id, d.job_kind, d.character_id, \
     c.name, d.realm_id, d.zone_id, d.failed_attempts, d.last_error, d.failed_at, \
     d.session_token, d.source, d.session_impact";

type SummaryRow = (
    Uuid,
    Uuid,
    String,
    Uuid,
    Option<String>,
    Option<String>,
    Option<String>,
    i32,
    String,
    i64,
    Option<String>,
    String,
    String,
);

fn summary(row: SummaryRow) -> Result<DeadLetterSummary, sqlx::Error> {
    let (
        id,
        job,
        kind,
        character,
        name,
        realm,
        zone,
        attempts,
        error,
        failed_at,
        session,
        source,
        impact,
    ) = row;
    Ok(DeadLetterSummary {
        dead_letter_id: id,
        retry_job_id: job,
        job_kind: kind,
        character_id: character,
        character_name: name,
        realm_id: realm,
        zone_id: zone,
        failed_attempts: attempts,
        error,
        failed_at: instant("failed_at", failed_at)?,
        session_token: session,
        source,
        session_impact: impact,
    })
}

/// Retry jobs waiting or leased (counted exactly), and active dead letters.
pub(super) async fn counts(db: &SqliteBackend) -> Result<(i64, i64), sqlx::Error> {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM persistence_retry_jobs),
                (SELECT count(*) FROM persistence_job_dead_letters WHERE requeued_at IS NULL)",
    )
    .fetch_one(db.reader()?)
    .await
}

/// A page of active dead letters, newest first, only those of character `id` or named `name`
/// when given (names matched by their folded key, as the store matches them).
pub(super) async fn page(
    db: &SqliteBackend,
    offset: i64,
    limit: i64,
    id: Option<Uuid>,
    name: Option<&str>,
) -> Result<Vec<DeadLetterSummary>, sqlx::Error> {
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS}
           FROM persistence_job_dead_letters d
           LEFT JOIN characters c ON c.id = d.character_id
          WHERE d.requeued_at IS NULL
            AND (?3 IS NULL OR d.character_id = ?3)
            AND (?4 IS NULL OR c.name_key = ?4)
          ORDER BY d.failed_at DESC, d.dead_letter_id DESC
          LIMIT ?1 OFFSET ?2"
    );
    let rows: Vec<SummaryRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(limit)
        .bind(offset.max(0))
        .bind(id)
        .bind(name.map(crate::audit::name_key))
        .fetch_all(db.reader()?)
        .await?;
    rows.into_iter().map(summary).collect()
}

/// The active dead letter `dead_letter_id`, with its payload (text that is not JSON comes back
/// as a JSON string).
pub(super) async fn detail(
    db: &SqliteBackend,
    dead_letter_id: Uuid,
) -> Result<Option<DeadLetterDetail>, sqlx::Error> {
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS}, d.payload
           FROM persistence_job_dead_letters d
           LEFT JOIN characters c ON c.id = d.character_id
          WHERE d.dead_letter_id = ?1 AND d.requeued_at IS NULL"
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(dead_letter_id)
        .fetch_optional(db.reader()?)
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    use sqlx::Row;
    let columns: SummaryRow = (
        row.try_get(0)?,
        row.try_get(1)?,
        row.try_get(2)?,
        row.try_get(3)?,
        row.try_get(4)?,
        row.try_get(5)?,
        row.try_get(6)?,
        row.try_get(7)?,
        row.try_get(8)?,
        row.try_get(9)?,
        row.try_get(10)?,
        row.try_get(11)?,
        row.try_get(12)?,
    );
    let summary = summary(columns)?;
    let payload = json_or_raw(row.try_get(13)?);
    let transfer_already_recorded = match payload.get("transfer_token").and_then(|t| t.as_str()) {
        Some(token) => {
            sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM transfer_activations
                                 WHERE character_id = ?1 AND transfer_token = ?2)",
            )
            .bind(summary.character_id)
            .bind(token)
            .fetch_one(db.reader()?)
            .await?
        }
        None => false,
    };
    Ok(Some(DeadLetterDetail {
        summary,
        payload,
        transfer_already_recorded,
    }))
}

/// One retention pass: deletes (at most 1,000 by age and 1,000 by count) dead letters,
/// requeued or not, that failed before `cutoff` or fall beyond the newest `keep`.
pub(super) async fn prune(
    db: &SqliteBackend,
    cutoff: DateTime<Utc>,
    keep: i64,
) -> Result<u64, sqlx::Error> {
    let mut tx = db.begin().await?;
    let done = sqlx::query(
        "DELETE FROM persistence_job_dead_letters
          WHERE dead_letter_id IN (
                SELECT dead_letter_id FROM persistence_job_dead_letters
                 WHERE failed_at < ?1
                 ORDER BY failed_at
                 LIMIT ?3)
             OR dead_letter_id IN (
                SELECT dead_letter_id FROM persistence_job_dead_letters
                 ORDER BY failed_at DESC, dead_letter_id DESC
                 LIMIT ?3 OFFSET ?2)",
    )
    .bind(cutoff.timestamp_micros())
    .bind(keep)
    .bind(PRUNE_BATCH)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(done.rows_affected())
}
