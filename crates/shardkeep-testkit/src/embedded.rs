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

/// One audit trail per driver: Postgres (the test's database) and a fresh embedded store.
pub struct AuditDrivers {
    pool: sqlx::PgPool,
    /// The embedded store's file.
    pub sqlite: TestSqlite,
}

impl AuditDrivers {
    /// The trail on the test's database `pool`, and on a fresh embedded store.
    pub async fn new(pool: &sqlx::PgPool) -> Self {
        Self {
            pool: pool.clone(),
            sqlite: TestSqlite::new().await,
        }
    }

    /// The trail of each driver.
    pub fn stores(&self) -> Vec<shardkeep::audit::AuditStore> {
        vec![
            shardkeep::audit::AuditStore::new(crate::pg(&self.pool)),
            shardkeep::audit::AuditStore::embedded(self.sqlite.backend()),
        ]
    }

    /// Adds a character row named `name` of `account` to the store behind `store`, as the
    /// driver's character table holds it (the embedded store's name key folded as its readers
    /// fold it). Returns the character's id.
    pub async fn character(
        &self,
        store: &shardkeep::audit::AuditStore,
        account: uuid::Uuid,
        name: &str,
    ) -> uuid::Uuid {
        let id = uuid::Uuid::now_v7();
        if store.driver() == "postgres" {
            sqlx::query("INSERT INTO characters (id, account_id, name) VALUES ($1, $2, $3)")
                .bind(id)
                .bind(account)
                .bind(name)
                .execute(&self.pool)
                .await
                .expect("insert a character row");
        } else {
            sqlx::query(
                "INSERT INTO characters (id, account_id, name, name_key, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, 0, 0)",
            )
            .bind(id)
            .bind(account)
            .bind(name)
            .bind(shardkeep::audit::name_key(name))
            .execute(self.sqlite.backend().pool())
            .await
            .expect("insert a character row");
        }
        id
    }
}

/// One character store per driver: Postgres (the test's database) and a fresh embedded store.
pub struct CharacterDrivers {
    pool: sqlx::PgPool,
    /// The embedded store's file.
    pub sqlite: TestSqlite,
}

impl CharacterDrivers {
    /// The store on the test's database `pool`, and on a fresh embedded store.
    pub async fn new(pool: &sqlx::PgPool) -> Self {
        Self {
            pool: pool.clone(),
            sqlite: TestSqlite::new().await,
        }
    }

    /// The character store of each driver.
    pub fn stores(&self) -> Vec<shardkeep::character::CharacterStore> {
        vec![
            shardkeep::character::CharacterStore::new(crate::pg(&self.pool)),
            shardkeep::character::CharacterStore::embedded(self.sqlite.backend()),
        ]
    }

    /// The checkpoint tier that goes with `store`: Redis under `redis` beside Postgres, the
    /// same file beside the embedded store.
    pub fn checkpoints_for(
        &self,
        store: &shardkeep::character::CharacterStore,
        redis: &TestRedis,
    ) -> CheckpointStore {
        match store.driver() {
            "postgres" => CheckpointStore::new(redis.backend()),
            _ => CheckpointStore::embedded(self.sqlite.backend()),
        }
    }
}
