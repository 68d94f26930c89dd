//! Retry backoff: exponential in milliseconds from a configured base, capped, with jitter. One
//! helper for every payload kind.

use std::time::Duration;

/// Backoff settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first failure (`PERSISTENCE_RETRY_BACKOFF_MILLIS`).
    pub base: Duration,
    /// Longest delay.
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(500),
            cap: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// Settings with `base_millis` (from `PERSISTENCE_RETRY_BACKOFF_MILLIS`) and the default cap.
    pub fn from_base_millis(base_millis: u64) -> Self {
        Self {
            base: Duration::from_millis(base_millis.max(1)),
            ..Self::default()
        }
    }

    /// The undithered delay after the `attempt`-th failure (1-based): `base × 2^(attempt−1)`,
    /// capped.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(32);
        let millis = (self.base.as_millis() as u64).saturating_mul(1u64 << exponent);
        Duration::from_millis(millis).min(self.cap)
    }

    /// The delay after the `attempt`-th failure with "equal jitter": half fixed, half drawn from
    /// `unit` (a number in `[0, 1)`), so retries of many jobs spread out but never come sooner
    /// than half the ceiling.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let ceiling = self.ceiling(attempt);
        let half = ceiling / 2;
        half + half.mul_f64(unit.clamp(0.0, 1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_doubles_from_the_base_up_to_the_cap() {
        let backoff = Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(5),
        };
        let ceilings: Vec<u128> = (1..=8).map(|a| backoff.ceiling(a).as_millis()).collect();
        assert_eq!(ceilings, vec![100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(backoff.ceiling(1_000), Duration::from_secs(5));
    }

    #[test]
    fn jitter_stays_between_half_and_the_ceiling() {
        let backoff = Backoff::from_base_millis(1000);
        assert_eq!(backoff.delay(3, 0.0), Duration::from_millis(2000));
        assert_eq!(backoff.delay(3, 0.5), Duration::from_millis(3000));
        assert!(backoff.delay(3, 0.999_999) <= Duration::from_millis(4000));
        assert_eq!(backoff.delay(3, 7.0), Duration::from_millis(4000));
    }
}
