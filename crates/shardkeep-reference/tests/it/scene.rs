//! One driver's stores for a shard-level test, with the rows underneath to read back: Postgres
//! and a Redis namespace, or one embedded file.

use shardkeep_testkit::{JobDriver, TestRedis, TestSqlite};
use sqlx::PgPool;

use crate::support::Stores;

/// Which stores a test runs on.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Driver {
    /// Postgres and Redis.
    Servers,
    /// One embedded file.
    Embedded,
}

impl Driver {
    /// Every driver, in the order the tests run them.
    pub(crate) const ALL: [Driver; 2] = [Driver::Servers, Driver::Embedded];
}

/// What keeps a driver's stores alive for the test (held, never read): dropping it sweeps the
/// namespace and stops the shard's writers, or deletes the file.
#[allow(dead_code)]
pub(crate) enum Keep {
    Redis(Box<TestRedis>),
    File(TestSqlite),
}

/// One driver's stores and the rows underneath them.
pub(crate) struct Scene {
    /// The services' handles over the driver's stores.
    pub(crate) stores: Stores,
    /// The same storage, for reading tables back and for retry queues and workers.
    pub(crate) rows: JobDriver,
    pub(crate) keep: Keep,
}

impl Scene {
    /// Fresh stores of `driver` (Postgres: the test's database `pool`).
    pub(crate) async fn new(pool: &PgPool, driver: Driver) -> Self {
        match driver {
            Driver::Servers => {
                let redis = TestRedis::new().await;
                Self {
                    stores: Stores::new(pool, redis.backend()),
                    rows: JobDriver::Postgres(pool.clone()),
                    keep: Keep::Redis(Box::new(redis)),
                }
            }
            Driver::Embedded => {
                let sqlite = TestSqlite::new().await;
                Self {
                    stores: Stores::embedded(&sqlite),
                    rows: JobDriver::Embedded(sqlite.backend()),
                    keep: Keep::File(sqlite),
                }
            }
        }
    }
}
