//! Persistence retry jobs: writes that could not finish synchronously, kept on Postgres or in
//! the embedded store's file (`job_tx`: one settle, two drivers).
//!
//! Durable first, then signal: [`RetryQueue::enqueue`] inserts the row and only then offers its
//! id to the worker's bounded channel; a full or closed channel leaves the row to the poll. The
//! [`RetryWorker`] claims signaled ids (batches growing with the load) and polls due rows (`FOR
//! UPDATE SKIP LOCKED`), settles each claimed batch in the transaction that claimed it (its row
//! locks are the lease; a batch that fails is claimed again under a 30 s lease and settled job
//! by job), and dead-letters jobs that exhaust their attempts or cannot be decoded.
//!
//! - [`job`] — the job and the idempotency envelope.
//! - [`payload`] — what a job writes: the core's kinds, or a game effect.
//! - [`policy`] — origin → session impact, the only place that decides it.
//! - [`backoff`] — the retry delay.
//! - `apply` — how each payload changes a character row (pure).
//! - `coalesce` — concurrent enqueues stored in one statement.
//! - `store` — insert, claim, inspect, requeue.
//! - `job_tx` — the driver: where jobs are kept, and a settle's transaction step by step;
//!   `sqlite_jobs`, `sqlite_settle` and `sqlite_dead_letters` are the embedded store's
//!   statements.
//! - `settle` — one batch's transaction; `settle_writes` — the batched writes that end it.
//! - [`worker`] — the worker loop.

pub(crate) mod apply;
mod at_claim;
pub mod backoff;
mod coalesce;
mod counts;
mod dead_letters;
pub(crate) mod effects;
pub mod job;
pub(crate) mod job_tx;
pub mod payload;
pub mod policy;
mod settle;
mod settle_writes;
mod sqlite_dead_letters;
mod sqlite_jobs;
mod sqlite_settle;
mod store;
pub mod worker;

use std::sync::Arc;

use tokio::sync::mpsc;
use uuid::Uuid;

use crate::backend::{PostgresBackend, SqliteBackend};
use crate::clock::Clock;
use crate::telemetry;
use job_tx::JobStore;

pub(crate) use at_claim::{SettledAtClaim, settle_before_claim};
pub use backoff::Backoff;
pub use dead_letters::{
    DeadLetterDetail, DeadLetterInspection, DeadLetterSummary, MAX_INSPECT_LIMIT,
};
pub use job::{IdempotencyEnvelope, InvalidJob, OFFLINE_EPOCH, PersistenceRetryJob};
pub use payload::{CoreWrite, PersistenceRetryPayload};
pub use policy::{Origin, SessionImpact, session_impact};
pub use settle::{DEFERRED_FOR, JobOutcome};
pub use store::{CLAIM_STATEMENTS, ClaimStatement, RequeueError, RequeueOutcome};
pub use worker::{ClaimedBatch, RetryPause, RetryStats, RetryWorker, RetryWorkerConfig};

/// Why a job was left to polling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurableOnlyReason {
    /// The signal channel was full.
    QueueFull,
    /// The worker is gone.
    QueueClosed,
}

/// How an enqueue ended. Either way the job is durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnqueueOutcome {
    /// Stored and signaled to the worker.
    Signaled,
    /// Stored; the worker will find it by polling.
    DurableOnly(DurableOnlyReason),
}

/// A retry call failed.
#[derive(Debug, thiserror::Error)]
pub enum RetryError {
    /// The store failed; for an enqueue, nothing was queued.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// A requeue failed.
    #[error(transparent)]
    Requeue(#[from] RequeueError),
}

/// Producer handle on the retry jobs. Cheap to clone; clones store concurrent enqueues together.
#[derive(Debug, Clone)]
pub struct RetryQueue {
    jobs: JobStore,
    signal: mpsc::Sender<Uuid>,
    clock: Arc<dyn Clock>,
    waiting: Arc<coalesce::Coalescer>,
}

/// The worker's end of the signal channel.
#[derive(Debug)]
pub struct RetrySignals(pub(crate) mpsc::Receiver<Uuid>);

impl RetryQueue {
    /// True once the activation of transfer `token` of `character_id` is recorded durably (its
    /// `transfer_activation` job settled). The Redis activation marker is bookkeeping (a failover
    /// run has left transfers whose markers were gone): a source waiting for the marker asks
    /// this to end the transfer anyway.
    pub async fn transfer_activation_recorded(
        &self,
        character_id: Uuid,
        token: &str,
    ) -> Result<bool, sqlx::Error> {
        self.jobs.activation_recorded(character_id, token).await
    }

    /// A queue over `pg` whose signal channel holds `signal_depth` ids.
    pub fn new(
        pg: PostgresBackend,
        signal_depth: usize,
        clock: Arc<dyn Clock>,
    ) -> (Self, RetrySignals) {
        Self::over(JobStore::Postgres(pg), signal_depth, clock)
    }

    /// A queue in the embedded store's file `db`, whose signal channel holds `signal_depth` ids.
    pub fn embedded(
        db: SqliteBackend,
        signal_depth: usize,
        clock: Arc<dyn Clock>,
    ) -> (Self, RetrySignals) {
        Self::over(JobStore::Embedded(db), signal_depth, clock)
    }

    fn over(jobs: JobStore, signal_depth: usize, clock: Arc<dyn Clock>) -> (Self, RetrySignals) {
        let (signal, receiver) = mpsc::channel(signal_depth.max(1));
        let waiting = coalesce::coalescer(jobs.clone());
        (
            Self {
                jobs,
                signal,
                clock,
                waiting,
            },
            RetrySignals(receiver),
        )
    }

    /// Stores `job`, then signals the worker. An insert failure comes back: nothing was queued.
    /// Enqueueing the same job again (a retry after a lost reply) stores it once. Enqueues made
    /// at the same time are stored in one statement and commit (see `coalesce`); each returns
    /// once its own job is committed.
    pub async fn enqueue(&self, job: &PersistenceRetryJob) -> Result<EnqueueOutcome, RetryError> {
        coalesce::insert_job(&self.waiting, job, self.clock.now()).await?;
        metrics::counter!(telemetry::RETRY_ENQUEUED_TOTAL, "kind" => job.payload().kind().to_owned())
            .increment(1);
        Ok(self.signal(job.retry_job_id()))
    }

    fn signal(&self, id: Uuid) -> EnqueueOutcome {
        match self.signal.try_send(id) {
            Ok(()) => EnqueueOutcome::Signaled,
            Err(err) => {
                let reason = match err {
                    mpsc::error::TrySendError::Full(_) => DurableOnlyReason::QueueFull,
                    mpsc::error::TrySendError::Closed(_) => DurableOnlyReason::QueueClosed,
                };
                let label = match reason {
                    DurableOnlyReason::QueueFull => "queue_full",
                    DurableOnlyReason::QueueClosed => "queue_closed",
                };
                metrics::counter!(telemetry::RETRY_DURABLE_ONLY_TOTAL, "reason" => label)
                    .increment(1);
                tracing::warn!(event = "retry_durable_only", retry_job_id = %id, reason = label,
                    "job stored; the worker will find it by polling");
                EnqueueOutcome::DurableOnly(reason)
            }
        }
    }

    /// The pending count, the active dead-letter count and the newest `limit` (clamped to
    /// 1..=500) active dead letters.
    pub async fn dead_letters_inspect(
        &self,
        limit: i64,
    ) -> Result<DeadLetterInspection, RetryError> {
        Ok(dead_letters::inspect(&self.jobs, 0, limit, None).await?)
    }

    /// Retry jobs waiting or leased, and active dead letters (no rows read).
    pub async fn depths(&self) -> Result<(i64, i64), RetryError> {
        Ok(dead_letters::counts(&self.jobs).await?)
    }

    /// Like [`RetryQueue::dead_letters_inspect`], a page of `limit` after skipping `offset`,
    /// only `character`'s when given.
    pub async fn dead_letters_page(
        &self,
        offset: i64,
        limit: i64,
        character: Option<&crate::operator::CharacterFilter>,
    ) -> Result<DeadLetterInspection, RetryError> {
        Ok(dead_letters::inspect(&self.jobs, offset, limit, character).await?)
    }

    /// One retention pass over the dead letters (see [`crate::queue::DeadLetterRetention`]).
    pub async fn dead_letters_prune(
        &self,
        retention: crate::queue::DeadLetterRetention,
    ) -> Result<u64, RetryError> {
        let removed = dead_letters::prune(&self.jobs, retention, self.clock.now()).await?;
        metrics::counter!(telemetry::DEAD_LETTERS_PRUNED_TOTAL, "kind" => "retry")
            .increment(removed);
        Ok(removed)
    }

    /// One active dead letter with its payload, and whether a transfer activation it carries is
    /// already recorded (what an operator checks before a requeue).
    pub async fn dead_letter_detail(
        &self,
        dead_letter_id: Uuid,
    ) -> Result<Option<DeadLetterDetail>, RetryError> {
        Ok(dead_letters::detail(&self.jobs, dead_letter_id).await?)
    }

    /// Restores an active dead letter as a fresh job (new id, no attempts) and signals the
    /// worker — all or nothing. Unknown or already requeued: `NotRequeued`.
    pub async fn dead_letters_requeue(
        &self,
        dead_letter_id: Uuid,
    ) -> Result<RequeueOutcome, RetryError> {
        let outcome = store::requeue(&self.jobs, dead_letter_id, self.clock.now()).await?;
        if let RequeueOutcome::Requeued { retry_job_id } = outcome {
            metrics::counter!(telemetry::RETRY_REQUEUED_TOTAL).increment(1);
            self.signal(retry_job_id);
        }
        Ok(outcome)
    }
}
