//! shardkeep's simulator and benchmarks, built on the public APIs of the core and the reference
//! game.
//!
//! # Layout
//!
//! - [`bench`](mod@bench) — benchmarks against raw engine rates and peers, run by `shardkeep bench`.
//!
//! # The simulator
//!
//! Whole shards of synthetic players, driven through the real library against
//! Postgres and Redis, with faults injected through proxies of its own, and an invariant report
//! checked against the durable stores at the end.
//!
//! - `env` — the scratch database and namespace, the fault proxies, the proxied stores.
//! - `world` — what every task shares: stores, routing to shard hosts, counters, the ledger.
//! - `agent` — a synthetic player: its choices come from a seeded generator.
//! - `host` — one shard's task: a `LiveShard` (the reference game on the live-copy runtime,
//!   which owns every durability rule), the pulse loop, messages; `play` — the players'
//!   actions; `host_faults` — zombies and kills; `host_settle` — the end of a run.
//! - `travel` — logins routed through the gate to a shard's runtime, handoff tickets carried
//!   to the destination's runtime, and what the checks must know of each claim.
//! - `observer` — what the runtimes report: landed row writes, journaled closes, handoffs.
//! - `faults` — the fault plan (pure) and its injection.
//! - `checks` — the durable-state scanner and the end-of-run invariants.
//! - [`series`] — the time series of a run and its stability verdict.
//! - `summary` — gathering the report's numbers; [`report`] — the report and its table.
//!
//! Time is compressed: a pulse is 100 ms and checkpoints and flushes come every 2 s and 6 s, so
//! a one-minute run goes through many save cycles.

mod agent;
pub mod bench;
mod checks;
mod claims;
mod crash_floors;
mod env;
mod faults;
mod host;
mod host_faults;
mod host_settle;
mod inbound;
mod observer;
mod order_checks;
mod play;
pub mod plot;
mod probe;
pub mod report;
mod rewards;
mod run;
pub mod series;
mod serves;
mod summary;
mod travel;
mod vacuum;
mod workers;
mod world;

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

pub use report::{Invariant, SimReport};
pub use run::{run, run_embedded};

/// A fault the simulator can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// A shard dies without flushing; its players rehydrate from checkpoint or row.
    KillShard,
    /// A shard dies, and its replacement dies too once its players are back but before any of
    /// its cadences wrote: the same players crash twice in a row.
    DoubleCrash,
    /// A shard keeps playing a character after it was claimed elsewhere.
    Zombie,
    /// The Redis connection is cut for a stretch.
    RedisOutage,
    /// The Postgres connection is cut for a stretch.
    PostgresOutage,
    /// The retry worker stops draining, so its signal channel saturates.
    QueueFull,
    /// Undecodable retry rows and journal entries are planted.
    Poison,
    /// A second journal worker leases a batch of entries and dies holding them, while the first
    /// goes on with later ones: recovery returns older entries after newer ones were applied.
    WorkerCrash,
    /// A Redis Cluster master fails over to its replica (`CLUSTER FAILOVER FORCE` on the
    /// replica: writes it had not received yet are lost). Needs `REDIS_URL` to name a cluster;
    /// not part of `all`, which runs on either topology.
    RedisFailover,
    /// One of the run's `serve` processes is SIGKILLed (its leases and processing entries left
    /// behind) and started again a second or two later. Needs `--serves`; not part of `all`.
    KillServe,
}

impl Fault {
    /// Every fault, in display order.
    pub const ALL: [Fault; 8] = [
        Fault::KillShard,
        Fault::DoubleCrash,
        Fault::Zombie,
        Fault::RedisOutage,
        Fault::PostgresOutage,
        Fault::QueueFull,
        Fault::Poison,
        Fault::WorkerCrash,
    ];

    /// Every fault a `--faults` list may name (`all`, the cluster-only one, and the one that
    /// needs `serve` processes).
    pub const KNOWN: [Fault; 10] = [
        Fault::KillShard,
        Fault::DoubleCrash,
        Fault::Zombie,
        Fault::RedisOutage,
        Fault::PostgresOutage,
        Fault::QueueFull,
        Fault::Poison,
        Fault::WorkerCrash,
        Fault::RedisFailover,
        Fault::KillServe,
    ];

    /// The flag spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::KillShard => "kill-shard",
            Fault::DoubleCrash => "double-crash",
            Fault::Zombie => "zombie",
            Fault::RedisOutage => "redis-outage",
            Fault::PostgresOutage => "postgres-outage",
            Fault::QueueFull => "queue-full",
            Fault::Poison => "poison",
            Fault::WorkerCrash => "worker-crash",
            Fault::RedisFailover => "redis-failover",
            Fault::KillServe => "kill-serve",
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `--faults` value that names no fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown fault {0:?}; expected all, none, or a comma list of: all, kill-shard, double-crash, zombie, redis-outage, postgres-outage, queue-full, poison, worker-crash, redis-failover (cluster only), kill-serve (with --serves)"
)]
pub struct UnknownFault(pub String);

/// The faults a run injects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FaultSet(BTreeSet<Fault>);

impl FaultSet {
    /// Every fault.
    pub fn all() -> Self {
        Self(Fault::ALL.into_iter().collect())
    }

    /// True when `fault` is on.
    pub fn contains(&self, fault: Fault) -> bool {
        self.0.contains(&fault)
    }

    /// The faults that are on.
    pub fn iter(&self) -> impl Iterator<Item = Fault> + '_ {
        self.0.iter().copied()
    }

    /// True when no fault is on.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromStr for FaultSet {
    type Err = UnknownFault;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "all" => return Ok(Self::all()),
            "none" | "" => return Ok(Self::default()),
            _ => {}
        }
        let mut set = BTreeSet::new();
        for part in s.split(',') {
            let part = part.trim();
            if part == "all" {
                set.extend(Fault::ALL);
                continue;
            }
            let fault = Fault::KNOWN
                .into_iter()
                .find(|f| f.as_str() == part)
                .ok_or_else(|| UnknownFault(part.to_owned()))?;
            set.insert(fault);
        }
        Ok(Self(set))
    }
}

impl fmt::Display for FaultSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let names: Vec<&str> = self.0.iter().map(|f| f.as_str()).collect();
        f.write_str(&names.join(","))
    }
}

/// What a run does.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// How long players play (settling and checks come after).
    pub duration: Duration,
    /// Shards in the process.
    pub shards: usize,
    /// Synthetic players.
    pub players: usize,
    /// Seed of every choice the run makes.
    pub seed: u64,
    /// Faults to inject.
    pub faults: FaultSet,
    /// Zones each shard hosts.
    pub zones_per_shard: usize,
    /// Pulse length.
    pub pulse: Duration,
    /// Pulses between checkpoints.
    pub checkpoint_pulses: u64,
    /// Pulses between flushes.
    pub flush_pulses: u64,
    /// Keep the scratch database and keys after the run.
    pub keep: bool,
    /// What stands between the run and Postgres.
    pub pg_pooler: shardkeep::backend::postgres::PgPooler,
    /// `serve` processes running the workers beside the run (0: the workers run inside it).
    pub serves: usize,
    /// The `shardkeep` binary those processes run (needed when `serves` is not 0).
    pub serve_binary: Option<std::path::PathBuf>,
    /// Run on a scratch SQLite file (embedded mode: no Postgres, no Redis); the store-outage
    /// faults become the file's outage hook.
    pub embedded: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(60),
            shards: 3,
            players: 1000,
            seed: 1,
            faults: FaultSet::all(),
            zones_per_shard: 3,
            pulse: Duration::from_millis(100),
            checkpoint_pulses: 20,
            flush_pulses: 60,
            keep: false,
            pg_pooler: shardkeep::backend::postgres::PgPooler::None,
            serves: 0,
            serve_binary: None,
            embedded: false,
        }
    }
}

/// Largest run sizes accepted.
pub const MAX_SHARDS: usize = 16;
/// Most players a run accepts.
pub const MAX_PLAYERS: usize = 100_000;
/// Most `serve` processes a run starts.
pub const MAX_SERVES: usize = 8;

impl SimConfig {
    /// Checks the sizes; the message names the bad one.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |m: String| Err(SimError::Invalid(m));
        if self.shards == 0 || self.shards > MAX_SHARDS {
            return bad(format!(
                "shards must be 1 to {MAX_SHARDS}, got {}",
                self.shards
            ));
        }
        if self.players == 0 || self.players > MAX_PLAYERS {
            return bad(format!(
                "players must be 1 to {MAX_PLAYERS}, got {}",
                self.players
            ));
        }
        if self.duration < Duration::from_secs(1) || self.duration > Duration::from_secs(24 * 3600)
        {
            return bad("duration must be 1 s to 24 h".into());
        }
        if self.zones_per_shard == 0 || self.zones_per_shard > 16 {
            return bad("zones per shard must be 1 to 16".into());
        }
        if self.pulse.is_zero() || self.checkpoint_pulses == 0 || self.flush_pulses == 0 {
            return bad("pulse and cadences must be positive".into());
        }
        let pulses = |n: u64| {
            self.pulse
                .saturating_mul(u32::try_from(n).unwrap_or(u32::MAX))
        };
        let cadence = shardkeep::live::Cadence {
            pulse: self.pulse,
            checkpoint_every: pulses(self.checkpoint_pulses),
            flush_every: pulses(self.flush_pulses),
        };
        if let Err(err) = cadence.validate(shardkeep::keyspace::CHECKPOINT_TTL.duration()) {
            return bad(format!("the shards' cadence: {err}"));
        }
        if self.serves > MAX_SERVES {
            return bad(format!(
                "serves must be 0 to {MAX_SERVES}, got {}",
                self.serves
            ));
        }
        if self.serves > 0 && self.serve_binary.is_none() {
            return bad("serves need the shardkeep binary to run".into());
        }
        if self.faults.contains(Fault::KillServe) && self.serves == 0 {
            return bad("the kill-serve fault needs serve processes (--serves 1 or more)".into());
        }
        if self.embedded {
            if self.serves > 0 {
                return bad("serve processes need Postgres and Redis, not embedded mode".into());
            }
            if self.faults.contains(Fault::RedisFailover) {
                return bad(
                    "the redis-failover fault needs a Redis Cluster, not embedded mode".into(),
                );
            }
            if self.pg_pooler != shardkeep::backend::postgres::PgPooler::None {
                return bad("a Postgres pooler has no meaning in embedded mode".into());
            }
        }
        Ok(())
    }
}

/// What the simulator is doing now, for a live display.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimProgress {
    /// Phase: `setup`, `play`, `settle`, `check`.
    pub phase: &'static str,
    /// Time spent playing.
    pub elapsed: Duration,
    /// The play time planned.
    pub duration: Duration,
    /// Players attached or link-dead on a shard.
    pub online: usize,
    /// Saves landed (checkpoints and rows) per second, over the last second.
    pub saves_per_sec: u64,
    /// Retry jobs waiting (not dead-lettered).
    pub retry_depth: u64,
    /// Journal entries pending or in processing.
    pub journal_depth: u64,
    /// Faults injected so far.
    pub faults_injected: u64,
}

/// Why a run could not happen (invariant failures are in the report, not here).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A bad size or flag.
    #[error("invalid simulation: {0}")]
    Invalid(String),
    /// The stores could not be prepared.
    #[error("simulation setup failed: {0}")]
    Setup(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_lists_parse_and_bad_names_are_refused() {
        assert_eq!("all".parse::<FaultSet>().unwrap(), FaultSet::all());
        assert!("none".parse::<FaultSet>().unwrap().is_empty());
        let some: FaultSet = "zombie, poison".parse().unwrap();
        assert!(some.contains(Fault::Zombie) && some.contains(Fault::Poison));
        assert!(!some.contains(Fault::KillShard));
        assert_eq!(some.to_string(), "zombie,poison");
        assert_eq!(
            "zombie,meteor".parse::<FaultSet>(),
            Err(UnknownFault("meteor".into()))
        );
        assert!("zombie,,poison".parse::<FaultSet>().is_err());
    }

    #[test]
    fn sizes_are_validated() {
        assert!(SimConfig::default().validate().is_ok());
        for bad in [
            SimConfig {
                shards: 0,
                ..SimConfig::default()
            },
            SimConfig {
                players: 0,
                ..SimConfig::default()
            },
            SimConfig {
                duration: Duration::ZERO,
                ..SimConfig::default()
            },
            SimConfig {
                shards: MAX_SHARDS + 1,
                ..SimConfig::default()
            },
        ] {
            assert!(matches!(bad.validate(), Err(SimError::Invalid(_))));
        }
    }
}
