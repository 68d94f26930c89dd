//! What a cross-shard handoff carries: the snapshot, and the epoch of the copy that dumped it.
//! The destination adopts the carried content only while that copy still owns the row
//! ([`super::CharacterLoader::claim_for_handoff`]).

use serde::{Deserialize, Serialize};

use super::snapshot::CharacterSnapshot;

/// Largest encoded payload accepted.
pub const MAX_HANDOFF_PAYLOAD_BYTES: usize = 1024 * 1024;

/// The payload of a cross-shard handoff.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandoffPayload {
    /// The owner epoch of the copy that dumped `snapshot`.
    pub dumped_under_epoch: i64,
    /// The character as that copy left it, located at the destination.
    pub snapshot: CharacterSnapshot,
}

/// A handoff payload could not be read; nothing was claimed.
#[derive(Debug, thiserror::Error)]
pub enum HandoffPayloadError {
    /// Over [`MAX_HANDOFF_PAYLOAD_BYTES`].
    #[error("handoff payload is {0} bytes; at most {MAX_HANDOFF_PAYLOAD_BYTES} are accepted")]
    TooLarge(usize),
    /// Not a handoff payload.
    #[error("handoff payload does not decode: {0}")]
    Malformed(#[from] serde_json::Error),
    /// The stated epoch is not the snapshot's, or is negative.
    #[error(
        "handoff payload says it was dumped under epoch {stated}, its snapshot under {snapshot}"
    )]
    EpochMismatch {
        /// `dumped_under_epoch`.
        stated: i64,
        /// The snapshot's `owner_epoch`.
        snapshot: i64,
    },
}

impl HandoffPayload {
    /// The payload for `snapshot`, dumped by the copy at its `owner_epoch`.
    pub fn new(snapshot: CharacterSnapshot) -> Self {
        Self {
            dumped_under_epoch: snapshot.owner_epoch,
            snapshot,
        }
    }

    /// The bytes stored under the handoff token.
    pub fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }

    /// Reads stored bytes, checking that the stated epoch is the snapshot's own. A bare
    /// snapshot, as shards before this payload stored them, is read as dumped under its own
    /// `owner_epoch` (what that field always meant), so a rolling upgrade loses no handoff.
    pub fn decode(bytes: &[u8]) -> Result<Self, HandoffPayloadError> {
        if bytes.len() > MAX_HANDOFF_PAYLOAD_BYTES {
            return Err(HandoffPayloadError::TooLarge(bytes.len()));
        }
        let payload: Self = match serde_json::from_slice(bytes) {
            Ok(payload) => payload,
            Err(err) => match serde_json::from_slice::<CharacterSnapshot>(bytes) {
                Ok(snapshot) => Self::new(snapshot),
                Err(_) => return Err(err.into()),
            },
        };
        let (stated, snapshot) = (payload.dumped_under_epoch, payload.snapshot.owner_epoch);
        if stated != snapshot || stated < 0 {
            return Err(HandoffPayloadError::EpochMismatch { stated, snapshot });
        }
        Ok(payload)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use uuid::Uuid;

    use super::*;

    fn snapshot(epoch: i64) -> CharacterSnapshot {
        CharacterSnapshot {
            character_id: Uuid::from_u128(1),
            account_id: Uuid::from_u128(2),
            name: "Aria".into(),
            zone_ref: Some("zone-1".into()),
            room_ref: Some("r0".into()),
            state: json!({ "currency": 3 }).into(),
            chargen: None,
            state_version: 4,
            owner_epoch: epoch,
            issue_mark: 0,
            schema_version: 1,
        }
    }

    #[test]
    fn a_payload_round_trips_and_names_its_epoch() {
        let payload = HandoffPayload::new(snapshot(7));
        assert_eq!(payload.dumped_under_epoch, 7);
        let bytes = payload.encode().unwrap();
        assert_eq!(HandoffPayload::decode(&bytes).unwrap(), payload);
    }

    #[test]
    fn a_bare_snapshot_from_an_older_shard_reads_as_dumped_under_its_epoch() {
        let bare = serde_json::to_vec(&snapshot(7)).unwrap();
        let payload = HandoffPayload::decode(&bare).unwrap();
        assert_eq!(payload.dumped_under_epoch, 7);
        assert_eq!(payload.snapshot, snapshot(7));
    }

    #[test]
    fn malformed_payloads_are_typed_errors() {
        assert!(matches!(
            HandoffPayload::decode(b"{not json"),
            Err(HandoffPayloadError::Malformed(_))
        ));
        assert!(matches!(
            HandoffPayload::decode(br#"{"dumped_under_epoch": 1}"#),
            Err(HandoffPayloadError::Malformed(_))
        ));
        let mut lying = HandoffPayload::new(snapshot(7));
        lying.dumped_under_epoch = 8;
        assert!(matches!(
            HandoffPayload::decode(&lying.encode().unwrap()),
            Err(HandoffPayloadError::EpochMismatch {
                stated: 8,
                snapshot: 7
            })
        ));
        let huge = vec![b' '; MAX_HANDOFF_PAYLOAD_BYTES + 1];
        assert!(matches!(
            HandoffPayload::decode(&huge),
            Err(HandoffPayloadError::TooLarge(_))
        ));
    }
}
