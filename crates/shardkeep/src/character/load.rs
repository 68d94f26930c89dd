//! Login-time load: claim the character, read the row and the checkpoint, and pick the freshest.
//!
//! Runs off the simulation thread. Fails closed: a character whose claim or row read fails gets no
//! session at all, never an ephemeral one. A checkpoint that cannot be read (Redis down, corrupt
//! value) only costs the crash-window shortening: the row is used.

use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use super::checkpoint::{CheckpointStore, CheckpointWrite, HeldCheckpoint};
use super::claim_batch::ClaimDue;
use super::handoff::HandoffPayload;
use super::snapshot::{CharacterSnapshot, Freshest, freshest};
use super::store::{CharacterStore, ClaimedRow, HandoffClaim, StoreError};
use crate::model::ModelHandle;
use crate::retry::apply::{RecordedEffect, RowState, apply_payload, lists_legacy_reward_key};

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
    /// The content is of a newer schema than this process's model, or could not be upgraded
    /// to it; the login must be refused.
    #[error("character {character_id}: {source}")]
    Schema {
        /// The character.
        character_id: Uuid,
        /// What was wrong.
        source: crate::model::UpgradeError,
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
    /// Which copy's content it is, and which of that copy's writes it holds.
    pub origin: ContentOrigin,
}

/// The copy whose dump a loaded content is, and which issued writes it holds: every one that
/// copy issued up to `mark`, and those in `beyond_mark` (durable jobs applied to the row since,
/// or replayed on a checkpoint), by issuing epoch and sequence. Checks and diagnostics read it;
/// the session does not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContentOrigin {
    /// The owner epoch of the copy that dumped the content (0: no copy ever wrote it).
    pub epoch: i64,
    /// That copy's issue mark in the content.
    pub mark: u64,
    /// Sequenced writes the content holds past the mark: `(issuing epoch, sequence)`.
    pub beyond_mark: Vec<(i64, u64)>,
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
    model: ModelHandle,
    io_timeout: Duration,
}

impl CharacterLoader {
    /// A loader over the store and, when configured, the checkpoint tier, replaying the game's
    /// effects through `model`.
    pub fn new(
        store: CharacterStore,
        checkpoints: Option<CheckpointStore>,
        model: ModelHandle,
        io_timeout: Duration,
    ) -> Self {
        Self {
            store: store.for_model(model.clone()),
            checkpoints,
            model,
            io_timeout,
        }
    }

    /// Claims `character_id` with the directory's epoch `floor`, then loads the freshest copy.
    ///
    /// A caller that gives up waiting (its own timeout, a dropped connection) cannot leave a
    /// claim committed without its take-over, which would fence the checkpoint unread and send
    /// the next login to the older row. Most claims are made in a claim batch's own task, and a
    /// committed claim owes its take-over until this call has made it (its `Owed`): a claim whose
    /// caller has gone, wherever it stopped, gets its take-over in a task of its own. A claim
    /// that must go the careful way runs, with what follows it, in a task of its own.
    pub async fn claim_and_load(
        &self,
        character_id: Uuid,
        floor: i64,
    ) -> Result<LoadedCharacter, LoadError> {
        let store_error = |source| LoadError::Store {
            character_id,
            source,
        };
        let batched = tokio::time::timeout(
            self.io_timeout,
            self.store
                .claim_batched(character_id, floor, None, self.take_over_due(character_id)),
        )
        .await
        .map_err(|_| LoadError::Timeout(character_id))?
        .map_err(store_error)?;
        let Some((claim, owed)) = batched else {
            let loader = self.clone();
            let task =
                tokio::spawn(
                    async move { loader.claim_carefully_and_load(character_id, floor).await },
                );
            return match tokio::time::timeout(self.io_timeout * 3, task).await {
                Ok(Ok(loaded)) => loaded,
                Ok(Err(_)) | Err(_) => Err(LoadError::Timeout(character_id)),
            };
        };
        let claimed = claim.claimed;
        let checkpoint = self.take_over(character_id, claimed.new_epoch).await;
        owed.settled();
        self.loaded_from(claimed, checkpoint).await
    }

    /// The careful claim (alone: it settles queued jobs and waits for a held row lock), then
    /// the take-over and the load, in the task the caller waits on (for three I/O bounds; the
    /// task goes on after a caller that gave up, and a claim it commits then is taken over and
    /// loaded for no one). Each statement and idle wait of the claim is bounded in Postgres by
    /// the I/O bound, so a claim that must give up is rolled back there rather than dropped here:
    /// a claim dropped while its commit is on its way may commit without its take-over. The
    /// commit itself is not bounded by Postgres (deferred triggers, a synchronous standby), nor
    /// is a long settle of many queued jobs as a whole: a claim still unanswered after
    /// [`CAREFUL_LAST_RESORT`] bounds is given up, and one committing after that takes nothing
    /// over (the next login loads the row).
    async fn claim_carefully_and_load(
        &self,
        character_id: Uuid,
        floor: i64,
    ) -> Result<LoadedCharacter, LoadError> {
        let claimed = tokio::time::timeout(
            self.io_timeout * CAREFUL_LAST_RESORT,
            self.store
                .claim_careful(character_id, floor, None, Some(self.io_timeout)),
        )
        .await
        .map_err(|_| LoadError::Timeout(character_id))?
        .map_err(|source| LoadError::Store {
            character_id,
            source,
        })?
        .claimed;
        let checkpoint = self.take_over(character_id, claimed.new_epoch).await;
        self.loaded_from(claimed, checkpoint).await
    }

    /// The freshest content of a claimed row and its taken-over checkpoint, at the model's
    /// schema, with its items recorded as loaded under the new epoch.
    async fn loaded_from(
        &self,
        claimed: ClaimedRow,
        checkpoint: Option<HeldCheckpoint>,
    ) -> Result<LoadedCharacter, LoadError> {
        let loaded = self.upgraded(self.chosen(claimed, checkpoint).await?)?;
        self.record_item_loads(&loaded).await;
        Ok(loaded)
    }

    /// What a claim of `character_id` owes if its caller goes before taking the checkpoint
    /// over: the take-over, in a task of its own. `None` without a checkpoint tier.
    fn take_over_due(&self, character_id: Uuid) -> Option<ClaimDue> {
        let checkpoints = self.checkpoints.clone()?;
        let io_timeout = self.io_timeout;
        Some(Arc::new(move |claimant| {
            let checkpoints = checkpoints.clone();
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn(async move {
                        take_over_within(&checkpoints, character_id, claimant, io_timeout).await
                    });
                }
                Err(_) => tracing::warn!(event = "take_over_abandoned", character = %character_id,
                    claimant, "no runtime to take the checkpoint over after its caller went"),
            }
        }))
    }

    /// [`choose`], reading first, when the checkpoint wins only by its mark (see
    /// [`dumped_after_the_rows_content`]), the items transfer commits took from the character:
    /// a transfer that took an item from a copy that had died writes its row as a live write (so
    /// its checkpoints lose to it on versions), and a checkpoint that wins on its mark must not
    /// bring that item back.
    ///
    /// Such a checkpoint also takes the unsequenced effects (offline grants) recorded past its
    /// own version, which the claim read only past the row's last live write: a departed
    /// releaser's commit moves that mark past grants the checkpoint never held.
    async fn chosen(
        &self,
        mut claimed: ClaimedRow,
        checkpoint: Option<HeldCheckpoint>,
    ) -> Result<LoadedCharacter, LoadError> {
        let character_id = claimed.row.character_id;
        let Some(checkpoint_version) = checkpoint
            .as_ref()
            .filter(|c| wins_by_mark(&claimed, Some(c)))
            .map(|c| c.snapshot.state_version)
        else {
            return Ok(choose(&self.model, claimed, checkpoint));
        };
        let store_error = |source| LoadError::Store {
            character_id,
            source,
        };
        let (released, landed) = tokio::time::timeout(self.io_timeout, async {
            tokio::try_join!(
                self.store.released_items(character_id),
                self.store
                    .effects_applied_since(character_id, checkpoint_version)
            )
        })
        .await
        .map_err(|_| LoadError::Timeout(character_id))?
        .map_err(store_error)?;
        let live_version = claimed.live_version;
        let mut effects: Vec<RecordedEffect> = landed
            .into_iter()
            .filter(|e| e.issue_seq == 0 && e.row_version <= live_version)
            .collect();
        effects.append(&mut claimed.effects);
        claimed.effects = effects;
        Ok(choose_leaving_out(
            &self.model,
            claimed,
            checkpoint,
            &released,
        ))
    }

    /// Brings the loaded content to the model's schema version; refuses content newer than the
    /// model (this process must not play it and save it back without what it does not know).
    fn upgraded(&self, mut loaded: LoadedCharacter) -> Result<LoadedCharacter, LoadError> {
        let snapshot = &mut loaded.snapshot;
        let current = self.model.schema_version();
        if snapshot.schema_version != current {
            let state = snapshot
                .state
                .try_to_value()
                .map_err(|err| LoadError::Schema {
                    character_id: snapshot.character_id,
                    source: crate::model::UpgradeError::Failed {
                        from: snapshot.schema_version,
                        reason: format!("the state document is not a JSON tree: {err}"),
                    },
                })?;
            snapshot.state = self
                .model
                .upgrade(snapshot.schema_version, state)
                .map_err(|source| LoadError::Schema {
                    character_id: snapshot.character_id,
                    source,
                })?
                .into();
            snapshot.schema_version = current;
        }
        Ok(loaded)
    }

    /// Writes the loaded content's items to the item-load ledger under the new epoch before the
    /// copy goes live, trying up to three times within the I/O bound. If it still fails the load
    /// goes on (logged, counted): the claim already minted the new epoch, and refusing now would
    /// make the retry's claim bury a fresher checkpoint under it. What the ledger then misses is
    /// the refusal of a phantom of one of this copy's items.
    async fn record_item_loads(&self, loaded: &LoadedCharacter) {
        let character_id = loaded.snapshot.character_id;
        let epoch = loaded.snapshot.owner_epoch;
        let items = self.model.held_items_in(&loaded.snapshot.state);
        if items.is_empty() {
            return;
        }
        let deadline = tokio::time::Instant::now() + self.io_timeout;
        let mut last = String::new();
        for _ in 0..3 {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(
                left,
                self.store.record_item_loads(character_id, epoch, &items),
            )
            .await
            {
                Ok(Ok(())) => return,
                Ok(Err(err)) => last = err.to_string(),
                Err(_) => {
                    last = "timed out".into();
                    break;
                }
            }
        }
        tracing::warn!(event = "item_loads_unrecorded", character = %character_id, epoch,
            error = %last, "loading without the item-load ledger entries");
        metrics::counter!(crate::telemetry::ITEM_LOADS_UNRECORDED_TOTAL).increment(1);
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
        // As for a login: the claim and what follows it run in a task the caller cannot cancel.
        let loader = self.clone();
        let token = handoff_token.to_owned();
        let character_id = carried.snapshot.character_id;
        let task =
            tokio::spawn(
                async move { loader.claim_for_handoff_here(carried, &token, floor).await },
            );
        match tokio::time::timeout(self.io_timeout * 3, task).await {
            Ok(Ok(loaded)) => loaded,
            Ok(Err(_)) | Err(_) => Err(LoadError::Timeout(character_id)),
        }
    }

    async fn claim_for_handoff_here(
        &self,
        carried: HandoffPayload,
        handoff_token: &str,
        floor: i64,
    ) -> Result<HandoffLoad, LoadError> {
        let character_id = carried.snapshot.character_id;
        // A batched claim that commits after its caller gave up still owes its take-over (paid
        // by a task of its own): the checkpoint is not left fenced unread. (It keeps the
        // source's last checkpoint, not the carried content, which only this call stores.) A
        // careful one is bounded in Postgres and run to its end here, as a login's is.
        let (claim, owed) = tokio::time::timeout(
            self.io_timeout * CAREFUL_LAST_RESORT,
            self.store.claim_for_handoff_owing(
                character_id,
                floor,
                carried.dumped_under_epoch,
                handoff_token,
                self.take_over_due(character_id),
                Some(self.io_timeout),
            ),
        )
        .await
        .map_err(|_| LoadError::Timeout(character_id))?
        .map_err(|source| LoadError::Store {
            character_id,
            source,
        })?;
        let loaded = self.arrived(carried, claim).await;
        if let Some(owed) = owed {
            owed.settled();
        }
        loaded
    }

    /// A handoff's claim made: the carried content adopted and stored as the checkpoint, or,
    /// superseded, the checkpoint taken over and the freshest durable copy loaded.
    async fn arrived(
        &self,
        carried: HandoffPayload,
        claim: HandoffClaim,
    ) -> Result<HandoffLoad, LoadError> {
        let character_id = carried.snapshot.character_id;
        let claimed = claim.claimed;
        if !claim.adopted {
            let owner_epoch = claimed.row.owner_epoch;
            tracing::warn!(event = "handoff_superseded", character = %character_id,
                dumped_under_epoch = carried.dumped_under_epoch, owner_epoch,
                "a superseded copy's handoff was refused; loading the freshest durable copy");
            metrics::counter!(crate::telemetry::HANDOFF_SUPERSEDED_TOTAL).increment(1);
            let checkpoint = self.take_over(character_id, claimed.new_epoch).await;
            let loaded = self.upgraded(self.chosen(claimed, checkpoint).await?)?;
            self.record_item_loads(&loaded).await;
            return Ok(HandoffLoad::Superseded {
                dumped_under_epoch: carried.dumped_under_epoch,
                owner_epoch,
                loaded,
            });
        }
        // What landed on the row after the carried dump (an offline grant, a requeued job) is
        // played on it, so the adopted copy holds everything up to the row's version; the
        // result is stored as the checkpoint at that version under the destination's claim.
        let (content, origin) = match replay_missing(
            &self.model,
            carried.snapshot.clone(),
            &claimed.effects,
            claimed.live_version.max(carried.snapshot.state_version),
        ) {
            Ok(replayed) => replayed,
            Err(err) => {
                tracing::warn!(event = "handoff_unmerged", character = %character_id,
                    error = %err, "the carried content goes without what landed after its dump");
                let origin = ContentOrigin {
                    epoch: carried.snapshot.owner_epoch,
                    mark: carried.snapshot.issue_mark,
                    beyond_mark: Vec::new(),
                };
                (carried.snapshot, origin)
            }
        };
        let kept = CharacterSnapshot {
            state_version: claimed.row.state_version,
            ..content.clone()
        };
        self.keep_adopted(&kept, claimed.new_epoch).await;
        let snapshot = CharacterSnapshot {
            state_version: claimed.row.state_version,
            owner_epoch: claimed.new_epoch,
            account_id: claimed.row.account_id,
            name: claimed.row.name,
            issue_mark: 0,
            ..content
        };
        let loaded = self.upgraded(LoadedCharacter {
            snapshot,
            source: LoadSource::Handoff,
            brand_new: false,
            origin,
        })?;
        self.record_item_loads(&loaded).await;
        Ok(HandoffLoad::Adopted(loaded))
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

    /// The checkpoint, taken over for the claim that minted `claimant` (see
    /// [`take_over_within`]); `None` without a checkpoint tier.
    async fn take_over(&self, character_id: Uuid, claimant: i64) -> Option<HeldCheckpoint> {
        let checkpoints = self.checkpoints.as_ref()?;
        take_over_within(checkpoints, character_id, claimant, self.io_timeout).await
    }

    /// Stores a handoff's adopted content as the checkpoint, under the destination's claim: the
    /// carried snapshot lives nowhere else once its handoff was taken, so a destination that
    /// dies before its first write would otherwise leave the next login an older copy. A
    /// failure is logged: the content then lives in this copy alone until its first checkpoint.
    async fn keep_adopted(&self, carried: &CharacterSnapshot, claimant: i64) {
        let Some(checkpoints) = &self.checkpoints else {
            return;
        };
        let kept =
            tokio::time::timeout(self.io_timeout, checkpoints.write_held(carried, claimant)).await;
        match kept {
            Ok(Ok(CheckpointWrite::Written)) => {}
            Ok(Ok(refused)) => {
                tracing::warn!(event = "handoff_content_unkept", character = %carried.character_id,
                    ?refused, "a newer owner holds the checkpoint");
            }
            Ok(Err(err)) => {
                tracing::warn!(event = "handoff_content_unkept", character = %carried.character_id,
                    error = %err, "the adopted content is in this copy only until its checkpoint");
            }
            Err(_) => {
                tracing::warn!(event = "handoff_content_unkept", character = %carried.character_id,
                    error = "timeout", "the adopted content is in this copy only until its checkpoint");
            }
        }
    }
}

/// Plays on `content` (a checkpoint or a handoff's carried snapshot, dumped by the copy its
/// `owner_epoch` names with its `issue_mark`) the job effects it does not hold: sequenced ones
/// issued after its dump — past its mark by that copy, or by any later copy of the chain — and
/// unsequenced ones applied past both the row's last live write and the content's own version.
/// Only content missing effects is decoded and encoded again; one whose document cannot be read
/// as a tree cannot take them (the error says why). Returns the content and its origin.
fn replay_missing(
    model: &ModelHandle,
    mut content: CharacterSnapshot,
    effects: &[RecordedEffect],
    holds_through: i64,
) -> Result<(CharacterSnapshot, ContentOrigin), serde_json::Error> {
    let mut origin = ContentOrigin {
        epoch: content.owner_epoch,
        mark: content.issue_mark,
        beyond_mark: Vec::new(),
    };
    // Content dumped before shardkeep's bookkeeping left the document still lists the rewards
    // it holds: an unsequenced grant it names is not granted again.
    let newer: Vec<&RecordedEffect> = effects
        .iter()
        .filter(|e| {
            if e.issue_seq == 0 {
                e.row_version > holds_through
                    && !lists_legacy_reward_key(content.state.value(), &e.key)
            } else {
                e.owner_epoch > origin.epoch
                    || (e.owner_epoch == origin.epoch && e.issue_seq > origin.mark)
            }
        })
        .collect();
    if newer.is_empty() {
        return Ok((content, origin));
    }
    let tree = content.state.try_to_value()?;
    let mut merged = RowState {
        state: tree,
        zone_ref: content.zone_ref,
        room_ref: content.room_ref,
        schema_version: content.schema_version,
    };
    for effect in newer {
        if apply_payload(model, &mut merged, &effect.payload).is_ok() && effect.issue_seq > 0 {
            origin
                .beyond_mark
                .push((effect.owner_epoch, effect.issue_seq));
        }
    }
    content.state = merged.state.into();
    content.zone_ref = merged.zone_ref;
    content.room_ref = merged.room_ref;
    content.schema_version = merged.schema_version;
    Ok((content, origin))
}

/// How many I/O bounds a careful claim may take before it is given up on the client. Postgres
/// bounds each of its statements and idle waits by one I/O bound, not its commit nor the whole
/// claim: a claim given up here whose commit lands later takes nothing over.
const CAREFUL_LAST_RESORT: u32 = 8;

/// The checkpoint, taken over for the claim that minted `claimant` (see
/// [`CheckpointStore::take_over`]), within `io_timeout`. One that cannot be read (Redis down, a
/// corrupt value) only costs the crash-window shortening: the row is used.
async fn take_over_within(
    checkpoints: &CheckpointStore,
    character_id: Uuid,
    claimant: i64,
    io_timeout: Duration,
) -> Option<HeldCheckpoint> {
    // Tried again within the I/O bound: a take-over whose reply was lost may have raised
    // the guard already, and loading the row then would let this copy's checkpoints bury
    // the content the guard kept. A repeat is safe: it answers the guard the first one found.
    let deadline = tokio::time::Instant::now() + io_timeout;
    let mut last = String::new();
    for _ in 0..3 {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, checkpoints.take_over(character_id, claimant)).await {
            Ok(Ok(found)) => return found,
            // A corrupt value is no outage: trying again finds it the same.
            Ok(Err(err @ super::checkpoint::CheckpointError::Corrupt { .. })) => {
                last = err.to_string();
                break;
            }
            Ok(Err(err)) => last = err.to_string(),
            Err(_) => {
                last = "timeout".into();
                break;
            }
        }
    }
    tracing::warn!(event = "checkpoint_read_failed", character = %character_id, error = %last,
        "loading from the row");
    metrics::counter!(crate::telemetry::CHECKPOINT_READ_FAILURES_TOTAL).increment(1);
    None
}

/// True when the checkpoint would lose to the row on versions but wins on its mark.
fn wins_by_mark(claimed: &ClaimedRow, checkpoint: Option<&HeldCheckpoint>) -> bool {
    checkpoint.is_some_and(|c| {
        c.snapshot.character_id == claimed.row.character_id
            && freshest(
                claimed.row.owner_epoch,
                claimed.live_version,
                (c.held_by, c.snapshot.state_version),
            ) == Freshest::Row
            && dumped_after_the_rows_content(c, claimed.row.owner_epoch, claimed.content_mark)
    })
}

/// True when `checkpoint`, held by the row's owner, was dumped by the copy whose content the row
/// holds after that content (a higher issue mark): its copy checkpointed while its older flush
/// was still on its way, and the flush landed at a version past the checkpoint's. Versions
/// cannot order the two (both were dumped at the version the copy knew); the copy's issue
/// sequence does, and the checkpoint's newer content must not lose to the row.
fn dumped_after_the_rows_content(
    checkpoint: &HeldCheckpoint,
    row_owner: i64,
    row_content: crate::character::IssueMark,
) -> bool {
    checkpoint.held_by == row_owner
        && checkpoint.snapshot.owner_epoch == row_content.epoch
        && checkpoint.snapshot.issue_mark > row_content.seq
}

/// `content` without the items of `released` it holds.
fn leave_out(
    model: &ModelHandle,
    mut content: CharacterSnapshot,
    released: &[Uuid],
) -> Result<CharacterSnapshot, serde_json::Error> {
    if released.is_empty() {
        return Ok(content);
    }
    let held = model.held_items(&content.state.try_to_value()?);
    let gone: Vec<&Uuid> = released.iter().filter(|i| held.contains(i)).collect();
    if gone.is_empty() {
        return Ok(content);
    }
    let mut tree = content.state.try_to_value()?;
    for item in gone {
        let _ = model.take_item(&mut tree, *item);
    }
    content.state = tree.into();
    Ok(content)
}

/// Combines a claimed row (with its pre-claim epoch, the version of its last live write and the
/// job effects applied since its content was dumped) and an optional checkpoint (with its guard
/// epoch) into the snapshot a session starts from. Identity always comes from the row; so does
/// the CAS token. When the checkpoint wins (see [`freshest`]), the job effects it does not hold
/// are replayed on it: sequenced ones issued after its dump — past its mark by the copy that
/// dumped it, or by any later copy of the chain (one that loaded it and crashed before writing)
/// — and unsequenced ones applied past both the row's last live write and the checkpoint's own
/// version. So neither the checkpoint's newer content nor a durable job's effect is lost, and
/// nothing older overwrites it.
pub(crate) fn choose(
    model: &ModelHandle,
    claimed: ClaimedRow,
    checkpoint: Option<HeldCheckpoint>,
) -> LoadedCharacter {
    choose_leaving_out(model, claimed, checkpoint, &[])
}

/// [`choose`], taking `released` (items transfer commits took from the character) out of a
/// checkpoint that wins. A checkpoint that wins only on its mark holds the unsequenced effects
/// up to its own version, not up to the row's last live write (the caller adds those past it to
/// the claim's effects).
fn choose_leaving_out(
    model: &ModelHandle,
    claimed: ClaimedRow,
    checkpoint: Option<HeldCheckpoint>,
    released: &[Uuid],
) -> LoadedCharacter {
    let by_mark = wins_by_mark(&claimed, checkpoint.as_ref());
    let ClaimedRow {
        new_epoch,
        live_version,
        row,
        content_mark,
        effects,
    } = claimed;
    let brand_new = row.zone_ref.is_none();
    let pick = checkpoint
        .filter(|c| c.snapshot.character_id == row.character_id)
        .map(|c| {
            let which = if by_mark {
                Freshest::Checkpoint
            } else {
                freshest(
                    row.owner_epoch,
                    live_version,
                    (c.held_by, c.snapshot.state_version),
                )
            };
            (which, c.snapshot)
        });
    // The row holds its last live writer's dump, then every job applied since.
    let from_row = || {
        let beyond_mark = effects
            .iter()
            .filter(|e| e.issue_seq > 0)
            .map(|e| (e.owner_epoch, e.issue_seq))
            .collect();
        let origin = ContentOrigin {
            epoch: content_mark.epoch,
            mark: content_mark.seq,
            beyond_mark,
        };
        (LoadSource::Row, row.clone(), origin)
    };
    let (source, mut snapshot, origin) = match pick {
        Some((Freshest::Checkpoint, c)) => {
            let mut s = c;
            if s.zone_ref.is_none() {
                // The checkpoint was dumped inside an instance; the durable anchor stands.
                s.zone_ref = row.zone_ref.clone();
                s.room_ref = row.room_ref.clone();
            }
            let holds_through = if by_mark {
                s.state_version
            } else {
                live_version.max(s.state_version)
            };
            match replay_missing(model, s, &effects, holds_through)
                .and_then(|(s, origin)| Ok((leave_out(model, s, released)?, origin)))
            {
                Ok((mut s, origin)) => {
                    s.account_id = row.account_id;
                    s.name = row.name.clone();
                    (LoadSource::Checkpoint, s, origin)
                }
                Err(err) => {
                    tracing::warn!(event = "checkpoint_unreadable", character = %row.character_id,
                        error = %err, "the row is loaded instead");
                    from_row()
                }
            }
        }
        _ => from_row(),
    };
    snapshot.state_version = row.state_version;
    snapshot.owner_epoch = new_epoch;
    snapshot.issue_mark = 0;
    LoadedCharacter {
        snapshot,
        source,
        brand_new,
        origin,
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
            state: serde_json::json!({ "marker": marker }).into(),
            chargen: None,
            state_version: version,
            owner_epoch: epoch,
            issue_mark: 0,
            schema_version: 1,
        }
    }

    /// A checkpoint as its own copy wrote it (never taken over).
    fn held(snapshot: CharacterSnapshot) -> Option<HeldCheckpoint> {
        Some(HeldCheckpoint {
            held_by: snapshot.owner_epoch,
            snapshot,
        })
    }

    fn claimed(row: CharacterSnapshot, live_version: i64, new_epoch: i64) -> ClaimedRow {
        ClaimedRow {
            new_epoch,
            live_version,
            content_mark: crate::character::IssueMark {
                epoch: row.owner_epoch,
                seq: row.issue_mark,
            },
            effects: Vec::new(),
            row,
        }
    }

    /// Copy 3 dumped a flush (mark 2) at version 7, then a checkpoint (mark 3) at version 7;
    /// the flush landed as version 8 after the checkpoint was written, and the copy died.
    #[test]
    fn a_checkpoint_dumped_after_the_rows_content_wins_over_its_later_landing() {
        let mut row = snap(3, 8, Some("a"), "flush");
        row.issue_mark = 2;
        let mut checkpoint = snap(3, 7, Some("a"), "ckpt");
        checkpoint.issue_mark = 3;
        let model = crate::model::test_model::handle();
        let loaded = choose(&model, claimed(row.clone(), 8, 4), held(checkpoint.clone()));
        assert_eq!(loaded.source, LoadSource::Checkpoint);
        assert_eq!(loaded.snapshot.state["marker"], "ckpt");
        assert_eq!((loaded.origin.epoch, loaded.origin.mark), (3, 3));
        // Dumped before the flush (a lower mark), or by another copy: versions decide.
        checkpoint.issue_mark = 1;
        let loaded = choose(&model, claimed(row.clone(), 8, 4), held(checkpoint.clone()));
        assert_eq!(loaded.source, LoadSource::Row);
        checkpoint.issue_mark = 3;
        checkpoint.owner_epoch = 2;
        let fenced = Some(HeldCheckpoint {
            held_by: 2,
            snapshot: checkpoint,
        });
        assert_eq!(
            choose(&model, claimed(row, 8, 4), fenced).source,
            LoadSource::Row
        );
    }

    #[test]
    fn checkpoint_content_at_a_tie_with_the_rows_token_and_new_epoch() {
        let loaded = choose(
            &crate::model::test_model::handle(),
            claimed(snap(3, 7, Some("a"), "row"), 7, 4),
            held(snap(3, 7, Some("b"), "ckpt")),
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
            &crate::model::test_model::handle(),
            claimed(snap(5, 2, Some("a"), "row"), 2, 6),
            held(snap(4, 40, Some("b"), "zombie")),
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
            &crate::model::test_model::handle(),
            claimed(snap(3, 7, Some("a"), "row"), 7, 4),
            held(snap(3, 7, None, "ckpt")),
        );
        assert_eq!(loaded.snapshot.state["marker"], "ckpt");
        assert_eq!(loaded.snapshot.zone_ref.as_deref(), Some("a"));
    }

    #[test]
    fn no_checkpoint_means_the_row() {
        let loaded = choose(
            &crate::model::test_model::handle(),
            claimed(snap(1, 1, None, "row"), 1, 2),
            None,
        );
        assert_eq!(loaded.source, LoadSource::Row);
        assert!(loaded.brand_new);
    }

    fn effect(seq: u64, row_version: i64, payload: serde_json::Value) -> RecordedEffect {
        RecordedEffect {
            key: format!("k-{seq}-{row_version}"),
            owner_epoch: 3,
            issue_seq: seq,
            row_version,
            payload: serde_json::from_value(payload).unwrap_or_else(|e| panic!("{e}")),
        }
    }

    /// A text nested past the JSON tree's depth limit (valid JSON all the same).
    fn too_deep() -> crate::character::StateJson {
        let depth = 200;
        let text = format!("{{\"deep\":{}1{}}}", "[".repeat(depth), "]".repeat(depth));
        crate::character::StateJson::parse(text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_checkpoint_that_cannot_take_its_missing_effects_gives_way_to_the_row() {
        let nil = Uuid::nil();
        let mut row = snap(3, 8, Some("a"), "row");
        row.state = serde_json::json!({ "experience": 35 }).into();
        let mut claim = claimed(row, 7, 4);
        claim.effects = vec![effect(
            3,
            8,
            serde_json::json!({ "kind": "combat_rewards", "character_id": nil,
            "experience": 25, "currency": 0, "items": [] }),
        )];
        let mut checkpoint = snap(3, 7, Some("a"), "ckpt");
        checkpoint.state = too_deep();
        let loaded = choose(&crate::model::test_model::handle(), claim, held(checkpoint));
        assert_eq!(loaded.source, LoadSource::Row);
        assert_eq!(
            loaded.snapshot.state["experience"], 35,
            "the reward, not null"
        );
    }

    #[test]
    fn a_checkpoint_missing_nothing_is_played_as_its_text_however_deep() {
        let mut checkpoint = snap(3, 7, Some("b"), "ckpt");
        checkpoint.state = too_deep();
        let text = checkpoint.state.as_str().to_owned();
        let loaded = choose(
            &crate::model::test_model::handle(),
            claimed(snap(3, 7, Some("a"), "row"), 7, 4),
            held(checkpoint),
        );
        assert_eq!(loaded.source, LoadSource::Checkpoint);
        assert_eq!(loaded.snapshot.state.as_str(), text);
    }

    #[test]
    fn a_newer_checkpoint_gets_only_the_effects_issued_after_its_dump() {
        let nil = Uuid::nil();
        // Live write at 7 (mark 2) with 10 xp. Jobs then took the row to 8: a reward issued as 3
        // and a hair change issued as 4. The checkpoint was dumped at 7 with mark 3: it holds the
        // reward (and an item the row lacks); the hair change came after it.
        let mut row = snap(3, 8, Some("a"), "row");
        row.state = serde_json::json!({ "experience": 35, "appearance": { "hair": "red" } }).into();
        let mut claim = claimed(row, 7, 4);
        claim.content_mark.seq = 2;
        claim.effects = vec![
            effect(
                3,
                8,
                serde_json::json!({ "kind": "combat_rewards", "character_id": nil,
                "experience": 25, "currency": 0, "items": [] }),
            ),
            effect(
                4,
                8,
                serde_json::json!({ "kind": "character_appearance", "character_id": nil,
                "appearance": { "hair": "red" } }),
            ),
        ];
        let mut checkpoint = snap(3, 7, Some("a"), "ckpt");
        checkpoint.issue_mark = 3;
        checkpoint.state = serde_json::json!({
            "experience": 35, "inventory": [{ "proto": "gem" }], "appearance": { "hair": "grey" },
        })
        .into();
        let loaded = choose(
            &crate::model::test_model::handle(),
            claim.clone(),
            held(checkpoint.clone()),
        );
        assert_eq!(loaded.source, LoadSource::Checkpoint);
        assert_eq!(loaded.snapshot.state["experience"], 35, "the reward once");
        assert_eq!(loaded.snapshot.state["appearance"]["hair"], "red");
        assert_eq!(loaded.snapshot.state["inventory"][0]["proto"], "gem");
        assert_eq!(loaded.snapshot.state_version, 8, "the row's CAS token");
        assert_eq!(
            loaded.snapshot.issue_mark, 0,
            "the new copy has issued nothing"
        );
        assert_eq!(
            loaded.origin,
            ContentOrigin {
                epoch: 3,
                mark: 3,
                beyond_mark: vec![(3, 4)]
            }
        );
        // A checkpoint dumped after the hair change (mark 4) holds its own, newer hair.
        checkpoint.issue_mark = 4;
        let mut appearance = checkpoint.state["appearance"].clone();
        appearance["hair"] = "blue".into();
        checkpoint.state.set_field("appearance", appearance);
        let loaded = choose(
            &crate::model::test_model::handle(),
            claim.clone(),
            held(checkpoint),
        );
        assert_eq!(loaded.snapshot.state["appearance"]["hair"], "blue");
        assert_eq!(loaded.snapshot.state["experience"], 35);
        // A live write after the checkpoint's dump wins outright, with its jobs applied.
        let mut newer = claim;
        newer.live_version = 8;
        let loaded = choose(
            &crate::model::test_model::handle(),
            newer,
            held(snap(3, 7, Some("a"), "ckpt")),
        );
        assert_eq!(loaded.source, LoadSource::Row);
        assert_eq!(
            loaded.origin,
            ContentOrigin {
                epoch: 3,
                mark: 2,
                beyond_mark: vec![(3, 3), (3, 4)]
            }
        );
    }

    /// Copy 3 checkpointed (mark 2), copy 4 loaded it, issued a reward that a job applied to the
    /// row, and died before writing: copy 5 loads copy 3's checkpoint (taken over by copy 4)
    /// with copy 3's later reward and copy 4's, each once.
    #[test]
    fn a_checkpoint_of_an_earlier_copy_in_the_chain_gets_every_later_copys_effects() {
        let nil = Uuid::nil();
        let reward = |epoch: i64, seq: u64, experience: i64| RecordedEffect {
            key: format!("k-{epoch}-{seq}"),
            owner_epoch: epoch,
            issue_seq: seq,
            row_version: 8,
            payload: serde_json::from_value(serde_json::json!({ "kind": "combat_rewards",
                "character_id": nil, "experience": experience, "currency": 0, "items": [] }))
            .unwrap_or_else(|e| panic!("{e}")),
        };
        let mut row = snap(4, 8, Some("a"), "row");
        row.state = serde_json::json!({ "experience": 1 }).into();
        let mut claim = claimed(row, 7, 5);
        claim.content_mark = crate::character::IssueMark { epoch: 3, seq: 1 };
        claim.effects = vec![reward(3, 2, 10), reward(3, 3, 100), reward(4, 1, 1000)];
        let mut checkpoint = snap(3, 7, Some("a"), "ckpt");
        checkpoint.issue_mark = 2;
        checkpoint.state = serde_json::json!({ "experience": 11 }).into();
        let taken = Some(HeldCheckpoint {
            snapshot: checkpoint,
            held_by: 4,
        });
        let loaded = choose(&crate::model::test_model::handle(), claim.clone(), taken);
        assert_eq!(loaded.source, LoadSource::Checkpoint);
        assert_eq!(loaded.snapshot.state["experience"], 1111);
        assert_eq!(loaded.origin.beyond_mark, vec![(3, 3), (4, 1)]);
        // Not taken over by copy 4 (its claim fenced it unread): a zombie may have written it,
        // so the row stands.
        let mut fenced = snap(3, 7, Some("a"), "zombie");
        fenced.issue_mark = 2;
        let loaded = choose(&crate::model::test_model::handle(), claim, held(fenced));
        assert_eq!(loaded.source, LoadSource::Row);
    }

    #[test]
    fn unsequenced_effects_replay_only_when_applied_since_the_last_live_write() {
        let nil = Uuid::nil();
        let reward = |version| {
            effect(
                0,
                version,
                serde_json::json!({ "kind": "combat_rewards", "character_id": nil,
                "experience": 5, "currency": 0, "items": [] }),
            )
        };
        let mut claim = claimed(snap(3, 9, Some("a"), "row"), 7, 4);
        claim.effects = vec![reward(8)];
        let mut checkpoint = snap(3, 7, Some("a"), "ckpt");
        checkpoint.state = serde_json::json!({ "experience": 10 }).into();
        let loaded = choose(
            &crate::model::test_model::handle(),
            claim.clone(),
            held(checkpoint.clone()),
        );
        assert_eq!(loaded.snapshot.state["experience"], 15);
        claim.effects = vec![reward(7)];
        let loaded = choose(
            &crate::model::test_model::handle(),
            claim.clone(),
            held(checkpoint.clone()),
        );
        assert_eq!(loaded.snapshot.state["experience"], 10);
        // A checkpoint from before the upgrade lists the rewards it holds: not granted twice.
        claim.effects = vec![reward(8)];
        checkpoint.state = serde_json::json!({ "experience": 15, "reward_keys": ["k-0-8"] }).into();
        let loaded = choose(&crate::model::test_model::handle(), claim, held(checkpoint));
        assert_eq!(loaded.snapshot.state["experience"], 15);
    }
}
