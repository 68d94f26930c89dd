//! Login-time load: claim the character, read the row and the checkpoint, and pick the freshest.
//!
//! Runs off the simulation thread. Fails closed: a character whose claim or row read fails gets no
//! session at all, never an ephemeral one. A checkpoint that cannot be read (Redis down, corrupt
//! value) only costs the crash-window shortening: the row is used.

use std::time::Duration;

use uuid::Uuid;

use super::checkpoint::CheckpointStore;
use super::handoff::HandoffPayload;
use super::snapshot::{CharacterSnapshot, Freshest, freshest};
use super::store::{CharacterStore, StoreError};
use crate::retry::apply::{RowState, replay_effects};

/// Why a character could not be loaded for a session.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The claim or the row read failed; the login must be refused.
    #[error("cannot claim or read character {character_id}: {source}")]
    Store {
        /// The character.
        character_id: Uuid,
        /// The failure.
        source: StoreError,
    },
    /// The claim or row read did not answer in time; the login must be refused.
    #[error("claiming character {0} timed out")]
    Timeout(Uuid),
    /// The character named in a lookup by name could not be read.
    #[error("looking up the character named {name:?}: {reason}")]
    NameLookup {
        /// The name asked for.
        name: String,
        /// What failed.
        reason: String,
    },
    /// A checkpoint asked for by name could not be read.
    #[error("reading the checkpoint of character {character_id}: {source}")]
    Checkpoint {
        /// The character.
        character_id: Uuid,
        /// The failure.
        source: super::checkpoint::CheckpointError,
    },
}

/// Where a loaded character's content came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadSource {
    /// The Postgres row.
    Row,
    /// The Redis checkpoint (fresher than, or tied with, the row).
    Checkpoint,
    /// The snapshot carried by a cross-shard handoff.
    Handoff,
}

/// A claimed character, ready to apply on the zone.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedCharacter {
    /// The freshest content, carrying the row's `state_version` (the CAS token) and the newly
    /// minted `owner_epoch`.
    pub snapshot: CharacterSnapshot,
    /// Where the content came from.
    pub source: LoadSource,
    /// True when the row had never been placed in a zone (a brand-new character).
    pub brand_new: bool,
}

/// How a handoff's claim loaded the character.
#[derive(Debug, Clone, PartialEq)]
pub enum HandoffLoad {
    /// The copy that dumped the carried snapshot still owned the row: its content is adopted.
    Adopted(LoadedCharacter),
    /// A newer owner had superseded the copy that dumped the carried snapshot: its content was
    /// refused, and the freshest durable copy (row or checkpoint) was loaded instead.
    Superseded {
        /// The epoch the carried snapshot was dumped under.
        dumped_under_epoch: i64,
        /// The row's owner epoch found by the claim (the copy that superseded it).
        owner_epoch: i64,
        /// The character as loaded from durable storage, under the new epoch.
        loaded: LoadedCharacter,
    },
}

impl HandoffLoad {
    /// The character to admit, whichever way it was loaded.
    pub fn into_loaded(self) -> LoadedCharacter {
        match self {
            Self::Adopted(loaded) | Self::Superseded { loaded, .. } => loaded,
        }
    }

    /// True when the carried content was refused.
    pub fn is_superseded(&self) -> bool {
        matches!(self, Self::Superseded { .. })
    }
}

/// Loads characters for sessions. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CharacterLoader {
    store: CharacterStore,
    checkpoints: Option<CheckpointStore>,
    io_timeout: Duration,
}

impl CharacterLoader {
    /// A loader over the store and, when configured, the checkpoint tier.
    pub fn new(
        store: CharacterStore,
        checkpoints: Option<CheckpointStore>,
        io_timeout: Duration,
    ) -> Self {
        Self {
            store,
            checkpoints,
            io_timeout,
        }
    }

    /// Claims `character_id` with the directory's epoch `floor`, then loads the freshest copy.
    pub async fn claim_and_load(
        &self,
        character_id: Uuid,
        floor: i64,
    ) -> Result<LoadedCharacter, LoadError> {
        let claimed = tokio::time::timeout(self.io_timeout, self.store.claim(character_id, floor))
            .await
            .map_err(|_| LoadError::Timeout(character_id))?
            .map_err(|source| LoadError::Store {
                character_id,
                source,
            })?;
        let row = claimed.row;
        let checkpoint = self.read_checkpoint(row.character_id).await;
        Ok(choose(
            row,
            claimed.live_version,
            checkpoint,
            claimed.new_epoch,
        ))
    }

    /// Claims a character arriving by cross-shard handoff `handoff_token`. When the copy that
    /// dumped the carried snapshot still owns the row, the carried snapshot is the content (it
    /// is newer than any durable copy): the row supplies the CAS token and the claim mints the
    /// destination's epoch. When a newer owner had superseded that copy (a zombie handed the
    /// player off), the carried content is refused and the freshest durable copy is loaded, as
    /// for a login; the answer says which happened.
    pub async fn claim_for_handoff(
        &self,
        carried: HandoffPayload,
        handoff_token: &str,
        floor: i64,
    ) -> Result<HandoffLoad, LoadError> {
        let character_id = carried.snapshot.character_id;
        let claim = tokio::time::timeout(
            self.io_timeout,
            self.store.claim_for_handoff(
                character_id,
                floor,
                carried.dumped_under_epoch,
                handoff_token,
            ),
        )
        .await
        .map_err(|_| LoadError::Timeout(character_id))?
        .map_err(|source| LoadError::Store {
            character_id,
            source,
        })?;
        let claimed = claim.claimed;
        if !claim.adopted {
            let owner_epoch = claimed.row.owner_epoch;
            tracing::warn!(event = "handoff_superseded", character = %character_id,
                dumped_under_epoch = carried.dumped_under_epoch, owner_epoch,
                "a superseded copy's handoff was refused; loading the freshest durable copy");
            metrics::counter!(crate::telemetry::HANDOFF_SUPERSEDED_TOTAL).increment(1);
            let checkpoint = self.read_checkpoint(character_id).await;
            return Ok(HandoffLoad::Superseded {
                dumped_under_epoch: carried.dumped_under_epoch,
                owner_epoch,
                loaded: choose(
                    claimed.row,
                    claimed.live_version,
                    checkpoint,
                    claimed.new_epoch,
                ),
            });
        }
        let snapshot = CharacterSnapshot {
            state_version: claimed.row.state_version,
            owner_epoch: claimed.new_epoch,
            account_id: claimed.row.account_id,
            name: claimed.row.name,
            ..carried.snapshot
        };
        Ok(HandoffLoad::Adopted(LoadedCharacter {
            snapshot,
            source: LoadSource::Handoff,
            brand_new: false,
        }))
    }

    /// The checkpoint of the character named `name` (any case), looked up the way names are
    /// unique: the character store resolves the name to its row, whose id keys the checkpoint.
    /// `None` when no character has the name or it has no checkpoint.
    pub async fn checkpoint_by_name(
        &self,
        name: &str,
    ) -> Result<Option<CharacterSnapshot>, LoadError> {
        let Some(checkpoints) = &self.checkpoints else {
            return Ok(None);
        };
        let lookup = |reason: String| LoadError::NameLookup {
            name: name.to_owned(),
            reason,
        };
        let row = tokio::time::timeout(self.io_timeout, self.store.load_by_name(name))
            .await
            .map_err(|_| lookup("timed out".into()))?
            .map_err(|e| lookup(e.to_string()))?;
        let Some(row) = row else {
            return Ok(None);
        };
        tokio::time::timeout(self.io_timeout, checkpoints.read(row.character_id))
            .await
            .map_err(|_| LoadError::Timeout(row.character_id))?
            .map_err(|err| LoadError::Checkpoint {
                character_id: row.character_id,
                source: err,
            })
    }

    async fn read_checkpoint(&self, character_id: Uuid) -> Option<CharacterSnapshot> {
        let checkpoints = self.checkpoints.as_ref()?;
        match tokio::time::timeout(self.io_timeout, checkpoints.read(character_id)).await {
            Ok(Ok(found)) => found,
            Ok(Err(err)) => {
                tracing::warn!(event = "checkpoint_read_failed", character = %character_id, error = %err,
                    "loading from the row");
                metrics::counter!(crate::telemetry::CHECKPOINT_READ_FAILURES_TOTAL).increment(1);
                None
            }
            Err(_) => {
                tracing::warn!(
                    event = "checkpoint_read_failed",
                    character = %character_id,
                    error = "timeout",
                    "loading from the row"
                );
                metrics::counter!(crate::telemetry::CHECKPOINT_READ_FAILURES_TOTAL).increment(1);
                None
            }
        }
    }
}

/// Combines the row (with its pre-claim epoch and the version of its last live write) and an
/// optional checkpoint into the snapshot a session starts from. Identity always comes from the
/// row; so does the CAS token. When the checkpoint wins, the retry-job effects the row took since
/// its last live write are replayed on it, so neither the checkpoint's newer content nor a
/// durable job's effect is lost.
pub fn choose(
    row: CharacterSnapshot,
    row_live_version: i64,
    checkpoint: Option<CharacterSnapshot>,
    new_epoch: i64,
) -> LoadedCharacter {
    let brand_new = row.zone_ref.is_none();
    let pick = checkpoint
        .filter(|c| c.character_id == row.character_id)
        .map(|c| {
            let which = freshest(
                (row.owner_epoch, row.state_version),
                row_live_version,
                (c.owner_epoch, c.state_version),
            );
            (which, c)
        });
    let (source, mut snapshot) = match pick {
        Some((Freshest::Checkpoint, c)) => {
            let mut s = c;
            if s.zone_ref.is_none() {
                // The checkpoint was dumped inside an instance; the durable anchor stands.
                s.zone_ref = row.zone_ref.clone();
                s.room_ref = row.room_ref.clone();
            }
            if s.owner_epoch == row.owner_epoch {
                let mut merged = RowState {
                    state: s.state,
                    zone_ref: s.zone_ref,
                    room_ref: s.room_ref,
                };
                replay_effects(&mut merged, &row.state);
                s.state = merged.state;
                s.zone_ref = merged.zone_ref;
                s.room_ref = merged.room_ref;
            }
            s.account_id = row.account_id;
            s.name = row.name.clone();
            (LoadSource::Checkpoint, s)
        }
        _ => (LoadSource::Row, row.clone()),
    };
    snapshot.state_version = row.state_version;
    snapshot.owner_epoch = new_epoch;
    LoadedCharacter {
        snapshot,
        source,
        brand_new,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(epoch: i64, version: i64, zone: Option<&str>, marker: &str) -> CharacterSnapshot {
        CharacterSnapshot {
            character_id: Uuid::nil(),
            account_id: Uuid::nil(),
            name: "Aria".into(),
            zone_ref: zone.map(str::to_owned),
            room_ref: zone.map(|_| "r1".to_owned()),
            state: serde_json::json!({ "marker": marker }),
            chargen: None,
            state_version: version,
            owner_epoch: epoch,
        }
    }

    #[test]
    fn checkpoint_content_at_a_tie_with_the_rows_token_and_new_epoch() {
        let loaded = choose(
            snap(3, 7, Some("a"), "row"),
            7,
            Some(snap(3, 7, Some("b"), "ckpt")),
            4,
        );
        assert_eq!(loaded.source, LoadSource::Checkpoint);
        assert_eq!(loaded.snapshot.state["marker"], "ckpt");
        assert_eq!(loaded.snapshot.zone_ref.as_deref(), Some("b"));
        assert_eq!(
            (loaded.snapshot.state_version, loaded.snapshot.owner_epoch),
            (7, 4)
        );
    }

    #[test]
    fn a_stale_owners_checkpoint_never_outranks_the_row() {
        let loaded = choose(
            snap(5, 2, Some("a"), "row"),
            2,
            Some(snap(4, 40, Some("b"), "zombie")),
            6,
        );
        assert_eq!(loaded.source, LoadSource::Row);
        assert_eq!(loaded.snapshot.state["marker"], "row");
        assert_eq!(
            (loaded.snapshot.state_version, loaded.snapshot.owner_epoch),
            (2, 6)
        );
    }

    #[test]
    fn an_instance_checkpoint_keeps_the_rows_anchor() {
        let loaded = choose(
            snap(3, 7, Some("a"), "row"),
            7,
            Some(snap(3, 7, None, "ckpt")),
            4,
        );
        assert_eq!(loaded.snapshot.state["marker"], "ckpt");
        assert_eq!(loaded.snapshot.zone_ref.as_deref(), Some("a"));
    }

    #[test]
    fn no_checkpoint_means_the_row() {
        let loaded = choose(snap(1, 1, None, "row"), 1, None, 2);
        assert_eq!(loaded.source, LoadSource::Row);
        assert!(loaded.brand_new);
    }

    #[test]
    fn a_newer_checkpoint_gets_the_rows_later_job_effects_replayed() {
        use crate::retry::PersistenceRetryPayload;
        // Live write at 7 with 10 xp; a reward job then took the row to 8 with 35 xp; the
        // checkpoint, dumped at 7 after the live copy gained an item, wins and gets the reward.
        let reward = PersistenceRetryPayload::CombatRewards {
            character_id: Uuid::nil(),
            experience: 25,
            currency: 2,
            items: vec![],
        };
        let mut row = snap(3, 8, Some("a"), "row");
        row.state = serde_json::json!({
            "experience": 35, "currency": 2, "reward_keys": ["k1"],
            "job_effects": [{ "key": "k1", "payload": reward }],
        });
        let mut checkpoint = snap(3, 7, Some("a"), "ckpt");
        checkpoint.state = serde_json::json!({
            "experience": 10, "inventory": [{ "proto": "gem" }],
        });
        let loaded = choose(row.clone(), 7, Some(checkpoint.clone()), 4);
        assert_eq!(loaded.source, LoadSource::Checkpoint);
        assert_eq!(loaded.snapshot.state["experience"], 35);
        assert_eq!(loaded.snapshot.state["currency"], 2);
        assert_eq!(loaded.snapshot.state["inventory"][0]["proto"], "gem");
        assert_eq!(loaded.snapshot.state_version, 8, "the row's CAS token");
        // A checkpoint that already holds the grant gets nothing twice.
        checkpoint.state = serde_json::json!({ "experience": 35, "reward_keys": ["k1"] });
        let loaded = choose(row.clone(), 7, Some(checkpoint), 4);
        assert_eq!(loaded.snapshot.state["experience"], 35);
        // A live write after the checkpoint's dump wins outright.
        let loaded = choose(row, 8, Some(snap(3, 7, Some("a"), "ckpt")), 4);
        assert_eq!(loaded.source, LoadSource::Row);
    }
}
