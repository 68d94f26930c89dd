//! The character durability ladder's storage tiers.
//!
//! - [`snapshot`] — the one snapshot type, save outcomes and the freshness rule (pure);
//!   [`state_json`] — its state document, encoded once and shared by every write.
//! - [`store`] — Postgres: create, claim (epoch mint), load, CAS save single and batched;
//!   `item_moves` — the transfer commit and the item-load ledger; `item_loads` — ledger
//!   records arriving together written in one statement.
//! - `claim_batch` — claims arriving together made in one statement.
//! - [`checkpoint`] — id-keyed snapshots behind an ownership guard: in Redis (a Lua guard) or
//!   in the embedded store's file (`checkpoint_sqlite`).
//! - [`handoff`] — what a cross-shard handoff carries, and the epoch it was dumped under.
//! - [`load`] — login-time load: claim, read both tiers, pick the freshest; fails closed.
//! - [`bookkeeping`] — pruning the job effects and item-load ledger kept beside the rows.

pub mod bookkeeping;
mod bookkeeping_sqlite;
pub mod checkpoint;
mod checkpoint_sqlite;
mod checkpoint_take;
mod claim_batch;
mod effects_since;
pub mod handoff;
mod item_loads;
mod item_moves;
pub mod load;
pub mod snapshot;
pub mod state_json;
pub mod store;
mod store_sqlite;
mod transfer_tx;

pub use bookkeeping::{
    Bookkeeping, BookkeepingRetention, BookkeepingSizes, PruneReport, run_bookkeeping_prune,
};
pub use checkpoint::{
    CheckpointError, CheckpointStore, CheckpointWrite, GuardDecision, HeldCheckpoint, StoredGuard,
    decide_guard,
};
pub use handoff::{HandoffPayload, HandoffPayloadError};
pub use load::{
    CharacterLoader, ContentOrigin, HandoffLoad, LoadError, LoadSource, LoadedCharacter,
};
pub use snapshot::{CharacterSnapshot, Freshest, IssueMark, SaveOutcome, freshest};
pub use state_json::StateJson;
pub use store::{
    CharacterStore, ClaimedRow, HandoffClaim, LocationOrder, LocationWrite, NewCharacter, Releaser,
    StoreError, TransferCommit,
};
