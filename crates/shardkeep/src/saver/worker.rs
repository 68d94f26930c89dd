//! The saver's batch handler. One pass: coalesce requests per character, write every snapshot's
//! checkpoint in one pipelined round trip, then CAS-save the flush and final snapshots in one
//! batched statement, and route each outcome.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

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
    cancel: CancellationToken,
}

impl SaverWorker {
    pub(super) fn new(
        store: Option<CharacterStore>,
        checkpoints: Option<CheckpointStore>,
        feedback: Arc<dyn SaveFeedback>,
        config: SaverConfig,
        stats: Arc<SaverStats>,
    ) -> Self {
        Self {
            store,
            checkpoints,
            feedback,
            config,
            stats,
            cancel: CancellationToken::new(),
        }
    }

    /// Stops background final retries with `cancel` (the shard's run context).
    pub(super) fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }
}

impl BatchHandler<Vec<SaveRequest>> for SaverWorker {
    async fn handle(&mut self, batch: Vec<Vec<SaveRequest>>) {
        let requests = coalesce(batch.into_iter().flatten().collect());
        for chunk in requests.chunks(self.config.write_chunk.clamp(1, MAX_SAVE_BATCH)) {
            // The two tiers are independent: write them concurrently.
            tokio::join!(self.write_checkpoints(chunk), self.write_rows(chunk));
        }
    }
}

/// Keeps one request per character: the latest snapshot (unless it is from an older owner) and
/// the strongest reason.
pub(super) fn coalesce(batch: Vec<SaveRequest>) -> Vec<SaveRequest> {
    let mut order: Vec<Uuid> = Vec::new();
    let mut merged: HashMap<Uuid, SaveRequest> = HashMap::new();
    for request in batch {
        let id = request.snapshot.character_id;
        match merged.get_mut(&id) {
            None => {
                order.push(id);
                merged.insert(id, request);
            }
            Some(kept) => {
                let reason = kept.reason.max(request.reason);
                if request.snapshot.owner_epoch >= kept.snapshot.owner_epoch {
                    kept.snapshot = request.snapshot;
                }
                kept.reason = reason;
            }
        }
    }
    order
        .into_iter()
        .filter_map(|id| merged.remove(&id))
        .collect()
}

impl SaverWorker {
    async fn write_checkpoints(&self, requests: &[SaveRequest]) {
        let Some(checkpoints) = &self.checkpoints else {
            return;
        };
        let snapshots: Vec<&CharacterSnapshot> = requests.iter().map(|r| &r.snapshot).collect();
        self.stats.checkpoint_attempted(snapshots.len() as u64);
        let result =
            tokio::time::timeout(self.config.io_timeout, checkpoints.write_many(&snapshots)).await;
        let writes = match result {
            Ok(Ok(writes)) => writes,
            Ok(Err(err)) => return self.checkpoint_failed(snapshots.len(), &err.to_string()),
            Err(_) => return self.checkpoint_failed(snapshots.len(), "timed out"),
        };
        for (snapshot, write) in snapshots.iter().zip(writes) {
            match write {
                CheckpointWrite::Written => self.stats.checkpoint_landed(1),
                CheckpointWrite::NotOwner { stored_epoch } => {
                    self.stats.checkpoint_refused(1);
                    metrics::counter!(telemetry::CHECKPOINT_REFUSED_TOTAL).increment(1);
                    tracing::warn!(event = "checkpoint_not_owner", character = %snapshot.character_id,
                        writer_epoch = snapshot.owner_epoch, stored_epoch, "double-own detected");
                    self.feedback.deliver(SaverEvent::DoubleOwn {
                        character_id: snapshot.character_id,
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

    async fn write_rows(&self, requests: &[SaveRequest]) {
        let Some(store) = &self.store else {
            return;
        };
        let rows: Vec<&SaveRequest> = requests.iter().filter(|r| r.reason.writes_row()).collect();
        if rows.is_empty() {
            return;
        }
        let snapshots: Vec<&CharacterSnapshot> = rows.iter().map(|r| &r.snapshot).collect();
        self.stats.row_attempted(snapshots.len() as u64);
        let started = Instant::now();
        let result =
            tokio::time::timeout(self.config.io_timeout, store.save_many(&snapshots)).await;
        metrics::histogram!(telemetry::SAVER_FLUSH_SECONDS).record(started.elapsed().as_secs_f64());
        let outcomes = match result {
            Ok(Ok(outcomes)) => outcomes,
            Ok(Err(err)) => return self.rows_failed(store, &rows, &err.to_string()),
            Err(_) => return self.rows_failed(store, &rows, "timed out"),
        };
        for (request, (_, outcome)) in rows.iter().zip(outcomes) {
            self.route(store, request, outcome).await;
        }
    }

    /// A batch did not reach Postgres. Flushes wait for the next cadence; a logout's final save
    /// has none, so it keeps retrying in the background.
    fn rows_failed(&self, store: &CharacterStore, rows: &[&SaveRequest], error: &str) {
        let count = rows.len();
        for request in rows.iter().filter(|r| r.reason == SaveReason::Final) {
            tokio::spawn(retry_final(
                FinalRetry {
                    store: store.clone(),
                    feedback: Arc::clone(&self.feedback),
                    stats: Arc::clone(&self.stats),
                    config: self.config,
                },
                (*request).clone(),
                self.cancel.clone(),
            ));
        }
        self.stats.row_failed(count as u64);
        metrics::counter!(telemetry::SAVER_WRITE_FAILURES_TOTAL, "tier" => "postgres")
            .increment(count as u64);
        tracing::warn!(
            event = "flush_failed",
            count,
            error,
            "retried at the next cadence"
        );
    }

    async fn route(&self, store: &CharacterStore, request: &SaveRequest, outcome: SaveOutcome) {
        let snapshot = &request.snapshot;
        let character_id = snapshot.character_id;
        match outcome {
            SaveOutcome::Saved(new_version) => {
                self.saved(request, snapshot.state_version, new_version)
            }
            SaveOutcome::OwnershipLost(current_epoch) => {
                self.ownership_lost(snapshot, current_epoch)
            }
            SaveOutcome::NotFound => {
                tracing::error!(event = "save_not_found", character = %character_id);
                self.feedback.deliver(SaverEvent::NotFound { character_id });
            }
            SaveOutcome::VersionConflict(current_version) => {
                self.stats.row_conflicts(1);
                metrics::counter!(telemetry::SAVER_CONFLICTS_TOTAL, "reason" => request.reason.as_str())
                    .increment(1);
                if request.reason == SaveReason::Final && !self.feedback.is_present(character_id) {
                    self.finalize(store, request, current_version).await;
                } else {
                    self.feedback.deliver(SaverEvent::FlushConflict {
                        character_id,
                        current_version,
                    });
                }
            }
        }
    }

    fn saved(&self, request: &SaveRequest, dumped_version: i64, new_version: i64) {
        self.stats.row_landed(1);
        self.feedback.deliver(SaverEvent::Saved {
            character_id: request.snapshot.character_id,
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
            current_epoch,
        });
    }

    /// The player is gone and nobody else will write this logout delta: rebase onto the current
    /// row and retry, bounded. Safe only because the epoch fence is a separate conjunct that a
    /// rebase cannot reach.
    async fn finalize(
        &self,
        store: &CharacterStore,
        request: &SaveRequest,
        mut current_version: i64,
    ) {
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
                    return self.saved(request, request.snapshot.state_version, new_version);
                }
                Ok(Ok(SaveOutcome::VersionConflict(v))) => current_version = v,
                Ok(Ok(SaveOutcome::OwnershipLost(epoch))) => {
                    return self.ownership_lost(&snapshot, epoch);
                }
                Ok(Ok(SaveOutcome::NotFound)) => break,
                Ok(Err(err)) => {
                    tracing::warn!(event = "final_flush_retry_failed", character = %snapshot.character_id, error = %err);
                }
                Err(_) => break,
            }
        }
        self.stats.final_dropped(1);
        metrics::counter!(telemetry::SAVER_FINAL_DROPPED_TOTAL).increment(1);
        tracing::warn!(event = "final_flush_dropped", character = %snapshot.character_id,
            "logout delta lost; the last durable flush still loads");
        self.feedback.deliver(SaverEvent::FinalDropped {
            character_id: snapshot.character_id,
        });
    }
}

/// What a background final retry needs.
struct FinalRetry {
    store: CharacterStore,
    feedback: Arc<dyn SaveFeedback>,
    stats: Arc<SaverStats>,
    config: SaverConfig,
}

/// Retries a logout's final save through a Postgres outage: backoff from 250 ms to 4 s, up to
/// the outage budget; version conflicts rebase (the epoch fence still applies); a crash of the
/// shard (`cancel`) abandons it.
async fn retry_final(retry: FinalRetry, request: SaveRequest, cancel: CancellationToken) {
    let FinalRetry {
        store,
        feedback,
        stats,
        config,
    } = retry;
    let character_id = request.snapshot.character_id;
    let deadline = Instant::now() + config.final_outage_budget;
    let mut snapshot = request.snapshot.clone();
    let mut pause = std::time::Duration::from_millis(250);
    let mut rebases = 0;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        match tokio::time::timeout(config.io_timeout, store.save(&snapshot)).await {
            Ok(Ok(SaveOutcome::Saved(new_version))) => {
                stats.row_landed(1);
                tracing::info!(event = "final_flush_recovered", character = %character_id);
                return feedback.deliver(SaverEvent::Saved {
                    character_id,
                    reason: SaveReason::Final,
                    dumped_version: request.snapshot.state_version,
                    new_version,
                });
            }
            Ok(Ok(SaveOutcome::VersionConflict(current))) if rebases < config.final_retries => {
                stats.row_conflicts(1);
                rebases += 1;
                snapshot.state_version = current;
                pause = std::time::Duration::ZERO;
                continue;
            }
            Ok(Ok(SaveOutcome::OwnershipLost(current_epoch))) => {
                stats.row_ownership_lost(1);
                return feedback.deliver(SaverEvent::OwnershipLost {
                    character_id,
                    current_epoch,
                });
            }
            Ok(Ok(SaveOutcome::NotFound)) => {
                return feedback.deliver(SaverEvent::NotFound { character_id });
            }
            Ok(Ok(SaveOutcome::VersionConflict(_))) => {}
            Ok(Err(_)) | Err(_) if Instant::now() < deadline => {
                pause = (pause * 2).clamp(
                    std::time::Duration::from_millis(250),
                    std::time::Duration::from_secs(4),
                );
                continue;
            }
            Ok(Err(_)) | Err(_) => {}
        }
        stats.final_dropped(1);
        metrics::counter!(telemetry::SAVER_FINAL_DROPPED_TOTAL).increment(1);
        tracing::warn!(event = "final_flush_dropped", character = %character_id,
            "logout delta lost; the last durable flush still loads");
        return feedback.deliver(SaverEvent::FinalDropped { character_id });
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn request(id: Uuid, reason: SaveReason, epoch: i64, marker: i64) -> SaveRequest {
        SaveRequest {
            reason,
            snapshot: CharacterSnapshot {
                character_id: id,
                account_id: Uuid::nil(),
                name: "n".into(),
                zone_ref: None,
                room_ref: None,
                state: json!({ "m": marker }),
                chargen: None,
                state_version: 1,
                owner_epoch: epoch,
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
        ]);
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0].snapshot.character_id, a);
        assert_eq!(merged[0].reason, SaveReason::Final);
        assert_eq!(
            merged[0].snapshot.state["m"], 3,
            "an older owner's later dump never wins"
        );
        assert_eq!(merged[1].reason, SaveReason::Checkpoint);
    }
}
