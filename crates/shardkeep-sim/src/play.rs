//! What the players on a host do each pulse: walk (across shards too), fight for rewards, die,
//! move items between themselves, the floor and containers, change appearance and equipment,
//! and end their sessions.

use std::sync::atomic::Ordering;

use uuid::Uuid;

use super::agent::{Action, SessionEnd};
use super::host::{Body, Host, Phase};
use super::inbound::Inbound;
use super::travel;
use super::world::bump;
use shardkeep_reference::game::ReferenceEffect;
use shardkeep_reference::game::items::{CarryLimits, Item, dump_one};
use shardkeep_reference::live_shard::{Pickup, Walk};

/// Pulses a dead player waits to respawn.
const RESPAWN_PULSES: u64 = 20;
/// Pulses a copy whose connection dropped stays link-dead (its runtime's grace): a reconnect
/// comes back well within it, a vanished player after it.
pub(super) const LINK_DEAD_PULSES: u64 = 80;
/// Most items a player carries (top level): loot and pickups beyond it are turned down, so
/// documents stop growing once the players have lived a while (with floor decay, the world's
/// item count stays bounded over a long run).
pub(super) const INVENTORY_CAP: usize = 24;

impl Host {
    /// Every playing body gets its turn.
    pub(super) fn act_all(&mut self) {
        let ids: Vec<Uuid> = self.bodies.keys().copied().collect();
        for id in ids {
            let Some(mut body) = self.bodies.remove(&id) else {
                continue;
            };
            if self.shard.copy_of(id).is_none() {
                // Evicted or gone without an event: the agent logs in again.
                if body.phase != Phase::Ghost
                    && let Some(agent) = body.agent.take()
                {
                    self.release(agent, 500);
                }
                continue;
            }
            if self.turn(id, &mut body) {
                self.bodies.insert(id, body);
            }
        }
    }

    /// One body's turn; false when the body left this host.
    fn turn(&mut self, id: Uuid, body: &mut Body) -> bool {
        match body.phase {
            Phase::LinkDead => return true,
            Phase::Attached {
                dead_until: Some(until),
            } => {
                if self.pulse >= until && self.shard.respawn(id).is_ok() {
                    body.phase = Phase::Attached { dead_until: None };
                }
                return true;
            }
            Phase::Attached { dead_until: None } | Phase::Ghost => {}
        }
        let ghost = body.phase == Phase::Ghost;
        if !ghost && self.pulse >= body.session_end && !self.shard.in_transfer(id) {
            return self.end_session(id, body);
        }
        let Some(agent) = body.agent.as_mut() else {
            return true;
        };
        let next = if ghost && agent.escapes {
            Some(Action::Walk)
        } else {
            agent.next_action()
        };
        let Some(action) = next else {
            return true;
        };
        match action {
            Action::Walk => return self.walk(id, body),
            Action::Fight => self.fight(id, body),
            Action::Drop => self.drop_item(id, body),
            Action::Get => self.pick_up(id, body),
            Action::Put => self.put_in_container(id, body),
            Action::TakeFromContainer => self.take_from_container(id, body),
            Action::Appearance => self.change_appearance(id, body),
            Action::Equip => self.change_equipment(id, body),
            Action::Die => {
                if let Ok(Some(_)) = self.shard.die(id, None) {
                    bump(&self.world.counters.deaths);
                    if !ghost {
                        body.phase = Phase::Attached {
                            dead_until: Some(self.pulse + RESPAWN_PULSES),
                        };
                    }
                }
            }
        }
        true
    }

    fn end_session(&mut self, id: Uuid, body: &mut Body) -> bool {
        let Some(mut agent) = body.agent.take() else {
            return true;
        };
        match agent.session_end() {
            SessionEnd::Logout => {
                let leaving = Body {
                    agent: Some(agent),
                    phase: body.phase,
                    session_end: body.session_end,
                };
                match self.log_out(id, leaving) {
                    None => false,
                    Some(stays) => {
                        body.agent = stays.agent;
                        true
                    }
                }
            }
            end => {
                // The runtime journals the closed stream with its resume ledger and keeps the
                // copy, link-dead, for its grace.
                // A player with no session known here has no connection to close.
                let detached = self
                    .sessions
                    .get(&id)
                    .is_some_and(|session| self.shard.detach(id, session, 0).is_ok());
                if !detached {
                    body.agent = Some(agent);
                    return true;
                }
                bump(&self.world.counters.disconnects);
                let after = if end == SessionEnd::Reconnect {
                    agent.between(300, 2500)
                } else {
                    agent.between(9000, 12000)
                };
                body.phase = Phase::LinkDead;
                self.release(agent, after);
                true
            }
        }
    }

    fn walk(&mut self, id: Uuid, body: &mut Body) -> bool {
        let Some((zone, room)) = self.shard.location(id) else {
            return true;
        };
        let hosted = |zone: &str| self.shard.floors().any(|(def, _)| def.id == zone);
        let mut exits: Vec<(String, String, String)> = self
            .zones
            .get(&zone)
            .and_then(|z| z.rooms.get(&room))
            .map(|r| {
                r.exits
                    .iter()
                    .map(|(dir, exit)| (dir.clone(), exit.zone.clone(), exit.room.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let Some(agent) = body.agent.as_mut() else {
            return true;
        };
        if agent.escapes {
            // Out of the shard if an exit leads out, else towards a room that has one.
            let out: Vec<_> = exits.iter().filter(|e| !hosted(&e.1)).cloned().collect();
            let towards: Vec<_> = exits.iter().filter(|e| e.2 == "r0").cloned().collect();
            if !out.is_empty() {
                exits = out;
            } else if !towards.is_empty() {
                exits = towards;
            }
        }
        if exits.is_empty() {
            return true;
        }
        let (direction, to_zone, _) = exits[agent.pick(exits.len())].clone();
        if !hosted(&to_zone) && self.shard.in_transfer(id) {
            // The runtime would hold the handoff until the transfer answers; the player waits.
            return true;
        }
        let epoch = self.shard.copy_of(id).map_or(0, |c| c.owner_epoch);
        match self.shard.walk(id, &direction) {
            Ok(Walk::Moved { zone: to, .. }) => {
                bump(&self.world.counters.walks);
                let is_instance = |id: &str| {
                    self.shard
                        .floors()
                        .any(|(def, _)| def.id == id && def.instance)
                };
                if is_instance(&to) && !is_instance(&zone) {
                    bump(&self.world.counters.instance_entries);
                }
                true
            }
            Ok(Walk::Leaving(departure)) => {
                tracing::debug!(event = "sim_handoff_out", shard = %self.id, character = %id,
                    epoch, target = %departure.target_shard);
                let Some(agent) = body.agent.take() else {
                    return false;
                };
                if !agent.ghost {
                    self.world.in_transit.fetch_add(1, Ordering::Relaxed);
                }
                let (world, observer, here) = (
                    std::sync::Arc::clone(&self.world),
                    std::sync::Arc::clone(&self.observer),
                    self.id.clone(),
                );
                tokio::spawn(async move {
                    match departure.ticket().await {
                        Ok(ticket) => {
                            observer.left(&world, &ticket.token);
                            travel::carry(&world, &ticket.target_shard, agent, ticket.token, epoch);
                        }
                        Err(err) => {
                            // Not stored: the copy stays where it stood; its player picks it up
                            // again (the runtime resumes the copy it still holds). A zombie's
                            // driver never logs in: its copy stays until its fence evicts it.
                            tracing::debug!(event = "sim_handoff_not_stored", error = %err);
                            bump(&world.counters.handoff_retries);
                            if !agent.ghost {
                                travel::deliver(&world, &here, Inbound::Login { agent });
                            }
                        }
                    }
                });
                false
            }
            Ok(Walk::NoExit) | Err(_) => true,
        }
    }

    fn fight(&mut self, id: Uuid, body: &mut Body) {
        let Some(agent) = body.agent.as_mut() else {
            return;
        };
        let Some(epoch) = self.shard.copy_of(id).map(|c| c.owner_epoch) else {
            return;
        };
        let (xp, gold, loot) = agent.reward();
        let full = self
            .shard
            .read(id, |c| c.inventory.len() >= INVENTORY_CAP)
            .unwrap_or(true);
        if loot && full {
            bump(&self.world.counters.inventory_full);
        }
        let herb = self.world.catalog.get("herb").cloned();
        let items: Vec<_> = (loot && !full)
            .then_some(herb)
            .flatten()
            .map(|p| Item::spawn(&p))
            .and_then(|item| dump_one(&item, CarryLimits::default(), &mut 0).ok())
            .into_iter()
            .collect();
        let reward = ReferenceEffect::CombatRewards {
            experience: xp,
            currency: gold,
            items,
        };
        // Applied, numbered and made durable by the runtime: the number goes in the ledger.
        match self.shard.grant(id, reward) {
            Ok(granted) => {
                self.world.with_ledger(|ledger| {
                    ledger
                        .rewards
                        .issued(id, epoch, granted.issue_seq, (xp, gold))
                });
                bump(&self.world.counters.fights);
                bump(&self.world.counters.retry_enqueued);
            }
            Err(err) => tracing::debug!(event = "sim_reward_refused", error = %err),
        }
    }

    /// Inventory items that can leave their owner.
    fn loose_items(&self, id: Uuid) -> Vec<Uuid> {
        self.shard
            .read(id, |c| {
                c.inventory
                    .iter()
                    .filter(|i| !i.delta.bound && !i.proto.container)
                    .filter_map(|i| i.id)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Floor items in the player's room: loose ones, and containers with their contents.
    fn room_floor(&self, id: Uuid) -> (Vec<Uuid>, Vec<(Uuid, Vec<Uuid>)>) {
        let Some((zone, room)) = self.shard.location(id) else {
            return Default::default();
        };
        let Some((_, floor)) = self.shard.floors().find(|(def, _)| def.id == zone) else {
            return Default::default();
        };
        let mut loose = Vec::new();
        let mut containers = Vec::new();
        for floor in floor.iter().filter(|f| f.room == room) {
            let Some(item_id) = floor.item.id else {
                continue;
            };
            if floor.item.proto.container {
                let contents = floor.item.contents.iter().filter_map(|i| i.id).collect();
                containers.push((item_id, contents));
            } else {
                loose.push(item_id);
            }
        }
        (loose, containers)
    }

    fn drop_item(&mut self, id: Uuid, body: &mut Body) {
        let items = self.loose_items(id);
        let Some(agent) = body.agent.as_mut() else {
            return;
        };
        if items.is_empty() {
            return;
        }
        let item = items[agent.pick(items.len())];
        if self.shard.drop_item(id, item).is_ok() {
            tracing::debug!(event = "sim_drop", shard = %self.id, character = %id, %item);
            bump(&self.world.counters.item_moves);
        }
    }

    /// True (and counted) when the player's inventory cannot take another item.
    fn inventory_full(&self, id: Uuid) -> bool {
        let full = self
            .shard
            .read(id, |c| c.inventory.len() >= INVENTORY_CAP)
            .unwrap_or(true);
        if full {
            bump(&self.world.counters.inventory_full);
        }
        full
    }

    fn pick_up(&mut self, id: Uuid, body: &mut Body) {
        if self.inventory_full(id) {
            return;
        }
        let (loose, _) = self.room_floor(id);
        let Some(agent) = body.agent.as_mut() else {
            return;
        };
        if loose.is_empty() {
            return;
        }
        let item = loose[agent.pick(loose.len())];
        if let Ok(pickup) = self.shard.get_item(id, item) {
            tracing::debug!(event = "sim_get", shard = %self.id, character = %id, %item,
                transfer = pickup == Pickup::Transferring);
            bump(&self.world.counters.item_moves);
        }
    }

    fn put_in_container(&mut self, id: Uuid, body: &mut Body) {
        let items = self.loose_items(id);
        let (_, containers) = self.room_floor(id);
        let Some(agent) = body.agent.as_mut() else {
            return;
        };
        if items.is_empty() || containers.is_empty() {
            return;
        }
        let item = items[agent.pick(items.len())];
        let container = containers[agent.pick(containers.len())].0;
        if self.shard.put_item(id, item, container).is_ok() {
            tracing::debug!(event = "sim_put", shard = %self.id, character = %id, %item, %container);
            bump(&self.world.counters.item_moves);
        }
    }

    fn take_from_container(&mut self, id: Uuid, body: &mut Body) {
        if self.inventory_full(id) {
            return;
        }
        let (_, containers) = self.room_floor(id);
        let Some(agent) = body.agent.as_mut() else {
            return;
        };
        let full: Vec<&(Uuid, Vec<Uuid>)> = containers.iter().filter(|c| !c.1.is_empty()).collect();
        if full.is_empty() {
            return;
        }
        let (container, contents) = full[agent.pick(full.len())];
        let item = contents[agent.pick(contents.len())];
        if let Ok(pickup) = self.shard.get_from_container(id, *container, item) {
            tracing::debug!(event = "sim_take", shard = %self.id, character = %id, %item,
                transfer = pickup == Pickup::Transferring);
            bump(&self.world.counters.item_moves);
        }
    }

    fn change_appearance(&mut self, id: Uuid, body: &mut Body) {
        const OUTFITS: [&str; 5] = ["tunic", "robe", "leathers", "cloak", "plate"];
        let Some(agent) = body.agent.as_mut() else {
            return;
        };
        let outfit = OUTFITS[agent.pick(OUTFITS.len())];
        let Ok(mut appearance) = self.shard.read(id, |c| c.appearance.clone()) else {
            return;
        };
        outfit.clone_into(&mut appearance.outfit);
        // A client's change made durable as a numbered grant of the runtime.
        if self
            .shard
            .grant(id, ReferenceEffect::CharacterAppearance { appearance })
            .is_ok()
        {
            bump(&self.world.counters.appearance_changes);
            bump(&self.world.counters.retry_enqueued);
        }
    }

    /// Equips a wearable from the inventory (the worn one goes back), or takes one off. The
    /// change reaches the stores with the next checkpoint and flush: equipment moves items, so
    /// it travels with the whole snapshot, never as a partial write.
    fn change_equipment(&mut self, id: Uuid, body: &mut Body) {
        let Some(agent) = body.agent.as_mut() else {
            return;
        };
        let roll = agent.pick(100);
        let changed = self.shard.update(id, |character| {
            let wearables: Vec<usize> = character
                .inventory
                .iter()
                .enumerate()
                .filter(|(_, i)| i.proto.slot.is_some())
                .map(|(n, _)| n)
                .collect();
            if roll < 70 && !wearables.is_empty() {
                let item = character
                    .inventory
                    .remove(wearables[roll % wearables.len()]);
                let Some(slot) = item.proto.slot else {
                    character.inventory.push(item);
                    return false;
                };
                if let Some(worn) = character.equipment.insert(slot, item) {
                    character.inventory.push(worn);
                }
            } else if let Some(slot) = character
                .equipment
                .keys()
                .nth(roll % character.equipment.len().max(1))
                .copied()
            {
                if let Some(worn) = character.equipment.remove(&slot) {
                    character.inventory.push(worn);
                }
            } else {
                return false;
            }
            character.recompute();
            true
        });
        if changed.unwrap_or(false) {
            bump(&self.world.counters.equipment_changes);
        }
    }
}
