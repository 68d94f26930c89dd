//! The Redis checkpoint tier: the full snapshot under the character's id, guarded by a Lua
//! ownership check so a stale owner can never overwrite a newer owner's checkpoint.

use std::sync::LazyLock;

use redis::{Script, Value};
use uuid::Uuid;

use super::snapshot::CharacterSnapshot;
use crate::backend::RedisBackend;
use crate::coord::handoff::is;
use crate::keyspace::{CHECKPOINT_TTL, KeyError};
use crate::ttl::Ttl;

/// The checkpoint guard script's source (KEYS and ARGV in its header), for benchmarks that drive
/// the engine's limit for a guarded write with it directly.
pub const WRITE_SCRIPT: &str = concat!(
    include_str!("../lua/ints.lua"),
    include_str!("lua/checkpoint_write.lua")
);

static WRITE: LazyLock<Script> = LazyLock::new(|| Script::new(WRITE_SCRIPT));

/// Snapshots per pipeline of a large write.
const PIPELINE_SNAPSHOTS: usize = 128;
/// Pipelines of one write in flight at once.
const PIPELINES_IN_FLIGHT: usize = 4;

/// A checkpoint call failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The name could not form a key; nothing was written.
    #[error("invalid checkpoint key: {0}")]
    InvalidKey(#[from] KeyError),
    /// Redis failed or could not be reached.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The stored checkpoint is not a valid snapshot.
    #[error("checkpoint of character {character_id} is corrupt: {reason}")]
    Corrupt {
        /// The character.
        character_id: Uuid,
        /// What was wrong.
        reason: String,
    },
    /// The snapshot could not be encoded.
    #[error("snapshot could not be encoded: {0}")]
    Encode(serde_json::Error),
    /// A script answered something this version does not understand.
    #[error("unexpected checkpoint script reply: {0}")]
    Protocol(String),
}

/// How a checkpoint write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointWrite {
    /// Stored.
    Written,
    /// Refused: a newer owner (this epoch) holds the checkpoint. A double-own signal for the zone.
    NotOwner {
        /// The epoch stored in the checkpoint.
        stored_epoch: i64,
    },
    /// Refused: the stored checkpoint is of a newer schema than this snapshot's (a process
    /// running an older model).
    SchemaNewer {
        /// The schema version stored.
        stored_schema: u32,
    },
}

/// Handle on the checkpoint tier. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    redis: RedisBackend,
    ttl: Ttl,
}

impl CheckpointStore {
    /// Checkpoints over `redis`, kept for the standard hour.
    pub fn new(redis: RedisBackend) -> Self {
        Self {
            redis,
            ttl: CHECKPOINT_TTL,
        }
    }

    /// Checkpoints kept for `ttl` instead.
    pub fn with_ttl(redis: RedisBackend, ttl: Ttl) -> Self {
        Self { redis, ttl }
    }

    /// Writes `snapshot` unless a newer owner's checkpoint is stored.
    pub async fn write(
        &self,
        snapshot: &CharacterSnapshot,
    ) -> Result<CheckpointWrite, CheckpointError> {
        let mut results = self.write_many(&[snapshot]).await?;
        results
            .pop()
            .ok_or_else(|| CheckpointError::Protocol("empty reply".into()))
    }

    /// Writes many snapshots, pipelined, one result per snapshot in order. A large call goes
    /// out as several pipelines kept in flight together, so encoding the next one overlaps
    /// Redis running the last; a failure of any fails the call (some may have landed).
    pub async fn write_many(
        &self,
        snapshots: &[&CharacterSnapshot],
    ) -> Result<Vec<CheckpointWrite>, CheckpointError> {
        use futures::{StreamExt, TryStreamExt};
        // Made up front (each encodes only when first polled), so the stream holds no closure.
        let pipelines: Vec<_> = snapshots
            .chunks(PIPELINE_SNAPSHOTS)
            .map(|chunk| self.write_pipeline(chunk))
            .collect();
        let per_pipeline: Vec<Vec<CheckpointWrite>> = futures::stream::iter(pipelines)
            .buffered(PIPELINES_IN_FLIGHT)
            .try_collect()
            .await?;
        Ok(per_pipeline.into_iter().flatten().collect())
    }

    /// One pipeline of guarded writes.
    async fn write_pipeline(
        &self,
        snapshots: &[&CharacterSnapshot],
    ) -> Result<Vec<CheckpointWrite>, CheckpointError> {
        let mut invocations = Vec::with_capacity(snapshots.len());
        for snapshot in snapshots {
            let body = serde_json::to_vec(snapshot).map_err(CheckpointError::Encode)?;
            let mut call = WRITE.prepare_invoke();
            call.key(self.redis.keys().checkpoint(snapshot.character_id))
                .arg(snapshot.owner_epoch)
                .arg(body)
                .arg(self.ttl.as_millis())
                .arg(snapshot.schema_version);
            invocations.push(call);
        }
        // Loading first makes the pipelined EVALSHAs immune to a flushed script cache.
        let mut pipe = redis::pipe();
        pipe.load_script(&WRITE).ignore();
        for call in &invocations {
            pipe.invoke_script(call);
        }
        // On a cluster a checkpoint counts once a replica holds it: a failover must not bring
        // back an older one (its copy may since have dropped an item someone else picked up).
        // Unconfirmed, the pipeline fails like any failed checkpoint write.
        let replies: Vec<Vec<Value>> = self.redis.query_confirmed(pipe).await?;
        replies.iter().map(|reply| decode_write(reply)).collect()
    }

    /// The checkpoint of `character_id`, if one is stored.
    pub async fn read(
        &self,
        character_id: Uuid,
    ) -> Result<Option<CharacterSnapshot>, CheckpointError> {
        let key = self.redis.keys().checkpoint(character_id);
        let (epoch, body): (Option<Vec<u8>>, Option<Vec<u8>>) = redis::cmd("HMGET")
            .arg(&key)
            .arg("epoch")
            .arg("snapshot")
            .query_async(&mut self.redis.conn())
            .await
            .map_err(|e| {
                if e.code() == Some("WRONGTYPE") {
                    CheckpointError::Corrupt {
                        character_id,
                        reason: "not a checkpoint hash".into(),
                    }
                } else {
                    CheckpointError::Redis(e)
                }
            })?;
        let Some(body) = body else {
            return Ok(None);
        };
        let corrupt = |reason: String| CheckpointError::Corrupt {
            character_id,
            reason,
        };
        let epoch = match epoch {
            Some(text) => Some(guard_int(&text).ok_or_else(|| {
                corrupt(format!(
                    "guard epoch {:?} is not an integer",
                    String::from_utf8_lossy(&text)
                ))
            })?),
            None => None,
        };
        let snapshot: CharacterSnapshot =
            serde_json::from_slice(&body).map_err(|e| corrupt(e.to_string()))?;
        if snapshot.character_id != character_id {
            return Err(corrupt(format!(
                "holds character {}",
                snapshot.character_id
            )));
        }
        if epoch != Some(snapshot.owner_epoch) {
            return Err(corrupt(format!(
                "guard epoch {epoch:?} differs from snapshot epoch {}",
                snapshot.owner_epoch
            )));
        }
        Ok(Some(snapshot))
    }

    /// Deletes the checkpoint of `character_id`.
    pub async fn delete(&self, character_id: Uuid) -> Result<(), CheckpointError> {
        let key = self.redis.keys().checkpoint(character_id);
        let _: i64 = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut self.redis.conn())
            .await?;
        Ok(())
    }
}

/// A guard field as every writer stores it: an i64 in canonical decimal (an optional `-`, no
/// leading zeros, no sign on zero), which is what the guard script compares as text.
fn guard_int(text: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(text).ok()?;
    let value: i64 = text.parse().ok()?;
    (value.to_string() == text).then_some(value)
}

fn decode_write(reply: &[Value]) -> Result<CheckpointWrite, CheckpointError> {
    match reply {
        [tag] if is(tag, "ok") => Ok(CheckpointWrite::Written),
        [tag, Value::BulkString(epoch)] if is(tag, "not_owner") => guard_int(epoch)
            .map(|stored_epoch| CheckpointWrite::NotOwner { stored_epoch })
            .ok_or_else(|| CheckpointError::Protocol("not_owner epoch".into())),
        // A stored schema past u32 is still newer than anything this process plays.
        [tag, Value::BulkString(schema)] if is(tag, "schema_newer") => guard_int(schema)
            .map(|stored| CheckpointWrite::SchemaNewer {
                stored_schema: u32::try_from(stored).unwrap_or(u32::MAX),
            })
            .ok_or_else(|| CheckpointError::Protocol("schema_newer schema".into())),
        other => Err(CheckpointError::Protocol(format!("{other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::guard_int;

    #[test]
    fn guard_numbers_are_canonical_i64s() {
        assert_eq!(guard_int(b"0"), Some(0));
        assert_eq!(guard_int(b"-7"), Some(-7));
        assert_eq!(guard_int(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(guard_int(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"inf",
            b"-inf",
            b"nan",
            b"1e300",
            b"0x10",
            b" 7 ",
            b"+7",
            b"7.0",
            b"007",
            b"-0",
            b"9223372036854775808",
            b"\xff",
        ] {
            assert_eq!(guard_int(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }
}
