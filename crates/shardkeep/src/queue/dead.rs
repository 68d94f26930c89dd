//! Dead letters: newest-first pages, lookup and requeue by id through an index beside the list
//! (so any retained letter is found, however deep), and retention by age and count. One script
//! removes a dead letter and pushes a fresh pending entry, so two concurrent requeues make one.

use std::sync::LazyLock;
use std::time::Duration;

use chrono::Utc;
use redis::{AsyncCommands, Script};
use serde::Serialize;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::{DurableDeadLetterEntry, DurableWorkQueueEntry, QueueError, WorkQueue};
use crate::telemetry;

static REQUEUE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/requeue.lua")));
static PRUNE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/prune_dead.lua")));

/// Most dead letters one listing returns.
pub const MAX_DEAD_LETTER_LIST: usize = 500;
/// Dead letters read per round trip when a walk of the list is needed.
const PAGE: isize = 500;
/// How deep a lookup walks the list when the index misses (letters written before the index
/// existed were always within the newest 10,000 the old requeue searched).
const UNINDEXED_SEARCH: isize = 10_000;
/// Dead letters one retention pass removes at most.
const PRUNE_BATCH: isize = 1_000;

/// How long and how many dead letters a queue keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadLetterRetention {
    /// Dead letters older than this are removed (30 days).
    pub max_age: Duration,
    /// At most this many are kept, the newest (100,000).
    pub max_count: usize,
}

impl Default for DeadLetterRetention {
    fn default() -> Self {
        Self {
            max_age: Duration::from_secs(30 * 86_400),
            max_count: 100_000,
        }
    }
}

/// A dead letter as listed: the stored record, and its item decoded when it can be.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterView<T> {
    /// The record, its item as raw JSON.
    pub record: DurableDeadLetterEntry<serde_json::Value>,
    /// The item as `T`, when it decodes.
    pub item: Option<T>,
}

fn view<T: DeserializeOwned>(raw: &[u8]) -> Option<DeadLetterView<T>> {
    let record: DurableDeadLetterEntry<serde_json::Value> = serde_json::from_slice(raw)
        .map_err(|e| tracing::warn!(event = "dead_letter_unreadable", error = %e))
        .ok()?;
    let item = serde_json::from_value(record.item.clone()).ok();
    Some(DeadLetterView { record, item })
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> WorkQueue<T> {
    /// The newest `limit` dead letters (clamped to 1..=500).
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetterView<T>>, QueueError> {
        self.dead_letters_page(0, limit).await
    }

    /// `limit` dead letters (clamped to 1..=500), newest first, skipping the newest `offset`.
    pub async fn dead_letters_page(
        &self,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<DeadLetterView<T>>, QueueError> {
        if let Some(file) = self.file() {
            let raws = file
                .dead_page(offset, limit.clamp(1, MAX_DEAD_LETTER_LIST))
                .await?;
            return Ok(raws.iter().filter_map(|raw| view(raw)).collect());
        }
        let limit = limit.clamp(1, MAX_DEAD_LETTER_LIST) as isize;
        let start = isize::try_from(offset)
            .unwrap_or(isize::MAX)
            .min(isize::MAX - limit);
        let raws: Vec<Vec<u8>> = self
            .redis()?
            .conn()
            .lrange(&self.keys().dead, start, start + limit - 1)
            .await?;
        Ok(raws.iter().filter_map(|raw| view(raw)).collect())
    }

    /// Every retained dead letter matching `keep`, newest first, skipping `offset` matches and
    /// returning at most `limit` (clamped to 1..=500) — a walk of the list in pages.
    pub async fn dead_letters_matching(
        &self,
        offset: usize,
        limit: usize,
        keep: impl Fn(&DeadLetterView<T>) -> bool,
    ) -> Result<Vec<DeadLetterView<T>>, QueueError> {
        let limit = limit.clamp(1, MAX_DEAD_LETTER_LIST);
        let (mut start, mut skipped, mut found) = (0isize, 0usize, Vec::new());
        loop {
            let raws: Vec<Vec<u8>> = match self.file() {
                Some(file) => {
                    let from = usize::try_from(start).unwrap_or(usize::MAX);
                    file.dead_page(from, PAGE as usize).await?
                }
                None => {
                    self.redis()?
                        .conn()
                        .lrange(&self.keys().dead, start, start + PAGE - 1)
                        .await?
                }
            };
            for letter in raws.iter().filter_map(|raw| view(raw)) {
                if !keep(&letter) {
                    continue;
                }
                if skipped < offset {
                    skipped += 1;
                } else if found.len() < limit {
                    found.push(letter);
                } else {
                    return Ok(found);
                }
            }
            if raws.len() < PAGE as usize {
                return Ok(found);
            }
            start += PAGE;
        }
    }

    /// The dead letter `dead_letter_id` as stored, through the index; a letter written before
    /// the index existed is found by walking the newest 10,000.
    async fn dead_letter_raw(&self, dead_letter_id: Uuid) -> Result<Option<Vec<u8>>, QueueError> {
        if let Some(file) = self.file() {
            return file.dead_by_id(dead_letter_id).await;
        }
        let mut conn = self.redis()?.conn();
        let indexed: Option<Vec<u8>> = conn
            .hget(&self.keys().dead_index, dead_letter_id.to_string())
            .await?;
        if indexed.is_some() {
            return Ok(indexed);
        }
        let mut start = 0isize;
        loop {
            let page: Vec<Vec<u8>> = conn
                .lrange(&self.keys().dead, start, start + PAGE - 1)
                .await?;
            let hit = page.iter().find(|raw| {
                serde_json::from_slice::<DurableDeadLetterEntry<serde_json::Value>>(raw)
                    .is_ok_and(|r| r.dead_letter_id == dead_letter_id)
            });
            if let Some(raw) = hit {
                return Ok(Some(raw.clone()));
            }
            start += PAGE;
            if page.len() < PAGE as usize || start >= UNINDEXED_SEARCH {
                return Ok(None);
            }
        }
    }

    /// The retained dead letter `dead_letter_id`, if any.
    pub async fn dead_letter(
        &self,
        dead_letter_id: Uuid,
    ) -> Result<Option<DeadLetterView<T>>, QueueError> {
        Ok(self
            .dead_letter_raw(dead_letter_id)
            .await?
            .and_then(|raw| view(&raw)))
    }

    /// Turns dead letter `dead_letter_id` into a fresh pending entry (new entry id, attempts and
    /// crash count reset); `Ok(None)` when no such dead letter is retained (or another requeue
    /// won).
    pub async fn requeue(&self, dead_letter_id: Uuid) -> Result<Option<Uuid>, QueueError> {
        let Some(raw) = self.dead_letter_raw(dead_letter_id).await? else {
            return Ok(None);
        };
        let record: DurableDeadLetterEntry<serde_json::Value> =
            serde_json::from_slice(&raw).map_err(|_| QueueError::Undecodable(dead_letter_id))?;
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
        let moved: i64 = if let Some(file) = self.file() {
            i64::from(file.requeue(dead_letter_id, &raw, &body).await?)
        } else {
            REQUEUE
                .key(&self.keys().dead)
                .key(&self.keys().pending)
                .key(&self.keys().dead_index)
                .arg(&raw)
                .arg(body)
                .arg(dead_letter_id.to_string())
                .invoke_async(&mut self.redis()?.conn())
                .await?
        };
        if moved == 1 {
            metrics::counter!(telemetry::QUEUE_REQUEUED_TOTAL, "queue" => self.name().to_owned())
                .increment(1);
            return Ok(Some(entry.entry_id));
        }
        Ok(None)
    }

    /// One retention pass: removes (at most 1,000) dead letters beyond `max_count` or older than
    /// `max_age`, oldest first, from the list and the index. Returns how many went.
    pub async fn dead_letters_prune(
        &self,
        retention: DeadLetterRetention,
    ) -> Result<u64, QueueError> {
        if let Some(file) = self.file() {
            let age =
                chrono::Duration::from_std(retention.max_age).unwrap_or(chrono::Duration::MAX);
            let cutoff = Utc::now()
                .checked_sub_signed(age)
                .unwrap_or(chrono::DateTime::<Utc>::MIN_UTC);
            let batch = usize::try_from(PRUNE_BATCH).unwrap_or(1_000);
            return file.prune(retention.max_count, cutoff, batch).await;
        }
        let mut conn = self.redis()?.conn();
        let len: isize = conn.llen(&self.keys().dead).await?;
        let keep = isize::try_from(retention.max_count).unwrap_or(isize::MAX);
        let over_count = (len - keep).clamp(0, PRUNE_BATCH);
        // The oldest end of the list: the last `PRUNE_BATCH` letters, oldest last.
        let oldest: Vec<Vec<u8>> = conn.lrange(&self.keys().dead, -PRUNE_BATCH, -1).await?;
        let age = chrono::Duration::from_std(retention.max_age).unwrap_or(chrono::Duration::MAX);
        let cutoff = Utc::now()
            .checked_sub_signed(age)
            .unwrap_or(chrono::DateTime::<Utc>::MIN_UTC);
        let mut doomed: Vec<(&[u8], String)> = Vec::new();
        for (from_oldest, raw) in oldest.iter().rev().enumerate() {
            let record =
                serde_json::from_slice::<DurableDeadLetterEntry<serde_json::Value>>(raw).ok();
            // An unreadable letter can never be requeued: it goes with the expired ones.
            let expired = record.as_ref().is_none_or(|r| r.failed_at < cutoff);
            if (from_oldest as isize) < over_count || expired {
                let id = record
                    .map(|r| r.dead_letter_id.to_string())
                    .unwrap_or_default();
                doomed.push((raw, id));
            } else {
                break;
            }
        }
        if doomed.is_empty() {
            return Ok(0);
        }
        let mut call = PRUNE.prepare_invoke();
        call.key(&self.keys().dead).key(&self.keys().dead_index);
        for (raw, id) in &doomed {
            call.arg(*raw).arg(id);
        }
        Ok(call.invoke_async(&mut conn).await?)
    }
}
