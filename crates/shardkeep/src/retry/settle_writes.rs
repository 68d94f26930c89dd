//! The writes that end a settle, batched: the changed character rows (chunked by size), the
//! transfer activations, and the jobs' own outcomes (deleted, rescheduled or dead-lettered).
//! What to write is decided here for both drivers; the Postgres statements are here too (the
//! embedded store's are in `sqlite_settle` and `sqlite_jobs`).

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::job_tx::JobTx;
use super::settle::{Claimed, JobOutcome, Locked, Reschedule};

/// Most bytes of state documents sent in one UPDATE. sqlx does not set TCP_NODELAY, and a bind
/// message larger than the socket's initial 16 KiB send buffer leaves its tail waiting on the
/// server's delayed ACK (~40 ms); statements kept under that size never stall.
const UPDATE_CHUNK_BYTES: usize = 12 * 1024;

/// Writes the changed rows (chunked by size), each moving one version on; returns every locked
/// character's row version after the batch.
pub(super) async fn write_characters(
    tx: &mut JobTx<'_>,
    characters: &HashMap<Uuid, Locked>,
    dirty: &HashSet<Uuid>,
) -> Result<HashMap<Uuid, i64>, sqlx::Error> {
    let mut chunk = RowChunk::default();
    let mut bytes = 0;
    let mut sorted: Vec<&Uuid> = dirty.iter().collect();
    sorted.sort();
    for (n, id) in sorted.iter().enumerate() {
        if let Some(locked) = characters.get(id) {
            bytes += crate::model::encoded_len(&locked.row.state);
            chunk.push(**id, locked);
        }
        let last = n + 1 == sorted.len();
        if !chunk.ids.is_empty() && (bytes >= UPDATE_CHUNK_BYTES || last) {
            tx.update_characters(&chunk).await?;
            chunk = RowChunk::default();
            bytes = 0;
        }
    }
    Ok(characters
        .iter()
        .map(|(id, locked)| {
            let moved = i64::from(dirty.contains(id));
            (*id, locked.state_version + moved)
        })
        .collect())
}

/// Rows to write, one column per vector.
#[derive(Default)]
pub(super) struct RowChunk<'a> {
    pub(super) ids: Vec<Uuid>,
    pub(super) states: Vec<&'a serde_json::Value>,
    pub(super) zones: Vec<Option<&'a str>>,
    pub(super) rooms: Vec<Option<&'a str>>,
    pub(super) mark_epochs: Vec<i64>,
    pub(super) marks: Vec<i64>,
    pub(super) live: Vec<bool>,
    pub(super) schemas: Vec<i32>,
}

impl<'a> RowChunk<'a> {
    fn push(&mut self, id: Uuid, locked: &'a Locked) {
        self.ids.push(id);
        self.states.push(&locked.row.state);
        self.zones.push(locked.row.zone_ref.as_deref());
        self.rooms.push(locked.row.room_ref.as_deref());
        self.mark_epochs.push(locked.mark.0);
        self.marks
            .push(i64::try_from(locked.mark.1).unwrap_or(i64::MAX));
        self.live.push(locked.live_write);
        self.schemas
            .push(i32::try_from(locked.row.schema_version).unwrap_or(i32::MAX));
    }
}

/// Postgres: writes the rows of `chunk` in one statement.
pub(super) async fn update_characters(
    tx: &mut sqlx::PgConnection,
    chunk: &RowChunk<'_>,
) -> Result<(), sqlx::Error> {
    // The version moves on, so a live copy's next flush conflicts and re-dumps over this row
    // rather than silently overwriting it.
    sqlx::query(
        "UPDATE characters c
            SET state = v.state, zone_ref = COALESCE(NULLIF(v.zone_ref, ''), c.zone_ref),
                room_ref = CASE WHEN NULLIF(v.zone_ref, '') IS NULL THEN c.room_ref ELSE v.room_ref END,
                live_issue_epoch = v.mark_epoch, live_issue_mark = v.mark,
                live_version = CASE WHEN v.live THEN c.state_version + 1 ELSE c.live_version END,
                state_version = c.state_version + 1, schema_version = v.schema,
                updated_at = now()
           FROM UNNEST($1::uuid[], $2::jsonb[], $3::text[], $4::text[], $5::int8[], $6::int8[],
                       $7::bool[], $8::int4[])
                AS v(id, state, zone_ref, room_ref, mark_epoch, mark, live, schema)
          WHERE c.id = v.id",
    )
    .bind(&chunk.ids)
    .bind(&chunk.states)
    .bind(&chunk.zones)
    .bind(&chunk.rooms)
    .bind(&chunk.mark_epochs)
    .bind(&chunk.marks)
    .bind(&chunk.live)
    .bind(&chunk.schemas)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// A transfer activation to record: token, character, target shard, target zone, owner epoch.
pub(super) type Activation = (String, Uuid, String, String, i64);

/// Postgres: records `activations` in one statement.
pub(super) async fn insert_activations(
    tx: &mut sqlx::PgConnection,
    activations: &[Activation],
) -> Result<(), sqlx::Error> {
    let tokens: Vec<&str> = activations.iter().map(|a| a.0.as_str()).collect();
    let characters: Vec<Uuid> = activations.iter().map(|a| a.1).collect();
    let shards: Vec<&str> = activations.iter().map(|a| a.2.as_str()).collect();
    let zones: Vec<&str> = activations.iter().map(|a| a.3.as_str()).collect();
    let epochs: Vec<i64> = activations.iter().map(|a| a.4).collect();
    sqlx::query(
        "INSERT INTO transfer_activations (transfer_token, character_id, target_shard, target_zone, owner_epoch)
         SELECT * FROM UNNEST($1::text[], $2::uuid[], $3::text[], $4::text[], $5::int8[])
         ON CONFLICT (character_id, transfer_token) DO NOTHING",
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

/// What a settle writes for its jobs, one list per kind of ending.
#[derive(Debug, Default)]
pub(super) struct OutcomeWrites {
    /// Applied, already applied or superseded: deleted.
    pub(super) done: Vec<Uuid>,
    /// Failed: rescheduled with one more attempt (id, error, next attempt).
    pub(super) retry: Vec<(Uuid, String, DateTime<Utc>)>,
    /// Failed for the last time: moved to the dead letters (id, error, dead letter id).
    pub(super) dead: Vec<(Uuid, String, Uuid)>,
    /// Left for a newer release (id, why), due again at `deferred_until`.
    pub(super) deferred: Vec<(Uuid, String)>,
    /// When deferred jobs are due again.
    pub(super) deferred_until: DateTime<Utc>,
}

/// Deletes finished jobs, reschedules retries and moves dead ones — batched.
pub(super) async fn write_job_outcomes(
    tx: &mut JobTx<'_>,
    claimed: &[Claimed],
    outcomes: &[JobOutcome],
    now: DateTime<Utc>,
    reschedule: &mut impl Reschedule,
) -> Result<(), sqlx::Error> {
    let mut writes = OutcomeWrites {
        deferred_until: now
            + chrono::Duration::from_std(super::settle::DEFERRED_FOR).unwrap_or_default(),
        ..OutcomeWrites::default()
    };
    for (c, outcome) in claimed.iter().zip(outcomes) {
        let id = c.row.stored.retry_job_id;
        match outcome {
            JobOutcome::Applied | JobOutcome::AlreadyApplied | JobOutcome::Superseded => {
                writes.done.push(id)
            }
            JobOutcome::Retrying(err) => {
                let attempt = u32::try_from(c.row.attempt_count).unwrap_or(0) + 1;
                writes
                    .retry
                    .push((id, err.clone(), reschedule.next_attempt(attempt, now)));
            }
            JobOutcome::DeadLettered(err) => {
                writes.dead.push((id, err.clone(), Uuid::now_v7()));
            }
            JobOutcome::Deferred(err) => writes.deferred.push((id, err.clone())),
            JobOutcome::Stale | JobOutcome::Unsettled(_) => {}
        }
    }
    tx.write_outcomes(&writes, now).await
}

/// Postgres: the writes of [`OutcomeWrites`], one statement per kind.
pub(super) async fn write_outcomes(
    tx: &mut sqlx::PgConnection,
    writes: &OutcomeWrites,
    now: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    fn ids<T>(rows: &[(Uuid, String, T)]) -> Vec<Uuid> {
        rows.iter().map(|r| r.0).collect()
    }
    fn errors<T>(rows: &[(Uuid, String, T)]) -> Vec<&str> {
        rows.iter().map(|r| r.1.as_str()).collect()
    }
    fn thirds<T: Copy>(rows: &[(Uuid, String, T)]) -> Vec<T> {
        rows.iter().map(|r| r.2).collect()
    }
    let done = &writes.done;
    let deferred_ids: Vec<Uuid> = writes.deferred.iter().map(|d| d.0).collect();
    let deferred_errors: Vec<&str> = writes.deferred.iter().map(|d| d.1.as_str()).collect();
    let (retry_ids, retry_errors, retry_at) = (
        ids(&writes.retry),
        errors(&writes.retry),
        thirds(&writes.retry),
    );
    let (dead_ids, dead_errors, dead_letter_ids) = (
        ids(&writes.dead),
        errors(&writes.dead),
        thirds(&writes.dead),
    );
    // A deferral keeps the count of leases that ran out: a job that crashes the workers of one
    // release is not forgiven by passing through another's.
    if !deferred_ids.is_empty() {
        let at = writes.deferred_until;
        sqlx::query(
            "UPDATE persistence_retry_jobs j
                SET last_error = v.err, next_attempt_at = $3,
                    lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, updated_at = $4
               FROM UNNEST($1::uuid[], $2::text[]) AS v(id, err)
              WHERE j.retry_job_id = v.id",
        )
        .bind(&deferred_ids)
        .bind(&deferred_errors)
        .bind(at)
        .bind(now)
        .execute(&mut *tx)
        .await?;
    }
    if !done.is_empty() {
        sqlx::query("DELETE FROM persistence_retry_jobs WHERE retry_job_id = ANY($1)")
            .bind(done)
            .execute(&mut *tx)
            .await?;
    }
    if !retry_ids.is_empty() {
        sqlx::query(
            "UPDATE persistence_retry_jobs j
                SET last_error = v.err, attempt_count = j.attempt_count + 1, next_attempt_at = v.at,
                    lease_token = NULL, lease_owner = NULL, lease_expires_at = NULL, updated_at = $4,
                    lease_expiries = 0
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
                 session_impact, idempotency_key, owner_epoch, origin, issued_at, issue_seq,
                 dumped_at_version)
             SELECT dead_letter_id, retry_job_id, job_kind, character_id, realm_id, zone_id, payload,
                    attempt_count + 1, err, $4, session_token, source, session_impact, idempotency_key,
                    owner_epoch, origin, issued_at, issue_seq, dumped_at_version
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
