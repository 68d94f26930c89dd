//! Saver counters, readable at any time without a metrics exporter.

use std::sync::atomic::{AtomicU64, Ordering};

use super::SaveReason;

/// Live counters (atomics).
#[derive(Debug, Default)]
pub struct SaverStats {
    checkpoint_attempted: AtomicU64,
    checkpoint_landed: AtomicU64,
    checkpoint_refused: AtomicU64,
    checkpoint_failed: AtomicU64,
    row_attempted: AtomicU64,
    row_landed: AtomicU64,
    row_conflicts: AtomicU64,
    row_ownership_lost: AtomicU64,
    row_failed: AtomicU64,
    final_dropped: AtomicU64,
    final_queued_as_job: AtomicU64,
    dropped_checkpoint: AtomicU64,
    dropped_row: AtomicU64,
}

/// A copy of the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SaverStatsSnapshot {
    /// Checkpoint writes attempted.
    pub checkpoint_attempted: u64,
    /// Checkpoint writes stored.
    pub checkpoint_landed: u64,
    /// Checkpoint writes refused by the ownership guard.
    pub checkpoint_refused: u64,
    /// Checkpoint writes that failed (Redis down, timeout).
    pub checkpoint_failed: u64,
    /// Row (CAS) writes attempted.
    pub row_attempted: u64,
    /// Row writes that landed.
    pub row_landed: u64,
    /// Row writes that lost the version race.
    pub row_conflicts: u64,
    /// Row writes fenced by a newer owner.
    pub row_ownership_lost: u64,
    /// Row writes that failed (Postgres down, timeout).
    pub row_failed: u64,
    /// Logout final saves written to neither the row nor a retry job (their checkpoints keep
    /// them).
    pub final_dropped: u64,
    /// Logout final saves that became durable retry jobs (a long outage, or no rebase won).
    pub final_queued_as_job: u64,
    /// Checkpoint requests dropped at enqueue.
    pub dropped_checkpoint: u64,
    /// Flush and final requests dropped at enqueue.
    pub dropped_row: u64,
}

macro_rules! bump {
    ($($name:ident),* $(,)?) => {
        impl SaverStats {
            $(
                #[doc = concat!("Adds `n` to `", stringify!($name), "`.")]
                pub fn $name(&self, n: u64) {
                    self.$name.fetch_add(n, Ordering::Relaxed);
                }
            )*
        }
    };
}

bump!(
    checkpoint_attempted,
    checkpoint_landed,
    checkpoint_refused,
    checkpoint_failed,
    row_attempted,
    row_landed,
    row_conflicts,
    row_ownership_lost,
    row_failed,
    final_dropped,
    final_queued_as_job,
);

impl SaverStats {
    /// Counts `count` requests dropped at enqueue.
    pub fn record_drop(&self, reason: SaveReason, count: u64) {
        if reason.writes_row() {
            self.dropped_row.fetch_add(count, Ordering::Relaxed);
        } else {
            self.dropped_checkpoint.fetch_add(count, Ordering::Relaxed);
        }
    }

    /// A consistent-enough copy (each counter read once).
    pub fn snapshot(&self) -> SaverStatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SaverStatsSnapshot {
            checkpoint_attempted: get(&self.checkpoint_attempted),
            checkpoint_landed: get(&self.checkpoint_landed),
            checkpoint_refused: get(&self.checkpoint_refused),
            checkpoint_failed: get(&self.checkpoint_failed),
            row_attempted: get(&self.row_attempted),
            row_landed: get(&self.row_landed),
            row_conflicts: get(&self.row_conflicts),
            row_ownership_lost: get(&self.row_ownership_lost),
            row_failed: get(&self.row_failed),
            final_dropped: get(&self.final_dropped),
            final_queued_as_job: get(&self.final_queued_as_job),
            dropped_checkpoint: get(&self.dropped_checkpoint),
            dropped_row: get(&self.dropped_row),
        }
    }
}
