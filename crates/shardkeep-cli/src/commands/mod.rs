//! One module per subcommand, and the store connections they share.

mod bench;
mod hostile;
mod migrate;
mod ops;
mod serve;
mod simulate;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, anyhow};
use shardkeep::backend::redis::{EvictionCheck, RedisOptions, RedisTimeouts};
use shardkeep::{Keyspace, PostgresBackend, RedisBackend};

use crate::cli::{Command, PostgresArgs, RedisArgs};

/// Runs one subcommand.
pub(crate) async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Migrate(args) => migrate::run(&args).await,
        Command::Bench(args) => bench::run(&args).await,
        Command::Serve(args) => serve::run(args).await,
        Command::DeadLetters(args) => ops::dead_letters(&args).await,
        Command::Cleanup(args) => ops::cleanup(&args).await,
        Command::Simulate(args) => simulate::run(&args).await,
    }
}

/// The Postgres URL, or an error naming DATABASE_URL.
pub(crate) fn database_url(args: &PostgresArgs) -> anyhow::Result<&str> {
    args.database_url
        .as_deref()
        .filter(|url| !url.trim().is_empty())
        .ok_or_else(|| anyhow!("DATABASE_URL is not set; pass --database-url or set DATABASE_URL"))
}

/// Refuses a `sqlite:` DATABASE_URL beside a REDIS_URL: the embedded store keeps everything in
/// its file, so half of the state in Redis would be a store nobody reads.
pub(crate) fn refuse_mixed_stores() -> anyhow::Result<()> {
    let redis = std::env::var("REDIS_URL").unwrap_or_default();
    if !redis.trim().is_empty() {
        return Err(anyhow!(
            "DATABASE_URL names a SQLite file (embedded mode) but REDIS_URL is set: embedded mode \
             keeps everything in the file and uses no Redis; unset REDIS_URL, or set DATABASE_URL \
             to a postgres:// URL to run on Postgres and Redis"
        ));
    }
    Ok(())
}

/// The Postgres URL of a command that needs Postgres: an error naming DATABASE_URL when it is
/// unset or names a SQLite file.
pub(crate) fn postgres_url(args: &PostgresArgs) -> anyhow::Result<&str> {
    let url = database_url(args)?;
    if shardkeep::backend::sqlite::is_sqlite_url(url) {
        return Err(anyhow!(
            "DATABASE_URL names a SQLite file (embedded mode); this command needs postgres:// \
             and REDIS_URL"
        ));
    }
    Ok(url)
}

/// Connects to Postgres, or fails with one line naming DATABASE_URL and what was tried.
pub(crate) async fn connect_postgres(
    args: &PostgresArgs,
    max_connections: u32,
) -> anyhow::Result<PostgresBackend> {
    let url = postgres_url(args)?;
    Ok(PostgresBackend::connect_through(
        "DATABASE_URL",
        url,
        max_connections,
        Duration::from_secs(args.connect_timeout),
        args.pg_pooler,
    )
    .await?)
}

/// The Redis URL, or an error naming REDIS_URL.
pub(crate) fn redis_url(url: Option<&str>) -> anyhow::Result<&str> {
    url.filter(|url| !url.trim().is_empty())
        .ok_or_else(|| anyhow!("REDIS_URL is not set; pass --redis-url or set REDIS_URL"))
}

/// Connects to Redis, or fails with one line naming REDIS_URL and what was tried.
pub(crate) async fn connect_redis(args: &RedisArgs) -> anyhow::Result<RedisBackend> {
    let url = redis_url(args.redis_url.as_deref())?;
    let keys = Keyspace::new(&args.namespace).context("SHARDKEEP_NAMESPACE")?;
    let options = RedisOptions {
        timeouts: RedisTimeouts::default(),
        eviction: if args.allow_eviction {
            EvictionCheck::Skip
        } else {
            EvictionCheck::Require
        },
        ..RedisOptions::default()
    };
    Ok(RedisBackend::connect_with("REDIS_URL", url, keys, options).await?)
}
