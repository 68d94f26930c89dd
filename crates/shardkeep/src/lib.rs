//! shardkeep: the durability layer for authoritative game servers.
//!
//! Player state lives in shard memory; shardkeep writes it down a ladder (Redis checkpoint, then a
//! fenced Postgres compare-and-swap), turns writes that cannot finish synchronously into durable
//! retry jobs, and runs cleanup after a realtime stream closes through a durable Redis journal.
//!
//! # Layout
//!
//! - [`drain`] — bounded batch-drained queues with a shutdown barrier (saver, placement writer).
//! - [`journal`] — the session lifecycle journal: cleanup after a stream closes, on the queue.
//! - [`keyspace`] — every Redis key name, its owner, TTL rule and cleanup descriptor (pure).
//! - [`placement`] — fenced placement records and their background writer.
//! - [`queue`] — the generic durable work queue on Redis, with per-consumer recovery.
//! - [`retry`] — durable persistence retry jobs on Postgres: enqueue, worker, dead letters.
//! - [`saver`] — the background saver: checkpoints, CAS flushes, conflicts, the final rebase.
//! - [`telemetry`] — names of every metric shardkeep records.
//! - [`ttl`] — the validated, strictly positive TTL type (pure).
//! - [`audit`] — the append-only audit trail: auditor, account operations, read views.
//! - [`backend`] — the Postgres pool and Redis connection, and the embedded migrations.
//! - [`character`] — the durability ladder's tiers: Postgres store, Redis checkpoints, load.
//! - [`clock`] — injectable time.
//! - [`coord`] — coordination primitives on Redis: handoffs, transfer markers, presence,
//!   registry, throttles, nonces, resume ledger, admin cleanup.

pub mod audit;
pub mod backend;
pub mod character;
pub mod clock;
pub mod coord;
pub mod drain;
pub mod journal;
pub mod keyspace;
pub mod model;
pub mod operator;
pub mod placement;
pub mod queue;
pub mod retry;
pub mod saver;
pub mod services;
pub mod telemetry;
pub mod ttl;

pub use backend::{ConnectError, PostgresBackend, RedisBackend};
pub use coord::{CoordError, Coordination, CoordinationConfig};
pub use keyspace::{HandoffScope, KeyError, Keyspace};
pub use services::{Services, ServicesConfig, ServicesError, Workers};
pub use ttl::{Ttl, TtlError};
