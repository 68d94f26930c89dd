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
use crate::queue::{QueueDepths, QueueError, WorkQueue, WorkQueueConfig};

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

    /// Depths and the newest `limit` (clamped to 1..=500) dead letters.
    pub async fn inspect(
        &self,
        limit: usize,
    ) -> Result<(QueueDepths, Vec<JournalDeadLetterSummary>), QueueError> {
        let depths = self.queue.depths().await?;
        let letters = self.queue.dead_letters(limit).await?;
        let summaries = letters
            .into_iter()
            .map(|view| JournalDeadLetterSummary {
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
            })
            .collect();
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
