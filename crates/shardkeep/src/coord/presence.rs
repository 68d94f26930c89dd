//! Presence: which session of which account is driving which character, on which shard.
//!
//! One record is written under both the account and the character, with a TTL derived from its
//! `expires_at`, and both ids join index sets. Reads prune index members whose record is gone and
//! delete a record whose counterpart disagrees (the account has moved on to another character or
//! session), so a set member is never taken as proof that a player is online.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use redis::{AsyncCommands, Script, Value};

use super::embedded::{self, RecordFile};
use super::handoff::is;
use super::{CoordError, Coordination, decode, encode};
use crate::ttl::Ttl;

static PRUNE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/index_prune.lua")));
static VERIFY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/presence_verify.lua")));

/// Attempts a read makes when the record changes under it.
const READ_ATTEMPTS: usize = 3;

/// One presence record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PresenceRecord {
    /// The account.
    pub account_id: String,
    /// The character it is playing.
    pub character_id: String,
    /// The realtime session token.
    pub session_token: String,
    /// The shard hosting the session.
    pub shard_id: String,
    /// The zone holding the character, when known.
    pub zone_id: Option<String>,
    /// When the record lapses. A session's refresh extends the record in the store without
    /// writing it again; a read reports the extended lapse.
    pub expires_at: DateTime<Utc>,
}

/// What a prune pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PresencePrune {
    /// Index members examined.
    pub examined: usize,
    /// Members removed because their record was gone.
    pub removed: usize,
}

#[derive(Clone, Copy)]
enum Side {
    Account,
    Character,
}

impl Coordination {
    /// Writes `record` under its account and character, expiring at `record.expires_at`.
    pub async fn presence_put(&self, record: &PresenceRecord) -> Result<(), CoordError> {
        self.presence_put_at(record, Utc::now()).await
    }

    /// [`Self::presence_put`] with an explicit current time.
    pub async fn presence_put_at(
        &self,
        record: &PresenceRecord,
        now: DateTime<Utc>,
    ) -> Result<(), CoordError> {
        let ttl = Ttl::from_millis((record.expires_at - now).num_milliseconds())?;
        let account_key = self.keys().presence_account(&record.account_id)?;
        let character_key = self.keys().presence_character(&record.character_id)?;
        let body = encode(record)?;
        if let Some(file) = self.file() {
            return file
                .set_many(&[(&account_key, &body), (&character_key, &body)], ttl)
                .await;
        }
        let () = redis::pipe()
            .atomic()
            .pset_ex(&account_key, &body, ttl.as_millis())
            .ignore()
            .pset_ex(&character_key, &body, ttl.as_millis())
            .ignore()
            .sadd(self.keys().presence_account_index(), &record.account_id)
            .ignore()
            .sadd(self.keys().presence_character_index(), &record.character_id)
            .ignore()
            .query_async(&mut self.conn()?)
            .await?;
        Ok(())
    }

    /// The presence of `account_id`, if it is live and consistent with its character record.
    pub async fn presence_by_account(
        &self,
        account_id: &str,
    ) -> Result<Option<PresenceRecord>, CoordError> {
        self.presence_read(Side::Account, account_id).await
    }

    /// The presence of `character_id`, if it is live and its account still points at it.
    pub async fn presence_by_character(
        &self,
        character_id: &str,
    ) -> Result<Option<PresenceRecord>, CoordError> {
        self.presence_read(Side::Character, character_id).await
    }

    async fn presence_read(
        &self,
        side: Side,
        id: &str,
    ) -> Result<Option<PresenceRecord>, CoordError> {
        let (key, index) = match side {
            Side::Account => (
                self.keys().presence_account(id)?,
                self.keys().presence_account_index(),
            ),
            Side::Character => (
                self.keys().presence_character(id)?,
                self.keys().presence_character_index(),
            ),
        };
        if let Some(file) = self.file() {
            return self.presence_read_in_file(file, side, &key).await;
        }
        let mut conn = self.conn()?;
        for _ in 0..READ_ATTEMPTS {
            let raw: Option<Vec<u8>> = conn.get(&key).await?;
            let Some(raw) = raw else {
                let _: i64 = conn.srem(&index, id).await?;
                return Ok(None);
            };
            let record: PresenceRecord = match decode(&key, &raw) {
                Ok(record) => record,
                Err(err) => {
                    tracing::warn!(event = "presence_corrupt", key = %key, error = %err);
                    let () = redis::pipe()
                        .atomic()
                        .del(&key)
                        .ignore()
                        .srem(&index, id)
                        .ignore()
                        .query_async(&mut conn)
                        .await?;
                    return Ok(None);
                }
            };
            let counterpart = match side {
                Side::Account => self.keys().presence_character(&record.character_id)?,
                Side::Character => self.keys().presence_account(&record.account_id)?,
            };
            let reply: Vec<Value> = VERIFY
                .key(&key)
                .key(&index)
                .key(&counterpart)
                .arg(id)
                .arg(&raw)
                .invoke_async(&mut conn)
                .await?;
            match reply.as_slice() {
                [tag, _, Value::Int(left)] if is(tag, "ok") => {
                    return Ok(Some(lapsing_in(record, Utc::now(), *left)));
                }
                [tag] if is(tag, "missing") || is(tag, "mismatch") => return Ok(None),
                [tag] if is(tag, "changed") => continue,
                other => return Err(CoordError::Protocol(format!("presence verify: {other:?}"))),
            }
        }
        Err(CoordError::Protocol(
            "presence record kept changing during the read".into(),
        ))
    }

    /// The read in the embedded store's file, in one write transaction: a record that does not
    /// decode, or whose counterpart disagrees, is deleted, as the Redis read deletes it.
    async fn presence_read_in_file(
        &self,
        file: &RecordFile,
        side: Side,
        key: &str,
    ) -> Result<Option<PresenceRecord>, CoordError> {
        let (mut tx, now) = file.begin().await?;
        let Some((raw, left)) = embedded::read(&mut tx, key, now).await? else {
            return Ok(None);
        };
        let record: Option<PresenceRecord> = match decode(key, &raw) {
            Ok(record) => Some(record),
            Err(err) => {
                tracing::warn!(event = "presence_corrupt", key = %key, error = %err);
                None
            }
        };
        let consistent = match &record {
            Some(record) => {
                let counterpart = match side {
                    Side::Account => self.keys().presence_character(&record.character_id)?,
                    Side::Character => self.keys().presence_account(&record.account_id)?,
                };
                embedded::read(&mut tx, &counterpart, now)
                    .await?
                    .and_then(|(other, _)| decode::<PresenceRecord>(&counterpart, &other).ok())
                    .is_some_and(|other| {
                        other.account_id == record.account_id
                            && other.character_id == record.character_id
                            && other.session_token == record.session_token
                    })
            }
            None => false,
        };
        if consistent {
            return Ok(record.map(|r| match left {
                Some(left) => {
                    let now = DateTime::from_timestamp_micros(now).unwrap_or_else(Utc::now);
                    lapsing_in(r, now, left)
                }
                None => r,
            }));
        }
        embedded::remove(&mut tx, key, now).await?;
        tx.commit().await?;
        Ok(None)
    }

    /// Removes index members whose record has expired, examining at most `max_examined`
    /// members per index set (in the embedded store, which keeps no index sets: deletes up to
    /// `max_examined` expired presence records).
    pub async fn presence_prune(&self, max_examined: usize) -> Result<PresencePrune, CoordError> {
        if let Some(file) = self.file() {
            let removed = file
                .sweep(&self.keys().presence_prefix(), max_examined)
                .await?;
            let removed = usize::try_from(removed).unwrap_or(usize::MAX);
            metrics::counter!(crate::telemetry::PRESENCE_PRUNED_TOTAL).increment(removed as u64);
            return Ok(PresencePrune {
                examined: removed,
                removed,
            });
        }
        let mut total = PresencePrune::default();
        for side in [Side::Account, Side::Character] {
            let index = match side {
                Side::Account => self.keys().presence_account_index(),
                Side::Character => self.keys().presence_character_index(),
            };
            let pass = self
                .prune_index(&index, max_examined, |id| match side {
                    Side::Account => self.keys().presence_account(id),
                    Side::Character => self.keys().presence_character(id),
                })
                .await?;
            total.examined += pass.examined;
            total.removed += pass.removed;
        }
        metrics::counter!(crate::telemetry::PRESENCE_PRUNED_TOTAL).increment(total.removed as u64);
        Ok(total)
    }

    /// Walks `index` with SSCAN and removes members whose payload key (from `key_of`) is gone.
    pub(crate) async fn prune_index(
        &self,
        index: &str,
        max_examined: usize,
        key_of: impl Fn(&str) -> Result<String, crate::keyspace::KeyError>,
    ) -> Result<PresencePrune, CoordError> {
        let mut report = PresencePrune::default();
        let mut conn = self.conn()?;
        let mut cursor: u64 = 0;
        loop {
            let (next, members): (u64, Vec<String>) = redis::cmd("SSCAN")
                .arg(index)
                .arg(cursor)
                .arg("COUNT")
                .arg(self.config().scan_count)
                .query_async(&mut conn)
                .await?;
            let mut invalid = Vec::new();
            let mut call = PRUNE.prepare_invoke();
            call.key(index);
            let mut probed = 0;
            for member in members {
                report.examined += 1;
                match key_of(&member) {
                    Ok(key) => {
                        call.key(key).arg(member);
                        probed += 1;
                    }
                    Err(_) => invalid.push(member),
                }
            }
            if probed > 0 {
                let removed: i64 = call.invoke_async(&mut conn).await?;
                report.removed += usize::try_from(removed).unwrap_or(0);
            }
            if !invalid.is_empty() {
                let removed: i64 = conn.srem(index, &invalid).await?;
                report.removed += usize::try_from(removed).unwrap_or(0);
            }
            cursor = next;
            if cursor == 0 || report.examined >= max_examined {
                break;
            }
        }
        Ok(report)
    }
}

/// `record` with its lapse moved to `left_ms` after `now` (the store's clock and count) when a
/// refresh extended the record past the lapse it was written with (by more than a second: the
/// store counts in milliseconds, and a record read back as written keeps its own time).
fn lapsing_in(mut record: PresenceRecord, now: DateTime<Utc>, left_ms: i64) -> PresenceRecord {
    let lapse = now + chrono::Duration::milliseconds(left_ms);
    if lapse > record.expires_at + chrono::Duration::seconds(1) {
        record.expires_at = lapse;
    }
    record
}
