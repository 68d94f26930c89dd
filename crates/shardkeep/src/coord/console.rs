//! Operator-console sessions in Redis, so every `serve` process behind a load balancer knows
//! them and a logout ends them everywhere. Records are named by a digest of the session token,
//! so reading Redis does not hand anyone a usable cookie.

use redis::AsyncCommands;

use super::{CoordError, Coordination};
use crate::ttl::Ttl;

impl Coordination {
    /// Stores the console session whose token digests to `digest`, for `ttl`.
    pub async fn console_session_store(&self, digest: &str, ttl: Ttl) -> Result<(), CoordError> {
        let key = self.keys().console_session(digest)?;
        if let Some(file) = self.file() {
            return file.set(&key, b"1", ttl).await;
        }
        let _: () = self.conn()?.pset_ex(key, 1, ttl.as_millis()).await?;
        Ok(())
    }

    /// Whether the console session `digest` is live.
    pub async fn console_session_exists(&self, digest: &str) -> Result<bool, CoordError> {
        let key = self.keys().console_session(digest)?;
        if let Some(file) = self.file() {
            return file.exists(&key).await;
        }
        Ok(self.conn()?.exists(key).await?)
    }

    /// Ends the console session `digest` (no-op when already gone).
    pub async fn console_session_delete(&self, digest: &str) -> Result<(), CoordError> {
        let key = self.keys().console_session(digest)?;
        if let Some(file) = self.file() {
            return file.delete(&[&key]).await.map(drop);
        }
        let _: i64 = self.conn()?.del(key).await?;
        Ok(())
    }
}
