//! One shard's task: it owns the [`LiveShard`] (the reference shard on the live-copy runtime),
//! the bodies of the players on it, and their agents. Each pulse the agents act, the shard
//! ticks, and evictions, lapsed link-dead copies and voided items are recorded. Messages bring
//! logins, admitted characters, handoffs and faults; settle steps end the run.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus as SimRng;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::agent::Agent;
use super::inbound::{Inbound, SettleStep};
use super::observer::SimObserver;
use super::travel;
use super::world::{World, bump};
use shardkeep::character::LoadSource;
use shardkeep::live::{Admitted, LoggedOut};
use shardkeep_reference::game::world::ZoneDef;
use shardkeep_reference::live_shard::{Gone, LiveShard};

/// Where a body is in its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Playing; dead until the pulse given.
    Attached { dead_until: Option<u64> },
    /// The connection dropped: the runtime keeps the copy for its link-dead grace.
    LinkDead,
    /// A zombie copy that keeps playing.
    Ghost,
}

/// A player held on this shard.
pub(super) struct Body {
    /// The agent driving it (`None` while link-dead: the agent is reconnecting).
    pub(super) agent: Option<Agent>,
    pub(super) phase: Phase,
    pub(super) session_end: u64,
}

/// A player whose logout waits for its final save.
pub(super) struct Leaving {
    pub(super) agent: Option<Agent>,
    since: u64,
    out: LoggedOut,
    /// What the copy held as it left: only its final save carries these until that save has
    /// an outcome (a shard killed before then takes them with it).
    pub(super) items: Vec<Uuid>,
}

/// Pulses a logout waits for its final save's outcome (longer than the saver's outage budget).
const FINAL_WAIT_PULSES: u64 = 650;

/// One shard's task.
pub(super) struct Host {
    pub(super) index: usize,
    pub(super) id: String,
    pub(super) world: Arc<World>,
    pub(super) shard: LiveShard,
    /// What the shard's runtime reports (a new one per boot).
    pub(super) observer: Arc<SimObserver>,
    pub(super) bodies: BTreeMap<Uuid, Body>,
    pub(super) leaving: BTreeMap<Uuid, Leaving>,
    /// The session each player here was last admitted under (its connection's, for a detach).
    pub(super) sessions: HashMap<Uuid, String>,
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
        let (shard, observer) = super::host_faults::boot(world, index, false);
        Self {
            shard,
            observer,
            index,
            id,
            world: Arc::clone(world),
            bodies: BTreeMap::new(),
            leaving: BTreeMap::new(),
            sessions: HashMap::new(),
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
                live[self.index] = self.shard.runtime().saver().stats();
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

    /// Seats an arrived agent's body, attached for one session's length.
    fn attach(&mut self, id: Uuid, mut agent: Agent) {
        let session_end = self.pulse + agent.session_pulses();
        self.bodies.insert(
            id,
            Body {
                agent: Some(agent),
                phase: Phase::Attached { dead_until: None },
                session_end,
            },
        );
        self.arrived();
    }

    /// An agent arrived on this host.
    fn arrived(&self) {
        self.world.in_transit.fetch_sub(1, Ordering::Relaxed);
    }

    /// Every item the copy of `id` held here holds (worn, carried, in containers).
    pub(super) fn items_of(&self, id: Uuid) -> Vec<Uuid> {
        self.shard
            .read(id, |c| c.items().iter().filter_map(|i| i.id).collect())
            .unwrap_or_default()
    }

    /// A clean logout: the runtime saves the copy; the agent leaves once the save has an
    /// outcome. An item transfer of the character in flight puts it off: the body comes back
    /// (a later turn tries again).
    pub(super) fn log_out(&mut self, character_id: Uuid, body: Body) -> Option<Body> {
        let items = self.items_of(character_id);
        let epoch = self.shard.copy_of(character_id).map(|c| c.owner_epoch);
        let Ok(out) = self.shard.logout(character_id) else {
            return Some(body);
        };
        tracing::debug!(event = "sim_logout", shard = %self.id, character = %character_id, ?epoch);
        bump(&self.world.counters.logouts);
        self.leaving.insert(
            character_id,
            Leaving {
                agent: body.agent,
                since: self.pulse,
                out,
                items,
            },
        );
        None
    }

    fn finish_logouts(&mut self) {
        let pulse = self.pulse;
        let done: Vec<Uuid> = self
            .leaving
            .iter_mut()
            .filter_map(|(id, l)| {
                let over = l.out.outcome().is_some() || pulse >= l.since + FINAL_WAIT_PULSES;
                over.then_some(*id)
            })
            .collect();
        for id in done {
            self.finish_logout(id);
        }
    }

    pub(super) fn finish_logout(&mut self, character_id: Uuid) {
        let Some(mut leaving) = self.leaving.remove(&character_id) else {
            return;
        };
        tracing::debug!(event = "sim_logout_done", shard = %self.id, character = %character_id,
            outcome = ?leaving.out.outcome());
        if let Some(mut agent) = leaving.agent.take() {
            let after = agent.offline_millis();
            self.release(agent, after);
        }
    }

    /// Records what the shard reported since the last pulse.
    pub(super) fn record_outcomes(&mut self) {
        let mut evicted = 0;
        for (copy, why) in self.shard.take_gone() {
            let id = copy.character_id;
            match why {
                Gone::Evicted => {
                    tracing::debug!(event = "sim_evicted", shard = %self.id, character = %id,
                        epoch = copy.owner_epoch);
                    bump(&self.world.counters.evictions);
                    evicted += 1;
                }
                Gone::LinkDeadExpired => bump(&self.world.counters.linkdead_timeouts),
            }
            if let Some(body) = self.bodies.remove(&id)
                && body.phase != Phase::Ghost
                && let Some(agent) = body.agent
            {
                // A live player's copy was stale (claimed elsewhere), or its grace ran out
                // while its agent still played: it logs in again.
                self.release(agent, 200);
            }
        }
        let voided = self.shard.take_voided_items();
        let decayed = self.shard.take_decayed_items();
        self.world
            .counters
            .floor_items_decayed
            .fetch_add(decayed.len() as u64, std::sync::atomic::Ordering::Relaxed);
        if evicted > 0 || !voided.is_empty() || !decayed.is_empty() {
            self.world.with_ledger(|ledger| {
                ledger.evicted += evicted;
                ledger.voided += voided.len() as u64;
                ledger.destroyed.extend(voided);
                ledger.destroyed.extend(decayed);
            });
        }
    }

    async fn handle(&mut self, message: Inbound) {
        match message {
            Inbound::Login { agent } => travel::admit(
                &self.world,
                self.shard.runtime().clone(),
                self.id.clone(),
                agent,
            ),
            Inbound::Admitted { agent, admitted } => self.admit_login(agent, admitted),
            Inbound::Handoff {
                agent,
                token,
                dumped_under,
            } => travel::arrive(
                &self.world,
                self.shard.runtime().clone(),
                self.id.clone(),
                agent,
                (token, dumped_under),
            ),
            Inbound::Arrived {
                agent,
                token,
                admitted,
            } => self.admit_handoff(agent, token, admitted),
            Inbound::Zombify { target } => self.zombify(&target),
            Inbound::Kill { quiet } => self.kill(quiet),
            Inbound::Settle(step) => self.settle(step).await,
        }
    }

    fn admit_login(&mut self, agent: Agent, admitted: Admitted) {
        let id = agent.character_id;
        let resumed = admitted.resumed.is_some();
        match self.shard.enter(admitted) {
            Ok(entered) => {
                tracing::debug!(event = "sim_login", shard = %self.id, character = %id,
                    source = ?entered.admitted.source, zone = %entered.zone, resumed,
                    epoch = entered.admitted.copy.owner_epoch);
                if !resumed {
                    bump(&self.world.counters.logins);
                }
                self.sessions.insert(id, entered.admitted.session_token);
                self.attach(id, agent);
            }
            Err(err) => {
                tracing::debug!(event = "sim_admit_failed", error = %err);
                travel::go_offline(&self.world, agent, 500);
            }
        }
    }

    fn admit_handoff(&mut self, agent: Agent, token: String, admitted: Admitted) {
        let id = agent.character_id;
        let superseded = admitted.source != Some(LoadSource::Handoff);
        let epoch = admitted.copy.owner_epoch;
        match self.shard.enter(admitted) {
            Ok(entered) => {
                self.sessions.insert(id, entered.admitted.session_token);
                tracing::debug!(event = "sim_handoff_in", shard = %self.id, character = %id, epoch);
                bump(&self.world.counters.handoffs);
                if !agent.ghost {
                    return self.attach(id, agent);
                }
                let body = Body {
                    agent: Some(agent),
                    phase: Phase::Ghost,
                    session_end: self.pulse,
                };
                if superseded {
                    // A zombie's handoff was refused: the destination loaded the durable copy
                    // under a new epoch, and the zombie's session leaves at once. The copy that
                    // played on elsewhere meets the new epoch at its next save.
                    if let Some(body) = self.log_out(id, body) {
                        self.bodies.insert(id, body);
                    }
                } else {
                    // Adopted before the real login's claim landed: it plays on as a zombie
                    // until that claim fences it.
                    self.bodies.insert(id, body);
                }
            }
            Err(err) => {
                // Taken by a runtime killed since (its activation never marked): the transfer
                // ends here, and the player logs in again.
                tracing::debug!(event = "sim_handoff_admit_failed", error = %err);
                bump(&self.world.counters.handoffs_lost);
                travel::abandon_transfer(&self.world, token);
                travel::go_offline(&self.world, agent, 500);
            }
        }
    }
}
