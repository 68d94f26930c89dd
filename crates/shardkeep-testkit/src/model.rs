//! A small game model for the core's tests: the state is any JSON object, so a test can store
//! whatever document it likes and still run the retry worker and the loader over it.
//!
//! Its effects use the kind names and fields of the reference game's, so stored jobs written by
//! either decode the same way.

use serde::{Deserialize, Serialize};
use shardkeep::model::{Anchor, GameEffect, GameModel, ModelHandle};

/// An effect of the ledger model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LedgerEffect {
    /// Adds to `experience` and `currency`, and appends `items` to `inventory`.
    CombatRewards {
        /// Added to `experience`.
        experience: i64,
        /// Added to `currency`.
        currency: i64,
        /// Appended to `inventory`.
        items: Vec<serde_json::Value>,
    },
    /// Sets `appearance`.
    CharacterAppearance {
        /// The new value.
        appearance: serde_json::Value,
    },
    /// Moves the anchor and sets `position`.
    CharacterLocation {
        /// Zone.
        zone: String,
        /// Room.
        room: String,
        /// Position inside the room.
        position: Option<[i32; 2]>,
    },
}

impl GameEffect for LedgerEffect {
    fn kind(&self) -> &'static str {
        match self {
            Self::CombatRewards { .. } => "combat_rewards",
            Self::CharacterAppearance { .. } => "character_appearance",
            Self::CharacterLocation { .. } => "character_location",
        }
    }

    fn sets_value(&self) -> bool {
        !matches!(self, Self::CombatRewards { .. })
    }

    fn zone(&self) -> Option<&str> {
        match self {
            Self::CharacterLocation { zone, .. } => Some(zone),
            _ => None,
        }
    }

    fn validate(&self) -> Result<(), String> {
        match self {
            Self::CombatRewards {
                experience,
                currency,
                ..
            } if *experience < 0 || *currency < 0 => Err("grants must not be negative".into()),
            _ => Ok(()),
        }
    }
}

/// The ledger model.
#[derive(Debug, Clone, Copy, Default)]
pub struct LedgerModel;

impl LedgerModel {
    /// The model behind a handle.
    pub fn handle() -> ModelHandle {
        ModelHandle::new(Self)
    }
}

impl GameModel for LedgerModel {
    type State = serde_json::Map<String, serde_json::Value>;
    type Effect = LedgerEffect;

    fn apply_effect(
        &self,
        state: &mut Self::State,
        anchor: &mut Anchor,
        effect: &LedgerEffect,
    ) -> Result<bool, String> {
        match effect {
            LedgerEffect::CombatRewards {
                experience,
                currency,
                items,
            } => {
                if *experience == 0 && *currency == 0 && items.is_empty() {
                    return Ok(false);
                }
                for (field, add) in [("experience", experience), ("currency", currency)] {
                    let now = state
                        .get(field)
                        .map_or(Some(0), serde_json::Value::as_i64)
                        .ok_or_else(|| format!("{field} is not a number"))?;
                    state.insert(field.into(), now.saturating_add(*add).into());
                }
                let inventory = state
                    .entry("inventory")
                    .or_insert_with(|| serde_json::json!([]));
                let list = inventory.as_array_mut().ok_or("inventory is not a list")?;
                list.extend(items.iter().cloned());
                Ok(true)
            }
            LedgerEffect::CharacterAppearance { appearance } => {
                let before = state.insert("appearance".into(), appearance.clone());
                Ok(before.as_ref() != Some(appearance))
            }
            LedgerEffect::CharacterLocation {
                zone,
                room,
                position,
            } => {
                anchor.zone_ref = Some(zone.clone());
                anchor.room_ref = Some(room.clone());
                let Some(position) = position else {
                    return Ok(false);
                };
                let position = serde_json::json!(position);
                let before = state.insert("position".into(), position.clone());
                Ok(before.as_ref() != Some(&position))
            }
        }
    }

    fn held_items(&self, state: &Self::State) -> Vec<uuid::Uuid> {
        state
            .get("inventory")
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|item| item.get("id")?.as_str()?.parse().ok())
            .collect()
    }

    fn take_item(&self, state: &mut Self::State, item: uuid::Uuid) -> bool {
        let Some(list) = state
            .get_mut("inventory")
            .and_then(serde_json::Value::as_array_mut)
        else {
            return false;
        };
        let before = list.len();
        list.retain(|i| i.get("id").and_then(serde_json::Value::as_str) != Some(&item.to_string()));
        list.len() != before
    }
}
