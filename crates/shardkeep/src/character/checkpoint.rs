//! The checkpoint tier: the full snapshot under the character's id, guarded by an ownership
//! check so a stale owner can never overwrite a newer owner's checkpoint. Two drivers: Redis
//! (a hash per character behind a Lua guard) and the embedded store (a row per character in the
//! SQLite file, `checkpoint_sqlite`), with one rule ([`decide_guard`]) and one API.

use std::sync::{Arc, LazyLock};

use redis::{Script, Value};
use uuid::Uuid;

use super::checkpoint_sqlite::{self as embedded, SharedClock};
use super::checkpoint_take::{TakeFailure, TakeOvers, TakeRequest, Taken, take_over_batcher};
use super::snapshot::CharacterSnapshot;
use crate::backend::{RedisBackend, SqliteBackend};
use crate::batching::Batcher;
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
pub const PIPELINE_SNAPSHOTS: usize = 128;
/// Most checkpoints one guard script call writes (fewer on a cluster, where one call holds
/// the keys of one slot only): a call's own cost is paid once for all of them.
pub const CHECKPOINTS_PER_CALL: usize = 32;
/// Snapshot bytes past which a guard script call takes no further checkpoint: a call runs as one
/// unit in Redis, so large documents go a few (or one) to a call and no call blocks Redis, or
/// fills a client's query buffer, for long.
pub const CALL_BYTES: usize = 256 * 1024;
/// Pipelines of one write in flight at once.
pub const PIPELINES_IN_FLIGHT: usize = 4;

/// A checkpoint call failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The name could not form a key; nothing was written.
    #[error("invalid checkpoint key: {0}")]
    InvalidKey(#[from] KeyError),
    /// Redis failed or could not be reached.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The embedded store's file failed.
    #[error("embedded store: {0}")]
    Embedded(#[from] sqlx::Error),
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

/// A stored checkpoint and the epoch that guards it. The guard is the epoch of the newest copy
/// that wrote the checkpoint or took it over at its load ([`CheckpointStore::take_over`]); the
/// snapshot's own `owner_epoch` is that of the copy that dumped the content, never above the
/// guard. A checkpoint whose guard is below the row's owner was fenced by a claim without being
/// taken over, so it may hold a zombie's writes after that claim; one whose guard reaches the
/// row's owner holds only content its chain of owners wrote before they were superseded.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldCheckpoint {
    /// The content, as its copy dumped it.
    pub snapshot: CharacterSnapshot,
    /// The guard epoch: no copy older than it can write the checkpoint.
    pub held_by: i64,
}

/// What a write finds stored, as the guard reads it: `None` when no live checkpoint is stored,
/// else its owner epoch and schema version, each `None` when the stored value is not a
/// canonical integer.
pub type StoredGuard = Option<(Option<i64>, Option<i64>)>;

/// What the guard decides for one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuardDecision {
    /// Store the snapshot (replacing whatever is stored).
    Write,
    /// Refuse it, for this reason.
    Refuse(CheckpointWrite),
}

/// The ownership guard both drivers apply to a checkpoint that holds both guard fields (the
/// Redis driver's script states it in Lua; the embedded table's columns are never empty, and a
/// Redis hash missing a field, which no writer leaves, is judged by the script alone): a
/// readable stored epoch above the writer's refuses; otherwise a readable stored schema above
/// the writer's refuses; anything else writes. A stored epoch or schema that is not an integer
/// marks the checkpoint corrupt, and a corrupt checkpoint is replaced (its reader refuses it
/// too, so it holds nothing a login could use) — except that a readable newer epoch refuses
/// before the schema is looked at.
pub fn decide_guard(stored: StoredGuard, writer_epoch: i64, writer_schema: i64) -> GuardDecision {
    let Some((epoch, schema)) = stored else {
        return GuardDecision::Write;
    };
    let Some(epoch) = epoch else {
        return GuardDecision::Write;
    };
    if epoch > writer_epoch {
        return GuardDecision::Refuse(CheckpointWrite::NotOwner {
            stored_epoch: epoch,
        });
    }
    match schema {
        Some(schema) if schema > writer_schema => {
            GuardDecision::Refuse(CheckpointWrite::SchemaNewer {
                stored_schema: u32::try_from(schema).unwrap_or(u32::MAX),
            })
        }
        _ => GuardDecision::Write,
    }
}

/// Handle on the checkpoint tier. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    tier: Tier,
    ttl: Ttl,
}

/// Where checkpoints are kept.
#[derive(Debug, Clone)]
enum Tier {
    Redis {
        redis: Box<RedisBackend>,
        /// Take-overs of concurrent logins, gathered into a few script calls.
        takes: Arc<Batcher<TakeOvers>>,
    },
    Embedded {
        db: SqliteBackend,
        clock: SharedClock,
    },
}

impl CheckpointStore {
    /// Checkpoints over `redis`, kept for the standard hour.
    pub fn new(redis: RedisBackend) -> Self {
        Self::with_ttl(redis, CHECKPOINT_TTL)
    }

    /// Checkpoints kept for `ttl` instead.
    pub fn with_ttl(redis: RedisBackend, ttl: Ttl) -> Self {
        Self {
            tier: Tier::Redis {
                takes: take_over_batcher(redis.clone()),
                redis: Box::new(redis),
            },
            ttl,
        }
    }

    /// Checkpoints in the embedded store's file, kept for the standard hour by the system clock.
    /// They survive a crash of the process as the Redis tier's survive a shard's.
    pub fn embedded(db: SqliteBackend) -> Self {
        Self {
            tier: Tier::Embedded {
                db,
                clock: std::sync::Arc::new(crate::clock::SystemClock),
            },
            ttl: CHECKPOINT_TTL,
        }
    }

    /// The same store with checkpoints kept for `ttl`.
    pub fn kept_for(mut self, ttl: Ttl) -> Self {
        self.ttl = ttl;
        self
    }

    /// The same store reading expiry against `clock` (the embedded driver's only; Redis keeps
    /// its own time).
    pub fn with_clock(mut self, clock: std::sync::Arc<dyn crate::clock::Clock>) -> Self {
        if let Tier::Embedded { clock: held, .. } = &mut self.tier {
            *held = clock;
        }
        self
    }

    /// The driver's name: `redis` or `embedded`.
    pub fn driver(&self) -> &'static str {
        match self.tier {
            Tier::Redis { .. } => "redis",
            Tier::Embedded { .. } => "embedded",
        }
    }

    /// Deletes up to `limit` checkpoints whose time has run out, returning how many. Redis
    /// expires its keys itself (0); the embedded store's maintenance calls this.
    pub async fn sweep_expired(&self, limit: u32) -> Result<u64, CheckpointError> {
        match &self.tier {
            Tier::Redis { .. } => Ok(0),
            Tier::Embedded { db, clock } => {
                embedded::sweep_expired(db, clock.as_ref(), limit).await
            }
        }
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

    /// Writes `snapshot` guarded by `held_by` (at least the snapshot's own epoch) instead of its
    /// own epoch: a copy that adopted content another copy dumped (a handoff's carried snapshot)
    /// stores it under its own claim, so the content outlives the copy's crash and no older copy
    /// can write over it.
    pub async fn write_held(
        &self,
        snapshot: &CharacterSnapshot,
        held_by: i64,
    ) -> Result<CheckpointWrite, CheckpointError> {
        let guard = held_by.max(snapshot.owner_epoch);
        let mut results = self.write_guarded(&[(snapshot, guard)]).await?;
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
        let guarded: Vec<(&CharacterSnapshot, i64)> =
            snapshots.iter().map(|s| (*s, s.owner_epoch)).collect();
        self.write_guarded(&guarded).await
    }

    /// [`Self::write_many`] with each snapshot's guard epoch given.
    async fn write_guarded(
        &self,
        snapshots: &[(&CharacterSnapshot, i64)],
    ) -> Result<Vec<CheckpointWrite>, CheckpointError> {
        use futures::{StreamExt, TryStreamExt};
        let redis = match &self.tier {
            Tier::Redis { redis, .. } => redis,
            Tier::Embedded { db, clock } => {
                return embedded::write_many(db, clock.as_ref(), self.ttl, snapshots).await;
            }
        };
        // Made up front (each encodes only when first polled), so the stream holds no closure.
        let pipelines: Vec<_> = snapshots
            .chunks(PIPELINE_SNAPSHOTS)
            .map(|chunk| self.write_pipeline(redis, chunk))
            .collect();
        let per_pipeline: Vec<Vec<CheckpointWrite>> = futures::stream::iter(pipelines)
            .buffered(PIPELINES_IN_FLIGHT)
            .try_collect()
            .await?;
        Ok(per_pipeline.into_iter().flatten().collect())
    }

    /// One pipeline of guarded writes: one script call per group of snapshots whose keys
    /// share a slot (all of them on standalone Redis), [`CHECKPOINTS_PER_CALL`] at most.
    async fn write_pipeline(
        &self,
        redis: &RedisBackend,
        snapshots: &[(&CharacterSnapshot, i64)],
    ) -> Result<Vec<CheckpointWrite>, CheckpointError> {
        let keys: Vec<String> = snapshots
            .iter()
            .map(|(s, _)| redis.keys().checkpoint(s.character_id))
            .collect();
        let bodies: Vec<Vec<u8>> = snapshots
            .iter()
            .map(|(s, _)| serde_json::to_vec(s).map_err(CheckpointError::Encode))
            .collect::<Result<_, _>>()?;
        let sizes: Vec<usize> = bodies.iter().map(Vec::len).collect();
        let groups = call_groups(&keys, &sizes, redis.is_cluster());
        let mut invocations = Vec::with_capacity(groups.len());
        for group in &groups {
            let mut call = WRITE.prepare_invoke();
            call.arg(self.ttl.as_millis());
            for &i in group {
                let (snapshot, guard) = snapshots[i];
                call.key(&keys[i])
                    .arg(guard)
                    .arg(&bodies[i])
                    .arg(snapshot.schema_version);
            }
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
        let replies: Vec<Vec<Vec<Value>>> = redis.query_confirmed(pipe).await?;
        if replies.len() != groups.len() {
            return Err(CheckpointError::Protocol(format!(
                "{} replies to {} calls",
                replies.len(),
                groups.len()
            )));
        }
        let mut results: Vec<Option<CheckpointWrite>> = vec![None; snapshots.len()];
        for (group, reply) in groups.iter().zip(&replies) {
            if reply.len() != group.len() {
                return Err(CheckpointError::Protocol(format!(
                    "{} replies to a call of {}",
                    reply.len(),
                    group.len()
                )));
            }
            for (&i, one) in group.iter().zip(reply) {
                results[i] = Some(decode_write(one)?);
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.ok_or_else(|| CheckpointError::Protocol("a checkpoint without reply".into()))
            })
            .collect()
    }

    /// The checkpoint of `character_id`, if one is stored.
    pub async fn read(
        &self,
        character_id: Uuid,
    ) -> Result<Option<CharacterSnapshot>, CheckpointError> {
        Ok(self
            .read_held(character_id)
            .await?
            .map(|held| held.snapshot))
    }

    /// The checkpoint of `character_id` with its guard epoch, if one is stored.
    pub async fn read_held(
        &self,
        character_id: Uuid,
    ) -> Result<Option<HeldCheckpoint>, CheckpointError> {
        let corrupt = |reason: String| CheckpointError::Corrupt {
            character_id,
            reason,
        };
        let redis = match &self.tier {
            Tier::Redis { redis, .. } => redis,
            Tier::Embedded { db, clock } => {
                let Some((epoch, body)) = embedded::read(db, clock.as_ref(), character_id).await?
                else {
                    return Ok(None);
                };
                let epoch = epoch.ok_or_else(|| corrupt("guard epoch is not an integer".into()))?;
                let body = body.ok_or_else(|| corrupt("snapshot is not text".into()))?;
                return checked_snapshot(character_id, Some(epoch), body.as_bytes());
            }
        };
        let key = redis.keys().checkpoint(character_id);
        let (epoch, body): (Option<Vec<u8>>, Option<Vec<u8>>) = redis::cmd("HMGET")
            .arg(&key)
            .arg("epoch")
            .arg("snapshot")
            .query_async(&mut redis.conn())
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
        let epoch = match epoch {
            Some(text) => Some(guard_int(&text).ok_or_else(|| {
                corrupt(format!(
                    "guard epoch {:?} is not an integer",
                    String::from_utf8_lossy(&text)
                ))
            })?),
            None => None,
        };
        checked_snapshot(character_id, epoch, &body)
    }

    /// The loader's step after a claim minted `claimant` for `character_id`: reads the
    /// checkpoint (with its guard as it was, which is what freshness compares) and, in the same
    /// step, raises its guard to `claimant`, keeping its content.
    /// From then on no copy the claim superseded can write it (a zombie's later checkpoint is
    /// refused and evicts it), and the content this claimant loaded stays what the checkpoint
    /// holds until the claimant writes its own — so a claimant that dies before its first write
    /// leaves the next one the same content, never the older row. The content outlives the
    /// claimant by a full TTL from now.
    pub async fn take_over(
        &self,
        character_id: Uuid,
        claimant: i64,
    ) -> Result<Option<HeldCheckpoint>, CheckpointError> {
        let (redis, takes) = match &self.tier {
            Tier::Redis { redis, takes } => (redis, takes),
            Tier::Embedded { db, clock } => {
                let (epoch, body) =
                    match embedded::take_over(db, clock.as_ref(), self.ttl, character_id, claimant)
                        .await?
                    {
                        Some(found) => found,
                        None => return Ok(None),
                    };
                let corrupt = |reason: &str| CheckpointError::Corrupt {
                    character_id,
                    reason: reason.into(),
                };
                let epoch = epoch.ok_or_else(|| corrupt("guard epoch is not an integer"))?;
                let body = body.ok_or_else(|| corrupt("snapshot is not text"))?;
                return checked_snapshot(character_id, Some(epoch), body.as_bytes());
            }
        };
        let request = TakeRequest {
            key: redis.keys().checkpoint(character_id),
            claimant,
            ttl_ms: self.ttl.as_millis(),
        };
        match takes.submit(request).await {
            Ok(Taken::None) => Ok(None),
            Ok(Taken::Corrupt(reason)) => Err(CheckpointError::Corrupt {
                character_id,
                reason,
            }),
            Ok(Taken::Held(guard, body)) => checked_snapshot(character_id, Some(guard), &body),
            Err(TakeFailure::Redis(err)) => Err(CheckpointError::Redis(err)),
            Err(TakeFailure::Protocol(why)) => Err(CheckpointError::Protocol(why)),
        }
    }

    /// Deletes the checkpoint of `character_id`.
    pub async fn delete(&self, character_id: Uuid) -> Result<(), CheckpointError> {
        let redis = match &self.tier {
            Tier::Redis { redis, .. } => redis,
            Tier::Embedded { db, .. } => return embedded::delete(db, character_id).await,
        };
        let key = redis.keys().checkpoint(character_id);
        let _: i64 = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut redis.conn())
            .await?;
        Ok(())
    }
}

/// A stored checkpoint decoded and checked against its key and guard: it must hold the
/// character it is stored under, dumped by a copy no newer than the epoch its guard names.
fn checked_snapshot(
    character_id: Uuid,
    epoch: Option<i64>,
    body: &[u8],
) -> Result<Option<HeldCheckpoint>, CheckpointError> {
    let corrupt = |reason: String| CheckpointError::Corrupt {
        character_id,
        reason,
    };
    let snapshot: CharacterSnapshot =
        serde_json::from_slice(body).map_err(|e| corrupt(e.to_string()))?;
    if snapshot.character_id != character_id {
        return Err(corrupt(format!(
            "holds character {}",
            snapshot.character_id
        )));
    }
    match epoch {
        Some(held_by) if held_by >= snapshot.owner_epoch => {
            Ok(Some(HeldCheckpoint { snapshot, held_by }))
        }
        _ => Err(corrupt(format!(
            "guard epoch {epoch:?} is below snapshot epoch {}",
            snapshot.owner_epoch
        ))),
    }
}

/// A guard field as every writer stores it: an i64 in canonical decimal (an optional `-`, no
/// leading zeros, no sign on zero), which is what the guard script compares as text.
pub(super) fn guard_int(text: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(text).ok()?;
    let value: i64 = text.parse().ok()?;
    (value.to_string() == text).then_some(value)
}

/// The script calls of one pipeline, as indexes into `keys` (whose snapshots encode to `sizes`
/// bytes): on a cluster the keys of each call share a slot, on standalone Redis any keys go
/// together; in batch order within a call, at most [`CHECKPOINTS_PER_CALL`] to a call, and no
/// checkpoint joins a call already holding [`CALL_BYTES`].
pub fn call_groups(keys: &[String], sizes: &[usize], cluster: bool) -> Vec<Vec<usize>> {
    call_groups_of(keys, sizes, cluster, CHECKPOINTS_PER_CALL)
}

/// [`call_groups`] with at most `most_per_call` keys to a call.
pub(super) fn call_groups_of(
    keys: &[String],
    sizes: &[usize],
    cluster: bool,
    most_per_call: usize,
) -> Vec<Vec<usize>> {
    let mut groups: Vec<(Vec<usize>, usize)> = Vec::new();
    let mut open: std::collections::HashMap<u16, usize> = std::collections::HashMap::new();
    for (i, key) in keys.iter().enumerate() {
        let slot = if cluster {
            crate::keyspace::slot::key_slot(key)
        } else {
            0
        };
        let size = sizes.get(i).copied().unwrap_or(0);
        match open.get(&slot) {
            Some(&g) if groups[g].0.len() < most_per_call && groups[g].1 < CALL_BYTES => {
                groups[g].0.push(i);
                groups[g].1 += size;
            }
            _ => {
                open.insert(slot, groups.len());
                groups.push((vec![i], size));
            }
        }
    }
    groups.into_iter().map(|(members, _)| members).collect()
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
    use super::{CheckpointWrite, GuardDecision, decide_guard, guard_int};

    #[test]
    fn the_guard_refuses_newer_owners_then_newer_schemas_and_replaces_corrupt_values() {
        use GuardDecision::{Refuse, Write};
        assert_eq!(decide_guard(None, 3, 1), Write);
        assert_eq!(decide_guard(Some((Some(3), Some(1))), 3, 1), Write);
        assert_eq!(decide_guard(Some((Some(2), Some(1))), 3, 1), Write);
        assert_eq!(
            decide_guard(Some((Some(4), Some(1))), 3, 1),
            Refuse(CheckpointWrite::NotOwner { stored_epoch: 4 })
        );
        // A newer owner refuses even beside a corrupt schema.
        assert_eq!(
            decide_guard(Some((Some(4), None)), 3, 1),
            Refuse(CheckpointWrite::NotOwner { stored_epoch: 4 })
        );
        assert_eq!(
            decide_guard(Some((Some(3), Some(2))), 3, 1),
            Refuse(CheckpointWrite::SchemaNewer { stored_schema: 2 })
        );
        assert_eq!(
            decide_guard(Some((Some(1), Some(i64::MAX))), 3, 1),
            Refuse(CheckpointWrite::SchemaNewer {
                stored_schema: u32::MAX
            })
        );
        assert_eq!(decide_guard(Some((None, Some(9))), 3, 1), Write);
        assert_eq!(decide_guard(Some((Some(3), None)), 3, 1), Write);
    }

    #[test]
    fn script_calls_hold_one_slots_keys_and_at_most_the_bound() {
        use super::{CALL_BYTES, CHECKPOINTS_PER_CALL, call_groups};
        use crate::keyspace::slot::key_slot;
        let keys: Vec<String> = (0..200).map(|i| format!("ns:checkpoint:{i}")).collect();
        let small = vec![600; 200];
        let standalone = call_groups(&keys, &small, false);
        assert_eq!(standalone.len(), 200usize.div_ceil(CHECKPOINTS_PER_CALL));
        let flat: Vec<usize> = standalone.concat();
        assert_eq!(flat, (0..200).collect::<Vec<_>>(), "in order, each once");
        // Many keys of one slot (a shared hash tag) and a few of others.
        let mut tagged: Vec<String> = (0..70).map(|i| format!("{{t}}:checkpoint:{i}")).collect();
        tagged.extend(keys.iter().take(5).cloned());
        let cluster = call_groups(&tagged, &small[..75], true);
        let mut seen: Vec<usize> = cluster.concat();
        seen.sort_unstable();
        assert_eq!(seen, (0..75).collect::<Vec<_>>(), "each key once");
        for group in &cluster {
            assert!(!group.is_empty() && group.len() <= CHECKPOINTS_PER_CALL);
            let slot = key_slot(&tagged[group[0]]);
            assert!(group.iter().all(|&i| key_slot(&tagged[i]) == slot));
            assert!(group.windows(2).all(|w| w[0] < w[1]), "in batch order");
        }
        assert_eq!(
            cluster
                .iter()
                .filter(|g| key_slot(&tagged[g[0]]) == key_slot("{t}"))
                .count(),
            70usize.div_ceil(CHECKPOINTS_PER_CALL)
        );
        // Large documents go fewer to a call, and one past the budget alone.
        let third = CALL_BYTES * 3 / 8;
        let sizes = [third, third, third, 10, CALL_BYTES + 1, 10, 10];
        let groups = call_groups(&keys[..7], &sizes, false);
        assert_eq!(groups, vec![vec![0, 1, 2], vec![3, 4], vec![5, 6]]);
    }

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
