//! The bookkeeping prune in the embedded store's file: the same rules as the Postgres
//! statements (`bookkeeping`), each table's doomed rows chosen by rowid, a bounded batch a pass,
//! instants in microseconds read from the store's clock.

use super::bookkeeping::{BookkeepingRetention, BookkeepingSizes, PRUNE_BATCH, PruneReport};
use super::checkpoint_sqlite::micros;
use crate::backend::SqliteBackend;
use crate::clock::Clock;

// A sequenced effect goes once a live write of its copy holds it or a later copy wrote; an
// unsequenced one after its dedupe window; any effect of a character that is gone.
const PRUNE_EFFECTS: &str = "
DELETE FROM character_job_effects WHERE rowid IN (
    SELECT e.rowid FROM character_job_effects e
      LEFT JOIN characters c ON c.id = e.character_id
     WHERE c.id IS NULL
        OR (e.issue_seq > 0 AND (e.owner_epoch < c.live_issue_epoch
                                 OR (e.owner_epoch = c.live_issue_epoch
                                     AND e.issue_seq <= c.live_issue_mark)))
        OR (e.issue_seq = 0 AND e.applied_at < ?1)
     LIMIT ?2)";

const PRUNE_ITEM_LOADS: &str = "
DELETE FROM item_loads WHERE rowid IN (
    SELECT rowid FROM item_loads WHERE loaded_at < ?1 LIMIT ?2)";

const PRUNE_ITEM_RELEASES: &str = "
DELETE FROM item_releases WHERE rowid IN (
    SELECT rowid FROM item_releases WHERE released_at < ?1 LIMIT ?2)";

const PRUNE_ACTIVATIONS: &str = "
DELETE FROM transfer_activations WHERE rowid IN (
    SELECT rowid FROM transfer_activations WHERE activated_at < ?1 LIMIT ?2)";

/// The instant `age` before `now` (microseconds).
fn before(now: i64, age: std::time::Duration) -> i64 {
    now.saturating_sub(i64::try_from(age.as_micros()).unwrap_or(i64::MAX))
}

/// One pass: at most [`PRUNE_BATCH`] rows from each table, in one transaction.
pub(super) async fn prune_once(
    db: &SqliteBackend,
    clock: &dyn Clock,
    retention: BookkeepingRetention,
) -> Result<PruneReport, sqlx::Error> {
    let mut tx = db.begin().await?;
    let now = micros(clock);
    let mut delete = async |sql: &'static str, age: std::time::Duration| {
        sqlx::query(sql)
            .bind(before(now, age))
            .bind(PRUNE_BATCH)
            .execute(&mut *tx)
            .await
            .map(|done| done.rows_affected())
    };
    let effects = delete(PRUNE_EFFECTS, retention.unsequenced_effects).await?;
    let item_loads = delete(
        PRUNE_ITEM_LOADS,
        retention.item_loads + retention.item_load_refresh(),
    )
    .await?;
    let item_releases = delete(PRUNE_ITEM_RELEASES, retention.item_loads).await?;
    let transfer_activations = delete(PRUNE_ACTIVATIONS, retention.transfer_activations).await?;
    tx.commit().await?;
    Ok(PruneReport {
        effects,
        item_loads,
        item_releases,
        transfer_activations,
    })
}

/// How many rows each table holds.
pub(super) async fn sizes(db: &SqliteBackend) -> Result<BookkeepingSizes, sqlx::Error> {
    let (effects, item_loads, item_releases, transfer_activations) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM character_job_effects), (SELECT count(*) FROM item_loads),
                (SELECT count(*) FROM item_releases), (SELECT count(*) FROM transfer_activations)",
    )
    .fetch_one(db.reader()?)
    .await?;
    Ok(BookkeepingSizes {
        effects,
        item_loads,
        item_releases,
        transfer_activations,
    })
}
