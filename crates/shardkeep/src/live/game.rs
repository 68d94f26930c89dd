//! What a game supplies to play its characters through the runtime: how a loaded document
//! becomes the character it plays, how that character is written back, and how one of its
//! effects changes it live.

use crate::character::StateJson;
use crate::model::{Anchor, GameEffect, GameModel, ModelHandle};

/// A game's characters as the runtime plays them.
///
/// Most games play the stored document itself: wrap the model in [`Stored`]. A game whose live
/// form differs (derived stats, resolved item prototypes) implements this trait, converting in
/// [`LiveGame::load`] and [`LiveGame::dump`].
pub trait LiveGame: Send + Sync + 'static {
    /// A character as the game holds it in memory.
    type Character: Send + 'static;
    /// The effects the game grants (the model's effect type).
    type Effect: GameEffect;

    /// The model the workers and the loader use (its effects must be [`LiveGame::Effect`]).
    fn model(&self) -> ModelHandle;

    /// The character a loaded state document (already at the model's schema version) plays as.
    /// A document that cannot be played refuses the login, with the reason.
    fn load(&self, state: &StateJson) -> Result<Self::Character, String>;

    /// The state document of a live character.
    fn dump(&self, character: &Self::Character) -> Result<StateJson, String>;

    /// Applies `effect` to a live character, exactly as the model applies it to a stored
    /// document (the worker applies the same effect to the row when it lands as a job);
    /// `Ok(true)` when anything changed.
    fn apply(
        &self,
        character: &mut Self::Character,
        anchor: &mut Anchor,
        effect: &Self::Effect,
    ) -> Result<bool, String>;

    /// A new character's state, for [`crate::live::Runtime::create`].
    fn fresh(&self) -> Self::Character;

    /// A copy was evicted (another copy owns the character): its character leaves the world
    /// without a save. A game whose items have identity records what it held as destroyed here
    /// (the live owner's copies of them live on there). Runs on the runtime's pulse: it must
    /// not block or call the runtime.
    fn evicted(&self, copy: super::CopyId, character: Self::Character) {
        let _ = (copy, character);
    }
}

/// A game that plays its stored document: the runtime holds `M::State` and applies effects with
/// the model's own [`GameModel::apply_effect`], so a live grant and its job can never differ.
pub struct Stored<M: GameModel> {
    model: M,
    handle: ModelHandle,
    fresh: fn() -> M::State,
}

impl<M: GameModel + Clone> Stored<M> {
    /// Plays `model`'s documents; `fresh` makes a new character's state.
    pub fn new(model: M, fresh: fn() -> M::State) -> Self {
        Self {
            handle: ModelHandle::new(model.clone()),
            model,
            fresh,
        }
    }
}

impl<M: GameModel> std::fmt::Debug for Stored<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Stored").field(&self.handle).finish()
    }
}

impl<M> LiveGame for Stored<M>
where
    M: GameModel + Clone,
    M::State: Send + 'static,
{
    type Character = M::State;
    type Effect = M::Effect;

    fn model(&self) -> ModelHandle {
        self.handle.clone()
    }

    fn load(&self, state: &StateJson) -> Result<M::State, String> {
        serde_json::from_str(state.as_str()).map_err(|e| format!("not a state document: {e}"))
    }

    fn dump(&self, character: &M::State) -> Result<StateJson, String> {
        StateJson::encode(character).map_err(|e| e.to_string())
    }

    fn apply(
        &self,
        character: &mut M::State,
        anchor: &mut Anchor,
        effect: &M::Effect,
    ) -> Result<bool, String> {
        self.model.apply_effect(character, anchor, effect)
    }

    fn fresh(&self) -> M::State {
        (self.fresh)()
    }
}
