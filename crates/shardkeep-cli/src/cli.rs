//! Command-line interface: subcommands and the options they share.

use clap::{Args, Parser, Subcommand, ValueEnum};
use shardkeep::backend::postgres::PgPooler;

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
    /// Run the workers (retry jobs, session journal, reconciliation) and the operator API,
    /// console and metrics on one address, until SIGINT or SIGTERM.
    Serve(ServeArgs),
    /// List or requeue dead letters through the signed internal API.
    DeadLetters(DeadLettersArgs),
    /// Run an admin cleanup of Redis (presence, handoff, registry) through the signed API.
    Cleanup(CleanupArgs),
    /// Simulate whole shards of synthetic players under faults, in a scratch database and
    /// namespace, then check the invariants against the durable stores. Exits 3 when an
    /// invariant fails, 4 when `--require-stable` is given and something grew.
    Simulate(SimulateArgs),
}

/// Options of `shardkeep simulate`.
#[derive(Debug, Args)]
pub(crate) struct SimulateArgs {
    #[command(flatten)]
    pub(crate) postgres: PostgresArgs,

    /// Redis connection URL.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub(crate) redis_url: Option<String>,

    /// Play time, as seconds (`90`) or with a unit (`90s`, `2m`); settling and checks follow.
    #[arg(long, env = "SHARDKEEP_SIM_DURATION", default_value = "60s", value_parser = parse_duration)]
    pub(crate) duration: std::time::Duration,

    /// Shards in the process.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub(crate) shards: u32,

    /// Synthetic players.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) players: u32,

    /// Seed of every choice the run makes (players' actions, fault plan).
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,

    /// Faults to inject: `all`, `none`, or a comma list of kill-shard, zombie, redis-outage,
    /// postgres-outage, queue-full, poison, worker-crash, redis-failover (on a Redis Cluster),
    /// kill-serve (with `--serves`). `all` is every fault but the last two.
    #[arg(long, default_value = "all")]
    pub(crate) faults: shardkeep_sim::FaultSet,

    /// Run the workers (retry, journal, maintenance) in this many `shardkeep serve` processes
    /// beside the run, sharing its database and namespace, instead of inside it (0).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=8))]
    pub(crate) serves: u32,

    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub(crate) report: Option<std::path::PathBuf>,

    /// Also draw the run's time series to this SVG file.
    #[arg(long)]
    pub(crate) plot: Option<std::path::PathBuf>,

    /// Exit 4 unless the stability verdict over the run's last stretch is `stable` (a soak; runs
    /// under 10 minutes get no verdict and pass on their invariants).
    #[arg(long)]
    pub(crate) require_stable: bool,

    /// Keep the scratch database and Redis keys after the run (for inspection).
    #[arg(long)]
    pub(crate) keep: bool,

    /// Run in embedded mode: everything in a scratch SQLite file, no Postgres or Redis (the
    /// default when DATABASE_URL names a `sqlite:` file). The store outages fail every call of
    /// the file for their stretch; redis-failover, kill-serve and `--serves` need the servers.
    #[arg(long)]
    pub(crate) embedded: bool,
}

/// Parses `90`, `90s`, `1500ms` or `2m` (1 s to 24 h).
pub(crate) fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 90, 90s or 2m"))?;
    let millis = match unit {
        "" | "s" => number.checked_mul(1000),
        "ms" => Some(number),
        "m" => number.checked_mul(60_000),
        "h" => number.checked_mul(3_600_000),
        other => return Err(format!("unknown unit {other:?}; use ms, s, m or h")),
    }
    .ok_or_else(|| format!("{text:?} is too long"))?;
    let duration = std::time::Duration::from_millis(millis);
    if duration < std::time::Duration::from_secs(1)
        || duration > std::time::Duration::from_secs(86_400)
    {
        return Err(format!("{text:?} is outside 1 s to 24 h"));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::{CommandFactory, Parser};
    use proptest::prelude::*;

    use super::{Cli, parse_duration};

    /// Every subcommand with the long flags it takes, read from the parser itself.
    fn vocabulary() -> Vec<(Vec<String>, Vec<String>)> {
        fn walk(
            command: &clap::Command,
            path: &[String],
            flags: &[String],
            out: &mut Vec<(Vec<String>, Vec<String>)>,
        ) {
            // Global flags of a parent stay valid below it.
            let mut flags = flags.to_vec();
            flags.extend(
                command
                    .get_arguments()
                    .filter_map(|a| a.get_long().map(|l| format!("--{l}"))),
            );
            let mut leaf = true;
            for sub in command.get_subcommands() {
                leaf = false;
                let mut path = path.to_vec();
                path.push(sub.get_name().to_owned());
                walk(sub, &path, &flags, out);
            }
            if leaf {
                out.push((path.to_vec(), flags));
            }
        }
        let mut out = Vec::new();
        walk(&Cli::command(), &[], &[], &mut out);
        out
    }

    /// A value a user could type after a flag.
    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            ".{0,24}",
            "-?[0-9]{1,22}",
            "[0-9]{1,6}(ms|s|m|h|x)?",
            "(redis|postgres|sqlite|http)://[ -~]{0,30}",
            "[a-z,-]{0,30}",
            Just(String::new()),
        ]
    }

    #[test]
    fn the_parser_is_consistent() {
        Cli::command().debug_assert();
        // The fuzz reaches nested commands, such as `bench hostile-api`.
        let paths: Vec<String> = vocabulary().into_iter().map(|(p, _)| p.join(" ")).collect();
        assert!(paths.iter().any(|p| p == "bench hostile-api"), "{paths:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

        /// Fuzzed command lines: a subcommand, its own flags and others, values of any shape,
        /// stray words. Parsing never panics; a refusal is a clap error that names the problem.
        #[test]
        fn fuzzed_command_lines_parse_or_are_refused_with_a_message(
            sub in 0usize..64,
            picks in prop::collection::vec((any::<usize>(), prop::option::of(value()), any::<bool>()), 0..6),
            stray in prop::option::of(".{0,12}"),
        ) {
            let vocabulary = vocabulary();
            let (path, flags) = &vocabulary[sub % vocabulary.len()];
            let mut args = vec!["shardkeep".to_owned()];
            args.extend(path.iter().cloned());
            for (flag, value, joined) in picks {
                let flag = flags.get(flag % flags.len().max(1)).cloned().unwrap_or_else(|| "--bogus".into());
                match (value, joined) {
                    (Some(value), true) => args.push(format!("{flag}={value}")),
                    (Some(value), false) => { args.push(flag); args.push(value); }
                    (None, _) => args.push(flag),
                }
            }
            args.extend(stray);
            if let Err(err) = Cli::try_parse_from(&args) {
                // A refusal is a usage error that says what was wrong, never a crash of the
                // parser's own definitions.
                use clap::error::ErrorKind;
                prop_assert!(
                    !matches!(err.kind(), ErrorKind::Io | ErrorKind::Format),
                    "{args:?}: {err}"
                );
                prop_assert!(!err.to_string().trim().is_empty(), "{args:?}");
            }
        }
    }

    #[test]
    fn durations_parse_with_and_without_units() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        for bad in [
            "",
            "s",
            "-5",
            "10x",
            "0",
            "500ms",
            "25h",
            "99999999999999999999",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}

/// Options of `shardkeep serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub(crate) postgres: PostgresArgs,

    #[command(flatten)]
    pub(crate) redis: RedisArgs,

    /// Address of the HTTP server.
    #[arg(long, env = "SHARDKEEP_LISTEN", default_value = "127.0.0.1:7400")]
    pub(crate) listen: std::net::SocketAddr,

    /// Signing keys, comma-separated key_id:secret pairs (several at once, for rotation).
    #[arg(long, env = "SHARDKEEP_INTERNAL_KEYS", hide_env_values = true)]
    pub(crate) internal_keys: Option<String>,

    /// Accepted clock skew of signed requests, in seconds (±).
    #[arg(long, env = "SHARDKEEP_SKEW_SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..=86_400))]
    pub(crate) skew_seconds: u32,

    /// Password of the operator console (unset: the console is disabled).
    #[arg(long, env = "SHARDKEEP_CONSOLE_PASSWORD", hide_env_values = true)]
    pub(crate) console_password: Option<String>,

    /// Console login attempts one client address may make per 5 minutes.
    #[arg(long, env = "SHARDKEEP_CONSOLE_LOGIN_CLIENT_LIMIT", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) console_login_client_limit: u32,

    /// Console login attempts all clients together may make per 5 minutes.
    #[arg(long, env = "SHARDKEEP_CONSOLE_LOGIN_GLOBAL_LIMIT", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) console_login_global_limit: u32,

    /// Seconds a worker may finish no pass, with work waiting, before /readyz fails.
    #[arg(long, env = "SHARDKEEP_STALL_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u32).range(5..=86_400))]
    pub(crate) stall_seconds: u32,

    /// The URL operators use to reach this server, e.g. `https://ops.example.com`. An `https`
    /// URL marks the console cookie `Secure` (set it whenever TLS ends in front of `serve`).
    #[arg(long, env = "SHARDKEEP_PUBLIC_URL", value_parser = parse_public_url)]
    pub(crate) public_url: Option<String>,

    /// Trust `X-Forwarded-For` (the login throttle's client address) and `X-Forwarded-Proto`
    /// (`https` marks the cookie `Secure`) from the proxy in front of `serve`. Only with a proxy
    /// that sets them: otherwise any client could pick its own address.
    #[arg(long, env = "SHARDKEEP_TRUST_FORWARDED_HEADERS")]
    pub(crate) trust_forwarded_headers: bool,

    /// Base of the retry backoff, in milliseconds.
    #[arg(long, env = "PERSISTENCE_RETRY_BACKOFF_MILLIS", default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub(crate) retry_backoff_millis: u64,

    /// Attempts before a retry job or journal entry is dead-lettered.
    #[arg(long, env = "SHARDKEEP_RETRY_LIMIT", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) retry_limit: u32,

    /// Times a retry job's lease may run out (its worker crashed or hung holding it) before the
    /// job is dead-lettered.
    #[arg(long, env = "SHARDKEEP_LEASE_EXPIRY_LIMIT", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) lease_expiry_limit: u32,

    /// Dead letters (retry and journal) older than this many days are removed by the
    /// maintenance pass, requeued or not.
    #[arg(long, env = "SHARDKEEP_DEAD_LETTER_MAX_AGE_DAYS", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub(crate) dead_letter_max_age_days: u32,

    /// At most this many dead letters of each kind are kept (the newest).
    #[arg(long, env = "SHARDKEEP_DEAD_LETTER_MAX_COUNT", default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub(crate) dead_letter_max_count: u32,

    /// Seconds between reconciliation passes (transfer markers, presence, registry).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(crate) reconcile_seconds: u64,

    /// A stable journal consumer id for this process (1 to 128 of [A-Za-z0-9_.-], for example a
    /// StatefulSet pod name). A restart under the same id takes its predecessor's held journal
    /// entries back itself: at once after a clean shutdown, within the heartbeat TTL (15 s)
    /// after a crash. A second live process with the same id is refused at start-up. Unset: a
    /// fresh id per start; a crashed process's entries then come back through any serve's
    /// recovery within the heartbeat TTL plus one recovery interval (about 25 s).
    #[arg(long, env = "SHARDKEEP_CONSUMER_ID", value_parser = parse_consumer_id)]
    pub(crate) consumer_id: Option<String>,
}

/// A public URL: `http://` or `https://` followed by a host.
fn parse_public_url(raw: &str) -> Result<String, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("expected http://host or https://host".into());
    }
    Ok(raw.to_owned())
}

/// A stable consumer id, checked before anything connects.
fn parse_consumer_id(raw: &str) -> Result<String, String> {
    let valid = !raw.is_empty()
        && raw.len() <= shardkeep::queue::MAX_CONSUMER_ID
        && raw
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if valid {
        Ok(raw.to_owned())
    } else {
        Err(format!(
            "{raw:?} is not a consumer id: 1 to {} characters of [A-Za-z0-9_.-]",
            shardkeep::queue::MAX_CONSUMER_ID
        ))
    }
}

/// Where the signed API is, and the key to sign with.
#[derive(Debug, Clone, Args)]
pub(crate) struct ApiClientArgs {
    /// Base URL of `shardkeep serve`.
    #[arg(
        long,
        env = "SHARDKEEP_API_URL",
        default_value = "http://127.0.0.1:7400"
    )]
    pub(crate) api_url: String,

    /// Signing keys, as for `serve`; the client signs with --key-id, or the first key.
    #[arg(long, env = "SHARDKEEP_INTERNAL_KEYS", hide_env_values = true)]
    pub(crate) internal_keys: Option<String>,

    /// Which key to sign with.
    #[arg(long)]
    pub(crate) key_id: Option<String>,
}

/// Which dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum DeadLetterKind {
    /// Persistence retry jobs (Postgres).
    Retry,
    /// Session lifecycle journal entries (Redis).
    Journal,
}

/// Options of `shardkeep dead-letters`.
#[derive(Debug, Args)]
pub(crate) struct DeadLettersArgs {
    #[command(flatten)]
    pub(crate) api: ApiClientArgs,

    #[command(subcommand)]
    pub(crate) action: DeadLettersAction,
}

/// What to do with dead letters.
#[derive(Debug, Subcommand)]
pub(crate) enum DeadLettersAction {
    /// List the newest dead letters and the queue counts.
    List {
        /// Which queue.
        #[arg(long, value_enum)]
        kind: DeadLetterKind,
        /// How many (1 to 500).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
        limit: u32,
        /// Skip this many of the newest.
        #[arg(long, default_value_t = 0)]
        offset: u32,
        /// Only this character's (an id or a name).
        #[arg(long)]
        character: Option<String>,
    },
    /// Show one dead letter in full: its payload and what to check before a requeue.
    Show {
        /// Which queue.
        #[arg(long, value_enum)]
        kind: DeadLetterKind,
        /// The dead letter's id.
        #[arg(long)]
        id: uuid::Uuid,
    },
    /// Requeue one dead letter as fresh work.
    Requeue {
        /// Which queue.
        #[arg(long, value_enum)]
        kind: DeadLetterKind,
        /// The dead letter's id.
        #[arg(long)]
        id: uuid::Uuid,
    },
}

/// Options of `shardkeep cleanup`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("mode").required(true).args(["dry_run", "delete"])))]
pub(crate) struct CleanupArgs {
    #[command(flatten)]
    pub(crate) api: ApiClientArgs,

    /// The cleanup target (presence, handoff, registry).
    #[arg(long)]
    pub(crate) target: String,

    /// Only count matching keys.
    #[arg(long)]
    pub(crate) dry_run: bool,

    /// Delete matching keys, in bounded calls until done.
    #[arg(long)]
    pub(crate) delete: bool,

    /// Keys deleted per call (1 to 10,000).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) batch: u32,
}

/// Options of `shardkeep bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    pub(crate) postgres: PostgresArgs,

    /// Redis connection URL: one server (the peers speak to one server).
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub(crate) redis_url: Option<String>,

    /// A Redis Cluster's seed nodes (comma-separated `redis://` URLs): the queue benchmark also
    /// runs on it and prints the ratio of cluster to standalone.
    #[arg(long, env = "REDIS_CLUSTER_URL", hide_env_values = true)]
    pub(crate) redis_cluster_url: Option<String>,

    #[command(subcommand)]
    pub(crate) which: BenchCommand,
}

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Every benchmark in one run and one table of every figure against what it is compared
    /// with in the same run (raw engine operations, peers, cadences), with goals.
    All(AllBenchArgs),
    /// Batched and single CAS saves against a plain UPDATE … FROM UNNEST and raw UPDATEs;
    /// checkpoint writes against the guard script driven raw and raw SETs; with a fresh, an
    /// aged and a 4 KB document.
    Ladder(LadderBenchArgs),
    /// Online characters one shard sustains at the default cadences, with no drop and no pulse
    /// over 250 ms, and the memory it holds per character.
    Capacity(CapacityBenchArgs),
    /// A killed shard's players logging in elsewhere at once, against the raw reads of the
    /// same rows and checkpoints.
    Login(LoginBenchArgs),
    /// The durable work queue with 1 and 4 consumers against apalis-redis and raw commands.
    Queue(QueueBenchArgs),
    /// What the journal's depth report costs with many consumers.
    Depth(DepthBenchArgs),
    /// Retry jobs end to end against apalis-postgres and the raw per-job lifecycle.
    Retry(RetryBenchArgs),
    /// Retry jobs end to end with a large backlog queued, against the same on an empty table.
    Backlog(BacklogBenchArgs),
    /// A death storm through the audit trail: the batched auditor against one INSERT per event,
    /// and what each drops against a store slowed by a proxy.
    Audit(AuditBenchArgs),
    /// A `serve` process under valid and invalid signed requests at full rate beside a retry
    /// and journal workload: no crash, no valid request refused, no invalid one accepted or
    /// changing the stores, memory flat; p99 of valid requests against an idle baseline.
    /// Exits 4 when a check fails.
    HostileApi(HostileApiBenchArgs),
}

/// Options of `shardkeep bench hostile-api`.
#[derive(Debug, Args)]
pub(crate) struct HostileApiBenchArgs {
    /// Seconds the load runs.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(10..=3600))]
    pub(crate) seconds: u64,

    /// Requests in flight at once.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=512))]
    pub(crate) connections: u32,

    /// Also write the findings as JSON to this file.
    #[arg(long)]
    pub(crate) json: Option<std::path::PathBuf>,
}

/// How large a whole run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BenchSize {
    /// The sizes the goals are stated for (several minutes).
    Full,
    /// Tiny sizes: every step runs in seconds; the figures mean little.
    Smoke,
}

/// Options of `shardkeep bench all`.
#[derive(Debug, Args)]
pub(crate) struct AllBenchArgs {
    /// Also write the table and every benchmark's findings as JSON to this file.
    #[arg(long)]
    pub(crate) json: Option<std::path::PathBuf>,

    /// How large the run is.
    #[arg(long, value_enum, default_value_t = BenchSize::Full)]
    pub(crate) size: BenchSize,

    /// Exit with status 4 when a goal is not met.
    #[arg(long)]
    pub(crate) require_goals: bool,
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
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub(crate) seconds: u64,

    /// Rows per batched statement and per pipeline.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) batch: u32,

    /// Times the steps run; each figure is the median.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub(crate) rounds: u32,

    /// Sessions of the aged character the steps also run with (each a login, 100 rewards, 10
    /// item moves and a flush, through the library); 0 skips the aged document.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub(crate) aging_logins: u32,
}

/// Options of `shardkeep bench capacity`.
#[derive(Debug, Args)]
pub(crate) struct CapacityBenchArgs {
    /// Online characters with the fresh template document (0 skips it).
    #[arg(long, default_value_t = 500_000, value_parser = clap::value_parser!(u32).range(0..=2_000_000))]
    pub(crate) fresh: u32,

    /// Online characters with the realistic 4 KB document (0 skips it).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(0..=2_000_000))]
    pub(crate) realistic: u32,

    /// Online characters with the fresh document on the embedded store: one scratch SQLite file
    /// holding the rows and the checkpoints (0 skips it).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(0..=2_000_000))]
    pub(crate) embedded: u32,

    /// Seconds each run goes at real pulse speed (a flush period is 60).
    #[arg(long, default_value_t = 70, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub(crate) seconds: u64,
}

/// Options of `shardkeep bench login`.
#[derive(Debug, Args)]
pub(crate) struct LoginBenchArgs {
    /// Players logging in at once.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) players: u32,

    /// Connections of the game server's pool (the raw reads get the same).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) pool: u32,

    /// Sessions of the veteran whose document the second storm logs in (up to 100 are used);
    /// 0 runs the fresh document only.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub(crate) aging_logins: u32,
}

/// Options of `shardkeep bench queue`.
#[derive(Debug, Args)]
pub(crate) struct QueueBenchArgs {
    /// Entries per run.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(10..=10_000_000))]
    pub(crate) entries: u32,

    /// Producer tasks, each appending one entry at a time (the same for every system; with few,
    /// every system is bound by its producers' round trips).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) producers: u32,

    /// Times each system runs; each rate is the median.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub(crate) rounds: u32,
}

/// Options of `shardkeep bench depth`.
#[derive(Debug, Args)]
pub(crate) struct DepthBenchArgs {
    /// Consumers registered, each holding one entry.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(crate) consumers: u32,

    /// Depth reports timed with each number of consumers.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) reports: u32,
}

/// Options of `shardkeep bench retry`.
#[derive(Debug, Args)]
pub(crate) struct RetryBenchArgs {
    /// Jobs per run.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(100..=10_000_000))]
    pub(crate) jobs: u32,

    /// Producer lanes enqueueing one job at a time.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) producers: u32,
}

/// Options of `shardkeep bench backlog`.
#[derive(Debug, Args)]
pub(crate) struct BacklogBenchArgs {
    /// Jobs queued and left waiting (not due, or leased elsewhere).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u32).range(1..=100_000_000))]
    pub(crate) queued: u32,

    /// Jobs run end to end in each measured run.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(100..=10_000_000))]
    pub(crate) jobs: u32,

    /// Producer lanes enqueueing one job at a time.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) producers: u32,
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

    /// What stands between shardkeep and Postgres: none (or session, a pooler in session mode)
    /// or transaction (PgBouncer's pool_mode = transaction: no named statements kept, every
    /// statement inside a transaction).
    #[arg(long, env = "SHARDKEEP_PG_POOLER", default_value = "none", value_parser = parse_pooler)]
    pub(crate) pg_pooler: PgPooler,
}

fn parse_pooler(raw: &str) -> Result<PgPooler, String> {
    raw.parse()
        .map_err(|e: shardkeep::backend::postgres::UnknownPooler| e.to_string())
}

/// Where Redis is, and the namespace of every key.
#[derive(Debug, Clone, Args)]
pub(crate) struct RedisArgs {
    /// Redis connection URL, e.g. redis://127.0.0.1:6379; a comma-separated list of two or
    /// more seed nodes selects Redis Cluster.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub(crate) redis_url: Option<String>,

    /// Prefix of every Redis key (1 to 64 characters of [A-Za-z0-9_-]).
    #[arg(long, env = "SHARDKEEP_NAMESPACE", default_value = "shardkeep")]
    pub(crate) namespace: String,

    /// Run even when Redis's maxmemory-policy is not noeviction (Redis may then evict
    /// shardkeep's keys, TTL-bearing records first).
    #[arg(long, env = "SHARDKEEP_ALLOW_EVICTION")]
    pub(crate) allow_eviction: bool,
}
