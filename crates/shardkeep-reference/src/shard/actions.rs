//! Game actions of the reference model that matter to durability: moving items between players
//! and the floor (with cross-character transfer detection), deaths, and permanent advancement —
//! each recorded on the audit trail through the shard's auditor.
//!
//! Transfer detection: dropping an item or putting it in a floor container stamps a transient
//! `Released` marker naming the releaser. When a *different* player of a persisted shard picks it
//! up, an `item_transferred` event names the acquirer (subject) and the releaser (actor). Every
//! pickup, and any mob or engine move, clears the marker, so it always names the most recent
//! release. Bound items cannot be released at all.

use std::time::Duration;

use serde_json::json;
use uuid::Uuid;

use super::{PlayerEntry, Shard};
use crate::game::items::{Item, Released};
use crate::game::world::FloorItem;
use shardkeep::audit::AuditEvent;
use shardkeep::character::{CharacterStore, Releaser, TransferCommit};

/// An action could not happen; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    /// The character is not on this shard.
    #[error("character {0} is not on this shard")]
    NotHere(Uuid),
    /// No such item where the action looked.
    #[error("no item {0} here")]
    NoSuchItem(Uuid),
    /// Bound items never leave their owner.
    #[error("item {0} is bound to its owner")]
    Bound(Uuid),
    /// The target is not a container.
    #[error("item {0} is not a container")]
    NotAContainer(Uuid),
    /// A character involved already waits on a transfer commit; one at a time each.
    #[error("character {0} already has an item transfer in flight")]
    TransferPending(Uuid),
}

impl Shard {
    /// Moves an item from the character's inventory to the floor of its room, stamping it as
    /// released by the character.
    pub fn drop_item(&mut self, character_id: Uuid, item_id: Uuid) -> Result<(), ActionError> {
        let (zone, room) = self
            .location(character_id)
            .ok_or(ActionError::NotHere(character_id))?;
        let item = self.release_from_inventory(character_id, item_id)?;
        let zone = self
            .zones
            .get_mut(&zone)
            .ok_or(ActionError::NotHere(character_id))?;
        zone.entities.floor.push(FloorItem {
            item,
            room,
            reset_op: None,
        });
        Ok(())
    }

    /// Moves an item from the character's inventory into a container on the floor of its room,
    /// stamping it as released by the character.
    pub fn put_item(
        &mut self,
        character_id: Uuid,
        item_id: Uuid,
        container_id: Uuid,
    ) -> Result<(), ActionError> {
        let (zone, room) = self
            .location(character_id)
            .ok_or(ActionError::NotHere(character_id))?;
        let floor = self.floor(&zone, character_id)?;
        let container = floor
            .iter()
            .find(|f| f.room == room && f.item.id == Some(container_id))
            .ok_or(ActionError::NoSuchItem(container_id))?;
        if !container.item.proto.container {
            return Err(ActionError::NotAContainer(container_id));
        }
        let item = self.release_from_inventory(character_id, item_id)?;
        let floor = self.floor_mut(&zone, character_id)?;
        if let Some(container) = floor
            .iter_mut()
            .find(|f| f.room == room && f.item.id == Some(container_id))
        {
            container.item.contents.push(item);
        }
        Ok(())
    }

    fn release_from_inventory(
        &mut self,
        character_id: Uuid,
        item_id: Uuid,
    ) -> Result<Item, ActionError> {
        let entry = self
            .player_mut(character_id)
            .ok_or(ActionError::NotHere(character_id))?;
        let index = entry
            .character
            .inventory
            .iter()
            .position(|i| i.id == Some(item_id))
            .ok_or(ActionError::NoSuchItem(item_id))?;
        if entry.character.inventory[index].delta.bound {
            return Err(ActionError::Bound(item_id));
        }
        let mut item = entry.character.inventory.remove(index);
        item.released = Some(Released {
            by: character_id,
            by_name: entry.character.name.clone(),
            epoch: entry.character.owner_epoch,
        });
        Ok(item)
    }

    /// Picks an item up from the floor of the character's room.
    pub fn get_item(
        &mut self,
        character_id: Uuid,
        item_id: Uuid,
    ) -> Result<Option<AuditEvent>, ActionError> {
        let (zone, room) = self
            .location(character_id)
            .ok_or(ActionError::NotHere(character_id))?;
        let floor = self.floor_mut(&zone, character_id)?;
        let index = floor
            .iter()
            .position(|f| f.room == room && f.item.id == Some(item_id))
            .ok_or(ActionError::NoSuchItem(item_id))?;
        let released = floor[index].item.released.clone();
        self.check_transfer_slot(character_id, released.as_ref())?;
        let floor = self.floor_mut(&zone, character_id)?;
        let item = floor.remove(index).item;
        Ok(self.acquire(character_id, item, &zone, &room))
    }

    /// Takes an item out of a container on the floor of the character's room.
    pub fn get_from_container(
        &mut self,
        character_id: Uuid,
        container_id: Uuid,
        item_id: Uuid,
    ) -> Result<Option<AuditEvent>, ActionError> {
        let (zone, room) = self
            .location(character_id)
            .ok_or(ActionError::NotHere(character_id))?;
        let floor = self.floor_mut(&zone, character_id)?;
        let container = floor
            .iter_mut()
            .find(|f| f.room == room && f.item.id == Some(container_id))
            .ok_or(ActionError::NoSuchItem(container_id))?;
        let index = container
            .item
            .contents
            .iter()
            .position(|i| i.id == Some(item_id))
            .ok_or(ActionError::NoSuchItem(item_id))?;
        let released = container.item.contents[index].released.clone();
        self.check_transfer_slot(character_id, released.as_ref())?;
        let item = self
            .zones
            .get_mut(&zone)
            .and_then(|z| {
                z.entities
                    .floor
                    .iter_mut()
                    .find(|f| f.room == room && f.item.id == Some(container_id))
            })
            .map(|c| c.item.contents.remove(index))
            .ok_or(ActionError::NoSuchItem(item_id))?;
        Ok(self.acquire(character_id, item, &zone, &room))
    }

    /// Refuses a pickup that would start a second transfer for either character: a snapshot
    /// dumped while another of its transfers is pending would leave that item out.
    fn check_transfer_slot(
        &self,
        acquirer: Uuid,
        released: Option<&Released>,
    ) -> Result<(), ActionError> {
        let Some(released) = released.filter(|r| r.by != acquirer && self.persisted) else {
            return Ok(());
        };
        for character in [acquirer, released.by] {
            if self.has_pending_transfer(character) {
                return Err(ActionError::TransferPending(character));
            }
        }
        Ok(())
    }

    /// Puts a picked-up item into the inventory: the marker is cleared and a bind-on-pickup item
    /// binds. An item another player of a persisted shard released becomes a transfer: it waits,
    /// held by neither, until both characters' rows and the `item_transferred` audit row are
    /// committed together; if that is refused it goes back to its releaser.
    fn acquire(
        &mut self,
        character_id: Uuid,
        mut item: Item,
        zone: &str,
        room: &str,
    ) -> Option<AuditEvent> {
        let released = item.released.take();
        if item.proto.bind_on_pickup {
            item.delta.bound = true;
        }
        let acquirer_name = self.player(character_id)?.character.name.clone();
        let released = match released {
            Some(r) if r.by != character_id && self.persisted => r,
            _ => {
                self.player_mut(character_id)?
                    .character
                    .inventory
                    .push(item);
                return None;
            }
        };
        let event = AuditEvent::item_transferred(
            character_id,
            released.by,
            Uuid::now_v7(),
            json!({
                "item_ref": item.proto.proto_ref,
                "item_id": item.id,
                "stack": item.delta.stack.max(1),
                "acquirer_name": acquirer_name,
                "releaser_name": released.by_name,
                "zone": zone,
                "room": room,
            }),
        );
        match &self.store {
            Some(store) => {
                let store = store.clone();
                self.begin_transfer(
                    store,
                    character_id,
                    released,
                    item,
                    event.clone(),
                    zone,
                    room,
                );
            }
            None => {
                self.player_mut(character_id)?
                    .character
                    .inventory
                    .push(item);
                self.auditor.emit(event.clone());
            }
        }
        Some(event)
    }

    /// A mob or the engine moves a floor item to another room of the zone: nothing is recorded,
    /// and the release marker is cleared.
    pub fn engine_move(
        &mut self,
        zone: &str,
        item_id: Uuid,
        to_room: &str,
    ) -> Result<(), ActionError> {
        let floor = &mut self
            .zones
            .get_mut(zone)
            .ok_or(ActionError::NoSuchItem(item_id))?
            .entities
            .floor;
        let item = floor
            .iter_mut()
            .find(|f| f.item.id == Some(item_id))
            .ok_or(ActionError::NoSuchItem(item_id))?;
        item.item.released = None;
        item.room = to_room.to_owned();
        Ok(())
    }

    /// The character dies. The death is recorded once (the latch holds until respawn), under a
    /// fresh per-death id. Returns the event when one was emitted.
    pub fn die(
        &mut self,
        character_id: Uuid,
        killer: Option<Uuid>,
    ) -> Result<Option<AuditEvent>, ActionError> {
        let location = self.location(character_id);
        let entry = self
            .player_mut(character_id)
            .ok_or(ActionError::NotHere(character_id))?;
        if entry.character.dying {
            return Ok(None);
        }
        entry.character.dying = true;
        if let Some(hp) = entry.character.pools.get_mut("hp") {
            hp.cur = 0;
        }
        let event = AuditEvent::died(
            character_id,
            Uuid::now_v7(),
            killer,
            json!({ "zone": location.as_ref().map(|l| &l.0), "room": location.as_ref().map(|l| &l.1) }),
        );
        self.auditor.emit(event.clone());
        Ok(Some(event))
    }

    /// The character respawns: the latch clears and its pools refill.
    pub fn respawn(&mut self, character_id: Uuid) -> Result<(), ActionError> {
        let entry = self
            .player_mut(character_id)
            .ok_or(ActionError::NotHere(character_id))?;
        entry.character.dying = false;
        for pool in entry.character.pools.values_mut() {
            pool.cur = pool.max;
        }
        Ok(())
    }

    /// A permanent base-attribute grant, recorded under the grant's durable key.
    pub fn grant_attribute(
        &mut self,
        character_id: Uuid,
        attribute: &str,
        delta: i32,
        grant_key: &str,
    ) -> Result<AuditEvent, ActionError> {
        let entry = self
            .player_mut(character_id)
            .ok_or(ActionError::NotHere(character_id))?;
        let base = entry
            .character
            .base
            .entry(attribute.to_owned())
            .or_insert(crate::game::state::DEFAULT_ATTRIBUTE);
        *base += delta;
        entry.character.recompute();
        let event = AuditEvent::attribute(
            character_id,
            grant_key,
            json!({ "attribute": attribute, "delta": delta }),
        );
        self.auditor.emit(event.clone());
        Ok(event)
    }

    /// One step on an advancement track.
    pub fn advance_track(
        &mut self,
        character_id: Uuid,
        track: &str,
    ) -> Result<AuditEvent, ActionError> {
        let entry = self
            .player_mut(character_id)
            .ok_or(ActionError::NotHere(character_id))?;
        let step = entry.character.tracks.entry(track.to_owned()).or_insert(0);
        *step += 1;
        let event = AuditEvent::track(character_id, track, *step);
        self.auditor.emit(event.clone());
        Ok(event)
    }
}

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
    fn begin_transfer(
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
        let releaser_snapshot = self
            .player(pending.releaser.by)
            .filter(|e| !e.skip_saves())
            .and_then(|e| self.dump(e));
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

    fn finish_transfer(&mut self, id: Uuid, result: Result<TransferCommit, String>) {
        if let Ok(TransferCommit::VersionRace {
            releaser_current,
            acquirer_current,
        }) = result
            && let Some(pending) = self.pending_transfers.get(&id)
            && pending.attempts < TRANSFER_ATTEMPTS
        {
            // A write of the same owner landed since the dump (its effect is in the live copy):
            // adopt the row's version, as a flush conflict does, and dump again.
            // The releaser's snapshot is whichever copy is resident; the acquirer's is pinned.
            let (releaser, acquirer, acquirer_epoch) = (
                pending.releaser.by,
                pending.acquirer,
                pending.acquirer_epoch,
            );
            if let (Some(current), Some(entry)) = (releaser_current, self.player_mut(releaser)) {
                entry.character.state_version = current;
            }
            if let (Some(current), Some(entry)) =
                (acquirer_current, self.copy_of_mut(acquirer, acquirer_epoch))
            {
                entry.character.state_version = current;
            }
            self.submit_transfer(id);
            return;
        }
        let Some(pending) = self.pending_transfers.remove(&id) else {
            return;
        };
        match result {
            Ok(TransferCommit::Committed {
                releaser_version,
                acquirer_version,
            }) => {
                self.transfers_committed += 1;
                if let Some(entry) = self.copy_of_mut(pending.acquirer, pending.acquirer_epoch) {
                    if entry.character.state_version == pending.acquirer_version {
                        entry.character.state_version = acquirer_version;
                    }
                    entry.character.inventory.push(pending.item);
                }
                if let (Some(version), Some(before)) = (releaser_version, pending.releaser_version)
                    && let Some(entry) = self.player_mut(pending.releaser.by)
                    && entry.character.state_version == before
                {
                    entry.character.state_version = version;
                }
            }
            Ok(TransferCommit::ReleaserSuperseded { current_epoch }) => {
                // Released by a copy that lost ownership: it may be a phantom of what the owner
                // holds, so it leaves the world (recorded) rather than enter another row or go
                // back to a zombie.
                self.transfers_rejected += 1;
                tracing::warn!(event = "item_voided", item = ?pending.item.id, releaser = %pending.releaser.by,
                    released_epoch = pending.releaser.epoch, current_epoch,
                    "released by a copy that lost ownership");
                self.void_item(&pending.item);
            }
            Ok(TransferCommit::AlreadyCommitted) => {
                // An earlier attempt landed; the live versions are behind the rows now, so the
                // next flushes conflict once and rebase.
                self.transfers_committed += 1;
                if let Some(entry) = self.copy_of_mut(pending.acquirer, pending.acquirer_epoch) {
                    entry.character.inventory.push(pending.item);
                }
            }
            Ok(TransferCommit::VersionRace { .. }) => {
                self.transfers_rejected += 1;
                tracing::info!(
                    event = "item_transfer_rejected",
                    reason = "version race",
                    "the item goes back to its releaser"
                );
                self.return_to_releaser(pending);
            }
            Ok(TransferCommit::Rejected(reason)) => {
                self.transfers_rejected += 1;
                tracing::info!(event = "item_transfer_rejected", reason = %reason, "the item goes back to its releaser");
                self.return_to_releaser(pending);
            }
            Err(reason) => {
                // It may have committed or not: handing it back could duplicate it, so it
                // leaves the world, on the record.
                self.transfers_rejected += 1;
                tracing::error!(event = "item_voided", item = ?pending.item.id, reason = %reason,
                    "transfer outcome unknown");
                self.void_item(&pending.item);
            }
        }
    }

    /// Records `item` (and everything inside it) as destroyed.
    pub(super) fn void_item(&mut self, item: &Item) {
        item.walk(&mut |i| self.voided_items.extend(i.id));
    }

    /// Removes from the floors every item released by `character_id`'s copy at `epoch` (an
    /// evicted zombie): another player must not pick up what may be a phantom.
    pub(super) fn void_released_by(&mut self, character_id: Uuid, epoch: i64) {
        let released_here = |item: &Item| {
            item.released
                .as_ref()
                .is_some_and(|r| r.by == character_id && r.epoch == epoch)
        };
        let mut voided = Vec::new();
        for zone in self.zones.values_mut() {
            zone.entities.floor.retain_mut(|floor| {
                if released_here(&floor.item) {
                    voided.push(floor.item.clone());
                    return false;
                }
                floor.item.contents.retain(|inner| {
                    if released_here(inner) {
                        voided.push(inner.clone());
                        return false;
                    }
                    true
                });
                true
            });
        }
        for item in &voided {
            self.void_item(item);
        }
    }

    /// Item ids destroyed since the last call: what evicted zombie copies held or released.
    pub fn take_voided_items(&mut self) -> Vec<Uuid> {
        std::mem::take(&mut self.voided_items)
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

    /// The floor of `zone`, where `character_id` acts.
    fn floor(&self, zone: &str, character_id: Uuid) -> Result<&Vec<FloorItem>, ActionError> {
        Ok(&self
            .zones
            .get(zone)
            .ok_or(ActionError::NotHere(character_id))?
            .entities
            .floor)
    }

    fn floor_mut(
        &mut self,
        zone: &str,
        character_id: Uuid,
    ) -> Result<&mut Vec<FloorItem>, ActionError> {
        Ok(&mut self
            .zones
            .get_mut(zone)
            .ok_or(ActionError::NotHere(character_id))?
            .entities
            .floor)
    }

    /// The resident copy of `character_id` if it is the one at `epoch`.
    fn copy_of(&self, character_id: Uuid, epoch: i64) -> Option<&PlayerEntry> {
        self.player(character_id)
            .filter(|e| e.character.owner_epoch == epoch)
    }

    fn copy_of_mut(&mut self, character_id: Uuid, epoch: i64) -> Option<&mut PlayerEntry> {
        self.player_mut(character_id)
            .filter(|e| e.character.owner_epoch == epoch)
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
}
