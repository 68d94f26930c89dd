//! Item-load records that arrive together are written together (through [`crate::batching`]):
//! a login storm's ledger writes become a few statements of many characters' items instead of a
//! statement and a commit per login.

use std::collections::HashMap;
use std::sync::Arc;

use uuid::Uuid;

use crate::backend::PostgresBackend;
use crate::batching::{BatchOp, Batcher, all_failed};

/// Most writing tasks at once.
const MOST_WRITING: usize = 2;
/// Most items one statement records.
const MOST_ITEMS: usize = 4096;

/// One copy's items at load: the character, the copy's epoch, the items (deduplicated).
pub(super) type ItemLoad = (Uuid, i64, Vec<Uuid>);

/// Writes of the item-load ledger, many copies to a statement.
pub(super) struct ItemLoadOp {
    pg: PostgresBackend,
    /// How stale an entry's `loaded_at` may be before a load writes it again.
    refresh: std::time::Duration,
}

/// A store's item-load records, batched.
pub(super) type ItemLoadBatcher = Batcher<ItemLoadOp>;

/// Item-load records on `pg`, their load time refreshed when older than `refresh`.
pub(super) fn item_load_batcher(
    pg: PostgresBackend,
    refresh: std::time::Duration,
) -> Arc<ItemLoadBatcher> {
    Batcher::new(ItemLoadOp { pg, refresh }, MOST_WRITING)
}

impl BatchOp for ItemLoadOp {
    type Request = ItemLoad;
    type Outcome = Result<(), sqlx::Error>;

    fn fits(&self, batch: &[ItemLoad], next: &ItemLoad) -> bool {
        let items: usize = batch.iter().map(|(_, _, items)| items.len()).sum();
        items + next.2.len() <= MOST_ITEMS
    }

    async fn run(&self, batch: &[ItemLoad]) -> Vec<Self::Outcome> {
        match self.write(batch).await {
            Ok(()) => batch.iter().map(|_| Ok(())).collect(),
            Err(err) => all_failed(err, batch.len()),
        }
    }

    fn lost(&self) -> Self::Outcome {
        Err(sqlx::Error::WorkerCrashed)
    }
}

impl ItemLoadOp {
    /// One statement; an item loaded by two copies of one character in the batch keeps the
    /// higher epoch (a row may be written once per statement).
    async fn write(&self, batch: &[ItemLoad]) -> Result<(), sqlx::Error> {
        let mut newest: HashMap<(Uuid, Uuid), i64> = HashMap::new();
        for (character, epoch, items) in batch {
            for item in items {
                let seen = newest.entry((*character, *item)).or_insert(*epoch);
                *seen = (*seen).max(*epoch);
            }
        }
        if newest.is_empty() {
            return Ok(());
        }
        let mut rows: Vec<((Uuid, Uuid), i64)> = newest.into_iter().collect();
        // In key order, so two statements touching the same rows lock them in one order.
        rows.sort_unstable();
        let characters: Vec<Uuid> = rows.iter().map(|((c, _), _)| *c).collect();
        let items: Vec<Uuid> = rows.iter().map(|((_, item), _)| *item).collect();
        let epochs: Vec<i64> = rows.iter().map(|(_, e)| *e).collect();
        // The load time is only moved when it is older than the refresh interval: every other
        // load changes no indexed column, so its update is a heap-only (HOT) one that adds no
        // index entries (every load rewrote both indexes for every item it held, and they
        // bloated faster than vacuum gave the space back). The prune keeps entries the refresh
        // interval longer to make up for it.
        sqlx::query(
            "INSERT INTO item_loads (item_id, character_id, loaded_epoch)
             SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::int8[])
             ON CONFLICT (item_id, character_id) DO UPDATE
                SET loaded_epoch = GREATEST(item_loads.loaded_epoch, EXCLUDED.loaded_epoch),
                    loaded_at = CASE
                        WHEN item_loads.loaded_at < now() - make_interval(secs => $4) THEN now()
                        ELSE item_loads.loaded_at END
              WHERE item_loads.loaded_epoch < EXCLUDED.loaded_epoch
                 OR item_loads.loaded_at < now() - make_interval(secs => $4)",
        )
        .bind(&items)
        .bind(&characters)
        .bind(&epochs)
        .bind(self.refresh.as_secs_f64())
        .execute(self.pg.exec())
        .await?;
        Ok(())
    }
}
