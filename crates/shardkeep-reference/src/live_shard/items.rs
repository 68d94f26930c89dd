//! Items between players and the floor, and the other actions that change a live character.
//! An item put down carries who put it down (its [`Released`] marker, read by the runtime as a
//! [`ReleaseMark`]); the runtime decides whether its pickup is a plain move or a transfer whose
//! two rows and audit row commit together, and runs the transfer. Until a transfer answers the
//! item is held by neither side; its answer, taken in on a tick, hands it over, gives it back to
//! the copy that put it down (or the floor), or voids it.

use serde_json::json;
use uuid::Uuid;

use super::{LiveShard, Resident};
use crate::game::items::{Item, Released};
use crate::game::world::{FloorItem, sweep_floor};
use crate::game::{LiveCharacter, ReferenceEffect};
use shardkeep::audit::AuditEvent;
use shardkeep::live::{CopyId, GrantedNow, LiveError, PickedUp, ReleaseMark, pickup_commits};

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
    /// The live-copy runtime refused the call.
    #[error("{0}")]
    Runtime(String),
}

/// How a pickup went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pickup {
    /// A plain move: the item is in the player's inventory.
    Moved,
    /// A transfer: the item is held by neither side until its commit answers (a later tick
    /// hands it over, gives it back or voids it).
    Transferring,
}

/// A transfer's answer, for the tick.
pub(super) struct Answer {
    acquirer: CopyId,
    item: Item,
    mark: ReleaseMark,
    released: Released,
    room: String,
    zone: String,
    result: Result<PickedUp, LiveError>,
}

impl LiveShard {
    /// Grants `effect` to a player now (a reward of the tick): applied and numbered at once,
    /// its job stored in the background (see [`shardkeep::live::Runtime::grant_now`]).
    pub fn grant(
        &mut self,
        character_id: Uuid,
        effect: ReferenceEffect,
    ) -> Result<GrantedNow, ActionError> {
        let copy = self.resident(character_id)?.copy;
        Ok(self.runtime.grant_now(copy, effect)?)
    }

    /// Changes a player's live character (play the cadences carry to the stores).
    pub fn update<T>(
        &mut self,
        character_id: Uuid,
        f: impl FnOnce(&mut LiveCharacter) -> T,
    ) -> Result<T, ActionError> {
        let copy = self.resident(character_id)?.copy;
        // Brought up to date first; a timer `f` starts or changes is scheduled after.
        let now = self.pulse;
        let (out, next) = self.runtime.update(copy, |c| {
            super::timers::catch_up(c, now);
            let out = f(c);
            (out, c.next_expiry())
        })?;
        self.schedule(character_id, next);
        Ok(out)
    }

    /// The player dies: recorded once on the audit trail (the latch holds until respawn).
    pub fn die(
        &mut self,
        character_id: Uuid,
        killer: Option<Uuid>,
    ) -> Result<Option<AuditEvent>, ActionError> {
        let Resident { zone, room, .. } = self.resident(character_id)?.clone();
        let first = self.update(character_id, LiveCharacter::die)?;
        if !first {
            return Ok(None);
        }
        let event = AuditEvent::died(
            character_id,
            Uuid::now_v7(),
            killer,
            json!({ "zone": zone, "room": room }),
        );
        self.runtime.audit(event.clone());
        Ok(Some(event))
    }

    /// The player respawns: the latch clears and its pools refill.
    pub fn respawn(&mut self, character_id: Uuid) -> Result<(), ActionError> {
        self.update(character_id, LiveCharacter::respawn)
    }

    /// A permanent base-attribute grant, recorded on the audit trail under the grant's key.
    pub fn grant_attribute(
        &mut self,
        character_id: Uuid,
        attribute: &str,
        delta: i32,
        grant_key: &str,
    ) -> Result<AuditEvent, ActionError> {
        self.update(character_id, |c| c.grant_base(attribute, delta))?;
        let event = AuditEvent::attribute(
            character_id,
            grant_key,
            json!({ "attribute": attribute, "delta": delta }),
        );
        self.runtime.audit(event.clone());
        Ok(event)
    }

    /// One step on an advancement track, recorded on the audit trail.
    pub fn advance_track(
        &mut self,
        character_id: Uuid,
        track: &str,
    ) -> Result<AuditEvent, ActionError> {
        let step = self.update(character_id, |c| c.step_track(track))?;
        let event = AuditEvent::track(character_id, track, step);
        self.runtime.audit(event.clone());
        Ok(event)
    }

    /// A mob or the engine moves a floor item to another room of its zone: nothing is
    /// recorded, and who put it down is forgotten.
    pub fn engine_move(
        &mut self,
        zone: &str,
        item_id: Uuid,
        to_room: &str,
    ) -> Result<(), ActionError> {
        let lying = self
            .floor_of(zone)?
            .iter_mut()
            .find(|f| f.item.id == Some(item_id))
            .ok_or(ActionError::NoSuchItem(item_id))?;
        lying.item.released = None;
        to_room.clone_into(&mut lying.room);
        Ok(())
    }

    /// Moves an item from the player's inventory to the floor of its room, marked as put down
    /// by this copy. Bound items never leave their owner.
    pub fn drop_item(&mut self, character_id: Uuid, item_id: Uuid) -> Result<(), ActionError> {
        let Resident { zone, room, .. } = self.resident(character_id)?.clone();
        self.floor_of(&zone)?;
        let item = self.release(character_id, item_id)?;
        self.floor_of(&zone)?.push(FloorItem {
            item,
            room,
            reset_op: None,
        });
        Ok(())
    }

    /// Moves an item from the player's inventory into a container on the floor of its room,
    /// marked as put down by this copy.
    pub fn put_item(
        &mut self,
        character_id: Uuid,
        item_id: Uuid,
        container_id: Uuid,
    ) -> Result<(), ActionError> {
        let Resident { zone, room, .. } = self.resident(character_id)?.clone();
        let container = self.lying(&zone, &room, None, container_id)?;
        if !container.proto.container {
            return Err(ActionError::NotAContainer(container_id));
        }
        let item = self.release(character_id, item_id)?;
        self.floor_of(&zone)?
            .iter_mut()
            .find(|f| f.room == room && f.item.id == Some(container_id))
            .ok_or(ActionError::NoSuchItem(container_id))?
            .item
            .contents
            .push(item);
        Ok(())
    }

    /// Takes an item out of the player's inventory, marked as put down by its copy now.
    fn release(&mut self, character_id: Uuid, item_id: Uuid) -> Result<Item, ActionError> {
        let copy = self.resident(character_id)?.copy;
        let pulse = self.pulse;
        self.update(character_id, |c| {
            let index = c
                .inventory
                .iter()
                .position(|i| i.id == Some(item_id))
                .ok_or(ActionError::NoSuchItem(item_id))?;
            if c.inventory[index].delta.bound {
                return Err(ActionError::Bound(item_id));
            }
            let mut item = c.inventory.remove(index);
            item.released = Some(Released {
                by: character_id,
                by_name: c.name.clone(),
                epoch: copy.owner_epoch,
                at_pulse: pulse,
            });
            Ok(item)
        })?
    }

    /// Picks an item up from the floor of the player's room: a plain move when nobody or this
    /// very copy put it down, else a transfer (one in flight per character at a time).
    pub fn get_item(&mut self, character_id: Uuid, item_id: Uuid) -> Result<Pickup, ActionError> {
        self.pick(character_id, None, item_id)
    }

    /// Takes an item out of a container on the floor of the player's room, as
    /// [`LiveShard::get_item`] picks one up.
    pub fn get_from_container(
        &mut self,
        character_id: Uuid,
        container_id: Uuid,
        item_id: Uuid,
    ) -> Result<Pickup, ActionError> {
        self.pick(character_id, Some(container_id), item_id)
    }

    fn pick(
        &mut self,
        character_id: Uuid,
        container: Option<Uuid>,
        item_id: Uuid,
    ) -> Result<Pickup, ActionError> {
        let Resident {
            copy, zone, room, ..
        } = self.resident(character_id)?.clone();
        let released = self
            .lying(&zone, &room, container, item_id)?
            .released
            .clone();
        let mark = released.as_ref().map(|r| ReleaseMark {
            by: r.by,
            epoch: r.epoch,
        });
        let Some((mark, released)) = mark
            .zip(released)
            .filter(|(m, _)| pickup_commits(copy, Some(*m)))
        else {
            let item = self.take_lying(&zone, &room, container, item_id)?;
            let given = picked(item.clone());
            if let Err(err) = self.update(character_id, |c| c.inventory.push(given)) {
                // The copy is gone (evicted since the last tick): the item lies where it was.
                self.floor_of(&zone)?.push(FloorItem {
                    item,
                    room,
                    reset_op: None,
                });
                return Err(err);
            }
            return Ok(Pickup::Moved);
        };
        for side in [character_id, mark.by] {
            if self.runtime.in_transfer(side) || self.transferring.contains(&side) {
                return Err(ActionError::TransferPending(side));
            }
        }
        let item = self.take_lying(&zone, &room, container, item_id)?;
        self.transfer(copy, item, mark, released, zone, room);
        Ok(Pickup::Transferring)
    }

    /// The item `item_id` lying in `room` (inside `container` when one is named).
    fn lying(
        &self,
        zone: &str,
        room: &str,
        container: Option<Uuid>,
        item_id: Uuid,
    ) -> Result<&Item, ActionError> {
        let floor = self
            .zones
            .get(zone)
            .map(|z| z.entities.floor.as_slice())
            .unwrap_or_default();
        let on_floor = |id: Uuid| {
            floor
                .iter()
                .find(|f| f.room == room && f.item.id == Some(id))
                .map(|f| &f.item)
        };
        match container {
            None => on_floor(item_id).ok_or(ActionError::NoSuchItem(item_id)),
            Some(container_id) => on_floor(container_id)
                .ok_or(ActionError::NoSuchItem(container_id))?
                .contents
                .iter()
                .find(|i| i.id == Some(item_id))
                .ok_or(ActionError::NoSuchItem(item_id)),
        }
    }

    /// Takes the item `item_id` lying in `room` (inside `container` when one is named).
    fn take_lying(
        &mut self,
        zone: &str,
        room: &str,
        container: Option<Uuid>,
        item_id: Uuid,
    ) -> Result<Item, ActionError> {
        let floor = self.floor_of(zone)?;
        let holder = container.unwrap_or(item_id);
        let index = floor
            .iter()
            .position(|f| f.room == room && f.item.id == Some(holder))
            .ok_or(ActionError::NoSuchItem(holder))?;
        if container.is_none() {
            return Ok(floor.remove(index).item);
        }
        let contents = &mut floor[index].item.contents;
        let inner = contents
            .iter()
            .position(|i| i.id == Some(item_id))
            .ok_or(ActionError::NoSuchItem(item_id))?;
        Ok(contents.remove(inner))
    }

    /// Runs a pickup's transfer in a task; its answer comes back to the tick.
    fn transfer(
        &mut self,
        acquirer: CopyId,
        item: Item,
        mark: ReleaseMark,
        released: Released,
        zone: String,
        room: String,
    ) {
        let acquirer_name = self.runtime.name(acquirer).unwrap_or_default();
        let details = json!({
            "item_ref": item.proto.proto_ref,
            "stack": item.delta.stack.max(1),
            "acquirer_name": acquirer_name,
            "releaser_name": released.by_name,
            "zone": zone,
            "room": room,
        });
        self.transferring.insert(acquirer.character_id);
        self.transferring.insert(mark.by);
        self.in_flight.push(item.clone());
        let runtime = self.runtime.clone();
        let back = self.pickups.0.clone();
        let item_id = item.id.unwrap_or_default();
        let given = picked(item.clone());
        tokio::spawn(async move {
            let result = runtime
                .pick_up(acquirer, item_id, Some(mark), details, |c| {
                    c.inventory.push(given.clone());
                })
                .await;
            let _ = back.send(Answer {
                acquirer,
                item,
                mark,
                released,
                room,
                zone,
                result,
            });
        });
    }

    /// Takes in the transfers' answers: a refused one gives the item back to the copy that put
    /// it down when it is still here (else to the floor it lay on, marked as it was); a voided
    /// one leaves the world; one that never reached a commit lies on the floor again.
    pub(super) fn take_pickup_answers(&mut self) {
        while let Ok(answer) = self.pickups.1.try_recv() {
            if let Some(at) = self.in_flight.iter().position(|i| i.id == answer.item.id) {
                self.in_flight.swap_remove(at);
            }
            self.transferring.remove(&answer.acquirer.character_id);
            self.transferring.remove(&answer.mark.by);
            match answer.result {
                Ok(PickedUp::Moved | PickedUp::Committed) => self.transfer_counts.0 += 1,
                Ok(PickedUp::Void { reason }) => {
                    self.transfer_counts.1 += 1;
                    tracing::warn!(event = "item_voided", item = ?answer.item.id, %reason);
                    answer.item.walk(&mut |i| self.voided_items.extend(i.id));
                }
                Ok(PickedUp::GiveBack { .. }) | Err(_) => {
                    self.transfer_counts.1 += 1;
                    let releaser = self
                        .residents
                        .get(&answer.mark.by)
                        .map(|r| r.copy)
                        .filter(|c| c.owner_epoch == answer.mark.epoch);
                    let back = picked(answer.item.clone());
                    let kept = releaser.is_some_and(|copy| {
                        self.runtime
                            .update(copy, |c| c.inventory.push(back))
                            .is_ok()
                    });
                    if !kept {
                        let mut item = answer.item;
                        item.released = Some(answer.released);
                        let lying = FloorItem {
                            item,
                            room: answer.room,
                            reset_op: None,
                        };
                        match self.floor_of(&answer.zone) {
                            Ok(floor) => floor.push(lying),
                            Err(_) => lying.item.walk(&mut |i| self.voided_items.extend(i.id)),
                        }
                    }
                }
            }
        }
    }

    /// Removes from the floors (and from containers lying there) every item put down by `copy`
    /// (an evicted zombie): what it put down may be a phantom, so nobody may pick it up.
    pub(super) fn void_released_by(&mut self, copy: CopyId) {
        let voided = self.sweep_floors(|item| {
            item.released
                .as_ref()
                .is_some_and(|r| r.by == copy.character_id && r.epoch == copy.owner_epoch)
        });
        self.voided_items.extend(voided);
    }

    /// Removes from the floors (and from containers lying there) every item put down at least
    /// `lifetime` pulses ago; what the zones spawned themselves stays until picked up.
    pub(super) fn decay_floors(&mut self, lifetime: u64) {
        let pulse = self.pulse;
        let decayed = self.sweep_floors(|item| {
            item.released
                .as_ref()
                .is_some_and(|r| r.at_pulse.saturating_add(lifetime) <= pulse)
        });
        self.decayed_items.extend(decayed);
    }

    /// Removes every floor item (or container content) `gone` names, on every floor here; the
    /// ids of all it removed, contents included.
    fn sweep_floors(&mut self, gone: impl Fn(&Item) -> bool) -> Vec<Uuid> {
        let mut removed = Vec::new();
        for zone in self.zones.values_mut() {
            removed.extend(sweep_floor(&mut zone.entities.floor, &gone));
        }
        removed
    }

    /// The floor of `zone` (every player stands in a zone hosted here).
    fn floor_of(&mut self, zone: &str) -> Result<&mut Vec<FloorItem>, ActionError> {
        self.zones
            .get_mut(zone)
            .map(|z| &mut z.entities.floor)
            .ok_or_else(|| ActionError::Runtime(format!("zone {zone:?} is not hosted here")))
    }
}

/// An item as it goes into an inventory: its marker cleared, bound when it binds on pickup.
fn picked(mut item: Item) -> Item {
    item.released = None;
    if item.proto.bind_on_pickup {
        item.delta.bound = true;
    }
    item
}
