//! How each payload changes a character row (pure): the core's kinds here, the game's through
//! its model.

use super::payload::{CoreWrite, PersistenceRetryPayload};
use crate::model::{Anchor, Applied, ModelHandle};

/// The mutable part of a character row a job may change.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RowState {
    pub(crate) state: serde_json::Value,
    pub(crate) zone_ref: Option<String>,
    pub(crate) room_ref: Option<String>,
    /// The schema version of `state`.
    pub(crate) schema_version: u32,
}

/// Brings the row's document to the model's schema version (an error when it is newer: this
/// process must not rewrite it).
fn upgrade_row(model: &ModelHandle, row: &mut RowState) -> Result<(), String> {
    let current = model.schema_version();
    if row.schema_version != current {
        let state = std::mem::take(&mut row.state);
        match model.upgrade(row.schema_version, state.clone()) {
            Ok(upgraded) => {
                row.state = upgraded;
                row.schema_version = current;
            }
            Err(err) => {
                row.state = state;
                return Err(err.to_string());
            }
        }
    }
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
/// to what is there. A game effect that does not decode counts as additive (it cannot apply).
pub(crate) fn is_absolute(model: &ModelHandle, payload: &PersistenceRetryPayload) -> bool {
    match payload.core() {
        Some(CoreWrite::GameplayState { .. }) => true,
        Some(CoreWrite::TransferActivation { .. }) => false,
        None => model.sets_value(&payload.game_fields()).unwrap_or(false),
    }
}

/// Replays `effects` on `row` (a newer snapshot's content), in the order given. An effect that
/// does not apply is skipped (the snapshot's own content stands); returns how many applied.
pub(crate) fn replay<'a>(
    model: &ModelHandle,
    row: &mut RowState,
    effects: impl IntoIterator<Item = &'a RecordedEffect>,
) -> usize {
    effects
        .into_iter()
        .filter(|effect| apply_payload(model, row, &effect.payload).is_ok())
        .count()
}

/// What `payload` does to `row`; true when the row changed. Whether it should run at all (a
/// duplicate, a write the row already holds) is decided by the caller from shardkeep's
/// bookkeeping, never from the document. A payload that would leave the row as it is changes
/// nothing (the stored document is not rewritten).
pub(crate) fn apply_payload(
    model: &ModelHandle,
    row: &mut RowState,
    payload: &PersistenceRetryPayload,
) -> Result<bool, String> {
    match payload.core() {
        Some(CoreWrite::GameplayState {
            state,
            zone_ref,
            room_ref,
            schema_version,
            ..
        }) => {
            let current = model.schema_version();
            if row.schema_version > current {
                return Err(format!(
                    "the row is at schema version {}, newer than this process's model ({current})",
                    row.schema_version
                ));
            }
            let state = model
                .upgrade(*schema_version, state.clone())
                .map_err(|e| e.to_string())?;
            model.check_state(&state)?;
            let mut changed = row.state != state || row.schema_version != current;
            if changed {
                row.state = state;
                row.schema_version = current;
            }
            if let Some(zone) = zone_ref.as_ref().filter(|z| !z.is_empty()) {
                changed |= row.zone_ref.as_ref() != Some(zone) || row.room_ref != *room_ref;
                row.zone_ref = Some(zone.clone());
                row.room_ref = room_ref.clone();
            }
            Ok(changed)
        }
        Some(CoreWrite::TransferActivation { .. }) => Ok(false),
        None => {
            let before = row.clone();
            if let Err(err) = upgrade_row(model, row) {
                *row = before;
                return Err(err);
            }
            let upgraded = row.schema_version != before.schema_version;
            // Applied to copies: an effect that fails leaves the row as it was.
            let mut anchor = Anchor {
                zone_ref: row.zone_ref.clone(),
                room_ref: row.room_ref.clone(),
            };
            let applied = match model.apply_effect(&row.state, &mut anchor, &payload.game_fields())
            {
                Ok(applied) => applied,
                Err(err) => {
                    *row = before;
                    return Err(err);
                }
            };
            let moved = anchor.zone_ref != row.zone_ref || anchor.room_ref != row.room_ref;
            row.zone_ref = anchor.zone_ref;
            row.room_ref = anchor.room_ref;
            match applied {
                Applied::Changed(state) => {
                    row.state = state;
                    Ok(true)
                }
                Applied::Unchanged => Ok(moved || upgraded),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use uuid::Uuid;

    use super::*;
    use crate::model::test_model::{Effect, handle};

    fn row() -> RowState {
        RowState {
            state: json!({ "experience": 10, "currency": 5 }),
            zone_ref: Some("zone-0".into()),
            room_ref: Some("r0".into()),
            schema_version: 1,
        }
    }

    fn looks(hair: &str) -> RecordedEffect {
        let effect = Effect::CharacterAppearance {
            appearance: json!({ "hair": hair }),
        };
        RecordedEffect {
            key: format!("looks-{hair}"),
            owner_epoch: 1,
            issue_seq: 1,
            row_version: 1,
            payload: PersistenceRetryPayload::effect(Uuid::nil(), &effect).unwrap(),
        }
    }

    #[test]
    fn replay_runs_effects_in_the_order_given_and_skips_what_does_not_apply() {
        let model = handle();
        let mut row = row();
        let broken = RecordedEffect {
            payload: PersistenceRetryPayload::gameplay_state(
                Uuid::nil(),
                json!("not an object"),
                None,
                None,
            ),
            ..looks("x")
        };
        assert_eq!(
            replay(&model, &mut row, [&looks("red"), &broken, &looks("blue")]),
            2
        );
        assert_eq!(row.state["appearance"]["hair"], "blue");
        assert_eq!(
            row.state["experience"], 10,
            "the broken state did not apply"
        );
        assert!(is_absolute(&model, &looks("x").payload));
    }

    #[test]
    fn a_whole_state_replaces_the_document_and_moves_the_anchor_only_when_it_names_one() {
        let model = handle();
        let mut row = row();
        let here = PersistenceRetryPayload::gameplay_state(
            Uuid::nil(),
            json!({ "experience": 20 }),
            None,
            None,
        );
        assert_eq!(apply_payload(&model, &mut row, &here), Ok(true));
        assert_eq!(row.zone_ref.as_deref(), Some("zone-0"));
        assert_eq!(apply_payload(&model, &mut row, &here), Ok(false));
        let moved = PersistenceRetryPayload::gameplay_state(
            Uuid::nil(),
            json!({ "experience": 20 }),
            Some("zone-9".into()),
            Some("r1".into()),
        );
        assert_eq!(apply_payload(&model, &mut row, &moved), Ok(true));
        assert_eq!(row.zone_ref.as_deref(), Some("zone-9"));
    }

    #[test]
    fn a_game_effect_that_fails_leaves_the_row_as_it_was() {
        let model = handle();
        let mut row = RowState {
            state: json!({ "experience": "lots" }),
            zone_ref: None,
            room_ref: None,
            schema_version: 1,
        };
        let before = row.clone();
        let grant = Effect::CombatRewards {
            experience: 1,
            currency: 0,
            items: vec![],
        };
        let payload = PersistenceRetryPayload::effect(Uuid::nil(), &grant).unwrap();
        assert!(apply_payload(&model, &mut row, &payload).is_err());
        assert_eq!(row, before);
        let activation = PersistenceRetryPayload::transfer_activation(Uuid::nil(), "t", "s", "z");
        assert_eq!(apply_payload(&model, &mut row, &activation), Ok(false));
        assert!(!is_absolute(&model, &activation));
    }
}
