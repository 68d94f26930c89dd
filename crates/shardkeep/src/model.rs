//! The game's model, as the core sees it.
//!
//! shardkeep never interprets a character's state itself: the state document is the game's. A
//! game implements [`GameModel`] once — its state type, the effects its retry jobs carry, how an
//! effect changes a state, which items a state holds — and hands a [`ModelHandle`] to the
//! workers and the loader. The core keeps everything else: the job envelope, idempotency keys,
//! fencing, the effects recorded since a checkpoint, the item-load ledger.
//!
//! Two job kinds belong to the core and need no model: `gameplay_state` (a whole dump that could
//! not land) and `transfer_activation` (recorded in shardkeep's own table). Every other kind is
//! the game's, named by [`GameEffect::kind`].

use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use serde::de::DeserializeOwned;
use uuid::Uuid;

/// Where a character is anchored in the world: the row's `zone_ref` and `room_ref` columns, the
/// only parts of a row besides the state document an effect may change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Anchor {
    /// Durable zone anchor.
    pub zone_ref: Option<String>,
    /// Room inside the zone.
    pub room_ref: Option<String>,
}

impl Anchor {
    /// Anchored in `zone`, at `room`.
    pub fn at(zone: impl Into<String>, room: impl Into<String>) -> Self {
        Self {
            zone_ref: Some(zone.into()),
            room_ref: Some(room.into()),
        }
    }
}

/// A change a retry job carries, in the game's own terms. Serialized as a JSON object whose
/// `kind` field is [`GameEffect::kind`] (for example a serde enum with `#[serde(tag = "kind")]`).
pub trait GameEffect: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The kind name: the `kind` field of the encoded effect and the job's `job_kind` column.
    /// Lower-case ASCII, digits and `_`; never one of the core's kinds.
    fn kind(&self) -> &'static str;

    /// True when the effect sets a value outright (the newest write of its kind wins), false
    /// when it adds to what is there (a grant: every one applies, once).
    fn sets_value(&self) -> bool;

    /// The zone the effect concerns, when it names one (stored with the job for operators).
    fn zone(&self) -> Option<&str> {
        None
    }

    /// Refuses an effect that can never apply (checked before the job is stored).
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }
}

/// What a game supplies so shardkeep can keep its characters durable.
pub trait GameModel: Send + Sync + 'static {
    /// The state document stored in a character's row and checkpoints.
    type State: Serialize + DeserializeOwned;
    /// The effects the game's retry jobs carry.
    type Effect: GameEffect;

    /// The schema version of [`GameModel::State`] this model reads and writes, from 1 up. Raise
    /// it when a release changes the document, and teach [`GameModel::upcast`] the step.
    const SCHEMA_VERSION: u32 = 1;

    /// Upgrades an encoded state of schema version `from` to `from + 1` (the loader runs the
    /// steps up to [`GameModel::SCHEMA_VERSION`]; the next save persists the result).
    fn upcast(&self, from: u32, _state: serde_json::Value) -> Result<serde_json::Value, String> {
        Err(format!("no upcaster from schema version {from}"))
    }

    /// What `effect` does to a character's state and anchor; `Ok(true)` when anything changed.
    /// An effect that would leave both as they are answers `Ok(false)` (nothing is rewritten).
    /// Whether it runs at all (a duplicate, a write the row already holds) is decided by the
    /// core from its bookkeeping, never here.
    fn apply_effect(
        &self,
        state: &mut Self::State,
        anchor: &mut Anchor,
        effect: &Self::Effect,
    ) -> Result<bool, String>;

    /// Ids of the items `state` holds (for the item-load ledger). A game without item identity
    /// keeps the default.
    fn held_items(&self, _state: &Self::State) -> Vec<Uuid> {
        Vec::new()
    }

    /// Removes item `item` from `state`; true when it was there.
    fn take_item(&self, _state: &mut Self::State, _item: Uuid) -> bool {
        false
    }
}

/// What an effect did to an encoded state.
#[derive(Debug, Clone, PartialEq)]
pub enum Applied {
    /// The state as it is now.
    Changed(serde_json::Value),
    /// The state is as it was (the anchor may still have moved).
    Unchanged,
}

/// The model behind a type-erased handle: every method works on encoded documents.
trait ErasedModel: Send + Sync {
    fn name(&self) -> &'static str;
    fn schema_version(&self) -> u32;
    fn upcast(&self, from: u32, state: serde_json::Value) -> Result<serde_json::Value, String>;
    fn check_state(&self, state: &serde_json::Value) -> Result<(), String>;
    fn apply(
        &self,
        state: &serde_json::Value,
        anchor: &mut Anchor,
        effect: &serde_json::Value,
    ) -> Result<Applied, String>;
    fn sets_value(&self, effect: &serde_json::Value) -> Option<bool>;
    fn held_items(&self, state: &serde_json::Value) -> Vec<Uuid>;
    fn held_items_text(&self, state: &str) -> Vec<Uuid>;
    fn take_item(&self, state: &mut serde_json::Value, item: Uuid) -> Result<bool, String>;
}

struct Erased<M>(M);

fn decode_state<M: GameModel>(state: &serde_json::Value) -> Result<M::State, String> {
    M::State::deserialize(state).map_err(|e| format!("stored state is not a state document: {e}"))
}

fn decode_effect<M: GameModel>(effect: &serde_json::Value) -> Result<M::Effect, String> {
    M::Effect::deserialize(effect).map_err(|e| format!("effect does not decode: {e}"))
}

use serde::Deserialize as _;

impl<M: GameModel> ErasedModel for Erased<M> {
    fn name(&self) -> &'static str {
        std::any::type_name::<M>()
    }

    fn schema_version(&self) -> u32 {
        M::SCHEMA_VERSION
    }

    fn upcast(&self, from: u32, state: serde_json::Value) -> Result<serde_json::Value, String> {
        self.0.upcast(from, state)
    }

    fn check_state(&self, state: &serde_json::Value) -> Result<(), String> {
        decode_state::<M>(state).map(drop)
    }

    fn apply(
        &self,
        state: &serde_json::Value,
        anchor: &mut Anchor,
        effect: &serde_json::Value,
    ) -> Result<Applied, String> {
        let effect = decode_effect::<M>(effect)?;
        let mut doc = decode_state::<M>(state)?;
        if !self.0.apply_effect(&mut doc, anchor, &effect)? {
            return Ok(Applied::Unchanged);
        }
        serde_json::to_value(&doc)
            .map(Applied::Changed)
            .map_err(|e| e.to_string())
    }

    fn sets_value(&self, effect: &serde_json::Value) -> Option<bool> {
        decode_effect::<M>(effect).ok().map(|e| e.sets_value())
    }

    fn held_items(&self, state: &serde_json::Value) -> Vec<Uuid> {
        decode_state::<M>(state)
            .map(|doc| self.0.held_items(&doc))
            .unwrap_or_default()
    }

    fn held_items_text(&self, state: &str) -> Vec<Uuid> {
        serde_json::from_str::<M::State>(state)
            .map(|doc| self.0.held_items(&doc))
            .unwrap_or_default()
    }

    fn take_item(&self, state: &mut serde_json::Value, item: Uuid) -> Result<bool, String> {
        let mut doc = decode_state::<M>(state)?;
        if !self.0.take_item(&mut doc, item) {
            return Ok(false);
        }
        *state = serde_json::to_value(&doc).map_err(|e| e.to_string())?;
        Ok(true)
    }
}

/// A state could not be brought to the model's schema version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpgradeError {
    /// The state is newer than the model.
    #[error(
        "stored at schema version {stored}, newer than this process's model (version {supported})"
    )]
    Newer {
        /// The stored version.
        stored: u32,
        /// The model's version.
        supported: u32,
    },
    /// An upcast failed.
    #[error("upgrading from schema version {from}: {reason}")]
    Failed {
        /// The version the failing step started from.
        from: u32,
        /// Why.
        reason: String,
    },
}

/// A game's model behind a cheap-to-clone handle, for the workers and the loader.
#[derive(Clone)]
pub struct ModelHandle(Arc<dyn ErasedModel>);

impl fmt::Debug for ModelHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ModelHandle").field(&self.0.name()).finish()
    }
}

impl ModelHandle {
    /// Wraps `model`.
    pub fn new<M: GameModel>(model: M) -> Self {
        Self(Arc::new(Erased(model)))
    }

    /// The schema version the model reads and writes.
    pub fn schema_version(&self) -> u32 {
        self.0.schema_version()
    }

    /// Brings an encoded state of schema version `from` to the model's version, one upcast at a
    /// time. A state newer than the model is refused ([`UpgradeError::Newer`]): an older
    /// process must never read it and write it back without the fields it does not know.
    pub fn upgrade(
        &self,
        from: u32,
        mut state: serde_json::Value,
    ) -> Result<serde_json::Value, UpgradeError> {
        let current = self.0.schema_version();
        if from > current {
            return Err(UpgradeError::Newer {
                stored: from,
                supported: current,
            });
        }
        for step in from.max(1)..current {
            state = self
                .0
                .upcast(step, state)
                .map_err(|reason| UpgradeError::Failed { from: step, reason })?;
        }
        Ok(state)
    }

    /// Refuses a document that is not the model's state.
    pub fn check_state(&self, state: &serde_json::Value) -> Result<(), String> {
        self.0.check_state(state)
    }

    /// Applies an encoded game effect to an encoded state and an anchor.
    pub fn apply_effect(
        &self,
        state: &serde_json::Value,
        anchor: &mut Anchor,
        effect: &serde_json::Value,
    ) -> Result<Applied, String> {
        self.0.apply(state, anchor, effect)
    }

    /// Whether an encoded game effect sets a value outright; `None` when it does not decode.
    pub fn sets_value(&self, effect: &serde_json::Value) -> Option<bool> {
        self.0.sets_value(effect)
    }

    /// The item ids an encoded state holds (none when it does not decode).
    pub fn held_items(&self, state: &serde_json::Value) -> Vec<Uuid> {
        self.0.held_items(state)
    }

    /// The item ids a state document holds, decoded straight from its text (none when it does
    /// not decode).
    pub fn held_items_in(&self, state: &crate::character::StateJson) -> Vec<Uuid> {
        self.0.held_items_text(state.as_str())
    }

    /// True when an encoded state holds `item`.
    pub fn holds_item(&self, state: &serde_json::Value, item: Uuid) -> bool {
        self.0.held_items(state).contains(&item)
    }

    /// Removes `item` from an encoded state; true when it was there.
    pub fn take_item(&self, state: &mut serde_json::Value, item: Uuid) -> Result<bool, String> {
        self.0.take_item(state, item)
    }
}

/// Whether a process whose model is at `model` may rewrite a stored document of schema
/// `document` on its owner's behalf (a retry job, an item taken from a departed releaser)
/// (pure). `owner` is the schema of the model of the copy that owns the row, or `None` when the
/// writer is the claim that replaces the owner. Refused, with the reason, when the document or
/// the owner's model is newer than `model`: the writer cannot read what that owner writes (a
/// kind it does not know, a field it would drop). An older document is upgraded as it is
/// written; a live owner of an older release then sends its own saves through whole-document
/// jobs, which a newer release applies (see the saver).
pub(crate) fn may_rewrite(model: u32, document: u32, owner: Option<u32>) -> Result<(), String> {
    let owner_schema = owner.unwrap_or(0);
    let newest = document.max(owner_schema);
    if newest > model {
        return Err(format!(
            "the character is at schema version {newest} (document {document}, owner \
             {owner_schema}), newer than this process's model ({model}): left for a newer release"
        ));
    }
    Ok(())
}

/// Encoded JSON size of `value`, counted without building the text (`usize::MAX` when it does
/// not encode).
pub fn encoded_len<T: Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

/// A small model for the core's own unit tests: the state is any JSON object; a grant adds to
/// `experience` and `currency` and appends `items`, a look sets `appearance`.
#[cfg(test)]
pub(crate) mod test_model {
    use serde::{Deserialize, Serialize};

    use super::{Anchor, GameEffect, GameModel, ModelHandle};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(tag = "kind", rename_all = "snake_case")]
    pub(crate) enum Effect {
        CombatRewards {
            experience: i64,
            currency: i64,
            items: Vec<serde_json::Value>,
        },
        CharacterAppearance {
            appearance: serde_json::Value,
        },
    }

    impl GameEffect for Effect {
        fn kind(&self) -> &'static str {
            match self {
                Self::CombatRewards { .. } => "combat_rewards",
                Self::CharacterAppearance { .. } => "character_appearance",
            }
        }
        fn sets_value(&self) -> bool {
            matches!(self, Self::CharacterAppearance { .. })
        }
    }

    pub(crate) struct Model;

    impl GameModel for Model {
        type State = serde_json::Map<String, serde_json::Value>;
        type Effect = Effect;

        fn apply_effect(
            &self,
            state: &mut Self::State,
            _anchor: &mut Anchor,
            effect: &Effect,
        ) -> Result<bool, String> {
            match effect {
                Effect::CombatRewards {
                    experience,
                    currency,
                    items,
                } => {
                    for (field, add) in [("experience", experience), ("currency", currency)] {
                        let now = state.get(field).map_or(Some(0), serde_json::Value::as_i64);
                        let now = now.ok_or_else(|| format!("{field} is not a number"))?;
                        state.insert(field.into(), (now + add).into());
                    }
                    let inventory = state
                        .entry("inventory")
                        .or_insert_with(|| serde_json::json!([]));
                    if let Some(list) = inventory.as_array_mut() {
                        list.extend(items.iter().cloned());
                    }
                    Ok(true)
                }
                Effect::CharacterAppearance { appearance } => {
                    let before = state.insert("appearance".into(), appearance.clone());
                    Ok(before.as_ref() != Some(appearance))
                }
            }
        }
    }

    pub(crate) fn handle() -> ModelHandle {
        ModelHandle::new(Model)
    }
}

#[cfg(test)]
mod rewrite_tests {
    use super::may_rewrite;

    #[test]
    fn a_writer_rewrites_only_what_it_can_read() {
        assert!(may_rewrite(2, 1, Some(2)).is_ok());
        assert!(may_rewrite(2, 2, Some(2)).is_ok());
        // An older owner's row is upgraded (its saves then come as whole-document jobs).
        assert!(may_rewrite(2, 1, Some(1)).is_ok());
        // A newer document or owner: unreadable here.
        assert!(may_rewrite(1, 2, Some(1)).unwrap_err().contains("newer"));
        assert!(may_rewrite(1, 1, Some(2)).unwrap_err().contains("newer"));
        // The claim that replaces the owner still cannot read a newer document.
        assert!(may_rewrite(2, 1, None).is_ok());
        assert!(may_rewrite(1, 2, None).is_err());
    }
}
