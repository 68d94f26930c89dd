//! Retry jobs end to end with a large backlog queued beside them: the same run on an empty job
//! table, then with (by default) a million jobs waiting — nine in ten not due for an hour, one
//! in ten leased by a worker elsewhere — so every claim, poll and depth report works past them.
//!
//! Each configuration runs twice and the second run is the one compared: the first run after
//! the backlog is written (and the checkpoints its WAL forced) pays Postgres's full-page image
//! for every index page it is the first to touch since — with a million jobs, thousands of
//! pages of the jobs-by-character index — which a queue in steady state spreads over a whole
//! checkpoint interval. The first runs are reported too.

use std::time::Instant;

use uuid::Uuid;

use super::retry::{characters, shardkeep_run};
use super::{BenchEnv, BenchError, Goal, Progress, Row, Unit};

const BENCH: &str = "backlog";

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct BacklogConfig {
    /// Jobs queued and left waiting.
    pub queued: usize,
    /// Jobs run end to end in each measured run.
    pub jobs: usize,
    /// Producer lanes.
    pub producers: usize,
}

/// The two runs' rates.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BacklogReport {
    /// Jobs left waiting in the second run.
    pub queued: usize,
    /// Jobs per second on an empty table.
    pub empty: f64,
    /// Jobs per second with the backlog queued.
    pub backlog: f64,
    /// The first run on the empty table.
    pub empty_first: f64,
    /// The first run after the backlog was queued.
    pub backlog_first: f64,
    /// Seconds it took to queue the backlog.
    pub queue_seconds: f64,
    /// What is wrong with the claim statements' generic plans over the queued backlog (empty
    /// when every poll walks the claimable index in order and nothing scans the table).
    pub plan_faults: Vec<String>,
}

/// Queues `count` jobs that stay out of reach for the run: 90 % due in an hour, 10 % under a
/// live lease of another worker. Each copies a well-formed reward job stored through the queue,
/// under a character of its own.
async fn queue_backlog(
    env: &BenchEnv,
    count: usize,
    progress: &Progress,
) -> Result<(), BenchError> {
    let clock: std::sync::Arc<dyn shardkeep::clock::Clock> =
        std::sync::Arc::new(shardkeep::clock::SystemClock);
    let (queue, _signals) = shardkeep::retry::RetryQueue::new(env.pg.clone(), 1, clock);
    let template = super::retry::reward_job(Uuid::now_v7(), "backlog-template".into(), 1)?;
    queue.enqueue(&template).await.map_err(BenchError::other)?;
    let mut left = count;
    while left > 0 {
        let n = left.min(100_000);
        sqlx::query(
            "INSERT INTO persistence_retry_jobs (retry_job_id, job_kind, character_id, realm_id,
                 zone_id, payload, next_attempt_at, lease_token, lease_owner, lease_expires_at,
                 session_token, session_impact, source, idempotency_key, owner_epoch, origin,
                 issued_at, issue_seq)
             SELECT gen_random_uuid(), t.job_kind, gen_random_uuid(), t.realm_id, t.zone_id,
                    t.payload, now() + interval '1 hour',
                    CASE WHEN g % 10 = 0 THEN gen_random_uuid() END,
                    CASE WHEN g % 10 = 0 THEN 'elsewhere' END,
                    CASE WHEN g % 10 = 0 THEN now() + interval '1 hour' END,
                    t.session_token, t.session_impact, t.source, 'backlog-' || ($2 + g),
                    t.owner_epoch, t.origin, t.issued_at, t.issue_seq
               FROM persistence_retry_jobs t, generate_series(1, $3) AS g
              WHERE t.retry_job_id = $1",
        )
        .bind(template.retry_job_id())
        .bind(i64::try_from(count - left).unwrap_or(i64::MAX))
        .bind(i64::try_from(n).unwrap_or(i64::MAX))
        .execute(&env.pool)
        .await?;
        left -= n;
        progress.step(BENCH, format!("queued {} of {count}", count - left));
    }
    sqlx::query("DELETE FROM persistence_retry_jobs WHERE retry_job_id = $1")
        .bind(template.retry_job_id())
        .execute(&env.pool)
        .await?;
    sqlx::query("VACUUM ANALYZE persistence_retry_jobs")
        .execute(&env.pool)
        .await?;
    Ok(())
}

/// Runs the empty-table run, queues the backlog, and runs again.
pub async fn run(
    env: &BenchEnv,
    config: BacklogConfig,
    progress: &Progress,
) -> Result<BacklogReport, BenchError> {
    let chars = characters(&env.pool, "bl-", (config.jobs / 2).max(1)).await?;
    let size = (config.jobs, config.producers);
    progress.step(BENCH, "jobs end to end, empty job table (twice)");
    let empty_first =
        shardkeep_run(env, "empty table".into(), &chars, size, None, progress).await?;
    let empty = shardkeep_run(env, "empty table".into(), &chars, size, None, progress).await?;
    let started = Instant::now();
    queue_backlog(env, config.queued, progress).await?;
    let queue_seconds = started.elapsed().as_secs_f64();
    progress.step(
        BENCH,
        format!(
            "jobs end to end, {} jobs queued beside them (twice)",
            config.queued
        ),
    );
    progress.step(BENCH, "the claim statements' plans over the backlog");
    let plan_faults = {
        let mut conn = env.pool.acquire().await?;
        shardkeep_testkit::claim_plans::claim_plan_faults(&mut conn).await?
    };
    for fault in &plan_faults {
        progress.step(BENCH, format!("claim plan: {fault}"));
    }
    let backlog_first =
        shardkeep_run(env, "with backlog".into(), &chars, size, None, progress).await?;
    let backlog = shardkeep_run(env, "with backlog".into(), &chars, size, None, progress).await?;
    let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM persistence_retry_jobs")
        .fetch_one(&env.pool)
        .await?;
    if waiting != i64::try_from(config.queued).unwrap_or(i64::MAX) {
        return Err(BenchError::Other(format!(
            "{waiting} jobs are left, expected the {} queued",
            config.queued
        )));
    }
    Ok(BacklogReport {
        queued: config.queued,
        empty: empty.rate(),
        backlog: backlog.rate(),
        empty_first: empty_first.rate(),
        backlog_first: backlog_first.rate(),
        queue_seconds,
        plan_faults,
    })
}

/// The report's rows.
pub fn rows(r: &BacklogReport) -> Vec<Row> {
    let queued = super::table::thousands(r.queued as f64);
    vec![
        Row::higher_is_better(
            BENCH,
            format!("jobs end to end, {queued} queued (not due or leased)"),
            r.backlog,
            "the same run, empty job table",
            r.empty,
            Unit::PerSecond,
            Goal::AtLeast(0.8),
        ),
        Row::higher_is_better(
            BENCH,
            format!("first run after queueing {queued} (full-page writes)"),
            r.backlog_first,
            "first run, empty job table",
            r.empty_first,
            Unit::PerSecond,
            Goal::None,
        ),
        Row::higher_is_better(
            BENCH,
            format!("claim plans with a table scan or a poll's sort, {queued} queued"),
            r.plan_faults.len() as f64,
            "claim statements explained",
            shardkeep::retry::CLAIM_STATEMENTS.len() as f64,
            Unit::Count,
            Goal::AtMost(0.0),
        ),
    ]
}
