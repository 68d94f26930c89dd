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
//! - [`services`] — the composition root: every handle built once, the workers spawned.
//! - [`saver`] — the background saver: checkpoints, CAS flushes, conflicts, the final rebase.
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
//! Connect, build the services with the game's model, spawn the workers, claim and load a
//! character at login, queue its dumps on the cadences, and shut down through the barrier.
//! `examples/arena` is a whole game built this way.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use shardkeep::backend::redis::RedisTimeouts;
//! use shardkeep::model::{Anchor, GameEffect, GameModel, ModelHandle};
//! use shardkeep::saver::{SaveFeedback, SaveReason, Saver, SaverConfig, SaverEvent, SaverSinks};
//! use shardkeep::{Keyspace, PostgresBackend, RedisBackend, Services, ServicesConfig};
//! use tokio_util::sync::CancellationToken;
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct Hero {
//!     gold: i64,
//! }
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! #[serde(tag = "kind", rename_all = "snake_case")]
//! enum Grant {
//!     HeroGold { amount: i64 },
//! }
//!
//! impl GameEffect for Grant {
//!     fn kind(&self) -> &'static str {
//!         "hero_gold"
//!     }
//!     fn sets_value(&self) -> bool {
//!         false // a grant adds; each applies once per idempotency key
//!     }
//! }
//!
//! struct MyGame;
//!
//! impl GameModel for MyGame {
//!     type State = Hero;
//!     type Effect = Grant;
//!     fn apply_effect(&self, hero: &mut Hero, _: &mut Anchor, grant: &Grant) -> Result<bool, String> {
//!         let Grant::HeroGold { amount } = grant;
//!         hero.gold += amount;
//!         Ok(true)
//!     }
//! }
//!
//! /// The zone's side of the saver: conflicts and ownership losses come back here.
//! struct Zone;
//!
//! impl SaveFeedback for Zone {
//!     fn deliver(&self, _event: SaverEvent) {}
//!     fn is_present(&self, _character: uuid::Uuid) -> bool {
//!         true
//!     }
//! }
//!
//! # async fn embed(character: uuid::Uuid) -> Result<(), Box<dyn std::error::Error>> {
//! let timeout = Duration::from_secs(5);
//! let pg = PostgresBackend::connect("DATABASE_URL", "postgres://localhost/game", 16, timeout).await?;
//! let keys = Keyspace::new("game")?;
//! let redis = RedisBackend::connect("REDIS_URL", "redis://localhost", keys, RedisTimeouts::default())
//!     .await?;
//! let config = ServicesConfig::new("shard-1", "game_server");
//! let mut services = Services::build(pg, redis, ModelHandle::new(MyGame), config)?;
//! let cancel = CancellationToken::new();
//! let workers = services.spawn_workers(cancel.clone()).await?;
//! let sinks = SaverSinks {
//!     rows: Some(services.characters.clone()),
//!     checkpoints: Some(services.checkpoints.clone()),
//!     retry: Some(services.retry.clone()),
//! };
//! let saver = Saver::spawn(sinks, Arc::new(Zone), SaverConfig::default(), cancel.clone());
//!
//! // Login: the claim mints this copy's epoch; the loader picks the freshest copy.
//! let loaded = services.loader.claim_and_load(character, 0).await?;
//! // Play, and at each cadence queue the copy's dump (never blocks the zone).
//! saver.enqueue(SaveReason::Checkpoint, loaded.snapshot.clone());
//! // Logout, then shutdown: the barrier waits for every queued save.
//! saver.enqueue(SaveReason::Final, loaded.snapshot);
//! saver.barrier(Duration::from_secs(10)).await;
//! workers.shutdown(Duration::from_secs(10)).await;
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
pub use ttl::{Ttl, TtlError};
