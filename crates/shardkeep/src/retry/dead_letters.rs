//! Retry dead letters as operators see them: pages (filtered by character), one letter with its
//! payload and the facts to check before a requeue, and retention by age and count.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::job_tx::JobStore;
use super::sqlite_dead_letters as embedded;
use crate::backend::PostgresBackend;
use crate::operator::CharacterFilter;
use crate::queue::DeadLetterRetention;

/// Largest page of dead letters.
pub const MAX_INSPECT_LIMIT: i64 = 500;
/// Dead letters one retention pass deletes at most.
pub(super) const PRUNE_BATCH: i64 = 1_000;

/// One dead letter, as operators see it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct DeadLetterSummary {
    /// Dead letter id.
    pub dead_letter_id: Uuid,
    /// The job it came from.
    pub retry_job_id: Uuid,
    /// Payload kind.
    pub job_kind: String,
    /// The character.
    pub character_id: Uuid,
    /// Its name, when the character row exists.
    pub character_name: Option<String>,
    /// Realm, if tagged.
    pub realm_id: Option<String>,
    /// Zone, if the payload names one.
    pub zone_id: Option<String>,
    /// Attempts made.
    pub failed_attempts: i32,
    /// The last error.
    pub error: String,
    /// When it was dead-lettered.
    pub failed_at: DateTime<Utc>,
    /// The session it belonged to.
    pub session_token: Option<String>,
    /// The enqueuing component.
    pub source: String,
    /// Its session impact.
    pub session_impact: String,
}

/// What an inspection found.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeadLetterInspection {
    /// Retry jobs waiting or leased.
    pub pending_retry_jobs: i64,
    /// Dead letters not yet requeued.
    pub active_dead_letters: i64,
    /// The newest active dead letters.
    pub dead_letters: Vec<DeadLetterSummary>,
}

/// One active dead letter with its saved payload.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeadLetterDetail {
    /// The summary operators see.
    pub summary: DeadLetterSummary,
    /// The saved payload (raw JSON; it may not decode).
    pub payload: serde_json::Value,
    /// Whether a transfer activation in the payload is already recorded.
    pub transfer_already_recorded: bool,
}

/// The summary columns of `persistence_job_dead_letters d LEFT JOIN characters c`.
macro_rules! summary_columns {
    () => {
        "SELECT d.dead_letter_id, d.retry_job_id, d.job_kind, d.character_id,
                c.name AS character_name, d.realm_id, d.zone_id, d.failed_attempts,
                d.last_error AS error, d.failed_at, d.session_token, d.source, d.session_impact"
    };
}

/// Retry jobs waiting or leased (exact up to 10,000, then Postgres's live-row estimate), and
/// active dead letters.
pub(crate) async fn counts(store: &JobStore) -> Result<(i64, i64), sqlx::Error> {
    let pg = match store {
        JobStore::Postgres(pg) => pg,
        JobStore::Embedded(db) => return embedded::counts(db).await,
    };
    let jobs = super::counts::job_counts(store).await?;
    let dead: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM persistence_job_dead_letters WHERE requeued_at IS NULL",
    )
    .fetch_one(pg.exec())
    .await?;
    Ok((jobs.pending + jobs.leased, dead))
}

/// Pending jobs, active dead letters and a page of the active ones, newest first: `limit`
/// (clamped to 1..=500) after skipping `offset`, only `character`'s when given.
pub(crate) async fn inspect(
    jobs: &JobStore,
    offset: i64,
    limit: i64,
    character: Option<&CharacterFilter>,
) -> Result<DeadLetterInspection, sqlx::Error> {
    let limit = limit.clamp(1, MAX_INSPECT_LIMIT);
    let (pending_retry_jobs, active_dead_letters) = counts(jobs).await?;
    let (id, name) = match character {
        Some(CharacterFilter::Id(id)) => (Some(*id), None),
        Some(CharacterFilter::Name(name)) => (None, Some(name.as_str())),
        None => (None, None),
    };
    let dead_letters = match jobs {
        JobStore::Postgres(pg) => page(pg, offset, limit, id, name).await?,
        JobStore::Embedded(db) => embedded::page(db, offset, limit, id, name).await?,
    };
    Ok(DeadLetterInspection {
        pending_retry_jobs,
        active_dead_letters,
        dead_letters,
    })
}

/// Postgres: a page of active dead letters, newest first, filtered by character id or name.
async fn page(
    pg: &PostgresBackend,
    offset: i64,
    limit: i64,
    id: Option<Uuid>,
    name: Option<&str>,
) -> Result<Vec<DeadLetterSummary>, sqlx::Error> {
    sqlx::query_as(concat!(
        summary_columns!(),
        "
           FROM persistence_job_dead_letters d
           LEFT JOIN characters c ON c.id = d.character_id
          WHERE d.requeued_at IS NULL
            AND ($3::uuid IS NULL OR d.character_id = $3)
            AND ($4::text IS NULL OR lower(c.name) = lower($4))
          ORDER BY d.failed_at DESC, d.dead_letter_id DESC
          LIMIT $1 OFFSET $2"
    ))
    .bind(limit)
    .bind(offset.max(0))
    .bind(id)
    .bind(name)
    .fetch_all(pg.exec())
    .await
}

/// The active dead letter `dead_letter_id`, with its payload.
pub(crate) async fn detail(
    jobs: &JobStore,
    dead_letter_id: Uuid,
) -> Result<Option<DeadLetterDetail>, sqlx::Error> {
    let pg = match jobs {
        JobStore::Postgres(pg) => pg,
        JobStore::Embedded(db) => return embedded::detail(db, dead_letter_id).await,
    };
    #[derive(sqlx::FromRow)]
    struct DetailRow {
        #[sqlx(flatten)]
        summary: DeadLetterSummary,
        payload: serde_json::Value,
    }
    let row: Option<DetailRow> = sqlx::query_as(concat!(
        summary_columns!(),
        ", d.payload
           FROM persistence_job_dead_letters d
           LEFT JOIN characters c ON c.id = d.character_id
          WHERE d.dead_letter_id = $1 AND d.requeued_at IS NULL"
    ))
    .bind(dead_letter_id)
    .fetch_optional(pg.exec())
    .await?;
    let Some(DetailRow { summary, payload }) = row else {
        return Ok(None);
    };
    let transfer_token = payload
        .get("transfer_token")
        .and_then(|t| t.as_str())
        .map(str::to_owned);
    let transfer_already_recorded = match transfer_token {
        Some(token) => {
            sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM transfer_activations
                                 WHERE character_id = $1 AND transfer_token = $2)",
            )
            .bind(summary.character_id)
            .bind(token)
            .fetch_one(pg.exec())
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

/// One retention pass: deletes (at most 2,000: 1,000 by age, 1,000 by count) dead letters, requeued or not, older than
/// `max_age` or beyond the newest `max_count`. Returns how many went.
pub(crate) async fn prune(
    jobs: &JobStore,
    retention: DeadLetterRetention,
    now: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    let age = chrono::Duration::from_std(retention.max_age).unwrap_or(chrono::Duration::MAX);
    let cutoff = now
        .checked_sub_signed(age)
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    let keep = i64::try_from(retention.max_count).unwrap_or(i64::MAX);
    let pg = match jobs {
        JobStore::Postgres(pg) => pg,
        JobStore::Embedded(db) => return embedded::prune(db, cutoff, keep).await,
    };
    let done = sqlx::query(
        "DELETE FROM persistence_job_dead_letters
          WHERE dead_letter_id IN (
                SELECT dead_letter_id FROM persistence_job_dead_letters
                 WHERE failed_at < $1
                 ORDER BY failed_at
                 LIMIT $3)
             OR dead_letter_id IN (
                SELECT dead_letter_id FROM persistence_job_dead_letters
                 ORDER BY failed_at DESC, dead_letter_id DESC
                 OFFSET $2 LIMIT $3)",
    )
    .bind(cutoff)
    .bind(keep)
    .bind(PRUNE_BATCH)
    .execute(pg.exec())
    .await?;
    Ok(done.rows_affected())
}
