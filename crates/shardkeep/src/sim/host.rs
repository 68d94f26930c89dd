//! One shard's task: it owns the [`Shard`], the bodies of the players on it, and their agents.
//! Each pulse the agents act, the shard ticks, and saver outcomes, evictions and voided items are
//! recorded. Messages bring logins, loaded characters, handoffs and faults; settle steps end the
//! run.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::rngs::Xoshiro256PlusPlus as SimRng;
use rand::{RngExt, SeedableRng};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::agent::Agent;
use super::travel;
use super::world::{World, add_saver_stats, bump};
use crate::character::{CharacterSnapshot, LoadedCharacter};
use crate::game::world::ZoneDef;
use crate::journal::{PlayerSnapshot, SessionLifecycleEffectPlan};
use crate::placement::PlacementStore;
use crate::saver::{SaveReason, SaverEvent};
use crate::shard::{Arrival, Link, Shard, ShardConfig};

/// A message to a host.
pub(super) enum Inbound {
    /// A login routed here by the gate.
    Login {
        agent: Agent,
        floor: i64,
        held: bool,
    },
    /// A login's claim landed.
    Loaded {
        agent: Agent,
        loaded: LoadedCharacter,
    },
    /// A player arrives through an exit from another shard. The source keeps its copy of the
    /// snapshot until the destination has it (a take whose reply was lost consumed the stored
    /// one).
    Handoff {
        agent: Agent,
        token: String,
        retained: Box<CharacterSnapshot>,
        old_session: String,
        old_player: PlayerSnapshot,
    },
    /// A handoff's claim landed.
    HandoffLoaded {
        agent: Agent,
        token: String,
        loaded: LoadedCharacter,
        old_session: String,
        old_player: PlayerSnapshot,
    },
    /// Fault: one player here logs in on `target` while this shard keeps playing it.
    Zombify { target: String },
    /// Fault: the shard dies without flushing and a fresh one boots in its place.
    Kill,
    /// Settling the run.
    Settle(SettleStep),
}

impl Inbound {
    /// The agent a message carries, if any.
    pub(super) fn into_agent(self) -> Option<Agent> {
        match self {
            Inbound::Login { agent, .. }
            | Inbound::Loaded { agent, .. }
            | Inbound::Handoff { agent, .. }
            | Inbound::HandoffLoaded { agent, .. } => Some(agent),
            _ => None,
        }
    }
}

/// A step of the end of the run.
pub(super) enum SettleStep {
    /// Flush every live player, so zombie copies meet their fence.
    Reconcile(oneshot::Sender<()>),
    /// Re-assert every placement and wait for the writes.
    RefreshPlacements(oneshot::Sender<()>),
    /// List live sessions whose placement record does not name them.
    CheckPlacements(oneshot::Sender<(u64, Vec<String>)>),
    /// Settle transfers, record the floors, log everyone out, stop.
    Shutdown(oneshot::Sender<()>),
}

/// Where a body is in its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Playing; dead until the pulse given.
    Attached { dead_until: Option<u64> },
    /// The connection dropped; logged out at the pulse given.
    LinkDead { until: u64 },
    /// A zombie copy that keeps playing.
    Ghost,
}

/// A player held on this shard.
pub(super) struct Body {
    /// The agent driving it (`None` while link-dead: the agent is reconnecting).
    pub(super) agent: Option<Agent>,
    pub(super) phase: Phase,
    pub(super) session: String,
    pub(super) session_end: u64,
}

/// A player whose logout waits for its final save.
struct Leaving {
    agent: Option<Agent>,
    since: u64,
    session: String,
    player: PlayerSnapshot,
}

/// Pulses a logout waits for its final save's outcome (longer than the saver's outage budget).
const FINAL_WAIT_PULSES: u64 = 650;

/// One shard's task.
pub(super) struct Host {
    pub(super) index: usize,
    pub(super) id: String,
    pub(super) world: Arc<World>,
    pub(super) shard: Shard,
    pub(super) bodies: BTreeMap<Uuid, Body>,
    leaving: BTreeMap<Uuid, Leaving>,
    /// Every zone of the world, for exits.
    pub(super) zones: HashMap<String, ZoneDef>,
    inbox: mpsc::UnboundedReceiver<Inbound>,
    pub(super) pulse: u64,
    rng: SimRng,
}

impl Host {
    /// Boots shard `index` and registers its inbox.
    pub(super) fn start(world: &Arc<World>, index: usize) -> Self {
        let id = World::shard_id(index);
        let (tx, inbox) = mpsc::unbounded_channel();
        world.register_host(&id, tx);
        let zones = world
            .shard_zones
            .iter()
            .flatten()
            .map(|z| (z.id.clone(), z.clone()))
            .collect();
        Self {
            shard: boot(world, index),
            index,
            id,
            world: Arc::clone(world),
            bodies: BTreeMap::new(),
            leaving: BTreeMap::new(),
            zones,
            inbox,
            pulse: 0,
            rng: SimRng::seed_from_u64(world.config.seed.wrapping_add(index as u64 * 7919)),
        }
    }

    /// Runs until the shutdown step.
    pub(super) async fn run(mut self) {
        let mut pulses = tokio::time::interval(self.world.config.pulse);
        pulses.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = pulses.tick() => self.pulse_once(),
                message = self.inbox.recv() => match message {
                    Some(Inbound::Settle(SettleStep::Shutdown(reply))) => {
                        self.shutdown().await;
                        let _ = reply.send(());
                        return;
                    }
                    Some(message) => self.handle(message).await,
                    None => return,
                },
            }
        }
    }

    fn pulse_once(&mut self) {
        self.pulse += 1;
        if !self.world.is_settling() {
            self.act_all();
        }
        self.expire_link_dead();
        self.shard.tick();
        self.record_outcomes();
        self.finish_logouts();
        if self.pulse.is_multiple_of(10) {
            let online = self
                .bodies
                .values()
                .filter(|b| b.phase != Phase::Ghost)
                .count();
            self.world.online[self.index].store(online, Ordering::Relaxed);
            if let Ok(mut live) = self.world.saver_live.lock() {
                live[self.index] = self.shard.saver().stats();
            }
        }
    }

    /// Gives an agent back to the world: it logs in again after `after_ms`.
    pub(super) fn release(&self, agent: Agent, after_ms: u64) {
        self.world.in_transit.fetch_add(1, Ordering::Relaxed);
        travel::go_offline(&self.world, agent, after_ms);
    }

    /// An agent arrived on this host.
    fn arrived(&self) {
        self.world.in_transit.fetch_sub(1, Ordering::Relaxed);
    }

    /// The journal's view of a held player.
    pub(super) fn player_snapshot(&self, character_id: Uuid) -> Option<PlayerSnapshot> {
        let entry = self.shard.player(character_id)?;
        let (zone, room) = self.shard.location(character_id)?;
        Some(PlayerSnapshot {
            character_id,
            account_id: entry.character.account_id,
            character_name: entry.character.name.clone(),
            shard_id: self.id.clone(),
            zone,
            room,
            owner_epoch: entry.character.owner_epoch,
        })
    }

    /// A clean logout: the final save is queued; the session closes once it has an outcome.
    pub(super) fn log_out(&mut self, character_id: Uuid, body: Body) {
        let Some(player) = self.player_snapshot(character_id) else {
            return;
        };
        if self.shard.logout(character_id).is_err() {
            return;
        }
        bump(&self.world.counters.logouts);
        self.leaving.insert(
            character_id,
            Leaving {
                agent: body.agent,
                since: self.pulse,
                session: body.session,
                player,
            },
        );
    }

    fn expire_link_dead(&mut self) {
        let expired: Vec<Uuid> = self
            .bodies
            .iter()
            .filter(|(_, b)| matches!(b.phase, Phase::LinkDead { until } if self.pulse >= until))
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            if let Some(body) = self.bodies.remove(&id) {
                bump(&self.world.counters.linkdead_timeouts);
                self.log_out(id, body);
            }
        }
    }

    fn finish_logouts(&mut self) {
        let done: Vec<Uuid> = self
            .leaving
            .iter()
            .filter(|(_, l)| self.pulse >= l.since + FINAL_WAIT_PULSES)
            .map(|(id, _)| *id)
            .collect();
        for id in done {
            self.finish_logout(id);
        }
    }

    fn finish_logout(&mut self, character_id: Uuid) {
        let Some(mut leaving) = self.leaving.remove(&character_id) else {
            return;
        };
        travel::close_stream(
            &self.world,
            leaving.session,
            leaving.player,
            SessionLifecycleEffectPlan::PermanentRemoval,
        );
        if let Some(mut agent) = leaving.agent.take() {
            let after = agent.offline_millis();
            self.release(agent, after);
        }
    }

    /// Records what the shard reported since the last pulse.
    fn record_outcomes(&mut self) {
        let mut finals = Vec::new();
        let events = self.shard.take_saver_events();
        self.world.with_ledger(|ledger| {
            for event in &events {
                match *event {
                    SaverEvent::Saved {
                        character_id,
                        reason,
                        new_version,
                        ..
                    } => {
                        if reason.writes_row() {
                            let acked = ledger.acked.entry(character_id).or_insert(new_version);
                            *acked = (*acked).max(new_version);
                        }
                        if reason == SaveReason::Final {
                            finals.push(character_id);
                        }
                    }
                    SaverEvent::FinalDropped { character_id }
                    | SaverEvent::OwnershipLost { character_id, .. }
                    | SaverEvent::NotFound { character_id } => finals.push(character_id),
                    _ => {}
                }
            }
        });
        for id in finals {
            if self.leaving.contains_key(&id) {
                self.finish_logout(id);
            }
        }
        let evictions = self.shard.take_evictions();
        for eviction in &evictions {
            tracing::debug!(event = "sim_evicted", shard = %self.id, character = %eviction.character_id,
                epoch = eviction.evicted_epoch);
            bump(&self.world.counters.evictions);
            if let Some(body) = self.bodies.remove(&eviction.character_id)
                && body.phase != Phase::Ghost
                && let Some(agent) = body.agent
            {
                // A live player's copy was stale (claimed elsewhere): it logs in again.
                self.release(agent, 200);
            }
        }
        let voided = self.shard.take_voided_items();
        if !evictions.is_empty() || !voided.is_empty() {
            self.world.with_ledger(|ledger| {
                ledger.evicted += evictions.len() as u64;
                ledger.voided += voided.len() as u64;
                ledger.destroyed.extend(voided);
            });
        }
    }

    async fn handle(&mut self, message: Inbound) {
        match message {
            Inbound::Login { agent, floor, held } => self.login(agent, floor, held),
            Inbound::Loaded { agent, loaded } => self.admit_login(agent, loaded),
            Inbound::Handoff {
                agent,
                token,
                retained,
                old_session,
                old_player,
            } => travel::arrive(
                &self.world,
                self.id.clone(),
                agent,
                (token, *retained),
                old_session,
                old_player,
            ),
            Inbound::HandoffLoaded {
                agent,
                token,
                loaded,
                old_session,
                old_player,
            } => self.admit_handoff(agent, token, loaded, old_session, old_player),
            Inbound::Zombify { target } => self.zombify(&target),
            Inbound::Kill => self.kill(),
            Inbound::Settle(step) => self.settle(step).await,
        }
    }

    fn login(&mut self, mut agent: Agent, floor: i64, held: bool) {
        let id = agent.character_id;
        let reconnectable = held
            && self
                .bodies
                .get(&id)
                .is_some_and(|b| matches!(b.phase, Phase::LinkDead { .. }) && b.agent.is_none());
        if reconnectable {
            let token = agent.token("session");
            if let Some(admitted) = self.shard.resume(id, &token) {
                travel::start_session(&self.world, &self.id, &agent, &token, &admitted.zone);
                bump(&self.world.counters.resumes);
                let session_end = self.pulse + agent.session_pulses();
                self.bodies.insert(
                    id,
                    Body {
                        agent: Some(agent),
                        phase: Phase::Attached { dead_until: None },
                        session: token,
                        session_end,
                    },
                );
                self.arrived();
                return;
            }
        }
        travel::claim(&self.world, self.id.clone(), agent, floor);
    }

    /// Drops any older copy of a character about to be admitted.
    fn clear_older_copy(&mut self, character_id: Uuid, epoch: i64) {
        if self.shard.residency().contains(character_id) {
            self.shard.evict_if_older(character_id, epoch);
            self.record_outcomes();
        }
    }

    fn admit_login(&mut self, mut agent: Agent, loaded: LoadedCharacter) {
        let id = agent.character_id;
        self.clear_older_copy(id, loaded.snapshot.owner_epoch);
        let token = agent.token("session");
        let arrival = Arrival::Login {
            session_token: token.clone(),
        };
        match self.shard.admit(loaded, arrival) {
            Ok(admitted) => {
                tracing::debug!(event = "sim_login", shard = %self.id, character = %id,
                    source = ?admitted.source, zone = %admitted.zone,
                    epoch = ?self.shard.player(id).map(|e| e.character.owner_epoch));
                travel::start_session(&self.world, &self.id, &agent, &token, &admitted.zone);
                bump(&self.world.counters.logins);
                let session_end = self.pulse + agent.session_pulses();
                self.bodies.insert(
                    id,
                    Body {
                        agent: Some(agent),
                        phase: Phase::Attached { dead_until: None },
                        session: token,
                        session_end,
                    },
                );
                self.arrived();
            }
            Err(err) => {
                tracing::debug!(event = "sim_admit_failed", error = %err);
                travel::go_offline(&self.world, agent, 500);
            }
        }
    }

    fn admit_handoff(
        &mut self,
        mut agent: Agent,
        token: String,
        loaded: LoadedCharacter,
        old_session: String,
        old_player: PlayerSnapshot,
    ) {
        let id = agent.character_id;
        let epoch = loaded.snapshot.owner_epoch;
        self.clear_older_copy(id, epoch);
        let admitted = self.shard.admit(
            loaded,
            Arrival::Handoff {
                handoff_token: token.clone(),
            },
        );
        let session = agent.token("session");
        let redialed = admitted.and_then(|_| self.shard.redial(&token, &session));
        match redialed {
            Ok(admitted) => {
                tracing::debug!(event = "sim_handoff_in", shard = %self.id, character = %id, epoch);
                travel::start_session(&self.world, &self.id, &agent, &session, &admitted.zone);
                travel::confirm_transfer(
                    &self.world,
                    &self.id,
                    &token,
                    &admitted.zone,
                    epoch,
                    old_session,
                    old_player,
                );
                bump(&self.world.counters.handoffs);
                let session_end = self.pulse + agent.session_pulses();
                self.bodies.insert(
                    id,
                    Body {
                        agent: Some(agent),
                        phase: Phase::Attached { dead_until: None },
                        session,
                        session_end,
                    },
                );
                self.arrived();
            }
            Err(err) => {
                tracing::debug!(event = "sim_handoff_admit_failed", error = %err);
                bump(&self.world.counters.handoffs_lost);
                travel::go_offline(&self.world, agent, 500);
            }
        }
    }

    fn zombify(&mut self, target: &str) {
        let candidates: Vec<Uuid> = self
            .bodies
            .iter()
            .filter(|(id, b)| {
                b.phase == (Phase::Attached { dead_until: None })
                    && b.agent.is_some()
                    && !self.shard.has_pending_transfer(**id)
            })
            .map(|(id, _)| *id)
            .collect();
        if candidates.is_empty() {
            return;
        }
        let id = candidates[self.rng.random_range(0..candidates.len())];
        let Some(body) = self.bodies.get_mut(&id) else {
            return;
        };
        let Some(real) = body.agent.take() else {
            return;
        };
        body.agent = Some(real.zombie_copy());
        body.phase = Phase::Ghost;
        tracing::debug!(event = "sim_zombie", shard = %self.id, character = %id, %target);
        bump(&self.world.counters.zombies_made);
        self.world.in_transit.fetch_add(1, Ordering::Relaxed);
        travel::deliver(
            &self.world,
            target,
            Inbound::Login {
                agent: real,
                floor: 0,
                held: false,
            },
        );
    }

    /// Every item id on this shard's floors, containers' contents included.
    fn floor_items(&self) -> Vec<Uuid> {
        let mut ids = Vec::new();
        for zone in self.shard.zones() {
            for floor in &zone.entities.floor {
                floor.item.walk(&mut |i| ids.extend(i.id));
            }
        }
        ids
    }

    fn kill(&mut self) {
        // Everything on this shard dies with it: floors, items between rows, and what its
        // players hold (what is durable elsewhere lives on there).
        let mut destroyed = self.floor_items();
        for zone in self.shard.zones() {
            for entry in zone.players() {
                destroyed.extend(entry.character.items().iter().filter_map(|i| i.id));
            }
        }
        destroyed.extend(self.shard.pending_transfer_items());
        destroyed.extend(self.shard.take_voided_items());
        let stats = self.shard.saver().stats();
        let transfers = self.shard.transfer_counts();
        self.world.with_ledger(|ledger| {
            ledger.destroyed.extend(destroyed);
            add_saver_stats(&mut ledger.saver_gone, &stats);
            ledger.transfers_gone.0 += transfers.0;
            ledger.transfers_gone.1 += transfers.1;
        });
        let bodies = std::mem::take(&mut self.bodies);
        for (_, body) in bodies {
            if body.phase == Phase::Ghost {
                continue;
            }
            if let Some(agent) = body.agent {
                let after = 300 + self.rng.random_range(0..1200);
                self.release(agent, after);
            }
        }
        let leaving = std::mem::take(&mut self.leaving);
        for (_, leaving) in leaving {
            if let Some(agent) = leaving.agent {
                self.release(agent, 500);
            }
        }
        let dead = std::mem::replace(&mut self.shard, boot(&self.world, self.index));
        dead.kill();
        if let Ok(mut live) = self.world.saver_live.lock() {
            live[self.index] = Default::default();
        }
        bump(&self.world.counters.shards_killed);
        tracing::info!(event = "sim_shard_killed", shard = %self.id);
    }

    async fn settle(&mut self, step: SettleStep) {
        match step {
            SettleStep::Reconcile(reply) => {
                self.shard.save_all(SaveReason::Flush);
                let _ = reply.send(());
            }
            SettleStep::RefreshPlacements(reply) => {
                self.shard.refresh_placements();
                self.shard.placement_barrier(Duration::from_secs(5)).await;
                let _ = reply.send(());
            }
            SettleStep::CheckPlacements(reply) => {
                let _ = reply.send(self.check_placements().await);
            }
            SettleStep::Shutdown(reply) => {
                self.shutdown().await;
                let _ = reply.send(());
            }
        }
    }

    /// Live sessions (attached or link-dead) whose placement record is missing or names another
    /// copy, and zombie copies still playing.
    async fn check_placements(&self) -> (u64, Vec<String>) {
        let placement = PlacementStore::new(self.world.env.redis_direct.clone());
        let mut problems = Vec::new();
        let mut checked = 0;
        for (id, body) in &self.bodies {
            let Some(entry) = self.shard.player(*id) else {
                continue;
            };
            if matches!(entry.link, Link::Pending { .. }) {
                continue;
            }
            if body.phase == Phase::Ghost {
                problems.push(format!(
                    "{id}: a zombie copy at epoch {} still plays on {}",
                    entry.character.owner_epoch, self.id
                ));
                continue;
            }
            let Some((zone, _)) = self.shard.location(*id) else {
                continue;
            };
            checked += 1;
            match placement.read(*id).await {
                Ok(Some(record))
                    if record.shard_id.as_deref() == Some(self.id.as_str())
                        && record.zone_id.as_deref() == Some(zone.as_str())
                        && record.owner_epoch == entry.character.owner_epoch => {}
                Ok(other) => problems.push(format!(
                    "{id}: live on {}/{zone} at epoch {}, placement says {other:?}",
                    self.id, entry.character.owner_epoch
                )),
                Err(err) => problems.push(format!("{id}: placement unreadable: {err}")),
            }
        }
        (checked, problems)
    }

    async fn shutdown(&mut self) {
        self.shard.settle_transfers(Duration::from_secs(10)).await;
        self.shard.tick();
        self.record_outcomes();
        let floors = self.floor_items();
        let bodies = std::mem::take(&mut self.bodies);
        for (id, body) in bodies {
            if body.phase != Phase::Ghost
                && let Some(player) = self.player_snapshot(id)
            {
                travel::close_stream(
                    &self.world,
                    body.session,
                    player,
                    SessionLifecycleEffectPlan::PermanentRemoval,
                );
            }
            if body.phase != Phase::Ghost
                && let Some(agent) = body.agent
            {
                self.world.park(agent);
            }
        }
        let leaving: Vec<Uuid> = self.leaving.keys().copied().collect();
        for id in leaving {
            self.finish_logout(id);
        }
        let saver = self.shard.saver().clone();
        let transfers = self.shard.transfer_counts();
        let shard = std::mem::replace(&mut self.shard, boot_idle(&self.world, self.index));
        let report = shard.shutdown(Duration::from_secs(20)).await;
        tracing::info!(event = "sim_shard_shutdown", shard = %self.id, finalized = report.finalized,
            saver = ?report.saver, placement = ?report.placement, auditor = ?report.auditor);
        let stats = saver.stats();
        self.world.with_ledger(|ledger| {
            ledger.end_floors.extend(floors.iter().copied());
            ledger.destroyed.extend(floors);
            add_saver_stats(&mut ledger.saver_gone, &stats);
            ledger.transfers_gone.0 += transfers.0;
            ledger.transfers_gone.1 += transfers.1;
        });
        if let Ok(mut live) = self.world.saver_live.lock() {
            live[self.index] = Default::default();
        }
        self.world.online[self.index].store(0, Ordering::Relaxed);
    }
}

fn shard_config(world: &World, index: usize) -> ShardConfig {
    let zones = &world.shard_zones[index];
    let home = zones.first().map(|z| z.id.clone()).unwrap_or_default();
    let mut config = ShardConfig::new(&World::shard_id(index), &home);
    config.checkpoint_pulses = world.config.checkpoint_pulses;
    config.flush_pulses = world.config.flush_pulses;
    config
}

/// Boots shard `index` with its zones, writing through the proxied stores.
fn boot(world: &World, index: usize) -> Shard {
    Shard::boot(
        shard_config(world, index),
        world.shard_zones[index].clone(),
        Arc::clone(&world.catalog),
        world.env.shard_stores(),
        world.directory.clone(),
    )
}

/// A storeless placeholder that stands in after a shutdown (it hosts no zones).
fn boot_idle(world: &World, index: usize) -> Shard {
    let mut config = shard_config(world, index);
    config.shard_id = format!("{}-stopped", config.shard_id);
    Shard::boot(
        config,
        Vec::new(),
        Arc::clone(&world.catalog),
        Default::default(),
        crate::shard::ZoneDirectory::new(),
    )
}
