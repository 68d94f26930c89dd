//! A consumer incarnation: leases entries into its own processing list, acks or fails them, and
//! keeps its heartbeat alive while it runs.

use std::marker::PhantomData;
use std::sync::LazyLock;
use std::time::Duration;

use chrono::Utc;
use redis::{AsyncCommands, Script};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{DurableDeadLetterEntry, DurableWorkQueueEntry, QueueError, WorkQueue};
use crate::telemetry;

static SETTLE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/settle.lua")));
static LEASE_BATCH: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/lease_batch.lua")));
static ACK_BATCH: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/ack_batch.lua")));
static REQUEUE_HELD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/requeue_held.lua")));

/// Most entries one [`Consumer::requeue_held`] call moves.
const MAX_REQUEUE_HELD: usize = 10_000;

/// Most entries one batch lease takes.
pub const MAX_LEASE_BATCH: usize = 512;

/// Most undecodable entries one lease call dead-letters before giving up for now.
const MAX_POISON_PER_LEASE: usize = 64;

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
    id: String,
    processing: String,
    heartbeat: String,
    blocking: Option<redis::aio::MultiplexedConnection>,
    stop: CancellationToken,
    _item: PhantomData<fn() -> T>,
}

impl<T> Drop for Consumer<T> {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> WorkQueue<T> {
    /// Registers a new consumer incarnation (a fresh id) and starts its heartbeat.
    pub async fn consumer(&self) -> Result<Consumer<T>, QueueError> {
        let id = Uuid::now_v7().to_string();
        let keys = self.keys();
        let processing = keys.processing(&id)?;
        let heartbeat = keys.consumer_heartbeat(&id)?;
        let ttl = self.config().heartbeat_ttl;
        let () = redis::pipe()
            .atomic()
            .pset_ex(&heartbeat, 1, ttl.as_millis())
            .ignore()
            .sadd(&keys.consumers, &id)
            .ignore()
            .query_async(&mut self.redis().conn())
            .await?;
        let stop = CancellationToken::new();
        tokio::spawn(beat(
            self.redis().clone(),
            heartbeat.clone(),
            ttl,
            stop.clone(),
        ));
        Ok(Consumer {
            queue: self.clone(),
            id,
            processing,
            heartbeat,
            blocking: None,
            stop,
            _item: PhantomData,
        })
    }
}

async fn beat(redis: crate::RedisBackend, key: String, ttl: crate::Ttl, stop: CancellationToken) {
    let period = ttl.duration() / 3;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
        let refreshed: redis::RedisResult<()> =
            redis.conn().pset_ex(&key, 1, ttl.as_millis()).await;
        if let Err(err) = refreshed {
            tracing::warn!(event = "queue_heartbeat_failed", error = %err);
        }
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> Consumer<T> {
    /// This incarnation's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Leases the oldest pending entry without waiting; `None` when pending is empty.
    pub async fn lease(&mut self) -> Result<Option<Leased<T>>, QueueError> {
        for _ in 0..MAX_POISON_PER_LEASE {
            let raw: Option<Vec<u8>> = redis::cmd("LMOVE")
                .arg(&self.queue.keys().pending)
                .arg(&self.processing)
                .arg("RIGHT")
                .arg("LEFT")
                .query_async(&mut self.queue.redis().conn())
                .await?;
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
        if self.blocking.is_none() {
            let client = self.queue.redis().client();
            let config = redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(timeout + Duration::from_secs(5)));
            self.blocking = Some(
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?,
            );
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
        let raws: Vec<Vec<u8>> = LEASE_BATCH
            .key(&self.queue.keys().pending)
            .key(&self.processing)
            .arg(max.clamp(1, MAX_LEASE_BATCH))
            .invoke_async(&mut self.queue.redis().conn())
            .await?;
        let mut leased = Vec::with_capacity(raws.len());
        for raw in raws {
            if let Decoded::Entry(entry) = self.decode(Some(raw)).await? {
                leased.push(entry);
            }
        }
        Ok(leased)
    }

    /// Acks many entries in one round trip; one outcome each, in order.
    pub async fn ack_batch(&self, leased: &[Leased<T>]) -> Result<Vec<AckOutcome>, QueueError> {
        if leased.is_empty() {
            return Ok(Vec::new());
        }
        let mut call = ACK_BATCH.prepare_invoke();
        call.key(&self.processing);
        for entry in leased {
            call.arg(&entry.raw);
        }
        let flags: Vec<i64> = call.invoke_async(&mut self.queue.redis().conn()).await?;
        Ok(flags
            .into_iter()
            .map(|f| {
                if f == 1 {
                    AckOutcome::Acked
                } else {
                    AckOutcome::Stale
                }
            })
            .collect())
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
                self.move_to(&raw, &self.queue.keys().dead, &dead).await?;
                metrics::counter!(telemetry::QUEUE_DEAD_LETTERS_TOTAL, "queue" => self.queue.name().to_owned(), "cause" => "undecodable")
                    .increment(1);
                Ok(Decoded::Poison)
            }
        }
    }

    async fn move_to<S: Serialize>(
        &self,
        raw: &[u8],
        destination: &str,
        successor: &S,
    ) -> Result<bool, QueueError> {
        let body = serde_json::to_vec(successor).map_err(QueueError::Encode)?;
        let moved: i64 = SETTLE
            .key(&self.processing)
            .key(destination)
            .arg(raw)
            .arg(body)
            .invoke_async(&mut self.queue.redis().conn())
            .await?;
        Ok(moved == 1)
    }

    /// Done with `leased`: removes it from this consumer's processing list.
    pub async fn ack(&self, leased: &Leased<T>) -> Result<AckOutcome, QueueError> {
        let removed: i64 = self
            .queue
            .redis()
            .conn()
            .lrem(&self.processing, 1, &leased.raw)
            .await?;
        Ok(if removed == 1 {
            AckOutcome::Acked
        } else {
            AckOutcome::Stale
        })
    }

    /// `leased` failed with `error`: back to pending with one more attempt, or, at the attempt
    /// limit, a dead letter — atomically.
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
            if !self
                .move_to(&leased.raw, &self.queue.keys().dead, &dead)
                .await?
            {
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
            .move_to(&leased.raw, &self.queue.keys().pending, &retry)
            .await?
        {
            return Ok(FailOutcome::Stale);
        }
        Ok(FailOutcome::Retried { attempts })
    }

    /// Hands `leased` back to pending unchanged (no attempt counted): used to end a pass
    /// without spinning on an entry that already failed in it.
    pub async fn release(&self, leased: &Leased<T>) -> Result<bool, QueueError> {
        let moved: i64 = SETTLE
            .key(&self.processing)
            .key(&self.queue.keys().pending)
            .arg(&leased.raw)
            .arg(&leased.raw)
            .invoke_async(&mut self.queue.redis().conn())
            .await?;
        Ok(moved == 1)
    }

    /// Moves every entry this consumer's processing list holds back to pending, oldest first, so
    /// they are leased next; returns how many. For a consumer that handles one entry at a time,
    /// called when it holds nothing: a lease whose reply was lost (a connection cut mid-call)
    /// left its entry here, and no recovery would find it while this consumer lives. Work may
    /// run twice, so handlers must be idempotent (the queue is at-least-once anyway).
    pub async fn requeue_held(&self) -> Result<usize, QueueError> {
        let moved: i64 = REQUEUE_HELD
            .key(&self.processing)
            .key(&self.queue.keys().pending)
            .arg(MAX_REQUEUE_HELD)
            .invoke_async(&mut self.queue.redis().conn())
            .await?;
        Ok(usize::try_from(moved).unwrap_or(0))
    }

    /// Refreshes the heartbeat now (the background beat does this every third of the TTL).
    pub async fn heartbeat(&self) -> Result<(), QueueError> {
        let () = self
            .queue
            .redis()
            .conn()
            .pset_ex(
                &self.heartbeat,
                1,
                self.queue.config().heartbeat_ttl.as_millis(),
            )
            .await?;
        Ok(())
    }

    /// Stops heartbeating without a trace, as a crashed process would (tests and the simulator).
    pub fn abandon(self) {
        self.stop.cancel();
    }

    /// Clean shutdown: stops the heartbeat and leaves the consumer set. Entries still held are
    /// returned to pending first, since nobody will finish them.
    pub async fn shutdown(self) -> Result<(), QueueError> {
        self.stop.cancel();
        let keys = self.queue.keys();
        let mut conn = self.queue.redis().conn();
        loop {
            let moved: Option<Vec<u8>> = redis::cmd("LMOVE")
                .arg(&self.processing)
                .arg(&keys.pending)
                .arg("LEFT")
                .arg("RIGHT")
                .query_async(&mut conn)
                .await?;
            if moved.is_none() {
                break;
            }
        }
        let () = redis::pipe()
            .atomic()
            .del(&self.heartbeat)
            .ignore()
            .srem(&keys.consumers, &self.id)
            .ignore()
            .query_async(&mut conn)
            .await?;
        Ok(())
    }
}

enum Decoded<T> {
    Entry(Leased<T>),
    Empty,
    Poison,
}
