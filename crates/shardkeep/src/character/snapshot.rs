//! The character snapshot — the one type every tier stores — and the pure rules that compare
//! snapshots.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Everything durable about one character, as one serde type.
///
/// The zone dumps it on its own thread; the saver writes it to Redis (whole) and Postgres
/// (columns plus the `state` document); a cross-shard handoff carries it over the wire. Adding a
/// field here threads it through every tier, and the drift-guard tests fail if a tier drops one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CharacterSnapshot {
    /// Stable character id.
    pub character_id: Uuid,
    /// Owning account.
    pub account_id: Uuid,
    /// Display name (unique without regard to case).
    pub name: String,
    /// Durable zone anchor; `None` keeps the stored one (an instance never overwrites it).
    pub zone_ref: Option<String>,
    /// Room inside `zone_ref`; ignored when `zone_ref` is `None`.
    pub room_ref: Option<String>,
    /// The game's state document, encoded once (see [`crate::model::GameModel::State`]).
    pub state: super::StateJson,
    /// Pending content-driven chargen input; `None` once applied.
    pub chargen: Option<serde_json::Value>,
    /// Contention token: the row version this snapshot was dumped at.
    pub state_version: i64,
    /// Ownership fence: the epoch of the copy that dumped it.
    pub owner_epoch: i64,
    /// The issue mark of the copy that dumped it: every reward and retry job that copy issued
    /// with a sequence up to this is already in `state`. A loaded copy starts again at 0 under
    /// its new epoch. (Absent in snapshots from before marks existed: 0.) It also orders one
    /// copy's dumps: of the saves of one copy a saver pass takes together, the one with the
    /// highest mark is written (the later queued on a tie), so a game feeding the saver itself
    /// gives each dump a mark at least that of the dump before, or every dump the same.
    #[serde(default)]
    pub issue_mark: u64,
    /// The game's schema version of `state` ([`crate::model::GameModel::SCHEMA_VERSION`]).
    /// (Absent in snapshots from before versions existed: 1. Left out when 1, so a process
    /// built before versions existed still reads a first-version snapshot mid-deploy.)
    #[serde(default = "first_schema", skip_serializing_if = "is_first_schema")]
    pub schema_version: u32,
}

fn first_schema() -> u32 {
    1
}

fn is_first_schema(version: &u32) -> bool {
    *version == 1
}

/// Where a content stands in the issue sequence of the copy that dumped it: that copy (at
/// `epoch`) had issued every reward and retry job up to `seq` when it dumped the content, so all
/// of them are in it. Rewards and jobs are applied in memory before they are stored, so a later
/// dump always holds an earlier issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct IssueMark {
    /// The owner epoch of the copy that dumped the content.
    pub epoch: i64,
    /// The last sequence that copy had issued.
    pub seq: u64,
}

impl IssueMark {
    /// True when the content already holds the write issued by the copy at `epoch` as `seq`
    /// (an unsequenced write, `seq` 0, is never known to be held).
    pub fn holds(&self, epoch: i64, seq: u64) -> bool {
        seq > 0 && self.epoch == epoch && seq <= self.seq
    }
}

/// How a compare-and-swap save ended. There is deliberately no `Default`: every variant demands
/// different handling, and none may be mistaken for success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveOutcome {
    /// Written; the row is now at this version.
    Saved(i64),
    /// Somebody wrote since this snapshot was dumped; the row is at this version.
    VersionConflict(i64),
    /// A newer owner claimed the character; the row's epoch is this. Terminal.
    OwnershipLost(i64),
    /// The row holds a document of a newer schema (this one) than the writer's: a process
    /// running an older model must not strip what it does not know. Terminal for the writer.
    SchemaOutdated(u32),
    /// No row with this id.
    NotFound,
}

/// Which copy a load should use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshest {
    /// The Postgres row.
    Row,
    /// The Redis checkpoint.
    Checkpoint,
}

/// Picks the fresher of a row and a checkpoint, from the row's owner epoch before the claim and
/// the version of its last live write, and the checkpoint's guard epoch and content version.
///
/// | checkpoint guard | rule |
/// | --- | --- |
/// | below the row's owner | the row: a claim fenced the checkpoint without taking it over, so a zombie may have written it after that claim |
/// | the row's owner | the checkpoint when dumped at or after the row's last live write (`version >= live`), else the row |
/// | above the row's owner | the checkpoint: a newer claim holds it |
///
/// A copy only learns a version once its write landed (or once it merged what landed since), so
/// a checkpoint dumped at or past the row's last live write holds newer live content; versions
/// that retry jobs or location writes added since do not count against it (their effects are
/// replayed on it). The guard is what lets a chain of owners that crashed before writing keep
/// the content they loaded: each claimant takes the checkpoint over at its load.
pub fn freshest(row_owner: i64, row_live_version: i64, checkpoint: (i64, i64)) -> Freshest {
    let (held_by, checkpoint_version) = checkpoint;
    if held_by != row_owner {
        return if held_by > row_owner {
            Freshest::Checkpoint
        } else {
            Freshest::Row
        };
    }
    if checkpoint_version >= row_live_version {
        Freshest::Checkpoint
    } else {
        Freshest::Row
    }
}

/// Decides a save's outcome from the row as locked by the save statement.
///
/// `row` is the locked row's `(version, epoch, schema)`, `None` when no row exists; `saved` is
/// the new version when the update applied; `writer` is the snapshot's `(epoch, schema)`. An
/// ownership loss outranks everything (a stale owner must learn it is stale rather than rebase),
/// then a newer schema (a rebase cannot cure an older model), then a version conflict.
pub fn classify_save(
    row: Option<(i64, i64, i32)>,
    saved: Option<i64>,
    (writer_epoch, writer_schema): (i64, i32),
) -> SaveOutcome {
    match (row, saved) {
        (_, Some(version)) => SaveOutcome::Saved(version),
        (None, None) => SaveOutcome::NotFound,
        (Some((_, epoch, _)), None) if epoch > writer_epoch => SaveOutcome::OwnershipLost(epoch),
        (Some((_, _, schema)), None) if schema > writer_schema => {
            SaveOutcome::SchemaOutdated(u32::try_from(schema).unwrap_or(u32::MAX))
        }
        (Some((version, _, _)), None) => SaveOutcome::VersionConflict(version),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tie_goes_to_the_checkpoint() {
        assert_eq!(freshest(3, 7, (3, 7)), Freshest::Checkpoint);
    }

    /// The snapshot as a build from before schema versions reads it.
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct BeforeVersions {
        character_id: Uuid,
        account_id: Uuid,
        name: String,
        zone_ref: Option<String>,
        room_ref: Option<String>,
        state: serde_json::Value,
        chargen: Option<serde_json::Value>,
        state_version: i64,
        owner_epoch: i64,
        #[serde(default)]
        issue_mark: u64,
    }

    #[test]
    fn a_first_version_snapshot_stays_readable_by_a_build_from_before_versions() {
        let mut snapshot = CharacterSnapshot {
            character_id: Uuid::nil(),
            account_id: Uuid::nil(),
            name: "Aria".into(),
            zone_ref: None,
            room_ref: None,
            state: serde_json::json!({ "gold": 1 }).into(),
            chargen: None,
            state_version: 3,
            owner_epoch: 2,
            issue_mark: 0,
            schema_version: 1,
        };
        let encoded = serde_json::to_string(&snapshot).unwrap();
        assert!(!encoded.contains("schema_version"), "{encoded}");
        serde_json::from_str::<BeforeVersions>(&encoded).unwrap();
        assert_eq!(
            serde_json::from_str::<CharacterSnapshot>(&encoded).unwrap(),
            snapshot
        );
        snapshot.schema_version = 2;
        let encoded = serde_json::to_string(&snapshot).unwrap();
        assert!(serde_json::from_str::<BeforeVersions>(&encoded).is_err());
        assert_eq!(
            serde_json::from_str::<CharacterSnapshot>(&encoded).unwrap(),
            snapshot
        );
    }

    #[test]
    fn a_newer_live_write_wins() {
        assert_eq!(freshest(3, 8, (3, 7)), Freshest::Row);
    }

    #[test]
    fn versions_added_by_jobs_do_not_outrank_newer_live_content() {
        // Live write at 7; two retry jobs took the row to 9; the checkpoint was dumped at 7.
        assert_eq!(freshest(3, 7, (3, 7)), Freshest::Checkpoint);
    }

    #[test]
    fn a_higher_checkpoint_version_wins() {
        assert_eq!(freshest(3, 7, (3, 8)), Freshest::Checkpoint);
    }

    #[test]
    fn a_stale_owners_checkpoint_loses_to_the_live_row_despite_a_higher_version() {
        assert_eq!(freshest(4, 2, (3, 50)), Freshest::Row);
    }

    #[test]
    fn a_newer_owners_checkpoint_beats_an_older_row() {
        assert_eq!(freshest(3, 9, (4, 1)), Freshest::Checkpoint);
    }

    #[test]
    fn a_checkpoint_taken_over_by_the_rows_owner_competes_on_versions() {
        // Copy 1 checkpointed at version 5; copy 2 claimed and took it over, then died. The
        // checkpoint's guard is the row's owner now, its content still copy 1's.
        assert_eq!(freshest(2, 5, (2, 5)), Freshest::Checkpoint);
        // A live write since (by copy 2) is newer.
        assert_eq!(freshest(2, 6, (2, 5)), Freshest::Row);
        // Fenced by copy 2's claim without a take-over: a zombie may have written it.
        assert_eq!(freshest(2, 5, (1, 9)), Freshest::Row);
    }

    #[test]
    fn save_outcomes_are_classified_ownership_then_schema_then_version() {
        assert_eq!(
            classify_save(Some((5, 2, 1)), Some(6), (2, 1)),
            SaveOutcome::Saved(6)
        );
        assert_eq!(classify_save(None, None, (2, 1)), SaveOutcome::NotFound);
        assert_eq!(
            classify_save(Some((5, 3, 2)), None, (2, 1)),
            SaveOutcome::OwnershipLost(3)
        );
        assert_eq!(
            classify_save(Some((5, 2, 2)), None, (2, 1)),
            SaveOutcome::SchemaOutdated(2)
        );
        assert_eq!(
            classify_save(Some((5, 2, 1)), None, (2, 2)),
            SaveOutcome::VersionConflict(5)
        );
        assert_eq!(
            classify_save(Some((5, 1, 1)), None, (2, 1)),
            SaveOutcome::VersionConflict(5)
        );
    }
}
