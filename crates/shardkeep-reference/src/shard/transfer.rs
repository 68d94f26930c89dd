//! Item transfers between characters, as the reference shard runs them: the item waits, held by
//! neither side, while both characters' rows and the `item_transferred` audit row commit
//! together through [`shardkeep::character::CharacterStore::commit_transfer`].
//!
//! - [`PendingTransfer`] — the state of one transfer between its pickup and its answer.
//! - [`decide`] — what the shard does with an answer (pure, tested case by case).
//! - the driver (`begin_transfer`, `submit_transfer`, `finish_transfer`) — dumps both sides,
//!   sends the commit off the pulse, and applies the decision.

use std::time::Duration;

use uuid::Uuid;

use super::Shard;
use crate::game::items::{Item, Released};
use crate::game::world::FloorItem;
use shardkeep::audit::AuditEvent;
use shardkeep::character::{CharacterStore, Releaser, TransferCommit};

/// An item between two characters, waiting for its transfer commit.
#[derive(Debug)]
pub(super) struct PendingTransfer {
    item: Item,
    acquirer: Uuid,
    /// The owner epoch of the acquiring copy: a copy that replaced it (loaded from the stores)
    /// must not be handed the item, nor have its snapshot committed in that copy's stead.
    acquirer_epoch: i64,
    releaser: Released,
    zone: String,
    room: String,
    event: AuditEvent,
    store: CharacterStore,
    /// The versions the current attempt's snapshots were dumped at.
    acquirer_version: i64,
    releaser_version: Option<i64>,
    /// Attempts made (each with fresh snapshots).
    attempts: u32,
}

/// A transfer commit's result, on its way back to the shard.
pub(super) type TransferResult = (Uuid, Result<TransferCommit, String>);

/// Attempts a transfer makes, each with fresh snapshots, when a write of the same owner keeps
/// winning the version race.
const TRANSFER_ATTEMPTS: u32 = 5;

impl Shard {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn begin_transfer(
        &mut self,
        store: CharacterStore,
        acquirer: Uuid,
        releaser: Released,
        item: Item,
        event: AuditEvent,
        zone: &str,
        room: &str,
    ) {
        let transfer_id = Uuid::now_v7();
        let acquirer_epoch = self
            .player(acquirer)
            .map_or(i64::MIN, |e| e.character.owner_epoch);
        self.pending_transfers.insert(
            transfer_id,
            PendingTransfer {
                item,
                acquirer,
                acquirer_epoch,
                releaser,
                zone: zone.to_owned(),
                room: room.to_owned(),
                event,
                store,
                acquirer_version: 0,
                releaser_version: None,
                attempts: 0,
            },
        );
        self.submit_transfer(transfer_id);
    }

    /// Dumps both sides as they are now (the acquirer with the item) and sends the commit.
    fn submit_transfer(&mut self, transfer_id: Uuid) {
        let Some(pending) = self.pending_transfers.get(&transfer_id) else {
            return;
        };
        let acquirer_snapshot = self
            .copy_of(pending.acquirer, pending.acquirer_epoch)
            .and_then(|entry| {
                let mut with_item = entry.clone();
                with_item.character.inventory.push(pending.item.clone());
                self.dump(&with_item)
            });
        // A later copy taking back what an earlier copy of its character put down is its own
        // releaser: its pinned copy (without the item) is checked, and never written, whatever
        // its saves are doing.
        let releaser_snapshot = if pending.releaser.by == pending.acquirer {
            self.copy_of(pending.acquirer, pending.acquirer_epoch)
                .and_then(|e| self.dump(e))
        } else {
            self.player(pending.releaser.by)
                .filter(|e| !e.skip_saves())
                .and_then(|e| self.dump(e))
        };
        let item_id = pending.item.id;
        let releaser_id = pending.releaser.by;
        let released_epoch = pending.releaser.epoch;
        let event = pending.event.clone();
        let store = pending.store.clone();
        let Some(acquirer_snapshot) = acquirer_snapshot else {
            let refused = TransferCommit::Rejected("acquirer could not be dumped".into());
            self.finish_transfer(transfer_id, Ok(refused));
            return;
        };
        if let Some(pending) = self.pending_transfers.get_mut(&transfer_id) {
            pending.acquirer_version = acquirer_snapshot.state_version;
            pending.releaser_version = releaser_snapshot.as_ref().map(|s| s.state_version);
            pending.attempts += 1;
        }
        let results = self.transfer_results.0.clone();
        let timeout = self.config.saver.io_timeout;
        let budget = self.config.transfer_budget;
        let cancel = self.cancel.child_token();
        let model = crate::game::ReferenceModel::handle();
        tokio::spawn(async move {
            let side = match (&releaser_snapshot, item_id) {
                (Some(snapshot), _) => Releaser::Held {
                    snapshot,
                    item_id,
                    released_epoch,
                },
                (None, Some(item_id)) => Releaser::Departed {
                    character_id: releaser_id,
                    item_id,
                    released_epoch,
                },
                (None, None) => {
                    let refused = TransferCommit::Rejected("item without identity".into());
                    let _ = results.send((transfer_id, Ok(refused))).await;
                    return;
                }
            };
            // An attempt that fails on the way may still have committed: retry the same commit
            // (it answers AlreadyCommitted then) until the budget runs out.
            let deadline = tokio::time::Instant::now() + budget;
            let mut pause = Duration::from_millis(200);
            let result = loop {
                let attempt = tokio::time::timeout(
                    timeout,
                    store.commit_transfer(&model, side, &acquirer_snapshot, &event),
                )
                .await;
                let error = match attempt {
                    Ok(Ok(outcome)) => break Ok(outcome),
                    Ok(Err(err)) => err.to_string(),
                    Err(_) => "timed out".to_owned(),
                };
                if tokio::time::Instant::now() + pause >= deadline {
                    break Err(format!("outcome unknown after retries: {error}"));
                }
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(Duration::from_secs(2));
            };
            let _ = results.send((transfer_id, result)).await;
        });
    }

    /// Applies finished transfer commits (called every pulse).
    pub(super) fn handle_transfer_results(&mut self) {
        while let Ok((id, result)) = self.transfer_results.1.try_recv() {
            self.finish_transfer(id, result);
        }
    }

    /// Applies a commit's answer as [`decide`] says, then lets go the logouts it held back.
    fn finish_transfer(&mut self, id: Uuid, result: Result<TransferCommit, String>) {
        self.apply_transfer_answer(id, result);
        self.logouts_after_transfers();
    }

    fn apply_transfer_answer(&mut self, id: Uuid, result: Result<TransferCommit, String>) {
        let Some(attempts) = self.pending_transfers.get(&id).map(|p| p.attempts) else {
            return;
        };
        match decide(&result, attempts) {
            TransferStep::DumpAgain {
                releaser_current,
                acquirer_current,
            } => {
                // The releaser's snapshot is whichever copy is resident; the acquirer's is pinned.
                let Some(pending) = self.pending_transfers.get(&id) else {
                    return;
                };
                let (releaser, acquirer, acquirer_epoch) = (
                    pending.releaser.by,
                    pending.acquirer,
                    pending.acquirer_epoch,
                );
                if let (Some(current), Some(entry)) = (releaser_current, self.player_mut(releaser))
                {
                    entry.character.state_version = current;
                }
                if let (Some(current), Some(entry)) =
                    (acquirer_current, self.copy_of_mut(acquirer, acquirer_epoch))
                {
                    entry.character.state_version = current;
                }
                self.submit_transfer(id);
            }
            TransferStep::Hand { versions } => {
                let Some(pending) = self.pending_transfers.remove(&id) else {
                    return;
                };
                self.transfers_committed += 1;
                self.hand_over(pending, versions);
            }
            TransferStep::GiveBack { reason } => {
                let Some(pending) = self.pending_transfers.remove(&id) else {
                    return;
                };
                self.transfers_rejected += 1;
                tracing::info!(event = "item_transfer_rejected", reason = %reason,
                    "the item goes back to its releaser");
                self.return_to_releaser(pending);
            }
            TransferStep::Void { reason } => {
                let Some(pending) = self.pending_transfers.remove(&id) else {
                    return;
                };
                self.transfers_rejected += 1;
                tracing::warn!(event = "item_voided", item = ?pending.item.id,
                    releaser = %pending.releaser.by, released_epoch = pending.releaser.epoch,
                    reason = %reason, "the item leaves the world, on the record");
                self.void_item(&pending.item);
            }
        }
    }

    /// A committed transfer: the acquirer's copy gets the item, and each copy that did not
    /// move on since its dump adopts its row's new version.
    fn hand_over(&mut self, pending: PendingTransfer, versions: Option<(Option<i64>, i64)>) {
        if let Some(entry) = self.copy_of_mut(pending.acquirer, pending.acquirer_epoch) {
            if let Some((_, acquirer_version)) = versions
                && entry.character.state_version == pending.acquirer_version
            {
                entry.character.state_version = acquirer_version;
            }
            entry.character.inventory.push(pending.item);
        }
        let releaser = versions.and_then(|(releaser, _)| releaser);
        if let (Some(version), Some(before)) = (releaser, pending.releaser_version)
            && let Some(entry) = self.player_mut(pending.releaser.by)
            && entry.character.state_version == before
        {
            entry.character.state_version = version;
        }
    }

    /// Every character taking part in an item transfer that waits for its commit.
    pub(crate) fn transferring(&self) -> std::collections::HashSet<Uuid> {
        self.pending_transfers
            .values()
            .flat_map(|p| [p.acquirer, p.releaser.by])
            .collect()
    }

    /// True while an item transfer involving `character_id` waits for its commit.
    pub fn has_pending_transfer(&self, character_id: Uuid) -> bool {
        self.pending_transfers
            .values()
            .any(|p| p.acquirer == character_id || p.releaser.by == character_id)
    }

    /// Ids of the items waiting for a transfer commit (held by neither side meanwhile).
    pub fn pending_transfer_items(&self) -> Vec<Uuid> {
        let mut ids = Vec::new();
        for pending in self.pending_transfers.values() {
            pending.item.walk(&mut |i| ids.extend(i.id));
        }
        ids
    }

    /// Transfers waiting for their commit.
    pub fn pending_transfer_count(&self) -> usize {
        self.pending_transfers.len()
    }

    /// Item transfers (committed, refused) since boot.
    pub fn transfer_counts(&self) -> (u64, u64) {
        (self.transfers_committed, self.transfers_rejected)
    }

    /// Waits, at most `bound`, for every pending transfer commit and applies the results.
    pub async fn settle_transfers(&mut self, bound: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + bound;
        while !self.pending_transfers.is_empty() {
            match tokio::time::timeout_at(deadline, self.transfer_results.1.recv()).await {
                Ok(Some((id, result))) => self.finish_transfer(id, result),
                _ => return false,
            }
        }
        true
    }

    /// A refused transfer: the item goes back to the releaser if it is still here, else back to
    /// the floor still marked as theirs (so the next pickup commits against their stored row).
    fn return_to_releaser(&mut self, pending: PendingTransfer) {
        let PendingTransfer {
            mut item,
            releaser,
            zone,
            room,
            ..
        } = pending;
        // Only to the very copy that released it: a newer copy loaded its content from the
        // stores, which may hold the item already (the release was never saved).
        if let Some(entry) = self.copy_of_mut(releaser.by, releaser.epoch) {
            entry.character.inventory.push(item);
            return;
        }
        item.released = Some(releaser);
        if let Some(zone) = self.zones.get_mut(&zone) {
            zone.entities.floor.push(FloorItem {
                item,
                room,
                reset_op: None,
            });
        }
    }
}

/// What the shard does with a transfer commit's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum TransferStep {
    /// A write of the same owner landed since the dump (its effect is in the live copy): adopt
    /// the rows' versions, as a flush conflict does, and dump both sides again.
    DumpAgain {
        /// The releaser row's version, when its save raced.
        releaser_current: Option<i64>,
        /// The acquirer row's version, when its save raced.
        acquirer_current: Option<i64>,
    },
    /// Committed: the acquirer gets the item. `versions` are the rows' new versions (releaser,
    /// acquirer), absent when an earlier attempt committed (the copies then rebase at their
    /// next flush).
    Hand {
        /// The rows' versions after this commit.
        versions: Option<(Option<i64>, i64)>,
    },
    /// Refused, nothing written: the item goes back to its releaser.
    GiveBack {
        /// Why.
        reason: String,
    },
    /// The item leaves the world, on the record: released by a copy that lost ownership (it
    /// may be a phantom of what the owner holds), or the commit's outcome is unknown (handing
    /// it back could duplicate it).
    Void {
        /// Why.
        reason: String,
    },
}

/// The step for `result`, the answer to attempt number `attempts` (counted from 1).
pub(super) fn decide(result: &Result<TransferCommit, String>, attempts: u32) -> TransferStep {
    match result {
        Ok(TransferCommit::VersionRace {
            releaser_current,
            acquirer_current,
        }) if attempts < TRANSFER_ATTEMPTS => TransferStep::DumpAgain {
            releaser_current: *releaser_current,
            acquirer_current: *acquirer_current,
        },
        Ok(TransferCommit::VersionRace { .. }) => TransferStep::GiveBack {
            reason: format!("lost the version race {attempts} times"),
        },
        Ok(TransferCommit::Committed {
            releaser_version,
            acquirer_version,
        }) => TransferStep::Hand {
            versions: Some((*releaser_version, *acquirer_version)),
        },
        Ok(TransferCommit::AlreadyCommitted) => TransferStep::Hand { versions: None },
        Ok(TransferCommit::Rejected(reason)) => TransferStep::GiveBack {
            reason: reason.clone(),
        },
        Ok(TransferCommit::ReleaserSuperseded { current_epoch }) => TransferStep::Void {
            reason: format!("released by a copy that lost ownership (row epoch {current_epoch})"),
        },
        Err(reason) => TransferStep::Void {
            reason: format!("outcome unknown: {reason}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn race() -> Result<TransferCommit, String> {
        Ok(TransferCommit::VersionRace {
            releaser_current: Some(4),
            acquirer_current: None,
        })
    }

    #[test]
    fn a_lost_version_race_dumps_again_with_the_rows_versions() {
        assert_eq!(
            decide(&race(), 1),
            TransferStep::DumpAgain {
                releaser_current: Some(4),
                acquirer_current: None
            }
        );
    }

    #[test]
    fn a_race_lost_on_the_last_attempt_gives_the_item_back() {
        assert!(matches!(
            decide(&race(), TRANSFER_ATTEMPTS),
            TransferStep::GiveBack { .. }
        ));
    }

    #[test]
    fn a_commit_hands_the_item_over_with_the_new_versions() {
        let committed = Ok(TransferCommit::Committed {
            releaser_version: Some(3),
            acquirer_version: 8,
        });
        assert_eq!(
            decide(&committed, 1),
            TransferStep::Hand {
                versions: Some((Some(3), 8))
            }
        );
    }

    #[test]
    fn an_earlier_commit_hands_the_item_over_without_versions() {
        assert_eq!(
            decide(&Ok(TransferCommit::AlreadyCommitted), 2),
            TransferStep::Hand { versions: None }
        );
    }

    #[test]
    fn a_refusal_gives_the_item_back() {
        let refused = Ok(TransferCommit::Rejected("acquirer: NotFound".into()));
        assert_eq!(
            decide(&refused, 1),
            TransferStep::GiveBack {
                reason: "acquirer: NotFound".into()
            }
        );
    }

    #[test]
    fn an_item_released_by_a_superseded_copy_is_voided() {
        let superseded = Ok(TransferCommit::ReleaserSuperseded { current_epoch: 9 });
        assert!(matches!(decide(&superseded, 1), TransferStep::Void { .. }));
    }

    #[test]
    fn an_unknown_outcome_voids_the_item_rather_than_risk_a_duplicate() {
        assert!(matches!(
            decide(&Err("timed out".into()), 1),
            TransferStep::Void { .. }
        ));
    }
}
