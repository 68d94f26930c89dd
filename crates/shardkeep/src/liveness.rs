//! Whether a background worker is making progress: each finished pass touches its
//! [`Liveness`]; readiness checks fail a worker that has finished none for a while with work
//! waiting, so a worker that says running while processing nothing is seen.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The time of a worker's last finished pass. Cheap to clone; clones share it.
#[derive(Debug, Clone)]
pub struct Liveness {
    origin: Instant,
    /// Milliseconds after `origin` of the last pass.
    last_ms: Arc<AtomicU64>,
}

impl Default for Liveness {
    /// Counts as touched now (a worker just started has not stalled yet).
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last_ms: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl Liveness {
    /// Records a finished pass.
    pub fn touch(&self) {
        let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// Time since the last finished pass (or since it was made).
    pub fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.origin.elapsed().saturating_sub(last)
    }

    /// True when no pass finished for longer than `bound` while `pending` work waits.
    pub fn stalled(&self, pending: u64, bound: Duration) -> bool {
        pending > 0 && self.idle_for() > bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_stalls_only_with_work_waiting_and_no_recent_pass() {
        let live = Liveness::default();
        assert!(!live.stalled(10, Duration::from_secs(60)));
        std::thread::sleep(Duration::from_millis(30));
        assert!(live.stalled(10, Duration::from_millis(10)));
        assert!(!live.stalled(0, Duration::from_millis(10)), "nothing waits");
        live.touch();
        assert!(!live.stalled(10, Duration::from_millis(10)));
        let shared = live.clone();
        std::thread::sleep(Duration::from_millis(30));
        assert!(shared.stalled(1, Duration::from_millis(10)));
    }
}
