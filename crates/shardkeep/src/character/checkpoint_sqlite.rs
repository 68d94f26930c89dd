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

/// Most checkpoints one guarded upsert statement writes (four parameters each).
const ROWS_PER_STATEMENT: usize = 128;

/// The guarded upsert of several checkpoints (`?1`: now, `?2`: the new rows' expiry, then four
/// parameters a row): a stored row is replaced only where [`decide_guard`] would write over what
/// [`READ_GUARD`] reads — it is expired, its epoch is not an integer, or its epoch is at most the
/// writer's and its schema is not an integer above the writer's. The rows written come back.
fn guarded_upsert(rows: usize) -> String {
    let mut sql = String::from(
        "INSERT INTO checkpoints (character_id, owner_epoch, schema, snapshot, expires_at) VALUES ",
    );
    for row in 0..rows {
        let first = 3 + row * 4;
        if row > 0 {
            sql.push_str(", ");
        }
        sql.push_str(&format!(
            "(?{first}, ?{}, ?{}, ?{}, ?2)",
            first + 1,
            first + 2,
            first + 3
        ));
    }
    sql.push_str(
        " ON CONFLICT (character_id) DO UPDATE SET
            owner_epoch = excluded.owner_epoch,
            schema = excluded.schema,
            snapshot = excluded.snapshot,
            expires_at = excluded.expires_at
          WHERE coalesce(checkpoints.expires_at > ?1, 0) = 0
             OR typeof(checkpoints.owner_epoch) <> 'integer'
             OR (checkpoints.owner_epoch <= excluded.owner_epoch
                 AND NOT (typeof(checkpoints.schema) = 'integer'
                          AND checkpoints.schema > excluded.schema))
        RETURNING character_id",
    );
    sql
}

/// Splits `snapshots` into the runs one guarded upsert writes: at most [`ROWS_PER_STATEMENT`],
/// and no character twice in one (a later write of it must see the earlier one's row).
fn statement_runs(snapshots: &[(&CharacterSnapshot, i64)]) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut start = 0;
    let mut seen = std::collections::HashSet::new();
    for (at, (snapshot, _)) in snapshots.iter().enumerate() {
        if at - start == ROWS_PER_STATEMENT || !seen.insert(snapshot.character_id) {
            runs.push(start..at);
            start = at;
            seen.clear();
            seen.insert(snapshot.character_id);
        }
    }
    if start < snapshots.len() {
        runs.push(start..snapshots.len());
    }
    runs
}

/// Writes each snapshot, guarded by the epoch given with it, unless a newer owner's (or newer
/// schema's) live checkpoint is stored, all in one transaction; one result per snapshot, in
/// order. The guard is decided in the
/// statement that writes; only a refused write reads the stored guard, for its reason.
pub(super) async fn write_many(
    db: &SqliteBackend,
    clock: &dyn Clock,
    ttl: Ttl,
    snapshots: &[(&CharacterSnapshot, i64)],
) -> Result<Vec<CheckpointWrite>, CheckpointError> {
    // Encoded before the write lock is taken: a snapshot that cannot be encoded fails the call
    // with nothing written.
    let bodies = snapshots
        .iter()
        .map(|(snapshot, _)| serde_json::to_string(snapshot).map_err(CheckpointError::Encode))
        .collect::<Result<Vec<_>, _>>()?;
    // The clock is read once the write lock is held: a wait for it must neither keep an
    // expired row guarding nor shorten the new rows' time.
    let mut tx = db.begin().await?;
    let now = micros(clock);
    let ttl_micros = i64::try_from(ttl.duration().as_micros()).unwrap_or(i64::MAX);
    let expires_at = now.saturating_add(ttl_micros);
    let mut results = Vec::with_capacity(snapshots.len());
    for run in statement_runs(snapshots) {
        // Only the full statement is kept prepared: a run of any other length is the tail of a
        // call (or cut short by a repeated character), and would crowd the connection's
        // statement cache with a shape per length.
        let full = run.len() == ROWS_PER_STATEMENT;
        let sql = guarded_upsert(run.len());
        let mut statement = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .persistent(full)
            .bind(now)
            .bind(expires_at);
        for at in run.clone() {
            let (snapshot, guard) = snapshots[at];
            statement = statement
                .bind(snapshot.character_id)
                .bind(guard)
                .bind(i64::from(snapshot.schema_version))
                .bind(bodies[at].as_str());
        }
        let written: std::collections::HashSet<Uuid> =
            statement.fetch_all(&mut *tx).await?.into_iter().collect();
        for &(snapshot, guard) in &snapshots[run] {
            if written.contains(&snapshot.character_id) {
                results.push(CheckpointWrite::Written);
                continue;
            }
            let stored: Option<(Option<i64>, Option<i64>)> = sqlx::query_as(READ_GUARD)
                .bind(snapshot.character_id)
                .bind(now)
                .fetch_optional(&mut *tx)
                .await?;
            let schema = i64::from(snapshot.schema_version);
            match decide_guard(stored, guard, schema) {
                GuardDecision::Refuse(refusal) => results.push(refusal),
                GuardDecision::Write => {
                    return Err(CheckpointError::Protocol(format!(
                        "the embedded guard refused the checkpoint of {} that its rule writes",
                        snapshot.character_id
                    )));
                }
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

/// The take-over of a claimant at `claimant` (see `CheckpointStore::take_over`), in one write
/// transaction: the live row is read as [`read`] reads it (its guard as it was), then, when its
/// guard is an integer below the claimant's epoch, it gets the claimant's epoch and a full TTL
/// and keeps the guard it replaced (`taken_from`), which a repeat of the same take-over answers.
pub(super) async fn take_over(
    db: &SqliteBackend,
    clock: &dyn Clock,
    ttl: Ttl,
    character_id: Uuid,
    claimant: i64,
) -> Result<Option<(Option<i64>, Option<String>)>, CheckpointError> {
    let mut tx = db.begin().await?;
    let now = micros(clock);
    let ttl_micros = i64::try_from(ttl.duration().as_micros()).unwrap_or(i64::MAX);
    let row: Option<(Option<i64>, Option<String>, Option<i64>)> = sqlx::query_as(
        "SELECT CASE WHEN typeof(owner_epoch) = 'integer' THEN owner_epoch END,
                CASE WHEN typeof(snapshot) = 'text' THEN snapshot END,
                CASE WHEN typeof(taken_from) = 'integer' THEN taken_from END
           FROM checkpoints WHERE character_id = ?1 AND expires_at > ?2",
    )
    .bind(character_id)
    .bind(now)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((guard, body, taken_from)) = row else {
        tx.commit().await?;
        return Ok(None);
    };
    let answered = match (guard, &body) {
        (Some(found), Some(_)) if found < claimant => {
            sqlx::query(
                "UPDATE checkpoints SET owner_epoch = ?2, taken_from = ?3, expires_at = ?4
                  WHERE character_id = ?1",
            )
            .bind(character_id)
            .bind(claimant)
            .bind(found)
            .bind(now.saturating_add(ttl_micros))
            .execute(&mut *tx)
            .await?;
            Some(found)
        }
        // The claimant's own take-over again: the guard it found the first time.
        (Some(found), Some(_)) if found == claimant => Some(taken_from.unwrap_or(found)),
        _ => guard,
    };
    tx.commit().await?;
    Ok(Some((answered, body)))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn of(ids: &[u128]) -> Vec<CharacterSnapshot> {
        ids.iter()
            .map(|id| CharacterSnapshot {
                character_id: Uuid::from_u128(*id),
                account_id: Uuid::nil(),
                name: "n".into(),
                zone_ref: None,
                room_ref: None,
                state: serde_json::json!({}).into(),
                chargen: None,
                state_version: 0,
                owner_epoch: 1,
                issue_mark: 0,
                schema_version: 1,
            })
            .collect()
    }

    #[test]
    fn a_statement_holds_each_character_once_and_at_most_its_bound() {
        let snapshots = of(&[1, 2, 1, 3, 3]);
        let refs: Vec<(&CharacterSnapshot, i64)> = snapshots.iter().map(|s| (s, 1)).collect();
        assert_eq!(statement_runs(&refs), vec![0..2, 2..4, 4..5]);
        let many = of(&(0..300).collect::<Vec<u128>>());
        let refs: Vec<(&CharacterSnapshot, i64)> = many.iter().map(|s| (s, 1)).collect();
        assert_eq!(statement_runs(&refs), vec![0..128, 128..256, 256..300]);
        assert!(statement_runs(&[]).is_empty());
    }

    #[test]
    fn the_upsert_numbers_four_parameters_a_row_after_the_two_shared() {
        let sql = guarded_upsert(2);
        assert!(
            sql.contains("(?3, ?4, ?5, ?6, ?2), (?7, ?8, ?9, ?10, ?2)"),
            "{sql}"
        );
    }
}
