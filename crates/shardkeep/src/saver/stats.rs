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
    write_latency: [AtomicU64; LATENCY_BUCKETS],
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
    /// Logout final saves that became durable retry jobs (a long outage, or the row moved under them).
    pub final_queued_as_job: u64,
    /// Checkpoint requests dropped at enqueue.
    pub dropped_checkpoint: u64,
    /// Flush and final requests dropped at enqueue.
    pub dropped_row: u64,
    /// Store calls (checkpoint pipelines and CAS statements) by how long they took.
    pub write_latency: LatencyCounts,
}

/// Buckets of [`LatencyCounts`].
pub const LATENCY_BUCKETS: usize = 32;
/// Upper bound of the first latency bucket, in microseconds.
const FIRST_BUCKET_MICROS: f64 = 250.0;

/// Store calls counted by duration in buckets growing by √2 from 250 µs (the last one is open):
/// a percentile read from them is within a factor of √2 of the true one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LatencyCounts(pub [u64; LATENCY_BUCKETS]);

impl LatencyCounts {
    /// The bucket a call of `elapsed` falls in.
    pub fn bucket(elapsed: std::time::Duration) -> usize {
        let micros = elapsed.as_secs_f64() * 1e6;
        if micros <= FIRST_BUCKET_MICROS {
            return 0;
        }
        let steps = (2.0 * (micros / FIRST_BUCKET_MICROS).log2()).ceil();
        (steps as usize).min(LATENCY_BUCKETS - 1)
    }

    /// The upper bound of bucket `index` (the last bucket reports its lower bound).
    pub fn bound(index: usize) -> std::time::Duration {
        let index = index.min(LATENCY_BUCKETS - 2) as f64;
        std::time::Duration::from_secs_f64(FIRST_BUCKET_MICROS * 2f64.powf(index / 2.0) / 1e6)
    }

    /// Calls counted.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &LatencyCounts) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }

    /// What `self` counted beyond `earlier` (a later copy of the same counters).
    pub fn since(&self, earlier: &LatencyCounts) -> LatencyCounts {
        let mut out = LatencyCounts::default();
        for (n, (a, b)) in self.0.iter().zip(earlier.0).enumerate() {
            out.0[n] = a.saturating_sub(b);
        }
        out
    }

    /// The bound under which a fraction `q` (0 to 1) of the calls fell; `None` with no calls.
    pub fn quantile(&self, q: f64) -> Option<std::time::Duration> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let wanted = ((total as f64) * q.clamp(0.0, 1.0)).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (index, count) in self.0.iter().enumerate() {
            seen += count;
            if seen >= wanted {
                return Some(Self::bound(index));
            }
        }
        Some(Self::bound(LATENCY_BUCKETS - 1))
    }
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
    /// Counts one store call that took `elapsed`.
    pub fn record_write_latency(&self, elapsed: std::time::Duration) {
        self.write_latency[LatencyCounts::bucket(elapsed)].fetch_add(1, Ordering::Relaxed);
    }

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
            write_latency: LatencyCounts(std::array::from_fn(|n| get(&self.write_latency[n]))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn latencies_fall_in_buckets_whose_bounds_hold_them() {
        for micros in [1u64, 250, 251, 400, 1_000, 9_999, 120_000, 2_500_000] {
            let elapsed = Duration::from_micros(micros);
            let bucket = LatencyCounts::bucket(elapsed);
            assert!(LatencyCounts::bound(bucket) >= elapsed, "{micros} µs");
            if bucket > 0 {
                assert!(LatencyCounts::bound(bucket - 1) < elapsed, "{micros} µs");
            }
        }
        assert_eq!(
            LatencyCounts::bucket(Duration::from_secs(3600)),
            LATENCY_BUCKETS - 1
        );
    }

    #[test]
    fn the_quantile_is_read_from_the_counts_and_a_difference_of_copies() {
        let stats = SaverStats::default();
        assert_eq!(stats.snapshot().write_latency.quantile(0.99), None);
        for _ in 0..98 {
            stats.record_write_latency(Duration::from_millis(1));
        }
        stats.record_write_latency(Duration::from_millis(200));
        stats.record_write_latency(Duration::from_millis(200));
        let first = stats.snapshot().write_latency;
        assert_eq!(first.total(), 100);
        let p50 = first.quantile(0.5).unwrap();
        assert!(p50 >= Duration::from_millis(1) && p50 < Duration::from_micros(1_500));
        let p99 = first.quantile(0.99).unwrap();
        assert!(p99 >= Duration::from_millis(200) && p99 < Duration::from_millis(290));
        stats.record_write_latency(Duration::from_millis(5));
        let later = stats.snapshot().write_latency.since(&first);
        assert_eq!(later.total(), 1);
        assert!(later.quantile(0.99).unwrap() >= Duration::from_millis(5));
    }
}
