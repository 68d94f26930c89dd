//! A generic durable work queue on Redis lists, or in the embedded store's file (`embedded`):
//! `WorkQueue<T>`.
//!
//! Producers `append` (LPUSH, optionally capped). Each consumer incarnation leases entries into a
//! processing list of its own (LMOVE, or BLMOVE on a dedicated connection), then acks them (LREM)
//! or fails them (one script: back to pending with one more attempt, or to the dead letters).
//! Consumers heartbeat a key with a TTL; recovery returns to pending only the entries of
//! consumers whose heartbeat is gone, counting those crash re-deliveries apart from handler
//! failures, so a restarting instance never steals a live consumer's work.
//!
//! - `consumer` — lease, ack, fail, release, shutdown.
//! - `identity` — a consumer's id and incarnation: fresh per process by default, or stable
//!   (`consumer_with_id`) so a restart takes its predecessor's entries back at once; the
//!   heartbeat that re-registers it.
//! - `recovery` — returning dead consumers' entries (and those of processing lists no
//!   registered consumer owns), under a lock, in order.
//!
//! Order: leases take the oldest entry; a retried, released or recovered entry goes back to the
//! front, in its original order, so work runs first in, first out except where a handler fails.
//! - `dead` — listing and requeueing dead letters.

mod appender;
mod consumer;
mod dead;
mod embedded;
mod identity;
mod recovery;

use std::marker::PhantomData;
use std::sync::{Arc, LazyLock};

use chrono::{DateTime, Utc};
use redis::Script;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::backend::RedisBackend;
use crate::keyspace::{KeyError, QueueKeys};
use crate::telemetry;
use crate::ttl::Ttl;

pub use consumer::{AckOutcome, Consumer, FailOutcome, Leased, MAX_LEASE_BATCH};
pub use dead::{DeadLetterRetention, DeadLetterView, MAX_DEAD_LETTER_LIST};
pub use identity::MAX_CONSUMER_ID;
pub use recovery::RecoveryReport;

/// A script that moves entries into or out of a processing list: the `recount` prelude (which
/// keeps the held counts and their total), then the script's body.
macro_rules! counting_script {
    ($file:literal) => {
        std::sync::LazyLock::new(|| {
            redis::Script::new(concat!(
                include_str!("lua/recount.lua"),
                include_str!($file)
            ))
        })
    };
}
pub(crate) use counting_script;

static APPEND: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/append.lua")));
static DEPTHS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/depths.lua")));

/// The name the embedded store's queue tables file queue `name` of namespace `keys` under:
/// queues of two namespaces sharing one file never see each other's entries.
pub fn embedded_queue_name(keys: &crate::keyspace::Keyspace, name: &str) -> String {
    format!("{}:{name}", keys.namespace())
}

/// One queued piece of work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DurableWorkQueueEntry<T> {
    /// Unique per entry (a requeue makes a new one).
    pub entry_id: Uuid,
    /// Handler failures so far.
    pub attempts: u32,
    /// Times a consumer died while holding it.
    pub crash_count: u32,
    /// When it was appended.
    pub enqueued_at: DateTime<Utc>,
    /// The work.
    pub item: T,
}

/// Work that failed for good.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DurableDeadLetterEntry<T> {
    /// Unique per dead letter.
    pub dead_letter_id: Uuid,
    /// The entry it came from (`None` when the entry could not be decoded at all).
    pub entry_id: Option<Uuid>,
    /// Attempts made.
    pub failed_attempts: u32,
    /// Why it failed.
    pub error: String,
    /// When it was dead-lettered.
    pub failed_at: DateTime<Utc>,
    /// The work (for an undecodable entry, its raw text as a JSON string).
    pub item: T,
}

/// A queue call failed.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The pending list is at its cap; nothing was appended.
    #[error("queue {0} is full")]
    Full(String),
    /// Redis failed or could not be reached.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The embedded store's file failed.
    #[error("embedded store: {0}")]
    Embedded(#[from] sqlx::Error),
    /// The queue or consumer name could not form a key.
    #[error("invalid queue key: {0}")]
    InvalidKey(#[from] KeyError),
    /// An item could not be encoded; nothing was written.
    #[error("item could not be encoded: {0}")]
    Encode(serde_json::Error),
    /// A dead letter's item does not decode, so it cannot become work again.
    #[error("dead letter {0} holds an undecodable item")]
    Undecodable(Uuid),
    /// A stable consumer id is held by a live process (its heartbeat kept being refreshed);
    /// each process needs an id of its own.
    #[error(
        "consumer id {0:?} is in use by a live process (its heartbeat is being refreshed); give each process its own consumer id"
    )]
    IdentityInUse(String),
    /// Another incarnation took this consumer's id over (this one stalled past its heartbeat);
    /// it must stop, leaving the entries to the new holder.
    #[error("consumer id {0:?} was taken over by another incarnation; this consumer has stopped")]
    IdentityLost(String),
    /// A stable consumer id must be 1 to 128 characters of `[A-Za-z0-9_.-]`.
    #[error("consumer id {0:?} must be 1 to 128 characters of [A-Za-z0-9_.-]")]
    InvalidConsumerId(String),
}

/// Tunables.
#[derive(Debug, Clone, Copy)]
pub struct WorkQueueConfig {
    /// Cap on pending entries (`None`: unbounded).
    pub max_pending: Option<usize>,
    /// Handler failures before an entry is dead-lettered.
    pub max_attempts: u32,
    /// Consumer deaths before an entry is dead-lettered as a poison pill.
    pub crash_limit: u32,
    /// Lifetime of a consumer's heartbeat key; refreshed at a third of it.
    pub heartbeat_ttl: Ttl,
}

impl Default for WorkQueueConfig {
    fn default() -> Self {
        Self {
            max_pending: None,
            max_attempts: 8,
            crash_limit: 3,
            heartbeat_ttl: Ttl::from_static_secs(15),
        }
    }
}

/// Queue depths.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct QueueDepths {
    /// Waiting for a consumer.
    pub pending: u64,
    /// Leased by some consumer.
    pub processing: u64,
    /// Dead letters.
    pub dead: u64,
}

/// Handle on one named queue. Cheap to clone.
#[derive(Debug)]
pub struct WorkQueue<T> {
    store: QueueStore,
    name: String,
    keys: QueueKeys,
    config: WorkQueueConfig,
    _item: PhantomData<fn() -> T>,
}

/// Where a queue's entries are kept.
#[derive(Debug, Clone)]
enum QueueStore {
    Redis(Arc<RedisQueue>),
    Embedded(embedded::QueueFile),
}

/// A queue's Redis side, shared by clones.
#[derive(Debug)]
struct RedisQueue {
    redis: RedisBackend,
    /// Where recovery's backstop SCAN goes on from (it walks the keyspace a bounded slice per
    /// pass).
    backstop_cursor: std::sync::Mutex<crate::backend::redis::ScanCursor>,
    /// Appends that arrive together, sent together.
    appender: Arc<appender::Appender>,
}

impl<T> Clone for WorkQueue<T> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            name: self.name.clone(),
            keys: self.keys.clone(),
            config: self.config,
            _item: PhantomData,
        }
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> WorkQueue<T> {
    /// The queue named `name`.
    pub fn new(
        redis: RedisBackend,
        name: &str,
        config: WorkQueueConfig,
    ) -> Result<Self, QueueError> {
        let keys = redis.keys().queue(name)?;
        let appender = appender::appender(
            redis.clone(),
            keys.pending.clone(),
            config.max_pending,
            &APPEND,
        );
        Ok(Self {
            store: QueueStore::Redis(Arc::new(RedisQueue {
                redis,
                backstop_cursor: std::sync::Mutex::default(),
                appender,
            })),
            name: name.to_owned(),
            keys,
            config,
            _item: PhantomData,
        })
    }

    /// The queue named `name` in the embedded store's file `db` (its consumer names checked
    /// against `keys`, as on Redis), its heartbeats timed by `clock`.
    pub fn embedded(
        db: crate::backend::SqliteBackend,
        keys: &crate::keyspace::Keyspace,
        name: &str,
        config: WorkQueueConfig,
        clock: Arc<dyn crate::clock::Clock>,
    ) -> Result<Self, QueueError> {
        Ok(Self {
            store: QueueStore::Embedded(embedded::QueueFile::new(
                db,
                clock,
                &embedded_queue_name(keys, name),
            )),
            name: name.to_owned(),
            keys: keys.queue(name)?,
            config,
            _item: PhantomData,
        })
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its tunables.
    pub fn config(&self) -> &WorkQueueConfig {
        &self.config
    }

    /// Appends `item` as a new entry; returns its id once it is in the pending list. Appends
    /// made at the same time go to Redis in one command.
    pub async fn append(&self, item: T) -> Result<Uuid, QueueError> {
        let entry = DurableWorkQueueEntry {
            entry_id: Uuid::now_v7(),
            attempts: 0,
            crash_count: 0,
            enqueued_at: Utc::now(),
            item,
        };
        let body = serde_json::to_vec(&entry).map_err(QueueError::Encode)?;
        let redis = match &self.store {
            QueueStore::Redis(redis) => redis,
            QueueStore::Embedded(file) => {
                if file.append(&[body], self.config.max_pending).await? {
                    return Ok(entry.entry_id);
                }
                metrics::counter!(telemetry::QUEUE_FULL_TOTAL, "queue" => self.name.clone())
                    .increment(1);
                return Err(QueueError::Full(self.name.clone()));
            }
        };
        match redis.appender.submit(body).await {
            appender::Appended::Stored => Ok(entry.entry_id),
            appender::Appended::Full => {
                metrics::counter!(telemetry::QUEUE_FULL_TOTAL, "queue" => self.name.clone())
                    .increment(1);
                Err(QueueError::Full(self.name.clone()))
            }
            appender::Appended::Failed { kind, detail } => Err(QueueError::Redis(
                redis::RedisError::from((kind, "append failed", detail)),
            )),
        }
    }

    /// Pending, processing (all consumers) and dead depths, in one round trip of O(1) work
    /// whatever the number of consumers (processing is the total the moving scripts keep); also
    /// exported as gauges.
    pub async fn depths(&self) -> Result<QueueDepths, QueueError> {
        let (pending, processing, dead): (u64, u64, u64) = match &self.store {
            QueueStore::Embedded(file) => file.depths().await?,
            QueueStore::Redis(redis) => {
                DEPTHS
                    .key(&self.keys.pending)
                    .key(&self.keys.dead)
                    .key(&self.keys.processing_total)
                    .invoke_async(&mut redis.redis.conn())
                    .await?
            }
        };
        let depths = QueueDepths {
            pending,
            processing,
            dead,
        };
        for (state, value) in [
            ("pending", pending),
            ("processing", processing),
            ("dead", dead),
        ] {
            metrics::gauge!(telemetry::QUEUE_DEPTH, "queue" => self.name.clone(), "state" => state)
                .set(value as f64);
        }
        Ok(depths)
    }

    pub(crate) fn keys(&self) -> &QueueKeys {
        &self.keys
    }

    /// Redis, for the calls that reach it (each embedded arm returns before asking).
    pub(crate) fn redis(&self) -> Result<&RedisBackend, QueueError> {
        match &self.store {
            QueueStore::Redis(redis) => Ok(&redis.redis),
            QueueStore::Embedded(_) => Err(QueueError::Embedded(sqlx::Error::Protocol(
                "this queue call has no embedded form".into(),
            ))),
        }
    }

    /// The file, when the queue is in the embedded store.
    pub(crate) fn file(&self) -> Option<&embedded::QueueFile> {
        match &self.store {
            QueueStore::Embedded(file) => Some(file),
            QueueStore::Redis(_) => None,
        }
    }

    pub(crate) fn backstop_cursor(
        &self,
    ) -> Option<&std::sync::Mutex<crate::backend::redis::ScanCursor>> {
        match &self.store {
            QueueStore::Redis(redis) => Some(&redis.backstop_cursor),
            QueueStore::Embedded(_) => None,
        }
    }
}
