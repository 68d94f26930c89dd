//! Retry jobs and their dead letters in the embedded store's file: insert, the claim (due rows,
//! oldest first, under a lease fenced by its token), the writes that end a settle, and requeue.
//!
//! Every write runs in a transaction holding the file's write lock, so a claim's read and its
//! lease are one atomic step, as `FOR UPDATE SKIP LOCKED` makes them on Postgres. Instants are
//! microseconds since the epoch; ids are 16-byte blobs.

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use uuid::Uuid;

use super::job::{PersistenceRetryJob, StoredJob};
use super::settle_writes::OutcomeWrites;
use super::store::ClaimedRow;
use crate::backend::SqliteBackend;

/// When a job can next be claimed: written exactly as the `persistence_retry_jobs_claimable`
/// index's expression, so the claim walks that index.
const CLAIMABLE_AT: &str = "CASE WHEN lease_token IS NULL THEN next_attempt_at \
     ELSE max(next_attempt_at, lease_expires_at) END";

/// The columns of a job as a claim reads it.
const CLAIM_COLUMNS: &str = "retry_job_id, job_kind, character_id, realm_id, zone_id, payload, \
     session_token, session_impact, source, idempotency_key, owner_epoch, origin, issued_at, \
     issue_seq, dumped_at_version, attempt_count, next_attempt_at, created_at, lease_expiries";

/// `?start, ?start+1, …` for `n` parameters.
pub(super) fn marks(start: usize, n: usize) -> String {
    (start..start + n)
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The integer column `$c`, or 0 when a foreign writer stored something else there.
macro_rules! int_or_zero {
    ($c:literal) => {
        concat!(
            "(CASE WHEN typeof(",
            $c,
            ") = 'integer' THEN ",
            $c,
            " ELSE 0 END)"
        )
    };
}

/// An instant as the file stores it.
fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

/// An instant the file stores, or a decode error naming the column.
pub(super) fn instant(column: &str, value: i64) -> Result<DateTime<Utc>, sqlx::Error> {
    DateTime::from_timestamp_micros(value).ok_or_else(|| {
        sqlx::Error::Decode(format!("{column} {value} is not an instant (microseconds)").into())
    })
}

/// A stored JSON text as a value; text that does not parse is kept as a JSON string, so the
/// job's decode fails and the job is dead-lettered as undecodable (its raw text stays in the row).
pub(super) fn json_or_raw(text: String) -> serde_json::Value {
    serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text))
}

/// The job columns of `row` (`JOB_COLUMNS` order, by name).
fn stored_job(row: &SqliteRow) -> Result<StoredJob, sqlx::Error> {
    Ok(StoredJob {
        retry_job_id: row.try_get("retry_job_id")?,
        job_kind: row.try_get("job_kind")?,
        character_id: row.try_get("character_id")?,
        realm_id: row.try_get("realm_id")?,
        zone_id: row.try_get("zone_id")?,
        payload: json_or_raw(row.try_get("payload")?),
        session_token: row.try_get("session_token")?,
        session_impact: row.try_get("session_impact")?,
        source: row.try_get("source")?,
        idempotency_key: row.try_get("idempotency_key")?,
        owner_epoch: row.try_get("owner_epoch")?,
        origin: row.try_get("origin")?,
        issued_at: instant("issued_at", row.try_get("issued_at")?)?,
        issue_seq: row.try_get("issue_seq")?,
        dumped_at_version: row.try_get("dumped_at_version")?,
    })
}

/// A claimed row (`CLAIM_COLUMNS` plus `lease_expired`).
fn claimed_row(row: &SqliteRow) -> Result<ClaimedRow, sqlx::Error> {
    Ok(ClaimedRow {
        stored: stored_job(row)?,
        attempt_count: row.try_get("attempt_count")?,
        next_attempt_at: instant("next_attempt_at", row.try_get("next_attempt_at")?)?,
        created_at: instant("created_at", row.try_get("created_at")?)?,
        lease_expiries: row.try_get("lease_expiries")?,
        lease_expired: row.try_get("lease_expired")?,
    })
}

/// The claimed rows of `rows`, each decoded on its own: the file's columns are loosely typed, so
/// a row written by hand or by a foreign tool can hold a value of the wrong type. Such a row is
/// claimed as undecodable (its payload replaced by a text naming the failure and keeping the
/// stored payload), so the settle dead-letters it and the jobs behind it go on. A row whose ids
/// are not blobs cannot be addressed at all: the claim's query leaves it out (it would hold a
/// slot of every batch), and one of a wrong length is skipped here with a warning.
fn claimed_rows(rows: &[SqliteRow]) -> Vec<ClaimedRow> {
    rows.iter()
        .filter_map(|row| match claimed_row(row) {
            Ok(claimed) => Some(claimed),
            Err(err) => undecodable_row(row, &err),
        })
        .collect()
}

/// A row that does not decode, as a claim of an undecodable job (see [`claimed_rows`]).
fn undecodable_row(row: &SqliteRow, err: &sqlx::Error) -> Option<ClaimedRow> {
    let ids = (
        row.try_get::<Uuid, _>("retry_job_id"),
        row.try_get::<Uuid, _>("character_id"),
    );
    let (Ok(retry_job_id), Ok(character_id)) = ids else {
        tracing::warn!(event = "retry_row_unaddressable", error = %err,
            "a retry job row whose ids do not decode is skipped; delete it by hand");
        return None;
    };
    tracing::warn!(event = "retry_row_undecodable", job = %retry_job_id, error = %err);
    let text = |column: &str| row.try_get::<String, _>(column).ok();
    let at = |column: &str| {
        row.try_get::<i64, _>(column)
            .ok()
            .and_then(DateTime::from_timestamp_micros)
            .unwrap_or(DateTime::UNIX_EPOCH)
    };
    let stored_payload = text("payload").unwrap_or_default();
    Some(ClaimedRow {
        stored: StoredJob {
            retry_job_id,
            job_kind: text("job_kind").unwrap_or_else(|| "undecodable".into()),
            character_id,
            realm_id: text("realm_id"),
            zone_id: text("zone_id"),
            payload: serde_json::Value::String(format!(
                "the stored row does not decode ({err}); its payload: {stored_payload}"
            )),
            session_token: text("session_token"),
            session_impact: text("session_impact").unwrap_or_default(),
            source: text("source").unwrap_or_default(),
            idempotency_key: text("idempotency_key").unwrap_or_default(),
            owner_epoch: row.try_get("owner_epoch").unwrap_or(0),
            origin: text("origin").unwrap_or_default(),
            issued_at: at("issued_at"),
            issue_seq: row.try_get("issue_seq").unwrap_or(0),
            dumped_at_version: row.try_get("dumped_at_version").unwrap_or(None),
        },
        attempt_count: row.try_get("attempt_count").unwrap_or(0),
        next_attempt_at: at("next_attempt_at"),
        created_at: at("created_at"),
        lease_expiries: row.try_get("lease_expiries").unwrap_or(0),
        lease_expired: row.try_get("lease_expired").unwrap_or(false),
    })
}

/// Stores `jobs` (each due at the instant given with it) in the caller's write transaction; a
/// job stored already (the same id) stays as it is.
pub(super) async fn insert_jobs(
    conn: &mut sqlx::SqliteConnection,
    jobs: &[(&PersistenceRetryJob, DateTime<Utc>)],
) -> Result<(), sqlx::Error> {
    for (job, due) in jobs {
        let envelope = job.envelope();
        let payload =
            serde_json::to_string(job.payload()).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
        sqlx::query(
            "INSERT INTO persistence_retry_jobs (retry_job_id, job_kind, character_id, realm_id,
                 zone_id, payload, next_attempt_at, session_token, session_impact, source,
                 idempotency_key, owner_epoch, origin, issued_at, issue_seq, dumped_at_version,
                 created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?7, ?7)
             ON CONFLICT (character_id, retry_job_id) DO NOTHING",
        )
        .bind(job.retry_job_id())
        .bind(job.payload().kind())
        .bind(job.payload().character_id())
        .bind(job.realm_id())
        .bind(job.payload().zone_id())
        .bind(payload)
        .bind(micros(*due))
        .bind(job.session_token())
        .bind(job.session_impact().as_str())
        .bind(job.source())
        .bind(&envelope.idempotency_key)
        .bind(envelope.owner_epoch)
        .bind(envelope.origin.as_str())
        .bind(micros(envelope.issued_at))
        .bind(i64::try_from(envelope.issue_seq).unwrap_or(i64::MAX))
        .bind(job.dumped_at_version())
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// The claim's query: jobs claimable at `?1`, oldest first, at most `?2`; only the `n` ids
/// bound from `?3` on when given.
fn due_sql(ids: Option<usize>) -> String {
    let which = match ids {
        Some(n) => format!("retry_job_id IN ({}) AND", marks(3, n)),
        None => String::new(),
    };
    format!(
        "SELECT {CLAIM_COLUMNS}, lease_token IS NOT NULL AS lease_expired
           FROM persistence_retry_jobs
          WHERE {which} {CLAIMABLE_AT} <= ?1
            AND typeof(retry_job_id) = 'blob' AND typeof(character_id) = 'blob'
          ORDER BY {CLAIMABLE_AT}, created_at
          LIMIT ?2"
    )
}

/// The query of [`pending_for`].
fn pending_sql() -> String {
    format!(
        "SELECT {CLAIM_COLUMNS}, 0 AS lease_expired FROM persistence_retry_jobs
          WHERE character_id = ?1 ORDER BY retry_job_id"
    )
}

/// Up to `limit` jobs claimable at `now` (only `ids` when given), oldest first, inside the
/// caller's write transaction (which locks them: the file has one writer).
pub(super) async fn due(
    conn: &mut sqlx::SqliteConnection,
    ids: Option<&[Uuid]>,
    limit: i64,
    now: DateTime<Utc>,
) -> Result<Vec<ClaimedRow>, sqlx::Error> {
    if ids.is_some_and(<[Uuid]>::is_empty) {
        return Ok(Vec::new());
    }
    let mut query = sqlx::query(sqlx::AssertSqlSafe(due_sql(ids.map(<[Uuid]>::len))))
        .bind(micros(now))
        .bind(limit);
    for id in ids.unwrap_or_default() {
        query = query.bind(*id);
    }
    Ok(claimed_rows(&query.fetch_all(&mut *conn).await?))
}

/// Claims up to `limit` due jobs (only `ids` when given) under a new lease (`token`, held by
/// `owner` for `lease`), in one write transaction; a lease that had run out is counted.
pub(super) async fn claim(
    db: &SqliteBackend,
    ids: Option<&[Uuid]>,
    limit: i64,
    owner: &str,
    token: Uuid,
    now: DateTime<Utc>,
    lease: std::time::Duration,
) -> Result<Vec<ClaimedRow>, sqlx::Error> {
    let mut tx = db.begin().await?;
    let mut rows = due(&mut tx, ids, limit, now).await?;
    if rows.is_empty() {
        tx.rollback().await?;
        return Ok(rows);
    }
    let lease_micros = i64::try_from(lease.as_micros()).unwrap_or(i64::MAX);
    for row in &mut rows {
        sqlx::query(
            "UPDATE persistence_retry_jobs
                SET lease_token = ?2, lease_owner = ?3, lease_expires_at = ?4, updated_at = ?5,
                    lease_expiries = lease_expiries + (lease_token IS NOT NULL)
              WHERE retry_job_id = ?1",
        )
        .bind(row.stored.retry_job_id)
        .bind(token)
        .bind(owner)
        .bind(micros(now).saturating_add(lease_micros))
        .bind(micros(now))
        .execute(&mut *tx)
        .await?;
        row.lease_expiries += i32::from(row.lease_expired);
    }
    tx.commit().await?;
    rows.sort_by_key(|r| (r.next_attempt_at, r.created_at));
    Ok(rows)
}

/// Those of `ids` still leased under `token`.
pub(super) async fn leased_to(
    conn: &mut sqlx::SqliteConnection,
    ids: &[Uuid],
    token: Uuid,
) -> Result<Vec<Uuid>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "SELECT retry_job_id FROM persistence_retry_jobs
          WHERE lease_token = ?1 AND retry_job_id IN ({})",
        marks(2, ids.len())
    );
    let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(token);
    for id in ids {
        query = query.bind(*id);
    }
    query.fetch_all(&mut *conn).await
}

/// Every job queued for `character_id`, in id order, whatever its due time or lease.
pub(super) async fn pending_for(
    conn: &mut sqlx::SqliteConnection,
    character_id: Uuid,
) -> Result<Vec<ClaimedRow>, sqlx::Error> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(pending_sql()))
        .bind(character_id)
        .fetch_all(&mut *conn)
        .await?;
    Ok(claimed_rows(&rows))
}

/// The writes of [`OutcomeWrites`], one statement per job.
pub(super) async fn write_outcomes(
    conn: &mut sqlx::SqliteConnection,
    writes: &OutcomeWrites,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    let now = micros(now);
    // A deferral keeps the count of leases that ran out (see the Postgres statements).
    for (id, error) in &writes.deferred {
        sqlx::query(
            "UPDATE persistence_retry_jobs
                SET last_error = ?2, next_attempt_at = ?3, lease_token = NULL, lease_owner = NULL,
                    lease_expires_at = NULL, updated_at = ?4
              WHERE retry_job_id = ?1",
        )
        .bind(id)
        .bind(error)
        .bind(micros(writes.deferred_until))
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    for id in &writes.done {
        sqlx::query("DELETE FROM persistence_retry_jobs WHERE retry_job_id = ?1")
            .bind(id)
            .execute(&mut *conn)
            .await?;
    }
    for (id, error, at) in &writes.retry {
        sqlx::query(
            "UPDATE persistence_retry_jobs
                SET last_error = ?2, attempt_count = attempt_count + 1, next_attempt_at = ?3,
                    lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL,
                    updated_at = ?4, lease_expiries = 0
              WHERE retry_job_id = ?1",
        )
        .bind(id)
        .bind(error)
        .bind(micros(*at))
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    for (id, error, dead_letter_id) in &writes.dead {
        // A row a foreign writer gave a value of the wrong type (see `claimed_rows`) becomes a
        // dead letter that still reads back: text columns as text, numbers that are not
        // integers as 0.
        sqlx::query(concat!(
            "INSERT INTO persistence_job_dead_letters (dead_letter_id, retry_job_id, job_kind,
                 character_id, realm_id, zone_id, payload, failed_attempts, last_error, failed_at,
                 session_token, source, session_impact, idempotency_key, owner_epoch, origin,
                 issued_at, issue_seq, dumped_at_version)
             SELECT ?2, retry_job_id, CAST(job_kind AS TEXT), character_id,
                    CAST(realm_id AS TEXT), CAST(zone_id AS TEXT), CAST(payload AS TEXT), ",
            int_or_zero!("attempt_count"),
            " + 1, ?3, ?4, CAST(session_token AS TEXT), CAST(source AS TEXT),
                    CAST(session_impact AS TEXT), CAST(idempotency_key AS TEXT), ",
            int_or_zero!("owner_epoch"),
            ", CAST(origin AS TEXT), ",
            int_or_zero!("issued_at"),
            ", ",
            int_or_zero!("issue_seq"),
            ", (CASE WHEN typeof(dumped_at_version) = 'integer' THEN dumped_at_version END)",
            " FROM persistence_retry_jobs WHERE retry_job_id = ?1"
        ))
        .bind(id)
        .bind(dead_letter_id)
        .bind(error)
        .bind(now)
        .execute(&mut *conn)
        .await?;
        sqlx::query("DELETE FROM persistence_retry_jobs WHERE retry_job_id = ?1")
            .bind(id)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// The job saved in the active dead letter `dead_letter_id`.
pub(super) async fn active_dead_letter(
    conn: &mut sqlx::SqliteConnection,
    dead_letter_id: Uuid,
) -> Result<Option<StoredJob>, sqlx::Error> {
    sqlx::query(
        "SELECT retry_job_id, job_kind, character_id, realm_id, zone_id, payload, session_token,
                session_impact, source, idempotency_key, owner_epoch, origin, issued_at, issue_seq,
                dumped_at_version
           FROM persistence_job_dead_letters
          WHERE dead_letter_id = ?1 AND requeued_at IS NULL",
    )
    .bind(dead_letter_id)
    .fetch_optional(&mut *conn)
    .await?
    .as_ref()
    .map(stored_job)
    .transpose()
}

/// Marks the dead letter `dead_letter_id` requeued as `retry_job_id` at `now` (microseconds).
pub(super) async fn mark_requeued(
    conn: &mut sqlx::SqliteConnection,
    dead_letter_id: Uuid,
    retry_job_id: Uuid,
    now: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE persistence_job_dead_letters SET requeued_at = ?2, requeued_retry_job_id = ?3
          WHERE dead_letter_id = ?1",
    )
    .bind(dead_letter_id)
    .bind(now)
    .bind(retry_job_id)
    .execute(&mut *conn)
    .await
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_marks_are_numbered_from_their_start() {
        assert_eq!(marks(3, 2), "?3, ?4");
        assert_eq!(marks(1, 0), "");
    }

    #[test]
    fn an_instant_out_of_range_is_a_decode_error_naming_its_column() {
        let err = instant("issued_at", i64::MAX).unwrap_err().to_string();
        assert!(err.contains("issued_at"), "{err}");
        let at = instant("issued_at", 1_700_000_000_000_000).unwrap();
        assert_eq!(micros(at), 1_700_000_000_000_000);
    }

    #[test]
    fn text_that_is_not_json_is_kept_as_a_string() {
        assert_eq!(json_or_raw("{\"a\":1}".into()), serde_json::json!({"a": 1}));
        assert_eq!(json_or_raw("{oops".into()), serde_json::json!("{oops"));
    }
}

#[cfg(test)]
#[path = "sqlite_jobs_plans.rs"]
mod plans;
