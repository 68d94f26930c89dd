//! What every simulator task shares: the stores, routing to shard hosts, counters, and the
//! ledger of facts the checker needs (acknowledged saves, recorded destructions).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::SimConfig;
use super::agent::Agent;
use super::env::SimEnv;
use super::inbound::Inbound;
use shardkeep::character::CharacterStore;
use shardkeep::placement::PlacementStore;
use shardkeep::saver::SaverStatsSnapshot;
use shardkeep_reference::game::Catalog;
use shardkeep_reference::game::world::ZoneDef;
use shardkeep_reference::shard::ZoneDirectory;

/// Counters of what the players and faults did.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) logins: AtomicU64,
    pub(super) login_retries: AtomicU64,
    /// Logins put off while the shard still held the character's link-dead copy or its logout save.
    pub(super) logins_waiting_for_last_copy: AtomicU64,
    pub(super) resumes: AtomicU64,
    pub(super) logouts: AtomicU64,
    pub(super) disconnects: AtomicU64,
    pub(super) linkdead_timeouts: AtomicU64,
    pub(super) walks: AtomicU64,
    pub(super) handoffs_superseded: AtomicU64,
    pub(super) transfers_completed: AtomicU64,
    pub(super) transfers_awaiting: AtomicU64,
    /// Handoffs whose source shard was killed while it waited for their activation.
    pub(super) transfers_orphaned: AtomicU64,
    pub(super) instance_entries: AtomicU64,
    pub(super) handoffs: AtomicU64,
    pub(super) handoff_retries: AtomicU64,
    pub(super) handoffs_lost: AtomicU64,
    pub(super) fights: AtomicU64,
    pub(super) deaths: AtomicU64,
    pub(super) item_moves: AtomicU64,
    /// `serve` processes SIGKILLed (and started again).
    pub(super) serves_killed: AtomicU64,
    /// Items put down that decayed on the floors.
    pub(super) floor_items_decayed: AtomicU64,
    /// Loot and pickups a full inventory turned down.
    pub(super) inventory_full: AtomicU64,
    pub(super) appearance_changes: AtomicU64,
    pub(super) equipment_changes: AtomicU64,
    pub(super) retry_enqueued: AtomicU64,
    pub(super) journal_appended: AtomicU64,
    pub(super) evictions: AtomicU64,
    pub(super) faults_injected: AtomicU64,
    pub(super) shards_killed: AtomicU64,
    pub(super) zombies_made: AtomicU64,
    pub(super) poison_planted: AtomicU64,
    pub(super) journal_held_by_crash: AtomicU64,
    pub(super) redis_failovers: AtomicU64,
    pub(super) upkeep_passes: AtomicU64,
    /// Bookkeeping rows (job effects, item loads) pruned by the maintenance pass.
    pub(super) upkeep_failed_steps: AtomicU64,
    pub(super) upkeep_markers_removed: AtomicU64,
    pub(super) upkeep_registrations: AtomicU64,
    /// The server has autovacuum off, so the run vacuums its churned tables itself.
    pub(super) autovacuum_off: std::sync::atomic::AtomicBool,
    /// Passes of that stand-in.
    pub(super) stand_in_vacuums: AtomicU64,
    pub(super) finals_unsaved_at_shutdown: AtomicU64,
}

/// Reads a counter.
pub(super) fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// Adds one.
pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Facts the checker needs that only the running shards know.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    /// Highest row version acknowledged by a `Saved` flush or final save, per character.
    pub(super) acked: HashMap<Uuid, i64>,
    /// Item ids whose destruction was recorded (a killed shard's floors and pending
    /// transfers, phantoms voided after a zombie, floors at the end of the world).
    pub(super) destroyed: HashSet<Uuid>,
    /// Item ids lying on floors or in floor containers when the shards shut down, with who
    /// released each and at which epoch.
    pub(super) end_floors: Vec<(Uuid, Option<(Uuid, i64)>)>,
    /// Saver counters of shards that are gone (killed or shut down).
    pub(super) saver_gone: SaverStatsSnapshot,
    /// Transfers committed and refused by shards that are gone.
    pub(super) transfers_gone: (u64, u64),
    /// Zombie copies evicted.
    pub(super) evicted: u64,
    /// Phantom items voided.
    pub(super) voided: u64,
    /// Handoff tokens whose source shard was killed while it waited for their activation: their
    /// transfers stay pending until their lifetime ends (nobody else completes them).
    pub(super) orphaned_transfers: HashSet<String>,
    /// Sessions found without a matching placement at the end.
    pub(super) placement_violations: Vec<String>,
    /// Every claim whose reply arrived (logins and handoffs).
    pub(super) claims: Vec<super::claims::ClaimRecord>,
    /// Every session started and every session cleanup appended to the journal.
    pub(super) session_events: Vec<super::order_checks::SessionEvent>,
    /// Every reward issued and what every copy started out with.
    pub(super) rewards: super::rewards::RewardLedger,
    /// What crashed copies had checkpointed, and the loads checked against it.
    pub(super) crash_floors: super::crash_floors::CrashFloors,
}

impl Ledger {
    /// About how many bytes the checker's ledger holds: it keeps every reward, claim and session
    /// event of the run to check them at the end, so it grows with the run by design, apart
    /// from the library's own memory.
    pub(super) fn approx_bytes(&self) -> u64 {
        use std::mem::size_of;
        let acked = self.acked.capacity() * (size_of::<(Uuid, i64)>() + 1);
        let destroyed = self.destroyed.capacity() * (size_of::<Uuid>() + 1);
        let floors = self.end_floors.len() * size_of::<(Uuid, Option<(Uuid, i64)>)>();
        let claims = self.claims.len() * size_of::<super::claims::ClaimRecord>()
            + self
                .claims
                .iter()
                .filter_map(|c| c.handoff.as_ref().map(|h| h.token.capacity()))
                .sum::<usize>();
        // Vectors by length: the spare capacity of a doubling is not resident until written.
        let events = self.session_events.len() * size_of::<super::order_checks::SessionEvent>();
        (acked + destroyed + floors + claims + events) as u64
            + self.rewards.approx_bytes()
            + self.crash_floors.approx_bytes()
    }
}

/// Adds `b` into `a`.
pub(super) fn add_saver_stats(a: &mut SaverStatsSnapshot, b: &SaverStatsSnapshot) {
    a.checkpoint_attempted += b.checkpoint_attempted;
    a.checkpoint_landed += b.checkpoint_landed;
    a.checkpoint_refused += b.checkpoint_refused;
    a.checkpoint_failed += b.checkpoint_failed;
    a.row_attempted += b.row_attempted;
    a.row_landed += b.row_landed;
    a.row_conflicts += b.row_conflicts;
    a.row_ownership_lost += b.row_ownership_lost;
    a.row_failed += b.row_failed;
    a.final_dropped += b.final_dropped;
    a.final_queued_as_job += b.final_queued_as_job;
    a.dropped_checkpoint += b.dropped_checkpoint;
    a.dropped_row += b.dropped_row;
    a.write_latency.add(&b.write_latency);
}

/// The shared state.
pub(super) struct World {
    pub(super) config: SimConfig,
    pub(super) env: SimEnv,
    pub(super) store: CharacterStore,
    pub(super) placement: PlacementStore,
    /// The handoff protocol's steps (the library's; the simulator meters and retries them).
    pub(super) transit: shardkeep::live::Transit,
    pub(super) directory: ZoneDirectory,
    pub(super) catalog: Arc<Catalog>,
    /// Zones of each shard, by shard index.
    pub(super) shard_zones: Vec<Vec<ZoneDef>>,
    hosts: RwLock<HashMap<String, mpsc::UnboundedSender<Inbound>>>,
    /// Bounds the I/O tasks in flight.
    pub(super) io: Semaphore,
    pub(super) counters: Counters,
    pub(super) ledger: Mutex<Ledger>,
    /// Agents between places (logging in, travelling, waiting to reconnect).
    pub(super) in_transit: AtomicUsize,
    /// Agents parked because the run stopped taking logins.
    parked: Mutex<Vec<Agent>>,
    /// No more logins or player actions: the run is settling.
    pub(super) settling: AtomicBool,
    /// Store outages: moved at each outage's start and end.
    outage_marks: AtomicU64,
    /// Store outages on now.
    outages_on: AtomicUsize,
    /// Holds the retry worker (the queue-full fault); set once the worker starts.
    pub(super) retry_pause: std::sync::OnceLock<shardkeep::retry::RetryPause>,
    /// The `serve` processes running the workers, with `--serves`.
    pub(super) serves: std::sync::OnceLock<Arc<super::serves::ServeFleet>>,
    /// Everything stops: retry loops give up.
    pub(super) halt: CancellationToken,
    /// Online players per host, by shard index.
    pub(super) online: Vec<AtomicUsize>,
    /// Saver counters of the live shards, by shard index.
    pub(super) saver_live: Mutex<Vec<SaverStatsSnapshot>>,
    /// The retry worker's end of the signal channel, until the worker takes it.
    /// The services `serve` runs, until the workers start.
    pub(super) services: Mutex<Option<shardkeep::Services>>,
    /// Bookkeeping rows the services' pruning deleted (set when the workers start).
    pub(super) bookkeeping_pruned: std::sync::OnceLock<Arc<AtomicU64>>,
}

impl World {
    /// A store outage starts (`true`) or ends.
    pub(super) fn outage_mark(&self, starts: bool) {
        use std::sync::atomic::Ordering::SeqCst;
        if starts {
            self.outages_on.fetch_add(1, SeqCst);
        } else {
            self.outages_on.fetch_sub(1, SeqCst);
        }
        self.outage_marks.fetch_add(1, SeqCst);
    }

    /// Where the outages stand now (`None` while one is on): compare two readings with
    /// [`World::no_outage_since`].
    pub(super) fn outage_reading(&self) -> Option<u64> {
        use std::sync::atomic::Ordering::SeqCst;
        let mark = self.outage_marks.load(SeqCst);
        (self.outages_on.load(SeqCst) == 0).then_some(mark)
    }

    /// True when no store outage was on at `before` nor started since.
    pub(super) fn no_outage_since(&self, before: Option<u64>) -> bool {
        before.is_some() && self.outage_reading() == before
    }

    /// Holds or releases the retry worker (nothing happens before it starts); with `serve`
    /// processes, freezes or resumes them.
    pub(super) fn hold_retry_worker(&self, held: bool) {
        if let Some(pause) = self.retry_pause.get() {
            pause.set(held);
        }
        if let Some(fleet) = self.serves.get() {
            fleet.freeze(held);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        config: SimConfig,
        mut env: SimEnv,
        directory: ZoneDirectory,
        catalog: Arc<Catalog>,
        shard_zones: Vec<Vec<ZoneDef>>,
    ) -> Self {
        let shards = config.shards;
        Self {
            services: Mutex::new(env.services.take()),
            bookkeeping_pruned: std::sync::OnceLock::new(),
            store: env.sut_characters(),
            placement: env.sut_placement(),
            transit: shardkeep::live::Transit::new(
                env.coord.clone(),
                env.loader(),
                env.retry.clone(),
                super::travel::HANDOFF_TTL,
                super::travel::SESSION_TTL,
            ),
            config,
            env,
            directory,
            catalog,
            shard_zones,
            hosts: RwLock::new(HashMap::new()),
            io: Semaphore::new(256),
            counters: Counters::default(),
            ledger: Mutex::new(Ledger::default()),
            in_transit: AtomicUsize::new(0),
            parked: Mutex::new(Vec::new()),
            settling: AtomicBool::new(false),
            outage_marks: AtomicU64::new(0),
            outages_on: AtomicUsize::new(0),
            retry_pause: std::sync::OnceLock::new(),
            serves: std::sync::OnceLock::new(),
            halt: CancellationToken::new(),
            online: (0..shards).map(|_| AtomicUsize::new(0)).collect(),
            saver_live: Mutex::new(vec![SaverStatsSnapshot::default(); shards]),
        }
    }

    /// The id of shard `index`.
    pub(super) fn shard_id(index: usize) -> String {
        format!("shard-{index}")
    }

    /// Registers the inbox of a host.
    pub(super) fn register_host(&self, shard: &str, inbox: mpsc::UnboundedSender<Inbound>) {
        if let Ok(mut hosts) = self.hosts.write() {
            hosts.insert(shard.to_owned(), inbox);
        }
    }

    /// Sends `message` to the host of `shard`; gives it back when there is none.
    pub(super) fn send(&self, shard: &str, message: Inbound) -> Result<(), Box<Inbound>> {
        let sender = self.hosts.read().ok().and_then(|h| h.get(shard).cloned());
        match sender {
            Some(sender) => sender.send(message).map_err(|e| Box::new(e.0)),
            None => Err(Box::new(message)),
        }
    }

    /// Every host's id.
    pub(super) fn host_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .hosts
            .read()
            .map(|h| h.keys().cloned().collect())
            .unwrap_or_default();
        ids.sort();
        ids
    }

    /// True once the run settles.
    pub(super) fn is_settling(&self) -> bool {
        self.settling.load(Ordering::Relaxed)
    }

    /// An agent in transit stops travelling for this run: parked, or, for a zombie's driver
    /// (never counted in transit), dropped.
    pub(super) fn leave_transit(&self, agent: Agent) {
        if agent.ghost {
            return;
        }
        self.in_transit.fetch_sub(1, Ordering::Relaxed);
        self.park(agent);
    }

    /// Keeps an agent that will not log in again this run.
    pub(super) fn park(&self, agent: Agent) {
        if let Ok(mut parked) = self.parked.lock() {
            parked.push(agent);
        }
    }

    /// Agents parked so far.
    pub(super) fn parked_count(&self) -> usize {
        self.parked.lock().map(|p| p.len()).unwrap_or(0)
    }

    /// Runs `f` on the ledger.
    pub(super) fn with_ledger<R>(&self, f: impl FnOnce(&mut Ledger) -> R) -> Option<R> {
        self.ledger.lock().ok().map(|mut l| f(&mut l))
    }

    /// Players online on every host.
    pub(super) fn online_total(&self) -> usize {
        self.online.iter().map(|o| o.load(Ordering::Relaxed)).sum()
    }

    /// Saver counters of every shard, live and gone.
    pub(super) fn saver_totals(&self) -> SaverStatsSnapshot {
        let mut total = self.with_ledger(|l| l.saver_gone).unwrap_or_default();
        if let Ok(live) = self.saver_live.lock() {
            for stats in live.iter() {
                add_saver_stats(&mut total, stats);
            }
        }
        total
    }
}
