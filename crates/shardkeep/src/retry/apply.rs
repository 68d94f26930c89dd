//! How each payload changes a character row (pure). The reference state document is the target;
//! a game with its own model supplies its own version of this step.

use serde::Deserialize;

use super::job::PersistenceRetryPayload;
use crate::game::state::StateDocument;

/// The mutable part of a character row a job may change.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RowState {
    pub(crate) state: serde_json::Value,
    pub(crate) zone_ref: Option<String>,
    pub(crate) room_ref: Option<String>,
}

fn document(state: &serde_json::Value) -> Result<StateDocument, String> {
    StateDocument::deserialize(state)
        .map_err(|e| format!("stored state is not a state document: {e}"))
}

fn store(row: &mut RowState, doc: &StateDocument) -> Result<(), String> {
    row.state = serde_json::to_value(doc).map_err(|e| e.to_string())?;
    Ok(())
}

/// A job effect as recorded beside its row (`character_job_effects`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RecordedEffect {
    /// The job's idempotency key.
    pub(crate) key: String,
    /// The epoch of the copy that issued the job.
    pub(crate) owner_epoch: i64,
    /// Its place in that copy's issue sequence (0: not sequenced).
    pub(crate) issue_seq: u64,
    /// The row version right after the settle that applied it.
    pub(crate) row_version: i64,
    /// What it did.
    pub(crate) payload: PersistenceRetryPayload,
}

/// True when a state document written before migration 8 lists `key` among the reward grants it
/// holds (the old `reward_keys` field; newer documents have none).
pub(crate) fn lists_legacy_reward_key(state: &serde_json::Value, key: &str) -> bool {
    state
        .get("reward_keys")
        .and_then(serde_json::Value::as_array)
        .is_some_and(|keys| keys.iter().any(|k| k.as_str() == Some(key)))
}

/// True for a payload that sets a value outright (the newest one wins), false for one that adds
/// to what is there.
pub(crate) fn is_absolute(payload: &PersistenceRetryPayload) -> bool {
    matches!(
        payload,
        PersistenceRetryPayload::CharacterLocation { .. }
            | PersistenceRetryPayload::CharacterAppearance { .. }
            | PersistenceRetryPayload::CharacterEquipment { .. }
            | PersistenceRetryPayload::GameplayState { .. }
    )
}

/// Replays `effects` on `row` (a newer snapshot's content), in the order given. An effect that
/// does not apply is skipped (the snapshot's own content stands); returns how many applied.
pub(crate) fn replay<'a>(
    row: &mut RowState,
    effects: impl IntoIterator<Item = &'a RecordedEffect>,
) -> usize {
    effects
        .into_iter()
        .filter(|effect| apply_payload(row, &effect.payload).is_ok())
        .count()
}

/// What `payload` does to `row`; true when the row changed. Whether it should run at all (a
/// duplicate, a write the row already holds) is decided by the caller from shardkeep's
/// bookkeeping, never from the document. A payload that would leave the row as it is changes
/// nothing (the stored document is not rewritten).
pub(crate) fn apply_payload(
    row: &mut RowState,
    payload: &PersistenceRetryPayload,
) -> Result<bool, String> {
    match payload {
        PersistenceRetryPayload::CharacterLocation {
            zone,
            room,
            position,
            ..
        } => {
            let mut doc = document(&row.state)?;
            let moved = position.is_some() && doc.position != *position;
            if moved {
                doc.position = *position;
                store(row, &doc)?;
            }
            let anchored =
                row.zone_ref.as_ref() != Some(zone) || row.room_ref.as_ref() != Some(room);
            row.zone_ref = Some(zone.clone());
            row.room_ref = Some(room.clone());
            Ok(moved || anchored)
        }
        PersistenceRetryPayload::CharacterAppearance { appearance, .. } => {
            let mut doc = document(&row.state)?;
            if doc.appearance == *appearance {
                return Ok(false);
            }
            doc.appearance = appearance.clone();
            store(row, &doc)?;
            Ok(true)
        }
        PersistenceRetryPayload::CharacterEquipment { equipment, .. } => {
            let mut doc = document(&row.state)?;
            if doc.equipment == *equipment {
                return Ok(false);
            }
            doc.equipment = equipment.clone();
            store(row, &doc)?;
            Ok(true)
        }
        PersistenceRetryPayload::GameplayState {
            state,
            zone_ref,
            room_ref,
            ..
        } => {
            document(state)?;
            let mut changed = row.state != *state;
            if changed {
                row.state = state.clone();
            }
            if let Some(zone) = zone_ref.as_ref().filter(|z| !z.is_empty()) {
                changed |= row.zone_ref.as_ref() != Some(zone) || row.room_ref != *room_ref;
                row.zone_ref = Some(zone.clone());
                row.room_ref = room_ref.clone();
            }
            Ok(changed)
        }
        PersistenceRetryPayload::CombatRewards {
            experience,
            currency,
            items,
            ..
        } => {
            let mut doc = document(&row.state)?;
            if *experience == 0 && *currency == 0 && items.is_empty() {
                return Ok(false);
            }
            doc.experience = doc.experience.saturating_add(*experience);
            doc.currency = doc.currency.saturating_add(*currency);
            doc.inventory.extend(items.iter().cloned());
            store(row, &doc)?;
            Ok(true)
        }
        PersistenceRetryPayload::TransferActivation { .. } => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use uuid::Uuid;

    use super::*;
    use crate::game::items::ItemJson;

    fn row() -> RowState {
        RowState {
            state: json!({ "experience": 10, "currency": 5, "inventory": [{ "proto": "gem" }] }),
            zone_ref: Some("zone-0".into()),
            room_ref: Some("r0".into()),
        }
    }

    #[test]
    fn rewards_add_to_what_is_there() {
        let mut row = row();
        let payload = PersistenceRetryPayload::CombatRewards {
            character_id: Uuid::nil(),
            experience: 90,
            currency: 1,
            items: vec![ItemJson {
                proto: "ore".into(),
                delta: Default::default(),
                contents: vec![],
                id: None,
            }],
        };
        apply_payload(&mut row, &payload).unwrap();
        assert_eq!(row.state["experience"], 100);
        assert_eq!(row.state["currency"], 6);
        assert_eq!(row.state["inventory"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn a_payload_that_leaves_the_row_as_it_is_changes_nothing() {
        let mut row = row();
        let before = row.clone();
        let nothing = PersistenceRetryPayload::CombatRewards {
            character_id: Uuid::nil(),
            experience: 0,
            currency: 0,
            items: vec![],
        };
        assert_eq!(apply_payload(&mut row, &nothing), Ok(false));
        let same_place = PersistenceRetryPayload::CharacterLocation {
            character_id: Uuid::nil(),
            zone: "zone-0".into(),
            room: "r0".into(),
            position: None,
        };
        assert_eq!(apply_payload(&mut row, &same_place), Ok(false));
        assert_eq!(row, before, "the document was not rewritten");
        let one_more = PersistenceRetryPayload::CombatRewards {
            character_id: Uuid::nil(),
            experience: 1,
            currency: 0,
            items: vec![],
        };
        assert_eq!(apply_payload(&mut row, &one_more), Ok(true));
    }

    #[test]
    fn replay_runs_effects_in_the_order_given_and_skips_what_does_not_apply() {
        let mut row = row();
        let looks = |hair: &str| RecordedEffect {
            key: format!("looks-{hair}"),
            owner_epoch: 1,
            issue_seq: 1,
            row_version: 1,
            payload: PersistenceRetryPayload::CharacterAppearance {
                character_id: Uuid::nil(),
                appearance: serde_json::from_value(json!({ "hair": hair })).unwrap(),
            },
        };
        let broken = RecordedEffect {
            payload: PersistenceRetryPayload::GameplayState {
                character_id: Uuid::nil(),
                state: json!({ "experience": "lots" }),
                zone_ref: None,
                room_ref: None,
            },
            ..looks("x")
        };
        assert_eq!(
            replay(&mut row, [&looks("red"), &broken, &looks("blue")]),
            2
        );
        assert_eq!(row.state["appearance"]["hair"], "blue");
        assert_eq!(
            row.state["experience"], 10,
            "the broken state did not apply"
        );
        assert!(is_absolute(&looks("x").payload));
    }

    #[test]
    fn location_moves_the_anchor_and_position() {
        let mut row = row();
        let payload = PersistenceRetryPayload::CharacterLocation {
            character_id: Uuid::nil(),
            zone: "zone-2".into(),
            room: "r3".into(),
            position: Some([1, 2]),
        };
        apply_payload(&mut row, &payload).unwrap();
        assert_eq!(
            (row.zone_ref.as_deref(), row.room_ref.as_deref()),
            (Some("zone-2"), Some("r3"))
        );
        assert_eq!(row.state["position"], json!([1, 2]));
    }

    #[test]
    fn a_state_that_is_not_a_document_is_an_error() {
        let mut row = RowState {
            state: json!("garbage"),
            zone_ref: None,
            room_ref: None,
        };
        let payload = PersistenceRetryPayload::CombatRewards {
            character_id: Uuid::nil(),
            experience: 1,
            currency: 0,
            items: vec![],
        };
        assert!(apply_payload(&mut row, &payload).is_err());
        let bad_state = PersistenceRetryPayload::GameplayState {
            character_id: Uuid::nil(),
            state: json!({ "experience": "lots" }),
            zone_ref: None,
            room_ref: None,
        };
        assert!(apply_payload(&mut row, &bad_state).is_err());
    }
}
