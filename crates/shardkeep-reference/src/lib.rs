//! The reference game built on shardkeep: the worked example of embedding the core.
//!
//! It implements the core's traits through the public API only, as any game would.
//!
//! # Layout
//!
//! - [`game`] — the character model: items, the state document, the applier and the dump, the
//!   retry effects and the [`game::ReferenceModel`] the core's workers and loader run.
//! - [`live_shard`] — the shard on the core's live-copy runtime, which owns every durability
//!   rule: the shard keeps only zones, rooms, floors and where each player stands.
//! - [`shard`] — what a shard needs besides its players: the reference game as the runtime
//!   plays it, the zone directory, the login gate and the landing table.

pub mod game;
pub mod live_shard;
pub mod shard;
