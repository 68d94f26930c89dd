//! Item moves between characters in the character store: the two-row transfer commit with its
//! phantom checks, and the item-load ledger those checks read (`docs/bookkeeping.md`).

use uuid::Uuid;

use super::snapshot::{CharacterSnapshot, SaveOutcome};
use super::store::{CharacterStore, Releaser, StoreError, TransferCommit};
use crate::model::ModelHandle;

impl CharacterStore {
    /// Commits a cross-character item move: the releaser's side, the acquirer's snapshot (which
    /// holds the item) and the `item_transferred` audit row, in one transaction, each save
    /// fenced like any other. Any refusal (a zombie on either side, a version race) rolls all of
    /// it back. Safe
    /// to retry when an attempt's outcome is unknown: the audit row's key makes a second attempt
    /// answer [`TransferCommit::AlreadyCommitted`].
    pub async fn commit_transfer(
        &self,
        model: &ModelHandle,
        releaser: Releaser<'_>,
        acquirer: &CharacterSnapshot,
        audit: &crate::audit::AuditEvent,
    ) -> Result<TransferCommit, StoreError> {
        let mut tx = self.pg.pool().begin().await?;
        // Lock both rows first, in id order (the global lock order: crossed transfers and a
        // batch over the same rows never deadlock), then look for this transfer's audit row: an
        // attempt whose reply was lost either committed (the row is there) or is rolled back.
        let releaser_id = match releaser {
            Releaser::Held { snapshot, .. } => snapshot.character_id,
            Releaser::Departed { character_id, .. } => character_id,
        };
        sqlx::query("SELECT id FROM characters WHERE id = ANY($1) ORDER BY id FOR UPDATE")
            .bind([acquirer.character_id, releaser_id])
            .fetch_all(&mut *tx)
            .await?;
        let done: Option<i64> = sqlx::query_scalar(
            "SELECT seq FROM character_audit WHERE subject_id = $1 AND event_kind = $2 AND dedup_key = $3",
        )
        .bind(audit.subject_id)
        .bind(audit.kind.as_str())
        .bind(&audit.dedup_key)
        .fetch_optional(&mut *tx)
        .await?;
        if done.is_some() {
            return Ok(TransferCommit::AlreadyCommitted);
        }
        let releaser_version = match releaser {
            Releaser::Held {
                snapshot,
                item_id,
                released_epoch,
            } => {
                if let Some(item_id) = item_id
                    && held_copy_supersedes(&mut tx, model, snapshot, item_id, released_epoch)
                        .await?
                {
                    return Ok(TransferCommit::ReleaserSuperseded {
                        current_epoch: snapshot.owner_epoch,
                    });
                }
                match Self::save_in(&mut tx, snapshot).await? {
                    SaveOutcome::Saved(version) => Some(version),
                    SaveOutcome::OwnershipLost(current_epoch) => {
                        return Ok(TransferCommit::ReleaserSuperseded { current_epoch });
                    }
                    SaveOutcome::VersionConflict(current) => {
                        return Ok(TransferCommit::VersionRace {
                            releaser_current: Some(current),
                            acquirer_current: None,
                        });
                    }
                    other => return Ok(TransferCommit::Rejected(format!("releaser: {other:?}"))),
                }
            }
            Releaser::Departed {
                character_id,
                item_id,
                released_epoch,
            } => match Self::take_item_in(&mut tx, model, character_id, item_id, released_epoch)
                .await?
            {
                Ok(version) => version,
                Err(current_epoch) => {
                    return Ok(TransferCommit::ReleaserSuperseded { current_epoch });
                }
            },
        };
        let acquirer_version = match Self::save_in(&mut tx, acquirer).await? {
            SaveOutcome::Saved(version) => version,
            SaveOutcome::VersionConflict(current) => {
                return Ok(TransferCommit::VersionRace {
                    releaser_current: None,
                    acquirer_current: Some(current),
                });
            }
            other => return Ok(TransferCommit::Rejected(format!("acquirer: {other:?}"))),
        };
        crate::audit::store::insert_many(&mut tx, std::slice::from_ref(audit)).await?;
        tx.commit().await?;
        Ok(TransferCommit::Committed {
            releaser_version,
            acquirer_version,
        })
    }

    /// Removes `item_id` from a departed releaser's stored row if it is still there. A row
    /// without it answers `Ok(Err)` too when a copy loaded after the release held the item. `Ok(Err)`
    /// carries the row's epoch when the row holds the item but its owner does not descend from
    /// the copy at `released_epoch` (that copy may have been a zombie releasing a phantom).
    async fn take_item_in(
        conn: &mut sqlx::PgConnection,
        model: &ModelHandle,
        character_id: Uuid,
        item_id: Uuid,
        released_epoch: i64,
    ) -> Result<Result<Option<i64>, i64>, StoreError> {
        let row: Option<(serde_json::Value, i64, i64)> = sqlx::query_as(
            "SELECT state, owner_epoch, lineage_epoch FROM characters WHERE id = $1 FOR UPDATE",
        )
        .bind(character_id)
        .fetch_optional(&mut *conn)
        .await?;
        let Some((mut state, epoch, lineage)) = row else {
            return Ok(Ok(None));
        };
        let Ok(taken) = model.take_item(&mut state, item_id) else {
            return Ok(Ok(None));
        };
        if !taken {
            // Gone from the row: released for good, unless a copy loaded since started out
            // holding it (and moved it on), which makes this released one a phantom.
            if loaded_after(conn, character_id, item_id, released_epoch).await? {
                return Ok(Err(epoch));
            }
            // A save the releaser dumped before the release may still be on its way with the
            // item in it: moving the version makes it conflict instead of landing a second copy.
            let version: i64 = sqlx::query_scalar(
                "UPDATE characters SET state_version = state_version + 1, updated_at = now() WHERE id = $1 RETURNING state_version",
            )
            .bind(character_id)
            .fetch_one(&mut *conn)
            .await?;
            return Ok(Ok(Some(version)));
        }
        // The releasing copy is an ancestor of the current owner only within its lineage.
        if released_epoch < lineage || released_epoch > epoch {
            return Ok(Err(epoch));
        }
        let version: i64 = sqlx::query_scalar(
            "UPDATE characters SET state = $2, state_version = state_version + 1, updated_at = now() WHERE id = $1 RETURNING state_version",
        )
        .bind(character_id)
        .bind(state)
        .fetch_one(&mut *conn)
        .await?;
        Ok(Ok(Some(version)))
    }

    /// Records in the item-load ledger that the copy at `owner_epoch` started out holding
    /// `items` (duplicates ignored; at most one carry tree's worth). A floor copy of one of them
    /// released by an earlier copy of this character is then known to be a phantom.
    pub async fn record_item_loads(
        &self,
        character_id: Uuid,
        owner_epoch: i64,
        items: &[Uuid],
    ) -> Result<(), StoreError> {
        let mut unique: Vec<Uuid> = items.to_vec();
        unique.sort_unstable();
        unique.dedup();
        if unique.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "INSERT INTO item_loads (item_id, character_id, loaded_epoch)
             SELECT item, $2, $3 FROM UNNEST($1::uuid[]) AS item
             ON CONFLICT (item_id, character_id) DO UPDATE
                SET loaded_epoch = GREATEST(item_loads.loaded_epoch, EXCLUDED.loaded_epoch),
                    loaded_at = now()",
        )
        .bind(&unique)
        .bind(character_id)
        .bind(owner_epoch)
        .execute(self.pg.pool())
        .await?;
        Ok(())
    }
}

/// Whether the releaser copy at hand shows the item released at `released_epoch` to be a
/// phantom: it holds the item itself, or a copy loaded after the release started out holding it.
async fn held_copy_supersedes(
    conn: &mut sqlx::PgConnection,
    model: &ModelHandle,
    snapshot: &CharacterSnapshot,
    item_id: Uuid,
    released_epoch: i64,
) -> Result<bool, StoreError> {
    model
        .check_state(&snapshot.state)
        .map_err(|e| StoreError::InvalidInput(format!("releaser state: {e}")))?;
    Ok(model.holds_item(&snapshot.state, item_id)
        || loaded_after(conn, snapshot.character_id, item_id, released_epoch).await?)
}

/// Whether a copy of `character_id` later than `released_epoch` started out holding `item_id`
/// (the item-load ledger): a copy of it released at `released_epoch` is then a phantom.
async fn loaded_after(
    conn: &mut sqlx::PgConnection,
    character_id: Uuid,
    item_id: Uuid,
    released_epoch: i64,
) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM item_loads
                         WHERE item_id = $1 AND character_id = $2 AND loaded_epoch > $3)",
    )
    .bind(item_id)
    .bind(character_id)
    .bind(released_epoch)
    .fetch_one(conn)
    .await?)
}
