//! Resume-ledger records: what a reconnecting realtime session needs to pick up where it left off.

use chrono::{DateTime, Utc};
use redis::AsyncCommands;

use super::{CoordError, Coordination, decode, encode};
use crate::ttl::Ttl;

/// A realtime session's resume record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ResumeLedgerRecord {
    /// The session it resumes.
    pub session_token: String,
    /// The character the session drives.
    pub character_id: String,
    /// Last input sequence the server applied.
    pub last_applied_seq: u64,
    /// Zone holding the session when it detached.
    pub zone_id: String,
    /// When the record was written.
    pub recorded_at: DateTime<Utc>,
}

impl Coordination {
    /// Stores `record` under its session token, expiring after `ttl`.
    pub async fn resume_store(
        &self,
        record: &ResumeLedgerRecord,
        ttl: Ttl,
    ) -> Result<(), CoordError> {
        let key = self.keys().resume_ledger(&record.session_token)?;
        let body = encode(record)?;
        if let Some(file) = self.file() {
            return file.set(&key, &body, ttl).await;
        }
        let () = self.conn()?.pset_ex(key, body, ttl.as_millis()).await?;
        Ok(())
    }

    /// The record for `session_token`, if present.
    pub async fn resume_load(
        &self,
        session_token: &str,
    ) -> Result<Option<ResumeLedgerRecord>, CoordError> {
        let key = self.keys().resume_ledger(session_token)?;
        let raw: Option<Vec<u8>> = match self.file() {
            Some(file) => file.get(&key).await?,
            None => self.conn()?.get(&key).await?,
        };
        raw.map(|raw| decode(&key, &raw)).transpose()
    }

    /// Deletes the record for `session_token`; true when one existed.
    pub async fn resume_delete(&self, session_token: &str) -> Result<bool, CoordError> {
        let key = self.keys().resume_ledger(session_token)?;
        if let Some(file) = self.file() {
            return Ok(file.delete(&[&key]).await? > 0);
        }
        let removed: i64 = self.conn()?.del(key).await?;
        Ok(removed > 0)
    }
}
