//! Dead letters: a bounded, newest-first listing, and requeue — one script removes the dead
//! letter and pushes a fresh pending entry, so two concurrent requeues make one entry.

use std::sync::LazyLock;

use chrono::Utc;
use redis::{AsyncCommands, Script};
use serde::Serialize;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::{DurableDeadLetterEntry, DurableWorkQueueEntry, QueueError, WorkQueue};
use crate::telemetry;

static REQUEUE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/requeue.lua")));

/// Most dead letters one listing returns.
pub const MAX_DEAD_LETTER_LIST: usize = 500;
/// Dead letters a requeue searches, newest first, for the id.
const REQUEUE_SEARCH: usize = 10_000;

/// A dead letter as listed: the stored record, and its item decoded when it can be.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterView<T> {
    /// The record, its item as raw JSON.
    pub record: DurableDeadLetterEntry<serde_json::Value>,
    /// The item as `T`, when it decodes.
    pub item: Option<T>,
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> WorkQueue<T> {
    /// The newest `limit` dead letters (clamped to 1..=500).
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetterView<T>>, QueueError> {
        let limit = limit.clamp(1, MAX_DEAD_LETTER_LIST) as isize;
        let raws: Vec<Vec<u8>> = self
            .redis()
            .conn()
            .lrange(&self.keys().dead, 0, limit - 1)
            .await?;
        Ok(raws
            .iter()
            .filter_map(|raw| {
                let record: DurableDeadLetterEntry<serde_json::Value> = serde_json::from_slice(raw)
                    .map_err(|e| tracing::warn!(event = "dead_letter_unreadable", error = %e))
                    .ok()?;
                let item = serde_json::from_value(record.item.clone()).ok();
                Some(DeadLetterView { record, item })
            })
            .collect())
    }

    /// Turns dead letter `dead_letter_id` into a fresh pending entry (new entry id, attempts and
    /// crash count reset); `Ok(None)` when no such dead letter exists (or another requeue won).
    pub async fn requeue(&self, dead_letter_id: Uuid) -> Result<Option<Uuid>, QueueError> {
        let mut conn = self.redis().conn();
        let mut start = 0isize;
        while (start as usize) < REQUEUE_SEARCH {
            let page: Vec<Vec<u8>> = conn.lrange(&self.keys().dead, start, start + 499).await?;
            for raw in &page {
                let Ok(record) =
                    serde_json::from_slice::<DurableDeadLetterEntry<serde_json::Value>>(raw)
                else {
                    continue;
                };
                if record.dead_letter_id != dead_letter_id {
                    continue;
                }
                if serde_json::from_value::<T>(record.item.clone()).is_err() {
                    return Err(QueueError::Undecodable(dead_letter_id));
                }
                let entry = DurableWorkQueueEntry {
                    entry_id: Uuid::now_v7(),
                    attempts: 0,
                    crash_count: 0,
                    enqueued_at: Utc::now(),
                    item: record.item,
                };
                let body = serde_json::to_vec(&entry).map_err(QueueError::Encode)?;
                let moved: i64 = REQUEUE
                    .key(&self.keys().dead)
                    .key(&self.keys().pending)
                    .arg(raw)
                    .arg(body)
                    .invoke_async(&mut conn)
                    .await?;
                if moved == 1 {
                    metrics::counter!(telemetry::QUEUE_REQUEUED_TOTAL, "queue" => self.name().to_owned()).increment(1);
                    return Ok(Some(entry.entry_id));
                }
                return Ok(None);
            }
            if page.len() < 500 {
                break;
            }
            start += 500;
        }
        Ok(None)
    }
}
