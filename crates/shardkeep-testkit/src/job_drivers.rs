//! The retry jobs of each driver, for the conformance tests: one test body runs on Postgres and
//! on the embedded store's file through [`JobDriver`], which builds the queue, the worker and the
//! character rows the jobs apply to, and reads the tables back.

use std::sync::Arc;

use shardkeep::SqliteBackend;
use shardkeep::character::{CharacterStore, CheckpointStore, NewCharacter};
use shardkeep::clock::Clock;
use shardkeep::retry::{RetryQueue, RetrySignals, RetryWorker, RetryWorkerConfig};
use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use uuid::Uuid;

use crate::TestSqlite;

/// The job stores of each driver: Postgres (the test's database) and a fresh embedded store.
pub struct JobDrivers {
    pool: sqlx::PgPool,
    /// The embedded store's file.
    pub sqlite: TestSqlite,
}

impl JobDrivers {
    /// The jobs on the test's database `pool`, and in a fresh embedded store.
    pub async fn new(pool: &sqlx::PgPool) -> Self {
        Self {
            pool: pool.clone(),
            sqlite: TestSqlite::new().await,
        }
    }

    /// Each driver.
    pub fn drivers(&self) -> Vec<JobDriver> {
        vec![
            JobDriver::Postgres(self.pool.clone()),
            JobDriver::Embedded(self.sqlite.backend()),
        ]
    }
}

/// One driver's storage.
#[derive(Clone)]
pub enum JobDriver {
    /// Postgres.
    Postgres(sqlx::PgPool),
    /// The embedded store's file.
    Embedded(SqliteBackend),
}

impl JobDriver {
    /// The driver's name, for assertion messages.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Postgres(_) => "postgres",
            Self::Embedded(_) => "sqlite",
        }
    }

    /// The character store.
    pub fn characters(&self) -> CharacterStore {
        match self {
            Self::Postgres(pool) => CharacterStore::new(crate::pg(pool)),
            Self::Embedded(db) => CharacterStore::embedded(db.clone()),
        }
    }

    /// The checkpoint tier that goes with this driver: Redis under `redis` beside Postgres, the
    /// same file beside the embedded store.
    pub fn checkpoints(&self, redis: &crate::TestRedis) -> CheckpointStore {
        match self {
            Self::Postgres(_) => CheckpointStore::new(redis.backend()),
            Self::Embedded(db) => CheckpointStore::embedded(db.clone()),
        }
    }

    /// A retry queue whose signal channel holds `depth` ids.
    pub fn queue(&self, depth: usize, clock: Arc<dyn Clock>) -> (RetryQueue, RetrySignals) {
        match self {
            Self::Postgres(pool) => RetryQueue::new(crate::pg(pool), depth, clock),
            Self::Embedded(db) => RetryQueue::embedded(db.clone(), depth, clock),
        }
    }

    /// A retry worker playing the ledger model.
    pub fn worker(
        &self,
        signals: RetrySignals,
        config: RetryWorkerConfig,
        clock: Arc<dyn Clock>,
    ) -> RetryWorker {
        self.worker_for(crate::model::LedgerModel::handle(), signals, config, clock)
    }

    /// A retry worker applying effects through `model`.
    pub fn worker_for(
        &self,
        model: shardkeep::model::ModelHandle,
        signals: RetrySignals,
        config: RetryWorkerConfig,
        clock: Arc<dyn Clock>,
    ) -> RetryWorker {
        match self {
            Self::Postgres(pool) => {
                RetryWorker::new(crate::pg(pool), model, signals, config, clock)
            }
            Self::Embedded(db) => RetryWorker::embedded(db.clone(), model, signals, config, clock),
        }
    }

    /// A new character named `name` holding the ledger model's empty document.
    pub async fn character(&self, name: &str) -> Uuid {
        let id = Uuid::now_v7();
        self.characters()
            .create(&NewCharacter {
                character_id: id,
                account_id: Uuid::now_v7(),
                name: name.into(),
                zone_ref: Some("zone-0".into()),
                room_ref: Some("r0".into()),
                state: serde_json::json!({ "experience": 0, "currency": 0 }).into(),
                chargen: None,
                schema_version: 1,
            })
            .await
            .expect("create a character");
        id
    }

    /// The character's stored document.
    pub async fn state(&self, id: Uuid) -> serde_json::Value {
        let (text,): (String,) = self
            .fetch_one("SELECT state::text FROM characters WHERE id = $1", Some(id))
            .await;
        serde_json::from_str(&text).expect("a stored document is JSON")
    }

    /// The character's experience.
    pub async fn experience(&self, id: Uuid) -> i64 {
        self.state(id).await["experience"]
            .as_i64()
            .expect("experience is a number")
    }

    /// Overwrites the character's document behind the library's back (a corrupt or repaired
    /// row).
    pub async fn set_state(&self, id: Uuid, state: serde_json::Value) {
        let done = match self {
            Self::Postgres(pool) => sqlx::query("UPDATE characters SET state = $2 WHERE id = $1")
                .bind(id)
                .bind(state)
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
            Self::Embedded(db) => sqlx::query("UPDATE characters SET state = ?2 WHERE id = ?1")
                .bind(id)
                .bind(state.to_string())
                .execute(db.pool())
                .await
                .map(|r| r.rows_affected()),
        };
        assert_eq!(done.expect("overwrite a document"), 1);
    }

    /// The rows of `table`.
    pub async fn count(&self, table: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM {table}");
        match self {
            Self::Postgres(pool) => sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(pool)
                .await
                .expect("count rows"),
            Self::Embedded(db) => sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(db.pool())
                .await
                .expect("count rows"),
        }
    }

    /// Runs `sql` (Postgres's dialect, `$n` marks; `::text` casts and `now()` are read as the
    /// embedded schema stores text and instants) with `id` bound as `$1` when given, and decodes
    /// its one row.
    pub async fn fetch_one<T>(&self, sql: &str, id: Option<Uuid>) -> T
    where
        T: for<'r> sqlx::FromRow<'r, PgRow> + for<'r> sqlx::FromRow<'r, SqliteRow> + Send + Unpin,
    {
        match self {
            Self::Postgres(pool) => {
                let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_owned()));
                if let Some(id) = id {
                    query = query.bind(id);
                }
                query.fetch_one(pool).await.expect("read one row")
            }
            Self::Embedded(db) => {
                let mut query = sqlx::query_as(sqlx::AssertSqlSafe(Self::embedded_sql(sql)));
                if let Some(id) = id {
                    query = query.bind(id);
                }
                query.fetch_one(db.pool()).await.expect("read one row")
            }
        }
    }

    /// Runs `sql` (as [`Self::fetch_one`] reads it), with `id` bound as `$1` when given, and
    /// decodes every row.
    pub async fn fetch_all<T>(&self, sql: &str, id: Option<Uuid>) -> Vec<T>
    where
        T: for<'r> sqlx::FromRow<'r, PgRow> + for<'r> sqlx::FromRow<'r, SqliteRow> + Send + Unpin,
    {
        match self {
            Self::Postgres(pool) => {
                let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_owned()));
                if let Some(id) = id {
                    query = query.bind(id);
                }
                query.fetch_all(pool).await.expect("read the rows")
            }
            Self::Embedded(db) => {
                let mut query = sqlx::query_as(sqlx::AssertSqlSafe(Self::embedded_sql(sql)));
                if let Some(id) = id {
                    query = query.bind(id);
                }
                query.fetch_all(db.pool()).await.expect("read the rows")
            }
        }
    }

    /// Runs `sql` (as [`Self::fetch_one`] reads it), with `id` bound as `$1` when given.
    pub async fn execute(&self, sql: &str, id: Option<Uuid>) -> Result<u64, sqlx::Error> {
        match self {
            Self::Postgres(pool) => {
                let mut query = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()));
                if let Some(id) = id {
                    query = query.bind(id);
                }
                Ok(query.execute(pool).await?.rows_affected())
            }
            Self::Embedded(db) => {
                let mut query = sqlx::query(sqlx::AssertSqlSafe(Self::embedded_sql(sql)));
                if let Some(id) = id {
                    query = query.bind(id);
                }
                Ok(query.execute(db.pool()).await?.rows_affected())
            }
        }
    }

    /// Ends every job's lease a second ago (a worker that died holding them).
    pub async fn expire_leases(&self) {
        let sql = match self {
            Self::Postgres(_) => {
                "UPDATE persistence_retry_jobs SET lease_expires_at = now() - interval '1 second'
                  WHERE lease_token IS NOT NULL"
            }
            Self::Embedded(_) => {
                "UPDATE persistence_retry_jobs SET lease_expires_at = now() - 1000000
                  WHERE lease_token IS NOT NULL"
            }
        };
        self.execute(sql, None).await.expect("expire the leases");
    }

    /// Postgres's dialect as the embedded file reads it: `?n` marks, no `::text` casts (the
    /// documents are text), and `now()` as microseconds since the epoch.
    fn embedded_sql(sql: &str) -> String {
        let now = chrono::Utc::now().timestamp_micros();
        sql.replace('$', "?")
            .replace("::text", "")
            .replace("now()", &now.to_string())
    }
}
