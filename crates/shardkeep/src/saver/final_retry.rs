//! A logout's final save that could not land with its batch. The player is gone, so no later
//! cadence would write these changes: the save keeps retrying in the background through a
//! Postgres outage (backoff 250 ms to 4 s, fenced by the epoch), and when the outage outlasts the
//! budget, or the row moved under the save, it becomes a durable `gameplay_state` retry job,
//! written as soon as Postgres answers and fenced like any save; its settle plays on the dump what
//! landed on the row after it (an offline grant), where a rebase would write over it. Each one is
//! registered as pending until it is durable, so the saver's barrier waits for it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::pending::{PendingFinals, PendingTicket};
use super::{SaveFeedback, SaveReason, SaveRequest, SaverConfig, SaverEvent, SaverStats};
use crate::character::{CharacterSnapshot, CharacterStore, SaveOutcome};
use crate::retry::{
    IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload, RetryQueue,
};
use crate::telemetry;

/// Longest pause between attempts to write the retry job.
const JOB_BACKOFF_CAP: Duration = Duration::from_secs(10);

/// What the background retries of one saver share.
#[derive(Clone)]
pub(super) struct FinalRetries {
    pub(super) store: CharacterStore,
    pub(super) retry: Option<RetryQueue>,
    pub(super) feedback: Arc<dyn SaveFeedback>,
    pub(super) stats: Arc<SaverStats>,
    pub(super) config: SaverConfig,
    pub(super) pending: PendingFinals,
    /// The shard's run context: a crash abandons every retry (the checkpoint keeps the save).
    pub(super) cancel: CancellationToken,
}

/// Where a background retry starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Start {
    /// Saving directly, through an outage.
    Direct,
    /// Straight to the durable job (the direct path already gave up).
    Job,
}

impl FinalRetries {
    /// True when `request`, a final save that cannot land directly, can become a durable job:
    /// there is a retry queue, and a job can carry its document.
    pub(super) fn takes_as_job(&self, request: &SaveRequest) -> bool {
        self.retry.is_some() && state_job(request, "final").is_ok()
    }

    /// Registers `request` as pending and retries it in the background from `start`.
    /// `checkpointed` says whether its checkpoint was written (what keeps it if all else fails).
    pub(super) fn spawn(&self, request: SaveRequest, checkpointed: bool, start: Start) {
        let character_id = request.snapshot.character_id;
        let Some(ticket) = self.pending.begin(character_id, checkpointed) else {
            tracing::warn!(event = "final_retry_refused", character = %character_id,
                "too many final saves pending; this one is kept by its checkpoint only");
            return self.dropped(&request.snapshot);
        };
        let retries = self.clone();
        tokio::spawn(async move { retries.run(request, start, ticket).await });
    }

    async fn run(self, request: SaveRequest, start: Start, ticket: PendingTicket) {
        if start == Start::Direct && !self.save_through_outage(&request).await {
            return;
        }
        if self.cancel.is_cancelled() {
            return;
        }
        match &self.retry {
            Some(retry) => self.queue_as_job(retry, &request).await,
            None => self.dropped(&request.snapshot),
        }
        drop(ticket);
    }

    /// Retries the save directly until it lands or is fenced (false: done), or the outage
    /// budget runs out or the row moved under it (true: make it a job).
    async fn save_through_outage(&self, request: &SaveRequest) -> bool {
        let character_id = request.snapshot.character_id;
        let deadline = Instant::now() + self.config.final_outage_budget;
        let mut snapshot = request.snapshot.clone();
        let mut pause = Duration::from_millis(250);
        let mut rebases = 0;
        loop {
            tokio::select! {
                () = self.cancel.cancelled() => return false,
                () = tokio::time::sleep(pause) => {}
            }
            match tokio::time::timeout(self.config.io_timeout, self.store.save(&snapshot)).await {
                Ok(Ok(SaveOutcome::Saved(new_version))) => {
                    self.stats.row_landed(1);
                    tracing::info!(event = "final_flush_recovered", character = %character_id);
                    self.feedback.deliver(SaverEvent::Saved {
                        character_id,
                        owner_epoch: snapshot.owner_epoch,
                        reason: SaveReason::Final,
                        dumped_version: request.snapshot.state_version,
                        new_version,
                    });
                    return false;
                }
                Ok(Ok(SaveOutcome::VersionConflict(current))) => {
                    self.stats.row_conflicts(1);
                    // The row moved under the save: its job replays what moved it. A save no
                    // job can take (no retry queue, or a document a job cannot carry) is
                    // rebased (what landed since the dump is then lost).
                    if self.takes_as_job(request) || rebases >= self.config.final_retries {
                        return true;
                    }
                    rebases += 1;
                    snapshot.state_version = current;
                    pause = Duration::ZERO;
                }
                Ok(Ok(SaveOutcome::SchemaOutdated(stored_schema))) => {
                    // A newer worker upgraded the row (see the saver's `row_schema_newer`): the
                    // job is the way in, upgraded by a worker of the newer model.
                    tracing::warn!(event = "row_schema_newer", character = %character_id,
                        stored_schema, "the logout save goes through a state job");
                    return true;
                }
                Ok(Ok(SaveOutcome::OwnershipLost(current_epoch))) => {
                    self.stats.row_ownership_lost(1);
                    self.feedback.deliver(SaverEvent::OwnershipLost {
                        character_id,
                        owner_epoch: snapshot.owner_epoch,
                        current_epoch,
                    });
                    return false;
                }
                Ok(Ok(SaveOutcome::NotFound)) => {
                    self.feedback.deliver(SaverEvent::NotFound {
                        character_id,
                        owner_epoch: snapshot.owner_epoch,
                    });
                    return false;
                }
                Ok(Err(_)) | Err(_) => {
                    if Instant::now() >= deadline {
                        return true;
                    }
                    pause = (pause * 2).clamp(Duration::from_millis(250), Duration::from_secs(4));
                }
            }
        }
    }

    /// Writes the save as a `gameplay_state` retry job, retrying until Postgres takes it (or the
    /// shard is killed: the checkpoint keeps the save). Applied by the retry worker, fenced by
    /// the copy's epoch like any save.
    async fn queue_as_job(&self, retry: &RetryQueue, request: &SaveRequest) {
        let snapshot = &request.snapshot;
        let character_id = snapshot.character_id;
        let job = match state_job(request, "final") {
            Ok(job) => job,
            Err(err) => {
                tracing::error!(event = "final_job_invalid", character = %character_id, error = %err);
                return self.dropped(snapshot);
            }
        };
        let mut pause = Duration::from_millis(250);
        loop {
            match tokio::time::timeout(self.config.io_timeout, retry.enqueue(&job)).await {
                Ok(Ok(_)) => {
                    self.stats.final_queued_as_job(1);
                    metrics::counter!(telemetry::SAVER_FINAL_QUEUED_AS_JOB_TOTAL).increment(1);
                    tracing::warn!(event = "final_flush_queued_as_job", character = %character_id,
                        retry_job_id = %job.retry_job_id(),
                        "the logout save is a durable retry job now");
                    return self.feedback.deliver(SaverEvent::FinalQueuedAsJob {
                        character_id,
                        owner_epoch: snapshot.owner_epoch,
                        retry_job_id: job.retry_job_id(),
                    });
                }
                Ok(Err(_)) | Err(_) => {
                    tokio::select! {
                        () = self.cancel.cancelled() => return,
                        () = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(JOB_BACKOFF_CAP);
                }
            }
        }
    }

    /// Stores a cadence flush the row refused for its schema (see the saver's
    /// `row_schema_newer`) as a durable state job, once, in the background: a newer worker
    /// upgrades and applies it. If it cannot be stored, the next cadence tries again and the
    /// checkpoint holds the flush meanwhile.
    pub(super) fn queue_flush(&self, request: SaveRequest) {
        let Some(retry) = self.retry.clone() else {
            return;
        };
        let timeout = self.config.io_timeout;
        tokio::spawn(async move {
            let character_id = request.snapshot.character_id;
            let stored = match state_job(&request, "flush") {
                Ok(job) => tokio::time::timeout(timeout, retry.enqueue(&job))
                    .await
                    .map_err(|_| "timed out".to_owned())
                    .and_then(|r| r.map(|_| ()).map_err(|e| e.to_string())),
                Err(err) => Err(err.to_string()),
            };
            if let Err(error) = stored {
                tracing::warn!(event = "flush_job_failed", character = %character_id, error,
                    "retried at the next cadence");
            }
        });
    }

    fn dropped(&self, snapshot: &CharacterSnapshot) {
        final_dropped(&self.stats, self.feedback.as_ref(), snapshot);
    }
}

/// Most levels of nesting a state document carried in a job may have: the payload around it
/// adds a level, and a stored job is read back as a JSON tree of at most 128.
const MOST_JOB_STATE_NESTING: usize = 120;

/// Levels of arrays and objects in `value` (a scalar is 0), walked without recursion.
fn nesting(value: &serde_json::Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((value, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &serde_json::Value>> = match value {
            serde_json::Value::Array(items) => Box::new(items.iter()),
            serde_json::Value::Object(fields) => Box::new(fields.values()),
            _ => continue,
        };
        deepest = deepest.max(depth + 1);
        stack.extend(children.map(|child| (child, depth + 1)));
    }
    deepest
}

/// A save as a durable `gameplay_state` retry job of its copy, fenced by its epoch; `label` names
/// the save in the idempotency key.
fn state_job(
    request: &SaveRequest,
    label: &str,
) -> Result<PersistenceRetryJob, crate::retry::InvalidJob> {
    let snapshot = &request.snapshot;
    let character_id = snapshot.character_id;
    // A job carries the document as a tree: one the tree cannot hold is refused here, never
    // queued as `null` in its place.
    let state = snapshot.state.try_to_value().map_err(|err| {
        crate::retry::InvalidJob(format!("the state document is not a JSON tree: {err}"))
    })?;
    // The job's payload nests the document a level deeper, and must read back as a tree.
    if nesting(&state) > MOST_JOB_STATE_NESTING {
        return Err(crate::retry::InvalidJob(format!(
            "the state document nests deeper than {MOST_JOB_STATE_NESTING} levels: its job \
             could not be read back"
        )));
    }
    PersistenceRetryJob::new(
        PersistenceRetryPayload::gameplay_state_at(
            character_id,
            state,
            snapshot.schema_version,
            snapshot.zone_ref.clone(),
            snapshot.zone_ref.as_ref().and(snapshot.room_ref.clone()),
        ),
        IdempotencyEnvelope {
            idempotency_key: format!(
                "{label}:{character_id}:{}:{}",
                snapshot.owner_epoch,
                Uuid::now_v7()
            ),
            owner_epoch: snapshot.owner_epoch,
            origin: Origin::GameplayState,
            issued_at: Utc::now(),
            // The dump's mark: the row then holds every write the copy issued up to it.
            issue_seq: snapshot.issue_mark,
        },
        &format!("saver-{label}"),
        None,
    )
    // The version the dump was made at: what lands on the row after it is played on the dump.
    .map(|job| job.dumped_at(snapshot.state_version))
}

/// A logout's final save as the durable `gameplay_state` job the saver makes of it (for a save
/// the saver gave up, which the live-copy runtime stores itself).
pub(crate) fn final_job(
    snapshot: &CharacterSnapshot,
) -> Result<PersistenceRetryJob, crate::retry::InvalidJob> {
    let request = SaveRequest {
        reason: SaveReason::Final,
        snapshot: snapshot.clone(),
        dumped_at: std::time::Instant::now(),
    };
    state_job(&request, "final")
}

/// Counts, logs and reports a logout save given up: written to neither its row nor a retry job
/// (its checkpoint still holds it).
pub(super) fn final_dropped(
    stats: &SaverStats,
    feedback: &dyn SaveFeedback,
    snapshot: &CharacterSnapshot,
) {
    let character_id = snapshot.character_id;
    stats.final_dropped(1);
    metrics::counter!(telemetry::SAVER_FINAL_DROPPED_TOTAL).increment(1);
    tracing::warn!(event = "final_flush_dropped", character = %character_id,
        "logout delta not written to Postgres; its checkpoint still loads");
    feedback.deliver(SaverEvent::FinalDropped {
        character_id,
        owner_epoch: snapshot.owner_epoch,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::character::StateJson;

    fn request(state: StateJson) -> SaveRequest {
        SaveRequest {
            reason: SaveReason::Final,
            snapshot: CharacterSnapshot {
                character_id: Uuid::now_v7(),
                account_id: Uuid::now_v7(),
                name: "Aria".into(),
                zone_ref: Some("zone-0".into()),
                room_ref: Some("r1".into()),
                state,
                chargen: None,
                state_version: 3,
                owner_epoch: 2,
                issue_mark: 0,
                schema_version: 1,
            },
            dumped_at: std::time::Instant::now(),
        }
    }

    #[test]
    fn a_document_the_job_cannot_carry_is_refused_rather_than_queued_as_null() {
        let depth = 200;
        let text = format!("{{\"deep\":{}1{}}}", "[".repeat(depth), "]".repeat(depth));
        let deep = StateJson::parse(text).unwrap_or_else(|e| panic!("{e}"));
        let refused = state_job(&request(deep), "final");
        assert!(
            refused.is_err_and(|e| e.0.contains("not a JSON tree")),
            "refused with its reason"
        );
        let shallow = StateJson::from(serde_json::json!({ "experience": 3 }));
        assert!(state_job(&request(shallow), "final").is_ok());
        // Just inside the tree's limit, yet too deep once the payload wraps it.
        let text = format!("{}1{}", "[".repeat(127), "]".repeat(127));
        let edge = StateJson::parse(text).unwrap_or_else(|e| panic!("{e}"));
        assert!(edge.tree().is_ok());
        assert!(state_job(&request(edge), "final").is_err());
    }

    #[test]
    fn nesting_counts_levels_of_arrays_and_objects() {
        assert_eq!(nesting(&serde_json::json!(1)), 0);
        assert_eq!(nesting(&serde_json::json!([])), 1);
        assert_eq!(
            nesting(&serde_json::json!({ "a": [1, { "b": [] }], "c": 2 })),
            4
        );
    }
}
