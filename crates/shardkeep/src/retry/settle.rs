//! Settling a claimed batch in one transaction: lock the jobs still leased to us (the rest are
//! stale), lock their characters, apply what passes the ownership fence, record reward keys and
//! transfer activations, delete what is done, and reschedule or dead-letter what failed — every
//! job write fenced by our lease token.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::apply::{RowState, apply_payload, effect_recorded};
use super::job::{PersistenceRetryJob, PersistenceRetryPayload};
use super::store::ClaimedRow;
use crate::backend::PostgresBackend;

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
    /// Failed for the last time, or undecodable: moved to the dead letters.
    DeadLettered(String),
    /// Our lease was reclaimed by another worker: nothing written.
    Stale,
    /// Nothing could be recorded (the store failed); the lease runs out and the job is claimed
    /// again.
    Unsettled(String),
}

/// A claimed job ready to settle.
#[derive(Debug, Clone)]
pub(crate) struct Claimed {
    pub(crate) row: ClaimedRow,
    pub(crate) job: Result<PersistenceRetryJob, String>,
}

/// How to reschedule a failure: attempt number → delay.
pub(crate) trait Reschedule {
    fn next_attempt(&mut self, attempt: u32, now: DateTime<Utc>) -> DateTime<Utc>;
}

type CharacterRow = (Uuid, i64, serde_json::Value, Option<String>, Option<String>);

/// Settles `claimed` in one transaction, returning an outcome per job in input order.
pub(crate) async fn settle(
    pg: &PostgresBackend,
    token: Uuid,
    now: DateTime<Utc>,
    claimed: &[Claimed],
    retry_limit: u32,
    reschedule: &mut impl Reschedule,
) -> Result<Vec<JobOutcome>, sqlx::Error> {
    let mut tx = pg.pool().begin().await?;
    let ids: Vec<Uuid> = claimed.iter().map(|c| c.row.stored.retry_job_id).collect();
    let owned: HashSet<Uuid> = sqlx::query_scalar(
        "SELECT retry_job_id FROM persistence_retry_jobs
          WHERE retry_job_id = ANY($1) AND lease_token = $2
          ORDER BY retry_job_id
            FOR UPDATE",
    )
    .bind(&ids)
    .bind(token)
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .collect();

    let character_ids: Vec<Uuid> = claimed
        .iter()
        .filter(|c| owned.contains(&c.row.stored.retry_job_id))
        .filter_map(|c| c.job.as_ref().ok().map(|j| j.payload().character_id()))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let rows: Vec<CharacterRow> = sqlx::query_as(
        "SELECT id, owner_epoch, state, zone_ref, room_ref FROM characters
          WHERE id = ANY($1) ORDER BY id FOR UPDATE",
    )
    .bind(&character_ids)
    .fetch_all(&mut *tx)
    .await?;
    let mut characters: HashMap<Uuid, (i64, RowState)> = rows
        .into_iter()
        .map(|(id, epoch, state, zone_ref, room_ref)| {
            (
                id,
                (
                    epoch,
                    RowState {
                        state,
                        zone_ref,
                        room_ref,
                    },
                ),
            )
        })
        .collect();

    let granted = grant_reward_keys(&mut tx, claimed, &owned, &characters).await?;
    let mut seen_keys = HashSet::new();
    let mut outcomes = Vec::with_capacity(claimed.len());
    let mut dirty = HashSet::new();
    let mut activations = Vec::new();
    for c in claimed {
        let id = c.row.stored.retry_job_id;
        if !owned.contains(&id) {
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
        let Some((epoch, row)) = characters.get_mut(&payload.character_id()) else {
            outcomes.push(failure(c, "character not found".into(), retry_limit));
            continue;
        };
        if *epoch > job.envelope().owner_epoch {
            outcomes.push(JobOutcome::Superseded);
            continue;
        }
        let key = &job.envelope().idempotency_key;
        if let PersistenceRetryPayload::CombatRewards { .. } = payload {
            if !granted.contains(key) || !seen_keys.insert(key.clone()) {
                outcomes.push(JobOutcome::AlreadyApplied);
                continue;
            }
        } else if effect_recorded(row, key) {
            // The same job stored twice (an enqueue retried after its reply was lost, landing
            // after the first copy ran): applying it again would undo what landed since.
            outcomes.push(JobOutcome::AlreadyApplied);
            continue;
        }
        let before = row.clone();
        match apply_payload(row, payload, &job.envelope().idempotency_key) {
            Ok(()) => {
                if *row != before {
                    dirty.insert(payload.character_id());
                }
                if let PersistenceRetryPayload::TransferActivation {
                    character_id,
                    transfer_token,
                    target_shard,
                    target_zone,
                } = payload
                {
                    activations.push((
                        transfer_token.clone(),
                        *character_id,
                        target_shard.clone(),
                        target_zone.clone(),
                        job.envelope().owner_epoch,
                    ));
                }
                outcomes.push(JobOutcome::Applied);
            }
            Err(err) => outcomes.push(failure(c, err, retry_limit)),
        }
    }

    release_reward_keys(&mut tx, claimed, &outcomes, &granted).await?;
    write_characters(&mut tx, &characters, &dirty).await?;
    write_activations(&mut tx, &activations).await?;
    write_job_outcomes(&mut tx, claimed, &outcomes, now, reschedule).await?;
    tx.commit().await?;
    Ok(outcomes)
}

fn failure(c: &Claimed, error: String, retry_limit: u32) -> JobOutcome {
    let attempt = u32::try_from(c.row.attempt_count).unwrap_or(0) + 1;
    if attempt >= retry_limit {
        JobOutcome::DeadLettered(error)
    } else {
        JobOutcome::Retrying(error)
    }
}

/// Records the idempotency keys of the reward jobs that will apply (owned, character present,
/// not superseded); returns the keys that were new. A key already recorded means the grant
/// happened before.
async fn grant_reward_keys(
    tx: &mut sqlx::PgConnection,
    claimed: &[Claimed],
    owned: &HashSet<Uuid>,
    characters: &HashMap<Uuid, (i64, RowState)>,
) -> Result<HashSet<String>, sqlx::Error> {
    let mut keys = Vec::new();
    let mut character_ids = Vec::new();
    let mut job_ids = Vec::new();
    for c in claimed
        .iter()
        .filter(|c| owned.contains(&c.row.stored.retry_job_id))
    {
        let Ok(job) = &c.job else { continue };
        if !matches!(job.payload(), PersistenceRetryPayload::CombatRewards { .. }) {
            continue;
        }
        let character_id = job.payload().character_id();
        let eligible = characters
            .get(&character_id)
            .is_some_and(|(epoch, _)| *epoch <= job.envelope().owner_epoch);
        if eligible {
            keys.push(job.envelope().idempotency_key.clone());
            character_ids.push(character_id);
            job_ids.push(job.retry_job_id());
        }
    }
    if keys.is_empty() {
        return Ok(HashSet::new());
    }
    Ok(sqlx::query_scalar(
        "INSERT INTO reward_grants (idempotency_key, character_id, retry_job_id)
         SELECT * FROM UNNEST($1::text[], $2::uuid[], $3::uuid[])
         ON CONFLICT (idempotency_key) DO NOTHING
         RETURNING idempotency_key",
    )
    .bind(&keys)
    .bind(&character_ids)
    .bind(&job_ids)
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .collect())
}

/// Takes back the reward keys recorded in this transaction for jobs that did not apply (their
/// apply failed: a retry, or a dead letter an operator may requeue), so the grant can still
/// happen once.
async fn release_reward_keys(
    tx: &mut sqlx::PgConnection,
    claimed: &[Claimed],
    outcomes: &[JobOutcome],
    granted: &HashSet<String>,
) -> Result<(), sqlx::Error> {
    let failed: Vec<String> = claimed
        .iter()
        .zip(outcomes)
        .filter(|(_, outcome)| {
            matches!(
                outcome,
                JobOutcome::Retrying(_) | JobOutcome::DeadLettered(_)
            )
        })
        .filter_map(|(c, _)| c.job.as_ref().ok())
        .map(|job| job.envelope().idempotency_key.clone())
        .filter(|key| granted.contains(key))
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    sqlx::query("DELETE FROM reward_grants WHERE idempotency_key = ANY($1)")
        .bind(&failed)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Most bytes of state documents sent in one UPDATE. sqlx does not set TCP_NODELAY, and a bind
/// message larger than the socket's initial 16 KiB send buffer leaves its tail waiting on the
/// server's delayed ACK (~40 ms); statements kept under that size never stall.
const UPDATE_CHUNK_BYTES: usize = 12 * 1024;

async fn write_characters(
    tx: &mut sqlx::PgConnection,
    characters: &HashMap<Uuid, (i64, RowState)>,
    dirty: &HashSet<Uuid>,
) -> Result<(), sqlx::Error> {
    let mut ids = Vec::new();
    let mut states = Vec::new();
    let mut zones = Vec::new();
    let mut rooms = Vec::new();
    let mut bytes = 0;
    let mut sorted: Vec<&Uuid> = dirty.iter().collect();
    sorted.sort();
    for (n, id) in sorted.iter().enumerate() {
        if let Some((_, row)) = characters.get(id) {
            bytes += crate::game::apply::encoded_len(&row.state);
            ids.push(**id);
            states.push(&row.state);
            zones.push(row.zone_ref.as_deref());
            rooms.push(row.room_ref.as_deref());
        }
        let last = n + 1 == sorted.len();
        if !ids.is_empty() && (bytes >= UPDATE_CHUNK_BYTES || last) {
            update_characters(tx, &ids, &states, &zones, &rooms).await?;
            ids.clear();
            states.clear();
            zones.clear();
            rooms.clear();
            bytes = 0;
        }
    }
    Ok(())
}

async fn update_characters(
    tx: &mut sqlx::PgConnection,
    ids: &[Uuid],
    states: &[&serde_json::Value],
    zones: &[Option<&str>],
    rooms: &[Option<&str>],
) -> Result<(), sqlx::Error> {
    // The version moves on, so a live copy's next flush conflicts and re-dumps over this row
    // rather than silently overwriting it.
    sqlx::query(
        "UPDATE characters c
            SET state = v.state, zone_ref = COALESCE(NULLIF(v.zone_ref, ''), c.zone_ref),
                room_ref = CASE WHEN NULLIF(v.zone_ref, '') IS NULL THEN c.room_ref ELSE v.room_ref END,
                state_version = c.state_version + 1, updated_at = now()
           FROM UNNEST($1::uuid[], $2::jsonb[], $3::text[], $4::text[]) AS v(id, state, zone_ref, room_ref)
          WHERE c.id = v.id",
    )
    .bind(ids)
    .bind(states)
    .bind(zones)
    .bind(rooms)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

type Activation = (String, Uuid, String, String, i64);

async fn write_activations(
    tx: &mut sqlx::PgConnection,
    activations: &[Activation],
) -> Result<(), sqlx::Error> {
    if activations.is_empty() {
        return Ok(());
    }
    let tokens: Vec<&str> = activations.iter().map(|a| a.0.as_str()).collect();
    let characters: Vec<Uuid> = activations.iter().map(|a| a.1).collect();
    let shards: Vec<&str> = activations.iter().map(|a| a.2.as_str()).collect();
    let zones: Vec<&str> = activations.iter().map(|a| a.3.as_str()).collect();
    let epochs: Vec<i64> = activations.iter().map(|a| a.4).collect();
    sqlx::query(
        "INSERT INTO transfer_activations (transfer_token, character_id, target_shard, target_zone, owner_epoch)
         SELECT * FROM UNNEST($1::text[], $2::uuid[], $3::text[], $4::text[], $5::int8[])
         ON CONFLICT (transfer_token) DO NOTHING",
    )
    .bind(&tokens)
    .bind(&characters)
    .bind(&shards)
    .bind(&zones)
    .bind(&epochs)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Deletes finished jobs, reschedules retries and moves dead ones — batched, one statement each.
async fn write_job_outcomes(
    tx: &mut sqlx::PgConnection,
    claimed: &[Claimed],
    outcomes: &[JobOutcome],
    now: DateTime<Utc>,
    reschedule: &mut impl Reschedule,
) -> Result<(), sqlx::Error> {
    let mut done = Vec::new();
    let (mut retry_ids, mut retry_errors, mut retry_at) = (Vec::new(), Vec::new(), Vec::new());
    let (mut dead_ids, mut dead_errors, mut dead_letter_ids) = (Vec::new(), Vec::new(), Vec::new());
    for (c, outcome) in claimed.iter().zip(outcomes) {
        let id = c.row.stored.retry_job_id;
        match outcome {
            JobOutcome::Applied | JobOutcome::AlreadyApplied | JobOutcome::Superseded => {
                done.push(id)
            }
            JobOutcome::Retrying(err) => {
                let attempt = u32::try_from(c.row.attempt_count).unwrap_or(0) + 1;
                retry_ids.push(id);
                retry_errors.push(err.clone());
                retry_at.push(reschedule.next_attempt(attempt, now));
            }
            JobOutcome::DeadLettered(err) => {
                dead_ids.push(id);
                dead_errors.push(err.clone());
                dead_letter_ids.push(Uuid::now_v7());
            }
            JobOutcome::Stale | JobOutcome::Unsettled(_) => {}
        }
    }
    if !done.is_empty() {
        sqlx::query("DELETE FROM persistence_retry_jobs WHERE retry_job_id = ANY($1)")
            .bind(&done)
            .execute(&mut *tx)
            .await?;
    }
    if !retry_ids.is_empty() {
        sqlx::query(
            "UPDATE persistence_retry_jobs j
                SET last_error = v.err, attempt_count = j.attempt_count + 1, next_attempt_at = v.at,
                    lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, updated_at = $4
               FROM UNNEST($1::uuid[], $2::text[], $3::timestamptz[]) AS v(id, err, at)
              WHERE j.retry_job_id = v.id",
        )
        .bind(&retry_ids)
        .bind(&retry_errors)
        .bind(&retry_at)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    }
    if !dead_ids.is_empty() {
        sqlx::query(
            "WITH moved AS (
                 DELETE FROM persistence_retry_jobs j
                  USING UNNEST($1::uuid[], $2::text[], $3::uuid[]) AS v(id, err, dead_letter_id)
                  WHERE j.retry_job_id = v.id
              RETURNING j.*, v.err, v.dead_letter_id
             )
             INSERT INTO persistence_job_dead_letters (dead_letter_id, retry_job_id, job_kind, character_id,
                 realm_id, zone_id, payload, failed_attempts, last_error, failed_at, session_token, source,
                 session_impact, idempotency_key, owner_epoch, origin, issued_at)
             SELECT dead_letter_id, retry_job_id, job_kind, character_id, realm_id, zone_id, payload,
                    attempt_count + 1, err, $4, session_token, source, session_impact, idempotency_key,
                    owner_epoch, origin, issued_at
               FROM moved",
        )
        .bind(&dead_ids)
        .bind(&dead_errors)
        .bind(&dead_letter_ids)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}

/// Records a failure for one job outside any batch (its batch could not settle), fenced by the
/// lease: rescheduled, or dead-lettered at the limit.
pub(crate) async fn fail_alone(
    pg: &PostgresBackend,
    token: Uuid,
    now: DateTime<Utc>,
    claimed: &Claimed,
    error: String,
    retry_limit: u32,
    reschedule: &mut impl Reschedule,
) -> Result<JobOutcome, sqlx::Error> {
    let mut tx = pg.pool().begin().await?;
    let owned: Option<Uuid> = sqlx::query_scalar(
        "SELECT retry_job_id FROM persistence_retry_jobs WHERE retry_job_id = $1 AND lease_token = $2 FOR UPDATE",
    )
    .bind(claimed.row.stored.retry_job_id)
    .bind(token)
    .fetch_optional(&mut *tx)
    .await?;
    if owned.is_none() {
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
    tx.commit().await?;
    Ok(outcome)
}
