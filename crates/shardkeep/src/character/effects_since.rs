//! The job effects that landed on a row after a given version: what a live copy merges before
//! it adopts a version it did not write itself (an offline grant, a requeued job), on either
//! driver.

use uuid::Uuid;

use super::store::StoreError;
use crate::backend::{PostgresBackend, SqliteBackend};
use crate::retry::apply::RecordedEffect;

/// Most effects one read returns (a live copy merges far fewer between two of its writes).
const MOST: i64 = 4096;

const SINCE_PG: &str = "
SELECT idempotency_key, owner_epoch, issue_seq, row_version, payload
  FROM character_job_effects
 WHERE character_id = $1 AND row_version > $2 AND payload IS NOT NULL
 ORDER BY row_version, applied_order
 LIMIT $3";

const SINCE_SQLITE: &str = "
SELECT idempotency_key, owner_epoch, issue_seq, row_version, payload
  FROM character_job_effects
 WHERE character_id = ?1 AND row_version > ?2 AND payload IS NOT NULL
 ORDER BY row_version, applied_order
 LIMIT ?3";

/// The effects recorded for `character_id` at a row version past `after`, oldest first. One
/// whose payload no longer decodes is left out.
pub(super) async fn on_postgres(
    pg: &PostgresBackend,
    character_id: Uuid,
    after: i64,
) -> Result<Vec<RecordedEffect>, StoreError> {
    let rows: Vec<(String, i64, i64, i64, serde_json::Value)> = sqlx::query_as(SINCE_PG)
        .bind(character_id)
        .bind(after)
        .bind(MOST)
        .fetch_all(pg.exec())
        .await?;
    Ok(decoded(character_id, rows))
}

/// [`on_postgres`] in the embedded store's file.
pub(super) async fn on_sqlite(
    db: &SqliteBackend,
    character_id: Uuid,
    after: i64,
) -> Result<Vec<RecordedEffect>, StoreError> {
    let rows: Vec<(String, i64, i64, i64, String)> = sqlx::query_as(SINCE_SQLITE)
        .bind(character_id)
        .bind(after)
        .bind(MOST)
        .fetch_all(db.reader().map_err(StoreError::Database)?)
        .await?;
    let rows = rows
        .into_iter()
        .filter_map(|(key, epoch, seq, version, payload)| {
            Some((
                key,
                epoch,
                seq,
                version,
                serde_json::from_str(&payload).ok()?,
            ))
        })
        .collect();
    Ok(decoded(character_id, rows))
}

fn decoded(
    character_id: Uuid,
    rows: Vec<(String, i64, i64, i64, serde_json::Value)>,
) -> Vec<RecordedEffect> {
    rows.into_iter()
        .filter_map(|(key, epoch, seq, version, payload)| {
            crate::retry::effects::decode((character_id, key, epoch, seq, version, payload))
        })
        .map(|(_, effect)| effect)
        .collect()
}
