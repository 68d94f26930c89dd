//! Recovery: returns to the front of pending, in their original order, only the entries of
//! consumers whose heartbeat is gone, under a lock so concurrent recoveries never double-deliver.
//! Each returned entry's `crash_count` goes up by one; an entry that reaches the crash limit
//! becomes a dead letter (a poison pill) instead of killing consumer after consumer.
//!
//! Candidates are the registered consumers, and, as a backstop, every processing list found by
//! a bounded SCAN whose consumer is not registered (however it fell out of the set): nothing a
//! dead consumer held is left unwalked.

use std::collections::HashSet;
use std::sync::LazyLock;

use chrono::Utc;
use redis::{AsyncCommands, Script};
use serde::Serialize;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::{DurableDeadLetterEntry, DurableWorkQueueEntry, QueueError, WorkQueue};
use crate::keyspace::QUEUE_RECOVERY_LOCK_TTL;
use crate::telemetry;

static RECOVER: LazyLock<Script> = super::counting_script!("lua/recover.lua");
static UNLOCK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/unlock.lua")));
static RECONCILE_TOTAL: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/reconcile_total.lua")));

/// Consumers examined per recovery pass.
const MAX_CONSUMERS_PER_PASS: usize = 10_000;
/// SCAN calls the backstop makes per pass (each examines about [`BACKSTOP_SCAN_COUNT`] keys of
/// the whole keyspace); the next pass goes on from where this one stopped, so a pass stays
/// bounded however large the keyspace, and the whole keyspace is covered every
/// `keys / (calls × count)` passes.
const BACKSTOP_CALLS_PER_PASS: usize = 64;
/// The COUNT hint of each backstop SCAN call.
const BACKSTOP_SCAN_COUNT: usize = 1000;
/// Entries moved per script call.
const RECOVER_CHUNK: isize = 256;

/// What a recovery pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RecoveryReport {
    /// False when another instance held the recovery lock (nothing was done).
    pub ran: bool,
    /// Consumers examined.
    pub consumers: usize,
    /// Consumers found dead (registered ones, and unregistered owners of processing lists).
    pub dead_consumers: usize,
    /// Processing lists found by the backstop whose consumer was not registered.
    pub unregistered: usize,
    /// Entries returned to pending.
    pub returned: usize,
    /// Entries dead-lettered as poison pills (or undecodable).
    pub poisoned: usize,
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> WorkQueue<T> {
    /// Returns the entries of dead consumers to pending, once, under the recovery lock.
    pub async fn recover(&self) -> Result<RecoveryReport, QueueError> {
        if self.file().is_some() {
            let report = self.recover_in_file().await?;
            self.report_recovery(&report);
            return Ok(report);
        }
        let keys = self.keys();
        let token = Uuid::now_v7().to_string();
        let mut conn = self.redis()?.conn();
        let locked: Option<String> = redis::cmd("SET")
            .arg(&keys.recovery_lock)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(QUEUE_RECOVERY_LOCK_TTL.as_millis())
            .query_async(&mut conn)
            .await?;
        if locked.is_none() {
            return Ok(RecoveryReport::default());
        }
        let result = self.recover_locked().await;
        let _: redis::RedisResult<i64> = UNLOCK
            .key(&keys.recovery_lock)
            .arg(&token)
            .invoke_async(&mut conn)
            .await;
        let report = result?;
        self.report_recovery(&report);
        Ok(report)
    }

    /// Counts and logs what a recovery pass returned.
    fn report_recovery(&self, report: &RecoveryReport) {
        if report.returned + report.poisoned > 0 {
            metrics::counter!(telemetry::QUEUE_RECOVERED_TOTAL, "queue" => self.name().to_owned())
                .increment(report.returned as u64);
            metrics::counter!(telemetry::QUEUE_DEAD_LETTERS_TOTAL, "queue" => self.name().to_owned(), "cause" => "poison")
                .increment(report.poisoned as u64);
            tracing::warn!(
                event = "queue_recovered",
                queue = self.name(),
                dead_consumers = report.dead_consumers,
                returned = report.returned,
                poisoned = report.poisoned
            );
        }
    }

    /// A recovery pass in the embedded store's file: each lapsed consumer's entries come back
    /// in one transaction that checks the heartbeat again, so no lock is needed.
    async fn recover_in_file(&self) -> Result<RecoveryReport, QueueError> {
        let Some(file) = self.file() else {
            return Ok(RecoveryReport::default());
        };
        let (consumers, lapsed, unregistered) = file.lapsed(MAX_CONSUMERS_PER_PASS).await?;
        let mut report = RecoveryReport {
            ran: true,
            consumers,
            unregistered,
            ..RecoveryReport::default()
        };
        for consumer in lapsed {
            if let Some((returned, poisoned)) = self.return_entries(&consumer, None).await? {
                report.dead_consumers += 1;
                report.returned += returned;
                report.poisoned += poisoned;
            }
        }
        Ok(report)
    }

    async fn recover_locked(&self) -> Result<RecoveryReport, QueueError> {
        let keys = self.keys();
        let mut conn = self.redis()?.conn();
        let mut report = RecoveryReport {
            ran: true,
            ..RecoveryReport::default()
        };
        let mut consumers = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, page): (u64, Vec<String>) = redis::cmd("SSCAN")
                .arg(&keys.consumers)
                .arg(cursor)
                .arg("COUNT")
                .arg(256)
                .query_async(&mut conn)
                .await?;
            consumers.extend(page);
            cursor = next;
            if cursor == 0 || consumers.len() >= MAX_CONSUMERS_PER_PASS {
                break;
            }
        }
        consumers.sort();
        consumers.dedup();
        report.consumers = consumers.len();
        let registered: HashSet<String> = consumers.iter().cloned().collect();
        let unregistered = self.unregistered_lists(&registered).await?;
        report.unregistered = unregistered.len();
        let found_by_backstop: HashSet<String> = unregistered.iter().cloned().collect();
        // A held count of a consumer that is neither registered nor owns a list found above (its
        // list deleted by hand, say) is recounted too, so the depth total cannot stay wrong.
        let counted = self
            .counted_elsewhere(&registered, &found_by_backstop)
            .await?;
        for consumer in consumers.into_iter().chain(unregistered).chain(counted) {
            let heartbeat = keys.consumer_heartbeat(&consumer)?;
            if conn.exists(&heartbeat).await? {
                continue;
            }
            if let Some((returned, poisoned)) = self.return_entries(&consumer, None).await? {
                report.dead_consumers += 1;
                if found_by_backstop.contains(&consumer) {
                    metrics::counter!(telemetry::QUEUE_BACKSTOP_RECOVERED_TOTAL, "queue" => self.name().to_owned())
                        .increment((returned + poisoned) as u64);
                }
                report.returned += returned;
                report.poisoned += poisoned;
            }
        }
        // The entries returned above stay reported whatever becomes of this last step.
        if let Err(err) = self.reconcile_total().await {
            tracing::warn!(event = "queue_total_reconcile_failed", queue = self.name(),
                error = %err, "tried again at the next pass");
        }
        Ok(report)
    }

    /// Puts the processing total right from the held counts (one script, bounded by
    /// [`MAX_CONSUMERS_PER_PASS`] counts), after the counts themselves were put right above.
    async fn reconcile_total(&self) -> Result<(), QueueError> {
        let keys = self.keys();
        let mut conn = self.redis()?.conn();
        let (sum, was): (i64, i64) = RECONCILE_TOTAL
            .key(&keys.processing_held)
            .key(&keys.processing_total)
            .arg(MAX_CONSUMERS_PER_PASS)
            .invoke_async(&mut conn)
            .await?;
        if sum >= 0 && sum != was {
            tracing::warn!(
                event = "queue_total_reconciled",
                queue = self.name(),
                was,
                now = sum,
                "the processing total had drifted from the held counts"
            );
        }
        Ok(())
    }

    /// Consumer ids with a held count that are neither in `registered` nor in `found` (at most
    /// [`MAX_CONSUMERS_PER_PASS`]).
    async fn counted_elsewhere(
        &self,
        registered: &HashSet<String>,
        found: &HashSet<String>,
    ) -> Result<Vec<String>, QueueError> {
        let mut conn = self.redis()?.conn();
        let mut ids = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, page): (u64, Vec<String>) = redis::cmd("HSCAN")
                .arg(&self.keys().processing_held)
                .arg(cursor)
                .arg("COUNT")
                .arg(256)
                .query_async(&mut conn)
                .await?;
            // Field, value, field, value…
            ids.extend(
                page.into_iter()
                    .step_by(2)
                    .filter(|id| !registered.contains(id) && !found.contains(id)),
            );
            cursor = next;
            if cursor == 0 || ids.len() >= MAX_CONSUMERS_PER_PASS {
                return Ok(ids);
            }
        }
    }

    /// Consumer ids of processing lists that are not in `registered`, found by the next slice
    /// of a SCAN of the keyspace (at most [`BACKSTOP_CALLS_PER_PASS`] calls; the cursor is kept
    /// for the next pass).
    async fn unregistered_lists(
        &self,
        registered: &HashSet<String>,
    ) -> Result<Vec<String>, QueueError> {
        let pattern = self.keys().processing_pattern();
        let mut found = Vec::new();
        let mut cursor = self.saved_backstop_cursor();
        for _ in 0..BACKSTOP_CALLS_PER_PASS {
            let (next, page) = self
                .redis()?
                .scan_page(cursor, &pattern, BACKSTOP_SCAN_COUNT)
                .await?;
            found.extend(
                page.iter()
                    .filter_map(|key| self.keys().consumer_of_processing(key))
                    .filter(|id| !registered.contains(id)),
            );
            cursor = next;
            if cursor.is_start() {
                break;
            }
        }
        if let Some(Ok(mut saved)) = self.backstop_cursor().map(std::sync::Mutex::lock) {
            *saved = cursor;
        }
        found.sort();
        found.dedup();
        Ok(found)
    }

    fn saved_backstop_cursor(&self) -> crate::backend::redis::ScanCursor {
        self.backstop_cursor()
            .and_then(|c| c.lock().ok().map(|c| *c))
            .unwrap_or(crate::backend::redis::ScanCursor::START)
    }

    /// Returns the entries of `consumer`'s processing list to the front of pending in their
    /// original order (newest chunk first, each chunk newest first, so the oldest is leased
    /// first), one crash more each. Only while its heartbeat is held by `holder` (`None`: while
    /// it has none). `None` when the heartbeat was not as expected (nothing more moved).
    pub(super) async fn return_entries(
        &self,
        consumer: &str,
        holder: Option<&str>,
    ) -> Result<Option<(usize, usize)>, QueueError> {
        if let Some(file) = self.file() {
            return file
                .return_entries(consumer, holder, |raw| self.successor(raw))
                .await;
        }
        let keys = self.keys();
        let mut conn = self.redis()?.conn();
        let heartbeat = keys.consumer_heartbeat(consumer)?;
        let processing = keys.processing(consumer)?;
        let (mut returned, mut poisoned) = (0, 0);
        loop {
            let entries: Vec<Vec<u8>> = conn.lrange(&processing, 0, RECOVER_CHUNK - 1).await?;
            let mut call = RECOVER.prepare_invoke();
            call.key(&processing)
                .key(&heartbeat)
                .key(&keys.pending)
                .key(&keys.dead)
                .key(&keys.consumers)
                .key(&keys.dead_index)
                .key(&keys.processing_held)
                .key(&keys.processing_total)
                .arg(consumer)
                .arg(holder.unwrap_or(""));
            for raw in &entries {
                let (successor, dead_letter_id) = self.successor(raw)?;
                call.arg(raw)
                    .arg(successor)
                    .arg(if dead_letter_id.is_some() { "d" } else { "p" })
                    .arg(dead_letter_id.map(|id| id.to_string()).unwrap_or_default());
            }
            let moved: Vec<i64> = call.invoke_async(&mut conn).await?;
            match moved.as_slice() {
                [r, p] => {
                    returned += usize::try_from(*r).unwrap_or(0);
                    poisoned += usize::try_from(*p).unwrap_or(0);
                }
                // The heartbeat is not as expected (a consumer came back to life, or another
                // incarnation took the id): leave the rest alone.
                _ => return Ok((returned + poisoned > 0).then_some((returned, poisoned))),
            }
            if entries.len() < RECOVER_CHUNK as usize {
                return Ok(Some((returned, poisoned)));
            }
        }
    }

    /// What an entry of a dead consumer becomes: back to pending with one more crash, or a dead
    /// letter when it has now crashed consumers too often (or cannot be read at all).
    fn successor(&self, raw: &[u8]) -> Result<(Vec<u8>, Option<Uuid>), QueueError> {
        // Decode generically so the item survives untouched even if this process's `T` differs.
        match serde_json::from_slice::<DurableWorkQueueEntry<serde_json::Value>>(raw) {
            Ok(mut entry) => {
                entry.crash_count += 1;
                if entry.crash_count >= self.config().crash_limit {
                    let dead = DurableDeadLetterEntry {
                        dead_letter_id: Uuid::now_v7(),
                        entry_id: Some(entry.entry_id),
                        failed_attempts: entry.attempts,
                        error: format!(
                            "poison pill: {} consumers died while processing this entry",
                            entry.crash_count
                        ),
                        failed_at: Utc::now(),
                        item: entry.item,
                    };
                    let body = serde_json::to_vec(&dead).map_err(QueueError::Encode)?;
                    Ok((body, Some(dead.dead_letter_id)))
                } else {
                    Ok((
                        serde_json::to_vec(&entry).map_err(QueueError::Encode)?,
                        None,
                    ))
                }
            }
            Err(err) => {
                let dead = DurableDeadLetterEntry {
                    dead_letter_id: Uuid::now_v7(),
                    entry_id: None,
                    failed_attempts: 0,
                    error: format!("entry does not decode: {err}"),
                    failed_at: Utc::now(),
                    item: serde_json::Value::String(String::from_utf8_lossy(raw).into_owned()),
                };
                let body = serde_json::to_vec(&dead).map_err(QueueError::Encode)?;
                Ok((body, Some(dead.dead_letter_id)))
            }
        }
    }
}
