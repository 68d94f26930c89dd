//! The journal worker: leases cleanup entries and applies their effects. A reconnectable entry
//! whose session is active again is skipped, so a reconnect is never undone by stale work, and so
//! is any entry older than a cleanup already applied for the same character (by the copy's
//! epoch, then the close time): effects are order-insensitive, whatever order retries,
//! recoveries and requeues deliver entries in. A failing side effect fails the entry, which
//! retries through the queue (at the front, keeping its place) and dead-letters after the
//! attempt limit.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use super::{RealtimeStreamCleanup, SessionJournal};
use crate::character::{CharacterStore, LocationOrder, LocationWrite};
use crate::coord::{Coordination, OrderCheck, PresenceRecord, SessionOrder};
use crate::liveness::Liveness;
use crate::queue::{Consumer, FailOutcome, Leased, QueueError};
use crate::ttl::Ttl;

/// Tunables.
#[derive(Debug, Clone)]
pub struct JournalWorkerConfig {
    /// How often the worker drains even without a wake signal.
    pub interval: Duration,
    /// How often it recovers dead consumers' entries.
    pub recovery_interval: Duration,
    /// Lifetime of a persisted resume ledger.
    pub resume_ttl: Ttl,
    /// Lifetime of a refreshed presence record.
    pub presence_ttl: Ttl,
    /// Pause after a pass in which an entry failed, doubled after each such pass up to
    /// [`Self::failure_backoff_cap`] and reset by a clean pass. Wake signals do not cut it
    /// short, so a store outage does not burn an entry's attempts in a burst of wakes.
    pub failure_backoff: Duration,
    /// Longest pause after failing passes.
    pub failure_backoff_cap: Duration,
    /// A stable consumer id (for example a StatefulSet ordinal): a restarted worker takes its
    /// predecessor's held entries back itself, within the heartbeat TTL of a crash and at once
    /// after a clean shutdown, and a second live worker with the same id is refused. `None`: a
    /// fresh id per start, whose crashed predecessor's entries come back through any worker's
    /// recovery (heartbeat TTL plus one recovery interval).
    pub consumer_id: Option<String>,
}

impl Default for JournalWorkerConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            recovery_interval: Duration::from_secs(10),
            resume_ttl: Ttl::from_static_secs(300),
            presence_ttl: Ttl::from_static_secs(120),
            failure_backoff: Duration::from_millis(500),
            failure_backoff_cap: Duration::from_secs(8),
            consumer_id: None,
        }
    }
}

/// Counters since start.
#[derive(Debug, Default)]
pub struct JournalStats {
    /// Entries whose effects were applied.
    pub processed: AtomicU64,
    /// Entries skipped because the session reconnected.
    pub skipped_reconnected: AtomicU64,
    /// Entries skipped because a newer session event of the same character came first.
    pub skipped_stale: AtomicU64,
    /// Entry failures (retried through the queue).
    pub failures: AtomicU64,
    /// Entries dead-lettered.
    pub dead_lettered: AtomicU64,
}

/// How long the worker pauses after a pass (pure): nothing after a clean pass; after a failing
/// pass a pause that doubles with each failing pass in a row, up to the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PassPacing {
    base: Duration,
    cap: Duration,
    next: Duration,
}

impl PassPacing {
    pub(crate) fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap: cap.max(base),
            next: base,
        }
    }

    /// The pause owed after a pass (`None`: wait for a wake or the interval as usual).
    pub(crate) fn after_pass(&mut self, failed: bool) -> Option<Duration> {
        if !failed {
            self.next = self.base;
            return None;
        }
        let pause = self.next;
        self.next = (self.next * 2).min(self.cap);
        Some(pause)
    }
}

/// Most entries one drain pass handles; the loop goes on at once when a pass stops at it, so
/// recovery, pacing and shutdown get their turn during a long backlog.
pub const MAX_PASS_ENTRIES: usize = 1024;
/// Longest a drain pass goes on leasing (a slow store cannot make one pass last for minutes).
pub const MAX_PASS_TIME: Duration = Duration::from_secs(10);

/// What one drain pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainPass {
    /// Entries handled (applied, skipped or failed).
    pub handled: usize,
    /// Entries that failed (retried through the queue or dead-lettered).
    pub failed: usize,
    /// True when the pass stopped at [`MAX_PASS_ENTRIES`] with work left.
    pub more: bool,
}

/// Counts one handled entry in [`crate::telemetry::JOURNAL_OUTCOMES_TOTAL`].
fn outcome_metric(outcome: &'static str) {
    metrics::counter!(crate::telemetry::JOURNAL_OUTCOMES_TOTAL, "outcome" => outcome).increment(1);
}

/// What processing one entry did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Processed {
    /// Every effect of the plan was applied.
    Applied,
    /// The session is active again; nothing was done.
    SkippedReconnected,
    /// A newer session event of the same character came first (a cleanup already applied, a
    /// session started since, a newer owner); nothing but this session's own resume-ledger
    /// deletion was done.
    SkippedStale,
}

/// Why an entry's effects could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct EffectError {
    /// True when a store could not be reached, so every entry would fail alike: the entry goes
    /// back to the front and the pass ends (one attempt counted, on that entry only). False:
    /// this entry fails on its own; it is held while the entries behind it run.
    pub unavailable: bool,
    /// What failed.
    pub message: String,
}

impl EffectError {
    fn coord(what: &str, err: &crate::coord::CoordError) -> Self {
        Self {
            unavailable: matches!(err, crate::coord::CoordError::Redis(_)),
            message: format!("{what}: {err}"),
        }
    }

    fn store(what: &str, err: &crate::character::StoreError) -> Self {
        Self {
            unavailable: matches!(err, crate::character::StoreError::Database(e) if store_unreachable(e)),
            message: format!("{what}: {err}"),
        }
    }

    fn entry(message: String) -> Self {
        Self {
            unavailable: false,
            message,
        }
    }
}

/// True for a Postgres failure that any entry would meet alike: no connection, or a server-side
/// condition of the connection, resource or operator-intervention classes (SQLSTATE 08, 53,
/// 57) or a transaction rollback (40).
fn store_unreachable(err: &sqlx::Error) -> bool {
    crate::backend::postgres::connection_lost(err)
        || matches!(err, sqlx::Error::Database(db) if db
            .code()
            .is_some_and(|code| ["40", "53", "57"].iter().any(|c| code.starts_with(c))))
}

/// How handling one entry ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handled {
    /// Applied or skipped, and acked.
    Done,
    /// Failed on its own: held until the pass ends.
    FailedHeld,
    /// A store was unreachable: back at the front; the pass ends.
    FailedUnavailable,
}

/// The journal worker.
#[derive(Debug)]
pub struct JournalWorker {
    journal: SessionJournal,
    coord: Coordination,
    store: CharacterStore,
    config: JournalWorkerConfig,
    stats: Arc<JournalStats>,
    liveness: Liveness,
}

/// How a worker's loop for one consumer ended.
#[derive(Debug, PartialEq, Eq)]
enum Served {
    /// Cancelled: shut down.
    Stopped,
    /// The consumer's identity was lost: start over with a new one.
    IdentityLost,
}

impl JournalWorker {
    /// A worker applying effects through `coord` (Redis) and `store` (Postgres).
    pub fn new(
        journal: SessionJournal,
        coord: Coordination,
        store: CharacterStore,
        config: JournalWorkerConfig,
    ) -> Self {
        Self {
            journal,
            coord,
            store,
            config,
            stats: Arc::new(JournalStats::default()),
            liveness: Liveness::default(),
        }
    }

    /// This worker's consumer: its configured stable id, or a fresh one. An id held by a live
    /// process is refused ([`QueueError::IdentityInUse`]); call this before [`Self::run_with`]
    /// to fail a start-up on it.
    pub async fn consumer(&self) -> Result<Consumer<RealtimeStreamCleanup>, QueueError> {
        match &self.config.consumer_id {
            Some(id) => self.journal.queue().consumer_with_id(id).await,
            None => self.journal.queue().consumer().await,
        }
    }

    /// Its counters.
    pub fn stats(&self) -> Arc<JournalStats> {
        Arc::clone(&self.stats)
    }

    /// Runs until `cancel` with a consumer of its own ([`Self::consumer`], retried while Redis
    /// is unreachable; a stable id in use by a live process stops it, logged).
    pub async fn run(self, cancel: CancellationToken) {
        if let Some(consumer) = self.next_consumer(&cancel).await {
            self.run_with(consumer, cancel).await;
        }
    }

    /// A consumer, retried every interval while Redis is unreachable; `None` when cancelled or
    /// when the stable id is held by a live process (logged).
    async fn next_consumer(
        &self,
        cancel: &CancellationToken,
    ) -> Option<Consumer<RealtimeStreamCleanup>> {
        loop {
            match self.consumer().await {
                Ok(consumer) => return Some(consumer),
                Err(err @ QueueError::IdentityInUse(_)) => {
                    tracing::error!(event = "journal_consumer_refused", error = %err);
                    return None;
                }
                Err(err) => {
                    tracing::warn!(event = "journal_consumer_failed", error = %err);
                    tokio::select! {
                        () = cancel.cancelled() => return None,
                        () = tokio::time::sleep(self.config.interval) => {}
                    }
                }
            }
        }
    }

    /// How recently this worker finished a pass (a live worker finishes one at least every
    /// interval, work or not).
    pub fn liveness(&self) -> Liveness {
        self.liveness.clone()
    }

    /// Runs with `consumer` until `cancel`: recovers at start-up and periodically, drains on
    /// every wake signal and on every interval, and at the end hands its held entries back at
    /// once (a clean shutdown). A consumer that lost its identity (its heartbeat lapsed — a
    /// stall, or a Redis failover or restart that lost its registration — and others recovered
    /// what it held) touches nothing more: the worker starts over as a new incarnation, so it
    /// never sits running while processing nothing. A stable id taken over by a live process
    /// stops it.
    pub async fn run_with(
        self,
        mut consumer: Consumer<RealtimeStreamCleanup>,
        cancel: CancellationToken,
    ) {
        loop {
            if self.serve(&mut consumer, &cancel).await == Served::Stopped {
                break;
            }
            metrics::counter!(crate::telemetry::QUEUE_CONSUMER_RESTARTS_TOTAL,
                "queue" => self.journal.queue().name().to_owned())
            .increment(1);
            match self.next_consumer(&cancel).await {
                Some(next) => consumer = next,
                None => return,
            }
        }
        if let Err(err) = consumer.shutdown().await {
            tracing::warn!(event = "journal_consumer_shutdown_failed", error = %err);
        }
    }

    /// The worker's loop for one consumer, until cancelled or the consumer's identity is lost.
    async fn serve(
        &self,
        consumer: &mut Consumer<RealtimeStreamCleanup>,
        cancel: &CancellationToken,
    ) -> Served {
        let wake = self.journal.wake_signal();
        let mut pacing =
            PassPacing::new(self.config.failure_backoff, self.config.failure_backoff_cap);
        let mut last_recovery = tokio::time::Instant::now() - self.config.recovery_interval;
        loop {
            if last_recovery.elapsed() >= self.config.recovery_interval {
                if let Err(err) = self.journal.queue().recover().await {
                    tracing::warn!(event = "journal_recovery_failed", error = %err);
                }
                last_recovery = tokio::time::Instant::now();
            }
            let (failed, more) = match self.drain_pass(consumer).await {
                Ok(pass) => {
                    self.liveness.touch();
                    (pass.failed > 0, pass.more)
                }
                Err(err @ QueueError::IdentityLost(_)) => {
                    tracing::error!(event = "journal_consumer_lost", error = %err,
                        "starting over as a new incarnation");
                    return Served::IdentityLost;
                }
                Err(err) => {
                    tracing::warn!(event = "journal_drain_failed", error = %err);
                    (true, false)
                }
            };
            if let Some(pause) = pacing.after_pass(failed) {
                tokio::select! {
                    () = cancel.cancelled() => return Served::Stopped,
                    () = tokio::time::sleep(pause) => {}
                }
                continue;
            }
            if more {
                if cancel.is_cancelled() {
                    return Served::Stopped;
                }
                continue;
            }
            tokio::select! {
                () = cancel.cancelled() => return Served::Stopped,
                () = wake.notified() => {}
                () = tokio::time::sleep(self.config.interval) => {}
            }
        }
    }

    /// Leases and processes entries until pending is empty (or [`MAX_PASS_ENTRIES`] were
    /// handled), trying each entry at most once per pass; returns how many it handled.
    pub async fn drain(
        &self,
        consumer: &mut Consumer<RealtimeStreamCleanup>,
    ) -> Result<usize, crate::queue::QueueError> {
        Ok(self.drain_pass(consumer).await?.handled)
    }

    /// One pass of [`Self::drain`]. It starts by putting back whatever the consumer's processing
    /// list holds (it holds nothing between passes, so those are leases whose replies were lost).
    /// An entry that fails stays held through the rest of the pass, so the entries behind it
    /// run (their effects do not depend on order), and goes back to the front, in its place,
    /// when the pass ends: one failing entry never stalls the journal.
    pub async fn drain_pass(
        &self,
        consumer: &mut Consumer<RealtimeStreamCleanup>,
    ) -> Result<DrainPass, crate::queue::QueueError> {
        let orphans = consumer.requeue_held().await?;
        if orphans > 0 {
            tracing::warn!(
                event = "journal_orphans_requeued",
                orphans,
                "entries leased by calls whose replies were lost are pending again"
            );
        }
        let mut pass = DrainPass::default();
        let started = tokio::time::Instant::now();
        let mut held = false;
        while pass.handled < MAX_PASS_ENTRIES {
            if started.elapsed() >= MAX_PASS_TIME {
                pass.more = true;
                break;
            }
            let Some(leased) = consumer.lease().await? else {
                break;
            };
            pass.handled += 1;
            match self.handle(consumer, &leased).await? {
                Handled::Done => {}
                Handled::FailedHeld => {
                    pass.failed += 1;
                    held = true;
                }
                Handled::FailedUnavailable => {
                    pass.failed += 1;
                    break;
                }
            }
        }
        pass.more |= pass.handled >= MAX_PASS_ENTRIES;
        if held {
            consumer.requeue_held().await?;
        }
        let _ = self.journal.queue().depths().await;
        Ok(pass)
    }

    /// Processes one entry, acking, holding or failing it.
    async fn handle(
        &self,
        consumer: &Consumer<RealtimeStreamCleanup>,
        leased: &Leased<RealtimeStreamCleanup>,
    ) -> Result<Handled, crate::queue::QueueError> {
        match self
            .process(&leased.entry.item, leased.entry.entry_id)
            .await
        {
            Ok(Processed::Applied) => {
                self.stats.processed.fetch_add(1, Ordering::Relaxed);
                outcome_metric("applied");
                consumer.ack(leased).await?;
            }
            Ok(Processed::SkippedReconnected) => {
                self.stats
                    .skipped_reconnected
                    .fetch_add(1, Ordering::Relaxed);
                outcome_metric("skipped_reconnected");
                tracing::info!(event = "journal_skipped_reconnected", session = %leased.entry.item.session_token);
                consumer.ack(leased).await?;
            }
            Ok(Processed::SkippedStale) => {
                self.stats.skipped_stale.fetch_add(1, Ordering::Relaxed);
                outcome_metric("skipped_stale");
                tracing::info!(event = "journal_skipped_stale", session = %leased.entry.item.session_token,
                    "a newer session event of this character came first");
                consumer.ack(leased).await?;
            }
            Err(error) => {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                outcome_metric("failed");
                tracing::warn!(event = "journal_effect_failed", session = %leased.entry.item.session_token,
                    error = %error, unavailable = error.unavailable);
                let outcome = if error.unavailable {
                    consumer.fail(leased, &error.message).await?
                } else {
                    consumer.fail_held(leased, &error.message).await?
                };
                if let FailOutcome::DeadLettered { .. } = outcome {
                    self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
                    outcome_metric("dead_lettered");
                }
                return Ok(if error.unavailable {
                    Handled::FailedUnavailable
                } else {
                    Handled::FailedHeld
                });
            }
        }
        Ok(Handled::Done)
    }

    /// Applies one entry's effects, only while the entry is the newest session event seen for
    /// its character (a cleanup of an earlier session, or one older than a cleanup already
    /// applied, is stale) and its copy still owns the character. Deleting the session's own
    /// resume ledger applies either way: that session is over.
    pub async fn process(
        &self,
        item: &RealtimeStreamCleanup,
        entry_id: uuid::Uuid,
    ) -> Result<Processed, EffectError> {
        let effects = item.plan.effects(item.transfer_confirmed);
        let token = &item.session_token;
        if !effects.delete_resume_ledger
            && self
                .coord
                .session_is_active(token)
                .await
                .map_err(|e| EffectError::coord("session check", &e))?
        {
            return Ok(Processed::SkippedReconnected);
        }
        let player = &item.player;
        let character = player.character_id.to_string();
        let order = SessionOrder {
            owner_epoch: player.owner_epoch,
            at: item.closed_at,
            event_id: entry_id,
        };
        let place = self
            .coord
            .session_order_claim(&character, &order)
            .await
            .map_err(|e| EffectError::coord("session order", &e))?;
        // After the claim: an older cleanup that stored this session's ledger concurrently
        // checks the order again after its store, and takes its record back.
        if effects.delete_resume_ledger {
            self.coord
                .resume_delete(token)
                .await
                .map_err(|e| EffectError::coord("resume ledger delete", &e))?;
        }
        if place == OrderCheck::Stale {
            // A store of this very entry that a crash kept from its check is taken back too.
            if effects.persist_resume_ledger {
                self.coord
                    .resume_take_back(token, &order)
                    .await
                    .map_err(|e| EffectError::coord("resume ledger take-back", &e))?;
            }
            return Ok(Processed::SkippedStale);
        }
        if effects.persist_location && !self.persist_location(item).await? {
            // A newer owner holds the character, or a newer cleanup wrote the location: this
            // session's presence and ledger are over.
            return Ok(Processed::SkippedStale);
        }
        if effects.persist_resume_ledger
            && let Some(record) = &item.pending_resume
            && !self.store_resume(token, record, &character, &order).await?
        {
            return Ok(Processed::SkippedStale);
        }
        if effects.refresh_presence {
            let record = PresenceRecord {
                account_id: player.account_id.to_string(),
                character_id: character.clone(),
                session_token: token.clone(),
                shard_id: player.shard_id.clone(),
                zone_id: Some(player.zone.clone()),
                expires_at: Utc::now()
                    + chrono::Duration::from_std(self.config.presence_ttl.duration())
                        .unwrap_or_default(),
            };
            // Checked against the order again in the write: a newer event may have come in.
            let written = self
                .coord
                .presence_put_ordered(&record, &order)
                .await
                .map_err(|e| EffectError::coord("presence refresh", &e))?;
            if written == OrderCheck::Stale {
                return Ok(Processed::SkippedStale);
            }
        }
        Ok(Processed::Applied)
    }

    /// Stores the session's resume ledger as the event at `order` (never over a newer event's),
    /// then checks the order again: if a newer event came in meanwhile, which may have deleted
    /// the ledger before this store landed, the record is taken back. False when stale.
    async fn store_resume(
        &self,
        token: &str,
        record: &crate::coord::ResumeLedgerRecord,
        character: &str,
        order: &SessionOrder,
    ) -> Result<bool, EffectError> {
        let stored = self
            .coord
            .resume_store_ordered(record, self.config.resume_ttl, order)
            .await
            .map_err(|e| EffectError::coord("resume ledger store", &e))?;
        if stored == OrderCheck::Stale {
            return Ok(false);
        }
        let still = self
            .coord
            .session_order_claim(character, order)
            .await
            .map_err(|e| EffectError::coord("session order", &e))?;
        if still == OrderCheck::Stale {
            self.coord
                .resume_take_back(token, order)
                .await
                .map_err(|e| EffectError::coord("resume ledger take-back", &e))?;
            return Ok(false);
        }
        Ok(true)
    }

    /// Writes the location, fenced by the snapshot's epoch and ordered against what the row
    /// holds (an older cleanup's location, or one older than the copy's last live write, is
    /// left alone). `Ok(false)` when a newer owner holds the character or a newer cleanup wrote
    /// the location. A failed write fails the entry, which is retried.
    async fn persist_location(&self, item: &RealtimeStreamCleanup) -> Result<bool, EffectError> {
        let player = &item.player;
        let order = LocationOrder {
            owner_epoch: player.owner_epoch,
            closed_at: item.closed_at,
            known_version: player.state_version,
        };
        match self
            .store
            .write_location_ordered(player.character_id, order, &player.zone, &player.room)
            .await
        {
            Ok(LocationWrite::Written) => Ok(true),
            Ok(LocationWrite::Superseded { current_epoch }) => {
                tracing::info!(event = "journal_location_superseded", character = %player.character_id,
                    epoch = player.owner_epoch, current_epoch);
                Ok(false)
            }
            Ok(LocationWrite::Stale { newer_cleanup }) => {
                tracing::info!(event = "journal_location_stale", character = %player.character_id,
                    newer_cleanup, "the row holds a newer location");
                // A live write of a newer state (say the flush at detach) keeps the session
                // going; a newer cleanup ends it.
                Ok(!newer_cleanup)
            }
            Ok(LocationWrite::NotFound) => Err(EffectError::entry(format!(
                "character {} not found",
                player.character_id
            ))),
            Err(err) => Err(EffectError::store("location write", &err)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_passes_pause_longer_each_time_up_to_the_cap_and_a_clean_pass_resets() {
        let ms = Duration::from_millis;
        let mut pacing = PassPacing::new(ms(500), ms(3000));
        assert_eq!(pacing.after_pass(false), None);
        let pauses: Vec<_> = (0..5).map(|_| pacing.after_pass(true)).collect();
        assert_eq!(
            pauses,
            [ms(500), ms(1000), ms(2000), ms(3000), ms(3000)].map(Some)
        );
        assert_eq!(pacing.after_pass(false), None);
        assert_eq!(pacing.after_pass(true), Some(ms(500)));
        // Eight attempts at the defaults span more than 30 s: a short outage dead-letters
        // nothing.
        let defaults = JournalWorkerConfig::default();
        let mut pacing = PassPacing::new(defaults.failure_backoff, defaults.failure_backoff_cap);
        let total: Duration = (0..7).filter_map(|_| pacing.after_pass(true)).sum();
        assert!(total > Duration::from_secs(30), "{total:?}");
    }
}
