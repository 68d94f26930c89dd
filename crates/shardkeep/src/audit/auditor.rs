//! The asynchronous auditor: shard-side events (deaths, grants, track steps, item transfers) are
//! queued without blocking and written off the simulation thread, up to 64 per round trip. When
//! a batch fails, its rows are retried one by one under the same deadline, so one poison row
//! loses only itself and a wedged database cannot stretch the drain. Shutdown drains through
//! the same barrier as the saver.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::event::AuditEvent;
use super::store::AuditStore;
use crate::drain::{BarrierOutcome, BatchHandler, DrainQueue};
use crate::telemetry;

/// Tunables.
#[derive(Debug, Clone, Copy)]
pub struct AuditorConfig {
    /// Events that may wait (256).
    pub queue_depth: usize,
    /// Events per round trip (64).
    pub max_batch: usize,
    /// Bound on one batch, fallback included.
    pub io_timeout: Duration,
}

impl Default for AuditorConfig {
    fn default() -> Self {
        Self {
            queue_depth: 256,
            max_batch: 64,
            io_timeout: Duration::from_secs(5),
        }
    }
}

/// Counters since start.
#[derive(Debug, Default)]
struct Counters {
    emitted: AtomicU64,
    dropped: AtomicU64,
    recorded: AtomicU64,
    duplicates: AtomicU64,
    failed: AtomicU64,
    batches: AtomicU64,
    fallbacks: AtomicU64,
}

/// A copy of the auditor's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct AuditorStats {
    /// Events accepted into the queue.
    pub emitted: u64,
    /// Events dropped because the queue was full (or the auditor stopped).
    pub dropped: u64,
    /// Events written.
    pub recorded: u64,
    /// Events already recorded (idempotent repeats).
    pub duplicates: u64,
    /// Events that could not be written.
    pub failed: u64,
    /// Batches written.
    pub batches: u64,
    /// Batches that fell back to row-by-row.
    pub fallbacks: u64,
}

/// Handle on a shard's auditor. Cheap to clone. A disabled auditor accepts and discards.
#[derive(Clone)]
pub struct Auditor {
    inner: Option<(DrainQueue<AuditEvent>, Arc<Counters>)>,
}

impl std::fmt::Debug for Auditor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auditor")
            .field("enabled", &self.inner.is_some())
            .finish()
    }
}

struct AuditWorker {
    store: AuditStore,
    timeout: Duration,
    counters: Arc<Counters>,
}

impl BatchHandler<AuditEvent> for AuditWorker {
    async fn handle(&mut self, batch: Vec<AuditEvent>) {
        let deadline = Instant::now() + self.timeout;
        self.counters.batches.fetch_add(1, Ordering::Relaxed);
        metrics::histogram!(telemetry::AUDIT_BATCH_SIZE).record(batch.len() as f64);
        let attempt = self.store.record(&batch);
        match tokio::time::timeout_at(deadline, attempt).await {
            Ok(Ok(inserted)) => self.count(inserted, batch.len() as u64, 0),
            Ok(Err(err)) => {
                self.counters.fallbacks.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(event = "audit_batch_failed", events = batch.len(), error = %err, "retrying row by row");
                self.row_by_row(&batch, deadline).await;
            }
            Err(_) => {
                self.count(0, 0, batch.len() as u64);
                tracing::warn!(event = "audit_batch_timeout", events = batch.len());
            }
        }
    }
}

impl AuditWorker {
    fn count(&self, inserted: u64, attempted: u64, failed: u64) {
        self.counters
            .recorded
            .fetch_add(inserted, Ordering::Relaxed);
        self.counters
            .duplicates
            .fetch_add(attempted.saturating_sub(inserted), Ordering::Relaxed);
        self.counters.failed.fetch_add(failed, Ordering::Relaxed);
    }

    async fn row_by_row(&self, batch: &[AuditEvent], deadline: Instant) {
        for (i, event) in batch.iter().enumerate() {
            let one = self.store.record(std::slice::from_ref(event));
            match tokio::time::timeout_at(deadline, one).await {
                Ok(Ok(inserted)) => self.count(inserted, 1, 0),
                Ok(Err(err)) => {
                    self.count(0, 0, 1);
                    tracing::warn!(event = "audit_row_failed", subject = %event.subject_id, kind = event.kind.as_str(), error = %err);
                }
                Err(_) => {
                    let lost = (batch.len() - i) as u64;
                    self.count(0, 0, lost);
                    tracing::warn!(event = "audit_fallback_timeout", lost);
                    return;
                }
            }
        }
    }
}

impl Auditor {
    /// An auditor that records nothing (no store configured).
    pub fn disabled() -> Self {
        Self { inner: None }
    }

    /// Starts an auditor writing to `store`; `cancel` is the shard's run context.
    pub fn spawn(store: AuditStore, config: AuditorConfig, cancel: CancellationToken) -> Self {
        let counters = Arc::new(Counters::default());
        let worker = AuditWorker {
            store,
            timeout: config.io_timeout,
            counters: Arc::clone(&counters),
        };
        let (queue, _task) =
            DrainQueue::spawn(config.queue_depth, config.max_batch, worker, cancel);
        Self {
            inner: Some((queue, counters)),
        }
    }

    /// Queues `event` without blocking; false when it was dropped (queue full).
    pub fn emit(&self, event: AuditEvent) -> bool {
        let Some((queue, counters)) = &self.inner else {
            return true;
        };
        let queued = queue.try_enqueue(event).is_ok();
        metrics::gauge!(telemetry::AUDIT_QUEUE_DEPTH).set(queue.depth() as f64);
        if queued {
            counters.emitted.fetch_add(1, Ordering::Relaxed);
        } else {
            counters.dropped.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(telemetry::AUDIT_DROPPED_TOTAL).increment(1);
            tracing::warn!(event = "audit_dropped");
        }
        queued
    }

    /// Waits, at most `bound`, until every queued event has been written (or given up on).
    pub async fn barrier(&self, bound: Duration) -> BarrierOutcome {
        match &self.inner {
            Some((queue, _)) => queue.barrier(bound).await,
            None => BarrierOutcome::Drained,
        }
    }

    /// Events waiting.
    pub fn depth(&self) -> usize {
        self.inner.as_ref().map_or(0, |(queue, _)| queue.depth())
    }

    /// Counters since start (zero for a disabled auditor).
    pub fn stats(&self) -> AuditorStats {
        let Some((_, c)) = &self.inner else {
            return AuditorStats::default();
        };
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        AuditorStats {
            emitted: get(&c.emitted),
            dropped: get(&c.dropped),
            recorded: get(&c.recorded),
            duplicates: get(&c.duplicates),
            failed: get(&c.failed),
            batches: get(&c.batches),
            fallbacks: get(&c.fallbacks),
        }
    }

    /// Stops at once; queued events are abandoned.
    pub fn abort(&self) {
        if let Some((queue, _)) = &self.inner {
            queue.cancel();
        }
    }
}
