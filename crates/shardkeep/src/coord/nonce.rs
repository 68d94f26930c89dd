//! Internal-request nonces: each (key id, nonce) registers once, and stays registered for as
//! long as a request carrying it could still be accepted.

use std::time::Duration;

use super::{CoordError, Coordination};

/// Result of registering a nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonceRegistration {
    /// First use while its timestamp can be accepted.
    Registered,
    /// Seen before: the request is a replay.
    Replayed,
}

/// How long a nonce must stay registered when timestamps are accepted within `±skew`: a
/// timestamp signed `skew` ahead is still accepted `2 × skew` later, and whole-second
/// timestamps add up to one more second.
pub fn nonce_lifetime(skew: Duration) -> Duration {
    skew.saturating_mul(2)
        .saturating_add(Duration::from_secs(1))
}

impl Coordination {
    /// Registers `nonce` for `key_id` with `SET NX PX <nonce_lifetime(skew)>`, so a replay is
    /// found for the whole span in which its timestamp passes the `±skew` check.
    pub async fn nonce_register(
        &self,
        key_id: &str,
        nonce: &str,
        skew: Duration,
    ) -> Result<NonceRegistration, CoordError> {
        let key = self.keys().internal_nonce(key_id, nonce)?;
        let lifetime_ms = u64::try_from(nonce_lifetime(skew).as_millis()).unwrap_or(u64::MAX);
        let registered = match self.file() {
            Some(file) => {
                let lifetime = crate::ttl::Ttl::try_from(nonce_lifetime(skew))?;
                file.set_new(&key, b"1", lifetime).await?
            }
            None => self.nonce_set_new(&key, lifetime_ms).await?,
        };
        let outcome = if registered {
            NonceRegistration::Registered
        } else {
            NonceRegistration::Replayed
        };
        let label = match outcome {
            NonceRegistration::Registered => "registered",
            NonceRegistration::Replayed => "replayed",
        };
        metrics::counter!(crate::telemetry::NONCE_REGISTRATIONS_TOTAL, "outcome" => label)
            .increment(1);
        Ok(outcome)
    }

    /// `SET NX PX` on Redis; true when the nonce was new.
    async fn nonce_set_new(&self, key: &str, lifetime_ms: u64) -> Result<bool, CoordError> {
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg("1")
            .arg("NX")
            .arg("PX")
            .arg(lifetime_ms)
            .query_async(&mut self.conn()?)
            .await?;
        Ok(set.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nonce_outlives_every_accepted_timestamp() {
        assert_eq!(
            nonce_lifetime(Duration::from_secs(300)),
            Duration::from_secs(601)
        );
        assert_eq!(
            nonce_lifetime(Duration::from_secs(1)),
            Duration::from_secs(3)
        );
        assert_eq!(nonce_lifetime(Duration::MAX), Duration::MAX);
    }
}
