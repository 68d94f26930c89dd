//! Command-line interface: subcommands and the options they share.

use clap::{Args, Parser, Subcommand, ValueEnum};

/// shardkeep — durability for authoritative game servers.
///
/// Configuration comes from flags or the environment: DATABASE_URL (Postgres), REDIS_URL (Redis)
/// and SHARDKEEP_NAMESPACE (prefix of every Redis key). Logging is controlled by RUST_LOG.
#[derive(Debug, Parser)]
#[command(name = "shardkeep", version, about, long_about)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) log: LogArgs,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Logging options.
#[derive(Debug, Args)]
pub(crate) struct LogArgs {
    /// Log line format.
    #[arg(long, env = "SHARDKEEP_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub(crate) log_format: LogFormat,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Apply the SQL migrations embedded in this binary to DATABASE_URL (idempotent).
    Migrate(MigrateArgs),
    /// Measure shardkeep against raw engine rates and peers, in a scratch database and namespace.
    Bench(BenchArgs),
}

/// Options of `shardkeep bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    pub(crate) postgres: PostgresArgs,

    /// Redis connection URL.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub(crate) redis_url: Option<String>,

    #[command(subcommand)]
    pub(crate) which: BenchCommand,
}

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// The durability ladder: batched and single CAS saves against raw UPDATEs, checkpoints
    /// against raw SETs, and the online characters one saver sustains.
    Ladder(LadderBenchArgs),
    /// A death storm through the audit trail: the batched auditor against one INSERT per event,
    /// and what each drops against a store slowed by a proxy.
    Audit(AuditBenchArgs),
}

/// Options of `shardkeep bench audit`.
#[derive(Debug, Args)]
pub(crate) struct AuditBenchArgs {
    /// Events in each throughput step.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(100..=1_000_000))]
    pub(crate) events: u32,

    /// Deaths arriving within one second against the slowed store.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u32).range(10..=100_000))]
    pub(crate) burst: u32,

    /// Milliseconds the proxy adds to every chunk, each way.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=5_000))]
    pub(crate) slowdown_ms: u64,
}

/// Options of `shardkeep bench ladder`.
#[derive(Debug, Args)]
pub(crate) struct LadderBenchArgs {
    /// Rows cycled through by the throughput steps.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(100..=1_000_000))]
    pub(crate) rows: u32,

    /// Seconds per throughput step.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub(crate) seconds: u64,

    /// Rows per batched statement and per pipeline.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) batch: u32,

    /// Online characters in the sustain step (0 skips it).
    #[arg(long, default_value_t = 250_000, value_parser = clap::value_parser!(u32).range(0..=2_000_000))]
    pub(crate) online: u32,

    /// Seconds the sustain step runs at real pulse speed.
    #[arg(long, default_value_t = 70, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub(crate) sustain_seconds: u64,
}

/// Options of `shardkeep migrate`.
#[derive(Debug, Clone, Args)]
pub(crate) struct MigrateArgs {
    #[command(flatten)]
    pub(crate) postgres: PostgresArgs,

    /// Create the database named in DATABASE_URL first, if it does not exist.
    #[arg(long)]
    pub(crate) create_database: bool,
}

/// Where Postgres is.
#[derive(Debug, Clone, Args)]
pub(crate) struct PostgresArgs {
    /// Postgres connection URL, e.g. postgres://postgres@127.0.0.1:5432/shardkeep.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub(crate) database_url: Option<String>,

    /// Seconds to wait for a Postgres connection before giving up.
    #[arg(long, env = "SHARDKEEP_CONNECT_TIMEOUT", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub(crate) connect_timeout: u64,
}

/// Where Redis is, and the namespace of every key.
#[derive(Debug, Clone, Args)]
pub(crate) struct RedisArgs {
    /// Redis connection URL, e.g. redis://127.0.0.1:6379.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub(crate) redis_url: Option<String>,

    /// Prefix of every Redis key (1 to 64 characters of [A-Za-z0-9_-]).
    #[arg(long, env = "SHARDKEEP_NAMESPACE", default_value = "shardkeep")]
    pub(crate) namespace: String,
}
