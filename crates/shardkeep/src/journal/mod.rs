//! The session lifecycle journal: cleanup after a realtime stream closes, made durable on the
//! generic work queue before anything relies on it.
//!
//! - [`plan`] — the effect plans (pure).
//! - [`cleanup`] — the producer side: append the entry, then remove the active session.
//! - [`worker`] — the consumer side: apply each entry's effects, skipping stale reconnects.

pub mod cleanup;
pub mod plan;
pub mod worker;

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use uuid::Uuid;

use crate::backend::RedisBackend;
use crate::coord::ResumeLedgerRecord;
use crate::operator::CharacterFilter;
use crate::queue::{
    DeadLetterRetention, DeadLetterView, QueueDepths, QueueError, WorkQueue, WorkQueueConfig,
};

pub use cleanup::{ActiveSession, ActiveSessions, CleanupOutcome, cleanup_stream};
pub use plan::{Effects, SessionLifecycleEffectPlan};
pub use worker::{
    DrainPass, EffectError, JournalStats, JournalWorker, JournalWorkerConfig, MAX_PASS_ENTRIES,
    MAX_PASS_TIME, Processed,
};

/// The queue name of the journal.
pub const JOURNAL_QUEUE: &str = "session-lifecycle";

/// The player as the stream left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlayerSnapshot {
    /// The character.
    pub character_id: Uuid,
    /// Its account.
    pub account_id: Uuid,
    /// Its name.
    pub character_name: String,
    /// The shard that hosted the session.
    pub shard_id: String,
    /// Durable location: zone (an instance's entrance, never the instance).
    pub zone: String,
    /// Durable location: room.
    pub room: String,
    /// The epoch of the copy the session drove; location writes are fenced by it.
    pub owner_epoch: i64,
    /// The copy's row version when the stream closed (its last write it knew of): a row with a
    /// newer live write holds a newer location, which the cleanup leaves alone. Absent in
    /// entries written before it existed.
    #[serde(default)]
    pub state_version: Option<i64>,
}

/// How the realtime session was connected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RealtimeRuntimeProfile {
    /// Transport (`quic`, `websocket`, …).
    pub transport: String,
    /// Negotiated protocol version.
    pub protocol_version: u32,
    /// Server tick rate the client was on.
    pub tick_rate_hz: u32,
}

/// The journal's work item: everything cleanup needs after a stream closed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RealtimeStreamCleanup {
    /// The closed session.
    pub session_token: String,
    /// The player.
    pub player: PlayerSnapshot,
    /// Its runtime profile.
    pub runtime_profile: RealtimeRuntimeProfile,
    /// The resume record to persist for a reconnect, if any.
    pub pending_resume: Option<ResumeLedgerRecord>,
    /// True when the target shard confirmed a transfer activation.
    pub transfer_confirmed: bool,
    /// What to do.
    pub plan: SessionLifecycleEffectPlan,
    /// When the stream closed.
    pub closed_at: DateTime<Utc>,
}

/// A journal dead letter, as operators see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JournalDeadLetterSummary {
    /// Dead letter id.
    pub dead_letter_id: Uuid,
    /// The entry it came from.
    pub entry_id: Option<Uuid>,
    /// Attempts made.
    pub attempts: u32,
    /// Why it failed.
    pub error: String,
    /// When.
    pub failed_at: DateTime<Utc>,
    /// The session (absent when the entry could not be decoded).
    pub session_token: Option<String>,
    /// The character.
    pub character_id: Option<Uuid>,
    /// Its name.
    pub character_name: Option<String>,
    /// The effect plan, what a requeue would do.
    pub plan: Option<SessionLifecycleEffectPlan>,
    /// Whether the transfer was confirmed.
    pub transfer_confirmed: Option<bool>,
}

fn summary(view: DeadLetterView<RealtimeStreamCleanup>) -> JournalDeadLetterSummary {
    JournalDeadLetterSummary {
        dead_letter_id: view.record.dead_letter_id,
        entry_id: view.record.entry_id,
        attempts: view.record.failed_attempts,
        error: view.record.error,
        failed_at: view.record.failed_at,
        session_token: view.item.as_ref().map(|i| i.session_token.clone()),
        character_id: view.item.as_ref().map(|i| i.player.character_id),
        character_name: view.item.as_ref().map(|i| i.player.character_name.clone()),
        plan: view.item.as_ref().map(|i| i.plan),
        transfer_confirmed: view.item.as_ref().map(|i| i.transfer_confirmed),
    }
}

/// Handle on the journal: append, inspect, requeue, and the worker's wake signal. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SessionJournal {
    queue: WorkQueue<RealtimeStreamCleanup>,
    wake: Arc<Notify>,
}

impl SessionJournal {
    /// The journal over `redis`.
    pub fn new(redis: RedisBackend, config: WorkQueueConfig) -> Result<Self, QueueError> {
        Ok(Self {
            queue: WorkQueue::new(redis, JOURNAL_QUEUE, config)?,
            wake: Arc::new(Notify::new()),
        })
    }

    /// The journal in the embedded store's file `db`, named by `keys`, its consumers'
    /// heartbeats timed by `clock`.
    pub fn embedded(
        db: crate::backend::SqliteBackend,
        keys: &crate::keyspace::Keyspace,
        config: WorkQueueConfig,
        clock: Arc<dyn crate::clock::Clock>,
    ) -> Result<Self, QueueError> {
        Ok(Self {
            queue: WorkQueue::embedded(db, keys, JOURNAL_QUEUE, config, clock)?,
            wake: Arc::new(Notify::new()),
        })
    }

    /// The underlying queue.
    pub fn queue(&self) -> &WorkQueue<RealtimeStreamCleanup> {
        &self.queue
    }

    /// The worker's wake signal (a lost notification only delays work to the next interval).
    pub fn wake_signal(&self) -> Arc<Notify> {
        Arc::clone(&self.wake)
    }

    /// Appends `cleanup` durably, then wakes the worker.
    pub async fn append(&self, cleanup: RealtimeStreamCleanup) -> Result<Uuid, QueueError> {
        let id = self.queue.append(cleanup).await?;
        self.wake.notify_one();
        Ok(id)
    }

    /// A page of dead letters, newest first: `limit` (clamped to 1..=500) after skipping
    /// `offset`, only those of `character` when given.
    pub async fn dead_letters_page(
        &self,
        offset: usize,
        limit: usize,
        character: Option<&CharacterFilter>,
    ) -> Result<Vec<JournalDeadLetterSummary>, QueueError> {
        let views = match character {
            None => self.queue.dead_letters_page(offset, limit).await?,
            Some(filter) => {
                self.queue
                    .dead_letters_matching(offset, limit, |view| {
                        view.item.as_ref().is_some_and(|item| {
                            filter.matches(item.player.character_id, &item.player.character_name)
                        })
                    })
                    .await?
            }
        };
        Ok(views.into_iter().map(summary).collect())
    }

    /// The retained dead letter `dead_letter_id` with its stored item (raw JSON, which may not
    /// decode), or `None`.
    pub async fn dead_letter(
        &self,
        dead_letter_id: Uuid,
    ) -> Result<Option<(JournalDeadLetterSummary, serde_json::Value)>, QueueError> {
        Ok(self.queue.dead_letter(dead_letter_id).await?.map(|view| {
            let item = view.record.item.clone();
            (summary(view), item)
        }))
    }

    /// One retention pass over the dead letters (see [`DeadLetterRetention`]).
    pub async fn dead_letters_prune(
        &self,
        retention: DeadLetterRetention,
    ) -> Result<u64, QueueError> {
        let removed = self.queue.dead_letters_prune(retention).await?;
        metrics::counter!(crate::telemetry::DEAD_LETTERS_PRUNED_TOTAL, "kind" => "journal")
            .increment(removed);
        Ok(removed)
    }

    /// Depths and the newest `limit` (clamped to 1..=500) dead letters.
    pub async fn inspect(
        &self,
        limit: usize,
    ) -> Result<(QueueDepths, Vec<JournalDeadLetterSummary>), QueueError> {
        let depths = self.queue.depths().await?;
        let letters = self.queue.dead_letters(limit).await?;
        let summaries = letters.into_iter().map(summary).collect();
        Ok((depths, summaries))
    }

    /// Requeues a dead letter as a fresh entry and wakes the worker; `None` when unknown.
    pub async fn requeue(&self, dead_letter_id: Uuid) -> Result<Option<Uuid>, QueueError> {
        let entry = self.queue.requeue(dead_letter_id).await?;
        if entry.is_some() {
            self.wake.notify_one();
        }
        Ok(entry)
    }
}
