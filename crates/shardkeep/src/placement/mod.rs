//! Placement records: which shard and zone hold a character, written on every residency change
//! and fenced by owner epoch; a clean logout leaves a tombstone (no shard, no zone) that still
//! carries the epoch, which is the directory's floor for the next claim. A tombstone is the last
//! word of its epoch: a live placement of the copy that left, queued before its logout and
//! landing after it, is refused ([`PlacementWrite::Left`]), so the record never names a shard
//! its copy has left.
//!
//! Writes go through a background [`PlacementWriter`] with the same shutdown barrier as the
//! saver, so a quitting player's tombstone lands before shutdown.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::{Script, Value};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::backend::RedisBackend;
use crate::coord::embedded::{self, RecordFile};
use crate::coord::handoff::is;
use crate::drain::{BarrierOutcome, BatchHandler, DrainQueue, EnqueueError};
use crate::keyspace::{KeyError, Keyspace, PLACEMENT_TTL};
use crate::telemetry;

static WRITE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/ints.lua"),
        include_str!("placement_write.lua")
    ))
});

/// Where a character is hosted.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PlacementRecord {
    /// The character.
    pub character_id: Uuid,
    /// The hosting shard; `None` in a tombstone.
    pub shard_id: Option<String>,
    /// The zone; `None` in a tombstone.
    pub zone_id: Option<String>,
    /// The epoch of the copy that wrote it.
    pub owner_epoch: i64,
    /// When it was written.
    pub updated_at: DateTime<Utc>,
}

impl PlacementRecord {
    /// True for a clean-logout tombstone.
    pub fn is_tombstone(&self) -> bool {
        self.zone_id.is_none()
    }
}

/// A placement call failed.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// The id could not form a key.
    #[error("invalid placement key: {0}")]
    InvalidKey(#[from] KeyError),
    /// Redis failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// A stored record is not valid.
    #[error("placement record is corrupt: {0}")]
    Corrupt(String),
    /// The embedded store's file failed.
    #[error("embedded store: {0}")]
    Embedded(String),
}

impl From<crate::coord::CoordError> for PlacementError {
    fn from(err: crate::coord::CoordError) -> Self {
        match err {
            crate::coord::CoordError::InvalidKey(key) => Self::InvalidKey(key),
            other => Self::Embedded(other.to_string()),
        }
    }
}

/// How a placement write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlacementWrite {
    /// Stored.
    Written,
    /// Refused: a newer owner wrote the record.
    Stale {
        /// The stored epoch.
        stored_epoch: i64,
    },
    /// Refused: the record is the writer's own copy's tombstone (the copy left; a live
    /// placement of it queued before its logout landed after it).
    Left {
        /// The stored epoch (the writer's own).
        epoch: i64,
    },
}

/// Handle on placement records. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PlacementStore {
    place: Place,
}

/// Where the records are kept.
#[derive(Debug, Clone)]
enum Place {
    Redis(Box<RedisBackend>),
    Embedded { file: RecordFile, keys: Keyspace },
}

impl PlacementStore {
    /// Placement records over `redis`.
    pub fn new(redis: RedisBackend) -> Self {
        Self {
            place: Place::Redis(Box::new(redis)),
        }
    }

    /// Placement records in the embedded store's file `db`, named by `keys`, their expiry read
    /// from `clock`.
    pub fn embedded(
        db: crate::backend::SqliteBackend,
        keys: Keyspace,
        clock: std::sync::Arc<dyn crate::clock::Clock>,
    ) -> Self {
        Self {
            place: Place::Embedded {
                file: RecordFile::new(db, clock),
                keys,
            },
        }
    }

    /// Writes many records in one pipelined round trip (one transaction in the embedded
    /// store), one result each, in order.
    pub async fn write_many(
        &self,
        records: &[PlacementRecord],
    ) -> Result<Vec<PlacementWrite>, PlacementError> {
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let redis = match &self.place {
            Place::Redis(redis) => redis,
            Place::Embedded { file, keys } => return write_in_file(file, keys, records).await,
        };
        let mut calls = Vec::with_capacity(records.len());
        for record in records {
            let body =
                serde_json::to_vec(record).map_err(|e| PlacementError::Corrupt(e.to_string()))?;
            let mut call = WRITE.prepare_invoke();
            call.key(redis.keys().placement(&record.character_id.to_string())?)
                .arg(record.owner_epoch)
                .arg(body)
                .arg(PLACEMENT_TTL.as_millis())
                .arg(if record.is_tombstone() { "1" } else { "0" });
            calls.push(call);
        }
        let mut pipe = redis::pipe();
        pipe.load_script(&WRITE).ignore();
        for call in &calls {
            pipe.invoke_script(call);
        }
        let replies: Vec<Vec<Value>> = pipe.query_async(&mut redis.conn()).await?;
        let epoch = |text: &[u8]| {
            std::str::from_utf8(text)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| PlacementError::Corrupt("stored epoch".into()))
        };
        replies
            .iter()
            .map(|reply| match reply.as_slice() {
                [tag] if is(tag, "ok") => Ok(PlacementWrite::Written),
                [tag, Value::BulkString(text)] if is(tag, "stale") => {
                    epoch(text).map(|stored_epoch| PlacementWrite::Stale { stored_epoch })
                }
                [tag, Value::BulkString(text)] if is(tag, "left") => {
                    epoch(text).map(|epoch| PlacementWrite::Left { epoch })
                }
                other => Err(PlacementError::Corrupt(format!("script reply {other:?}"))),
            })
            .collect()
    }

    /// Writes one record.
    pub async fn write(&self, record: &PlacementRecord) -> Result<PlacementWrite, PlacementError> {
        self.write_many(std::slice::from_ref(record))
            .await?
            .pop()
            .ok_or_else(|| PlacementError::Corrupt("empty reply".into()))
    }

    /// The record of `character_id`, if any.
    pub async fn read(
        &self,
        character_id: Uuid,
    ) -> Result<Option<PlacementRecord>, PlacementError> {
        let body: Option<Vec<u8>> = match &self.place {
            Place::Redis(redis) => {
                let key = redis.keys().placement(&character_id.to_string())?;
                redis::cmd("HGET")
                    .arg(&key)
                    .arg("record")
                    .query_async(&mut redis.conn())
                    .await?
            }
            Place::Embedded { file, keys } => {
                file.get(&keys.placement(&character_id.to_string())?)
                    .await?
            }
        };
        body.map(|b| serde_json::from_slice(&b).map_err(|e| PlacementError::Corrupt(e.to_string())))
            .transpose()
    }
}

/// Just the fence of a stored record: a record of a newer shape still fences by its epoch.
#[derive(serde::Deserialize)]
struct StoredFence {
    owner_epoch: i64,
    /// `null` in a tombstone; a record without the field is not one.
    #[serde(default = "zone_unnamed")]
    zone_id: serde_json::Value,
}

/// What a stored record without a `zone_id` reads as: not a tombstone.
fn zone_unnamed() -> serde_json::Value {
    serde_json::Value::Bool(false)
}

/// The fenced write in the embedded store's file, every record in one transaction: a record
/// whose stored epoch is newer is refused, and a live placement over its own copy's tombstone;
/// a stored record that does not decode is replaced.
async fn write_in_file(
    file: &RecordFile,
    keys: &Keyspace,
    records: &[PlacementRecord],
) -> Result<Vec<PlacementWrite>, PlacementError> {
    let mut bodies = Vec::with_capacity(records.len());
    for record in records {
        let key = keys.placement(&record.character_id.to_string())?;
        let body =
            serde_json::to_vec(record).map_err(|e| PlacementError::Corrupt(e.to_string()))?;
        bodies.push((key, body));
    }
    let (mut tx, now) = file.begin().await?;
    let mut writes = Vec::with_capacity(records.len());
    for (record, (key, body)) in records.iter().zip(&bodies) {
        let stored = embedded::read(&mut tx, key, now)
            .await?
            .and_then(|(raw, _)| serde_json::from_slice::<StoredFence>(&raw).ok());
        match stored {
            Some(stored) if stored.owner_epoch > record.owner_epoch => {
                writes.push(PlacementWrite::Stale {
                    stored_epoch: stored.owner_epoch,
                });
            }
            Some(stored)
                if stored.owner_epoch == record.owner_epoch
                    && stored.zone_id.is_null()
                    && !record.is_tombstone() =>
            {
                writes.push(PlacementWrite::Left {
                    epoch: stored.owner_epoch,
                });
            }
            _ => {
                let expires = embedded::expiry(now, PLACEMENT_TTL);
                embedded::put(&mut tx, key, body, Some(expires)).await?;
                writes.push(PlacementWrite::Written);
            }
        }
    }
    tx.commit()
        .await
        .map_err(|e| PlacementError::Embedded(e.to_string()))?;
    Ok(writes)
}

/// The latest update of each character whose placement write failed or was dropped, until the
/// writer's owner takes them ([`PlacementWriter::take_failed`]).
#[derive(Debug, Clone, Default)]
struct Failed(Arc<Mutex<HashMap<Uuid, PlacementRecord>>>);

/// Whether `record` replaces `kept`, both updates of one character (failed ones, or two in one
/// batch): a newer copy's over an older one's, and within one copy its tombstone over its
/// placement, whichever came last (a dropped tombstone is reported at once, the batch of the
/// placement before it only when its write gives up; a placement queued outside the copy's
/// lock can follow its tombstone).
fn supersedes(record: &PlacementRecord, kept: &PlacementRecord) -> bool {
    record.owner_epoch > kept.owner_epoch
        || (record.owner_epoch == kept.owner_epoch
            && (record.is_tombstone() || !kept.is_tombstone()))
}

/// The most characters [`Failed`] keeps (about a million): an owner that never takes them
/// cannot make it grow without bound; past it further failures are only logged.
const MOST_FAILED: usize = 1 << 20;

impl Failed {
    fn add(&self, records: impl IntoIterator<Item = PlacementRecord>) {
        let mut failed = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut unkept = 0;
        for record in records {
            let full = failed.len() >= MOST_FAILED;
            match failed.entry(record.character_id) {
                Entry::Occupied(mut kept) if supersedes(&record, kept.get()) => {
                    kept.insert(record);
                }
                Entry::Occupied(_) => {}
                Entry::Vacant(_) if full => unkept += 1,
                Entry::Vacant(slot) => {
                    slot.insert(record);
                }
            }
        }
        if unkept > 0 {
            tracing::warn!(
                event = "placement_failures_unkept",
                count = unkept,
                "too many failed placement writes kept: a live copy's waits for its periodic \
                 full write, a tombstone is not written again"
            );
        }
    }

    fn take(&self) -> Vec<PlacementRecord> {
        let mut failed = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // Taken whole, so the memory of a long outage's failures goes with them.
        std::mem::take(&mut *failed).into_values().collect()
    }
}

struct PlacementWorker {
    store: PlacementStore,
    io_timeout: Duration,
    failed: Failed,
}

impl BatchHandler<PlacementRecord> for PlacementWorker {
    async fn handle(&mut self, batch: Vec<PlacementRecord>) {
        // Only the last update per character matters (within a copy, its tombstone).
        let mut latest: Vec<PlacementRecord> = Vec::with_capacity(batch.len());
        for record in batch {
            match latest
                .iter_mut()
                .find(|r| r.character_id == record.character_id)
            {
                Some(kept) if supersedes(&record, kept) => *kept = record,
                Some(_) => {}
                None => latest.push(record),
            }
        }
        match tokio::time::timeout(self.io_timeout, self.store.write_many(&latest)).await {
            Ok(Ok(writes)) => {
                for (record, write) in latest.iter().zip(writes) {
                    match write {
                        PlacementWrite::Written => {}
                        PlacementWrite::Stale { stored_epoch } => {
                            metrics::counter!(telemetry::PLACEMENT_STALE_TOTAL).increment(1);
                            tracing::debug!(event = "placement_stale",
                                character = %record.character_id,
                                writer_epoch = record.owner_epoch, stored_epoch);
                        }
                        // A race between one copy's own writes, not a zombie's: not counted.
                        PlacementWrite::Left { epoch } => {
                            tracing::debug!(event = "placement_after_tombstone",
                                character = %record.character_id, epoch);
                        }
                    }
                }
            }
            Ok(Err(err)) => {
                tracing::warn!(event = "placement_write_failed", count = latest.len(), error = %err);
                self.failed.add(latest);
            }
            Err(_) => {
                tracing::warn!(
                    event = "placement_write_failed",
                    count = latest.len(),
                    error = "timed out"
                );
                self.failed.add(latest);
            }
        }
    }
}

/// Background writer of placement records, with a shutdown barrier. Cheap to clone.
#[derive(Clone)]
pub struct PlacementWriter {
    queue: Option<DrainQueue<PlacementRecord>>,
    failed: Failed,
}

impl std::fmt::Debug for PlacementWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlacementWriter").finish_non_exhaustive()
    }
}

impl PlacementWriter {
    /// Starts a writer over `store` (`None`: a storeless shard, every update is a no-op).
    pub fn spawn(
        store: Option<PlacementStore>,
        depth: usize,
        io_timeout: Duration,
        cancel: CancellationToken,
    ) -> Self {
        let failed = Failed::default();
        let queue = store.map(|store| {
            let worker = PlacementWorker {
                store,
                io_timeout,
                failed: failed.clone(),
            };
            DrainQueue::spawn(depth, 256, worker, cancel).0
        });
        Self { queue, failed }
    }

    /// The latest update of each character whose placement write failed or was dropped since
    /// the last call (at most about a million are kept): their owner writes them again.
    pub fn take_failed(&self) -> Vec<PlacementRecord> {
        self.failed.take()
    }

    /// Keeps `records` among the failed ones without writing them: they are taken again at the
    /// next [`PlacementWriter::take_failed`].
    pub fn owe(&self, records: impl IntoIterator<Item = PlacementRecord>) {
        self.failed.add(records);
    }

    /// Queues `records` again, written or failed like any update; what the queue has no room
    /// for is kept among the failed ones quietly (neither counted nor logged as dropped: it was
    /// reported when it first failed).
    pub fn retry(&self, records: impl IntoIterator<Item = PlacementRecord>) {
        let unqueued: Vec<PlacementRecord> = records
            .into_iter()
            .filter_map(|record| self.push(record).err())
            .collect();
        self.failed.add(unqueued);
    }

    /// Queues an update without blocking; false when it was dropped.
    pub fn enqueue(&self, record: PlacementRecord) -> bool {
        let Err(record) = self.push(record) else {
            return true;
        };
        metrics::counter!(telemetry::PLACEMENT_DROPPED_TOTAL).increment(1);
        tracing::warn!(event = "placement_dropped");
        self.failed.add([record]);
        false
    }

    /// Queues `record`; a queue without room (full, or its writer stopped) hands it back. A
    /// storeless writer takes everything.
    fn push(&self, record: PlacementRecord) -> Result<(), PlacementRecord> {
        match self.queue.as_ref().map(|queue| queue.try_enqueue(record)) {
            None | Some(Ok(())) => Ok(()),
            Some(Err(EnqueueError::Full(record) | EnqueueError::Closed(record))) => Err(record),
        }
    }

    /// Waits, at most `bound`, until every queued update is written.
    pub async fn barrier(&self, bound: Duration) -> BarrierOutcome {
        match &self.queue {
            Some(queue) => queue.barrier(bound).await,
            None => BarrierOutcome::Drained,
        }
    }

    /// Stops the writer at once.
    pub fn abort(&self) {
        if let Some(queue) = &self.queue {
            queue.cancel();
        }
    }
}
