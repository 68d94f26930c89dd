//! SQL for retry jobs and dead letters: the batched insert, the claim statements (signaled ids or any due
//! rows; locked for the caller's transaction or leased), inspection and requeue. Settling a
//! claimed batch lives in `settle`.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::job::{PersistenceRetryJob, StoredJob};
use super::job_tx::JobStore;
use crate::backend::PostgresBackend;

/// A job row as claimed: what is stored, plus its attempt count.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct ClaimedRow {
    #[sqlx(flatten)]
    pub(crate) stored: StoredJob,
    pub(crate) attempt_count: i32,
    pub(crate) next_attempt_at: DateTime<Utc>,
    pub(crate) created_at: DateTime<Utc>,
    /// Leases of this job that ran out, this claim's included.
    pub(crate) lease_expiries: i32,
    /// Whether this claim found a lease that had run out (its holder crashed or hung).
    pub(crate) lease_expired: bool,
}

const JOB_COLUMNS: &str = "retry_job_id, job_kind, character_id, realm_id, zone_id, payload, session_token, \
    session_impact, source, idempotency_key, owner_epoch, origin, issued_at, issue_seq, dumped_at_version";

const INSERT_MANY: &str = "
INSERT INTO persistence_retry_jobs (retry_job_id, job_kind, character_id, realm_id, zone_id, payload,
    next_attempt_at, session_token, session_impact, source, idempotency_key, owner_epoch, origin, issued_at,
    issue_seq, dumped_at_version)
SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::uuid[], $4::text[], $5::text[], $6::jsonb[],
    $7::timestamptz[], $8::text[], $9::text[], $10::text[], $11::text[], $12::int8[], $13::text[],
    $14::timestamptz[], $15::int8[], $16::int8[])
ON CONFLICT (character_id, retry_job_id) DO NOTHING";

/// When a job can next be claimed (due, and past any lease on it): the expression of the
/// `persistence_retry_jobs_claimable` index (migration 13), written exactly as there so the claim
/// walks that index.
macro_rules! claimable_at {
    () => {
        "(CASE WHEN lease_token IS NULL THEN next_attempt_at \
               ELSE GREATEST(next_attempt_at, COALESCE(lease_expires_at, 'infinity')) END)"
    };
}

/// The rows a claim takes: due, with no live lease, oldest first, skipping rows another worker
/// is claiming. Two forms, so each gets a plan of its own: the signaled ids (`$2`) found through
/// the id index `persistence_retry_jobs_id` (one statement for both let the planner scan the
/// whole table), or any due row, found by walking the claimable index from its start (the scan
/// stops at the first row not yet claimable, however many wait for later).
macro_rules! due_rows {
    ($columns:literal, $which:literal) => {
        concat!(
            "SELECT ",
            $columns,
            " FROM persistence_retry_jobs
              WHERE ",
            $which,
            " ",
            claimable_at!(),
            " <= $1
              ORDER BY ",
            claimable_at!(),
            ", created_at
              LIMIT $3
                FOR UPDATE SKIP LOCKED"
        )
    };
}

/// The signaled rows among `$2`.
macro_rules! signaled_rows {
    ($columns:literal) => {
        due_rows!($columns, "retry_job_id = ANY($2) AND")
    };
}

/// Any due rows (both forms take the same parameters; here `$2` is null).
macro_rules! any_due_rows {
    ($columns:literal) => {
        due_rows!($columns, "$2::uuid[] IS NULL AND")
    };
}

/// Stamps a lease (`$4` token, `$5` owner, `$6` seconds) on the rows of `$due`, counting a lease
/// that had run out. The claimed rows are also named by id (`= ANY(ARRAY(…))`), so the update
/// finds them through the id index `persistence_retry_jobs_id` in every plan: a generic plan
/// cannot know how few rows the limit lets through, and joined them against a scan of the whole
/// table.
macro_rules! lease {
    ($due:expr) => {
        concat!(
            "WITH due AS (",
            $due,
            ")
             UPDATE persistence_retry_jobs j
                SET lease_token = $4, lease_owner = $5,
                    lease_expires_at = $1 + make_interval(secs => $6), updated_at = $1,
                    lease_expiries = j.lease_expiries + due.lease_expired::int
               FROM due
              WHERE j.retry_job_id = due.retry_job_id
                AND j.retry_job_id = ANY (ARRAY(SELECT retry_job_id FROM due))
             RETURNING j.retry_job_id, j.job_kind, j.character_id, j.realm_id, j.zone_id, j.payload,
                       j.session_token, j.session_impact, j.source, j.idempotency_key,
                       j.owner_epoch, j.origin, j.issued_at, j.issue_seq, j.dumped_at_version,
                       j.attempt_count,
                       j.next_attempt_at, j.created_at, j.lease_expiries, due.lease_expired"
        )
    };
}

/// Claims signaled rows under a new lease.
const LEASE_SIGNALED: &str = lease!(signaled_rows!(
    "retry_job_id, lease_token IS NOT NULL AS lease_expired"
));
/// Claims due rows under a new lease.
const LEASE_DUE: &str = lease!(any_due_rows!(
    "retry_job_id, lease_token IS NOT NULL AS lease_expired"
));
/// Locks signaled rows for the caller's transaction.
const LOCK_SIGNALED: &str = signaled_rows!(
    "retry_job_id, job_kind, character_id, realm_id, zone_id, payload, session_token, session_impact,
     source, idempotency_key, owner_epoch, origin, issued_at, issue_seq, dumped_at_version, attempt_count,
     next_attempt_at, created_at, lease_expiries, lease_token IS NOT NULL AS lease_expired"
);
/// Locks due rows for the caller's transaction.
const LOCK_DUE: &str = any_due_rows!(
    "retry_job_id, job_kind, character_id, realm_id, zone_id, payload, session_token, session_impact,
     source, idempotency_key, owner_epoch, origin, issued_at, issue_seq, dumped_at_version, attempt_count,
     next_attempt_at, created_at, lease_expiries, lease_token IS NOT NULL AS lease_expired"
);

/// One statement a Postgres claim runs, for plan checks: the retry plan test and the backlog
/// benchmark prepare each with its parameter types and explain its generic plan.
#[derive(Debug, Clone, Copy)]
pub struct ClaimStatement {
    /// What it claims.
    pub name: &'static str,
    /// The statement: `$1` now, `$2` the signaled ids (null for a poll), `$3` the limit; a lease
    /// also takes `$4` its token, `$5` its owner and `$6` its seconds.
    pub sql: &'static str,
    /// Its parameters' Postgres types, comma-separated, for `PREPARE`.
    pub param_types: &'static str,
    /// Whether it is a poll's form (any due row) rather than the signaled ids'.
    pub poll: bool,
}

const LEASE_PARAMS: &str = "timestamptz, uuid[], bigint, uuid, text, double precision";
const LOCK_PARAMS: &str = "timestamptz, uuid[], bigint";

/// Every statement a Postgres claim runs.
pub const CLAIM_STATEMENTS: [ClaimStatement; 4] = [
    ClaimStatement {
        name: "lease, poll",
        sql: LEASE_DUE,
        param_types: LEASE_PARAMS,
        poll: true,
    },
    ClaimStatement {
        name: "lease, signaled",
        sql: LEASE_SIGNALED,
        param_types: LEASE_PARAMS,
        poll: false,
    },
    ClaimStatement {
        name: "lock, poll",
        sql: LOCK_DUE,
        param_types: LOCK_PARAMS,
        poll: true,
    },
    ClaimStatement {
        name: "lock, signaled",
        sql: LOCK_SIGNALED,
        param_types: LOCK_PARAMS,
        poll: false,
    },
];

/// Locks up to `limit` due jobs (only `ids` when given) inside the caller's transaction.
pub(crate) async fn lock_due(
    conn: &mut sqlx::PgConnection,
    ids: Option<&[Uuid]>,
    limit: i64,
    now: DateTime<Utc>,
) -> Result<Vec<ClaimedRow>, sqlx::Error> {
    sqlx::query_as(if ids.is_some() {
        LOCK_SIGNALED
    } else {
        LOCK_DUE
    })
    .bind(now)
    .bind(ids)
    .bind(limit)
    .fetch_all(conn)
    .await
}

/// Inserts `jobs`, each due at the instant given with it, in one statement on `conn` (inside the
/// caller's transaction when it has one): all or none. A job stored already (the same id) stays
/// as it is.
pub(crate) async fn insert_jobs(
    conn: &mut sqlx::PgConnection,
    jobs: &[(&PersistenceRetryJob, DateTime<Utc>)],
) -> Result<(), sqlx::Error> {
    // One array per column, in the order of `INSERT_MANY`'s UNNEST.
    fn column<'a, T>(
        jobs: &'a [(&PersistenceRetryJob, DateTime<Utc>)],
        value: impl Fn(&'a PersistenceRetryJob) -> T,
    ) -> Vec<T> {
        jobs.iter().map(|(job, _)| value(job)).collect()
    }
    let ids = column(jobs, |j| j.retry_job_id());
    let kinds = column(jobs, |j| j.payload().kind());
    let characters = column(jobs, |j| j.payload().character_id());
    let realms = column(jobs, |j| j.realm_id());
    let zones = column(jobs, |j| j.payload().zone_id());
    let payloads = column(jobs, |j| sqlx::types::Json(j.payload()));
    let due: Vec<DateTime<Utc>> = jobs.iter().map(|(_, now)| *now).collect();
    let sessions = column(jobs, |j| j.session_token());
    let impacts = column(jobs, |j| j.session_impact().as_str());
    let sources = column(jobs, |j| j.source());
    let keys = column(jobs, |j| j.envelope().idempotency_key.as_str());
    let epochs = column(jobs, |j| j.envelope().owner_epoch);
    let origins = column(jobs, |j| j.envelope().origin.as_str());
    let issued = column(jobs, |j| j.envelope().issued_at);
    let seqs = column(jobs, |j| {
        i64::try_from(j.envelope().issue_seq).unwrap_or(i64::MAX)
    });
    let dumped = column(jobs, PersistenceRetryJob::dumped_at_version);
    sqlx::query(INSERT_MANY)
        .bind(&ids)
        .bind(&kinds)
        .bind(&characters)
        .bind(&realms)
        .bind(&zones)
        .bind(&payloads)
        .bind(&due)
        .bind(&sessions)
        .bind(&impacts)
        .bind(&sources)
        .bind(&keys)
        .bind(&epochs)
        .bind(&origins)
        .bind(&issued)
        .bind(&seqs)
        .bind(&dumped)
        .execute(conn)
        .await?;
    Ok(())
}

/// Claims up to `limit` due jobs (only `ids` when given) under a new lease.
pub(crate) async fn claim(
    pg: &PostgresBackend,
    ids: Option<&[Uuid]>,
    limit: i64,
    owner: &str,
    token: Uuid,
    now: DateTime<Utc>,
    lease: std::time::Duration,
) -> Result<Vec<ClaimedRow>, sqlx::Error> {
    let mut rows: Vec<ClaimedRow> = sqlx::query_as(if ids.is_some() {
        LEASE_SIGNALED
    } else {
        LEASE_DUE
    })
    .bind(now)
    .bind(ids)
    .bind(limit)
    .bind(token)
    .bind(owner)
    .bind(lease.as_secs_f64())
    .fetch_all(pg.exec())
    .await?;
    rows.sort_by_key(|r| (r.next_attempt_at, r.created_at));
    Ok(rows)
}

/// How a requeue ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequeueOutcome {
    /// Restored as this fresh retry job.
    Requeued {
        /// The new job's id.
        retry_job_id: Uuid,
    },
    /// Unknown id, or already requeued.
    NotRequeued,
    /// Left dead: the copy that issued the job was superseded (the character was claimed since),
    /// so the worker would drop the job unapplied. What it carried was played by that copy, and
    /// reached the stores through its saves unless the copy was lost first; to grant it again,
    /// issue an offline grant (`live::Runtime::grant_offline`).
    Superseded {
        /// The epoch of the copy that issued the job.
        job_epoch: i64,
        /// The character's owner epoch now.
        owner_epoch: i64,
    },
}

/// Whether a dead letter's job issued under `job_epoch` may go back to the queue, for a row now
/// owned at `owner_epoch` (`None`: no row, and the job fails again, loudly) (pure). An offline
/// grant reaches whichever copy owns the character; a copy's job only while that copy (or an
/// older one) still owns the row: past that the worker would drop it silently.
pub(crate) fn requeue_refusal(job_epoch: i64, owner_epoch: Option<i64>) -> Option<RequeueOutcome> {
    match owner_epoch {
        Some(owner) if owner > job_epoch => Some(RequeueOutcome::Superseded {
            job_epoch,
            owner_epoch: owner,
        }),
        _ => None,
    }
}

/// A requeue failed; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum RequeueError {
    /// Postgres failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The saved job does not decode (a poison payload); it stays dead.
    #[error("the dead letter's job does not decode: {0}")]
    Undecodable(String),
}

/// Restores an active dead letter as a fresh job, all or nothing.
pub(crate) async fn requeue(
    jobs: &JobStore,
    dead_letter_id: Uuid,
    now: DateTime<Utc>,
) -> Result<RequeueOutcome, RequeueError> {
    let mut open = jobs.begin().await?;
    let mut tx = open.steps(now);
    let Some(stored) = tx.active_dead_letter(dead_letter_id).await? else {
        return Ok(RequeueOutcome::NotRequeued);
    };
    let job = PersistenceRetryJob::restore(stored)
        .map_err(RequeueError::Undecodable)?
        .renewed();
    let owner = tx.owner_epoch(job.payload().character_id()).await?;
    if let Some(refused) = requeue_refusal(job.envelope().owner_epoch, owner) {
        return Ok(refused);
    }
    tx.insert_jobs(&[(&job, now)]).await?;
    tx.mark_requeued(dead_letter_id, job.retry_job_id(), now)
        .await?;
    open.commit().await?;
    Ok(RequeueOutcome::Requeued {
        retry_job_id: job.retry_job_id(),
    })
}

/// Postgres: the job saved in the active dead letter `dead_letter_id`, locked.
pub(super) async fn active_dead_letter(
    conn: &mut sqlx::PgConnection,
    dead_letter_id: Uuid,
) -> Result<Option<StoredJob>, sqlx::Error> {
    let sql = sqlx::AssertSqlSafe(format!(
        "SELECT {JOB_COLUMNS} FROM persistence_job_dead_letters
          WHERE dead_letter_id = $1 AND requeued_at IS NULL
            FOR UPDATE"
    ));
    sqlx::query_as(sql)
        .bind(dead_letter_id)
        .fetch_optional(conn)
        .await
}

/// Postgres: marks the dead letter requeued as `retry_job_id`.
pub(super) async fn mark_requeued(
    conn: &mut sqlx::PgConnection,
    dead_letter_id: Uuid,
    retry_job_id: Uuid,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE persistence_job_dead_letters SET requeued_at = $2, requeued_retry_job_id = $3
          WHERE dead_letter_id = $1",
    )
    .bind(dead_letter_id)
    .bind(now)
    .bind(retry_job_id)
    .execute(conn)
    .await
    .map(drop)
}

#[cfg(test)]
mod requeue_tests {
    use super::{RequeueOutcome, requeue_refusal};

    #[test]
    fn a_job_is_requeued_only_while_its_copy_could_still_land_it() {
        assert_eq!(requeue_refusal(4, Some(4)), None);
        assert_eq!(requeue_refusal(4, Some(3)), None);
        assert_eq!(
            requeue_refusal(4, Some(5)),
            Some(RequeueOutcome::Superseded {
                job_epoch: 4,
                owner_epoch: 5
            })
        );
        assert_eq!(requeue_refusal(i64::MAX, Some(9)), None, "an offline grant");
        assert_eq!(requeue_refusal(4, None), None, "it fails again, loudly");
    }
}
