//! What the players on a host do each pulse: walk (across shards too), fight for rewards, die,
//! move items between themselves, the floor and containers, change appearance and equipment,
//! and end their sessions.

use std::sync::atomic::Ordering;

use uuid::Uuid;

use super::agent::{Action, SessionEnd};
use super::host::{Body, Host, Phase};
use super::travel;
use super::world::bump;
use shardkeep::journal::SessionLifecycleEffectPlan;
use shardkeep::retry::{Origin, PersistenceRetryPayload};
use shardkeep_reference::game::ReferenceEffect;
use shardkeep_reference::game::items::{CarryLimits, Item, dump_one};
use shardkeep_reference::shard::WalkOutcome;

/// Pulses a dead player waits to respawn.
const RESPAWN_PULSES: u64 = 20;
/// Pulses a reconnecting player's copy stays link-dead.
const RECONNECT_WINDOW_PULSES: u64 = 80;
/// Pulses a vanished player's copy stays link-dead.
const VANISH_WINDOW_PULSES: u64 = 30;
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
            if self.shard.player(id).is_none() {
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
            Phase::LinkDead { .. } => return true,
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
        if !ghost && self.pulse >= body.session_end && !self.shard.has_pending_transfer(id) {
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
                let body = Body {
                    agent: Some(agent),
                    phase: body.phase,
                    session: std::mem::take(&mut body.session),
                    session_end: body.session_end,
                };
                self.log_out(id, body);
                false
            }
            end => {
                let Some(player) = self.player_snapshot(id) else {
                    return false;
                };
                if self.shard.detach(id).is_err() {
                    return false;
                }
                bump(&self.world.counters.disconnects);
                travel::close_stream(
                    &self.world,
                    body.session.clone(),
                    player,
                    SessionLifecycleEffectPlan::Reconnectable,
                );
                let (window, after) = if end == SessionEnd::Reconnect {
                    (RECONNECT_WINDOW_PULSES, agent.between(300, 2500))
                } else {
                    (VANISH_WINDOW_PULSES, agent.between(5000, 9000))
                };
                body.phase = Phase::LinkDead {
                    until: self.pulse + window,
                };
                self.release(agent, after);
                true
            }
        }
    }

    fn walk(&mut self, id: Uuid, body: &mut Body) -> bool {
        let Some((zone, room)) = self.shard.location(id) else {
            return true;
        };
        let hosted = |zone: &str| self.shard.zones().any(|z| z.def.id == zone);
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
        let leaves_shard = !hosted(&to_zone);
        if leaves_shard && self.shard.has_pending_transfer(id) {
            // An item waiting on its transfer commit must not travel. Zombies do travel: the
            // destination refuses the carried copy once the live owner has claimed.
            return true;
        }
        let before = self.player_snapshot(id);
        match self.shard.walk(id, &direction) {
            Ok(WalkOutcome::Moved { zone: to, .. }) => {
                bump(&self.world.counters.walks);
                let is_instance =
                    |id: &str| self.shard.zones().any(|z| z.def.id == id && z.def.instance);
                if is_instance(&to) && !is_instance(&zone) {
                    bump(&self.world.counters.instance_entries);
                }
                true
            }
            Ok(WalkOutcome::Handoff(handoff)) => {
                tracing::debug!(event = "sim_handoff_out", shard = %self.id, character = %id,
                    epoch = handoff.snapshot.owner_epoch, target = ?handoff.target_shard);
                let (Some(agent), Some(old_player)) = (body.agent.take(), before) else {
                    return false;
                };
                let target = handoff
                    .target_shard
                    .clone()
                    .unwrap_or_else(|| super::world::World::shard_id(agent.home_shard));
                if !agent.ghost {
                    self.world.in_transit.fetch_add(1, Ordering::Relaxed);
                }
                travel::hand_off(
                    &self.world,
                    agent,
                    handoff.snapshot,
                    target,
                    std::mem::take(&mut body.session),
                    old_player,
                );
                false
            }
            Ok(WalkOutcome::NoExit) | Err(_) => true,
        }
    }

    fn fight(&mut self, id: Uuid, body: &mut Body) {
        let Some(agent) = body.agent.as_mut() else {
            return;
        };
        let herb = self.world.catalog.get("herb").cloned();
        let Some(entry) = self.shard.player_mut(id) else {
            return;
        };
        let epoch = entry.character.owner_epoch;
        let (xp, gold, loot) = agent.reward();
        let key = agent.next_reward_key(epoch);
        let full = entry.character.inventory.len() >= INVENTORY_CAP;
        if loot && full {
            bump(&self.world.counters.inventory_full);
        }
        let loot = (loot && !full)
            .then_some(herb)
            .flatten()
            .map(|p| Item::spawn(&p));
        entry.character.experience += xp;
        entry.character.currency += gold;
        let mut items = Vec::new();
        if let Some(item) = loot {
            let mut nodes = 0;
            if let Ok(stored) = dump_one(&item, CarryLimits::default(), &mut nodes) {
                items.push(stored);
            }
            entry.character.inventory.push(item);
        }
        // Granted in memory first, then issued: every later dump holds it.
        let seq = entry.character.issue();
        self.world
            .with_ledger(|ledger| ledger.rewards.issued(id, epoch, seq, (xp, gold)));
        bump(&self.world.counters.fights);
        let payload = PersistenceRetryPayload::effect(
            id,
            &ReferenceEffect::CombatRewards {
                experience: xp,
                currency: gold,
                items,
            },
        );
        if let Some(job) = travel::job(
            payload,
            key,
            (epoch, seq),
            Origin::CombatRewards,
            &self.id,
            &body.session,
        ) {
            travel::enqueue_job(&self.world, job);
        }
    }

    /// Inventory items that can leave their owner.
    fn loose_items(&self, id: Uuid) -> Vec<Uuid> {
        self.shard
            .player(id)
            .map(|e| {
                e.character
                    .inventory
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
        let Some(zone) = self.shard.zones().find(|z| z.def.id == zone) else {
            return Default::default();
        };
        let mut loose = Vec::new();
        let mut containers = Vec::new();
        for floor in zone.entities.floor.iter().filter(|f| f.room == room) {
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
            .player(id)
            .is_some_and(|e| e.character.inventory.len() >= INVENTORY_CAP);
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
        if let Ok(transfer) = self.shard.get_item(id, item) {
            tracing::debug!(event = "sim_get", shard = %self.id, character = %id, %item, transfer = transfer.is_some());
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
        if let Ok(transfer) = self.shard.get_from_container(id, *container, item) {
            tracing::debug!(event = "sim_take", shard = %self.id, character = %id, %item, transfer = transfer.is_some());
            bump(&self.world.counters.item_moves);
        }
    }

    fn change_appearance(&mut self, id: Uuid, body: &mut Body) {
        const OUTFITS: [&str; 5] = ["tunic", "robe", "leathers", "cloak", "plate"];
        let Some(agent) = body.agent.as_mut() else {
            return;
        };
        let outfit = OUTFITS[agent.pick(OUTFITS.len())];
        let seq = agent.between(0, u64::from(u32::MAX));
        let Some(entry) = self.shard.player_mut(id) else {
            return;
        };
        entry.character.appearance.outfit = outfit.to_owned();
        let epoch = entry.character.owner_epoch;
        let issued = entry.character.issue();
        let payload = PersistenceRetryPayload::effect(
            id,
            &ReferenceEffect::CharacterAppearance {
                appearance: entry.character.appearance.clone(),
            },
        );
        bump(&self.world.counters.appearance_changes);
        let key = format!("appearance:{id}:{epoch}:{seq}");
        if let Some(job) = travel::job(
            payload,
            key,
            (epoch, issued),
            Origin::ClientAppearance,
            &self.id,
            &body.session,
        ) {
            travel::enqueue_job(&self.world, job);
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
        let Some(entry) = self.shard.player_mut(id) else {
            return;
        };
        let character = &mut entry.character;
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
            let Some(slot) = item.proto.slot else { return };
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
            return;
        }
        character.recompute();
        bump(&self.world.counters.equipment_changes);
    }
}
