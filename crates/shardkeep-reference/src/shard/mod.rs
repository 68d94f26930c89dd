//! A shard at runtime: the zones it hosts, the players in them, the pulse that drives cadences,
//! and the saver and placement writer behind it. Everything here runs on the shard's own thread
//! and never waits on I/O: saves and placement updates are queued, and their outcomes come back
//! as events handled on the next pulse.
//!
//! - [`zone`] — a zone's players and entities; the only writers of the residency index.
//! - [`residency`] — character → zone, for reconnect routing and the saver's presence probe.
//! - [`landing`] — where a returning player lands (pure).
//! - [`directory`] — which shard owns each zone now.
//! - [`gate`] — which shard a login goes to, and its claim's epoch floor.
//! - `actions` — item moves with transfer detection, deaths, advancement; audited.
//! - `sessions` — login admission, handoff re-dial, resume, detach, logout, walks, shutdown.

mod actions;
pub mod directory;
mod feedback;
pub mod gate;
pub mod landing;
pub mod live_game;
pub mod residency;
mod sessions;
mod transfer;
pub mod zone;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::game::world::{ZoneDef, run_resets};
use crate::game::{Catalog, LiveCharacter};
use shardkeep::audit::{Auditor, AuditorConfig};
use shardkeep::character::{CharacterStore, CheckpointStore};
use shardkeep::placement::{PlacementRecord, PlacementStore, PlacementWriter};
use shardkeep::saver::{SaveReason, Saver, SaverConfig, SaverEvent, SaverSinks};

pub use actions::ActionError;
pub use directory::ZoneDirectory;
pub use landing::LandingCase;
pub use live_game::{EvictedCopy, Observer, ReferenceGame};
pub use residency::ResidencyIndex;
pub use sessions::{
    AdmitError, Admitted, Arrival, MAX_DEFERRED_FINALS, OutboundHandoff, SHUTDOWN_FINAL_SLICE,
    ShutdownReport, WalkOutcome,
};
pub use zone::{Link, PlayerEntry, ZoneRuntime};

/// Pulse length of the reference server.
pub const PULSE: Duration = Duration::from_millis(250);

/// The stores a shard writes to; any may be absent (a storeless shard is ephemeral).
#[derive(Debug, Clone, Default)]
pub struct ShardStores {
    /// Postgres character rows.
    pub characters: Option<CharacterStore>,
    /// Redis checkpoints.
    pub checkpoints: Option<CheckpointStore>,
    /// Redis placement records.
    pub placement: Option<PlacementStore>,
    /// The audit trail (`None`: auditing disabled).
    pub audit: Option<shardkeep::audit::AuditStore>,
    /// Retry jobs: where a logout save that outlasts a Postgres outage goes (`None`: such a
    /// save is given up, and only its checkpoint keeps it).
    pub retry: Option<shardkeep::retry::RetryQueue>,
}

/// Tunables of one shard.
#[derive(Debug, Clone)]
pub struct ShardConfig {
    /// This shard's id.
    pub shard_id: String,
    /// Zone for brand-new characters and unhosted zone refs.
    pub home_zone: String,
    /// Pulses between checkpoints (40 × 250 ms ≈ 10 s).
    pub checkpoint_pulses: u64,
    /// Pulses between flushes (240 × 250 ms ≈ 60 s).
    pub flush_pulses: u64,
    /// The saver's tunables.
    pub saver: SaverConfig,
    /// Placement updates that may wait.
    pub placement_depth: usize,
    /// Saver events that may wait for the next pulse.
    pub event_depth: usize,
    /// How long an item transfer retries a commit whose outcome is unknown (a store outage)
    /// before the item is voided, on the record; meanwhile it is held by neither side.
    pub transfer_budget: Duration,
    /// The embedding application's stop signal: once it is cancelled the shard's background
    /// writers (saver, placement writer, auditor) stop as they do on [`Shard::kill`]. Without
    /// one, they run until the shard is shut down or killed, and a dropped shard's writers
    /// still write what was queued.
    pub stop_with: Option<CancellationToken>,
    /// Pulses an item put down on a floor (or into a container lying there) stays before it
    /// decays (`None`: it stays until picked up). A floor copy lives in shard memory only; a
    /// lifetime bounds how long after its release a pickup can still commit it, which the
    /// item-load ledger's retention must exceed.
    pub floor_lifetime_pulses: Option<u64>,
    /// Pulses after boot on which the cadences save nothing (0: none). The simulator's double
    /// crash boots a replacement so, to kill it before its first write.
    pub quiet_pulses: u64,
}

/// Pulses between two sweeps of the floors for decayed items.
const FLOOR_SWEEP_PULSES: u64 = 20;

impl ShardConfig {
    /// Defaults for a shard called `shard_id` whose home is `home_zone`.
    pub fn new(shard_id: &str, home_zone: &str) -> Self {
        Self {
            shard_id: shard_id.to_owned(),
            home_zone: home_zone.to_owned(),
            checkpoint_pulses: 40,
            flush_pulses: 240,
            saver: SaverConfig::default(),
            placement_depth: 4096,
            event_depth: 8192,
            transfer_budget: Duration::from_secs(30),
            stop_with: None,
            floor_lifetime_pulses: None,
            quiet_pulses: 0,
        }
    }
}

/// Why a copy of a character was evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionCause {
    /// The row's epoch moved past this copy's.
    OwnershipLost {
        /// The row's epoch.
        current_epoch: i64,
    },
    /// The checkpoint tier holds a newer owner's copy.
    DoubleOwn {
        /// The checkpoint's epoch.
        stored_epoch: i64,
    },
    /// A process with a newer model wrote the character: this copy must not write over it.
    SchemaOutdated {
        /// The schema version stored.
        stored_schema: u32,
    },
}

/// A zombie copy the shard removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    /// The character.
    pub character_id: Uuid,
    /// This copy's epoch.
    pub evicted_epoch: i64,
    /// Why.
    pub cause: EvictionCause,
}

/// The durable location of a player standing in `zone`: where it stands, or inside an instance
/// the entrance it came from (its anchor). `None` only for an instance entered without one, where
/// a save then keeps the stored location.
fn durable_location_of<'a>(
    entry: &'a PlayerEntry,
    zone: &'a str,
    in_instance: bool,
) -> Option<(&'a str, &'a str)> {
    if in_instance {
        entry
            .anchor
            .as_ref()
            .map(|(zone, room)| (zone.as_str(), room.as_str()))
    } else {
        Some((zone, entry.room.as_str()))
    }
}

/// Dumps a player standing in `zone` at its durable location (inside an instance, the entrance).
fn dump_entry(
    entry: &PlayerEntry,
    zone: &ZoneRuntime,
) -> Option<shardkeep::character::CharacterSnapshot> {
    let location = durable_location_of(entry, &zone.def.id, zone.def.instance);
    match crate::game::apply::dump_character_after(
        &entry.character,
        zone.elapsed(entry),
        location.map(|l| l.0),
        location.map(|l| l.1),
        crate::game::items::CarryLimits::default(),
    ) {
        Ok(snapshot) => Some(snapshot),
        Err(err) => {
            tracing::warn!(event = "dump_refused", character = %entry.character.character_id, error = %err);
            None
        }
    }
}

/// Dumps a player of `zone` for a save, numbered: the dump takes the next number of the copy's
/// issue sequence, so of two dumps of one copy the later ranks higher at a load (a checkpoint
/// dumped after a flush that lands later outranks that flush's row on its mark, where an equal
/// mark would let the row win and lose what was played between the two dumps).
fn dump_for_save(
    zone: &mut ZoneRuntime,
    character_id: Uuid,
) -> Option<shardkeep::character::CharacterSnapshot> {
    zone.player_mut(character_id)?.character.issue();
    dump_entry(zone.player(character_id)?, zone)
}

/// A crash-window measure in progress; dropping it lets the next one start.
struct ExportingFlag(Arc<std::sync::atomic::AtomicBool>);

impl Drop for ExportingFlag {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// One shard.
pub struct Shard {
    config: ShardConfig,
    catalog: Arc<Catalog>,
    zones: BTreeMap<String, ZoneRuntime>,
    directory: ZoneDirectory,
    residency: ResidencyIndex,
    saver: Saver,
    placement: PlacementWriter,
    events: mpsc::Receiver<SaverEvent>,
    auditor: Auditor,
    persisted: bool,
    store: Option<CharacterStore>,
    pending_transfers: std::collections::HashMap<Uuid, transfer::PendingTransfer>,
    transfer_results: (
        mpsc::Sender<transfer::TransferResult>,
        mpsc::Receiver<transfer::TransferResult>,
    ),
    transfers_committed: u64,
    transfers_rejected: u64,
    voided_items: Vec<Uuid>,
    decayed_items: Vec<Uuid>,
    /// Logouts waiting for an item transfer of the character to answer (see `Shard::logout`),
    /// with the owner epoch of the copy that is to leave.
    logouts_after_transfer: std::collections::HashMap<Uuid, i64>,
    /// Copies that left once their transfer answered, with the items their finals carry, for
    /// a host's bookkeeping (see `Shard::take_departed_after_transfer`).
    departed_after_transfer: Vec<(Uuid, i64, Vec<Uuid>)>,
    /// Final saves the saver's full queue could not take yet, oldest first; offered again
    /// every pulse.
    deferred_finals: std::collections::VecDeque<shardkeep::character::CharacterSnapshot>,
    evictions: Vec<Eviction>,
    acknowledged: Vec<SaverEvent>,
    /// A crash-window measure is running (off the pulse).
    exporting: Arc<std::sync::atomic::AtomicBool>,
    pulse: u64,
    cancel: CancellationToken,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("shard_id", &self.config.shard_id)
            .field("zones", &self.zones.keys().collect::<Vec<_>>())
            .field("pulse", &self.pulse)
            .finish_non_exhaustive()
    }
}

impl Shard {
    /// Boots a shard hosting `zones`: registers them in the directory, runs their resets and
    /// starts the saver and placement writer. Must run inside a tokio runtime.
    pub fn boot(
        config: ShardConfig,
        zones: Vec<ZoneDef>,
        catalog: Arc<Catalog>,
        stores: ShardStores,
        directory: ZoneDirectory,
    ) -> Self {
        let cancel = config
            .stop_with
            .as_ref()
            .map_or_else(CancellationToken::new, CancellationToken::child_token);
        let residency = ResidencyIndex::default();
        let persisted = stores.characters.is_some();
        let store = stores.characters.clone();
        let auditor = match stores.audit {
            Some(store) => Auditor::spawn(store, AuditorConfig::default(), cancel.child_token()),
            None => Auditor::disabled(),
        };
        let (tx, events) = mpsc::channel(config.event_depth.max(1));
        let feedback = Arc::new(feedback::ShardFeedback {
            events: tx,
            residency: residency.clone(),
        });
        let saver = Saver::spawn(
            SaverSinks {
                rows: stores.characters,
                checkpoints: stores.checkpoints,
                retry: stores.retry,
            },
            feedback,
            config.saver,
            cancel.child_token(),
        );
        let placement = PlacementWriter::spawn(
            stores.placement,
            config.placement_depth,
            config.saver.io_timeout,
            cancel.child_token(),
        );
        let mut runtimes = BTreeMap::new();
        for def in zones {
            directory.assign(&def.id, &config.shard_id);
            let mut zone = ZoneRuntime::new(Arc::new(def), config.flush_pulses);
            run_resets(&zone.def, &mut zone.entities, &catalog);
            runtimes.insert(zone.def.id.clone(), zone);
        }
        Self {
            config,
            catalog,
            zones: runtimes,
            directory,
            residency,
            saver,
            placement,
            events,
            auditor,
            persisted,
            store,
            pending_transfers: std::collections::HashMap::new(),
            transfer_results: mpsc::channel(4096),
            transfers_committed: 0,
            transfers_rejected: 0,
            voided_items: Vec::new(),
            decayed_items: Vec::new(),
            deferred_finals: std::collections::VecDeque::new(),
            logouts_after_transfer: std::collections::HashMap::new(),
            departed_after_transfer: Vec::new(),
            evictions: Vec::new(),
            acknowledged: Vec::new(),
            exporting: Arc::default(),
            pulse: 0,
            cancel,
        }
    }

    /// This shard's id.
    pub fn id(&self) -> &str {
        &self.config.shard_id
    }

    /// The saver handle.
    pub fn saver(&self) -> &Saver {
        &self.saver
    }

    /// The auditor.
    pub fn auditor(&self) -> &Auditor {
        &self.auditor
    }

    /// The residency index.
    pub fn residency(&self) -> &ResidencyIndex {
        &self.residency
    }

    /// The content catalog.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// The zones hosted here.
    pub fn zones(&self) -> impl Iterator<Item = &ZoneRuntime> {
        self.zones.values()
    }

    /// A hosted zone, mutably (for game actions on entities).
    pub fn zone_mut(&mut self, zone: &str) -> Option<&mut ZoneRuntime> {
        self.zones.get_mut(zone)
    }

    /// Pulses run so far.
    pub fn pulse_count(&self) -> u64 {
        self.pulse
    }

    /// The player entry of `character_id`, if held here.
    pub fn player(&self, character_id: Uuid) -> Option<&PlayerEntry> {
        let zone = self.residency.zone_of(character_id)?;
        self.zones.get(&zone)?.player(character_id)
    }

    /// The player entry, mutably (game actions change the live character through it).
    pub fn player_mut(&mut self, character_id: Uuid) -> Option<&mut PlayerEntry> {
        let zone = self.residency.zone_of(character_id)?;
        self.zones.get_mut(&zone)?.player_mut(character_id)
    }

    /// Where `character_id` stands: zone and room.
    pub fn location(&self, character_id: Uuid) -> Option<(String, String)> {
        let zone = self.residency.zone_of(character_id)?;
        let room = self.zones.get(&zone)?.player(character_id)?.room.clone();
        Some((zone, room))
    }

    /// Where `character_id` would be written down: where it stands, or inside an instance the
    /// zone and room it entered from. Journal entries and saves carry this, never an instance.
    pub fn durable_location(&self, character_id: Uuid) -> Option<(String, String)> {
        let zone_id = self.residency.zone_of(character_id)?;
        let zone = self.zones.get(&zone_id)?;
        let entry = zone.player(character_id)?;
        durable_location_of(entry, &zone_id, zone.def.instance)
            .map(|(zone, room)| (zone.to_owned(), room.to_owned()))
    }

    /// Zombie copies evicted since the last call.
    pub fn take_evictions(&mut self) -> Vec<Eviction> {
        std::mem::take(&mut self.evictions)
    }

    /// Saver outcomes handled since the last call (saves, conflicts, drops).
    pub fn take_saver_events(&mut self) -> Vec<SaverEvent> {
        std::mem::take(&mut self.acknowledged)
    }

    /// Runs one pulse: handles saver events, advances timed effects, runs the save cadences and
    /// repops. Never waits on I/O.
    ///
    /// Cadences are staggered: each player has a fixed phase inside each period, so a shard's
    /// checkpoints and flushes spread evenly over the pulses instead of arriving all at once,
    /// while every player is still checkpointed once per checkpoint period and flushed once per
    /// flush period. A player due for both gets the flush (which also writes the checkpoint).
    pub fn tick(&mut self) {
        self.pulse += 1;
        // Transfer results first: a flush conflict handled after them re-dumps the item too.
        self.handle_transfer_results();
        self.handle_saver_events();
        self.offer_deferred_finals();
        let checkpoint_period = self.config.checkpoint_pulses.max(1);
        let flush_period = self.config.flush_pulses.max(1);
        let mut checkpoints = Vec::new();
        let mut flushes = Vec::new();
        // A character in an item transfer is not saved until its commit answers: the commit
        // writes its row with what it will hold then, and a checkpoint dumped meanwhile (a grant
        // may have raised its mark) would outrank that row at a load without the item.
        let transferring = self.transferring();
        let settled = |e: &&&PlayerEntry| !transferring.contains(&e.character.character_id);
        for zone in self.zones.values_mut() {
            let repop = u64::from(zone.def.repop_pulses.max(1));
            if self.pulse.is_multiple_of(repop) {
                run_resets(&zone.def, &mut zone.entities, &self.catalog);
            }
            zone.pulse_timed();
            let due = zone.due_saves(self.pulse, checkpoint_period, flush_period);
            let ids = |due: &[&PlayerEntry]| -> Vec<Uuid> {
                due.iter()
                    .filter(settled)
                    .map(|e| e.character.character_id)
                    .collect()
            };
            let (flush_ids, checkpoint_ids) = (ids(&due.flush), ids(&due.checkpoint));
            flushes.extend(
                flush_ids
                    .into_iter()
                    .filter_map(|id| dump_for_save(zone, id)),
            );
            checkpoints.extend(
                checkpoint_ids
                    .into_iter()
                    .filter_map(|id| dump_for_save(zone, id)),
            );
        }
        if self.pulse > self.config.quiet_pulses {
            self.saver.enqueue_many(SaveReason::Flush, flushes);
            self.saver.enqueue_many(SaveReason::Checkpoint, checkpoints);
        }
        if let Some(lifetime) = self.config.floor_lifetime_pulses
            && self.pulse.is_multiple_of(FLOOR_SWEEP_PULSES)
        {
            self.decay_floors(lifetime);
        }
        // The crash window, once per checkpoint period.
        if self.pulse.is_multiple_of(checkpoint_period) {
            self.export_crash_window();
        }
    }

    /// Measures and exports the crash window over every resident, off the pulse (it reads a
    /// landing time per resident: tens of milliseconds for a full shard), one measure at a time.
    fn export_crash_window(&self) {
        if self
            .exporting
            .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            return;
        }
        let landed = self.saver.landed().clone();
        let residency = self.residency.clone();
        let shard = self.config.shard_id.clone();
        // Clears the flag when the measure ends, however it ends (a panic, or a runtime that
        // refused the task), so one failed measure never stops the next.
        let exporting = ExportingFlag(Arc::clone(&self.exporting));
        let export = move || {
            let _exporting = exporting;
            landed.export(&shard, &residency.ids());
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(export)),
            Err(_) => export(),
        }
    }

    /// Dumps every live, persisted, non-frozen, non-pending player and queues it for `reason`
    /// (a drain or a live reconcile).
    pub fn save_all(&mut self, reason: SaveReason) {
        let transferring = self.transferring();
        let mut snapshots = Vec::new();
        for zone in self.zones.values_mut() {
            let (numbered, tied): (Vec<Uuid>, Vec<Uuid>) = zone
                .players()
                .filter(|e| !e.skip_saves())
                .map(|e| e.character.character_id)
                .partition(|id| !transferring.contains(id));
            // In a transfer: unnumbered, as `dump_numbered` says why.
            snapshots.extend(
                tied.into_iter()
                    .filter_map(|id| dump_entry(zone.player(id)?, zone)),
            );
            snapshots.extend(
                numbered
                    .into_iter()
                    .filter_map(|id| dump_for_save(zone, id)),
            );
        }
        self.saver.enqueue_many(reason, snapshots);
    }

    /// Dumps one player and queues it; false when skipped, unsavable or dropped.
    pub fn save_one(&mut self, character_id: Uuid, reason: SaveReason) -> bool {
        let Some(entry) = self.player(character_id) else {
            return false;
        };
        if entry.skip_saves() {
            return false;
        }
        let Some(snapshot) = self.dump_numbered(character_id) else {
            return false;
        };
        self.saver.enqueue(reason, snapshot) == shardkeep::saver::EnqueueOutcome::Queued
    }

    /// Dumps a player for a save, numbered (see `dump_for_save`) — unless an item transfer of
    /// the character waits for its commit: the commit's row holds the item under the copy's
    /// current mark, and a dump without the item numbered past it would outrank that row at a
    /// load (the item in no row), so such a dump keeps the current mark and ties, and the row
    /// wins.
    pub(super) fn dump_numbered(
        &mut self,
        character_id: Uuid,
    ) -> Option<shardkeep::character::CharacterSnapshot> {
        if self.has_pending_transfer(character_id) {
            return self.dump(self.player(character_id)?);
        }
        let zone = self.residency.zone_of(character_id)?;
        dump_for_save(self.zones.get_mut(&zone)?, character_id)
    }

    /// Dumps a player at its durable location (an instance keeps its anchor).
    pub(super) fn dump(
        &self,
        entry: &PlayerEntry,
    ) -> Option<shardkeep::character::CharacterSnapshot> {
        let zone = self.residency.zone_of(entry.character.character_id)?;
        dump_entry(entry, self.zones.get(&zone)?)
    }

    fn handle_saver_events(&mut self) {
        while let Ok(event) = self.events.try_recv() {
            self.handle_saver_event(&event);
            self.acknowledged.push(event);
        }
    }

    fn handle_saver_event(&mut self, event: &SaverEvent) {
        match *event {
            SaverEvent::Saved {
                character_id,
                dumped_version,
                new_version,
                ..
            } => {
                if let Some(entry) = self.player_mut(character_id)
                    && entry.character.state_version == dumped_version
                {
                    entry.character.state_version = new_version;
                }
            }
            SaverEvent::FlushConflict {
                character_id,
                owner_epoch,
                current_version,
            } => {
                let pending = self.has_pending_transfer(character_id);
                // Only the copy that dumped the snapshot adopts the row's version (a late event
                // of an earlier copy is not this one's).
                if let Some(entry) = self
                    .player_mut(character_id)
                    .filter(|e| e.character.owner_epoch == owner_epoch)
                {
                    entry.character.state_version = current_version;
                    // With an item between rows, a re-dump would miss it; the next cadence
                    // flush carries the settled state.
                    if !pending {
                        self.save_one(character_id, SaveReason::Flush);
                    }
                }
            }
            SaverEvent::OwnershipLost {
                character_id,
                current_epoch,
                ..
            } => self.evict(
                character_id,
                current_epoch,
                EvictionCause::OwnershipLost { current_epoch },
            ),
            SaverEvent::DoubleOwn {
                character_id,
                stored_epoch,
                ..
            } => self.evict(
                character_id,
                stored_epoch,
                EvictionCause::DoubleOwn { stored_epoch },
            ),
            SaverEvent::SchemaOutdated {
                character_id,
                owner_epoch,
                stored_schema,
            } => self.evict(
                character_id,
                owner_epoch.saturating_add(1),
                EvictionCause::SchemaOutdated { stored_schema },
            ),
            SaverEvent::FinalDropped { .. }
            | SaverEvent::FinalQueuedAsJob { .. }
            | SaverEvent::NotFound { .. } => {}
        }
    }

    /// Evicts the copy of `character_id` held here if its epoch is older than `newer_epoch`
    /// (a login or handoff claimed it elsewhere and landed here); true when one was evicted.
    pub fn evict_if_older(&mut self, character_id: Uuid, newer_epoch: i64) -> bool {
        let before = self.evictions.len();
        self.evict(
            character_id,
            newer_epoch,
            EvictionCause::OwnershipLost {
                current_epoch: newer_epoch,
            },
        );
        self.evictions.len() > before
    }

    /// Removes a zombie copy without saving it, if its epoch is older than `newer_epoch`.
    fn evict(&mut self, character_id: Uuid, newer_epoch: i64, cause: EvictionCause) {
        let Some(zone) = self.residency.zone_of(character_id) else {
            return;
        };
        let Some(zone) = self.zones.get_mut(&zone) else {
            return;
        };
        let stale = zone
            .player(character_id)
            .is_some_and(|e| e.character.owner_epoch < newer_epoch);
        if !stale {
            return;
        }
        if let Some(entry) = zone.remove(character_id, &self.residency) {
            tracing::warn!(event = "zombie_evicted", character = %character_id,
                epoch = entry.character.owner_epoch, newer_epoch);
            // The copy's belongings leave with it; those the live owner also holds live on there.
            for item in entry.character.items() {
                self.voided_items.extend(item.id);
            }
            self.void_released_by(character_id, entry.character.owner_epoch);
            self.evictions.push(Eviction {
                character_id,
                evicted_epoch: entry.character.owner_epoch,
                cause,
            });
        }
    }

    /// Records that this shard holds `character_id`, at its durable location: inside an
    /// instance the record names the entrance, never the shard-local instance.
    fn register_placement(&self, character_id: Uuid) {
        let (Some(entry), Some((zone, _))) = (
            self.player(character_id),
            self.durable_location(character_id),
        ) else {
            return;
        };
        self.placement.enqueue(PlacementRecord {
            character_id,
            shard_id: Some(self.config.shard_id.clone()),
            zone_id: Some(zone),
            owner_epoch: entry.character.owner_epoch,
            updated_at: Utc::now(),
        });
    }

    fn tombstone_placement(&self, character: &LiveCharacter) {
        self.placement.enqueue(PlacementRecord {
            character_id: character.character_id,
            shard_id: None,
            zone_id: None,
            owner_epoch: character.owner_epoch,
            updated_at: Utc::now(),
        });
    }

    /// Re-asserts the placement record of every attached or link-dead player (a repair pass after
    /// a Redis outage; records are fenced, so a stale one never wins).
    pub fn refresh_placements(&self) {
        for zone in self.zones.values() {
            for entry in zone
                .players()
                .filter(|e| !matches!(e.link, Link::Pending { .. }))
            {
                self.register_placement(entry.character.character_id);
            }
        }
    }

    /// Waits, at most `bound`, until queued placement updates are written.
    pub async fn placement_barrier(&self, bound: Duration) -> shardkeep::drain::BarrierOutcome {
        self.placement.barrier(bound).await
    }

    /// Kills the shard without flushing anything (a crash): the saver and placement writer stop
    /// at once and every held character is abandoned.
    pub fn kill(self) {
        self.cancel.cancel();
    }
}
