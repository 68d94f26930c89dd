//! Who a consumer is. By default every consumer is a new incarnation with a fresh id, so no two
//! processes ever share one; a crashed one's entries come back once its heartbeat lapses and a
//! recovery pass runs (heartbeat TTL + recovery interval). A stable id (`consumer_with_id`, for
//! example a StatefulSet ordinal) lets a restarted process take its predecessor's entries back
//! itself, at once, instead of waiting for another worker's recovery; a second live process
//! asking for an id in use is refused.
//!
//! Each incarnation has a token, stored as its heartbeat's value. A heartbeat refresh (every
//! third of the TTL, and every lease) re-registers the consumer in the same script, and only
//! while the id is still this incarnation's: a process can never keep another's heartbeat alive.

use std::sync::Arc;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::{Script, Value};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::consumer::Consumer;
use super::embedded::Beat;
use super::{QueueError, WorkQueue};
use crate::coord::handoff::is;
use crate::ttl::Ttl;

static HEARTBEAT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/heartbeat.lua")));
static CLAIM_IDENTITY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/claim_identity.lua")));

/// Longest stable consumer id accepted.
pub const MAX_CONSUMER_ID: usize = 128;

/// One consumer incarnation: its id, its token, and whether it lost the id to another.
#[derive(Debug, Clone)]
pub(super) struct Incarnation {
    pub(super) id: String,
    pub(super) token: String,
    pub(super) heartbeat: String,
    consumers: String,
    queue: String,
    ttl: Ttl,
    lost: Arc<AtomicBool>,
    /// When the heartbeat was last refreshed, in milliseconds since `born`.
    refreshed_ms: Arc<AtomicU64>,
    born: Instant,
}

impl Incarnation {
    fn new<T: Serialize + DeserializeOwned + Send + Sync + 'static>(
        queue: &WorkQueue<T>,
        id: String,
    ) -> Result<Self, QueueError> {
        Ok(Self {
            heartbeat: queue.keys().consumer_heartbeat(&id)?,
            consumers: queue.keys().consumers.clone(),
            queue: queue.name().to_owned(),
            token: Uuid::now_v7().to_string(),
            ttl: queue.config().heartbeat_ttl,
            lost: Arc::default(),
            refreshed_ms: Arc::default(),
            born: Instant::now(),
            id,
        })
    }

    /// `Err(IdentityLost)` once another incarnation took the id over.
    pub(super) fn check(&self) -> Result<(), QueueError> {
        if self.lost.load(Ordering::Relaxed) {
            return Err(QueueError::IdentityLost(self.id.clone()));
        }
        Ok(())
    }

    /// Marks the id lost; the error to return.
    pub(super) fn lost(&self) -> QueueError {
        if !self.lost.swap(true, Ordering::Relaxed) {
            tracing::error!(event = "queue_consumer_identity_lost", consumer = %self.id,
                "another incarnation took this consumer id over; this consumer stops");
        }
        QueueError::IdentityLost(self.id.clone())
    }

    /// Refreshes the heartbeat and re-registers the id, unless another incarnation holds it.
    pub(super) async fn refresh<T: Serialize + DeserializeOwned + Send + Sync + 'static>(
        &self,
        queue: &WorkQueue<T>,
    ) -> Result<(), QueueError> {
        self.check()?;
        let refreshed: i64 = match queue.file() {
            Some(file) => match file.heartbeat(&self.id, &self.token, self.ttl).await? {
                Beat::Refreshed => 1,
                Beat::Reregistered => 2,
                Beat::Lost => 0,
            },
            None => {
                HEARTBEAT
                    .key(&self.heartbeat)
                    .key(&self.consumers)
                    .arg(&self.id)
                    .arg(&self.token)
                    .arg(self.ttl.as_millis())
                    .invoke_async(&mut queue.redis()?.conn())
                    .await?
            }
        };
        if refreshed >= 1 {
            if refreshed == 2 {
                tracing::info!(event = "queue_consumer_reregistered", queue = %self.queue, consumer = %self.id);
                metrics::counter!(crate::telemetry::QUEUE_CONSUMERS_REREGISTERED_TOTAL, "queue" => self.queue.clone())
                    .increment(1);
            }
            self.mark_refreshed();
            Ok(())
        } else {
            Err(self.lost())
        }
    }

    /// Records that the heartbeat was just refreshed (by a refresh or a lease script).
    pub(super) fn mark_refreshed(&self) {
        let ms = u64::try_from(self.born.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.refreshed_ms.store(ms, Ordering::Relaxed);
    }

    /// Refreshes unless a refresh landed within the last third of the TTL (then the heartbeat,
    /// and so the registration, is certainly alive): what a blocking lease does first, so a
    /// consumer back from a stall is registered again before it can take anything.
    pub(super) async fn refresh_if_due<T: Serialize + DeserializeOwned + Send + Sync + 'static>(
        &self,
        queue: &WorkQueue<T>,
    ) -> Result<(), QueueError> {
        self.check()?;
        let last = Duration::from_millis(self.refreshed_ms.load(Ordering::Relaxed));
        let since = self.born.elapsed().saturating_sub(last);
        if self.refreshed_ms.load(Ordering::Relaxed) > 0 && since < self.ttl.duration() / 3 {
            return Ok(());
        }
        self.refresh(queue).await
    }

    /// The background heartbeat: every third of the TTL until `stop`, or until the id is lost.
    pub(super) async fn beat<T: Serialize + DeserializeOwned + Send + Sync + 'static>(
        self,
        queue: WorkQueue<T>,
        stop: CancellationToken,
    ) {
        let period = self.ttl.duration() / 3;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(period) => {}
            }
            match self.refresh(&queue).await {
                Ok(()) => {}
                Err(QueueError::IdentityLost(_)) => return,
                Err(err) => tracing::warn!(event = "queue_heartbeat_failed", error = %err),
            }
        }
    }
}

impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> WorkQueue<T> {
    /// A new consumer incarnation with a fresh id, registered, its heartbeat started. A crash
    /// leaves its entries for any worker's recovery once its heartbeat lapses: within the
    /// heartbeat TTL plus one recovery interval.
    pub async fn consumer(&self) -> Result<Consumer<T>, QueueError> {
        let incarnation = Incarnation::new(self, Uuid::now_v7().to_string())?;
        incarnation.refresh(self).await?;
        Consumer::start(self, incarnation)
    }

    /// A consumer with the stable id `id` (1 to 128 characters of `[A-Za-z0-9_.-]`), for a
    /// process that restarts under the same name. It waits for the id to be free: at once
    /// after a clean shutdown, within the heartbeat TTL after a crash (the predecessor's
    /// heartbeat lapses). Once it holds the id, it returns the predecessor's held entries to
    /// the front of pending itself (counted as a crash), without waiting for a recovery pass.
    /// If the id's heartbeat is refreshed meanwhile, a live process holds it: refused with
    /// [`QueueError::IdentityInUse`], within about a third of the TTL.
    pub async fn consumer_with_id(&self, id: &str) -> Result<Consumer<T>, QueueError> {
        let valid = !id.is_empty()
            && id.len() <= MAX_CONSUMER_ID
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !valid {
            return Err(QueueError::InvalidConsumerId(id.to_owned()));
        }
        let incarnation = Incarnation::new(self, id.to_owned())?;
        self.claim_identity(&incarnation).await?;
        let report = self.return_entries(id, Some(&incarnation.token)).await?;
        if let Some((returned, poisoned)) = report
            && returned + poisoned > 0
        {
            tracing::warn!(
                event = "queue_predecessor_recovered",
                queue = self.name(),
                consumer = id,
                returned,
                poisoned,
                "a restarted consumer took its predecessor's entries back"
            );
        }
        Consumer::start(self, incarnation)
    }

    /// Waits for `incarnation`'s id to be free and claims it; refuses when a live holder
    /// refreshes its heartbeat meanwhile.
    async fn claim_identity(&self, incarnation: &Incarnation) -> Result<(), QueueError> {
        let ttl = incarnation.ttl.duration();
        let deadline = tokio::time::Instant::now() + ttl + ttl / 2;
        let poll = (ttl / 10).clamp(Duration::from_millis(20), Duration::from_millis(500));
        let mut last_remaining: Option<i64> = None;
        loop {
            if let Some(file) = self.file() {
                let held = file
                    .claim_identity(&incarnation.id, &incarnation.token, incarnation.ttl)
                    .await?;
                let Some(remaining) = held else {
                    return Ok(());
                };
                let refreshed = last_remaining.is_some_and(|last| remaining > last);
                if refreshed || tokio::time::Instant::now() >= deadline {
                    return Err(QueueError::IdentityInUse(incarnation.id.clone()));
                }
                last_remaining = Some(remaining);
                tokio::time::sleep(poll).await;
                continue;
            }
            let reply: Vec<Value> = CLAIM_IDENTITY
                .key(&incarnation.heartbeat)
                .key(&incarnation.consumers)
                .arg(&incarnation.id)
                .arg(&incarnation.token)
                .arg(incarnation.ttl.as_millis())
                .invoke_async(&mut self.redis()?.conn())
                .await?;
            let remaining = match reply.as_slice() {
                [tag] if is(tag, "claimed") => return Ok(()),
                [tag, Value::Int(ms)] if is(tag, "held") => *ms,
                other => {
                    return Err(QueueError::Redis(redis::RedisError::from((
                        redis::ErrorKind::UnexpectedReturnType,
                        "identity claim",
                        format!("{other:?}"),
                    ))));
                }
            };
            // A lapsing heartbeat only counts down; one that went up was refreshed by a live
            // holder.
            let refreshed = last_remaining.is_some_and(|last| remaining > last);
            if refreshed || tokio::time::Instant::now() >= deadline {
                return Err(QueueError::IdentityInUse(incarnation.id.clone()));
            }
            last_remaining = Some(remaining);
            tokio::time::sleep(poll).await;
        }
    }
}
