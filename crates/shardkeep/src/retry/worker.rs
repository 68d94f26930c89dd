//! The retry worker: claims signaled ids as they arrive and polls due rows on an interval (at
//! most 128 per claim), then settles each claimed batch in one transaction.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::backoff::Backoff;
use super::job::PersistenceRetryJob;
use super::settle::{Claimed, JobOutcome, Reschedule, fail_alone, settle};
use super::{RetrySignals, store};
use crate::backend::PostgresBackend;
use crate::clock::Clock;
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
    /// Delay between attempts.
    pub backoff: Backoff,
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
            backoff: Backoff::default(),
        }
    }
}

/// Counters since start.
#[derive(Debug, Default)]
pub struct RetryStats {
    /// Jobs claimed.
    pub claimed: AtomicU64,
    /// Jobs applied.
    pub applied: AtomicU64,
    /// Reward jobs whose grant had already happened.
    pub already_applied: AtomicU64,
    /// Jobs from a superseded owner, deleted unapplied.
    pub superseded: AtomicU64,
    /// Failures rescheduled.
    pub retried: AtomicU64,
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

/// The worker. Run it with [`RetryWorker::run`], or step it in tests.
#[derive(Debug)]
pub struct RetryWorker {
    pg: PostgresBackend,
    signals: RetrySignals,
    signals_open: bool,
    config: RetryWorkerConfig,
    clock: Arc<dyn Clock>,
    stats: Arc<RetryStats>,
}

impl RetryWorker {
    /// A worker over `pg`, fed by `signals`.
    pub fn new(
        pg: PostgresBackend,
        signals: RetrySignals,
        config: RetryWorkerConfig,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            pg,
            signals,
            signals_open: true,
            config,
            clock,
            stats: Arc::new(RetryStats::default()),
        }
    }

    /// Its counters.
    pub fn stats(&self) -> Arc<RetryStats> {
        Arc::clone(&self.stats)
    }

    /// Runs until `cancel`: signaled ids are claimed as they arrive; due rows are polled every
    /// poll interval (repeatedly while claims come back full).
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut interval = tokio::time::interval(self.config.poll_interval);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = cancel.cancelled() => return,
                first = self.signals.0.recv(), if self.signals_open => match first {
                    Some(id) => {
                        if let Err(err) = self.claim_signaled(id).await {
                            tracing::warn!(event = "retry_claim_failed", error = %err);
                        }
                    }
                    None => self.signals_open = false,
                },
                _ = interval.tick() => {
                    loop {
                        match self.poll_once().await {
                            Ok(n) if n as i64 >= self.config.claim_limit && !cancel.is_cancelled() => continue,
                            Ok(_) => break,
                            Err(err) => {
                                tracing::warn!(event = "retry_poll_failed", error = %err);
                                break;
                            }
                        }
                    }
                    self.report_depths().await;
                }
            }
        }
    }

    async fn claim_signaled(&mut self, first: Uuid) -> Result<usize, sqlx::Error> {
        let mut ids = vec![first];
        while (ids.len() as i64) < self.config.claim_limit {
            match self.signals.0.try_recv() {
                Ok(id) => ids.push(id),
                Err(_) => break,
            }
        }
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
        let batch = self.claim(ids).await?;
        let count = batch.len();
        if count > 0 {
            self.settle_batch(&batch).await;
        }
        Ok(count)
    }

    /// Claims up to the claim limit of due jobs (only `ids`, when given) under a fresh lease,
    /// without settling them.
    pub async fn claim(&mut self, ids: Option<&[Uuid]>) -> Result<ClaimedBatch, sqlx::Error> {
        let token = Uuid::now_v7();
        let rows = store::claim(
            &self.pg,
            ids,
            self.config.claim_limit,
            &self.config.owner,
            token,
            self.clock.now(),
            self.config.lease,
        )
        .await?;
        self.stats
            .claimed
            .fetch_add(rows.len() as u64, Ordering::Relaxed);
        metrics::counter!(telemetry::RETRY_CLAIMED_TOTAL).increment(rows.len() as u64);
        let claimed = rows
            .into_iter()
            .map(|row| Claimed {
                job: PersistenceRetryJob::restore(row.stored.clone()),
                row,
            })
            .collect();
        Ok(ClaimedBatch { token, claimed })
    }

    /// Settles a claimed batch (fenced by its lease) and returns each job's outcome in order.
    pub async fn settle_batch(&mut self, batch: &ClaimedBatch) -> Vec<JobOutcome> {
        self.settle_claimed(batch.token, &batch.claimed).await
    }

    /// Settles the batch in one transaction; if that fails, job by job, so one bad job costs
    /// only itself.
    async fn settle_claimed(&mut self, token: Uuid, claimed: &[Claimed]) -> Vec<JobOutcome> {
        let mut jitter = Jitter(self.config.backoff);
        let now = self.clock.now();
        let limit = self.config.retry_limit;
        let outcomes = match settle(&self.pg, token, now, claimed, limit, &mut jitter).await {
            Ok(outcomes) => outcomes,
            Err(batch_err) => {
                self.stats.fallbacks.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(event = "retry_batch_fallback", jobs = claimed.len(), error = %batch_err);
                let mut outcomes = Vec::with_capacity(claimed.len());
                for one in claimed {
                    let single = std::slice::from_ref(one);
                    let outcome = match settle(&self.pg, token, now, single, limit, &mut jitter)
                        .await
                    {
                        Ok(mut settled) => settled.pop(),
                        Err(err) => fail_alone(
                            &self.pg,
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
        outcomes.iter().for_each(|o| self.log_and_record(o));
        outcomes
    }

    fn log_and_record(&self, outcome: &JobOutcome) {
        match outcome {
            JobOutcome::Superseded => tracing::info!(
                event = "retry_superseded",
                "job from a superseded owner dropped"
            ),
            JobOutcome::DeadLettered(err) => {
                tracing::warn!(event = "retry_dead_lettered", error = %err)
            }
            JobOutcome::Stale => tracing::warn!(
                event = "retry_lease_stale",
                "lease reclaimed; nothing written"
            ),
            _ => {}
        }
        self.stats.record(outcome);
    }

    async fn report_depths(&self) {
        let depths: Result<(i64, i64), _> = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE lease_token IS NULL), count(*) FILTER (WHERE lease_token IS NOT NULL)
               FROM persistence_retry_jobs",
        )
        .fetch_one(self.pg.pool())
        .await;
        if let Ok((pending, leased)) = depths {
            metrics::gauge!(telemetry::RETRY_ROWS, "state" => "pending").set(pending as f64);
            metrics::gauge!(telemetry::RETRY_ROWS, "state" => "leased").set(leased as f64);
        }
    }
}
