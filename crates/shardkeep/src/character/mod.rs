//! The character durability ladder's storage tiers.
//!
//! - [`snapshot`] — the one snapshot type, save outcomes and the freshness rule (pure).
//! - [`store`] — Postgres: create, claim (epoch mint), load, CAS save single and batched.
//! - [`checkpoint`] — Redis: name-keyed snapshots behind a Lua ownership guard.
//! - [`load`] — login-time load: claim, read both tiers, pick the freshest; fails closed.

pub mod checkpoint;
pub mod load;
pub mod snapshot;
pub mod store;

pub use checkpoint::{CheckpointError, CheckpointStore, CheckpointWrite};
pub use load::{CharacterLoader, LoadError, LoadSource, LoadedCharacter};
pub use snapshot::{CharacterSnapshot, Freshest, SaveOutcome, freshest};
pub use store::{
    CharacterStore, ClaimedRow, LocationWrite, NewCharacter, Releaser, StoreError, TransferCommit,
};
