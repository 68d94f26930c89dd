//! Active realtime session markers: set while a session token is attached, cleared when its
//! stream closes. Journal processing reads them to skip stale cleanup of a session that
//! reconnected.

use redis::AsyncCommands;

use super::{CoordError, Coordination};
use crate::ttl::Ttl;

impl Coordination {
    /// Marks `session_token` active for `ttl` (refresh it while the session lives).
    pub async fn session_activate(&self, session_token: &str, ttl: Ttl) -> Result<(), CoordError> {
        let key = self.keys().active_session(session_token)?;
        if let Some(file) = self.file() {
            return file.set(&key, b"1", ttl).await;
        }
        let () = self.conn()?.pset_ex(key, 1, ttl.as_millis()).await?;
        Ok(())
    }

    /// Extends the marker of `session_token` to `ttl` from now, only while it is still set:
    /// false when it is not (its stream closed, and a refresh queued before the close must not
    /// set it again — a journal worker would read that as a reconnect).
    pub async fn session_refresh(&self, session_token: &str, ttl: Ttl) -> Result<bool, CoordError> {
        let key = self.keys().active_session(session_token)?;
        if let Some(file) = self.file() {
            return file.refresh(&key, ttl).await;
        }
        let extended: bool = self.conn()?.pexpire(key, ttl.as_millis() as i64).await?;
        Ok(extended)
    }

    /// Clears the marker of `session_token`.
    pub async fn session_deactivate(&self, session_token: &str) -> Result<(), CoordError> {
        let key = self.keys().active_session(session_token)?;
        if let Some(file) = self.file() {
            return file.delete(&[&key]).await.map(drop);
        }
        let _: i64 = self.conn()?.del(key).await?;
        Ok(())
    }

    /// True while `session_token` is marked active.
    pub async fn session_is_active(&self, session_token: &str) -> Result<bool, CoordError> {
        let key = self.keys().active_session(session_token)?;
        if let Some(file) = self.file() {
            return file.exists(&key).await;
        }
        Ok(self.conn()?.exists(key).await?)
    }
}
