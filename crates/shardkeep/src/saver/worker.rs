//! The saver's batch handler. One pass: coalesce requests per character, then write both tiers
//! of the whole pass at once — every checkpoint in pipelines kept in flight, the flush and final
//! snapshots in batched CAS statements kept in flight — neither tier waiting on the other, and
//! route each outcome. A final save that cannot land goes on in the background
//! ([`super::final_retry`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use uuid::Uuid;

use super::final_retry::{FinalRetries, Start};
use super::landed::{LandedWrites, Tier};
use super::{SaveFeedback, SaveReason, SaveRequest, SaverConfig, SaverEvent, SaverStats};
use crate::character::store::MAX_SAVE_BATCH;
use crate::character::{
    CharacterSnapshot, CharacterStore, CheckpointStore, CheckpointWrite, SaveOutcome,
};
use crate::drain::BatchHandler;
use crate::telemetry;

pub(super) struct SaverWorker {
    store: Option<CharacterStore>,
    checkpoints: Option<CheckpointStore>,
    feedback: Arc<dyn SaveFeedback>,
    config: SaverConfig,
    stats: Arc<SaverStats>,
    finals: Option<FinalRetries>,
    queued_finals: Option<super::pending::PendingFinals>,
    /// The saver's count of saves waiting in its queue, taken down as this worker takes them.
    waiting: Option<Arc<AtomicUsize>>,
    landed: LandedWrites,
}

impl SaverWorker {
    fn count_dequeued(&self, finals: Vec<Uuid>) {
        if let Some(pending) = &self.queued_finals {
            pending.dequeued(finals);
        }
    }

    /// Records every landed write in `landed`.
    pub(super) fn recording(mut self, landed: LandedWrites) -> Self {
        self.landed = landed;
        self
    }

    /// Takes the saves this worker takes off the queue out of `waiting`.
    pub(super) fn counting_waiting(mut self, waiting: Arc<AtomicUsize>) -> Self {
        self.waiting = Some(waiting);
        self
    }

    /// Counts the final saves this worker takes off the queue in `pending`.
    pub(super) fn counting_finals(mut self, pending: super::pending::PendingFinals) -> Self {
        self.queued_finals = Some(pending);
        self
    }

    pub(super) fn new(
        store: Option<CharacterStore>,
        checkpoints: Option<CheckpointStore>,
        feedback: Arc<dyn SaveFeedback>,
        config: SaverConfig,
        stats: Arc<SaverStats>,
        finals: Option<FinalRetries>,
    ) -> Self {
        Self {
            store,
            checkpoints,
            feedback,
            config,
            stats,
            finals,
            queued_finals: None,
            waiting: None,
            landed: LandedWrites::default(),
        }
    }
}

/// A final save the batch could not land, and where its background retry starts.
type Unlanded = (SaveRequest, Start);

impl BatchHandler<Vec<SaveRequest>> for SaverWorker {
    async fn handle(&mut self, batch: Vec<Vec<SaveRequest>>) {
        // The first queue entry's buffer takes the rest (most passes hold one entry).
        let mut entries = batch.into_iter();
        let mut requests: Vec<SaveRequest> = entries.next().unwrap_or_default();
        for entry in entries {
            requests.extend(entry);
        }
        if let Some(waiting) = &self.waiting {
            waiting.fetch_sub(requests.len(), Ordering::Relaxed);
        }
        let finals: Vec<Uuid> = requests
            .iter()
            .filter(|r| r.reason == SaveReason::Final)
            .map(|r| r.snapshot.character_id)
            .collect();
        let Coalesced {
            requests,
            superseded_finals,
        } = coalesce(requests);
        for (request, current_epoch) in &superseded_finals {
            self.ownership_lost(&request.snapshot, *current_epoch);
        }
        // The two tiers are independent: write them concurrently, each as fast as it goes.
        let (checkpointed, unlanded) = tokio::join!(
            self.write_checkpoints(&requests),
            self.write_rows(&requests)
        );
        self.landed.record(
            Tier::Checkpoint,
            requests
                .iter()
                .filter(|r| checkpointed.contains(&r.snapshot.character_id))
                .map(|r| (r.snapshot.character_id, r.dumped_at)),
        );
        // Registered before this batch counts as handled, so a barrier queued after it waits
        // for these too.
        for (request, start) in unlanded {
            let id = request.snapshot.character_id;
            match &self.finals {
                Some(finals) => finals.spawn(request, checkpointed.contains(&id), start),
                None => self.final_dropped(&request.snapshot),
            }
        }
        // The batch's finals (those merged into another request of the same character too) are
        // off the queue now: in their rows, pending, or dropped.
        self.count_dequeued(finals);
    }
}

/// Checkpoints one `write_many` call writes (pipelines of 128, a few in flight), each bounded
/// by the I/O timeout.
const CHECKPOINTS_PER_WRITE: usize = 4096;
/// Batched CAS statements of one pass in flight at once (their characters are distinct).
const ROW_STATEMENTS_IN_FLIGHT: usize = 4;

/// The row refused this copy's save for its schema while this copy still owns the character:
/// a worker or a transfer of a newer release upgraded the row under it (a claim by a newer model
/// would have fenced the copy by its epoch first). The copy must not write its older document
/// over it, and it holds every write it issued: its saves go on as durable state jobs, which a
/// newer release's worker upgrades as it applies them. A logout's final save does so with its
/// background retry (`Some`: where that starts); a cadence flush is stored once by the caller,
/// its checkpoint holding it until then. The copy plays on.
fn row_schema_newer(request: &SaveRequest, stored_schema: u32) -> Option<Unlanded> {
    let snapshot = &request.snapshot;
    metrics::counter!(telemetry::SAVER_ROW_SCHEMA_NEWER_TOTAL, "reason" => request.reason.as_str())
        .increment(1);
    tracing::warn!(event = "row_schema_newer", character = %snapshot.character_id,
        writer_schema = snapshot.schema_version, stored_schema, reason = request.reason.as_str(),
        "a newer release upgraded this copy's row; its save goes on as a state job");
    (request.reason == SaveReason::Final).then(|| (request.clone(), Start::Job))
}

/// A batch coalesced to one request per character, and the logout saves it set aside because
/// a newer owner's snapshot of the same character is in the batch too.
pub(super) struct Coalesced {
    /// One request per character, in first-seen order.
    pub(super) requests: Vec<SaveRequest>,
    /// Final saves of an owner a newer copy has superseded, each with the newer owner's epoch.
    pub(super) superseded_finals: Vec<(SaveRequest, i64)>,
}

/// Keeps one request per character. Requests of one owner merge: the latest snapshot (the
/// highest issue mark; the later queued on a tie) and the strongest reason. A newer owner's
/// request replaces an older owner's outright, reason and all: an older copy's logout must not
/// lend its final-save treatment (rebase over conflicts, background retry, a state job) to a
/// live copy's snapshot, which would then overwrite the live copy's later saves. An older
/// owner's final set aside so is in `superseded_finals` (its row write would be fenced anyway);
/// any other older request is simply dropped.
pub(super) fn coalesce(batch: Vec<SaveRequest>) -> Coalesced {
    // Most passes hold one request per character: they go on as they are (a pass holds
    // thousands of requests, each a few hundred bytes, not worth moving through a map).
    let mut seen = HashSet::with_capacity(batch.len());
    if batch.iter().all(|r| seen.insert(r.snapshot.character_id)) {
        return Coalesced {
            requests: batch,
            superseded_finals: Vec::new(),
        };
    }
    drop(seen);
    // Otherwise the requests stay in their slots; the map holds the slot of each character's.
    let mut slot_of: HashMap<Uuid, usize> = HashMap::with_capacity(batch.len());
    let mut kept: Vec<SaveRequest> = Vec::with_capacity(batch.len());
    let mut superseded_finals = Vec::new();
    for request in batch {
        let id = request.snapshot.character_id;
        let slot = *slot_of.entry(id).or_insert(kept.len());
        let Some(kept) = kept.get_mut(slot) else {
            kept.push(request);
            continue;
        };
        let (kept_epoch, epoch) = (kept.snapshot.owner_epoch, request.snapshot.owner_epoch);
        if epoch == kept_epoch {
            kept.reason = kept.reason.max(request.reason);
            // The copy's later dump: each dump takes the next number of the copy's issue
            // sequence, so the higher mark (the later queued on a tie). A dump queued after a
            // newer one (a pulse's dump queued after the logout's final it raced) must not
            // replace it, or the final would write the older content.
            if request.snapshot.issue_mark >= kept.snapshot.issue_mark {
                kept.snapshot = request.snapshot;
                kept.dumped_at = request.dumped_at;
            }
            continue;
        }
        let (older, newer_epoch) = if epoch > kept_epoch {
            (std::mem::replace(kept, request), epoch)
        } else {
            (request, kept_epoch)
        };
        if older.reason == SaveReason::Final {
            superseded_finals.push((older, newer_epoch));
        }
    }
    Coalesced {
        requests: kept,
        superseded_finals,
    }
}

impl SaverWorker {
    /// Writes the checkpoints of `requests`; returns the characters whose checkpoint landed.
    async fn write_checkpoints(&self, requests: &[SaveRequest]) -> HashSet<Uuid> {
        let mut landed = HashSet::new();
        if self.checkpoints.is_none() {
            return landed;
        }
        for chunk in requests.chunks(CHECKPOINTS_PER_WRITE) {
            self.write_checkpoint_call(chunk, &mut landed).await;
        }
        landed
    }

    /// One bounded call of [`Self::write_checkpoints`].
    async fn write_checkpoint_call(&self, requests: &[SaveRequest], landed: &mut HashSet<Uuid>) {
        let Some(checkpoints) = &self.checkpoints else {
            return;
        };
        // A checkpoint dumped after a landed row write of its copy, before the copy heard of it,
        // goes at that write's version (see `LandedWrites::raised_many`); the rest go as dumped.
        let raised = self.landed.raised_many(requests);
        let mut snapshots: Vec<&CharacterSnapshot> = requests.iter().map(|r| &r.snapshot).collect();
        for (index, up) in &raised {
            if let Some(slot) = snapshots.get_mut(*index) {
                *slot = up;
            }
        }
        self.stats.checkpoint_attempted(snapshots.len() as u64);
        let started = Instant::now();
        let result =
            tokio::time::timeout(self.config.io_timeout, checkpoints.write_many(&snapshots)).await;
        self.stats.record_write_latency(started.elapsed());
        let writes = match result {
            Ok(Ok(writes)) => writes,
            Ok(Err(err)) => {
                self.checkpoint_failed(snapshots.len(), &err.to_string());
                return;
            }
            Err(_) => {
                self.checkpoint_failed(snapshots.len(), "timed out");
                return;
            }
        };
        for (snapshot, write) in snapshots.iter().zip(writes) {
            match write {
                CheckpointWrite::Written => {
                    self.stats.checkpoint_landed(1);
                    landed.insert(snapshot.character_id);
                }
                CheckpointWrite::SchemaNewer { stored_schema } => {
                    self.stats.checkpoint_refused(1);
                    metrics::counter!(telemetry::CHECKPOINT_REFUSED_TOTAL).increment(1);
                    self.schema_outdated(snapshot, stored_schema);
                }
                CheckpointWrite::NotOwner { stored_epoch } => {
                    self.stats.checkpoint_refused(1);
                    metrics::counter!(telemetry::CHECKPOINT_REFUSED_TOTAL).increment(1);
                    tracing::warn!(event = "checkpoint_not_owner", character = %snapshot.character_id,
                        writer_epoch = snapshot.owner_epoch, stored_epoch, "double-own detected");
                    self.feedback.deliver(SaverEvent::DoubleOwn {
                        character_id: snapshot.character_id,
                        owner_epoch: snapshot.owner_epoch,
                        stored_epoch,
                    });
                }
            }
        }
    }

    fn checkpoint_failed(&self, count: usize, error: &str) {
        self.stats.checkpoint_failed(count as u64);
        metrics::counter!(telemetry::SAVER_WRITE_FAILURES_TOTAL, "tier" => "redis")
            .increment(count as u64);
        tracing::warn!(
            event = "checkpoint_failed",
            count,
            error,
            "checkpoint window widens by one cadence"
        );
    }

    /// CAS-saves the flush and final snapshots of `requests`, in statements of up to the write
    /// chunk kept [`ROW_STATEMENTS_IN_FLIGHT`] at once; returns the final saves that did not land
    /// and must go on in the background.
    async fn write_rows(&self, requests: &[SaveRequest]) -> Vec<Unlanded> {
        use futures::StreamExt;
        if self.store.is_none() {
            return Vec::new();
        }
        let rows: Vec<&SaveRequest> = requests.iter().filter(|r| r.reason.writes_row()).collect();
        let statements: Vec<_> = rows
            .chunks(self.config.write_chunk.clamp(1, MAX_SAVE_BATCH))
            .map(|chunk| self.write_row_statement(chunk))
            .collect();
        futures::stream::iter(statements)
            .buffer_unordered(ROW_STATEMENTS_IN_FLIGHT)
            .concat()
            .await
    }

    /// One batched CAS statement of [`Self::write_rows`], and its outcomes routed.
    async fn write_row_statement(&self, rows: &[&SaveRequest]) -> Vec<Unlanded> {
        let Some(store) = &self.store else {
            return Vec::new();
        };
        let snapshots: Vec<&CharacterSnapshot> = rows.iter().map(|r| &r.snapshot).collect();
        self.stats.row_attempted(snapshots.len() as u64);
        let started = Instant::now();
        let result =
            tokio::time::timeout(self.config.io_timeout, store.save_many(&snapshots)).await;
        metrics::histogram!(telemetry::SAVER_FLUSH_SECONDS).record(started.elapsed().as_secs_f64());
        self.stats.record_write_latency(started.elapsed());
        let outcomes = match result {
            Ok(Ok(outcomes)) => outcomes,
            Ok(Err(err)) => return self.rows_failed(rows, &err.to_string()),
            Err(_) => return self.rows_failed(rows, "timed out"),
        };
        let mut unlanded = Vec::new();
        for (request, (_, outcome)) in rows.iter().zip(outcomes) {
            unlanded.extend(self.route(store, request, outcome).await);
        }
        unlanded
    }

    /// A batch did not reach Postgres. Flushes wait for the next cadence; a logout's final save
    /// has none, so it goes on in the background.
    fn rows_failed(&self, rows: &[&SaveRequest], error: &str) -> Vec<Unlanded> {
        let count = rows.len();
        self.stats.row_failed(count as u64);
        metrics::counter!(telemetry::SAVER_WRITE_FAILURES_TOTAL, "tier" => "postgres")
            .increment(count as u64);
        tracing::warn!(
            event = "flush_failed",
            count,
            error,
            "retried at the next cadence"
        );
        rows.iter()
            .filter(|r| r.reason == SaveReason::Final)
            .map(|r| ((*r).clone(), Start::Direct))
            .collect()
    }

    async fn route(
        &self,
        store: &CharacterStore,
        request: &SaveRequest,
        outcome: SaveOutcome,
    ) -> Option<Unlanded> {
        let snapshot = &request.snapshot;
        let character_id = snapshot.character_id;
        match outcome {
            SaveOutcome::Saved(new_version) => {
                self.saved(request, snapshot.state_version, new_version)
            }
            SaveOutcome::OwnershipLost(current_epoch) => {
                self.ownership_lost(snapshot, current_epoch)
            }
            SaveOutcome::SchemaOutdated(stored_schema) => {
                let unlanded = row_schema_newer(request, stored_schema);
                if unlanded.is_none()
                    && let Some(finals) = &self.finals
                {
                    finals.queue_flush(request.clone());
                }
                return unlanded;
            }
            SaveOutcome::NotFound => {
                tracing::error!(event = "save_not_found", character = %character_id);
                self.feedback.deliver(SaverEvent::NotFound {
                    character_id,
                    owner_epoch: snapshot.owner_epoch,
                });
            }
            SaveOutcome::VersionConflict(current_version) => {
                self.stats.row_conflicts(1);
                metrics::counter!(telemetry::SAVER_CONFLICTS_TOTAL, "reason" => request.reason.as_str())
                    .increment(1);
                if request.reason == SaveReason::Final && !self.feedback.is_present(character_id) {
                    return self
                        .finalize(store, request, current_version)
                        .await
                        .map(|start| (request.clone(), start));
                } else {
                    self.feedback.deliver(SaverEvent::FlushConflict {
                        character_id,
                        owner_epoch: snapshot.owner_epoch,
                        current_version,
                        reason: request.reason,
                    });
                }
            }
        }
        None
    }

    /// A process with a newer model wrote this character's checkpoint: this copy stops saving.
    fn schema_outdated(&self, snapshot: &CharacterSnapshot, stored_schema: u32) {
        tracing::error!(event = "schema_outdated", character = %snapshot.character_id,
            writer_schema = snapshot.schema_version, stored_schema,
            "a newer model wrote this character; this copy's writes are refused");
        self.feedback.deliver(SaverEvent::SchemaOutdated {
            character_id: snapshot.character_id,
            owner_epoch: snapshot.owner_epoch,
            stored_schema,
        });
    }

    fn saved(&self, request: &SaveRequest, dumped_version: i64, new_version: i64) {
        self.stats.row_landed(1);
        self.landed.row_landed(request, new_version);
        self.feedback.deliver(SaverEvent::Saved {
            character_id: request.snapshot.character_id,
            owner_epoch: request.snapshot.owner_epoch,
            reason: request.reason,
            dumped_version,
            new_version,
        });
    }

    fn ownership_lost(&self, snapshot: &CharacterSnapshot, current_epoch: i64) {
        self.stats.row_ownership_lost(1);
        metrics::counter!(telemetry::SAVER_OWNERSHIP_LOST_TOTAL).increment(1);
        tracing::warn!(event = "ownership_lost", character = %snapshot.character_id,
            writer_epoch = snapshot.owner_epoch, current_epoch, "zombie copy fenced; evicting");
        self.feedback.deliver(SaverEvent::OwnershipLost {
            character_id: snapshot.character_id,
            owner_epoch: snapshot.owner_epoch,
            current_epoch,
        });
    }

    /// The player is gone and nobody else will write this logout delta. The row moved under
    /// it: with a retry queue, the save goes down as a state job, whose settle plays on the dump
    /// what landed after it (an offline grant) instead of writing over it. Without one (or for a
    /// document no job can carry), it is rebased onto the current row and retried, bounded
    /// (what landed since the dump is then lost; the epoch fence is a separate conjunct that a
    /// rebase cannot reach). `Some` when it did not land: where its background retry starts.
    async fn finalize(
        &self,
        store: &CharacterStore,
        request: &SaveRequest,
        mut current_version: i64,
    ) -> Option<Start> {
        if self
            .finals
            .as_ref()
            .is_some_and(|finals| finals.takes_as_job(request))
        {
            return Some(Start::Job);
        }
        let deadline = Instant::now() + self.config.final_budget;
        let mut snapshot = request.snapshot.clone();
        for _ in 0..self.config.final_retries {
            if Instant::now() >= deadline {
                break;
            }
            snapshot.state_version = current_version;
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left.min(self.config.io_timeout), store.save(&snapshot))
                .await
            {
                Ok(Ok(SaveOutcome::Saved(new_version))) => {
                    self.saved(request, request.snapshot.state_version, new_version);
                    return None;
                }
                Ok(Ok(SaveOutcome::VersionConflict(v))) => current_version = v,
                Ok(Ok(SaveOutcome::OwnershipLost(epoch))) => {
                    self.ownership_lost(&snapshot, epoch);
                    return None;
                }
                Ok(Ok(SaveOutcome::SchemaOutdated(stored_schema))) => {
                    return row_schema_newer(request, stored_schema).map(|(_, start)| start);
                }
                Ok(Ok(SaveOutcome::NotFound)) => {
                    self.feedback.deliver(SaverEvent::NotFound {
                        character_id: snapshot.character_id,
                        owner_epoch: snapshot.owner_epoch,
                    });
                    return None;
                }
                Ok(Err(err)) => {
                    tracing::warn!(event = "final_flush_retry_failed", character = %snapshot.character_id, error = %err);
                    return Some(Start::Direct);
                }
                Err(_) => return Some(Start::Direct),
            }
        }
        // Every rebase lost a race: a durable job applies without one, fenced by the epoch.
        Some(Start::Job)
    }

    fn final_dropped(&self, snapshot: &CharacterSnapshot) {
        super::final_retry::final_dropped(&self.stats, self.feedback.as_ref(), snapshot);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn request(id: Uuid, reason: SaveReason, epoch: i64, marker: i64) -> SaveRequest {
        SaveRequest {
            dumped_at: std::time::Instant::now(),
            reason,
            snapshot: CharacterSnapshot {
                character_id: id,
                account_id: Uuid::nil(),
                name: "n".into(),
                zone_ref: None,
                room_ref: None,
                state: json!({ "m": marker }).into(),
                chargen: None,
                state_version: 1,
                owner_epoch: epoch,
                issue_mark: 0,
                schema_version: 1,
            },
        }
    }

    #[test]
    fn coalescing_keeps_the_latest_snapshot_and_the_strongest_reason() {
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let merged = coalesce(vec![
            request(a, SaveReason::Final, 3, 1),
            request(b, SaveReason::Checkpoint, 3, 2),
            request(a, SaveReason::Checkpoint, 3, 3),
            request(a, SaveReason::Checkpoint, 2, 4),
        ])
        .requests;
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0].snapshot.character_id, a);
        assert_eq!(merged[0].reason, SaveReason::Final);
        assert_eq!(
            merged[0].snapshot.state["m"], 3,
            "an older owner's later dump never wins"
        );
        assert_eq!(merged[1].reason, SaveReason::Checkpoint);
    }

    /// A dump queued after a newer dump of the same copy (the pulse dumps, the game logs the copy
    /// out and its final is queued, then the pulse queues its older dump) never replaces it: the
    /// batch writes the final's snapshot, with the final's treatment.
    #[test]
    fn an_older_dump_queued_after_a_copys_final_does_not_replace_it() {
        let a = Uuid::from_u128(1);
        let dump = |reason, mark: u64| {
            let mut r = request(a, reason, 3, i64::try_from(mark).unwrap_or(0));
            r.snapshot.issue_mark = mark;
            r
        };
        for older in [SaveReason::Flush, SaveReason::Checkpoint] {
            let merged = coalesce(vec![dump(SaveReason::Final, 5), dump(older, 4)]).requests;
            assert_eq!(merged.len(), 1);
            assert_eq!(
                (merged[0].reason, merged[0].snapshot.issue_mark),
                (SaveReason::Final, 5),
                "{older:?}"
            );
            assert_eq!(merged[0].snapshot.state["m"], 5);
        }
        // A later dump (a final merged again keeps its mark) still replaces an earlier one.
        let merged =
            coalesce(vec![dump(SaveReason::Flush, 4), dump(SaveReason::Final, 5)]).requests;
        assert_eq!(merged[0].snapshot.issue_mark, 5);
        // On a tie (a final merged and queued again keeps its mark) the later queued wins.
        let mut again = dump(SaveReason::Final, 5);
        again.snapshot.state = json!({ "m": "merged" }).into();
        let merged = coalesce(vec![dump(SaveReason::Final, 5), again]).requests;
        assert_eq!(merged[0].reason, SaveReason::Final);
        assert_eq!(merged[0].snapshot.state["m"], "merged");
    }

    /// A logout of one copy and a later save of the copy a re-login claimed, in one batch: the
    /// live copy's snapshot keeps its own reason (a final's rebase would overwrite its later
    /// saves), and the superseded logout is set aside with the newer epoch, in either order.
    #[test]
    fn a_newer_owners_snapshot_never_inherits_an_older_owners_final() {
        let a = Uuid::from_u128(1);
        for batch in [
            vec![
                request(a, SaveReason::Final, 6, 1),
                request(a, SaveReason::Checkpoint, 7, 2),
            ],
            vec![
                request(a, SaveReason::Checkpoint, 7, 2),
                request(a, SaveReason::Final, 6, 1),
            ],
        ] {
            let merged = coalesce(batch);
            assert_eq!(merged.requests.len(), 1);
            let kept = &merged.requests[0];
            assert_eq!(
                (
                    kept.reason,
                    kept.snapshot.owner_epoch,
                    &kept.snapshot.state["m"]
                ),
                (SaveReason::Checkpoint, 7, &json!(2))
            );
            assert_eq!(merged.superseded_finals.len(), 1);
            let (final_save, newer) = &merged.superseded_finals[0];
            assert_eq!((final_save.snapshot.owner_epoch, *newer), (6, 7));
        }
        let plain = coalesce(vec![
            request(a, SaveReason::Flush, 6, 1),
            request(a, SaveReason::Checkpoint, 7, 2),
        ]);
        assert_eq!(plain.requests[0].reason, SaveReason::Checkpoint);
        assert!(plain.superseded_finals.is_empty());
    }
}
