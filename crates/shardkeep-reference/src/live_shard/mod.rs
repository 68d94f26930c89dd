//! The reference shard playing through the live-copy runtime: the zones it hosts, their rooms,
//! floors and mobiles, and where each player stands. The characters themselves live in a
//! [`Runtime`] of the [`ReferenceGame`], which owns every durability rule — the claim and the
//! load, the save cadences, the saver's answers, logouts, sessions, handoffs and item
//! transfers — so this shard keeps only what a player does.
//!
//! It is a tick-driven host: [`LiveShard::tick`] pulses the runtime (its cadences stay in step
//! with the zones) and never waits on I/O; a pickup that must commit as a transfer, and a walk
//! into a zone another shard hosts, run as tasks whose answers the next tick takes in. The calls
//! that wait (a login, an arrival, a shutdown) are `async`.
//!
//! - `moves` — entering (after a login or an arrival), logout, detach, walks and handoffs.
//! - `items` — drops and pickups, with the runtime deciding which pickups commit as transfers.
//! - `timers` — affects and cooldowns run down lazily: a pulse visits only the players whose
//!   timer runs out on it.
//!
//! The simulator and the capacity benchmark play their shards through it.

mod items;
mod moves;
mod timers;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};
use uuid::Uuid;

use crate::game::world::{FloorItem, ZoneDef, ZoneEntities, run_resets};
use crate::game::{Catalog, LiveCharacter};
use crate::shard::{ReferenceGame, ZoneDirectory};
use shardkeep::Services;
use shardkeep::live::{CopyId, LiveConfig, LiveError, LiveEvent, Runtime, StartError};

pub use items::{ActionError, Pickup};
pub use moves::{Departure, Entered, Walk};

/// Tunables of a shard on the runtime.
#[derive(Debug, Clone)]
pub struct LiveShardConfig {
    /// The runtime's (its shard id is this shard's; `own_pulse` is turned off: the shard's
    /// tick pulses it).
    pub live: LiveConfig,
    /// Zone for brand-new characters and for players saved in a zone not hosted here.
    pub home_zone: String,
    /// Pulses an item put down stays on the floor before it decays (`None`: until picked up).
    pub floor_lifetime_pulses: Option<u64>,
    /// Ticks after boot that do not pulse the runtime (0: none), so its cadences save nothing
    /// yet: the simulator's double crash boots a replacement so, to kill it before its first
    /// write.
    pub quiet_pulses: u64,
    /// Told what the runtime reports of the copies' writes, streams and handoffs.
    pub observer: Option<Arc<dyn crate::shard::Observer>>,
}

impl LiveShardConfig {
    /// Defaults for shard `shard_id` whose home is `home_zone`.
    pub fn new(shard_id: &str, home_zone: &str) -> Self {
        Self {
            live: LiveConfig::new(shard_id),
            home_zone: home_zone.to_owned(),
            floor_lifetime_pulses: None,
            quiet_pulses: 0,
            observer: None,
        }
    }
}

/// A shard could not boot.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The zones are refused (the home zone is not among them, or is an instance).
    #[error("zones: {0}")]
    Zones(String),
    /// The runtime refused its configuration.
    #[error(transparent)]
    Start(#[from] StartError),
}

/// A zone hosted here: its definition and its ephemeral entities.
#[derive(Debug)]
pub(crate) struct HostedZone {
    pub(crate) def: Arc<ZoneDef>,
    pub(crate) entities: ZoneEntities,
}

/// Where a player held here stands, and which copy of its character it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resident {
    pub(crate) copy: CopyId,
    pub(crate) zone: String,
    pub(crate) room: String,
    /// The pulse its next affect or cooldown runs out on (`None`: none runs).
    pub(crate) timer_due: Option<u64>,
}

/// Pulses between two sweeps of the floors for decayed items.
const FLOOR_SWEEP_PULSES: u64 = 20;

/// One shard of the reference game on the live-copy runtime.
pub struct LiveShard {
    runtime: Runtime<ReferenceGame>,
    catalog: Arc<Catalog>,
    directory: ZoneDirectory,
    zones: BTreeMap<String, HostedZone>,
    residents: HashMap<Uuid, Resident>,
    events: broadcast::Receiver<LiveEvent>,
    floor_lifetime: Option<u64>,
    quiet_pulses: u64,
    pickups: (
        mpsc::UnboundedSender<items::Answer>,
        mpsc::UnboundedReceiver<items::Answer>,
    ),
    /// Items of pickups whose transfers have not answered: held by neither side.
    in_flight: Vec<crate::game::Item>,
    /// Transfers handed over (committed) and given back or voided, so far.
    transfer_counts: (u64, u64),
    /// Characters with a pickup's transfer started here and not answered yet.
    transferring: HashSet<Uuid>,
    departures: (
        mpsc::UnboundedSender<moves::Departed>,
        mpsc::UnboundedReceiver<moves::Departed>,
    ),
    /// Players on their way to another shard, by character, until their handoff answers.
    departing: HashMap<Uuid, Resident>,
    voided_items: Vec<Uuid>,
    decayed_items: Vec<Uuid>,
    gone: Vec<(CopyId, Gone)>,
    pulse: u64,
    /// Players by the pulse their next timer runs out on, earliest first (an entry whose pulse
    /// is no longer the player's `timer_due` is stale and skipped).
    timers: BinaryHeap<Reverse<(u64, Uuid)>>,
}

/// Why a player left this shard without a logout of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gone {
    /// Evicted: another copy owns the character (a zombie removed without a save).
    Evicted,
    /// Its link-dead grace ran out: the runtime logged it out, saved.
    LinkDeadExpired,
}

impl std::fmt::Debug for LiveShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveShard")
            .field("shard_id", &self.runtime.shard_id())
            .field("zones", &self.zones.keys().collect::<Vec<_>>())
            .field("residents", &self.residents.len())
            .finish_non_exhaustive()
    }
}

impl LiveShard {
    /// Boots a shard hosting `zones` over `services` (whose model must be the reference
    /// game's): registers the zones in the directory, runs their resets and starts the runtime,
    /// pulsed by [`LiveShard::tick`]. Must run inside a tokio runtime.
    pub fn boot(
        services: &Services,
        config: LiveShardConfig,
        zones: Vec<ZoneDef>,
        catalog: Arc<Catalog>,
        directory: ZoneDirectory,
    ) -> Result<Self, BootError> {
        let mut game = ReferenceGame::new(Arc::clone(&catalog), zones.clone(), &config.home_zone)
            .map_err(BootError::Zones)?;
        if let Some(observer) = config.observer {
            game = game.observed_by(observer);
        }
        let mut live = config.live;
        live.own_pulse = false;
        let shard_id = live.shard_id.clone();
        let runtime = Runtime::start(services, game, live)?;
        let mut hosted = BTreeMap::new();
        for def in zones {
            directory.assign(&def.id, &shard_id);
            let mut entities = ZoneEntities::default();
            run_resets(&def, &mut entities, &catalog);
            hosted.insert(
                def.id.clone(),
                HostedZone {
                    def: Arc::new(def),
                    entities,
                },
            );
        }
        Ok(Self {
            events: runtime.subscribe(),
            runtime,
            catalog,
            directory,
            zones: hosted,
            residents: HashMap::new(),
            floor_lifetime: config.floor_lifetime_pulses,
            quiet_pulses: config.quiet_pulses,
            pickups: mpsc::unbounded_channel(),
            in_flight: Vec::new(),
            transfer_counts: (0, 0),
            transferring: HashSet::new(),
            departures: mpsc::unbounded_channel(),
            departing: HashMap::new(),
            voided_items: Vec::new(),
            decayed_items: Vec::new(),
            gone: Vec::new(),
            pulse: 0,
            timers: BinaryHeap::new(),
        })
    }

    /// This shard's id.
    pub fn id(&self) -> &str {
        self.runtime.shard_id()
    }

    /// The runtime holding this shard's characters (for the calls that wait on a store, run
    /// off the tick: a login's claim, an arrival).
    pub fn runtime(&self) -> &Runtime<ReferenceGame> {
        &self.runtime
    }

    /// Pulses run so far.
    pub fn pulse_count(&self) -> u64 {
        self.pulse
    }

    /// The copy of `character_id` playing here, if any.
    pub fn copy_of(&self, character_id: Uuid) -> Option<CopyId> {
        self.residents.get(&character_id).map(|r| r.copy)
    }

    /// Ids of every player held here.
    pub fn players(&self) -> Vec<Uuid> {
        self.residents.keys().copied().collect()
    }

    /// Where `character_id` stands: zone and room.
    pub fn location(&self, character_id: Uuid) -> Option<(String, String)> {
        self.residents
            .get(&character_id)
            .map(|r| (r.zone.clone(), r.room.clone()))
    }

    /// Reads the live character of a player held here, its timers as of this pulse.
    pub fn read<T>(
        &self,
        character_id: Uuid,
        f: impl FnOnce(&LiveCharacter) -> T,
    ) -> Result<T, ActionError> {
        let copy = self.resident(character_id)?.copy;
        // Its timers as of this pulse (catching up moves no expiry: the schedule stands).
        let now = self.pulse;
        self.runtime
            .update(copy, |c| {
                timers::catch_up(c, now);
                f(c)
            })
            .map_err(|_| ActionError::NotHere(character_id))
    }

    /// Every zone hosted here with what lies on its floors.
    pub fn floors(&self) -> impl Iterator<Item = (&ZoneDef, &[FloorItem])> {
        self.zones
            .values()
            .map(|z| (z.def.as_ref(), z.entities.floor.as_slice()))
    }

    /// Every item a copy held by this shard's runtime holds: the players on the map, those
    /// link-dead, and those on their way to another shard whose handoff has not left yet (what
    /// a crash now takes with it, unless a row, a checkpoint or a handoff already holds it).
    pub fn held_items(&self) -> Vec<Uuid> {
        let mut ids = Vec::new();
        for copy in self.runtime.copies() {
            let _ = self.runtime.read(copy, |c| {
                ids.extend(c.items().iter().filter_map(|i| i.id));
            });
        }
        ids
    }

    /// Items whose pickups' transfers have not answered yet (held by neither side: a crash
    /// now loses them unless a row already holds them).
    pub fn items_in_transfer(&self) -> Vec<Uuid> {
        let mut ids = Vec::new();
        for item in &self.in_flight {
            item.walk(&mut |i| ids.extend(i.id));
        }
        ids
    }

    /// Transfers committed, and given back or voided, so far.
    pub fn transfer_counts(&self) -> (u64, u64) {
        self.transfer_counts
    }

    /// Why players left without a logout of their own since the last call.
    pub fn take_gone(&mut self) -> Vec<(CopyId, Gone)> {
        std::mem::take(&mut self.gone)
    }

    /// Item ids destroyed since the last call: what evicted copies held or put down, and what a
    /// transfer voided.
    pub fn take_voided_items(&mut self) -> Vec<Uuid> {
        std::mem::take(&mut self.voided_items)
    }

    /// Item ids that decayed on the floors since the last call.
    pub fn take_decayed_items(&mut self) -> Vec<Uuid> {
        std::mem::take(&mut self.decayed_items)
    }

    /// Runs one pulse: the answers of pickups and handoffs taken in, players the runtime
    /// removed taken off the map, the runtime pulsed (its cadences, deferred logouts, link-dead
    /// graces), timers advanced, zones reset and floors swept. Never waits on I/O.
    pub fn tick(&mut self) {
        self.pulse += 1;
        self.runtime.game().set_pulse(self.pulse);
        self.take_pickup_answers();
        self.take_departures();
        self.take_runtime_news();
        if self.pulse > self.quiet_pulses {
            self.runtime.pulse();
        }
        self.run_timers();
        let pulse = self.pulse;
        for zone in self.zones.values_mut() {
            let repop = u64::from(zone.def.repop_pulses.max(1));
            if pulse.is_multiple_of(repop) {
                run_resets(&zone.def, &mut zone.entities, &self.catalog);
            }
        }
        if let Some(lifetime) = self.floor_lifetime
            && pulse.is_multiple_of(FLOOR_SWEEP_PULSES)
        {
            self.decay_floors(lifetime);
        }
    }

    /// Takes off the map the players the runtime removed on its own: evicted copies (what they
    /// held and put down leaves the world) and link-dead copies whose grace ran out.
    fn take_runtime_news(&mut self) {
        for evicted in self.runtime.game().take_evicted() {
            self.voided_items.extend(evicted.items);
            self.void_released_by(evicted.copy);
        }
        loop {
            match self.events.try_recv() {
                Ok(LiveEvent::Evicted { copy, .. }) => self.forget(copy, Gone::Evicted),
                Ok(LiveEvent::LinkDeadExpired { copy }) => {
                    self.forget(copy, Gone::LinkDeadExpired);
                }
                Err(broadcast::error::TryRecvError::Lagged(_)) => self.reconcile(),
                Err(_) => break,
            }
        }
    }

    /// Forgets a player whose copy `copy` the runtime removed (a later copy of the character
    /// that entered since stays).
    fn forget(&mut self, copy: CopyId, why: Gone) {
        if self
            .residents
            .get(&copy.character_id)
            .is_some_and(|r| r.copy == copy)
        {
            self.residents.remove(&copy.character_id);
            self.gone.push((copy, why));
        }
    }

    /// After missed news: forgets every player whose copy the runtime no longer holds.
    fn reconcile(&mut self) {
        let lost: Vec<CopyId> = self
            .residents
            .values()
            .map(|r| r.copy)
            .filter(|copy| self.runtime.copy_of(copy.character_id) != Some(*copy))
            .collect();
        for copy in lost {
            self.forget(copy, Gone::Evicted);
        }
    }

    fn resident(&self, character_id: Uuid) -> Result<&Resident, ActionError> {
        self.residents
            .get(&character_id)
            .ok_or(ActionError::NotHere(character_id))
    }

    /// Waits, at most `bound`, until every pickup and handoff started here has answered, then
    /// takes the answers in (a drain before shutdown, or a test's settle).
    pub async fn settle(&mut self, bound: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            self.take_pickup_answers();
            self.take_departures();
            if self.in_flight.is_empty() && self.departing.is_empty() {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Graceful shutdown: pickups and handoffs answer first (within `bound`), then the runtime
    /// logs every player out and waits for the final saves, journal entries and placements.
    /// Nobody plays here afterwards.
    pub async fn shutdown(&mut self, bound: Duration) -> shardkeep::live::ShutdownReport {
        if !self.settle(bound).await {
            tracing::warn!(
                event = "shutdown_unsettled",
                pickups = self.in_flight.len(),
                handoffs = self.departing.len(),
                "pickups or handoffs still wait for their answers"
            );
        }
        let report = self.runtime.clone().shutdown(bound).await;
        self.residents.clear();
        report
    }

    /// True while an item transfer of `character_id` started here has not answered (its
    /// logout, handoff and saves wait for it).
    pub fn in_transfer(&self, character_id: Uuid) -> bool {
        self.transferring.contains(&character_id) || self.runtime.in_transfer(character_id)
    }

    /// Stops everything at once without saving (a crash).
    pub fn kill(self) {
        self.runtime.kill();
    }
}

impl From<LiveError> for ActionError {
    fn from(err: LiveError) -> Self {
        match err {
            LiveError::Gone(copy) => Self::NotHere(copy.character_id),
            LiveError::TransferPending(id) => Self::TransferPending(id),
            other => Self::Runtime(other.to_string()),
        }
    }
}
