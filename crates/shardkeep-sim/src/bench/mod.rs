//! Benchmarks that measure shardkeep against the raw engine rates (and, where an issue names
//! one, a peer) in one run, on the same Postgres and Redis. The `shardkeep bench` subcommands
//! call these and print the ratio lines.
//!
//! Each run works in a database and a Redis namespace of its own, created for the run and
//! removed afterwards, so a benchmark never touches operational data.

pub mod aging;
pub mod audit;
pub mod ladder;

use std::time::{Duration, Instant};

use sqlx::migrate::MigrateDatabase;

use shardkeep::backend::redis::RedisTimeouts;
use shardkeep::backend::{ConnectError, PostgresBackend, RedisBackend};
use shardkeep::keyspace::Keyspace;

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
    pub redis_conn: redis::aio::ConnectionManager,
    db_url: String,
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
        let redis_conn = redis::Client::open(redis_url)
            .map_err(|e| failed("REDIS_URL", redis_url, &e))?
            .get_connection_manager()
            .await
            .map_err(|e| failed("REDIS_URL", redis_url, &e))?;
        Ok(Self {
            pg,
            redis,
            pool,
            redis_conn,
            db_url,
        })
    }

    /// Name of the scratch database.
    pub fn database(&self) -> &str {
        self.db_url.rsplit('/').next().unwrap_or_default()
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
