//! The reference game built on shardkeep: the worked example of embedding the core.
//!
//! It implements the core's traits through the public API only, as any game would.
//!
//! # Layout
//!
//! - [`game`] — the character model: items, the state document, the applier and the dump, the
//!   retry effects and the [`game::ReferenceModel`] the core's workers and loader run.
//! - [`shard`] — the shard runtime: zones, players, cadences, sessions, landing, item transfers.
//! - [`live_shard`] — the shard on the core's live-copy runtime, which owns every durability
//!   rule: the shard keeps only zones, rooms, floors and where each player stands.

pub mod game;
pub mod live_shard;
pub mod shard;
