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

use super::settle::{Claimed, JobOutcome, Policy, Reschedule, settle_owned};
use super::settle_writes::write_job_outcomes;
use super::store::ClaimedRow;
use super::worker::LEASE_EXPIRY_LIMIT;
use crate::model::ModelHandle;

/// Every job still queued for one character, locked in id order, whatever its due time or
/// lease.
const PENDING_FOR_CHARACTER: &str = "
SELECT retry_job_id, job_kind, character_id, realm_id, zone_id, payload, session_token,
       session_impact, source, idempotency_key, owner_epoch, origin, issued_at, issue_seq,
       attempt_count, next_attempt_at, created_at, lease_expiries, false AS lease_expired
  FROM persistence_retry_jobs
 WHERE character_id = $1
 ORDER BY retry_job_id
   FOR UPDATE";

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

/// What a claim's settle did, for the log line written once the claim commits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SettledAtClaim {
    /// Jobs settled (applied, already held, superseded or dead-lettered).
    pub(crate) settled: usize,
    /// Of those, applied.
    pub(crate) applied: usize,
}

impl SettledAtClaim {
    /// Logs and counts a claim's settle; call once the claim has committed.
    pub(crate) fn report(self, character_id: Uuid) {
        if self.settled == 0 {
            return;
        }
        tracing::info!(event = "claim_settled_pending_jobs", character = %character_id,
            jobs = self.settled, applied = self.applied,
            "the previous owner's queued writes were settled before the claim");
        metrics::counter!(crate::telemetry::RETRY_SETTLED_AT_CLAIM_TOTAL)
            .increment(self.settled as u64);
    }
}

/// Settles every job still queued for `character_id` inside the claim's transaction `tx`,
/// applying the current owner's through the claimant's `model` (older owners' are superseded).
/// A lease held by a worker that has not reached its settle yet becomes stale: its settle then
/// writes nothing.
pub(crate) async fn settle_before_claim(
    tx: &mut sqlx::PgConnection,
    model: &ModelHandle,
    character_id: Uuid,
    now: DateTime<Utc>,
) -> Result<SettledAtClaim, sqlx::Error> {
    let rows: Vec<ClaimedRow> = sqlx::query_as(PENDING_FOR_CHARACTER)
        .bind(character_id)
        .fetch_all(&mut *tx)
        .await?;
    if rows.is_empty() {
        return Ok(SettledAtClaim::default());
    }
    let mut claimed: Vec<Claimed> = rows
        .into_iter()
        .map(|row| Claimed::new(row, LEASE_EXPIRY_LIMIT))
        .collect();
    // Applied in the order their copies issued them.
    claimed.sort_by_key(|c| match &c.job {
        Ok(job) => (0, job.envelope().owner_epoch, job.envelope().issue_seq),
        Err(_) => (1, 0, 0),
    });
    let outcomes = match settle_under_savepoint(tx, model, now, &claimed).await? {
        Ok(outcomes) => outcomes,
        Err(err) => {
            tracing::warn!(event = "claim_settle_isolating", character = %character_id,
                error = %err, "settling the queued jobs one at a time");
            let mut outcomes = Vec::with_capacity(claimed.len());
            for one in &claimed {
                outcomes.extend(settle_alone(tx, model, now, one).await?);
            }
            outcomes
        }
    };
    Ok(SettledAtClaim {
        settled: outcomes.len(),
        applied: outcomes
            .iter()
            .filter(|o| matches!(o, JobOutcome::Applied))
            .count(),
    })
}

/// Settles `claimed` under a savepoint: `Ok(Err(_))` when the database refused the settle (the
/// savepoint is rolled back, nothing of it stays), the outer error when even that failed.
async fn settle_under_savepoint(
    tx: &mut sqlx::PgConnection,
    model: &ModelHandle,
    now: DateTime<Utc>,
    claimed: &[Claimed],
) -> Result<Result<Vec<JobOutcome>, sqlx::Error>, sqlx::Error> {
    sqlx::query("SAVEPOINT claim_settle")
        .execute(&mut *tx)
        .await?;
    let owned: HashSet<Uuid> = claimed.iter().map(|c| c.row.stored.retry_job_id).collect();
    match settle_owned(tx, model, now, claimed, &owned, CLAIMANT, &mut NoReschedule).await {
        Ok(outcomes) => {
            sqlx::query("RELEASE SAVEPOINT claim_settle")
                .execute(&mut *tx)
                .await?;
            Ok(Ok(outcomes))
        }
        Err(err) => {
            sqlx::query("ROLLBACK TO SAVEPOINT claim_settle")
                .execute(&mut *tx)
                .await?;
            Ok(Err(err))
        }
    }
}

/// Settles one job on its own; one the database refuses is dead-lettered, and one that cannot
/// even be dead-lettered is left queued (superseded by the claim, logged).
async fn settle_alone(
    tx: &mut sqlx::PgConnection,
    model: &ModelHandle,
    now: DateTime<Utc>,
    one: &Claimed,
) -> Result<Option<JobOutcome>, sqlx::Error> {
    let single = std::slice::from_ref(one);
    let err = match settle_under_savepoint(tx, model, now, single).await? {
        Ok(mut outcomes) => return Ok(outcomes.pop()),
        Err(err) => err,
    };
    let dead = JobOutcome::DeadLettered(format!(
        "could not be settled before its owner's successor claimed the character: {err}"
    ));
    sqlx::query("SAVEPOINT claim_settle")
        .execute(&mut *tx)
        .await?;
    match write_job_outcomes(
        tx,
        single,
        std::slice::from_ref(&dead),
        now,
        &mut NoReschedule,
    )
    .await
    {
        Ok(()) => {
            sqlx::query("RELEASE SAVEPOINT claim_settle")
                .execute(&mut *tx)
                .await?;
            Ok(Some(dead))
        }
        Err(again) => {
            sqlx::query("ROLLBACK TO SAVEPOINT claim_settle")
                .execute(&mut *tx)
                .await?;
            tracing::error!(event = "claim_settle_failed", retry_job_id = %one.row.stored.retry_job_id,
                error = %again, "left queued; the claim supersedes it");
            Ok(None)
        }
    }
}
