//! Benchmarks that measure shardkeep against the raw engine rates (and, where an issue names
//! one, a peer) in one run, on the same Postgres and Redis. The `shardkeep bench` subcommands
//! call these and print the ratio lines.
//!
//! Each run works in a database and a Redis namespace of its own, created for the run and
//! removed afterwards, so a benchmark never touches operational data.
//!
//! - [`table`] — the report: one row per figure against what it is compared with, ratio, goal.
//! - [`progress`] — progress lines on stderr while a benchmark runs.
//! - [`documents`] — the state documents benchmarks write: fresh, realistic (4 KB), aged.
//! - [`ladder`] — CAS saves and checkpoint writes against the raw engine operations.
//! - [`capacity`] — online characters one shard sustains at the default cadences.
//! - [`login`] — a login storm against the raw reads of the same rows and keys.
//! - [`retry`] — retry jobs end to end against apalis-postgres; [`backlog`] — with a million
//!   jobs queued.
//! - [`queue`] — the durable work queue against apalis-redis; [`depth`] — the cost of the
//!   journal's depth report as consumers grow.
//! - [`audit`] — a death storm through the batched auditor.
//! - [`all`] — every benchmark in one run, one table.

pub mod aging;
pub mod all;
pub mod audit;
pub mod backlog;
pub mod capacity;
pub mod depth;
pub mod documents;
pub mod embedded_cas;
pub mod embedded_report;
pub mod ladder;
pub mod login;
pub mod progress;
pub mod queue;
pub mod retry;
pub mod table;

pub use progress::Progress;
pub use table::{Goal, Row, Table, Unit};

use std::time::{Duration, Instant};

use sqlx::migrate::MigrateDatabase;

use shardkeep::backend::redis::RedisTimeouts;
use shardkeep::backend::{ConnectError, PostgresBackend, RedisBackend};
use shardkeep::keyspace::Keyspace;

/// A benchmark step failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Postgres failed.
    #[error("postgres: {0}")]
    Postgres(#[from] sqlx::Error),
    /// The character store failed.
    #[error(transparent)]
    Store(#[from] shardkeep::character::StoreError),
    /// Redis failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The checkpoint tier failed.
    #[error(transparent)]
    Checkpoint(#[from] shardkeep::character::CheckpointError),
    /// A store could not be reached or set up.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// Something else went wrong.
    #[error("{0}")]
    Other(String),
}

impl BenchError {
    /// An error from anything displayable.
    pub fn other(error: impl std::fmt::Display) -> Self {
        Self::Other(error.to_string())
    }
}

/// A scratch database and Redis namespace for one benchmark run.
pub struct BenchEnv {
    /// The scratch database, migrated.
    pub pg: PostgresBackend,
    /// The scratch namespace.
    pub redis: RedisBackend,
    /// The benchmark's own pool on the scratch database (the backend is built over it), for the
    /// raw statements it compares against.
    pub pool: sqlx::PgPool,
    /// The benchmark's own Redis connection, for raw commands.
    pub redis_conn: shardkeep::backend::redis::RedisConn,
    db_url: String,
    redis_url: String,
}

impl BenchEnv {
    /// Creates a scratch database next to `database_url` and a namespace on `redis_url`.
    pub async fn setup(database_url: &str, redis_url: &str) -> Result<Self, ConnectError> {
        let run = format!("bench_{}", uuid::Uuid::new_v4().simple());
        let (server, _) = database_url.rsplit_once('/').unwrap_or((database_url, ""));
        let db_url = format!("{server}/{run}");
        PostgresBackend::create_database_if_missing("DATABASE_URL", &db_url).await?;
        let failed = |setting: &'static str, url: &str, e: &dyn std::fmt::Display| ConnectError {
            setting,
            target: shardkeep::backend::redact_url(url),
            reason: e.to_string(),
        };
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(5))
            .connect(&db_url)
            .await
            .map_err(|e| failed("DATABASE_URL", &db_url, &e))?;
        let pg = PostgresBackend::from_pool(pool.clone());
        pg.migrate().await.map_err(|e| ConnectError {
            setting: "DATABASE_URL",
            target: shardkeep::backend::redact_url(&db_url),
            reason: e.to_string(),
        })?;
        let keys = Keyspace::new(&run).map_err(|e| ConnectError {
            setting: "REDIS_URL",
            target: shardkeep::backend::redact_url(redis_url),
            reason: e.to_string(),
        })?;
        let redis =
            RedisBackend::connect("REDIS_URL", redis_url, keys, RedisTimeouts::default()).await?;
        let redis_conn = redis.conn();
        Ok(Self {
            pg,
            redis,
            pool,
            redis_conn,
            db_url,
            redis_url: redis_url.to_owned(),
        })
    }

    /// Name of the scratch database.
    pub fn database(&self) -> &str {
        self.db_url.rsplit('/').next().unwrap_or_default()
    }

    /// URL of the scratch database.
    pub fn database_url(&self) -> &str {
        &self.db_url
    }

    /// URL of the Redis server.
    pub fn redis_url(&self) -> &str {
        &self.redis_url
    }

    /// A pool of `size` connections of its own on the scratch database (a worker's, as in
    /// `serve`).
    pub async fn pool_of(&self, size: u32) -> Result<sqlx::PgPool, BenchError> {
        Ok(shardkeep::PostgresBackend::pool_options(size)
            .connect_with(self.pool.connect_options().as_ref().clone())
            .await?)
    }

    /// Drops the scratch database and the namespace's keys.
    pub async fn teardown(self) {
        self.pg.close().await;
        if let Err(err) = sqlx::Postgres::force_drop_database(&self.db_url).await {
            tracing::warn!(event = "bench_teardown_failed", error = %err);
        }
        self.redis.purge_namespace().await;
    }
}

/// Operations per second of `count` operations over `elapsed`.
pub fn rate(count: u64, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// The `p` quantile (0 to 1) of `values`, or NaN when there are none.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize]
}

/// Runs `op` repeatedly for `window`, returning operations done and the time taken. `op` returns
/// how many operations it completed.
pub async fn measure<F, Fut, E>(window: Duration, mut op: F) -> Result<(u64, Duration), E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64, E>>,
{
    let started = Instant::now();
    let mut done = 0;
    while started.elapsed() < window {
        done += op().await?;
    }
    Ok((done, started.elapsed()))
}
