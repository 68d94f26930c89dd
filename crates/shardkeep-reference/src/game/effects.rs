//! The reference game's retry effects and its [`GameModel`]: what each job kind the game issues
//! does to a [`StateDocument`], and which items a document holds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::items::{ItemJson, Slot};
use super::state::{Appearance, StateDocument};
use super::state::{remove_stored_item, stored_items};
use shardkeep::model::{Anchor, GameEffect, GameModel};

/// Most items one reward or equipment effect carries.
pub const MAX_EFFECT_ITEMS: usize = 512;
/// Longest zone or room name an effect carries.
const MAX_NAME_BYTES: usize = 256;

/// A write the reference game issues as a retry job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ReferenceEffect {
    /// Where the character stands.
    CharacterLocation {
        /// Zone.
        zone: String,
        /// Room in the zone.
        room: String,
        /// Position inside the room.
        position: Option<[i32; 2]>,
    },
    /// How the character looks.
    CharacterAppearance {
        /// The new looks.
        appearance: Appearance,
    },
    /// What the character wears: the complete set of worn items.
    CharacterEquipment {
        /// Worn items by slot.
        equipment: BTreeMap<Slot, ItemJson>,
    },
    /// Rewards granted for a fight: deltas, applied once per idempotency key.
    CombatRewards {
        /// Experience gained.
        experience: i64,
        /// Coins gained.
        currency: i64,
        /// Loot added to the inventory.
        items: Vec<ItemJson>,
    },
}

impl GameEffect for ReferenceEffect {
    fn kind(&self) -> &'static str {
        match self {
            Self::CharacterLocation { .. } => "character_location",
            Self::CharacterAppearance { .. } => "character_appearance",
            Self::CharacterEquipment { .. } => "character_equipment",
            Self::CombatRewards { .. } => "combat_rewards",
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
        let name = |what: &str, value: &str| {
            if value.trim().is_empty() {
                Err(format!("{what} must not be empty"))
            } else if value.len() > MAX_NAME_BYTES {
                Err(format!("{what} is longer than {MAX_NAME_BYTES} bytes"))
            } else {
                Ok(())
            }
        };
        match self {
            Self::CharacterLocation { zone, room, .. } => {
                name("zone", zone)?;
                name("room", room)
            }
            Self::CharacterAppearance { .. } => Ok(()),
            Self::CharacterEquipment { equipment } if equipment.len() > MAX_EFFECT_ITEMS => {
                Err(format!("more than {MAX_EFFECT_ITEMS} items"))
            }
            Self::CharacterEquipment { .. } => Ok(()),
            Self::CombatRewards {
                experience,
                currency,
                items,
            } => {
                if *experience < 0 || *currency < 0 {
                    Err("rewards are grants: experience and currency must not be negative".into())
                } else if items.len() > MAX_EFFECT_ITEMS {
                    Err(format!("more than {MAX_EFFECT_ITEMS} items"))
                } else {
                    Ok(())
                }
            }
        }
    }
}

/// The reference game's model.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReferenceModel;

impl ReferenceModel {
    /// The model behind a handle, for the workers and the loader.
    pub fn handle() -> shardkeep::model::ModelHandle {
        shardkeep::model::ModelHandle::new(Self)
    }
}

impl GameModel for ReferenceModel {
    type State = StateDocument;
    type Effect = ReferenceEffect;

    fn apply_effect(
        &self,
        doc: &mut StateDocument,
        anchor: &mut Anchor,
        effect: &ReferenceEffect,
    ) -> Result<bool, String> {
        match effect {
            ReferenceEffect::CharacterLocation {
                zone,
                room,
                position,
            } => {
                let moved = position.is_some() && doc.position != *position;
                if moved {
                    doc.position = *position;
                }
                anchor.zone_ref = Some(zone.clone());
                anchor.room_ref = Some(room.clone());
                Ok(moved)
            }
            ReferenceEffect::CharacterAppearance { appearance } => {
                let changed = doc.appearance != *appearance;
                doc.appearance = appearance.clone();
                Ok(changed)
            }
            ReferenceEffect::CharacterEquipment { equipment } => {
                let changed = doc.equipment != *equipment;
                doc.equipment = equipment.clone();
                Ok(changed)
            }
            ReferenceEffect::CombatRewards {
                experience,
                currency,
                items,
            } => {
                if *experience == 0 && *currency == 0 && items.is_empty() {
                    return Ok(false);
                }
                doc.experience = doc.experience.saturating_add(*experience);
                doc.currency = doc.currency.saturating_add(*currency);
                doc.inventory.extend(items.iter().cloned());
                Ok(true)
            }
        }
    }

    fn held_items(&self, doc: &StateDocument) -> Vec<Uuid> {
        stored_items(doc)
    }

    fn take_item(&self, doc: &mut StateDocument, item: Uuid) -> bool {
        remove_stored_item(doc, item)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use shardkeep::model::{Applied, ModelHandle};

    fn state() -> serde_json::Value {
        json!({ "experience": 10, "currency": 5, "inventory": [{ "proto": "gem" }] })
    }

    fn anchor() -> Anchor {
        Anchor {
            zone_ref: Some("zone-0".into()),
            room_ref: Some("r0".into()),
        }
    }

    fn apply(state: &serde_json::Value, anchor: &mut Anchor, effect: &ReferenceEffect) -> Applied {
        ModelHandle::new(ReferenceModel)
            .apply_effect(state, anchor, &serde_json::to_value(effect).unwrap())
            .unwrap()
    }

    #[test]
    fn rewards_add_to_what_is_there() {
        let effect = ReferenceEffect::CombatRewards {
            experience: 90,
            currency: 1,
            items: vec![ItemJson {
                proto: "ore".into(),
                delta: Default::default(),
                contents: vec![],
                id: None,
            }],
        };
        let Applied::Changed(after) = apply(&state(), &mut anchor(), &effect) else {
            panic!("nothing changed");
        };
        assert_eq!(after["experience"], 100);
        assert_eq!(after["currency"], 6);
        assert_eq!(after["inventory"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn an_effect_that_leaves_the_state_as_it_is_changes_nothing() {
        let nothing = ReferenceEffect::CombatRewards {
            experience: 0,
            currency: 0,
            items: vec![],
        };
        assert_eq!(apply(&state(), &mut anchor(), &nothing), Applied::Unchanged);
        let same_place = ReferenceEffect::CharacterLocation {
            zone: "zone-0".into(),
            room: "r0".into(),
            position: None,
        };
        let mut here = anchor();
        assert_eq!(apply(&state(), &mut here, &same_place), Applied::Unchanged);
        assert_eq!(here, anchor());
    }

    #[test]
    fn location_moves_the_anchor_and_position() {
        let effect = ReferenceEffect::CharacterLocation {
            zone: "zone-2".into(),
            room: "r3".into(),
            position: Some([1, 2]),
        };
        let mut here = anchor();
        let Applied::Changed(after) = apply(&state(), &mut here, &effect) else {
            panic!("nothing changed");
        };
        assert_eq!(
            (here.zone_ref.as_deref(), here.room_ref.as_deref()),
            (Some("zone-2"), Some("r3"))
        );
        assert_eq!(after["position"], json!([1, 2]));
    }

    #[test]
    fn a_state_that_is_not_a_document_is_an_error() {
        let effect = serde_json::to_value(ReferenceEffect::CombatRewards {
            experience: 1,
            currency: 0,
            items: vec![],
        })
        .unwrap();
        let model = ModelHandle::new(ReferenceModel);
        assert!(
            model
                .apply_effect(&json!("garbage"), &mut anchor(), &effect)
                .is_err()
        );
        assert!(model.check_state(&json!({ "experience": "lots" })).is_err());
        assert!(
            model
                .apply_effect(&state(), &mut anchor(), &json!({ "kind": "teleport" }))
                .is_err()
        );
    }

    #[test]
    fn invalid_effects_are_refused_before_they_are_stored() {
        let negative = ReferenceEffect::CombatRewards {
            experience: -5,
            currency: 0,
            items: vec![],
        };
        assert!(shardkeep::retry::PersistenceRetryPayload::effect(Uuid::nil(), &negative).is_err());
        let nowhere = ReferenceEffect::CharacterLocation {
            zone: " ".into(),
            room: "r".into(),
            position: None,
        };
        assert!(shardkeep::retry::PersistenceRetryPayload::effect(Uuid::nil(), &nowhere).is_err());
    }

    #[test]
    fn effects_keep_the_stored_wire_format() {
        let id = Uuid::now_v7();
        let stored = json!({ "kind": "combat_rewards", "character_id": id, "experience": 10,
                             "currency": 2, "items": [] });
        let payload =
            shardkeep::retry::PersistenceRetryPayload::decode(stored.clone(), None).unwrap();
        assert_eq!(payload.kind(), "combat_rewards");
        assert_eq!(payload.character_id(), id);
        assert_eq!(
            payload.game_effect::<ReferenceEffect>().unwrap(),
            ReferenceEffect::CombatRewards {
                experience: 10,
                currency: 2,
                items: vec![]
            }
        );
        let built = shardkeep::retry::PersistenceRetryPayload::effect(
            id,
            &ReferenceEffect::CombatRewards {
                experience: 10,
                currency: 2,
                items: vec![],
            },
        )
        .unwrap();
        assert_eq!(serde_json::to_value(&built).unwrap(), stored);
    }
}
