//! The composition root: every handle shardkeep offers, built once from a Postgres backend and a
//! Redis backend (or one SQLite file, in embedded mode) and the game's model, and the background
//! workers spawned under one cancellation token.
//!
//! A game server builds [`Services`] at start, hands the handles to its shards, and (unless a
//! separate `shardkeep serve` runs them) spawns the workers. `serve`, the simulator and the
//! tests build it the same way, so nothing wires the parts by hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::audit::AuditStore;
use crate::backend::{PostgresBackend, RedisBackend, SqliteBackend};
use crate::character::{
    Bookkeeping, BookkeepingRetention, CharacterLoader, CharacterStore, CheckpointStore,
    run_bookkeeping_prune,
};
use crate::clock::{Clock, SystemClock};
use crate::coord::{Coordination, CoordinationConfig, InstanceRecord, run_maintenance};
use crate::journal::{JournalStats, JournalWorker, JournalWorkerConfig, SessionJournal};
use crate::keyspace::Keyspace;
use crate::model::ModelHandle;
use crate::placement::PlacementStore;
use crate::queue::{DeadLetterRetention, QueueError, WorkQueueConfig};
use crate::retry::{
    RetryPause, RetryQueue, RetrySignals, RetryStats, RetryWorker, RetryWorkerConfig,
};

/// How the services are built and what the workers do.
#[derive(Debug, Clone)]
pub struct ServicesConfig {
    /// This process's id: the retry worker's lease owner and the registry entry.
    pub instance_id: String,
    /// What kind of process registers (`serve`, `game_server`…).
    pub service: String,
    /// Where operators reach this process (recorded in the registry).
    pub address: String,
    /// The shard it runs, for a game server.
    pub shard_id: Option<String>,
    /// Depth of the retry signal channel; a full one leaves jobs to the poll.
    pub retry_signal_depth: usize,
    /// Bound on the loader's claim and reads.
    pub io_timeout: Duration,
    /// The retry worker.
    pub retry: RetryWorkerConfig,
    /// The journal's queue.
    pub journal_queue: WorkQueueConfig,
    /// The journal worker.
    pub journal_worker: JournalWorkerConfig,
    /// Coordination records.
    pub coordination: CoordinationConfig,
    /// Period of keyspace maintenance, bookkeeping pruning and dead-letter retention.
    pub maintenance_every: Duration,
    /// How long dead letters are kept.
    pub dead_letter_retention: DeadLetterRetention,
    /// How long bookkeeping rows are kept.
    pub bookkeeping_retention: BookkeepingRetention,
}

impl ServicesConfig {
    /// Defaults for a process named `instance_id` registering as `service`.
    pub fn new(instance_id: &str, service: &str) -> Self {
        Self {
            instance_id: instance_id.to_owned(),
            service: service.to_owned(),
            address: String::new(),
            shard_id: None,
            retry_signal_depth: 1024,
            io_timeout: Duration::from_secs(5),
            retry: RetryWorkerConfig::new(instance_id),
            journal_queue: WorkQueueConfig::default(),
            journal_worker: JournalWorkerConfig::default(),
            coordination: CoordinationConfig::default(),
            maintenance_every: Duration::from_secs(30),
            dead_letter_retention: DeadLetterRetention::default(),
            bookkeeping_retention: BookkeepingRetention::default(),
        }
    }
}

/// Every handle, built once; clone the handles you need (the retry signal receiver stays
/// here, for [`Services::spawn_workers`]).
#[derive(Debug)]
pub struct Services {
    /// The engines everything is kept in.
    pub stores: Stores,
    /// The game's model.
    pub model: ModelHandle,
    /// Character rows: claim, CAS save, load, transfers. Its claims are the loader's: bounded by
    /// the model's schema version, and settling the character's queued retry jobs first.
    pub characters: CharacterStore,
    /// The checkpoint tier.
    pub checkpoints: CheckpointStore,
    /// Login-time loads: claim, then the freshest copy.
    pub loader: CharacterLoader,
    /// Coordination records.
    pub coord: Coordination,
    /// Durable retry jobs (producer side).
    pub retry: RetryQueue,
    /// The session lifecycle journal (producer side).
    pub journal: SessionJournal,
    /// The audit trail.
    pub audit: AuditStore,
    /// Placement records.
    pub placement: PlacementStore,
    /// The clock every part reads.
    pub clock: Arc<dyn Clock>,
    config: ServicesConfig,
    retry_signals: Option<RetrySignals>,
}

/// The engines the services keep everything in.
// One value per process, built once and never moved on a hot path: the size of the Redis
// handle is no cost worth an indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Stores {
    /// Postgres for the durable store, Redis for the fast tier.
    Servers {
        /// Postgres.
        pg: PostgresBackend,
        /// Redis.
        redis: RedisBackend,
    },
    /// One SQLite file for everything (embedded mode).
    Embedded(SqliteBackend),
}

impl Stores {
    /// Closes the pools (Postgres, or the file) once the work in hand is done.
    pub async fn close(&self) {
        match self {
            Self::Servers { pg, .. } => pg.close().await,
            Self::Embedded(db) => db.close().await,
        }
    }
}

/// The services could not be built or the workers not started.
#[derive(Debug, thiserror::Error)]
pub enum ServicesError {
    /// A queue configuration was refused, or the journal consumer could not be claimed (an id
    /// held by a live process).
    #[error("journal: {0}")]
    Journal(#[from] QueueError),
    /// The workers were already spawned from these services.
    #[error("the workers of these services are already running")]
    WorkersRunning,
}

impl Services {
    /// Builds every handle over `pg` and `redis`, applying the game's effects through `model`.
    pub fn build(
        pg: PostgresBackend,
        redis: RedisBackend,
        model: ModelHandle,
        config: ServicesConfig,
    ) -> Result<Self, ServicesError> {
        Self::build_with_clock(pg, redis, model, config, Arc::new(SystemClock))
    }

    /// As [`Services::build`], reading time from `clock`.
    pub fn build_with_clock(
        pg: PostgresBackend,
        redis: RedisBackend,
        model: ModelHandle,
        config: ServicesConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ServicesError> {
        let characters = CharacterStore::new(pg.clone());
        let (retry, signals) =
            RetryQueue::new(pg.clone(), config.retry_signal_depth, Arc::clone(&clock));
        let parts = Parts {
            characters,
            checkpoints: CheckpointStore::new(redis.clone()),
            retry: (retry, signals),
            journal: SessionJournal::new(redis.clone(), config.journal_queue)?,
            coord: Coordination::new(redis.clone(), config.coordination),
            audit: AuditStore::new(pg.clone()),
            placement: PlacementStore::new(redis.clone()),
        };
        Ok(Self::assemble(
            Stores::Servers { pg, redis },
            parts,
            model,
            config,
            clock,
        ))
    }

    /// Builds every handle in the embedded store's file `db` (embedded mode: no servers), its
    /// coordination records and journal named by `keys`, reading time from `clock`.
    pub fn embedded(
        db: SqliteBackend,
        keys: &Keyspace,
        model: ModelHandle,
        config: ServicesConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, ServicesError> {
        let (retry, signals) =
            RetryQueue::embedded(db.clone(), config.retry_signal_depth, Arc::clone(&clock));
        let parts = Parts {
            characters: CharacterStore::embedded(db.clone()),
            checkpoints: CheckpointStore::embedded(db.clone()),
            retry: (retry, signals),
            journal: SessionJournal::embedded(
                db.clone(),
                keys,
                config.journal_queue,
                Arc::clone(&clock),
            )?,
            coord: Coordination::embedded(
                db.clone(),
                keys.clone(),
                config.coordination,
                Arc::clone(&clock),
            ),
            audit: AuditStore::embedded(db.clone()),
            placement: PlacementStore::embedded(db.clone(), keys.clone(), Arc::clone(&clock)),
        };
        Ok(Self::assemble(
            Stores::Embedded(db),
            parts,
            model,
            config,
            clock,
        ))
    }

    fn assemble(
        stores: Stores,
        parts: Parts,
        model: ModelHandle,
        config: ServicesConfig,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let characters = parts
            .characters
            .with_item_load_retention(config.bookkeeping_retention.item_loads)
            .with_lease_expiry_limit(config.retry.lease_expiry_limit)
            .for_model(model.clone());
        let loader = CharacterLoader::new(
            characters.clone(),
            Some(parts.checkpoints.clone()),
            model.clone(),
            config.io_timeout,
        );
        let (retry, signals) = parts.retry;
        Self {
            coord: parts.coord,
            audit: parts.audit,
            placement: parts.placement,
            characters,
            checkpoints: parts.checkpoints,
            loader,
            retry,
            journal: parts.journal,
            stores,
            model,
            clock,
            config,
            retry_signals: Some(signals),
        }
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &ServicesConfig {
        &self.config
    }

    /// Another set of the same handles, for another part of this process (a live-copy runtime
    /// beside the workers): its retry jobs signal the workers these services spawn, and it
    /// spawns none itself ([`ServicesError::WorkersRunning`]).
    pub fn share(&self) -> Services {
        Services {
            stores: self.stores.clone(),
            model: self.model.clone(),
            characters: self.characters.clone(),
            checkpoints: self.checkpoints.clone(),
            loader: self.loader.clone(),
            coord: self.coord.clone(),
            retry: self.retry.clone(),
            journal: self.journal.clone(),
            audit: self.audit.clone(),
            placement: self.placement.clone(),
            clock: Arc::clone(&self.clock),
            config: self.config.clone(),
            retry_signals: None,
        }
    }

    /// Spawns the background workers under `cancel`: the retry worker, the journal worker (its
    /// consumer claimed first, so a consumer id held by a live process fails here), keyspace
    /// maintenance with this process's registry entry, bookkeeping pruning and dead-letter
    /// retention. Once only.
    pub async fn spawn_workers(
        &mut self,
        cancel: CancellationToken,
    ) -> Result<Workers, ServicesError> {
        if self.retry_signals.is_none() {
            return Err(ServicesError::WorkersRunning);
        }
        let config = &self.config;
        let journal_worker = JournalWorker::new(
            self.journal.clone(),
            self.coord.clone(),
            self.characters.clone(),
            config.journal_worker.clone(),
        );
        let journal_stats = journal_worker.stats();
        let journal_liveness = journal_worker.liveness();
        // The one step that can fail comes before the signal receiver is taken: a start refused
        // here can be tried again, and the producers' signals still reach the worker.
        let consumer = journal_worker.consumer().await?;
        let signals = self
            .retry_signals
            .take()
            .ok_or(ServicesError::WorkersRunning)?;
        let (model, retry_config, clock) = (
            self.model.clone(),
            config.retry.clone(),
            Arc::clone(&self.clock),
        );
        let (retry_worker, bookkeeping) = match &self.stores {
            Stores::Servers { pg, .. } => (
                RetryWorker::new(pg.clone(), model, signals, retry_config, clock),
                Bookkeeping::new(pg.clone()),
            ),
            Stores::Embedded(db) => (
                RetryWorker::embedded(db.clone(), model, signals, retry_config, clock),
                Bookkeeping::embedded(db.clone()),
            ),
        };
        let retry_stats = retry_worker.stats();
        let retry_liveness = retry_worker.liveness();
        let retry_pause = retry_worker.pause_handle();
        let bookkeeping_pruned = Arc::new(AtomicU64::new(0));
        let mut tasks = vec![
            ("retry", tokio::spawn(retry_worker.run(cancel.clone()))),
            (
                "journal",
                tokio::spawn(journal_worker.run_with(consumer, cancel.clone())),
            ),
        ];
        let record = InstanceRecord {
            instance_id: config.instance_id.clone(),
            service: config.service.clone(),
            address: config.address.clone(),
            shard_id: config.shard_id.clone(),
            registered_at: chrono::Utc::now(),
        };
        let every = config.maintenance_every;
        tasks.push((
            "maintenance",
            tokio::spawn(run_maintenance(
                self.coord.clone(),
                record,
                every,
                cancel.clone(),
                |_| {},
            )),
        ));
        // Every instance may prune: each pass deletes a bounded batch, and two passes at once
        // only share the work.
        let pruned = Arc::clone(&bookkeeping_pruned);
        tasks.push((
            "bookkeeping",
            tokio::spawn(run_bookkeeping_prune(
                bookkeeping,
                config.bookkeeping_retention,
                every,
                cancel.clone(),
                move |pass| {
                    if let Ok(report) = pass {
                        pruned.fetch_add(
                            report.effects
                                + report.item_loads
                                + report.item_releases
                                + report.transfer_activations,
                            Ordering::Relaxed,
                        );
                    }
                },
            )),
        ));
        tasks.push((
            "dead_letter_retention",
            tokio::spawn(run_dead_letter_retention(
                self.retry.clone(),
                self.journal.clone(),
                config.dead_letter_retention,
                every,
                cancel.clone(),
            )),
        ));
        Ok(Workers {
            tasks,
            retry_stats,
            retry_pause,
            journal_stats,
            bookkeeping_pruned,
            liveness: WorkerLiveness {
                retry: retry_liveness,
                journal: journal_liveness,
            },
            cancel,
        })
    }
}

/// The handles that differ by engine, before the shared wiring.
struct Parts {
    characters: CharacterStore,
    checkpoints: CheckpointStore,
    retry: (RetryQueue, RetrySignals),
    journal: SessionJournal,
    coord: Coordination,
    audit: AuditStore,
    placement: PlacementStore,
}

/// The spawned workers.
#[derive(Debug)]
pub struct Workers {
    tasks: Vec<(&'static str, JoinHandle<()>)>,
    /// The retry worker's counters.
    pub retry_stats: Arc<RetryStats>,
    /// Holds and releases the retry worker.
    pub retry_pause: RetryPause,
    /// The journal worker's counters.
    pub journal_stats: Arc<JournalStats>,
    /// Bookkeeping rows the pruning has deleted.
    pub bookkeeping_pruned: Arc<AtomicU64>,
    /// When the retry worker last finished a poll and the journal worker a pass.
    pub liveness: WorkerLiveness,
    cancel: CancellationToken,
}

/// The workers' [`Liveness`](crate::liveness::Liveness), for readiness checks.
#[derive(Debug, Clone, Default)]
pub struct WorkerLiveness {
    /// The retry worker (a poll of due rows finishes every poll interval).
    pub retry: crate::liveness::Liveness,
    /// The journal worker (a pass finishes every interval).
    pub journal: crate::liveness::Liveness,
}

impl Workers {
    /// Cancels the workers and waits up to `bound` for them to finish the work in hand (the
    /// retry worker between batches, the journal consumer handing back what it holds). Returns
    /// the names of those that did not finish in time.
    pub async fn shutdown(self, bound: Duration) -> Vec<&'static str> {
        self.cancel.cancel();
        let deadline = tokio::time::Instant::now() + bound;
        let mut late = Vec::new();
        for (name, task) in self.tasks {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if tokio::time::timeout(left, task).await.is_err() {
                late.push(name);
            }
        }
        late
    }
}

/// Prunes both kinds of dead letters every `every` until `cancel` (each pass is bounded; a
/// backlog takes several passes).
async fn run_dead_letter_retention(
    retry: RetryQueue,
    journal: SessionJournal,
    retention: DeadLetterRetention,
    every: Duration,
    cancel: CancellationToken,
) {
    let mut interval = tokio::time::interval(every);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = interval.tick() => {}
        }
        if let Err(err) = retry.dead_letters_prune(retention).await {
            tracing::warn!(event = "dead_letter_retention_failed", kind = "retry", error = %err);
        }
        if let Err(err) = journal.dead_letters_prune(retention).await {
            tracing::warn!(event = "dead_letter_retention_failed", kind = "journal", error = %err);
        }
    }
}
