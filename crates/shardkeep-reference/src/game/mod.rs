//! The reference game-state model: a small, concrete character model for tests, the simulator
//! and as an example for games, which embed their own through [`CharacterModel`].
//!
//! - [`items`] — flyweight items, prototypes, carry-tree bounds.
//! - [`state`] — the stored state document and the live character.
//! - [`apply`] — the applier (in the documented order) and the dump; `dump` — a live
//!   character encoded straight to its document.
//! - [`effects`] — the retry effects the game issues, and its [`shardkeep::model::GameModel`].
//! - [`world`] — zones, rooms, exits, resets and the room resolver.

pub mod apply;
mod dump;
pub mod effects;
pub mod items;
pub mod state;
pub mod world;

pub use apply::{
    Applied, ApplyOptions, DumpError, apply_snapshot, dump_character, dump_character_after,
    dump_state_after,
};
pub use effects::{ReferenceEffect, ReferenceModel};
pub use items::{CarryLimits, CarryTreeError, Catalog, Item, ItemJson, Prototype, Slot};
pub use state::{LiveCharacter, StateDocument};
pub use world::{ZoneDef, reference_world};

use shardkeep::character::CharacterSnapshot;

/// What a game provides so shardkeep can persist its characters: a dump to the snapshot's state
/// document and an apply back. The reference model implements it for [`LiveCharacter`].
pub trait CharacterModel: Sized {
    /// Content the apply needs (prototypes and the like).
    type Content;

    /// Builds the live character from a snapshot; never fails, skipping what it cannot read.
    fn apply(
        snapshot: &CharacterSnapshot,
        content: &Self::Content,
        fresh_login: bool,
    ) -> (Self, Vec<String>);

    /// Dumps the live character; `zone_ref` is `None` inside an instance.
    fn dump(
        &self,
        zone_ref: Option<&str>,
        room_ref: Option<&str>,
    ) -> Result<CharacterSnapshot, DumpError>;
}

impl CharacterModel for LiveCharacter {
    type Content = Catalog;

    fn apply(
        snapshot: &CharacterSnapshot,
        content: &Catalog,
        fresh_login: bool,
    ) -> (Self, Vec<String>) {
        let applied = apply_snapshot(
            snapshot,
            content,
            ApplyOptions {
                fresh_login,
                limits: CarryLimits::default(),
            },
        );
        (applied.character, applied.warnings)
    }

    fn dump(
        &self,
        zone_ref: Option<&str>,
        room_ref: Option<&str>,
    ) -> Result<CharacterSnapshot, DumpError> {
        dump_character(self, zone_ref, room_ref, CarryLimits::default())
    }
}
