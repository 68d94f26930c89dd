//! shardkeep: the durability layer for authoritative game servers.
//!
//! Player state lives in shard memory; shardkeep writes it down a ladder (Redis checkpoint, then a
//! fenced Postgres compare-and-swap), turns writes that cannot finish synchronously into durable
//! retry jobs, and runs cleanup after a realtime stream closes through a durable Redis journal.
//! A game embeds it with its own character model ([`model::GameModel`]); shardkeep never reads
//! the game's state itself, and keeps its bookkeeping beside it.
//!
//! # Layout
//!
//! The game's side:
//! - [`model`] — the trait a game implements: its state, its effects, its schema versions.
//! - [`live`] — the live-copy runtime a game plays its characters through.
//! - [`services`] — the composition root: every handle built once, the workers spawned.
//! - [`saver`] — the background saver the runtime writes through: checkpoints, CAS flushes,
//!   conflicts, logout saves through outages.
//!
//! Durable state (Postgres):
//! - [`character`] — the ladder's tiers: the character store (claim, CAS save, transfers),
//!   Redis checkpoints, the login-time loader, the bookkeeping beside the rows.
//! - [`retry`] — durable persistence retry jobs: envelope, enqueue, worker, dead letters.
//! - [`audit`] — the append-only audit trail: auditor, account operations, read views.
//!
//! Coordination (Redis):
//! - [`keyspace`] — every Redis key name, its owner, TTL rule and cleanup descriptor (pure).
//! - [`coord`] — handoffs, transfer markers, presence, registry, throttles, nonces, resume
//!   ledger, maintenance and admin cleanup.
//! - [`queue`] — the generic durable work queue, with per-consumer recovery.
//! - [`journal`] — the session lifecycle journal on that queue: cleanup after a stream closes.
//! - [`placement`] — fenced placement records and their background writer.
//!
//! Foundations:
//! - [`backend`] — the Postgres pool and Redis connection, and the embedded migrations.
//! - [`drain`] — bounded batch-drained queues with a shutdown barrier.
//! - [`clock`] — injectable time; [`ttl`] — the validated TTL type.
//! - [`telemetry`] — names of every metric; [`operator`] — operator-facing facts.
//!
//! # Embedding
//!
//! A game implements its model ([`model::GameModel`]: its state, its effects, how an effect
//! applies) and launches a [`live::Runtime`] ([`live::Runtime::launch`]: the stores connected,
//! the [`Services`] built, their workers spawned); then it logs players in, plays them and logs
//! them out. The runtime keeps every rule that makes the
//! guarantees true — the copy's epoch, versions and issue numbers, the cadences, the saver's
//! answers, the logout save, the order of a session's start and close, handoffs — so the game
//! writes no timer, no saver feedback and no journal entry. `examples/arena` is a whole game
//! built this way.
//!
//! A game needs `shardkeep`, `serde` (with `derive`) and `tokio` (a multi-threaded runtime);
//! the ids and the cancellation token it may name are re-exported here ([`Uuid`],
//! [`CancellationToken`]). A `sqlite:` URL and no Redis runs the same game on one file.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use shardkeep::Uuid;
//! use shardkeep::live::{Launch, Runtime, SessionStart, Stored};
//! use shardkeep::model::{Anchor, GameEffect, GameModel};
//!
//! #[derive(Default, serde::Serialize, serde::Deserialize)]
//! struct Farm {
//!     coins: i64,
//!     crops: u32,
//! }
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! #[serde(tag = "kind", rename_all = "snake_case")]
//! enum FarmEffect {
//!     Harvest { coins: i64 },
//! }
//!
//! impl GameEffect for FarmEffect {
//!     fn kind(&self) -> &'static str {
//!         "harvest"
//!     }
//!     fn sets_value(&self) -> bool {
//!         false // a harvest adds; each applies once
//!     }
//! }
//!
//! #[derive(Clone)]
//! struct FarmGame;
//!
//! impl GameModel for FarmGame {
//!     type State = Farm;
//!     type Effect = FarmEffect;
//!     fn apply_effect(&self, farm: &mut Farm, _: &mut Anchor, effect: &FarmEffect) -> Result<bool, String> {
//!         let FarmEffect::Harvest { coins } = effect;
//!         farm.coins += coins;
//!         Ok(true)
//!     }
//! }
//!
//! # async fn embed() -> Result<(), Box<dyn std::error::Error>> {
//! // Connect, migrate, build the services, spawn their workers, start the runtime.
//! let mut launch = Launch::new("postgres://localhost/game", Some("redis://localhost"), "shard-1");
//! launch.migrate = true;
//! let shard = Runtime::launch(launch, Stored::new(FarmGame, Farm::default)).await?;
//! let runtime = &shard.runtime;
//!
//! // Login claims the character (minting this copy's epoch) and loads the freshest copy.
//! let id = runtime.find_or_create("Aria", Uuid::now_v7(), Anchor::at("valley", "barn")).await?;
//! let aria = runtime.login(id, SessionStart::default()).await?.copy;
//! // Play changes memory; the runtime's cadences checkpoint and flush it.
//! runtime.update(aria, |farm| farm.crops += 1)?;
//! // A grant is applied, numbered and durable before it returns.
//! runtime.grant(aria, FarmEffect::Harvest { coins: 40 }).await?;
//! // Logout: the final save is never dropped, the closed stream is journaled.
//! runtime.logout(aria).await?;
//! // Stop: everyone saved, then the workers, then the pools.
//! shard.shutdown(Duration::from_secs(10)).await;
//! # Ok(())
//! # }
//! ```

pub mod audit;
pub mod backend;
mod batching;
pub mod character;
pub mod clock;
pub mod coord;
pub mod drain;
pub mod journal;
pub mod keyspace;
pub mod live;
pub mod liveness;
pub mod model;
pub mod operator;
pub mod placement;
pub mod queue;
pub mod retry;
pub mod saver;
pub mod services;
pub mod telemetry;
pub mod ttl;

pub use backend::{ConnectError, PostgresBackend, RedisBackend, SqliteBackend};
pub use coord::{CoordError, Coordination, CoordinationConfig};
pub use keyspace::{HandoffScope, KeyError, Keyspace};
pub use services::{Services, ServicesConfig, ServicesError, Stores, Workers};
pub use tokio_util::sync::CancellationToken;
pub use ttl::{Ttl, TtlError};
pub use uuid::Uuid;
