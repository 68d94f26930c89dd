//! Item moves between characters in the character store: the two-row transfer commit with its
//! phantom checks, and the item-load ledger those checks read (`docs/bookkeeping.md`).

use uuid::Uuid;

use super::snapshot::{CharacterSnapshot, SaveOutcome};
use super::store::{CharacterStore, Releaser, StoreError, TransferCommit};
use super::transfer_tx::TransferTx;
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
        let mut tx = self.transfer_tx().await?;
        // Both rows are locked first (on Postgres in id order, the global lock order: crossed
        // transfers and a batch over the same rows never deadlock), then this transfer's audit
        // row looked for: an attempt whose reply was lost either committed (the row is there) or
        // is rolled back.
        let releaser_id = match releaser {
            Releaser::Held { snapshot, .. } => snapshot.character_id,
            Releaser::Departed { character_id, .. } => character_id,
        };
        if tx
            .lock_and_find([acquirer.character_id, releaser_id], audit)
            .await?
        {
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
                // A copy taking back what an earlier copy of its character put down is both
                // sides: the acquirer's snapshot below is its row's one write.
                if snapshot.character_id == acquirer.character_id {
                    None
                } else {
                    match tx.save(snapshot).await? {
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
                        other => {
                            return Ok(TransferCommit::Rejected(format!("releaser: {other:?}")));
                        }
                    }
                }
            }
            Releaser::Departed {
                character_id,
                item_id,
                released_epoch,
            } => {
                // A character picking up what an earlier copy of it put down is a held releaser
                // (its copy is at hand); as a departed one its row would be written twice.
                if character_id == acquirer.character_id {
                    return Ok(TransferCommit::Rejected(
                        "a departed releaser cannot be the acquirer".into(),
                    ));
                }
                match release_from_row(&mut tx, model, character_id, item_id, released_epoch)
                    .await?
                {
                    DepartedWrite::Nothing => None,
                    DepartedWrite::Written { version } => Some(version),
                    DepartedWrite::Superseded { current_epoch } => {
                        return Ok(TransferCommit::ReleaserSuperseded { current_epoch });
                    }
                    DepartedWrite::Refused(reason) => return Ok(TransferCommit::Rejected(reason)),
                }
            }
        };
        let acquirer_version = match tx.save(acquirer).await? {
            SaveOutcome::Saved(version) => version,
            SaveOutcome::VersionConflict(current) => {
                return Ok(TransferCommit::VersionRace {
                    releaser_current: None,
                    acquirer_current: Some(current),
                });
            }
            other => return Ok(TransferCommit::Rejected(format!("acquirer: {other:?}"))),
        };
        let (released_item, released_epoch) = match releaser {
            Releaser::Held {
                item_id,
                released_epoch,
                ..
            } => (item_id, released_epoch),
            Releaser::Departed {
                item_id,
                released_epoch,
                ..
            } => (Some(item_id), released_epoch),
        };
        if let Some(item_id) = released_item {
            tx.record_release(
                (releaser_id, acquirer.character_id),
                item_id,
                released_epoch,
            )
            .await?;
        }
        tx.insert_audit(audit).await?;
        tx.commit().await?;
        Ok(TransferCommit::Committed {
            releaser_version,
            acquirer_version,
        })
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
        self.record_item_loads_of((character_id, owner_epoch), unique)
            .await
    }
}

/// The departed releaser's side of a transfer commit, under the row lock: reads what the
/// stored row says about the item, lets [`judge_departed`] decide, and writes that. Returns
/// the row's version after the write (`None`: nothing written), or the row's epoch when the
/// releasing copy is superseded.
async fn release_from_row(
    tx: &mut TransferTx,
    model: &ModelHandle,
    character_id: Uuid,
    item_id: Uuid,
    released_epoch: i64,
) -> Result<DepartedWrite, StoreError> {
    let row = tx.departed_row(character_id).await?;
    let current = model.schema_version();
    let (facts, state) = match row {
        None => (DepartedRow::Unreadable, None),
        Some((_, _, _, schema, owner_schema))
            if let Err(reason) = crate::model::may_rewrite(
                current,
                u32::try_from(schema).unwrap_or(u32::MAX),
                Some(u32::try_from(owner_schema).unwrap_or(u32::MAX)),
            ) =>
        {
            // A newer release's row: this process must not rewrite it (see `may_rewrite`).
            // The item stays where it is; nothing is written.
            return Ok(DepartedWrite::Refused(format!("the releaser: {reason}")));
        }
        Some((state, owner_epoch, lineage_epoch, schema, _)) => {
            // An older document is upgraded first, and written back at the model's version.
            let mut state = match model.upgrade(u32::try_from(schema).unwrap_or(1), state) {
                Ok(state) => state,
                Err(err) => {
                    return Ok(DepartedWrite::Refused(format!("the releaser's row: {err}")));
                }
            };
            match model.take_item(&mut state, item_id) {
                Err(_) => (DepartedRow::Unreadable, None),
                Ok(true) => (
                    DepartedRow::Holds {
                        owner_epoch,
                        lineage_epoch,
                    },
                    Some(state),
                ),
                Ok(false) => (
                    DepartedRow::Lacks {
                        owner_epoch,
                        loaded_after: tx
                            .loaded_after(character_id, item_id, released_epoch)
                            .await?,
                    },
                    None,
                ),
            }
        }
    };
    // When the departed copy still owns the row, either write is live content none of its
    // checkpoints holds (they were dumped before it left): it moves `live_version`, so the
    // next login chooses this row over them instead of bringing the taken item back. A row
    // owned by a later copy keeps its `live_version`: that copy's checkpoints are its own.
    let departed_owns = match &facts {
        DepartedRow::Holds { owner_epoch, .. } | DepartedRow::Lacks { owner_epoch, .. } => {
            *owner_epoch == released_epoch
        }
        DepartedRow::Unreadable => false,
    };
    let version = match (judge_departed(facts, released_epoch), state) {
        (DepartedSide::Untouched, _) => return Ok(DepartedWrite::Nothing),
        (DepartedSide::Superseded { current_epoch }, _) => {
            return Ok(DepartedWrite::Superseded { current_epoch });
        }
        (DepartedSide::TakeItem, Some(state)) => {
            tx.write_departed(character_id, Some((&state, current)), departed_owns)
                .await?
        }
        (DepartedSide::TakeItem | DepartedSide::BumpVersion, _) => {
            tx.write_departed(character_id, None, departed_owns).await?
        }
    };
    Ok(DepartedWrite::Written { version })
}

/// Whether the releaser copy at hand shows the item released at `released_epoch` to be a
/// phantom: it holds the item itself, or a copy loaded after the release started out holding it.
async fn held_copy_supersedes(
    tx: &mut TransferTx,
    model: &ModelHandle,
    snapshot: &CharacterSnapshot,
    item_id: Uuid,
    released_epoch: i64,
) -> Result<bool, StoreError> {
    model
        .check_state(snapshot.state.value())
        .map_err(|e| StoreError::InvalidInput(format!("releaser state: {e}")))?;
    Ok(model.holds_item(snapshot.state.value(), item_id)
        || tx
            .loaded_after(snapshot.character_id, item_id, released_epoch)
            .await?)
}

/// What a departed releaser's stored row says about an item it released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DepartedRow {
    /// No row, or a document the model cannot read: there is nothing to take or fence.
    Unreadable,
    /// The row still holds the item.
    Holds {
        /// The row's owner epoch.
        owner_epoch: i64,
        /// The first epoch of the row's current lineage.
        lineage_epoch: i64,
    },
    /// The row no longer holds the item.
    Lacks {
        /// The row's owner epoch.
        owner_epoch: i64,
        /// A copy loaded after the release started out holding the item.
        loaded_after: bool,
    },
}

/// What a transfer commit does on the departed releaser's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DepartedSide {
    /// Nothing to write.
    Untouched,
    /// Write the row without the item.
    TakeItem,
    /// The item left the row for good: move the version on, so a save the releaser dumped
    /// before the release (still holding the item) conflicts instead of landing a second copy.
    BumpVersion,
    /// The releasing copy is not an ancestor of the row's owner, or a later copy held the item:
    /// the released item may be a zombie's phantom.
    Superseded {
        /// The row's epoch.
        current_epoch: i64,
    },
}

/// What the commit did on the departed releaser's side.
enum DepartedWrite {
    Nothing,
    Written {
        version: i64,
    },
    Superseded {
        current_epoch: i64,
    },
    /// Nothing written: the row is of a schema this process must not rewrite, or its document
    /// could not be upgraded.
    Refused(String),
}

/// The departed releaser's side of a commit for an item released by the copy at
/// `released_epoch` (pure).
fn judge_departed(row: DepartedRow, released_epoch: i64) -> DepartedSide {
    match row {
        DepartedRow::Unreadable => DepartedSide::Untouched,
        DepartedRow::Lacks {
            owner_epoch,
            loaded_after: true,
        } => DepartedSide::Superseded {
            current_epoch: owner_epoch,
        },
        DepartedRow::Lacks { .. } => DepartedSide::BumpVersion,
        // The releasing copy is an ancestor of the current owner only within its lineage.
        DepartedRow::Holds {
            owner_epoch,
            lineage_epoch,
        } if released_epoch < lineage_epoch || released_epoch > owner_epoch => {
            DepartedSide::Superseded {
                current_epoch: owner_epoch,
            }
        }
        DepartedRow::Holds { .. } => DepartedSide::TakeItem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_that_cannot_be_read_is_left_alone() {
        assert_eq!(
            judge_departed(DepartedRow::Unreadable, 3),
            DepartedSide::Untouched
        );
    }

    #[test]
    fn a_row_of_the_releasers_lineage_gives_the_item_up() {
        let row = DepartedRow::Holds {
            owner_epoch: 5,
            lineage_epoch: 2,
        };
        assert_eq!(judge_departed(row, 2), DepartedSide::TakeItem);
        assert_eq!(judge_departed(row, 5), DepartedSide::TakeItem);
    }

    #[test]
    fn a_releaser_outside_the_rows_lineage_is_superseded() {
        let row = DepartedRow::Holds {
            owner_epoch: 5,
            lineage_epoch: 4,
        };
        let superseded = DepartedSide::Superseded { current_epoch: 5 };
        assert_eq!(judge_departed(row, 3), superseded, "before the lineage");
        assert_eq!(
            judge_departed(row, 6),
            superseded,
            "a claim the row never saw"
        );
    }

    #[test]
    fn an_item_gone_from_the_row_moves_the_version_on() {
        let row = DepartedRow::Lacks {
            owner_epoch: 5,
            loaded_after: false,
        };
        assert_eq!(judge_departed(row, 5), DepartedSide::BumpVersion);
    }

    #[test]
    fn an_item_a_later_copy_started_with_makes_the_release_a_phantom() {
        let row = DepartedRow::Lacks {
            owner_epoch: 7,
            loaded_after: true,
        };
        assert_eq!(
            judge_departed(row, 5),
            DepartedSide::Superseded { current_epoch: 7 }
        );
    }
}
