//! Login throttles: every attempt is counted, atomically, before it is judged, in a fixed window
//! that starts at the first attempt; attempt number `max_attempts + 1` and later are refused
//! until the window ends. Counting first means parallel guesses cannot all pass one check.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{AsyncCommands, Script};

use super::embedded::{self, RecordFile};
use super::{CoordError, Coordination};
use crate::ttl::Ttl;

static HIT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/throttle_hit.lua")));

/// How many attempts a window allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottlePolicy {
    /// Attempts allowed inside one window.
    pub max_attempts: u32,
    /// Window length, starting at the first attempt.
    pub window: Ttl,
}

/// Whether an attempt may proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThrottleStatus {
    /// Within the limit; this many attempts remain after this one.
    Allowed {
        /// Attempts left in the window after this one.
        remaining: u32,
    },
    /// Over the limit until the window ends.
    Throttled {
        /// Time until the window ends.
        retry_after: Duration,
    },
}

impl ThrottlePolicy {
    /// Judges attempt number `attempt` (1 for the first in the window) with `ttl_ms` left in
    /// the window: attempts `1..=max_attempts` are allowed, later ones throttled.
    pub fn status(&self, attempt: u64, ttl_ms: i64) -> ThrottleStatus {
        match u64::from(self.max_attempts).checked_sub(attempt) {
            Some(left) => ThrottleStatus::Allowed {
                remaining: u32::try_from(left).unwrap_or(u32::MAX),
            },
            None => ThrottleStatus::Throttled {
                retry_after: Duration::from_millis(u64::try_from(ttl_ms).unwrap_or(0)),
            },
        }
    }
}

impl Coordination {
    /// Counts one attempt by `subject` (in one atomic step), then judges it.
    pub async fn login_attempt(
        &self,
        subject: &str,
        policy: ThrottlePolicy,
    ) -> Result<ThrottleStatus, CoordError> {
        if policy.max_attempts == 0 {
            return Err(CoordError::InvalidInput(
                "max_attempts must be at least 1".into(),
            ));
        }
        let key = self.keys().login_throttle(subject)?;
        if let Some(file) = self.file() {
            let (count, ttl) = hit_in_file(file, &key, policy.window).await?;
            return Ok(policy.status(count, ttl));
        }
        let (count, ttl): (u64, i64) = HIT
            .key(key)
            .arg(policy.window.as_millis())
            .invoke_async(&mut self.conn()?)
            .await?;
        Ok(policy.status(count, ttl))
    }

    /// Says how `subject`'s next attempt would be judged, without counting one.
    pub async fn login_throttle_check(
        &self,
        subject: &str,
        policy: ThrottlePolicy,
    ) -> Result<ThrottleStatus, CoordError> {
        let key = self.keys().login_throttle(subject)?;
        if let Some(file) = self.file() {
            let live = file.get_live(&key).await?;
            let (count, ttl) =
                live.map_or((0, -2), |(raw, ttl)| (counter(&raw), ttl.unwrap_or(-1)));
            return Ok(policy.status(count.saturating_add(1), ttl));
        }
        let (count, ttl): (Option<u64>, i64) = redis::pipe()
            .get(&key)
            .pttl(&key)
            .query_async(&mut self.conn()?)
            .await?;
        Ok(policy.status(count.unwrap_or(0).saturating_add(1), ttl))
    }

    /// Clears the attempts of `subject` (after a successful login).
    pub async fn login_throttle_reset(&self, subject: &str) -> Result<(), CoordError> {
        let key = self.keys().login_throttle(subject)?;
        if let Some(file) = self.file() {
            return file.delete(&[&key]).await.map(drop);
        }
        let _: i64 = self.conn()?.del(key).await?;
        Ok(())
    }
}

/// A stored attempt counter (decimal text); anything else counts as none.
fn counter(raw: &[u8]) -> u64 {
    std::str::from_utf8(raw)
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(0)
}

/// Counts one attempt in the embedded store's file, as the script does: the window starts at
/// the first attempt and keeps its expiry. Returns the count and the window's remaining
/// milliseconds.
async fn hit_in_file(file: &RecordFile, key: &str, window: Ttl) -> Result<(u64, i64), CoordError> {
    let (mut tx, now) = file.begin().await?;
    let (count, ttl) = match embedded::read(&mut tx, key, now).await? {
        Some((raw, Some(ttl))) => {
            let count = counter(&raw).saturating_add(1);
            embedded::replace_value(&mut tx, key, count.to_string().as_bytes()).await?;
            (count, ttl)
        }
        // A counter left without an expiry counts on and gets the window's, as INCR then
        // PEXPIRE do on Redis.
        Some((raw, None)) => {
            let count = counter(&raw).saturating_add(1);
            let expires = embedded::expiry(now, window);
            embedded::put(&mut tx, key, count.to_string().as_bytes(), Some(expires)).await?;
            (count, i64::try_from(window.as_millis()).unwrap_or(i64::MAX))
        }
        None => {
            let expires = embedded::expiry(now, window);
            embedded::put(&mut tx, key, b"1", Some(expires)).await?;
            (1, i64::try_from(window.as_millis()).unwrap_or(i64::MAX))
        }
    };
    tx.commit().await?;
    Ok((count, ttl))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_max_attempts_are_allowed() {
        let policy = ThrottlePolicy {
            max_attempts: 3,
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
