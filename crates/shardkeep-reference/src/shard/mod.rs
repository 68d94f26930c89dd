//! What a reference shard needs besides its players: the reference game as the live-copy
//! runtime plays it, which shard hosts each zone, where a login goes and where it lands. The
//! shard itself is [`crate::live_shard::LiveShard`].
//!
//! - [`live_game`] — [`ReferenceGame`], the [`shardkeep::live::LiveGame`] of the reference game.
//! - [`directory`] — which shard owns each zone now.
//! - [`gate`] — which shard a login goes to, and its claim's epoch floor.
//! - [`landing`] — which zone a returning player lands in (pure).

pub mod directory;
pub mod gate;
pub mod landing;
pub mod live_game;

pub use directory::ZoneDirectory;
pub use landing::LandingCase;
pub use live_game::{EvictedCopy, Observer, ReferenceGame};
