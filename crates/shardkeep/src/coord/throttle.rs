//! Failed-login throttles: failures counted in a fixed window; over the limit answers
//! `Throttled` with the time until the window ends.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{AsyncCommands, Script};

use super::{CoordError, Coordination};
use crate::ttl::Ttl;

static HIT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/throttle_hit.lua")));

/// How many failures a window allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottlePolicy {
    /// Failures allowed inside one window.
    pub max_failures: u32,
    /// Window length, starting at the first failure.
    pub window: Ttl,
}

/// Whether a subject may try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThrottleStatus {
    /// Under the limit; this many failures remain in the window.
    Allowed {
        /// Failures left before throttling.
        remaining: u32,
    },
    /// Over the limit until the window ends.
    Throttled {
        /// Time until the window ends.
        retry_after: Duration,
    },
}

impl ThrottlePolicy {
    /// Classifies a failure count with `ttl_ms` left in the window.
    pub fn status(&self, failures: u64, ttl_ms: i64) -> ThrottleStatus {
        if failures > u64::from(self.max_failures) {
            ThrottleStatus::Throttled {
                retry_after: Duration::from_millis(u64::try_from(ttl_ms).unwrap_or(0)),
            }
        } else {
            let left = u64::from(self.max_failures) - failures;
            ThrottleStatus::Allowed {
                remaining: u32::try_from(left).unwrap_or(u32::MAX),
            }
        }
    }
}

impl Coordination {
    /// Records one failed login for `subject` and says whether it is now throttled.
    pub async fn login_failure_record(
        &self,
        subject: &str,
        policy: ThrottlePolicy,
    ) -> Result<ThrottleStatus, CoordError> {
        if policy.max_failures == 0 {
            return Err(CoordError::InvalidInput(
                "max_failures must be at least 1".into(),
            ));
        }
        let key = self.keys().login_throttle(subject)?;
        let (count, ttl): (u64, i64) = HIT
            .key(key)
            .arg(policy.window.as_millis())
            .invoke_async(&mut self.conn())
            .await?;
        Ok(policy.status(count, ttl))
    }

    /// Says whether `subject` is throttled, without counting a failure.
    pub async fn login_throttle_check(
        &self,
        subject: &str,
        policy: ThrottlePolicy,
    ) -> Result<ThrottleStatus, CoordError> {
        let key = self.keys().login_throttle(subject)?;
        let (count, ttl): (Option<u64>, i64) = redis::pipe()
            .get(&key)
            .pttl(&key)
            .query_async(&mut self.conn())
            .await?;
        Ok(policy.status(count.unwrap_or(0), ttl))
    }

    /// Clears the failures of `subject` (after a successful login).
    pub async fn login_throttle_reset(&self, subject: &str) -> Result<(), CoordError> {
        let key = self.keys().login_throttle(subject)?;
        let _: i64 = self.conn().del(key).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_crosses_the_limit_after_max_failures() {
        let policy = ThrottlePolicy {
            max_failures: 3,
            window: Ttl::from_static_secs(60),
        };
        assert_eq!(
            policy.status(1, 59_000),
            ThrottleStatus::Allowed { remaining: 2 }
        );
        assert_eq!(
            policy.status(3, 59_000),
            ThrottleStatus::Allowed { remaining: 0 }
        );
        assert_eq!(
            policy.status(4, 1_500),
            ThrottleStatus::Throttled {
                retry_after: Duration::from_millis(1_500)
            }
        );
    }
}
