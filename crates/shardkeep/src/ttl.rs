//! A validated, strictly positive time-to-live.

use std::time::Duration;

/// A time-to-live of at least one millisecond.
///
/// Built only through the checked constructors, so a zero or negative TTL (which Redis would turn
/// into an immediate delete or an error) never reaches a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ttl(Duration);

/// A TTL was zero, negative or unreasonably large.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TtlError {
    /// Zero or negative.
    #[error("TTL must be positive, got {millis} ms")]
    NotPositive {
        /// The rejected value in milliseconds.
        millis: i64,
    },
    /// Longer than [`Ttl::MAX`].
    #[error("TTL of {millis} ms exceeds the maximum of one year")]
    TooLong {
        /// The rejected value in milliseconds.
        millis: i128,
    },
}

impl Ttl {
    /// Longest TTL accepted: one year.
    pub const MAX: Duration = Duration::from_secs(365 * 24 * 60 * 60);

    /// A TTL from a constant number of seconds; evaluated at compile time in `const` items, where
    /// an out-of-range value fails the build.
    pub const fn from_static_secs(secs: u64) -> Self {
        assert!(
            secs > 0 && secs <= 365 * 24 * 60 * 60,
            "TTL constant out of range"
        );
        Self(Duration::from_secs(secs))
    }

    /// A TTL of `millis` milliseconds.
    pub fn from_millis(millis: i64) -> Result<Self, TtlError> {
        if millis <= 0 {
            return Err(TtlError::NotPositive { millis });
        }
        Self::try_from(Duration::from_millis(millis.unsigned_abs()))
    }

    /// A TTL of `secs` seconds.
    pub fn from_secs(secs: i64) -> Result<Self, TtlError> {
        if secs <= 0 {
            return Err(TtlError::NotPositive {
                millis: secs.saturating_mul(1000),
            });
        }
        Self::from_millis(secs.saturating_mul(1000))
    }

    /// The TTL as a duration.
    pub fn duration(self) -> Duration {
        self.0
    }

    /// Whole milliseconds, as Redis `PX` wants them.
    pub fn as_millis(self) -> u64 {
        // Bounded by `MAX`, so this never truncates.
        u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX)
    }
}

impl TryFrom<Duration> for Ttl {
    type Error = TtlError;

    fn try_from(value: Duration) -> Result<Self, Self::Error> {
        if value.as_millis() == 0 {
            return Err(TtlError::NotPositive { millis: 0 });
        }
        if value > Self::MAX {
            return Err(TtlError::TooLong {
                millis: i128::try_from(value.as_millis()).unwrap_or(i128::MAX),
            });
        }
        Ok(Self(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_negative_are_rejected() {
        assert_eq!(Ttl::from_secs(0), Err(TtlError::NotPositive { millis: 0 }));
        assert_eq!(
            Ttl::from_secs(-5),
            Err(TtlError::NotPositive { millis: -5000 })
        );
        assert_eq!(
            Ttl::from_millis(-1),
            Err(TtlError::NotPositive { millis: -1 })
        );
        assert!(Ttl::try_from(Duration::from_micros(999)).is_err());
        assert!(Ttl::try_from(Duration::from_secs(400 * 24 * 3600)).is_err());
    }

    #[test]
    fn positive_values_convert() {
        assert_eq!(Ttl::from_secs(3).map(Ttl::as_millis), Ok(3000));
        assert_eq!(Ttl::from_millis(1).map(Ttl::as_millis), Ok(1));
    }
}
