//! Settling a claimed batch in one transaction: lock the jobs still leased to us (the rest are
//! stale), lock their characters, apply what passes the ownership fence and is not already in the
//! row (by key, or by the issue mark of the content the row holds), record what applied beside
//! the row and the transfer activations, delete what is done, and reschedule or dead-letter what
//! failed — every job write fenced by our lease token. A job that fails records nothing, so its
//! next attempt (or the requeue of its dead letter) still applies.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::apply::{
    RecordedEffect, RowState, apply_payload, is_absolute, lists_legacy_reward_key, replay,
};
use super::effects;
use super::job::PersistenceRetryJob;
use super::job_tx::{JobStore, JobTx};
use super::payload::CoreWrite;
use super::settle_writes::{write_characters, write_job_outcomes};
use super::store::ClaimedRow;
use crate::model::ModelHandle;

/// What became of one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    /// Applied and deleted.
    Applied,
    /// A reward already granted under this key: deleted without a second grant.
    AlreadyApplied,
    /// A newer owner holds the character: deleted, never applied.
    Superseded,
    /// Failed; rescheduled with backoff.
    Retrying(String),
    /// Left for a newer release: the character's document or its owner's model is newer than
    /// this worker's model (it cannot read what the owner writes). Put back without counting an
    /// attempt (a rolling deploy is not the job's failure) and tried again after
    /// [`DEFERRED_FOR`].
    Deferred(String),
    /// Failed for the last time, or undecodable: moved to the dead letters.
    DeadLettered(String),
    /// Our lease was reclaimed by another worker: nothing written.
    Stale,
    /// Nothing could be recorded (the store failed); the lease runs out and the job is claimed
    /// again.
    Unsettled(String),
}

/// How long a job left for a newer worker waits before it is claimed again.
pub const DEFERRED_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// A claimed job ready to settle.
#[derive(Debug, Clone)]
pub(crate) struct Claimed {
    pub(crate) row: ClaimedRow,
    pub(crate) job: Result<PersistenceRetryJob, String>,
}

impl Claimed {
    /// A claimed row as a job; one whose lease has run out more than `lease_expiry_limit` times
    /// is a job that keeps crashing or hanging its worker, and settles as a dead letter.
    pub(crate) fn new(row: ClaimedRow, lease_expiry_limit: u32) -> Self {
        let expiries = u32::try_from(row.lease_expiries).unwrap_or(0);
        let job = if expiries > lease_expiry_limit {
            Err(format!(
                "its lease ran out {expiries} times (limit {lease_expiry_limit}): the job crashed \
                 or hung every worker that took it; inspect its payload before a requeue"
            ))
        } else {
            PersistenceRetryJob::restore(row.stored.clone())
        };
        Self { row, job }
    }
}

/// How to reschedule a failure: attempt number → delay.
pub(crate) trait Reschedule {
    fn next_attempt(&mut self, attempt: u32, now: DateTime<Utc>) -> DateTime<Utc>;
}

/// A character row as a settle holds it under its lock.
#[derive(Debug, Clone)]
pub(super) struct Locked {
    owner_epoch: i64,
    /// The schema of the model of the copy that owns the row (set by its claim).
    owner_schema: u32,
    pub(super) state_version: i64,
    /// The issue mark of the content the row holds (see `docs/bookkeeping.md`).
    pub(super) mark: (i64, u64),
    pub(super) row: RowState,
    /// The sequenced effects recorded for the row's epoch, in issue order (read only when a job
    /// in the batch orders against them), plus those applied in this batch.
    sequenced: Vec<RecordedEffect>,
    /// A state job (a live copy's dump) applied in this batch: the write counts as live.
    pub(super) live_write: bool,
    /// Items transfer commits took from this character (the item-release ledger): a job that
    /// puts one back leaves it out.
    released: Vec<Uuid>,
    /// The effects recorded past the oldest version a state job of the batch was dumped at
    /// (read only for such a job), then every effect applied in this batch.
    landed_after_dump: Vec<RecordedEffect>,
}

/// Settles `claimed` (leased under `token`) in one transaction, returning an outcome per job in
/// input order. Jobs whose lease was reclaimed meanwhile are `Stale`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn settle(
    jobs: &JobStore,
    model: &ModelHandle,
    token: Uuid,
    now: DateTime<Utc>,
    claimed: &[Claimed],
    retry_limit: u32,
    bound: std::time::Duration,
    reschedule: &mut impl Reschedule,
) -> Result<Vec<JobOutcome>, sqlx::Error> {
    let mut open = jobs.begin_bounded(bound).await?;
    let mut tx = open.steps(now);
    let ids: Vec<Uuid> = claimed.iter().map(|c| c.row.stored.retry_job_id).collect();
    let owned = tx.leased_to(&ids, token).await?;
    let outcomes = settle_owned(
        &mut tx,
        model,
        now,
        claimed,
        &owned,
        Policy::worker(retry_limit),
        reschedule,
    )
    .await?;
    open.commit().await?;
    Ok(outcomes)
}

/// Claims up to `limit` due jobs (only `ids` when given) and settles them in the same
/// transaction: the row locks taken by the claim (`FOR UPDATE SKIP LOCKED`) are the lease, so no
/// lease is written, and a worker that dies mid-way leaves the jobs due as they were. A job
/// whose lease ran out (its last worker crashed or hung on it) is left alone here, so the caller
/// claims it under a counted lease instead. Returns the claimed jobs with their outcomes, in
/// order, without those left alone.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn claim_and_settle(
    jobs: &JobStore,
    model: &ModelHandle,
    ids: Option<&[Uuid]>,
    limit: i64,
    now: DateTime<Utc>,
    retry_limit: u32,
    bound: std::time::Duration,
    reschedule: &mut impl Reschedule,
) -> Result<OneTransaction, sqlx::Error> {
    let mut open = jobs.begin_bounded(bound).await?;
    let (expired, fresh): (Vec<ClaimedRow>, Vec<ClaimedRow>) = open
        .steps(now)
        .lock_due(ids, limit, now)
        .await?
        .into_iter()
        .partition(|row| row.lease_expired);
    let lease_ran_out = expired.iter().map(|r| r.stored.retry_job_id).collect();
    let claimed: Vec<Claimed> = fresh
        .into_iter()
        .map(|row| Claimed::new(row, u32::MAX))
        .collect();
    if claimed.is_empty() {
        // Ended here, not on drop: a dropped transaction rolls back later, and until then its
        // row locks would hide the jobs with a lapsed lease from the claim that follows.
        open.rollback().await?;
        return Ok(OneTransaction {
            claimed,
            outcomes: Vec::new(),
            lease_ran_out,
        });
    }
    let owned: HashSet<Uuid> = claimed.iter().map(|c| c.row.stored.retry_job_id).collect();
    let outcomes = settle_owned(
        &mut open.steps(now),
        model,
        now,
        &claimed,
        &owned,
        Policy::worker(retry_limit),
        reschedule,
    )
    .await?;
    open.commit().await?;
    Ok(OneTransaction {
        claimed,
        outcomes,
        lease_ran_out,
    })
}

/// What one claim-and-settle transaction did.
pub(crate) struct OneTransaction {
    /// The jobs it claimed and settled.
    pub(crate) claimed: Vec<Claimed>,
    /// Their outcomes, in order.
    pub(crate) outcomes: Vec<JobOutcome>,
    /// Due jobs whose lease had run out, left for a claim under a counted lease.
    pub(crate) lease_ran_out: Vec<Uuid>,
}

/// The settle itself, inside the caller's transaction, for the jobs in `owned` (the rest of
/// `claimed` are `Stale`).
pub(super) async fn settle_owned(
    tx: &mut JobTx<'_>,
    model: &ModelHandle,
    now: DateTime<Utc>,
    claimed: &[Claimed],
    owned: &HashSet<Uuid>,
    policy: Policy,
    reschedule: &mut impl Reschedule,
) -> Result<Vec<JobOutcome>, sqlx::Error> {
    let retry_limit = policy.retry_limit;
    let jobs: Vec<&PersistenceRetryJob> = claimed
        .iter()
        .filter(|c| owned.contains(&c.row.stored.retry_job_id))
        .filter_map(|c| c.job.as_ref().ok())
        .collect();
    let mut characters = lock_characters(tx, model, &jobs).await?;
    let pairs: Vec<(Uuid, String)> = jobs
        .iter()
        .map(|j| {
            (
                j.payload().character_id(),
                j.envelope().idempotency_key.clone(),
            )
        })
        .collect();
    let recorded = tx.recorded_keys(&pairs).await?;

    let mut seen = HashSet::new();
    let mut outcomes = Vec::with_capacity(claimed.len());
    let mut dirty = HashSet::new();
    let mut activations = Vec::new();
    let mut records = Vec::new();
    for c in claimed {
        if !owned.contains(&c.row.stored.retry_job_id) {
            outcomes.push(JobOutcome::Stale);
            continue;
        }
        let job = match &c.job {
            Ok(job) => job,
            Err(err) => {
                outcomes.push(JobOutcome::DeadLettered(err.clone()));
                continue;
            }
        };
        let payload = job.payload();
        let envelope = job.envelope();
        let Some(locked) = characters.get_mut(&payload.character_id()) else {
            outcomes.push(failure(c, "character not found".into(), retry_limit));
            continue;
        };
        if locked.owner_epoch > envelope.owner_epoch {
            outcomes.push(JobOutcome::Superseded);
            continue;
        }
        let pair = (payload.character_id(), envelope.idempotency_key.clone());
        if recorded.contains(&pair) || seen.contains(&pair) || already_held(model, locked, job) {
            outcomes.push(JobOutcome::AlreadyApplied);
            continue;
        }
        if let Some(reason) = rewrite_refused(model, locked, job, policy.claimant) {
            outcomes.push(JobOutcome::Deferred(reason));
            continue;
        }
        let held_before = if locked.released.is_empty() {
            Vec::new()
        } else {
            model.held_items(&locked.row.state)
        };
        match apply_payload(model, &mut locked.row, payload) {
            Ok(changed) => {
                if payload.is_state() {
                    // A dump: a live write of that copy's content up to its mark (a checkpoint
                    // dumped before it no longer outranks the row), then the effects it issued
                    // later, replayed on it.
                    // Within one copy the mark never goes down: an unsequenced dump (0) by a
                    // producer without the copy's sequence keeps what the row's mark held.
                    locked.mark = if locked.mark.0 == envelope.owner_epoch {
                        (locked.mark.0, locked.mark.1.max(envelope.issue_seq))
                    } else {
                        (envelope.owner_epoch, envelope.issue_seq)
                    };
                    locked.live_write = true;
                    dirty.insert(payload.character_id());
                    if let Some(dumped_at) = job.dumped_at_version() {
                        // What the row took after the dump that the dump does not hold: an
                        // offline grant, or the copy's own later effects.
                        let missing = locked.landed_after_dump.iter().filter(|e| {
                            e.row_version > dumped_at
                                && e.payload.core().is_none()
                                && !(e.owner_epoch == envelope.owner_epoch
                                    && e.issue_seq > 0
                                    && e.issue_seq <= envelope.issue_seq)
                        });
                        replay(model, &mut locked.row, missing);
                    } else {
                        let later = locked.sequenced.iter().filter(|e| {
                            e.owner_epoch == envelope.owner_epoch
                                && e.issue_seq > envelope.issue_seq
                        });
                        replay(model, &mut locked.row, later);
                    }
                }
                if leave_out_released(model, &mut locked.row.state, &locked.released, &held_before)
                {
                    dirty.insert(payload.character_id());
                }
                if changed {
                    dirty.insert(payload.character_id());
                }
                if let Some(CoreWrite::TransferActivation {
                    character_id,
                    transfer_token,
                    target_shard,
                    target_zone,
                }) = payload.core()
                {
                    activations.push((
                        transfer_token.clone(),
                        *character_id,
                        target_shard.clone(),
                        target_zone.clone(),
                        envelope.owner_epoch,
                    ));
                } else {
                    let applied = RecordedEffect {
                        key: envelope.idempotency_key.clone(),
                        owner_epoch: envelope.owner_epoch,
                        issue_seq: envelope.issue_seq,
                        row_version: locked.state_version + 1,
                        payload: payload.clone(),
                    };
                    if envelope.issue_seq > 0 {
                        locked.sequenced.push(applied.clone());
                    }
                    locked.landed_after_dump.push(applied);
                    records.push(effects::NewRecord {
                        character_id: payload.character_id(),
                        key: envelope.idempotency_key.clone(),
                        owner_epoch: envelope.owner_epoch,
                        issue_seq: envelope.issue_seq,
                        payload: payload.clone(),
                    });
                }
                seen.insert(pair);
                outcomes.push(JobOutcome::Applied);
            }
            Err(err) => outcomes.push(failure(c, err, retry_limit)),
        }
    }

    let versions = write_characters(tx, &characters, &dirty).await?;
    tx.insert_effects(&records, &versions).await?;
    tx.insert_activations(&activations).await?;
    write_job_outcomes(tx, claimed, &outcomes, now, reschedule).await?;
    Ok(outcomes)
}

/// Locks the characters `jobs` apply to (in id order), with the sequenced effects of those that
/// have a sequenced job whose order matters (a value set outright).
async fn lock_characters(
    tx: &mut JobTx<'_>,
    model: &ModelHandle,
    jobs: &[&PersistenceRetryJob],
) -> Result<HashMap<Uuid, Locked>, sqlx::Error> {
    let ids: Vec<Uuid> = jobs
        .iter()
        .map(|j| j.payload().character_id())
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let rows = tx.character_rows(&ids).await?;
    let mut characters: HashMap<Uuid, Locked> = rows
        .into_iter()
        .map(
            |(
                id,
                owner_epoch,
                state_version,
                state,
                zone_ref,
                room_ref,
                mark_epoch,
                mark,
                schema,
                owner_schema,
            )| {
                let locked = Locked {
                    owner_epoch,
                    owner_schema: u32::try_from(owner_schema).unwrap_or(1),
                    state_version,
                    mark: (mark_epoch, u64::try_from(mark).unwrap_or(0)),
                    row: RowState {
                        state,
                        zone_ref,
                        room_ref,
                        schema_version: u32::try_from(schema).unwrap_or(1),
                    },
                    sequenced: Vec::new(),
                    live_write: false,
                    released: Vec::new(),
                    landed_after_dump: Vec::new(),
                };
                (id, locked)
            },
        )
        .collect();
    let ordered: Vec<(Uuid, i64)> = jobs
        .iter()
        .filter(|j| j.envelope().issue_seq > 0 && is_absolute(model, j.payload()))
        .filter_map(|j| {
            let id = j.payload().character_id();
            characters.get(&id).map(|c| (id, c.owner_epoch))
        })
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    for (id, found) in tx.sequenced(&ordered).await? {
        if let Some(locked) = characters.get_mut(&id) {
            locked.sequenced = found;
        }
    }
    let mut dumped: HashMap<Uuid, i64> = HashMap::new();
    for job in jobs {
        if let Some(at) = job.dumped_at_version() {
            let oldest = dumped.entry(job.payload().character_id()).or_insert(at);
            *oldest = (*oldest).min(at);
        }
    }
    let dumped: Vec<(Uuid, i64)> = dumped.into_iter().collect();
    for (id, found) in tx.recorded_after(&dumped).await? {
        if let Some(locked) = characters.get_mut(&id) {
            locked.landed_after_dump = found;
        }
    }
    for (id, item) in tx.released(&ids).await? {
        if let Some(locked) = characters.get_mut(&id) {
            locked.released.push(item);
        }
    }
    Ok(characters)
}

/// Takes out of `state` every item of `released` (items transfer commits took from this
/// character) that the write just applied put back; `before` lists what the row held before it.
/// A fight's loot is in its copy at once and in its reward job, which may land only after the copy
/// dropped the item and another character's row took it: the job must not bring it back (nor may a
/// dump issued before the release). True when it took any.
fn leave_out_released(
    model: &ModelHandle,
    state: &mut serde_json::Value,
    released: &[Uuid],
    before: &[Uuid],
) -> bool {
    if released.is_empty() {
        return false;
    }
    let after = model.held_items(state);
    let mut taken = false;
    for item in released {
        if after.contains(item) && !before.contains(item) {
            taken |= model.take_item(state, *item).unwrap_or(false);
        }
    }
    taken
}

/// True when the row already holds what a sequenced job would write: a dump of its copy at or
/// after the job's issue landed (the row's mark reaches it; a state job's own dump only when a
/// later one landed), or, for a value set outright, a later write of the same kind applied.
fn already_held(model: &ModelHandle, locked: &Locked, job: &PersistenceRetryJob) -> bool {
    let envelope = job.envelope();
    let seq = envelope.issue_seq;
    if matches!(
        job.payload().core(),
        Some(CoreWrite::TransferActivation { .. })
    ) {
        return false;
    }
    if seq == 0 {
        // A document written before migration 8 still lists the grants it holds.
        return job.payload().core().is_none()
            && !is_absolute(model, job.payload())
            && lists_legacy_reward_key(&locked.row.state, &envelope.idempotency_key);
    }
    let (mark_epoch, mark) = locked.mark;
    let is_state = job.payload().is_state();
    if mark_epoch == envelope.owner_epoch && (mark > seq || (mark == seq && !is_state)) {
        return true;
    }
    is_absolute(model, job.payload())
        && locked.sequenced.iter().any(|e| {
            e.owner_epoch == envelope.owner_epoch
                && e.issue_seq > seq
                && (e.payload.kind() == job.payload().kind() || e.payload.is_state())
        })
}

/// Why this settle must leave a job alone, if it must (see [`crate::model::may_rewrite`]): only
/// for a job that writes the document. A claimant replaces the row's owner, so only the
/// document's schema counts for it.
fn rewrite_refused(
    model: &ModelHandle,
    locked: &Locked,
    job: &PersistenceRetryJob,
    claimant: bool,
) -> Option<String> {
    if matches!(
        job.payload().core(),
        Some(CoreWrite::TransferActivation { .. })
    ) {
        return None;
    }
    let owner = (!claimant).then_some(locked.owner_schema);
    crate::model::may_rewrite(model.schema_version(), locked.row.schema_version, owner).err()
}

/// How a settle decides failures, and for whom it writes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Policy {
    /// Attempts before a failing job is dead-lettered.
    pub(super) retry_limit: u32,
    /// True when the settle runs inside the claim that replaces the row's owner.
    pub(super) claimant: bool,
}

impl Policy {
    /// A retry worker's settle.
    pub(super) fn worker(retry_limit: u32) -> Self {
        Self {
            retry_limit,
            claimant: false,
        }
    }
}

fn failure(c: &Claimed, error: String, retry_limit: u32) -> JobOutcome {
    let attempt = u32::try_from(c.row.attempt_count).unwrap_or(0) + 1;
    if attempt >= retry_limit {
        JobOutcome::DeadLettered(error)
    } else {
        JobOutcome::Retrying(error)
    }
}

/// Records a failure for one job outside any batch (its batch could not settle), fenced by the
/// lease: rescheduled, or dead-lettered at the limit.
pub(crate) async fn fail_alone(
    jobs: &JobStore,
    token: Uuid,
    now: DateTime<Utc>,
    claimed: &Claimed,
    error: String,
    retry_limit: u32,
    reschedule: &mut impl Reschedule,
) -> Result<JobOutcome, sqlx::Error> {
    let mut open = jobs.begin().await?;
    let mut tx = open.steps(now);
    let owned = tx
        .leased_to(&[claimed.row.stored.retry_job_id], token)
        .await?;
    if owned.is_empty() {
        return Ok(JobOutcome::Stale);
    }
    let outcome = failure(claimed, error, retry_limit);
    write_job_outcomes(
        &mut tx,
        std::slice::from_ref(claimed),
        std::slice::from_ref(&outcome),
        now,
        reschedule,
    )
    .await?;
    open.commit().await?;
    Ok(outcome)
}
