//! Settling a character's pending jobs inside the claim that mints its next owner.
//!
//! A job is applied only while the copy that issued it still owns the character; once a newer
//! copy claims the row, the job is superseded. A copy that dies with acknowledged writes still
//! queued (a failed first attempt backing off, or a worker that had not reached them) would lose
//! them to the next login. So the claim settles them first, in its own transaction: it locks the
//! character's jobs (waiting out a worker that is applying one), applies those of the current
//! owner exactly as a worker would, and only then mints the epoch. What a job changed is recorded
//! beside the row, so the loader replays it on a newer checkpoint that does not hold it.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::settle::{Claimed, JobOutcome, Reschedule, settle_owned};
use super::store::ClaimedRow;
use crate::model::ModelHandle;

/// Every job still queued for one character, locked in id order (the order workers never wait
/// in: they skip locked jobs), whatever its due time or lease.
const PENDING_FOR_CHARACTER: &str = "
SELECT retry_job_id, job_kind, character_id, realm_id, zone_id, payload, session_token,
       session_impact, source, idempotency_key, owner_epoch, origin, issued_at, issue_seq,
       attempt_count, next_attempt_at, created_at, lease_expiries, false AS lease_expired
  FROM persistence_retry_jobs
 WHERE character_id = $1
 ORDER BY retry_job_id
   FOR UPDATE";

/// A job that fails here cannot apply later (the claim supersedes it), so it goes to the dead
/// letters at once, where an operator sees it; no reschedule is ever asked for.
struct NoReschedule;

impl Reschedule for NoReschedule {
    fn next_attempt(&mut self, _attempt: u32, now: DateTime<Utc>) -> DateTime<Utc> {
        now
    }
}

/// Settles every job still queued for `character_id` inside the claim's transaction `tx`,
/// applying the current owner's through `model` (older owners' are superseded, as a worker
/// would decide). A lease held by a worker that has not reached its settle yet becomes stale: its
/// settle then writes nothing. Returns how many jobs were settled.
pub(crate) async fn settle_before_claim(
    tx: &mut sqlx::PgConnection,
    model: &ModelHandle,
    character_id: Uuid,
    now: DateTime<Utc>,
) -> Result<usize, sqlx::Error> {
    let rows: Vec<ClaimedRow> = sqlx::query_as(PENDING_FOR_CHARACTER)
        .bind(character_id)
        .fetch_all(&mut *tx)
        .await?;
    if rows.is_empty() {
        return Ok(0);
    }
    let mut claimed: Vec<Claimed> = rows
        .into_iter()
        .map(|row| Claimed::new(row, u32::MAX))
        .collect();
    // Applied in the order their copies issued them.
    claimed.sort_by_key(|c| match &c.job {
        Ok(job) => (0, job.envelope().owner_epoch, job.envelope().issue_seq),
        Err(_) => (1, 0, 0),
    });
    let owned: HashSet<Uuid> = claimed.iter().map(|c| c.row.stored.retry_job_id).collect();
    let outcomes = settle_owned(tx, model, now, &claimed, &owned, 1, &mut NoReschedule).await?;
    let applied = outcomes
        .iter()
        .filter(|o| matches!(o, JobOutcome::Applied))
        .count();
    tracing::info!(event = "claim_settled_pending_jobs", character = %character_id,
        jobs = outcomes.len(), applied, "the previous owner's queued writes landed before the claim");
    metrics::counter!(crate::telemetry::RETRY_SETTLED_AT_CLAIM_TOTAL)
        .increment(outcomes.len() as u64);
    Ok(outcomes.len())
}
