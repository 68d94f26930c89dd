//! The saver: the zone produces snapshots, one background task writes them down the ladder.
//!
//! Enqueue never blocks — a full queue drops the request, counts it and logs `event=save_dropped`.
//! All blocking I/O happens in the drainer, each operation bounded by the I/O timeout. Outcomes
//! that need the zone (a flush conflict, an ownership loss, a refused checkpoint) go back through
//! [`SaveFeedback`]; shutdown waits on [`Saver::barrier`], which covers the logout saves still
//! retrying in the background too.
//!
//! - `worker` — the batch handler: coalescing, the checkpoint leg, the CAS leg, a final over a moved row.
//! - `final_retry` — a logout save that could not land: retried through an outage, then a
//!   durable retry job.
//! - [`pending`] — the registry of those logout saves, which the barrier waits for.
//! - [`stats`] — counters the simulator and benchmarks read.

mod final_retry;
pub mod landed;
pub mod pending;
pub mod stats;
mod worker;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::character::{CharacterSnapshot, CharacterStore, CheckpointStore};
use crate::drain::{BarrierOutcome, DrainQueue, EnqueueError};
use crate::retry::RetryQueue;
use crate::telemetry;
pub(crate) use final_retry::final_job;
pub use landed::{LandedWrites, UnsavedAges};
pub use pending::{MAX_PENDING_FINALS, UnsavedFinals};
pub use stats::{LatencyCounts, SaverStats, SaverStatsSnapshot};

/// Why a snapshot is being saved, which decides the tiers it reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SaveReason {
    /// The ~10 s cadence: Redis only.
    Checkpoint,
    /// The ~60 s cadence, a drain or a live reconcile: Redis and Postgres.
    Flush,
    /// Logout or leave: Redis and Postgres; over a moved row (a departed player's), a state job.
    Final,
}

impl SaveReason {
    /// Label used in metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Checkpoint => "checkpoint",
            Self::Flush => "flush",
            Self::Final => "final",
        }
    }

    /// True when the reason reaches Postgres.
    pub fn writes_row(self) -> bool {
        !matches!(self, Self::Checkpoint)
    }
}

/// What the saver tells the zone. Every event names the character and the epoch of the copy
/// it is about: a late event for an earlier session of the same character is not the current
/// session's.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SaverEvent {
    /// The row was written; the character's CAS token moves from `dumped_version` to `new_version`.
    Saved {
        /// The character.
        character_id: Uuid,
        /// The owner epoch of the copy whose snapshot this is about (a game matches events to
        /// the session they belong to by it).
        owner_epoch: i64,
        /// Why it was saved.
        reason: SaveReason,
        /// The version the snapshot was dumped at.
        dumped_version: i64,
        /// The row's version now.
        new_version: i64,
    },
    /// A live player's flush lost the version race: re-dump current state at `current_version`.
    FlushConflict {
        /// The character.
        character_id: Uuid,
        /// The owner epoch of the copy whose snapshot this is about (a game matches events to
        /// the session they belong to by it).
        owner_epoch: i64,
        /// The row's version.
        current_version: i64,
        /// The save that lost: a flush, or a logout's final save while its game still holds
        /// it ([`SaveFeedback::is_present`]). A flush answered after its copy left needs
        /// nothing: the copy's final save, dumped after it, holds everything it did.
        reason: SaveReason,
    },
    /// A newer owner holds the character: evict this copy. Terminal; never retried.
    OwnershipLost {
        /// The character.
        character_id: Uuid,
        /// The owner epoch of the copy whose snapshot this is about (a game matches events to
        /// the session they belong to by it).
        owner_epoch: i64,
        /// The row's epoch.
        current_epoch: i64,
    },
    /// The checkpoint holds a document of a newer schema than this copy's: a process with a
    /// newer model wrote it. Terminal for this copy, like an ownership loss. (A row upgraded
    /// under a live copy by a newer release is not this: the copy plays on, and its saves
    /// reach the row through state jobs that a newer worker upgrades.)
    SchemaOutdated {
        /// The character.
        character_id: Uuid,
        /// The owner epoch of the copy whose snapshot this is about (a game matches events to
        /// the session they belong to by it).
        owner_epoch: i64,
        /// The schema version stored.
        stored_schema: u32,
    },
    /// The checkpoint tier refused this copy: another owner with a higher epoch is writing it.
    DoubleOwn {
        /// The character.
        character_id: Uuid,
        /// The owner epoch of the copy whose snapshot this is about (a game matches events to
        /// the session they belong to by it).
        owner_epoch: i64,
        /// The checkpoint's epoch.
        stored_epoch: i64,
    },
    /// A logout's final save was written to neither the row nor a retry job (no retry queue,
    /// or too many pending); its checkpoint still holds it.
    FinalDropped {
        /// The character.
        character_id: Uuid,
        /// The owner epoch of the copy whose snapshot this is about (a game matches events to
        /// the session they belong to by it).
        owner_epoch: i64,
    },
    /// A logout's final save outlasted the outage budget (or the row moved under it) and is a
    /// durable `gameplay_state` retry job now, applied by the retry worker under the epoch fence.
    FinalQueuedAsJob {
        /// The character.
        character_id: Uuid,
        /// The owner epoch of the copy whose snapshot this is about (a game matches events to
        /// the session they belong to by it).
        owner_epoch: i64,
        /// The job.
        retry_job_id: Uuid,
    },
    /// The row does not exist.
    NotFound {
        /// The character.
        character_id: Uuid,
        /// The owner epoch of the copy whose snapshot this is about (a game matches events to
        /// the session they belong to by it).
        owner_epoch: i64,
    },
}

/// The zone side of the saver: where events go, and whether a player is still held.
pub trait SaveFeedback: Send + Sync + 'static {
    /// Delivers `event` without blocking.
    fn deliver(&self, event: SaverEvent);

    /// True while this shard holds `character_id` in a zone.
    fn is_present(&self, character_id: Uuid) -> bool;
}

impl SaverEvent {
    /// The character the event is about.
    pub fn character_id(&self) -> Uuid {
        match self {
            Self::Saved { character_id, .. }
            | Self::FlushConflict { character_id, .. }
            | Self::OwnershipLost { character_id, .. }
            | Self::SchemaOutdated { character_id, .. }
            | Self::DoubleOwn { character_id, .. }
            | Self::FinalDropped { character_id, .. }
            | Self::FinalQueuedAsJob { character_id, .. }
            | Self::NotFound { character_id, .. } => *character_id,
        }
    }

    /// The owner epoch of the copy whose snapshot the event is about.
    pub fn owner_epoch(&self) -> i64 {
        match self {
            Self::Saved { owner_epoch, .. }
            | Self::FlushConflict { owner_epoch, .. }
            | Self::OwnershipLost { owner_epoch, .. }
            | Self::SchemaOutdated { owner_epoch, .. }
            | Self::DoubleOwn { owner_epoch, .. }
            | Self::FinalDropped { owner_epoch, .. }
            | Self::FinalQueuedAsJob { owner_epoch, .. }
            | Self::NotFound { owner_epoch, .. } => *owner_epoch,
        }
    }
}

/// Tunables.
#[derive(Debug, Clone, Copy)]
pub struct SaverConfig {
    /// Queue entries that may wait (the document's 256). An entry is one save, or one pulse's
    /// slice of a zone queued with [`Saver::enqueue_many`].
    pub queue_depth: usize,
    /// Most queue entries one drain pass takes.
    pub max_batch: usize,
    /// Most snapshots per Redis pipeline and per batched CAS statement.
    pub write_chunk: usize,
    /// Bound on each Redis or Postgres operation.
    pub io_timeout: Duration,
    /// Final-flush rebase attempts (a saver without a retry queue only: with one, a final over
    /// a moved row becomes a state job).
    pub final_retries: u32,
    /// Time budget of the final-flush rebase loop.
    pub final_budget: Duration,
    /// How long a logout's final save keeps retrying directly, in the background, while
    /// Postgres is unreachable (the player is gone: no later cadence would write its last
    /// changes); after that it becomes a durable retry job, written when Postgres answers.
    pub final_outage_budget: Duration,
}

impl Default for SaverConfig {
    fn default() -> Self {
        Self {
            queue_depth: 256,
            max_batch: 64,
            write_chunk: 512,
            io_timeout: Duration::from_secs(5),
            final_retries: 8,
            final_budget: Duration::from_secs(2),
            final_outage_budget: Duration::from_secs(60),
        }
    }
}

/// One request to the saver.
#[derive(Debug, Clone)]
pub struct SaveRequest {
    /// Why.
    pub reason: SaveReason,
    /// What.
    pub snapshot: CharacterSnapshot,
    /// When the snapshot was taken (queued): what a landed write makes durable.
    pub dumped_at: std::time::Instant,
}

/// Whether a save request was queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnqueueOutcome {
    /// Queued for the drainer.
    Queued,
    /// Dropped: the queue was full.
    DroppedFull,
    /// Dropped: the saver has stopped.
    DroppedClosed,
}

/// Where a saver writes; any may be absent (with neither rows nor checkpoints every save is a
/// no-op: a storeless, ephemeral shard).
#[derive(Debug, Clone, Default)]
pub struct SaverSinks {
    /// Postgres rows (flushes and final saves).
    pub rows: Option<CharacterStore>,
    /// Redis checkpoints (every save).
    pub checkpoints: Option<CheckpointStore>,
    /// Where a logout save that outlasts a Postgres outage becomes a durable job. Without it
    /// such a save is given up (counted, logged) and only its checkpoint keeps it.
    pub retry: Option<RetryQueue>,
}

/// Handle on a shard's saver. Cheap to clone.
#[derive(Clone)]
pub struct Saver {
    queue: DrainQueue<Vec<SaveRequest>>,
    /// Saves in the queue's entries, not yet taken by the writer.
    waiting: Arc<AtomicUsize>,
    stats: Arc<SaverStats>,
    pending: pending::PendingFinals,
    landed: LandedWrites,
}

impl std::fmt::Debug for Saver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Saver")
            .field("depth", &self.queue.depth())
            .finish_non_exhaustive()
    }
}

impl Saver {
    /// Starts a saver writing to `sinks`. `cancel` is the shard's run context: cancelling it
    /// stops the drainer and abandons background final retries (a crash).
    pub fn spawn(
        sinks: SaverSinks,
        feedback: Arc<dyn SaveFeedback>,
        config: SaverConfig,
        cancel: CancellationToken,
    ) -> Self {
        let stats = Arc::new(SaverStats::default());
        let pending = pending::PendingFinals::default();
        let landed = LandedWrites::default();
        let waiting = Arc::new(AtomicUsize::new(0));
        let finals = sinks.rows.clone().map(|store| final_retry::FinalRetries {
            store,
            retry: sinks.retry.clone(),
            feedback: Arc::clone(&feedback),
            stats: Arc::clone(&stats),
            config,
            pending: pending.clone(),
            cancel: cancel.clone(),
        });
        let worker = worker::SaverWorker::new(
            sinks.rows,
            sinks.checkpoints,
            feedback,
            config,
            Arc::clone(&stats),
            finals,
        )
        .counting_finals(pending.clone())
        .counting_waiting(Arc::clone(&waiting))
        .recording(landed.clone());
        let (queue, _task) =
            DrainQueue::spawn(config.queue_depth, config.max_batch, worker, cancel);
        Self {
            queue,
            waiting,
            stats,
            pending,
            landed,
        }
    }

    /// When each character's snapshots last landed on each tier (the crash window).
    pub fn landed(&self) -> &LandedWrites {
        &self.landed
    }

    /// Queues a save without blocking; a full queue drops it (counted, logged).
    pub fn enqueue(&self, reason: SaveReason, snapshot: CharacterSnapshot) -> EnqueueOutcome {
        self.enqueue_many(reason, vec![snapshot])
    }

    /// Queues many saves as one queue entry (one pulse's slice of a zone) without blocking; a
    /// full queue drops them all (counted per snapshot, logged once).
    pub fn enqueue_many(
        &self,
        reason: SaveReason,
        snapshots: Vec<CharacterSnapshot>,
    ) -> EnqueueOutcome {
        match self.push(reason, snapshots) {
            Ok(()) => EnqueueOutcome::Queued,
            Err(EnqueueError::Full(dropped)) => {
                self.record_dropped(reason, &dropped, "full");
                EnqueueOutcome::DroppedFull
            }
            Err(EnqueueError::Closed(dropped)) => {
                self.record_dropped(reason, &dropped, "closed");
                EnqueueOutcome::DroppedClosed
            }
        }
    }

    /// Queues many saves as one queue entry without blocking, handing them back when the queue
    /// is full so the caller can offer them again (nothing is counted as dropped). A closed
    /// saver drops them, counted and logged as [`Saver::enqueue_many`] does.
    pub fn offer_many(
        &self,
        reason: SaveReason,
        snapshots: Vec<CharacterSnapshot>,
    ) -> Result<(), Vec<CharacterSnapshot>> {
        match self.push(reason, snapshots) {
            Ok(()) => Ok(()),
            Err(EnqueueError::Full(back)) => Err(back),
            Err(EnqueueError::Closed(dropped)) => {
                self.record_dropped(reason, &dropped, "closed");
                Ok(())
            }
        }
    }

    /// One queue entry of `snapshots`; what the queue refused comes back.
    fn push(
        &self,
        reason: SaveReason,
        snapshots: Vec<CharacterSnapshot>,
    ) -> Result<(), EnqueueError<Vec<CharacterSnapshot>>> {
        if snapshots.is_empty() {
            return Ok(());
        }
        let dumped_at = std::time::Instant::now();
        let requests: Vec<SaveRequest> = snapshots
            .into_iter()
            .map(|snapshot| SaveRequest {
                reason,
                snapshot,
                dumped_at,
            })
            .collect();
        let unwrap =
            |requests: Vec<SaveRequest>| requests.into_iter().map(|r| r.snapshot).collect();
        let finals: Vec<Uuid> = if reason == SaveReason::Final {
            requests.iter().map(|r| r.snapshot.character_id).collect()
        } else {
            Vec::new()
        };
        // Counted before the drainer can see them, taken back if the queue refuses them.
        self.pending.queued(finals.iter().copied());
        let count = requests.len();
        self.waiting.fetch_add(count, Ordering::Relaxed);
        let refused = |requests: Vec<SaveRequest>| {
            self.pending.dequeued(finals);
            self.waiting.fetch_sub(count, Ordering::Relaxed);
            unwrap(requests)
        };
        let result = match self.queue.try_enqueue(requests) {
            Ok(()) => Ok(()),
            Err(EnqueueError::Full(requests)) => Err(EnqueueError::Full(refused(requests))),
            Err(EnqueueError::Closed(requests)) => Err(EnqueueError::Closed(refused(requests))),
        };
        metrics::gauge!(telemetry::SAVER_QUEUE_DEPTH).set(self.queue.depth() as f64);
        result
    }

    fn record_dropped(
        &self,
        reason: SaveReason,
        dropped: &[CharacterSnapshot],
        cause: &'static str,
    ) {
        let count = dropped.len() as u64;
        let first = dropped.first().map(|s| s.character_id).unwrap_or_default();
        self.stats.record_drop(reason, count);
        metrics::counter!(telemetry::SAVER_DROPPED_TOTAL, "reason" => reason.as_str(), "cause" => cause)
            .increment(count);
        tracing::warn!(event = "save_dropped", character = %first, count, reason = reason.as_str(), cause);
    }

    /// Waits, at most `bound`, until every save queued so far finished its I/O, including the
    /// logout saves still retrying in the background: `Drained` means each is in its row or a
    /// durable retry job (or was fenced). `TimedOut` when the bound ran out first;
    /// [`Saver::unsaved_finals`] then says what is left.
    pub async fn barrier(&self, bound: Duration) -> BarrierOutcome {
        let deadline = tokio::time::Instant::now() + bound;
        let queued = self.queue.barrier(bound).await;
        if queued != BarrierOutcome::Drained {
            return queued;
        }
        if self.pending.settled_by(deadline).await {
            BarrierOutcome::Drained
        } else {
            BarrierOutcome::TimedOut
        }
    }

    /// Logout saves not yet durable: still queued, or retrying through an outage, or waiting to
    /// become a job.
    pub fn unsaved_finals(&self) -> UnsavedFinals {
        self.pending.unsaved()
    }

    /// True while a logout save of `character_id` is still in this saver: queued, or retrying
    /// through an outage, or waiting to become a retry job. Its changes are in neither the row
    /// nor a job yet, so a login must not claim the character until this turns false: the claim
    /// would load the older row and fence the save out.
    pub fn final_in_flight(&self, character_id: Uuid) -> bool {
        self.pending.in_flight(character_id)
    }

    /// Stops the saver at once; queued saves are abandoned.
    pub fn abort(&self) {
        self.queue.cancel();
    }

    /// Queue entries waiting.
    pub fn depth(&self) -> usize {
        self.queue.depth()
    }

    /// Queue entries the queue holds at most.
    pub fn capacity(&self) -> usize {
        self.queue.capacity()
    }

    /// Saves waiting in the queue's entries (an entry is one save or a pulse's slice of many),
    /// not yet taken by the writer.
    pub fn waiting_saves(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Counters since start.
    pub fn stats(&self) -> SaverStatsSnapshot {
        self.stats.snapshot()
    }
}
