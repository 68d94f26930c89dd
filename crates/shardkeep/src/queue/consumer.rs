//! A consumer incarnation: leases entries into its own processing list, acks or fails them, and
//! keeps its heartbeat (and its place in the consumer set) alive while it runs.

use std::marker::PhantomData;
use std::sync::LazyLock;
use std::time::Duration;

use chrono::Utc;
use redis::Script;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::counting_script;
use super::embedded::{Destination, QueueFile};
use super::identity::Incarnation;
use super::{DurableDeadLetterEntry, DurableWorkQueueEntry, QueueError, WorkQueue};
use crate::telemetry;

static SETTLE: LazyLock<Script> = counting_script!("lua/settle.lua");
static LEASE_BATCH: LazyLock<Script> = counting_script!("lua/lease_batch.lua");
static ACK_BATCH: LazyLock<Script> = counting_script!("lua/ack_batch.lua");
static REQUEUE_HELD: LazyLock<Script> = counting_script!("lua/requeue_held.lua");
static LEAVE: LazyLock<Script> = counting_script!("lua/leave.lua");
static RECOUNT_ONE: LazyLock<Script> = counting_script!("lua/recount_one.lua");
static ACK_LEASE: LazyLock<Script> = counting_script!("lua/ack_lease.lua");

/// Most entries one [`Consumer::requeue_held`] or [`Consumer::shutdown`] call moves.
const MAX_REQUEUE_HELD: usize = 10_000;

/// Most entries one batch lease takes.
pub const MAX_LEASE_BATCH: usize = 512;

/// Most undecodable entries one lease call dead-letters before giving up for now.
const MAX_POISON_PER_LEASE: usize = 64;

/// Where a successor entry goes in its destination list.
#[derive(Debug, Clone, Copy)]
enum Place {
    /// The front of pending: leased next.
    Front,
    /// The newest end (dead letters).
    Newest,
}

impl Place {
    fn as_arg(self) -> &'static str {
        match self {
            Self::Front => "front",
            Self::Newest => "newest",
        }
    }
}

/// An entry this consumer holds.
#[derive(Debug, Clone, PartialEq)]
pub struct Leased<T> {
    raw: Vec<u8>,
    /// The decoded entry.
    pub entry: DurableWorkQueueEntry<T>,
}

/// How an ack ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// Removed from this consumer's processing list.
    Acked,
    /// No longer there (recovered after this consumer was presumed dead).
    Stale,
}

/// How a failure was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOutcome {
    /// Back to pending with this many attempts.
    Retried {
        /// Attempts so far.
        attempts: u32,
    },
    /// Out of attempts: now a dead letter.
    DeadLettered {
        /// The dead letter's id.
        dead_letter_id: Uuid,
    },
    /// No longer held by this consumer.
    Stale,
}

/// One consumer incarnation of a queue.
#[derive(Debug)]
pub struct Consumer<T> {
    queue: WorkQueue<T>,
    incarnation: Incarnation,
    processing: String,
    blocking: Option<crate::backend::redis::RedisConn>,
    stop: CancellationToken,
    _item: PhantomData<fn() -> T>,
}

impl<T> Drop for Consumer<T> {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> Consumer<T> {
    /// A consumer for `incarnation` (already registered), with its heartbeat started.
    pub(super) fn start(
        queue: &WorkQueue<T>,
        incarnation: Incarnation,
    ) -> Result<Self, QueueError> {
        let processing = queue.keys().processing(&incarnation.id)?;
        let stop = CancellationToken::new();
        tokio::spawn(incarnation.clone().beat(queue.clone(), stop.clone()));
        Ok(Self {
            queue: queue.clone(),
            incarnation,
            processing,
            blocking: None,
            stop,
            _item: PhantomData,
        })
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> Consumer<T> {
    /// This consumer's id (fresh per incarnation by default, or the stable id it claimed).
    pub fn id(&self) -> &str {
        &self.incarnation.id
    }

    /// Leases the oldest pending entry without waiting; `None` when pending is empty. The lease
    /// refreshes this consumer's heartbeat and registration in the same step.
    pub async fn lease(&mut self) -> Result<Option<Leased<T>>, QueueError> {
        for _ in 0..MAX_POISON_PER_LEASE {
            let raw = self.lease_raw(1).await?.pop();
            match self.decode(raw).await? {
                Decoded::Entry(leased) => return Ok(Some(leased)),
                Decoded::Empty => return Ok(None),
                Decoded::Poison => continue,
            }
        }
        Ok(None)
    }

    /// Leases the oldest pending entry, waiting up to `timeout` for one (BLMOVE on a connection
    /// of this consumer's own, so other traffic is never blocked behind it).
    pub async fn lease_blocking(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<Leased<T>>, QueueError> {
        // Registered (with a fresh heartbeat) before blocking; a stall while blocked is covered
        // by the beat and, failing that, by recovery's backstop.
        self.incarnation.refresh_if_due(&self.queue).await?;
        if let Some(file) = self.queue.file().cloned() {
            let deadline = tokio::time::Instant::now() + timeout;
            loop {
                // Registered before waiting, so an append that lands meanwhile wakes this wait.
                let woken = file.wake().notified();
                // A read first: waiting writes nothing (the background beat keeps the
                // registration alive).
                if file.has_pending().await?
                    && let Some(leased) = self.lease().await?
                {
                    return Ok(Some(leased));
                }
                let now = tokio::time::Instant::now();
                if now >= deadline {
                    return Ok(None);
                }
                // Another process on the same file cannot wake this one: look again at least
                // every 100 ms.
                let nap = (deadline - now).min(Duration::from_millis(100));
                let _ = tokio::time::timeout(nap, woken).await;
            }
        }
        if self.blocking.is_none() {
            let response = timeout + Duration::from_secs(5);
            self.blocking = Some(self.queue.redis()?.dedicated_conn(response).await?);
        }
        for _ in 0..MAX_POISON_PER_LEASE {
            let Some(conn) = self.blocking.as_mut() else {
                return Ok(None);
            };
            let raw: Option<Vec<u8>> = redis::cmd("BLMOVE")
                .arg(&self.queue.keys().pending)
                .arg(&self.processing)
                .arg("RIGHT")
                .arg("LEFT")
                .arg(timeout.as_secs_f64())
                .query_async(conn)
                .await?;
            if raw.is_some() {
                // No script can wrap a blocking move: count it in one of its own. Should that
                // fail, or this process die first, the next script to touch the list counts it;
                // the entry, already in this consumer's list, is handed out either way (an
                // error here would strand it there until the consumer dies).
                if let Err(err) = self.recount().await {
                    tracing::warn!(event = "queue_recount_failed", queue = self.queue.name(),
                        error = %err, "counted by the next script touching the list");
                }
            }
            match self.decode(raw).await? {
                Decoded::Entry(leased) => return Ok(Some(leased)),
                Decoded::Empty => return Ok(None),
                Decoded::Poison => continue,
            }
        }
        Ok(None)
    }

    /// Leases up to `max` (at most 512) of the oldest pending entries in one round trip, oldest
    /// first; undecodable ones are dead-lettered on the way.
    pub async fn lease_batch(&mut self, max: usize) -> Result<Vec<Leased<T>>, QueueError> {
        let raws = self.lease_raw(max.clamp(1, MAX_LEASE_BATCH)).await?;
        self.decode_all(raws).await
    }

    /// Acks `done` and leases up to `max` (at most 512) of the oldest pending entries, in one
    /// round trip: a consumer working through batches makes one script call per batch instead
    /// of two. One outcome per entry of `done`, in order, and the new entries, oldest first
    /// (undecodable ones are dead-lettered on the way).
    pub async fn ack_and_lease(
        &mut self,
        done: &[Leased<T>],
        max: usize,
    ) -> Result<(Vec<AckOutcome>, Vec<Leased<T>>), QueueError> {
        self.incarnation.check()?;
        if let Some(file) = self.queue.file() {
            let raws: Vec<&[u8]> = done.iter().map(|entry| entry.raw.as_slice()).collect();
            let (acked, leased) = self.lease_in_file(file, &raws, max).await?;
            let leased = self.decode_all(leased).await?;
            return Ok((acked.into_iter().map(ack_flag).collect(), leased));
        }
        let keys = self.queue.keys();
        let mut call = ACK_LEASE.prepare_invoke();
        call.key(&keys.pending)
            .key(&self.processing)
            .key(&self.incarnation.heartbeat)
            .key(&keys.consumers)
            .key(&keys.processing_held)
            .key(&keys.processing_total)
            .arg(max.clamp(1, MAX_LEASE_BATCH))
            .arg(&self.incarnation.id)
            .arg(&self.incarnation.token)
            .arg(self.queue.config().heartbeat_ttl.as_millis());
        for entry in done {
            call.arg(&entry.raw);
        }
        let reply = call.invoke_async(&mut self.queue.redis()?.conn()).await;
        let (flags, raws): (Vec<i64>, Vec<Vec<u8>>) = self.refreshed(reply)?;
        let leased = self.decode_all(raws).await?;
        Ok((flags.into_iter().map(ack_outcome).collect(), leased))
    }

    /// Decodes leased entries, dead-lettering undecodable ones.
    async fn decode_all(&self, raws: Vec<Vec<u8>>) -> Result<Vec<Leased<T>>, QueueError> {
        let mut leased = Vec::with_capacity(raws.len());
        for raw in raws {
            if let Decoded::Entry(entry) = self.decode(Some(raw)).await? {
                leased.push(entry);
            }
        }
        Ok(leased)
    }

    /// The reply of a script that refreshes this incarnation's heartbeat: `identity_lost` means
    /// another incarnation took the id over.
    fn refreshed<R>(&self, reply: redis::RedisResult<R>) -> Result<R, QueueError> {
        match reply {
            Err(err) if err.to_string().contains("identity_lost") => Err(self.incarnation.lost()),
            other => {
                let value = other?;
                self.incarnation.mark_refreshed();
                Ok(value)
            }
        }
    }

    /// Moves up to `max` of the oldest pending entries into this consumer's processing list,
    /// refreshing its heartbeat and registration in the same script.
    async fn lease_raw(&self, max: usize) -> Result<Vec<Vec<u8>>, QueueError> {
        self.incarnation.check()?;
        if let Some(file) = self.queue.file() {
            return Ok(self.lease_in_file(file, &[], max).await?.1);
        }
        let keys = self.queue.keys();
        let leased: redis::RedisResult<Vec<Vec<u8>>> = LEASE_BATCH
            .key(&keys.pending)
            .key(&self.processing)
            .key(&self.incarnation.heartbeat)
            .key(&keys.consumers)
            .key(&keys.processing_held)
            .key(&keys.processing_total)
            .arg(max)
            .arg(&self.incarnation.id)
            .arg(&self.incarnation.token)
            .arg(self.queue.config().heartbeat_ttl.as_millis())
            .invoke_async(&mut self.queue.redis()?.conn())
            .await;
        self.refreshed(leased)
    }

    /// Acks `done` and leases up to `max` in the embedded store's file, refreshing the heartbeat.
    async fn lease_in_file(
        &self,
        file: &QueueFile,
        done: &[&[u8]],
        max: usize,
    ) -> Result<(Vec<bool>, Vec<Vec<u8>>), QueueError> {
        let me = (
            self.incarnation.id.as_str(),
            self.incarnation.token.as_str(),
            self.queue.config().heartbeat_ttl,
        );
        match file.ack_and_lease(me, done, max).await? {
            Some(outcome) => {
                self.incarnation.mark_refreshed();
                Ok(outcome)
            }
            None => Err(self.incarnation.lost()),
        }
    }

    /// Acks many entries in one round trip; one outcome each, in order.
    pub async fn ack_batch(&self, leased: &[Leased<T>]) -> Result<Vec<AckOutcome>, QueueError> {
        if leased.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(file) = self.queue.file() {
            let raws: Vec<&[u8]> = leased.iter().map(|entry| entry.raw.as_slice()).collect();
            let acked = file.ack(&self.incarnation.id, &raws).await?;
            return Ok(acked.into_iter().map(ack_flag).collect());
        }
        let keys = self.queue.keys();
        let mut call = ACK_BATCH.prepare_invoke();
        call.key(&self.processing)
            .key(&keys.processing_held)
            .key(&keys.processing_total)
            .arg(&self.incarnation.id);
        for entry in leased {
            call.arg(&entry.raw);
        }
        let flags: Vec<i64> = call.invoke_async(&mut self.queue.redis()?.conn()).await?;
        Ok(flags.into_iter().map(ack_outcome).collect())
    }

    async fn decode(&self, raw: Option<Vec<u8>>) -> Result<Decoded<T>, QueueError> {
        let Some(raw) = raw else {
            return Ok(Decoded::Empty);
        };
        match serde_json::from_slice::<DurableWorkQueueEntry<T>>(&raw) {
            Ok(entry) => Ok(Decoded::Entry(Leased { raw, entry })),
            Err(err) => {
                let error = format!("entry does not decode: {err}");
                tracing::warn!(event = "queue_poison_entry", queue = self.queue.name(), error = %error);
                let entry_id = serde_json::from_slice::<serde_json::Value>(&raw)
                    .ok()
                    .and_then(|v| {
                        v.get("entry_id")
                            .and_then(|id| id.as_str())
                            .and_then(|s| s.parse().ok())
                    });
                let dead = DurableDeadLetterEntry {
                    dead_letter_id: Uuid::now_v7(),
                    entry_id,
                    failed_attempts: 0,
                    error,
                    failed_at: Utc::now(),
                    item: serde_json::Value::String(String::from_utf8_lossy(&raw).into_owned()),
                };
                self.move_to_dead(&raw, &dead).await?;
                metrics::counter!(telemetry::QUEUE_DEAD_LETTERS_TOTAL, "queue" => self.queue.name().to_owned(), "cause" => "undecodable")
                    .increment(1);
                Ok(Decoded::Poison)
            }
        }
    }

    async fn move_to<S: Serialize>(
        &self,
        raw: &[u8],
        destination: Destination,
        successor: &S,
    ) -> Result<bool, QueueError> {
        let body = serde_json::to_vec(successor).map_err(QueueError::Encode)?;
        self.settle(raw, destination, &body).await
    }

    /// Moves `raw` to the dead letters as `dead`, indexed by its id.
    async fn move_to_dead<S: Serialize>(
        &self,
        raw: &[u8],
        dead: &DurableDeadLetterEntry<S>,
    ) -> Result<bool, QueueError> {
        let body = serde_json::to_vec(dead).map_err(QueueError::Encode)?;
        self.settle(raw, Destination::Dead(dead.dead_letter_id), &body)
            .await
    }

    /// Moves the held entry `raw` to `destination` as `body`; false when this consumer no
    /// longer holds it.
    async fn settle(
        &self,
        raw: &[u8],
        destination: Destination,
        body: &[u8],
    ) -> Result<bool, QueueError> {
        if let Some(file) = self.queue.file() {
            return file
                .settle(&self.incarnation.id, raw, destination, body)
                .await;
        }
        let keys = self.queue.keys();
        let (destination, place, dead_letter_id) = match destination {
            Destination::Pending => (keys.pending.as_str(), Place::Front, None),
            Destination::Held => (self.processing.as_str(), Place::Newest, None),
            Destination::Dead(id) => (keys.dead.as_str(), Place::Newest, Some(id)),
        };
        let moved: i64 = SETTLE
            .key(&self.processing)
            .key(destination)
            .key(&keys.dead_index)
            .key(&keys.processing_held)
            .key(&keys.processing_total)
            .arg(raw)
            .arg(body)
            .arg(place.as_arg())
            .arg(dead_letter_id.map(|id| id.to_string()).unwrap_or_default())
            .arg(&self.incarnation.id)
            .invoke_async(&mut self.queue.redis()?.conn())
            .await?;
        Ok(moved == 1)
    }

    /// Sets this consumer's held count from its processing list's length.
    async fn recount(&self) -> Result<(), QueueError> {
        let keys = self.queue.keys();
        let _: i64 = RECOUNT_ONE
            .key(&self.processing)
            .key(&keys.processing_held)
            .key(&keys.processing_total)
            .arg(&self.incarnation.id)
            .invoke_async(&mut self.queue.redis()?.conn())
            .await?;
        Ok(())
    }

    /// Done with `leased`: removes it from this consumer's processing list.
    pub async fn ack(&self, leased: &Leased<T>) -> Result<AckOutcome, QueueError> {
        let mut outcomes = self.ack_batch(std::slice::from_ref(leased)).await?;
        Ok(outcomes.pop().unwrap_or(AckOutcome::Stale))
    }

    /// `leased` failed with `error`: back to the front of pending with one more attempt (it is
    /// retried before later entries), or, at the attempt limit, a dead letter — atomically.
    pub async fn fail(&self, leased: &Leased<T>, error: &str) -> Result<FailOutcome, QueueError>
    where
        T: Clone,
    {
        let attempts = leased.entry.attempts + 1;
        if attempts >= self.queue.config().max_attempts {
            let dead = DurableDeadLetterEntry {
                dead_letter_id: Uuid::now_v7(),
                entry_id: Some(leased.entry.entry_id),
                failed_attempts: attempts,
                error: error.to_owned(),
                failed_at: Utc::now(),
                item: leased.entry.item.clone(),
            };
            if !self.move_to_dead(&leased.raw, &dead).await? {
                return Ok(FailOutcome::Stale);
            }
            metrics::counter!(telemetry::QUEUE_DEAD_LETTERS_TOTAL, "queue" => self.queue.name().to_owned(), "cause" => "attempts")
                .increment(1);
            return Ok(FailOutcome::DeadLettered {
                dead_letter_id: dead.dead_letter_id,
            });
        }
        let retry = DurableWorkQueueEntry {
            attempts,
            ..leased.entry.clone()
        };
        if !self
            .move_to(&leased.raw, Destination::Pending, &retry)
            .await?
        {
            return Ok(FailOutcome::Stale);
        }
        Ok(FailOutcome::Retried { attempts })
    }

    /// `leased` failed with `error`, and the caller goes on with later entries: it stays held
    /// by this consumer with one more attempt (so neither this pass nor another worker runs it
    /// again meanwhile), until [`Consumer::requeue_held`] puts it back at the front of pending
    /// in its original order; at the attempt limit it is a dead letter at once.
    pub async fn fail_held(
        &self,
        leased: &Leased<T>,
        error: &str,
    ) -> Result<FailOutcome, QueueError>
    where
        T: Clone,
    {
        let attempts = leased.entry.attempts + 1;
        if attempts >= self.queue.config().max_attempts {
            return self.fail(leased, error).await;
        }
        let retry = DurableWorkQueueEntry {
            attempts,
            ..leased.entry.clone()
        };
        if !self.move_to(&leased.raw, Destination::Held, &retry).await? {
            return Ok(FailOutcome::Stale);
        }
        Ok(FailOutcome::Retried { attempts })
    }

    /// Hands `leased` back to the front of pending unchanged (no attempt counted): used to end
    /// a pass without spinning on an entry that already failed in it.
    pub async fn release(&self, leased: &Leased<T>) -> Result<bool, QueueError> {
        self.settle(&leased.raw, Destination::Pending, &leased.raw)
            .await
    }

    /// Moves every entry this consumer's processing list holds back to the front of pending, in
    /// the order they were leased, so they are leased next; returns how many. For a consumer that handles one entry at a time,
    /// called when it holds nothing: a lease whose reply was lost (a connection cut mid-call)
    /// left its entry here, and no recovery would find it while this consumer lives. Work may
    /// run twice, so handlers must be idempotent (the queue is at-least-once anyway).
    pub async fn requeue_held(&self) -> Result<usize, QueueError> {
        if let Some(file) = self.queue.file() {
            let (id, token) = (&self.incarnation.id, &self.incarnation.token);
            return match file.hand_back(id, token, false).await? {
                Some(moved) => Ok(moved),
                None => Err(self.incarnation.lost()),
            };
        }
        let keys = self.queue.keys();
        let moved: i64 = REQUEUE_HELD
            .key(&self.processing)
            .key(&keys.pending)
            .key(&self.incarnation.heartbeat)
            .key(&keys.processing_held)
            .key(&keys.processing_total)
            .arg(MAX_REQUEUE_HELD)
            .arg(&self.incarnation.token)
            .arg(&self.incarnation.id)
            .invoke_async(&mut self.queue.redis()?.conn())
            .await?;
        if moved < 0 {
            return Err(self.incarnation.lost());
        }
        Ok(usize::try_from(moved).unwrap_or(0))
    }

    /// Refreshes the heartbeat and registration now (the background beat does this every third
    /// of the TTL).
    pub async fn heartbeat(&self) -> Result<(), QueueError> {
        self.incarnation.refresh(&self.queue).await
    }

    /// Stops heartbeating without a trace, as a crashed process would (tests and the simulator).
    pub fn abandon(self) {
        self.stop.cancel();
    }

    /// Clean shutdown: hands every held entry back to the front of pending (nobody will finish
    /// them), stops the heartbeat and leaves the consumer set, in one step. A consumer whose id
    /// another incarnation took over touches nothing: those entries are the new holder's.
    pub async fn shutdown(self) -> Result<(), QueueError> {
        self.stop.cancel();
        if let Some(file) = self.queue.file() {
            let (id, token) = (&self.incarnation.id, &self.incarnation.token);
            return match file.hand_back(id, token, true).await? {
                Some(_) => Ok(()),
                None => Err(QueueError::IdentityLost(id.clone())),
            };
        }
        let keys = self.queue.keys();
        let moved: i64 = LEAVE
            .key(&self.processing)
            .key(&keys.pending)
            .key(&self.incarnation.heartbeat)
            .key(&keys.consumers)
            .key(&keys.processing_held)
            .key(&keys.processing_total)
            .arg(&self.incarnation.id)
            .arg(&self.incarnation.token)
            .arg(MAX_REQUEUE_HELD)
            .invoke_async(&mut self.queue.redis()?.conn())
            .await?;
        if moved < 0 {
            return Err(QueueError::IdentityLost(self.incarnation.id.clone()));
        }
        Ok(())
    }
}

fn ack_flag(acked: bool) -> AckOutcome {
    if acked {
        AckOutcome::Acked
    } else {
        AckOutcome::Stale
    }
}

fn ack_outcome(flag: i64) -> AckOutcome {
    if flag == 1 {
        AckOutcome::Acked
    } else {
        AckOutcome::Stale
    }
}

enum Decoded<T> {
    Entry(Leased<T>),
    Empty,
    Poison,
}
