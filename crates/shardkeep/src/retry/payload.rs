//! What a retry job writes: one of the core's kinds, or an effect of the game's.
//!
//! Encoded as one flat JSON object: `kind`, `character_id`, then the kind's own fields. The core
//! decodes its own kinds strictly; a game kind's fields stay encoded until the worker hands them
//! to the game's model ([`crate::model::GameModel`]).

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::job::MAX_LABEL_BYTES;
use crate::model::GameEffect;

/// Longest kind name.
pub const MAX_KIND_BYTES: usize = 64;
/// Most bytes of one encoded payload.
pub const MAX_PAYLOAD_BYTES: usize = 256 * 1024;

/// The kind of a whole-document job.
pub const GAMEPLAY_STATE: &str = "gameplay_state";
/// The kind of a transfer-activation job.
pub const TRANSFER_ACTIVATION: &str = "transfer_activation";

/// The kinds the core applies itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum CoreWrite {
    /// The whole state document (a flush that could not land).
    GameplayState {
        /// The character.
        character_id: Uuid,
        /// The state document.
        state: serde_json::Value,
        /// Zone anchor (`None` keeps the stored one).
        zone_ref: Option<String>,
        /// Room in the zone.
        room_ref: Option<String>,
        /// The game's schema version of `state` (absent in jobs from before versions: 1; left
        /// out when 1, so a worker built before versions still reads a first-version job).
        #[serde(default = "first_schema", skip_serializing_if = "is_first_schema")]
        schema_version: u32,
    },
    /// A cross-shard transfer activation, recorded durably.
    TransferActivation {
        /// The character.
        character_id: Uuid,
        /// The transfer token.
        transfer_token: String,
        /// The shard that activated it.
        target_shard: String,
        /// The zone it activated into.
        target_zone: String,
    },
}

fn first_schema() -> u32 {
    1
}

fn is_first_schema(version: &u32) -> bool {
    *version == 1
}

/// The write a job performs.
#[derive(Debug, Clone, PartialEq)]
pub struct PersistenceRetryPayload {
    kind: String,
    character_id: Uuid,
    zone: Option<String>,
    core: Option<CoreWrite>,
    /// The encoded object (kind and character id included).
    encoded: serde_json::Value,
}

impl PersistenceRetryPayload {
    /// A whole state document of schema version 1 to write.
    pub fn gameplay_state(
        character_id: Uuid,
        state: serde_json::Value,
        zone_ref: Option<String>,
        room_ref: Option<String>,
    ) -> Self {
        Self::gameplay_state_at(character_id, state, 1, zone_ref, room_ref)
    }

    /// A whole state document of `schema_version` to write (a flush that could not land).
    pub fn gameplay_state_at(
        character_id: Uuid,
        state: serde_json::Value,
        schema_version: u32,
        zone_ref: Option<String>,
        room_ref: Option<String>,
    ) -> Self {
        Self::from_core(CoreWrite::GameplayState {
            character_id,
            state,
            zone_ref,
            room_ref,
            schema_version,
        })
    }

    /// A transfer activation to record.
    pub fn transfer_activation(
        character_id: Uuid,
        transfer_token: &str,
        target_shard: &str,
        target_zone: &str,
    ) -> Self {
        Self::from_core(CoreWrite::TransferActivation {
            character_id,
            transfer_token: transfer_token.to_owned(),
            target_shard: target_shard.to_owned(),
            target_zone: target_zone.to_owned(),
        })
    }

    fn from_core(core: CoreWrite) -> Self {
        let (character_id, zone) = match &core {
            CoreWrite::GameplayState {
                character_id,
                zone_ref,
                ..
            } => (*character_id, zone_ref.clone()),
            CoreWrite::TransferActivation {
                character_id,
                target_zone,
                ..
            } => (*character_id, Some(target_zone.clone())),
        };
        let encoded = serde_json::to_value(&core).unwrap_or(serde_json::Value::Null);
        let kind = match core {
            CoreWrite::GameplayState { .. } => GAMEPLAY_STATE,
            CoreWrite::TransferActivation { .. } => TRANSFER_ACTIVATION,
        };
        Self {
            kind: kind.to_owned(),
            character_id,
            zone,
            core: Some(core),
            encoded,
        }
    }

    /// A game effect for `character_id`. Refused when the effect is invalid, does not encode as
    /// an object tagged with its kind, takes a core kind's name, or is too large.
    pub fn effect<E: GameEffect>(character_id: Uuid, effect: &E) -> Result<Self, String> {
        effect.validate()?;
        let kind = effect.kind();
        check_kind(kind)?;
        if is_core_kind(kind) {
            return Err(format!("{kind:?} is a kind of shardkeep's own"));
        }
        let mut encoded = serde_json::to_value(effect).map_err(|e| e.to_string())?;
        let object = encoded
            .as_object_mut()
            .ok_or("an effect must encode as a JSON object")?;
        if object.get("kind").and_then(serde_json::Value::as_str) != Some(kind) {
            return Err(format!(
                "an effect must encode its kind {kind:?} in a kind field"
            ));
        }
        if object.contains_key("character_id") {
            return Err("an effect must not carry its own character_id field".into());
        }
        object.insert("character_id".into(), serde_json::json!(character_id));
        let zone = effect.zone().map(str::to_owned);
        if zone.as_deref().is_some_and(|z| z.len() > MAX_LABEL_BYTES) {
            return Err(format!("zone is longer than {MAX_LABEL_BYTES} bytes"));
        }
        let payload = Self {
            kind: kind.to_owned(),
            character_id,
            zone,
            core: None,
            encoded,
        };
        payload.check_size()?;
        Ok(payload)
    }

    /// Decodes a stored payload; `zone` is the job's stored zone (game kinds do not carry one
    /// the core can read).
    pub fn decode(encoded: serde_json::Value, zone: Option<String>) -> Result<Self, String> {
        let object = encoded.as_object().ok_or("payload is not a JSON object")?;
        let kind = object
            .get("kind")
            .and_then(serde_json::Value::as_str)
            .ok_or("payload has no kind")?
            .to_owned();
        check_kind(&kind)?;
        if is_core_kind(&kind) {
            let core: CoreWrite = serde_json::from_value(encoded).map_err(|e| e.to_string())?;
            let payload = Self::from_core(core);
            payload.check_core()?;
            return Ok(payload);
        }
        let character_id = object
            .get("character_id")
            .cloned()
            .ok_or("payload has no character_id")
            .and_then(|v| {
                serde_json::from_value::<Uuid>(v).map_err(|_| "character_id is not a UUID")
            })?;
        let payload = Self {
            kind,
            character_id,
            zone,
            core: None,
            encoded,
        };
        payload.check_size()?;
        Ok(payload)
    }

    /// The kind name (the `kind` field and the `job_kind` column).
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The character it applies to.
    pub fn character_id(&self) -> Uuid {
        self.character_id
    }

    /// The zone it concerns, when it names one.
    pub fn zone_id(&self) -> Option<&str> {
        self.zone.as_deref()
    }

    /// The core's own write, for the core's kinds.
    pub fn core(&self) -> Option<&CoreWrite> {
        self.core.as_ref()
    }

    /// True for a whole-document job.
    pub fn is_state(&self) -> bool {
        matches!(self.core, Some(CoreWrite::GameplayState { .. }))
    }

    /// The encoded object.
    pub fn encoded(&self) -> &serde_json::Value {
        &self.encoded
    }

    /// The game effect decoded as `E` (a reader's view; the worker goes through the model).
    pub fn game_effect<E: GameEffect>(&self) -> Result<E, String> {
        if self.core.is_some() {
            return Err(format!("{:?} is a kind of shardkeep's own", self.kind));
        }
        E::deserialize(&self.game_fields()).map_err(|e| e.to_string())
    }

    /// The encoded game effect without the character id the core added.
    pub(crate) fn game_fields(&self) -> serde_json::Value {
        let mut fields = self.encoded.clone();
        if let Some(object) = fields.as_object_mut() {
            object.remove("character_id");
        }
        fields
    }

    pub(crate) fn check_core(&self) -> Result<(), String> {
        let text = |what: &str, value: &str| {
            if value.trim().is_empty() {
                Err(format!("{what} must not be empty"))
            } else if value.len() > MAX_LABEL_BYTES {
                Err(format!("{what} is longer than {MAX_LABEL_BYTES} bytes"))
            } else {
                Ok(())
            }
        };
        match &self.core {
            Some(CoreWrite::GameplayState {
                state, zone_ref, ..
            }) => {
                if !state.is_object() {
                    return Err("state must be a JSON object".into());
                }
                zone_ref.as_deref().map_or(Ok(()), |z| text("zone_ref", z))
            }
            Some(CoreWrite::TransferActivation {
                transfer_token,
                target_shard,
                target_zone,
                ..
            }) => {
                text("transfer token", transfer_token)?;
                text("target shard", target_shard)?;
                text("target zone", target_zone)
            }
            None => Ok(()),
        }
    }

    fn check_size(&self) -> Result<(), String> {
        if crate::model::encoded_len(&self.encoded) > MAX_PAYLOAD_BYTES {
            return Err(format!("payload is larger than {MAX_PAYLOAD_BYTES} bytes"));
        }
        Ok(())
    }
}

fn is_core_kind(kind: &str) -> bool {
    kind == GAMEPLAY_STATE || kind == TRANSFER_ACTIVATION
}

fn check_kind(kind: &str) -> Result<(), String> {
    let valid = !kind.is_empty()
        && kind.len() <= MAX_KIND_BYTES
        && kind
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "kind {kind:?} must be 1 to {MAX_KIND_BYTES} lower-case letters, digits or _"
        ))
    }
}

impl Serialize for PersistenceRetryPayload {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.encoded.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for PersistenceRetryPayload {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let encoded = serde_json::Value::deserialize(deserializer)?;
        Self::decode(encoded, None).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
    enum Effect {
        Gold { amount: i64, zone: Option<String> },
        GameplayState { x: i64 },
        Untagged,
    }

    impl GameEffect for Effect {
        fn kind(&self) -> &'static str {
            match self {
                Self::Gold { .. } => "gold",
                Self::GameplayState { .. } => GAMEPLAY_STATE,
                Self::Untagged => "something_else",
            }
        }
        fn sets_value(&self) -> bool {
            false
        }
        fn zone(&self) -> Option<&str> {
            match self {
                Self::Gold { zone, .. } => zone.as_deref(),
                _ => None,
            }
        }
        fn validate(&self) -> Result<(), String> {
            match self {
                Self::Gold { amount, .. } if *amount < 0 => Err("negative".into()),
                _ => Ok(()),
            }
        }
    }

    #[test]
    fn a_first_version_state_job_reads_as_it_did_before_versions() {
        let id = Uuid::nil();
        let first =
            PersistenceRetryPayload::gameplay_state_at(id, json!({ "gold": 1 }), 1, None, None);
        let stored = serde_json::to_value(&first).unwrap();
        assert_eq!(
            stored,
            json!({ "kind": "gameplay_state", "character_id": id, "state": { "gold": 1 },
                    "zone_ref": null, "room_ref": null }),
            "the shape a worker built before versions decodes"
        );
        assert_eq!(
            PersistenceRetryPayload::decode(stored, None).unwrap(),
            first
        );
        let second =
            PersistenceRetryPayload::gameplay_state_at(id, json!({ "coins": 1 }), 2, None, None);
        let stored = serde_json::to_value(&second).unwrap();
        assert_eq!(stored["schema_version"], 2);
        assert_eq!(
            PersistenceRetryPayload::decode(stored, None).unwrap(),
            second
        );
    }

    #[test]
    fn a_game_effect_round_trips_flat_with_its_character() {
        let id = Uuid::now_v7();
        let effect = Effect::Gold {
            amount: 5,
            zone: Some("z1".into()),
        };
        let payload = PersistenceRetryPayload::effect(id, &effect).unwrap();
        assert_eq!(payload.kind(), "gold");
        assert_eq!(payload.zone_id(), Some("z1"));
        let encoded = serde_json::to_value(&payload).unwrap();
        assert_eq!(encoded["character_id"], json!(id));
        assert_eq!(encoded["amount"], 5);
        let back = PersistenceRetryPayload::decode(encoded, Some("z1".into())).unwrap();
        assert_eq!(back, payload);
        assert_eq!(back.game_effect::<Effect>().unwrap(), effect);
    }

    #[test]
    fn effects_that_break_the_envelope_are_refused() {
        let id = Uuid::nil();
        let negative = Effect::Gold {
            amount: -1,
            zone: None,
        };
        assert!(PersistenceRetryPayload::effect(id, &negative).is_err());
        let stolen = Effect::GameplayState { x: 1 };
        assert!(PersistenceRetryPayload::effect(id, &stolen).is_err());
        let mislabeled = Effect::Untagged;
        assert!(PersistenceRetryPayload::effect(id, &mislabeled).is_err());
    }

    #[test]
    fn core_kinds_decode_strictly_and_malformed_payloads_are_errors() {
        let id = Uuid::now_v7();
        let state = PersistenceRetryPayload::gameplay_state(id, json!({}), Some("z".into()), None);
        let back = PersistenceRetryPayload::decode(state.encoded().clone(), None).unwrap();
        assert_eq!(back, state);
        assert!(back.is_state());
        for bad in [
            json!("text"),
            json!({ "character_id": id }),
            json!({ "kind": "Gold!", "character_id": id }),
            json!({ "kind": "gold" }),
            json!({ "kind": "gold", "character_id": "not a uuid" }),
            json!({ "kind": "gameplay_state", "character_id": id, "state": {}, "zone_ref": null,
                    "room_ref": null, "extra": 1 }),
            json!({ "kind": "gameplay_state", "character_id": id, "state": [], "zone_ref": null,
                    "room_ref": null }),
            json!({ "kind": "transfer_activation", "character_id": id, "transfer_token": "",
                    "target_shard": "s", "target_zone": "z" }),
        ] {
            assert!(
                PersistenceRetryPayload::decode(bad.clone(), None).is_err(),
                "{bad} was accepted"
            );
        }
    }
}
