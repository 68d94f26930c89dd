//! Game actions of the reference model that matter to durability: moving items between players
//! and the floor (with cross-character transfer detection), deaths, and permanent advancement —
//! each recorded on the audit trail through the shard's auditor.
//!
//! Transfer detection: dropping an item or putting it in a floor container stamps a transient
//! `Released` marker naming the releaser and its copy. When a different player of a persisted
//! shard picks it up, or a later copy of the releaser (the put-down may never have been saved),
//! an `item_transferred` event names the acquirer (subject) and the releaser (actor). Every
//! pickup, and any mob or engine move, clears the marker, so it always names the most recent
//! release. Bound items cannot be released at all.

use serde_json::json;
use uuid::Uuid;

use super::{PlayerEntry, Shard};
use crate::game::items::{Item, Released};
use crate::game::world::{FloorItem, sweep_floor};
use shardkeep::audit::AuditEvent;

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
    /// The live-copy runtime refused the call (a shard on the runtime only).
    #[error("{0}")]
    Runtime(String),
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
            at_pulse: self.pulse,
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
        let Some(released) = released.filter(|r| self.pickup_commits(acquirer, r)) else {
            return Ok(());
        };
        for character in [acquirer, released.by] {
            if self.has_pending_transfer(character) {
                return Err(ActionError::TransferPending(character));
            }
        }
        Ok(())
    }

    /// Whether picking up an item `released` commits as a transfer (on a persisted shard): when
    /// another player put it down, and when an earlier copy of the acquirer did. That copy may
    /// have died before a save recorded the put-down, so the floor copy may be a phantom of
    /// what the acquirer holds, or held since: the commit's phantom checks decide, as for any
    /// releaser. Only the very copy that put it down takes it back as a plain move.
    fn pickup_commits(&self, acquirer: Uuid, released: &Released) -> bool {
        if !self.persisted {
            return false;
        }
        released.by != acquirer
            || self
                .player(acquirer)
                .is_none_or(|e| e.character.owner_epoch != released.epoch)
    }

    /// Puts a picked-up item into the inventory: the marker is cleared and a bind-on-pickup item
    /// binds. An item another player, or an earlier copy of this one, released on a persisted
    /// shard becomes a transfer: it waits, held by neither, until the rows and the
    /// `item_transferred` audit row are committed together; if that is refused it goes back to
    /// the copy that released it, or to the floor when that copy is gone.
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
            Some(r) if self.pickup_commits(character_id, &r) => r,
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
        if !entry.character.die() {
            return Ok(None);
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
        entry.character.respawn();
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
        entry.character.grant_base(attribute, delta);
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
        let step = entry.character.step_track(track);
        let event = AuditEvent::track(character_id, track, step);
        self.auditor.emit(event.clone());
        Ok(event)
    }
}

impl Shard {
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
        for zone in self.zones.values_mut() {
            self.voided_items
                .extend(sweep_floor(&mut zone.entities.floor, released_here));
        }
    }

    /// Item ids destroyed since the last call: what evicted zombie copies held or released.
    pub fn take_voided_items(&mut self) -> Vec<Uuid> {
        std::mem::take(&mut self.voided_items)
    }

    /// Item ids that decayed on the floors since the last call.
    pub fn take_decayed_items(&mut self) -> Vec<Uuid> {
        std::mem::take(&mut self.decayed_items)
    }

    /// Removes from the floors (and from containers lying there) every item put down at least
    /// `lifetime` pulses ago; what the zones spawned themselves stays until picked up.
    pub(super) fn decay_floors(&mut self, lifetime: u64) {
        let pulse = self.pulse;
        let expired = |item: &Item| {
            item.released
                .as_ref()
                .is_some_and(|r| r.at_pulse.saturating_add(lifetime) <= pulse)
        };
        for zone in self.zones.values_mut() {
            self.decayed_items
                .extend(sweep_floor(&mut zone.entities.floor, expired));
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
    pub(super) fn copy_of(&self, character_id: Uuid, epoch: i64) -> Option<&PlayerEntry> {
        self.player(character_id)
            .filter(|e| e.character.owner_epoch == epoch)
    }

    pub(super) fn copy_of_mut(
        &mut self,
        character_id: Uuid,
        epoch: i64,
    ) -> Option<&mut PlayerEntry> {
        self.player_mut(character_id)
            .filter(|e| e.character.owner_epoch == epoch)
    }
}
