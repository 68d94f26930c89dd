//! Stores of either driver with a path for the shard that a test can cut or stall while its own
//! reads go on: a fault proxy in front of Postgres (checkpoints straight to Redis), or a second
//! connection to the embedded file with the file's fault hooks (rows, checkpoints and jobs all
//! behind it).

use std::sync::Arc;
use std::time::Duration;

use shardkeep::SqliteBackend;
use shardkeep::backend::redis::RedisTimeouts;
use shardkeep::character::CheckpointStore;
use shardkeep::clock::SystemClock;
use shardkeep::retry::{RetryStats, RetryWorkerConfig};
use shardkeep_reference::game::ReferenceModel;
use shardkeep_testkit::faults::{FaultProxy, ProxyControl, ProxyMode, ProxySet};
use shardkeep_testkit::{JobDriver, TestRedis, TestSqlite};
use sqlx::PgPool;

pub(crate) use crate::scene::{Driver, Keep, Scene};
use crate::support::{pg_addr, proxied_pg};

/// A store outage a test turns on and off on the shard's path only.
pub(crate) enum Outage {
    /// A proxy in front of Postgres.
    Proxy(FaultProxy),
    /// The shard's own connection to the embedded file.
    File(SqliteBackend),
}

/// Longer than any test: an outage lasts until [`Outage::heal`].
const UNTIL_HEALED: Duration = Duration::from_secs(3_600);

impl Outage {
    /// Every call fails at once (Postgres: the connections are cut).
    pub(crate) fn cut(&self) {
        match self {
            Self::Proxy(proxy) => proxy.set_mode(ProxyMode::Cut),
            Self::File(db) => db.fail_for(UNTIL_HEALED),
        }
    }

    /// Calls hang (Postgres: every call; the file: every write).
    pub(crate) fn stall(&self) {
        match self {
            Self::Proxy(proxy) => proxy.set_mode(ProxyMode::Stall),
            Self::File(db) => db.stall_writes_for(UNTIL_HEALED),
        }
    }

    /// Calls go through again.
    pub(crate) fn heal(&self) {
        match self {
            Self::Proxy(proxy) => proxy.set_mode(ProxyMode::Pass),
            Self::File(db) => db.end_outage(),
        }
    }
}

/// An outage of the fast tier on the shard's path only.
pub(crate) enum FastOutage {
    /// A proxy before every Redis node.
    Redis(ProxySet),
    /// The shard's own connection to the embedded file.
    File(SqliteBackend),
}

impl FastOutage {
    /// Every call fails at once.
    pub(crate) fn cut(&self) {
        match self {
            Self::Redis(proxies) => proxies.set_mode(ProxyMode::Cut),
            Self::File(db) => db.fail_for(UNTIL_HEALED),
        }
    }

    /// Calls go through again.
    pub(crate) fn heal(&self) {
        match self {
            Self::Redis(proxies) => proxies.set_mode(ProxyMode::Pass),
            Self::File(db) => db.end_outage(),
        }
    }
}

/// The test's Redis namespace through proxies of its own (cut them to cut it), answers bounded
/// by `response_ms`.
async fn proxied_redis(redis: &TestRedis, response_ms: u64) -> (ProxySet, shardkeep::RedisBackend) {
    let timeouts = RedisTimeouts {
        connect: Duration::from_millis(300),
        response: Duration::from_millis(response_ms),
    };
    let (proxies, proxied) = shardkeep_testkit::faults::proxied_redis(
        &shardkeep_testkit::redis_url(),
        redis.keys().clone(),
        timeouts,
    )
    .await
    .unwrap();
    redis.closes_with(&proxied);
    (proxies, proxied)
}

/// Fresh stores of `driver`, and a checkpoint tier over a path of the shard's own that the
/// test can cut while its reads through the scene's stores go on: proxies before Redis, or a
/// second connection to the embedded file.
pub(crate) async fn faultable_checkpoints(
    pool: &PgPool,
    driver: Driver,
) -> (Scene, CheckpointStore, FastOutage) {
    let scene = Scene::new(pool, driver).await;
    let (checkpoints, outage) = match &scene.keep {
        Keep::Redis(redis) => {
            let (proxies, proxied) = proxied_redis(redis, 300).await;
            (CheckpointStore::new(proxied), FastOutage::Redis(proxies))
        }
        Keep::File(sqlite) => {
            let db = SqliteBackend::connect("DATABASE_URL", sqlite.url())
                .await
                .unwrap();
            (CheckpointStore::embedded(db.clone()), FastOutage::File(db))
        }
    };
    (scene, checkpoints, outage)
}

/// Services of either driver for a shard on the runtime, over a path the test can cut or stall
/// (Postgres behind a fault proxy with Redis direct, or a second connection to the embedded
/// file, every tier behind it), and the test's own services beside them, never faulted.
pub(crate) struct FaultableServices {
    _keep: Keep,
    /// The test's own handles over the same stores (reads, claims elsewhere).
    pub(crate) own: shardkeep::Services,
    /// The shard's services, over the faultable path.
    pub(crate) shard: shardkeep::Services,
    /// Switches the shard's path to the rows and jobs off and on.
    pub(crate) outage: Outage,
    /// Switches the shard's path to its fast tier (Redis, or the same embedded file) off and on.
    pub(crate) fast: FastOutage,
    /// The retry jobs' store (never faulted), to read them and to run a worker.
    pub(crate) jobs: JobDriver,
    /// `postgres` or `embedded`.
    pub(crate) driver: &'static str,
}

impl FaultableServices {
    /// Fresh stores of `driver` (Postgres: the test's database `pool`).
    pub(crate) async fn new(pool: &PgPool, driver: Driver) -> Self {
        let config = || shardkeep::ServicesConfig::new("it-faultable", "game_server");
        match driver {
            Driver::Servers => {
                let redis = TestRedis::new().await;
                let own = shardkeep::Services::build(
                    shardkeep_testkit::pg(pool),
                    redis.backend(),
                    ReferenceModel::handle(),
                    config(),
                )
                .unwrap();
                let proxy = FaultProxy::start(pg_addr()).await.unwrap();
                let proxied = proxied_pg(pool, &proxy).await;
                let (proxies, fast) = proxied_redis(&redis, 500).await;
                let shard =
                    shardkeep::Services::build(proxied, fast, ReferenceModel::handle(), config())
                        .unwrap();
                Self {
                    _keep: Keep::Redis(Box::new(redis)),
                    own,
                    shard,
                    outage: Outage::Proxy(proxy),
                    fast: FastOutage::Redis(proxies),
                    jobs: JobDriver::Postgres(pool.clone()),
                    driver: "postgres",
                }
            }
            Driver::Embedded => {
                let sqlite = TestSqlite::new().await;
                let keys =
                    shardkeep::Keyspace::new(&format!("t-{}", uuid::Uuid::now_v7().simple()))
                        .unwrap();
                let embedded = |db: SqliteBackend| {
                    shardkeep::Services::embedded(
                        db,
                        &keys,
                        ReferenceModel::handle(),
                        config(),
                        Arc::new(SystemClock),
                    )
                    .unwrap()
                };
                let own = embedded(sqlite.backend());
                let shard_db = SqliteBackend::connect("DATABASE_URL", sqlite.url())
                    .await
                    .unwrap();
                let shard = embedded(shard_db.clone());
                Self {
                    jobs: JobDriver::Embedded(sqlite.backend()),
                    _keep: Keep::File(sqlite),
                    own,
                    shard,
                    outage: Outage::File(shard_db.clone()),
                    fast: FastOutage::File(shard_db),
                    driver: "embedded",
                }
            }
        }
    }

    /// Whether the checkpoints share the rows' faultable path (the embedded file).
    pub(crate) fn checkpoints_share_the_outage(&self) -> bool {
        matches!(self.outage, Outage::File(_))
    }

    /// Runs a retry worker of the reference game until no job is due; returns the jobs it
    /// settled and how many of them were superseded.
    pub(crate) async fn run_retry_worker(&self) -> (usize, u64) {
        let clock = Arc::new(SystemClock);
        let (_, signals) = self.jobs.queue(4, clock.clone());
        let mut worker = self.jobs.worker_for(
            ReferenceModel::handle(),
            signals,
            RetryWorkerConfig::new("w"),
            clock,
        );
        let stats = worker.stats();
        let settled = worker.run_until_idle().await.unwrap();
        (settled, RetryStats::get(&stats.superseded))
    }
}
