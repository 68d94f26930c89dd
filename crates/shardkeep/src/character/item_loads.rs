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
}

/// A store's item-load records, batched.
pub(super) type ItemLoadBatcher = Batcher<ItemLoadOp>;

/// Item-load records on `pg`.
pub(super) fn item_load_batcher(pg: PostgresBackend) -> Arc<ItemLoadBatcher> {
    Batcher::new(ItemLoadOp { pg }, MOST_WRITING)
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
                let seen = newest.entry((*item, *character)).or_insert(*epoch);
                *seen = (*seen).max(*epoch);
            }
        }
        if newest.is_empty() {
            return Ok(());
        }
        let mut rows: Vec<((Uuid, Uuid), i64)> = newest.into_iter().collect();
        // In key order, so two statements touching the same rows lock them in one order.
        rows.sort_unstable();
        let items: Vec<Uuid> = rows.iter().map(|((item, _), _)| *item).collect();
        let characters: Vec<Uuid> = rows.iter().map(|((_, c), _)| *c).collect();
        let epochs: Vec<i64> = rows.iter().map(|(_, e)| *e).collect();
        sqlx::query(
            "INSERT INTO item_loads (item_id, character_id, loaded_epoch)
             SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::int8[])
             ON CONFLICT (item_id, character_id) DO UPDATE
                SET loaded_epoch = GREATEST(item_loads.loaded_epoch, EXCLUDED.loaded_epoch),
                    loaded_at = now()",
        )
        .bind(&items)
        .bind(&characters)
        .bind(&epochs)
        .execute(self.pg.exec())
        .await?;
        Ok(())
    }
}
