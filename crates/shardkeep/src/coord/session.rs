//! Active realtime session markers: set while a session token is attached, cleared when its
//! stream closes. Journal processing reads them to skip stale cleanup of a session that
//! reconnected.

use redis::AsyncCommands;

use super::{CoordError, Coordination};
use crate::ttl::Ttl;

/// A living session whose records a refresh extends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveSession {
    /// Its realtime session token.
    pub session_token: String,
    /// The account playing.
    pub account_id: String,
    /// The character it drives.
    pub character_id: String,
}

/// What [`Coordination::sessions_refresh`] found of one session's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionRefreshed {
    /// The active marker was set, and is extended.
    pub marker: bool,
    /// Both presence records (under the account and the character) were there, and are
    /// extended.
    pub presence: bool,
}

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

    /// Extends the records of living sessions to `ttl` from now, all in one round trip (one
    /// pipeline; one write transaction in the embedded file): each session's active marker and
    /// its presence under its account and its character, each only where it is still there —
    /// nothing is written back. Per session, in order, what was found; a session missing any of
    /// them has its records written again the full way (an ordered presence write), by a caller
    /// that knows it still plays.
    pub async fn sessions_refresh(
        &self,
        sessions: &[LiveSession],
        ttl: Ttl,
    ) -> Result<Vec<SessionRefreshed>, CoordError> {
        let keys = self.keys();
        let mut names = Vec::with_capacity(sessions.len() * 3);
        for session in sessions {
            names.push(keys.active_session(&session.session_token)?);
            names.push(keys.presence_account(&session.account_id)?);
            names.push(keys.presence_character(&session.character_id)?);
        }
        let found: Vec<bool> = if let Some(file) = self.file() {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            file.refresh_many(&names, ttl).await?
        } else {
            if names.is_empty() {
                return Ok(Vec::new());
            }
            let mut pipe = redis::pipe();
            for name in &names {
                pipe.pexpire(name, ttl.as_millis() as i64);
            }
            pipe.query_async(&mut self.conn()?).await?
        };
        if found.len() != names.len() {
            return Err(CoordError::Protocol(format!(
                "a session refresh of {} records came back with {}",
                names.len(),
                found.len()
            )));
        }
        Ok(found
            .chunks_exact(3)
            .map(|f| SessionRefreshed {
                marker: f[0],
                presence: f[1] && f[2],
            })
            .collect())
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
