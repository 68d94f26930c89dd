//! The checkpoint tier in the embedded store: one row per character in the SQLite file's
//! `checkpoints` table, behind the same ownership guard as the Redis tier's script. A batch of
//! writes is one transaction (one sync of the file); expired rows are invisible at once and
//! deleted by [`sweep_expired`].

use std::sync::Arc;

use uuid::Uuid;

use super::checkpoint::{CheckpointError, CheckpointWrite, GuardDecision, decide_guard};
use super::snapshot::CharacterSnapshot;
use crate::backend::SqliteBackend;
use crate::clock::Clock;
use crate::ttl::Ttl;

/// Microseconds since the epoch, as the embedded schema stores times.
pub(crate) fn micros(clock: &dyn Clock) -> i64 {
    clock.now().timestamp_micros()
}

/// The stored guard of a live (unexpired) row: the epoch and schema as stored, `None` for a
/// value that is not an integer (a column's INTEGER affinity turns integer-looking text into an
/// integer, and keeps anything else, such as `five` or `5.5`, as it was written).
const READ_GUARD: &str = "
SELECT CASE WHEN typeof(owner_epoch) = 'integer' THEN owner_epoch END,
       CASE WHEN typeof(schema) = 'integer' THEN schema END
  FROM checkpoints WHERE character_id = ?1 AND expires_at > ?2";

const UPSERT: &str = "
INSERT INTO checkpoints (character_id, owner_epoch, schema, snapshot, expires_at)
VALUES (?1, ?2, ?3, ?4, ?5)
ON CONFLICT (character_id) DO UPDATE SET
    owner_epoch = excluded.owner_epoch,
    schema = excluded.schema,
    snapshot = excluded.snapshot,
    expires_at = excluded.expires_at";

/// Writes each snapshot unless a newer owner's (or newer schema's) live checkpoint is stored,
/// all in one transaction; one result per snapshot, in order.
pub(super) async fn write_many(
    db: &SqliteBackend,
    clock: &dyn Clock,
    ttl: Ttl,
    snapshots: &[&CharacterSnapshot],
) -> Result<Vec<CheckpointWrite>, CheckpointError> {
    // Encoded before the write lock is taken: a snapshot that cannot be encoded fails the call
    // with nothing written.
    let bodies = snapshots
        .iter()
        .map(|snapshot| serde_json::to_string(snapshot).map_err(CheckpointError::Encode))
        .collect::<Result<Vec<_>, _>>()?;
    // The clock is read once the write lock is held: a wait for it must neither keep an
    // expired row guarding nor shorten the new rows' time.
    let mut tx = db.begin().await?;
    let now = micros(clock);
    let ttl_micros = i64::try_from(ttl.duration().as_micros()).unwrap_or(i64::MAX);
    let expires_at = now.saturating_add(ttl_micros);
    let mut results = Vec::with_capacity(snapshots.len());
    for (snapshot, body) in snapshots.iter().zip(bodies) {
        let stored: Option<(Option<i64>, Option<i64>)> = sqlx::query_as(READ_GUARD)
            .bind(snapshot.character_id)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
        let schema = i64::from(snapshot.schema_version);
        match decide_guard(stored, snapshot.owner_epoch, schema) {
            GuardDecision::Refuse(refusal) => results.push(refusal),
            GuardDecision::Write => {
                sqlx::query(UPSERT)
                    .bind(snapshot.character_id)
                    .bind(snapshot.owner_epoch)
                    .bind(schema)
                    .bind(body)
                    .bind(expires_at)
                    .execute(&mut *tx)
                    .await?;
                results.push(CheckpointWrite::Written);
            }
        }
    }
    tx.commit().await?;
    Ok(results)
}

/// The live checkpoint of `character_id`: its guard epoch (`None` when not an integer) and its
/// body (`None` when not text).
pub(super) async fn read(
    db: &SqliteBackend,
    clock: &dyn Clock,
    character_id: Uuid,
) -> Result<Option<(Option<i64>, Option<String>)>, CheckpointError> {
    let row: Option<(Option<i64>, Option<String>)> = sqlx::query_as(
        "SELECT CASE WHEN typeof(owner_epoch) = 'integer' THEN owner_epoch END,
                CASE WHEN typeof(snapshot) = 'text' THEN snapshot END
           FROM checkpoints WHERE character_id = ?1 AND expires_at > ?2",
    )
    .bind(character_id)
    .bind(micros(clock))
    .fetch_optional(db.reader()?)
    .await?;
    Ok(row)
}

/// Deletes the checkpoint of `character_id`.
pub(super) async fn delete(db: &SqliteBackend, character_id: Uuid) -> Result<(), CheckpointError> {
    sqlx::query("DELETE FROM checkpoints WHERE character_id = ?1")
        .bind(character_id)
        .execute(db.reader()?)
        .await?;
    Ok(())
}

/// Deletes up to `limit` expired checkpoints, oldest expiry first; how many it deleted.
pub(super) async fn sweep_expired(
    db: &SqliteBackend,
    clock: &dyn Clock,
    limit: u32,
) -> Result<u64, CheckpointError> {
    let done = sqlx::query(
        "DELETE FROM checkpoints WHERE character_id IN (
             SELECT character_id FROM checkpoints WHERE expires_at <= ?1
              ORDER BY expires_at LIMIT ?2)",
    )
    .bind(micros(clock))
    .bind(i64::from(limit))
    .execute(db.reader()?)
    .await?;
    Ok(done.rows_affected())
}

/// The clock the embedded tier reads expiry against, shared by clones.
pub(super) type SharedClock = Arc<dyn Clock>;
