//! How each payload changes a character row (pure). The reference state document is the target;
//! a game with its own model supplies its own version of this step.

use super::job::PersistenceRetryPayload;
use crate::game::state::{MAX_JOB_EFFECTS, StateDocument};

/// The mutable part of a character row a job may change.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RowState {
    pub(crate) state: serde_json::Value,
    pub(crate) zone_ref: Option<String>,
    pub(crate) room_ref: Option<String>,
}

fn document(state: &serde_json::Value) -> Result<StateDocument, String> {
    serde_json::from_value(state.clone())
        .map_err(|e| format!("stored state is not a state document: {e}"))
}

fn store(row: &mut RowState, doc: &StateDocument) -> Result<(), String> {
    row.state = serde_json::to_value(doc).map_err(|e| e.to_string())?;
    Ok(())
}

/// Applies `payload` to `row` and, when it changed the row, records it among the row's job
/// effects (replayed by a loader that prefers a newer checkpoint). A transfer activation changes
/// no row state (it is recorded in its own table).
pub(crate) fn apply_payload(
    row: &mut RowState,
    payload: &PersistenceRetryPayload,
    key: &str,
) -> Result<(), String> {
    let before = row.clone();
    apply_effect(row, payload, key)?;
    if *row != before {
        record_effect(row, payload, key)?;
    }
    Ok(())
}

fn record_effect(
    row: &mut RowState,
    payload: &PersistenceRetryPayload,
    key: &str,
) -> Result<(), String> {
    let mut doc = document(&row.state)?;
    let effect = serde_json::json!({ "key": key, "payload": payload });
    doc.job_effects.push(effect);
    if doc.job_effects.len() > MAX_JOB_EFFECTS {
        let excess = doc.job_effects.len() - MAX_JOB_EFFECTS;
        doc.job_effects.drain(..excess);
    }
    store(row, &doc)
}

/// True when the row's recorded job effects hold one under `key` (the job ran before).
pub(crate) fn effect_recorded(row: &RowState, key: &str) -> bool {
    row.state
        .get("job_effects")
        .and_then(|e| e.as_array())
        .is_some_and(|effects| {
            effects
                .iter()
                .any(|e| e.get("key").and_then(|k| k.as_str()) == Some(key))
        })
}

/// Replays the job effects recorded in `source` (a stored row's state) on `row` (a newer
/// checkpoint's), in the order they were applied. Reward grants stay idempotent by key; an
/// effect that does not decode or apply is skipped (the checkpoint's own content stands).
pub(crate) fn replay_effects(row: &mut RowState, source: &serde_json::Value) -> usize {
    let Some(effects) = source.get("job_effects").and_then(|e| e.as_array()) else {
        return 0;
    };
    let mut replayed = 0;
    for effect in effects {
        let key = effect
            .get("key")
            .and_then(|k| k.as_str())
            .unwrap_or_default();
        let Some(payload) = effect
            .get("payload")
            .and_then(|p| serde_json::from_value::<PersistenceRetryPayload>(p.clone()).ok())
        else {
            continue;
        };
        if apply_effect(row, &payload, key).is_ok() {
            replayed += 1;
        }
    }
    replayed
}

/// What `payload` does to `row`.
fn apply_effect(
    row: &mut RowState,
    payload: &PersistenceRetryPayload,
    key: &str,
) -> Result<(), String> {
    match payload {
        PersistenceRetryPayload::CharacterLocation {
            zone,
            room,
            position,
            ..
        } => {
            let mut doc = document(&row.state)?;
            if position.is_some() {
                doc.position = *position;
            }
            store(row, &doc)?;
            row.zone_ref = Some(zone.clone());
            row.room_ref = Some(room.clone());
        }
        PersistenceRetryPayload::CharacterAppearance { appearance, .. } => {
            let mut doc = document(&row.state)?;
            doc.appearance = appearance.clone();
            store(row, &doc)?;
        }
        PersistenceRetryPayload::CharacterEquipment { equipment, .. } => {
            let mut doc = document(&row.state)?;
            doc.equipment = equipment.clone();
            store(row, &doc)?;
        }
        PersistenceRetryPayload::GameplayState {
            state,
            zone_ref,
            room_ref,
            ..
        } => {
            document(state)?;
            row.state = state.clone();
            if let Some(zone) = zone_ref.as_ref().filter(|z| !z.is_empty()) {
                row.zone_ref = Some(zone.clone());
                row.room_ref = room_ref.clone();
            }
        }
        PersistenceRetryPayload::CombatRewards {
            experience,
            currency,
            items,
            ..
        } => {
            let mut doc = document(&row.state)?;
            if !crate::game::state::remember_reward(&mut doc.reward_keys, key) {
                // The live copy already granted it and a flush carried it here.
                return Ok(());
            }
            doc.experience = doc.experience.saturating_add(*experience);
            doc.currency = doc.currency.saturating_add(*currency);
            doc.inventory.extend(items.iter().cloned());
            store(row, &doc)?;
        }
        PersistenceRetryPayload::TransferActivation { .. } => {}
    }
    Ok(())
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
        apply_payload(&mut row, &payload, "k").unwrap();
        assert_eq!(row.state["experience"], 100);
        assert_eq!(row.state["currency"], 6);
        assert_eq!(row.state["inventory"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn a_reward_whose_key_the_state_holds_is_not_granted_again() {
        let mut row = row();
        let payload = PersistenceRetryPayload::CombatRewards {
            character_id: Uuid::nil(),
            experience: 5,
            currency: 0,
            items: vec![],
        };
        apply_payload(&mut row, &payload, "kill-1").unwrap();
        apply_payload(&mut row, &payload, "kill-1").unwrap();
        assert_eq!(row.state["experience"], 15);
        assert_eq!(row.state["reward_keys"], serde_json::json!(["kill-1"]));
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
        apply_payload(&mut row, &payload, "k").unwrap();
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
        assert!(apply_payload(&mut row, &payload, "k").is_err());
        let bad_state = PersistenceRetryPayload::GameplayState {
            character_id: Uuid::nil(),
            state: json!({ "experience": "lots" }),
            zone_ref: None,
            room_ref: None,
        };
        assert!(apply_payload(&mut row, &bad_state, "k").is_err());
    }
}
