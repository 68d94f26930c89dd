//! One shard's task: it owns the [`Shard`], the bodies of the players on it, and their agents.
//! Each pulse the agents act, the shard ticks, and saver outcomes, evictions and voided items are
//! recorded. Messages bring logins, loaded characters, handoffs and faults; settle steps end the
//! run.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus as SimRng;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::agent::Agent;
use super::inbound::{Inbound, SettleStep};
use super::travel;
use super::world::{World, bump};
use shardkeep::character::{HandoffLoad, LoadedCharacter};
use shardkeep::journal::{PlayerSnapshot, SessionLifecycleEffectPlan};
use shardkeep::saver::{SaveReason, SaverEvent};
use shardkeep_reference::game::world::ZoneDef;
use shardkeep_reference::shard::{Arrival, Shard};

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
pub(super) struct Leaving {
    pub(super) agent: Option<Agent>,
    since: u64,
    session: String,
    player: PlayerSnapshot,
    /// What the copy held as it left: only its final save carries these until that save has
    /// an outcome (a shard killed before then takes them with it).
    pub(super) items: Vec<Uuid>,
}

/// Pulses a logout waits for its final save's outcome (longer than the saver's outage budget).
const FINAL_WAIT_PULSES: u64 = 650;
/// How long a login put off by its character's logout save still in flight waits to try again.
const FINAL_WAIT_RETRY_MS: u64 = 250;

/// One shard's task.
pub(super) struct Host {
    pub(super) index: usize,
    pub(super) id: String,
    pub(super) world: Arc<World>,
    pub(super) shard: Shard,
    pub(super) bodies: BTreeMap<Uuid, Body>,
    pub(super) leaving: BTreeMap<Uuid, Leaving>,
    /// Every zone of the world, for exits.
    pub(super) zones: HashMap<String, ZoneDef>,
    inbox: mpsc::UnboundedReceiver<Inbound>,
    pub(super) pulse: u64,
    pub(super) rng: SimRng,
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
            shard: super::host_faults::boot(world, index),
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
                        // What arrived meanwhile finds no shard: handed back as undeliverable.
                        self.inbox.close();
                        while let Ok(message) = self.inbox.try_recv() {
                            travel::undeliverable(&self.world, message);
                        }
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
        if agent.ghost {
            // A zombie's driver never logs in.
            return;
        }
        self.world.in_transit.fetch_add(1, Ordering::Relaxed);
        travel::go_offline(&self.world, agent, after_ms);
    }

    /// Seats an arrived agent's body, attached under `session` for one session's length.
    fn attach(&mut self, id: Uuid, mut agent: Agent, session: String) {
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

    /// An agent arrived on this host.
    fn arrived(&self) {
        self.world.in_transit.fetch_sub(1, Ordering::Relaxed);
    }

    /// The owner epoch of the copy of `id` held here (0 when none is).
    fn epoch_of(&self, id: Uuid) -> i64 {
        self.shard.player(id).map_or(0, |p| p.character.owner_epoch)
    }

    /// The journal's view of a held player.
    pub(super) fn player_snapshot(&self, character_id: Uuid) -> Option<PlayerSnapshot> {
        let entry = self.shard.player(character_id)?;
        let (zone, room) = self.shard.durable_location(character_id)?;
        Some(PlayerSnapshot {
            character_id,
            account_id: entry.character.account_id,
            character_name: entry.character.name.clone(),
            shard_id: self.id.clone(),
            zone,
            room,
            owner_epoch: entry.character.owner_epoch,
            state_version: Some(entry.character.state_version),
        })
    }

    /// A clean logout: the final save is queued; the session closes once it has an outcome.
    pub(super) fn log_out(&mut self, character_id: Uuid, body: Body) {
        let Some(player) = self.player_snapshot(character_id) else {
            return;
        };
        let items = self
            .shard
            .player(character_id)
            .map(|e| e.character.items().iter().filter_map(|i| i.id).collect())
            .unwrap_or_default();
        if self.shard.logout(character_id).is_err() {
            return;
        }
        tracing::debug!(event = "sim_logout", shard = %self.id, character = %character_id,
            epoch = player.owner_epoch);
        bump(&self.world.counters.logouts);
        self.leaving.insert(
            character_id,
            Leaving {
                agent: body.agent,
                since: self.pulse,
                session: body.session,
                player,
                items,
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
        // A logout that waited for its item transfer left with what its copy held then (an
        // item handed over or given back meanwhile): its final carries that too.
        for (id, epoch, items) in self.shard.take_departed_after_transfer() {
            if let Some(leaving) = self
                .leaving
                .get_mut(&id)
                .filter(|l| l.player.owner_epoch == epoch)
            {
                for item in items {
                    if !leaving.items.contains(&item) {
                        leaving.items.push(item);
                    }
                }
            }
        }
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

    pub(super) fn finish_logout(&mut self, character_id: Uuid) {
        let Some(mut leaving) = self.leaving.remove(&character_id) else {
            return;
        };
        tracing::debug!(event = "sim_logout_done", shard = %self.id, character = %character_id);
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
    pub(super) fn record_outcomes(&mut self) {
        let mut finals = Vec::new();
        let events = self.shard.take_saver_events();
        for event in &events {
            let routine = matches!(event, SaverEvent::Saved { reason, .. } if !reason.writes_row());
            if !routine {
                tracing::debug!(event = "sim_saver_event", shard = %self.id, outcome = ?event);
            }
        }
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
                    SaverEvent::FinalDropped { character_id, .. }
                    | SaverEvent::FinalQueuedAsJob { character_id, .. }
                    | SaverEvent::OwnershipLost { character_id, .. }
                    | SaverEvent::NotFound { character_id, .. } => finals.push(character_id),
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
        let decayed = self.shard.take_decayed_items();
        self.world
            .counters
            .floor_items_decayed
            .fetch_add(decayed.len() as u64, std::sync::atomic::Ordering::Relaxed);
        if !evictions.is_empty() || !voided.is_empty() || !decayed.is_empty() {
            self.world.with_ledger(|ledger| {
                ledger.evicted += evictions.len() as u64;
                ledger.voided += voided.len() as u64;
                ledger.destroyed.extend(voided);
                ledger.destroyed.extend(decayed);
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
            } => self.admit_handoff(agent, token, *loaded, old_session, old_player),
            Inbound::Zombify { target } => self.zombify(&target),
            Inbound::Kill { quiet } => self.kill(quiet),
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
                let epoch = self.epoch_of(id);
                travel::start_session(
                    &self.world,
                    &self.id,
                    &agent,
                    (&token, epoch),
                    &admitted.zone,
                );
                bump(&self.world.counters.resumes);
                self.attach(id, agent, token);
                return;
            }
        }
        let link_dead_here = self
            .bodies
            .get(&id)
            .is_some_and(|b| matches!(b.phase, Phase::LinkDead { .. }));
        if self.shard.final_save_in_flight(id) || link_dead_here {
            // The last session's copy is still here (link-dead, its placement unreadable) or its
            // logout is still saving: claiming now would load the older row and fence that copy's
            // save out. The player tries again shortly. (A zombie's ghost is no such copy: the
            // claim supersedes it.)
            bump(&self.world.counters.logins_waiting_for_last_copy);
            travel::go_offline(&self.world, agent, FINAL_WAIT_RETRY_MS);
            return;
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
                let epoch = self.epoch_of(id);
                travel::start_session(
                    &self.world,
                    &self.id,
                    &agent,
                    (&token, epoch),
                    &admitted.zone,
                );
                bump(&self.world.counters.logins);
                self.attach(id, agent, token);
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
        load: HandoffLoad,
        old_session: String,
        old_player: PlayerSnapshot,
    ) {
        let superseded = load.is_superseded();
        if superseded {
            bump(&self.world.counters.handoffs_superseded);
        }
        let loaded = load.into_loaded();
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
                tracing::debug!(event = "sim_handoff_in", shard = %self.id, character = %id, epoch, %token);
                travel::start_session(
                    &self.world,
                    &self.id,
                    &agent,
                    (&session, epoch),
                    &admitted.zone,
                );
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
                if !agent.ghost {
                    return self.attach(id, agent, session);
                }
                let body = Body {
                    agent: Some(agent),
                    phase: Phase::Ghost,
                    session,
                    session_end: self.pulse,
                };
                if superseded {
                    // A zombie's handoff was refused: the destination loaded the durable copy
                    // under a new epoch, and the zombie's session leaves at once. The copy that
                    // played on elsewhere meets the new epoch at its next save.
                    self.log_out(id, body);
                } else {
                    // Adopted before the real login's claim landed: it plays on as a zombie
                    // until that claim fences it.
                    self.bodies.insert(id, body);
                }
            }
            Err(err) => {
                tracing::debug!(event = "sim_handoff_admit_failed", error = %err);
                bump(&self.world.counters.handoffs_lost);
                travel::abandon_transfer(&self.world, token);
                travel::go_offline(&self.world, agent, 500);
            }
        }
    }
}
