//! What a game supplies to play its characters through the runtime: how a loaded document
//! becomes the character it plays, how that character is written back, and how one of its
//! effects changes it live.

use uuid::Uuid;

use crate::character::{CharacterSnapshot, StateJson};
use crate::coord::SessionOrder;
use crate::journal::SessionLifecycleEffectPlan;
use crate::model::{Anchor, GameEffect, GameModel, ModelHandle};
use crate::saver::SaveReason;

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

    /// The live copy a claimed and loaded character becomes: its character, where it lands and
    /// the character-creation input it still carries. The default plays the document
    /// ([`LiveGame::load`]) where it was saved and keeps the input as it is. A game that lands
    /// players by a table of its own (a zone this shard does not host, a first spawn), or
    /// applies its creation input, overrides this; `snapshot` names the copy (its id, name,
    /// account, epoch and row version) and `arrival` how it came. What it answers is what the
    /// copy's saves write. A refusal refuses the login.
    ///
    /// Apply creation input only on a first spawn (`Arrival::Login { brand_new: true }`), and
    /// answer `chargen: None` then: the copy's row saves and checkpoints clear the stored input,
    /// but a logout save that goes down as a retry job writes the document and the anchor
    /// only, so the input can outlive its first spawn (the anchor it saved makes the next login
    /// not brand new).
    fn land(
        &self,
        snapshot: &CharacterSnapshot,
        arrival: Arrival,
    ) -> Result<Landed<Self::Character>, String> {
        let _ = arrival;
        Ok(Landed {
            character: self.load(&snapshot.state)?,
            anchor: Anchor {
                zone_ref: snapshot.zone_ref.clone(),
                room_ref: snapshot.room_ref.clone(),
            },
            chargen: snapshot.chargen.clone(),
        })
    }

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

    /// A write of `copy`'s row landed and the row is at `version`: a cadence flush or a logout's
    /// final save (`reason`), or a write outside the cadences (a grant's, `save_now`'s, an item
    /// transfer's commit), reported as a [`SaveReason::Flush`]. Called once for each write whose
    /// answer the runtime heard, and never for one that did not land: a write whose answer was
    /// lost (a timeout, a transfer commit found already made on its retry), a final save made a
    /// retry job, and an answer still on its way when the runtime stops are not reported.
    /// Checkpoints are not reported (one per copy every few seconds). Runs on the runtime's
    /// pulse or the writing call's task: it must not block or call the runtime.
    fn saved(&self, copy: super::CopyId, reason: SaveReason, version: i64) {
        let _ = (copy, reason, version);
    }

    /// A handoff of `copy` that left this shard under `token` is settled here: the destination
    /// took it (`activated`) or it was abandoned, the transfer is completed and the copy's
    /// stream closed. Called once per handoff, from the task that waited for it; it must not
    /// block or call the runtime.
    fn handed_off(&self, copy: super::CopyId, token: &str, activated: bool) {
        let _ = (copy, token, activated);
    }

    /// A closed stream of `character_id` was journaled (its cleanup is durable from now on):
    /// `order` is its place in the character's session order (the close's epoch and time, and
    /// the journal entry's id), `plan` what its cleanup does. Called once per closed stream,
    /// from the task that retried the append until it landed; it must not block or call the
    /// runtime.
    fn journaled(&self, character_id: Uuid, order: SessionOrder, plan: SessionLifecycleEffectPlan) {
        let _ = (character_id, order, plan);
    }
}

/// How a copy came to be loaded ([`LiveGame::land`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// A login (the character was claimed here).
    Login {
        /// True for a character never placed before (its first spawn).
        brand_new: bool,
    },
    /// A handoff from another shard (its content is the source's dump, or the freshest durable
    /// copy when a newer owner had superseded the source).
    Handoff,
}

/// A loaded character as the game lands it ([`LiveGame::land`]).
#[derive(Debug, Clone)]
pub struct Landed<C> {
    /// The character the game plays.
    pub character: C,
    /// Where it is (saved with it, and its placement's zone).
    pub anchor: Anchor,
    /// The character-creation input it still carries (`None` once applied: the next save
    /// clears it).
    pub chargen: Option<serde_json::Value>,
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
