//! The embedded store for tests, and the drivers of each tier the conformance tests run on.
//!
//! [`TestSqlite`] is a fresh, migrated SQLite file in its own temporary directory, removed on
//! drop. [`CheckpointDrivers`] holds one checkpoint tier per driver — Redis of the suite's
//! topology (standalone or cluster, as `REDIS_URL` says) and the embedded store — so one test
//! body runs against each.

use std::path::PathBuf;

use shardkeep::SqliteBackend;
use shardkeep::character::CheckpointStore;

use crate::TestRedis;

/// A fresh embedded store in a temporary directory, deleted on drop.
pub struct TestSqlite {
    dir: PathBuf,
    url: String,
    backend: SqliteBackend,
}

impl TestSqlite {
    /// A new file with every embedded migration applied.
    pub async fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("shardkeep-test-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).expect("create the test's directory");
        let url = format!("sqlite:{}", dir.join("shardkeep.db").display());
        let backend = SqliteBackend::connect("DATABASE_URL", &url)
            .await
            .expect("open the test's SQLite file");
        backend
            .migrate()
            .await
            .expect("migrate the test's SQLite file");
        Self { dir, url, backend }
    }

    /// The file's `DATABASE_URL`, to open it again as another process would.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The store over the file.
    pub fn backend(&self) -> SqliteBackend {
        self.backend.clone()
    }
}

impl Drop for TestSqlite {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One checkpoint tier per driver, each on fresh storage.
pub struct CheckpointDrivers {
    /// The Redis namespace of the Redis driver.
    pub redis: TestRedis,
    /// The embedded store's file.
    pub sqlite: TestSqlite,
}

impl CheckpointDrivers {
    /// Fresh storage for each driver.
    pub async fn new() -> Self {
        Self {
            redis: TestRedis::new().await,
            sqlite: TestSqlite::new().await,
        }
    }

    /// The checkpoint tier of each driver, kept for the standard hour.
    pub fn stores(&self) -> Vec<CheckpointStore> {
        vec![
            CheckpointStore::new(self.redis.backend()),
            CheckpointStore::embedded(self.sqlite.backend()),
        ]
    }
}
