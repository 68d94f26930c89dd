//! The coordination records of each driver, for the conformance tests: one test body runs on
//! Redis (the suite's topology) and in the embedded store's file through [`CoordDriver`], which
//! builds the [`Coordination`] handle and reads and writes records underneath it.

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use shardkeep::clock::SystemClock;
use shardkeep::queue::{QueueError, WorkQueue, WorkQueueConfig, embedded_queue_name};
use shardkeep::{Coordination, CoordinationConfig, Keyspace};

use crate::{TestRedis, TestSqlite};

/// One driver's records, in a namespace of their own.
pub enum CoordDriver {
    /// Redis.
    Redis(Box<TestRedis>),
    /// The embedded store's file (shared by the namespaces of one test).
    Embedded {
        /// The file.
        file: Arc<TestSqlite>,
        /// This namespace's keys.
        keys: Keyspace,
    },
}

/// A Redis namespace and a fresh embedded store: one driver of each kind.
pub async fn coord_drivers() -> Vec<CoordDriver> {
    vec![
        CoordDriver::Redis(Box::new(TestRedis::new().await)),
        CoordDriver::Embedded {
            file: Arc::new(TestSqlite::new().await),
            keys: fresh_keys(),
        },
    ]
}

fn fresh_keys() -> Keyspace {
    Keyspace::new(&format!("t-{}", uuid::Uuid::new_v4().simple())).expect("test namespace")
}

impl CoordDriver {
    /// The driver's name, for assertion messages.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Redis(_) => "redis",
            Self::Embedded { .. } => "sqlite",
        }
    }

    /// The namespace's keyspace.
    pub fn keys(&self) -> &Keyspace {
        match self {
            Self::Redis(redis) => redis.keys(),
            Self::Embedded { keys, .. } => keys,
        }
    }

    /// Coordination in this namespace with default tunables.
    pub fn coordination(&self) -> Coordination {
        self.coordination_with(CoordinationConfig::default())
    }

    /// Coordination in this namespace with `config`.
    pub fn coordination_with(&self, config: CoordinationConfig) -> Coordination {
        match self {
            Self::Redis(redis) => Coordination::new(redis.backend(), config),
            Self::Embedded { file, keys } => {
                Coordination::embedded(file.backend(), keys.clone(), config, Arc::new(SystemClock))
            }
        }
    }

    /// Placement records in this namespace.
    pub fn placement(&self) -> shardkeep::placement::PlacementStore {
        match self {
            Self::Redis(redis) => shardkeep::placement::PlacementStore::new(redis.backend()),
            Self::Embedded { file, keys } => shardkeep::placement::PlacementStore::embedded(
                file.backend(),
                keys.clone(),
                Arc::new(SystemClock),
            ),
        }
    }

    /// The work queue `name` in this namespace.
    pub fn queue<T>(&self, name: &str, config: WorkQueueConfig) -> Result<WorkQueue<T>, QueueError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned + Send + Sync + 'static,
    {
        match self {
            Self::Redis(redis) => WorkQueue::new(redis.backend(), name, config),
            Self::Embedded { file, keys } => {
                WorkQueue::embedded(file.backend(), keys, name, config, Arc::new(SystemClock))
            }
        }
    }

    /// The consumers registered with queue `name`, sorted.
    pub async fn queue_consumers(&self, name: &str) -> Vec<String> {
        let mut ids: Vec<String> = match self {
            Self::Redis(redis) => {
                let keys = redis.keys().queue(name).unwrap();
                redis.raw().await.smembers(&keys.consumers).await.unwrap()
            }
            Self::Embedded { file, keys } => {
                sqlx::query_scalar("SELECT id FROM queue_consumers WHERE queue = ?1")
                    .bind(embedded_queue_name(keys, name))
                    .fetch_all(file.backend().pool())
                    .await
                    .unwrap()
            }
        };
        ids.sort();
        ids
    }

    /// Makes consumer `id` of queue `name` look stalled past its heartbeat.
    pub async fn lapse_consumer(&self, name: &str, id: &str) {
        match self {
            Self::Redis(redis) => {
                let keys = redis.keys().queue(name).unwrap();
                let heartbeat = keys.consumer_heartbeat(id).unwrap();
                let _: i64 = redis.raw().await.del(heartbeat).await.unwrap();
            }
            Self::Embedded { file, keys } => {
                sqlx::query(
                    "UPDATE queue_consumers SET beat_until = 0 WHERE queue = ?1 AND id = ?2",
                )
                .bind(embedded_queue_name(keys, name))
                .bind(id)
                .execute(file.backend().pool())
                .await
                .unwrap();
            }
        }
    }

    /// Puts `body` underneath queue `name`: pending at the newest end (`holder` none), or held
    /// by consumer `holder` (registered or not).
    pub async fn push_raw_entry(&self, name: &str, holder: Option<&str>, body: &[u8]) {
        match self {
            Self::Redis(redis) => {
                let keys = redis.keys().queue(name).unwrap();
                let list = match holder {
                    Some(id) => keys.processing(id).unwrap(),
                    None => keys.pending,
                };
                let _: i64 = redis.raw().await.lpush(list, body).await.unwrap();
            }
            Self::Embedded { file, keys } => {
                sqlx::query("INSERT INTO queue_entries (queue, body, holder) VALUES (?1, ?2, ?3)")
                    .bind(embedded_queue_name(keys, name))
                    .bind(body)
                    .bind(holder)
                    .execute(file.backend().pool())
                    .await
                    .unwrap();
            }
        }
    }

    /// Entries of queue `name` that consumer `id` holds.
    pub async fn held_by(&self, name: &str, id: &str) -> usize {
        match self {
            Self::Redis(redis) => {
                let keys = redis.keys().queue(name).unwrap();
                let len: usize = redis
                    .raw()
                    .await
                    .llen(keys.processing(id).unwrap())
                    .await
                    .unwrap();
                len
            }
            Self::Embedded { file, keys } => {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM queue_entries WHERE queue = ?1 AND holder = ?2",
                )
                .bind(embedded_queue_name(keys, name))
                .bind(id)
                .fetch_one(file.backend().pool())
                .await
                .unwrap();
                usize::try_from(n).unwrap()
            }
        }
    }

    /// Another namespace on the same engine (the same Redis server, the same file).
    pub async fn neighbour(&self) -> Self {
        match self {
            Self::Redis(redis) => {
                Self::Redis(Box::new(TestRedis::with_url(redis.url().to_owned()).await))
            }
            Self::Embedded { file, .. } => Self::Embedded {
                file: file.clone(),
                keys: fresh_keys(),
            },
        }
    }

    /// The Redis namespace, for assertions on Redis's own structures (index sets).
    pub fn redis(&self) -> Option<&TestRedis> {
        match self {
            Self::Redis(redis) => Some(redis),
            Self::Embedded { .. } => None,
        }
    }

    /// The remaining lifetime of the live record at `key` in milliseconds: `None` when there is
    /// none, `Some(-1)` when it never expires.
    pub async fn pttl(&self, key: &str) -> Option<i64> {
        match self {
            Self::Redis(redis) => {
                let pttl: i64 = redis.raw().await.pttl(key).await.unwrap();
                (pttl != -2).then_some(pttl)
            }
            Self::Embedded { file, .. } => {
                let now = chrono::Utc::now().timestamp_micros();
                let row: Option<Option<i64>> = sqlx::query_scalar(
                    "SELECT expires_at FROM coord_records
                      WHERE key = ?1 AND (expires_at IS NULL OR expires_at > ?2)",
                )
                .bind(key)
                .bind(now)
                .fetch_optional(file.backend().pool())
                .await
                .unwrap();
                row.map(|at| at.map_or(-1, |at| (at - now) / 1000))
            }
        }
    }

    /// Whether a live record is at `key`.
    pub async fn exists(&self, key: &str) -> bool {
        self.pttl(key).await.is_some()
    }

    /// Every live key of this namespace, sorted.
    pub async fn all_keys(&self) -> Vec<String> {
        match self {
            Self::Redis(redis) => redis.all_keys().await,
            Self::Embedded { .. } => {
                let coord = self.coordination();
                let mut found = Vec::new();
                for pattern in self.keys().namespace_patterns() {
                    found.extend(coord.keys_matching(&pattern, usize::MAX).await.unwrap());
                }
                found.sort();
                found.dedup();
                found
            }
        }
    }

    /// Rows stored in the file under this namespace, expired ones included (none on Redis,
    /// which forgets expired keys itself).
    pub async fn stored_rows(&self) -> usize {
        let Self::Embedded { file, keys } = self else {
            return self.all_keys().await.len();
        };
        let mut total = 0;
        for pattern in keys.namespace_patterns() {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM coord_records WHERE key GLOB ?1")
                .bind(pattern)
                .fetch_one(file.backend().pool())
                .await
                .unwrap();
            total += usize::try_from(n).unwrap();
        }
        total
    }

    /// Writes `value` at `key` with no expiry, underneath the primitives (a corrupt or foreign
    /// record).
    pub async fn set_raw(&self, key: &str, value: &[u8]) {
        match self {
            Self::Redis(redis) => {
                let () = redis.raw().await.set(key, value).await.unwrap();
            }
            Self::Embedded { file, .. } => {
                sqlx::query(
                    "INSERT INTO coord_records (key, value, expires_at) VALUES (?1, ?2, NULL)
                     ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = NULL",
                )
                .bind(key)
                .bind(value)
                .execute(file.backend().pool())
                .await
                .unwrap();
            }
        }
    }

    /// Deletes the record at `key` underneath the primitives.
    pub async fn delete_raw(&self, key: &str) {
        match self {
            Self::Redis(redis) => {
                let _: i64 = redis.raw().await.del(key).await.unwrap();
            }
            Self::Embedded { file, .. } => {
                sqlx::query("DELETE FROM coord_records WHERE key = ?1")
                    .bind(key)
                    .execute(file.backend().pool())
                    .await
                    .unwrap();
            }
        }
    }

    /// A coordination handle whose store fails every call for `stretch`: Redis behind a cut
    /// proxy (kept alive by the returned guard), or the file's outage fault hook.
    pub async fn cut_off(&self, stretch: Duration) -> (Coordination, Box<dyn std::any::Any>) {
        match self {
            Self::Redis(redis) => {
                let timeouts = shardkeep::backend::redis::RedisTimeouts {
                    connect: Duration::from_millis(300),
                    response: Duration::from_millis(300),
                };
                let (proxy, cut) =
                    crate::faults::proxied_redis(redis.url(), redis.keys().clone(), timeouts)
                        .await
                        .unwrap();
                crate::faults::ProxyControl::set_mode(&proxy, crate::faults::ProxyMode::Cut);
                let coord = Coordination::new(cut, CoordinationConfig::default());
                (coord, Box::new(proxy))
            }
            Self::Embedded { file, .. } => {
                file.backend().fail_for(stretch);
                (self.coordination(), Box::new(()))
            }
        }
    }
}
