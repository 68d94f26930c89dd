//! Settling a character's pending jobs inside the claim that mints its next owner.
//!
//! A job is applied only while the copy that issued it still owns the character; once a newer
//! copy claims the row, the job is superseded. A copy that dies with acknowledged writes still
//! queued (a failed first attempt backing off, or a worker that had not reached them) would lose
//! them to the next login. So the claim settles them first, in its own transaction: it locks the
//! character's jobs in id order (as a worker's counted-lease settle does; a worker's claim skips
//! locked jobs), applies the current owner's with the claimant's model, and only then mints the
//! epoch. What a job changed is recorded beside the row, so the loader replays it on a newer
//! checkpoint that does not hold it.
//!
//! It differs from a worker's settle in three ways: a job that fails is dead-lettered at once
//! (after the claim it could never apply), a job whose lease ran out too often is dead-lettered
//! unapplied (it crashed or hung the workers that took it; it must not take the login with it),
//! and a job whose settle fails in the database is isolated (each one under its own savepoint)
//! instead of failing the login.
//!
//! One race stays: a job committed after the claim has read the character's jobs and before it
//! mints the epoch (a dying copy's logout save turning into a job at that very moment) is
//! superseded, as every job was before; its copy's checkpoint still holds it.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::job_tx::JobTx;
use super::settle::{Claimed, JobOutcome, Policy, Reschedule, settle_owned};
use super::settle_writes::write_job_outcomes;
use super::store::ClaimedRow;
use crate::model::ModelHandle;

/// Every job still queued for one character, locked in id order, whatever its due time or
/// lease.
const PENDING_FOR_CHARACTER: &str = "
SELECT retry_job_id, job_kind, character_id, realm_id, zone_id, payload, session_token,
       session_impact, source, idempotency_key, owner_epoch, origin, issued_at, issue_seq,
       dumped_at_version, attempt_count, next_attempt_at, created_at, lease_expiries, false AS lease_expired
  FROM persistence_retry_jobs
 WHERE character_id = $1
 ORDER BY retry_job_id
   FOR UPDATE";

/// Postgres: every job still queued for `character_id`, locked in id order.
pub(super) async fn pending_for(
    conn: &mut sqlx::PgConnection,
    character_id: Uuid,
) -> Result<Vec<ClaimedRow>, sqlx::Error> {
    sqlx::query_as(PENDING_FOR_CHARACTER)
        .bind(character_id)
        .fetch_all(conn)
        .await
}

/// A failure here is final (see the module doc): no reschedule is ever asked for.
struct NoReschedule;

impl Reschedule for NoReschedule {
    fn next_attempt(&mut self, _attempt: u32, now: DateTime<Utc>) -> DateTime<Utc> {
        now
    }
}

const CLAIMANT: Policy = Policy {
    retry_limit: 1,
    claimant: true,
};

/// What a claim's settle did, reported once the claim commits (a claim rolled back did
/// nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SettledAtClaim {
    /// Jobs settled (applied, already held, superseded or dead-lettered).
    pub(crate) settled: usize,
    /// Of those, applied.
    pub(crate) applied: usize,
    /// Dead-lettered, with why.
    pub(crate) dead_lettered: Vec<(Uuid, String)>,
    /// Left queued because not even their dead letter could be written (the claim supersedes
    /// them).
    pub(crate) left: Vec<Uuid>,
}

impl SettledAtClaim {
    /// Logs and counts a claim's settle; call once the claim has committed.
    pub(crate) fn report(&self, character_id: Uuid) {
        if self.settled == 0 && self.left.is_empty() {
            return;
        }
        tracing::info!(event = "claim_settled_pending_jobs", character = %character_id,
            jobs = self.settled, applied = self.applied,
            "the previous owner's queued writes were settled before the claim");
        metrics::counter!(crate::telemetry::RETRY_SETTLED_AT_CLAIM_TOTAL)
            .increment(self.settled as u64);
        for (retry_job_id, error) in &self.dead_lettered {
            tracing::warn!(event = "retry_dead_lettered", character = %character_id,
                %retry_job_id, error, "at the claim of the character's next owner");
            metrics::counter!(crate::telemetry::RETRY_OUTCOMES_TOTAL, "outcome" => "dead_lettered")
                .increment(1);
        }
        for retry_job_id in &self.left {
            tracing::error!(event = "claim_settle_failed", character = %character_id,
                %retry_job_id, "neither applied nor dead-lettered; the claim superseded it");
        }
    }
}

/// True for an error the job itself causes (bad data, a constraint, a trigger's refusal, a
/// document over a limit): retrying cannot cure it, so the job is isolated and dead-lettered.
/// Anything else (a timeout, a lost connection, a serialization failure) fails the claim, which
/// can be retried with the jobs intact.
fn caused_by_the_job(err: &sqlx::Error) -> bool {
    use sqlx::error::ErrorKind;
    let sqlx::Error::Database(db) = err else {
        return false;
    };
    if matches!(
        db.kind(),
        ErrorKind::UniqueViolation
            | ErrorKind::ForeignKeyViolation
            | ErrorKind::NotNullViolation
            | ErrorKind::CheckViolation
    ) {
        return true;
    }
    let Some(code) = db.code() else {
        return false;
    };
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // SQLite's primary result code is the extended code's low byte: CONSTRAINT (19),
        // TOOBIG (18), MISMATCH (20). RANGE (25) is a statement binding a parameter it does
        // not have: this build's fault, never the job's.
        return code
            .parse::<i32>()
            .is_ok_and(|c| matches!(c & 0xff, 18..=20));
    }
    code.starts_with("22") || code.starts_with("23") || code.starts_with("54") || code == "P0001"
}

/// Settles every job still queued for `character_id` inside the claim's transaction `tx`,
/// applying the current owner's through the claimant's `model` (older owners' are superseded).
/// A job whose lease ran out more than `lease_expiry_limit` times is dead-lettered unapplied. A
/// lease held by a worker that has not reached its settle yet becomes stale: its settle then
/// writes nothing.
pub(crate) async fn settle_before_claim(
    tx: &mut JobTx<'_>,
    model: &ModelHandle,
    character_id: Uuid,
    lease_expiry_limit: u32,
    now: DateTime<Utc>,
) -> Result<SettledAtClaim, sqlx::Error> {
    let rows = tx.pending_for(character_id).await?;
    if rows.is_empty() {
        return Ok(SettledAtClaim::default());
    }
    let mut claimed: Vec<Claimed> = rows
        .into_iter()
        .map(|row| Claimed::new(row, lease_expiry_limit))
        .collect();
    // Applied in the order their copies issued them.
    claimed.sort_by_key(|c| match &c.job {
        Ok(job) => (0, job.envelope().owner_epoch, job.envelope().issue_seq),
        Err(_) => (1, 0, 0),
    });
    let mut done = SettledAtClaim::default();
    savepoint(tx).await?;
    let settled = settle_all(tx, model, now, &claimed).await;
    end_savepoint(tx, settled.is_ok()).await?;
    let outcomes = match settled {
        Ok(outcomes) => outcomes,
        Err(err) if caused_by_the_job(&err) => {
            let mut outcomes = Vec::with_capacity(claimed.len());
            for one in &claimed {
                match settle_alone(tx, model, now, one).await? {
                    Some(outcome) => outcomes.push(outcome),
                    None => done.left.push(one.row.stored.retry_job_id),
                }
            }
            outcomes
        }
        Err(err) => return Err(err),
    };
    for (one, outcome) in claimed.iter().zip(&outcomes) {
        if let JobOutcome::DeadLettered(error) = outcome {
            done.dead_lettered
                .push((one.row.stored.retry_job_id, error.clone()));
        }
    }
    done.settled = outcomes.len();
    done.applied = outcomes
        .iter()
        .filter(|o| matches!(o, JobOutcome::Applied))
        .count();
    Ok(done)
}

async fn settle_all(
    tx: &mut JobTx<'_>,
    model: &ModelHandle,
    now: DateTime<Utc>,
    claimed: &[Claimed],
) -> Result<Vec<JobOutcome>, sqlx::Error> {
    let owned: HashSet<Uuid> = claimed.iter().map(|c| c.row.stored.retry_job_id).collect();
    settle_owned(tx, model, now, claimed, &owned, CLAIMANT, &mut NoReschedule).await
}

/// Opens the savepoint a settle step runs under.
async fn savepoint(tx: &mut JobTx<'_>) -> Result<(), sqlx::Error> {
    tx.execute("SAVEPOINT claim_settle").await
}

/// Closes the savepoint, first undoing what the step wrote when it failed (`ok` false).
async fn end_savepoint(tx: &mut JobTx<'_>, ok: bool) -> Result<(), sqlx::Error> {
    if !ok {
        tx.execute("ROLLBACK TO SAVEPOINT claim_settle").await?;
    }
    tx.execute("RELEASE SAVEPOINT claim_settle").await
}

/// Settles one job on its own; one the database refuses (for a reason of its own) is
/// dead-lettered, and one that cannot even be dead-lettered is left (`None`).
async fn settle_alone(
    tx: &mut JobTx<'_>,
    model: &ModelHandle,
    now: DateTime<Utc>,
    one: &Claimed,
) -> Result<Option<JobOutcome>, sqlx::Error> {
    let single = std::slice::from_ref(one);
    savepoint(tx).await?;
    let settled = settle_all(tx, model, now, single).await;
    end_savepoint(tx, settled.is_ok()).await?;
    let err = match settled {
        Ok(mut outcomes) => return Ok(outcomes.pop()),
        Err(err) if caused_by_the_job(&err) => err,
        Err(err) => return Err(err),
    };
    let dead = JobOutcome::DeadLettered(format!(
        "could not be settled before its owner's successor claimed the character: {err}"
    ));
    savepoint(tx).await?;
    let written = write_job_outcomes(
        tx,
        single,
        std::slice::from_ref(&dead),
        now,
        &mut NoReschedule,
    )
    .await;
    end_savepoint(tx, written.is_ok()).await?;
    Ok(written.ok().map(|()| dead))
}
