//! The retry worker: claims signaled ids as they arrive (batching them while others settle) and
//! polls due rows on an interval beside them (at most 128 per claim), then settles each claimed
//! batch in one transaction.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::RetrySignals;
use super::backoff::Backoff;
use super::job_tx::JobStore;
use super::settle::{Claimed, JobOutcome, Reschedule, claim_and_settle, fail_alone, settle};
use crate::backend::postgres::connection_lost;
use crate::backend::{PostgresBackend, SqliteBackend};
use crate::clock::Clock;
use crate::model::ModelHandle;
use crate::telemetry;

/// Tunables.
#[derive(Debug, Clone)]
pub struct RetryWorkerConfig {
    /// This worker's name, stamped as `lease_owner`.
    pub owner: String,
    /// Time between polls (5 s).
    pub poll_interval: Duration,
    /// Most rows one claim takes (128).
    pub claim_limit: i64,
    /// Lease length (30 s).
    pub lease: Duration,
    /// Attempts before a job is dead-lettered.
    pub retry_limit: u32,
    /// Times a job's lease may run out before it is dead-lettered (3): a job whose worker keeps
    /// crashing or hanging on it never settles, so it never counts an attempt.
    pub lease_expiry_limit: u32,
    /// Delay between attempts.
    pub backoff: Backoff,
    /// Most signaled batches settling at once in [`RetryWorker::run`] (3; the poll runs beside
    /// them). A second one starts only when a full claim's worth of signaled jobs is waiting or
    /// the oldest has waited `max_signal_wait` (see [`RetryWorker::run`]); batches touching one
    /// character serialize on its row lock.
    pub settles_in_flight: usize,
    /// How long signaled jobs wait for a settling batch to finish before a batch of their own
    /// starts beside it (10 ms): bounds the signal-to-start latency when one batch is slow.
    pub max_signal_wait: Duration,
    /// Longest a settle may hold the characters' rows it locked (10 s): a worker that hangs
    /// inside a settle (its process stalled, its network gone, a statement stuck) has its
    /// transaction ended by Postgres after this, so the characters' logins and saves wait at
    /// most this long; the jobs are claimed again.
    pub settle_bound: Duration,
}

impl RetryWorkerConfig {
    /// Defaults for a worker named `owner`.
    pub fn new(owner: &str) -> Self {
        Self {
            owner: owner.to_owned(),
            poll_interval: Duration::from_secs(5),
            claim_limit: 128,
            lease: Duration::from_secs(30),
            retry_limit: 8,
            lease_expiry_limit: LEASE_EXPIRY_LIMIT,
            backoff: Backoff::default(),
            settles_in_flight: 3,
            max_signal_wait: Duration::from_millis(10),
            settle_bound: Duration::from_secs(10),
        }
    }
}

/// Default for how many times a job's lease may run out before it is dead-lettered unapplied.
pub const LEASE_EXPIRY_LIMIT: u32 = 3;

/// Counters since start.
#[derive(Debug, Default)]
pub struct RetryStats {
    /// Jobs claimed.
    pub claimed: AtomicU64,
    /// Claims that took at least one job (`claimed / batches` is the mean batch size).
    pub batches: AtomicU64,
    /// Jobs applied.
    pub applied: AtomicU64,
    /// Reward jobs whose grant had already happened.
    pub already_applied: AtomicU64,
    /// Jobs from a superseded owner, deleted unapplied.
    pub superseded: AtomicU64,
    /// Failures rescheduled.
    pub retried: AtomicU64,
    /// Jobs left uncounted for a worker of a newer model.
    pub deferred: AtomicU64,
    /// Jobs dead-lettered.
    pub dead_lettered: AtomicU64,
    /// Settlements refused because our lease was reclaimed.
    pub stale: AtomicU64,
    /// Jobs whose outcome could not be recorded (left to their lease).
    pub unsettled: AtomicU64,
    /// Batches that fell back to settling job by job.
    pub fallbacks: AtomicU64,
}

impl RetryStats {
    fn record(&self, outcome: &JobOutcome) {
        let (counter, label) = match outcome {
            JobOutcome::Applied => (&self.applied, "applied"),
            JobOutcome::AlreadyApplied => (&self.already_applied, "already_applied"),
            JobOutcome::Superseded => (&self.superseded, "superseded"),
            JobOutcome::Retrying(_) => (&self.retried, "retrying"),
            JobOutcome::Deferred(_) => (&self.deferred, "deferred"),
            JobOutcome::DeadLettered(_) => (&self.dead_lettered, "dead_lettered"),
            JobOutcome::Stale => (&self.stale, "stale"),
            JobOutcome::Unsettled(_) => (&self.unsettled, "unsettled"),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(telemetry::RETRY_OUTCOMES_TOTAL, "outcome" => label).increment(1);
    }

    /// One counter's value.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

struct Jitter(Backoff);

impl Reschedule for Jitter {
    fn next_attempt(&mut self, attempt: u32, now: DateTime<Utc>) -> DateTime<Utc> {
        let delay = self.0.delay(attempt, rand::random::<f64>());
        now + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX)
    }
}

/// Jobs claimed under one lease, not yet settled.
#[derive(Debug)]
pub struct ClaimedBatch {
    token: Uuid,
    claimed: Vec<Claimed>,
}

impl ClaimedBatch {
    /// Jobs in the batch.
    pub fn len(&self) -> usize {
        self.claimed.len()
    }

    /// True when nothing was claimed.
    pub fn is_empty(&self) -> bool {
        self.claimed.is_empty()
    }

    /// Ids of the claimed jobs.
    pub fn job_ids(&self) -> Vec<Uuid> {
        self.claimed
            .iter()
            .map(|c| c.row.stored.retry_job_id)
            .collect()
    }
}

/// Holds a running [`RetryWorker`]: while held it claims nothing new (batches already running
/// finish). Cheap to clone.
#[derive(Debug, Clone)]
pub struct RetryPause(Arc<tokio::sync::watch::Sender<bool>>);

impl Default for RetryPause {
    /// A hold, released, that no worker follows yet.
    fn default() -> Self {
        Self(Arc::new(tokio::sync::watch::channel(false).0))
    }
}

impl RetryPause {
    /// Holds the worker, or releases it.
    pub fn set(&self, held: bool) {
        self.0.send_replace(held);
    }

    /// True while held.
    pub fn is_held(&self) -> bool {
        *self.0.borrow()
    }
}

/// The worker. Run it with [`RetryWorker::run`], or step it in tests.
#[derive(Debug)]
pub struct RetryWorker {
    signals: RetrySignals,
    signals_open: bool,
    paused: tokio::sync::watch::Receiver<bool>,
    pause: RetryPause,
    config: RetryWorkerConfig,
    settler: Settler,
}

impl Settler {
    /// Claims and settles due rows until a claim comes back short of the claim limit (or
    /// `cancel`), then reports the queue's depths.
    ///
    /// A `cautious` poll (a worker's first, after a start) claims under a lease: a due job may
    /// be one that killed the previous process inside its one-transaction settle, which left no
    /// trace; under a lease a second kill leaves one that runs out and is counted.
    async fn poll_due(self, cancel: CancellationToken, cautious: bool) {
        loop {
            let claimed = if cautious {
                self.claim_and_settle_leased(None).await
            } else {
                self.claim_and_settle(None).await
            };
            match claimed {
                Ok(n) if n as i64 >= self.claim_limit && !cancel.is_cancelled() => continue,
                Ok(_) => {
                    self.liveness.touch();
                    break;
                }
                Err(err) => {
                    tracing::warn!(event = "retry_poll_failed", error = %err);
                    break;
                }
            }
        }
        self.report_depths().await;
    }

    async fn report_depths(&self) {
        if let Ok(super::counts::JobCounts { pending, leased }) =
            super::counts::job_counts(&self.jobs).await
        {
            metrics::gauge!(telemetry::RETRY_ROWS, "state" => "pending").set(pending as f64);
            metrics::gauge!(telemetry::RETRY_ROWS, "state" => "leased").set(leased as f64);
        }
    }

    /// Claims and settles in one transaction (the row locks are the lease); returns the jobs
    /// claimed. If that transaction fails, the same jobs are claimed under a lease and settled
    /// the careful way (job by job when the batch fails again), so one bad job costs only itself.
    async fn claim_and_settle(&self, ids: Option<&[Uuid]>) -> Result<usize, sqlx::Error> {
        let mut jitter = Jitter(self.backoff);
        let now = self.clock.now();
        let one_transaction = bounded(
            self.settle_bound,
            claim_and_settle(
                &self.jobs,
                &self.model,
                ids,
                self.claim_limit,
                now,
                self.retry_limit,
                self.settle_bound,
                &mut jitter,
            ),
        )
        .await;
        match one_transaction {
            Ok(done) => {
                self.count_claimed(done.claimed.len());
                done.outcomes
                    .iter()
                    .for_each(|o| log_and_record(&self.stats, o));
                let mut total = done.claimed.len();
                // Each under a lease of its own: when one of them crashes its worker again,
                // only its lease runs out, and only it is counted.
                for id in &done.lease_ran_out {
                    total += self
                        .claim_and_settle_leased(Some(std::slice::from_ref(id)))
                        .await?;
                }
                Ok(total)
            }
            Err(err) => {
                tracing::warn!(event = "retry_batch_fallback", error = %err,
                    "settling under a lease instead");
                self.claim_and_settle_leased(ids).await
            }
        }
    }

    /// Claims under a lease (committed before any work, so a worker that dies holding the jobs
    /// leaves a lease that runs out and is counted), then settles; returns the jobs claimed.
    async fn claim_and_settle_leased(&self, ids: Option<&[Uuid]>) -> Result<usize, sqlx::Error> {
        let batch = self.claim_leased(ids).await?;
        if !batch.is_empty() {
            self.settle(batch.token, &batch.claimed).await;
        }
        Ok(batch.len())
    }

    /// Claims up to the claim limit of due jobs (only `ids`, when given) under a fresh lease.
    async fn claim_leased(&self, ids: Option<&[Uuid]>) -> Result<ClaimedBatch, sqlx::Error> {
        let token = Uuid::now_v7();
        let rows = self
            .jobs
            .claim(
                ids,
                self.claim_limit,
                &self.owner,
                token,
                self.clock.now(),
                self.lease,
            )
            .await?;
        self.count_claimed(rows.len());
        let ran_out = rows.iter().filter(|r| r.lease_expired).count();
        if ran_out > 0 {
            tracing::warn!(
                event = "retry_lease_ran_out",
                jobs = ran_out,
                "jobs leased again after their lease ran out: a worker crashed or hung holding them"
            );
            metrics::counter!(telemetry::RETRY_LEASE_EXPIRIES_TOTAL).increment(ran_out as u64);
        }
        let claimed = rows
            .into_iter()
            .map(|row| Claimed::new(row, self.lease_expiry_limit))
            .collect();
        Ok(ClaimedBatch { token, claimed })
    }

    fn count_claimed(&self, n: usize) {
        if n > 0 {
            self.stats.batches.fetch_add(1, Ordering::Relaxed);
        }
        self.stats.claimed.fetch_add(n as u64, Ordering::Relaxed);
        metrics::counter!(telemetry::RETRY_CLAIMED_TOTAL).increment(n as u64);
    }

    /// Settles the batch in one transaction; if that fails, job by job, so one bad job costs
    /// only itself.
    async fn settle(&self, token: Uuid, claimed: &[Claimed]) -> Vec<JobOutcome> {
        let mut jitter = Jitter(self.backoff);
        let now = self.clock.now();
        let limit = self.retry_limit;
        let outcomes = match bounded(
            self.settle_bound,
            settle(
                &self.jobs,
                &self.model,
                token,
                now,
                claimed,
                limit,
                self.settle_bound,
                &mut jitter,
            ),
        )
        .await
        {
            Ok(outcomes) => outcomes,
            Err(batch_err) => {
                self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(event = "retry_batch_fallback", jobs = claimed.len(), error = %batch_err);
                let mut outcomes = Vec::with_capacity(claimed.len());
                for one in claimed {
                    let single = std::slice::from_ref(one);
                    let outcome = match bounded(
                        self.settle_bound,
                        settle(
                            &self.jobs,
                            &self.model,
                            token,
                            now,
                            single,
                            limit,
                            self.settle_bound,
                            &mut jitter,
                        ),
                    )
                    .await
                    {
                        Ok(mut settled) => settled.pop(),
                        // A lost connection is no failure of the job's: it keeps its attempts
                        // and is claimed again when the lease runs out.
                        Err(err) if connection_lost(&err) => {
                            Some(JobOutcome::Unsettled(err.to_string()))
                        }
                        Err(err) => fail_alone(
                            &self.jobs,
                            token,
                            now,
                            one,
                            err.to_string(),
                            limit,
                            &mut jitter,
                        )
                        .await
                        .map_err(|e| tracing::warn!(event = "retry_fail_unrecorded", error = %e))
                        .ok(),
                    };
                    outcomes.push(
                        outcome.unwrap_or_else(|| JobOutcome::Unsettled(batch_err.to_string())),
                    );
                }
                outcomes
            }
        };
        outcomes.iter().for_each(|o| log_and_record(&self.stats, o));
        outcomes
    }
}

/// Whether a settle or poll task panicked. Its transaction rolled back and wrote no lease, so
/// the next poll claims under a lease (as after a start): a job that panics again then leaves a
/// lease that runs out, is counted, and is dead-lettered past the limit instead of looping.
fn panicked(joined: Result<(), tokio::task::JoinError>) -> bool {
    match joined {
        Err(err) if err.is_panic() => {
            tracing::error!(event = "retry_settle_panicked", error = %err,
                "the next poll claims under a lease");
            true
        }
        _ => false,
    }
}

/// An instant no wait reaches (about thirty years on).
fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86_400 * 365 * 30)
}

/// Whether the run loop starts a batch of the `waiting` signaled ids now, with `in_flight`
/// batches settling: at once when none is; beside others, while fewer than `most_in_flight`
/// settle, when a full claim is waiting or the oldest has `waited` its longest.
fn starts_batch(
    waiting: usize,
    in_flight: usize,
    limit: usize,
    most_in_flight: usize,
    waited: bool,
) -> bool {
    waiting > 0 && (in_flight == 0 || ((waiting >= limit || waited) && in_flight < most_in_flight))
}

fn log_and_record(stats: &RetryStats, outcome: &JobOutcome) {
    match outcome {
        JobOutcome::Superseded => tracing::info!(
            event = "retry_superseded",
            "job from a superseded owner dropped"
        ),
        JobOutcome::DeadLettered(err) => {
            tracing::warn!(event = "retry_dead_lettered", error = %err)
        }
        JobOutcome::Deferred(reason) => {
            metrics::counter!(telemetry::RETRY_DEFERRED_TOTAL).increment(1);
            tracing::warn!(event = "retry_deferred_to_newer_worker", reason = %reason)
        }
        JobOutcome::Stale => tracing::warn!(
            event = "retry_lease_stale",
            "lease reclaimed; nothing written"
        ),
        _ => {}
    }
    stats.record(outcome);
}

/// What settling a batch needs; cheap to clone into a settle task.
/// Runs a settle, giving it up (its transaction rolled back as it is dropped) once it has run
/// past its bound in this process: Postgres ends a transaction whose client is gone the same way
/// (see `PostgresBackend::begin_bounded`), and the embedded store has only this bound.
async fn bounded<T>(
    bound: Duration,
    settle: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    // A little beyond the server's own bound, so the server's answer comes first when it can.
    match tokio::time::timeout(bound + bound / 4, settle).await {
        Ok(done) => done,
        Err(_) => Err(sqlx::Error::PoolTimedOut),
    }
}

#[derive(Debug, Clone)]
struct Settler {
    jobs: JobStore,
    model: ModelHandle,
    clock: Arc<dyn Clock>,
    stats: Arc<RetryStats>,
    backoff: Backoff,
    retry_limit: u32,
    lease_expiry_limit: u32,
    claim_limit: i64,
    owner: String,
    lease: Duration,
    settle_bound: Duration,
    liveness: crate::liveness::Liveness,
}

impl RetryWorker {
    /// A worker over `pg`, applying the game's effects through `model`, fed by `signals`.
    pub fn new(
        pg: PostgresBackend,
        model: ModelHandle,
        signals: RetrySignals,
        config: RetryWorkerConfig,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self::over(JobStore::Postgres(pg), model, signals, config, clock)
    }

    /// A worker over the embedded store's file `db` (see [`RetryWorker::new`]).
    pub fn embedded(
        db: SqliteBackend,
        model: ModelHandle,
        signals: RetrySignals,
        config: RetryWorkerConfig,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self::over(JobStore::Embedded(db), model, signals, config, clock)
    }

    fn over(
        jobs: JobStore,
        model: ModelHandle,
        signals: RetrySignals,
        config: RetryWorkerConfig,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let settler = Settler {
            jobs,
            model,
            clock,
            stats: Arc::new(RetryStats::default()),
            backoff: config.backoff,
            retry_limit: config.retry_limit,
            lease_expiry_limit: config.lease_expiry_limit,
            claim_limit: config.claim_limit,
            owner: config.owner.clone(),
            lease: config.lease,
            settle_bound: config.settle_bound,
            liveness: crate::liveness::Liveness::default(),
        };
        let (pause, paused) = tokio::sync::watch::channel(false);
        Self {
            signals,
            signals_open: true,
            paused,
            pause: RetryPause(Arc::new(pause)),
            config,
            settler,
        }
    }

    /// A handle that holds and releases [`RetryWorker::run`] (operators' drains, and the
    /// simulator's queue-full fault).
    pub fn pause_handle(&self) -> RetryPause {
        self.pause.clone()
    }

    /// How recently a poll of due rows finished (one runs every poll interval).
    pub fn liveness(&self) -> crate::liveness::Liveness {
        self.settler.liveness.clone()
    }

    /// Its counters.
    pub fn stats(&self) -> Arc<RetryStats> {
        Arc::clone(&self.settler.stats)
    }

    /// Runs until `cancel`: signaled ids are claimed as they arrive; due rows are polled every
    /// poll interval (repeatedly while claims come back full).
    ///
    /// Batches grow with the load rather than multiply: signaled ids wait in a buffer (at most
    /// one claim's worth; the channel holds the rest). A batch starts at once when none is
    /// settling; beside others (up to `settles_in_flight`) only when a full claim's worth is
    /// waiting or the oldest waiting id has waited `max_signal_wait`. A light load is claimed
    /// the moment it is signaled; a heavy one settles in few large transactions. On cancel the
    /// batches in flight finish first; ids still buffered are durable rows the next poll finds.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut interval = tokio::time::interval(self.config.poll_interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut settling = tokio::task::JoinSet::new();
        let mut waiting: Vec<Uuid> = Vec::new();
        let mut oldest_waiting = tokio::time::Instant::now();
        let limit = usize::try_from(self.config.claim_limit.max(1)).unwrap_or(usize::MAX);
        let most_in_flight = self.config.settles_in_flight.max(1);
        // The poll runs beside the signaled batches, so a slow one never holds them up; one
        // poll at a time (the tick waits while one runs).
        let mut polling = tokio::task::JoinSet::new();
        let mut first_poll = true;
        loop {
            if *self.paused.borrow() {
                // Held: nothing new is claimed, and signals stay in the channel (which fills,
                // so producers fall back to durable-only, as with a stuck worker).
                tokio::select! {
                    () = cancel.cancelled() => break,
                    _ = self.paused.wait_for(|held| !*held) => {}
                }
                continue;
            }
            let waited = oldest_waiting.elapsed() >= self.config.max_signal_wait;
            if starts_batch(waiting.len(), settling.len(), limit, most_in_flight, waited)
                && !cancel.is_cancelled()
            {
                let ids: Vec<Uuid> = waiting.drain(..waiting.len().min(limit)).collect();
                oldest_waiting = tokio::time::Instant::now();
                let settler = self.settler.clone();
                settling.spawn(async move {
                    if let Err(err) = settler.claim_and_settle(Some(&ids)).await {
                        tracing::warn!(event = "retry_claim_failed", error = %err);
                    }
                });
                continue;
            }
            let accepting = self.signals_open && waiting.len() < limit;
            let wait_ends = oldest_waiting
                .checked_add(self.config.max_signal_wait)
                .unwrap_or_else(far_future);
            let may_join = !waiting.is_empty() && settling.len() < most_in_flight;
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                Some(joined) = settling.join_next(), if !settling.is_empty() => {
                    first_poll |= panicked(joined);
                }
                first = self.signals.0.recv(), if accepting => match first {
                    Some(id) => {
                        if waiting.is_empty() {
                            oldest_waiting = tokio::time::Instant::now();
                        }
                        waiting.push(id);
                        while waiting.len() < limit {
                            match self.signals.0.try_recv() {
                                Ok(id) => waiting.push(id),
                                Err(_) => break,
                            }
                        }
                    }
                    None => self.signals_open = false,
                },
                () = tokio::time::sleep_until(wait_ends), if may_join => {}
                Some(joined) = polling.join_next(), if !polling.is_empty() => {
                    first_poll |= panicked(joined);
                }
                _ = self.paused.changed() => {}
                _ = interval.tick(), if polling.is_empty() && !*self.paused.borrow() => {
                    polling.spawn(self.settler.clone().poll_due(cancel.clone(), first_poll));
                    first_poll = false;
                }
            }
        }
        while settling.join_next().await.is_some() {}
        while polling.join_next().await.is_some() {}
    }

    fn signaled_ids(&mut self, first: Uuid) -> Vec<Uuid> {
        let mut ids = vec![first];
        while (ids.len() as i64) < self.config.claim_limit {
            match self.signals.0.try_recv() {
                Ok(id) => ids.push(id),
                Err(_) => break,
            }
        }
        ids
    }

    async fn claim_signaled(&mut self, first: Uuid) -> Result<usize, sqlx::Error> {
        let ids = self.signaled_ids(first);
        self.claim_and_settle(Some(&ids)).await
    }

    /// Claims and settles whatever signals are waiting now; returns jobs claimed.
    pub async fn drain_signals(&mut self) -> Result<usize, sqlx::Error> {
        let mut total = 0;
        while let Ok(first) = self.signals.0.try_recv() {
            total += self.claim_signaled(first).await?;
        }
        Ok(total)
    }

    /// One poll: claims up to the claim limit of due rows and settles them; returns jobs claimed.
    pub async fn poll_once(&mut self) -> Result<usize, sqlx::Error> {
        self.claim_and_settle(None).await
    }

    /// Polls until a poll claims nothing (tests and drains).
    pub async fn run_until_idle(&mut self) -> Result<usize, sqlx::Error> {
        let mut total = self.drain_signals().await?;
        loop {
            let n = self.poll_once().await?;
            if n == 0 {
                return Ok(total);
            }
            total += n;
        }
    }

    async fn claim_and_settle(&mut self, ids: Option<&[Uuid]>) -> Result<usize, sqlx::Error> {
        self.settler.claim_and_settle(ids).await
    }

    /// Claims up to the claim limit of due jobs (only `ids`, when given) under a fresh lease,
    /// without settling them (the two-step path: [`RetryWorker::settle_batch`] settles, fenced
    /// by the lease; the worker itself claims and settles in one transaction).
    pub async fn claim(&mut self, ids: Option<&[Uuid]>) -> Result<ClaimedBatch, sqlx::Error> {
        self.settler.claim_leased(ids).await
    }

    /// Settles a claimed batch (fenced by its lease) and returns each job's outcome in order.
    pub async fn settle_batch(&mut self, batch: &ClaimedBatch) -> Vec<JobOutcome> {
        self.settler.settle(batch.token, &batch.claimed).await
    }
}

#[cfg(test)]
mod tests {
    use super::starts_batch;

    #[test]
    fn a_batch_starts_at_once_when_none_is_settling() {
        assert!(starts_batch(1, 0, 128, 3, false));
        assert!(!starts_batch(0, 0, 128, 3, true));
    }

    #[test]
    fn a_second_batch_starts_with_a_full_claim_waiting_or_after_the_longest_wait() {
        assert!(!starts_batch(127, 1, 128, 3, false));
        assert!(starts_batch(128, 1, 128, 3, false));
        assert!(starts_batch(1, 2, 128, 3, true));
        assert!(!starts_batch(128, 3, 128, 3, true));
    }
}
