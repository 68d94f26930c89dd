//! Internal-request nonces: each (key id, nonce) registers once inside the skew window.

use super::{CoordError, Coordination};

/// Result of registering a nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonceRegistration {
    /// First use inside the window.
    Registered,
    /// Seen before inside the window: the request is a replay.
    Replayed,
}

impl Coordination {
    /// Registers `nonce` for `key_id` with `SET NX PX <skew window>`.
    pub async fn nonce_register(
        &self,
        key_id: &str,
        nonce: &str,
    ) -> Result<NonceRegistration, CoordError> {
        let key = self.keys().internal_nonce(key_id, nonce)?;
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg("1")
            .arg("NX")
            .arg("PX")
            .arg(self.config().nonce_skew_window.as_millis())
            .query_async(&mut self.conn())
            .await?;
        let outcome = match set {
            Some(_) => NonceRegistration::Registered,
            None => NonceRegistration::Replayed,
        };
        let label = match outcome {
            NonceRegistration::Registered => "registered",
            NonceRegistration::Replayed => "replayed",
        };
        metrics::counter!(crate::telemetry::NONCE_REGISTRATIONS_TOTAL, "outcome" => label)
            .increment(1);
        Ok(outcome)
    }
}
