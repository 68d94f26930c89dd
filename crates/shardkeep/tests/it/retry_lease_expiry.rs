//! Jobs that crash or hang the worker holding them: every lease that runs out is counted, and a
//! job over the limit is dead-lettered with a clear error instead of being leased forever.
//! Tests that hold a Postgres row lock to stand for a hung settle run on Postgres only; the
//! others run on each driver.

use std::sync::Arc;
use std::time::Duration;

use shardkeep::clock::SystemClock;
use shardkeep::retry::{RetryQueue, RetryWorker};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use shardkeep_testkit::JobDrivers;

use super::retry_jobs::{character, config, experience, pg, reward};

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_job_whose_lease_keeps_running_out_is_dead_lettered(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let id = d.character("Crashy").await;
        let (queue, signals) = d.queue(16, Arc::new(SystemClock));
        queue.enqueue(&reward(id, "crash-1", 0, 5)).await.unwrap();
        let mut settings = config("w");
        settings.lease = Duration::from_millis(50);
        settings.lease_expiry_limit = 2;
        let mut worker = d.worker(signals, settings, Arc::new(SystemClock));
        // Three workers in turn take the job and die holding it (the batch is never settled).
        for _ in 0..3 {
            let held = worker.claim(None).await.unwrap();
            assert_eq!(held.len(), 1, "{}", d.name());
            drop(held);
            tokio::time::sleep(Duration::from_millis(80)).await;
        }
        // The next claim finds its lease run out a third time: over the limit of two.
        worker.run_until_idle().await.unwrap();
        assert_eq!(
            d.experience(id).await,
            0,
            "{}: the job is not run again",
            d.name()
        );
        let (jobs, error): (i64, Option<String>) = d
            .fetch_one(
                "SELECT (SELECT count(*) FROM persistence_retry_jobs),
                        (SELECT last_error FROM persistence_job_dead_letters LIMIT 1)",
                None,
            )
            .await;
        assert_eq!(jobs, 0, "{}", d.name());
        let error = error.expect("a dead letter");
        assert!(
            error.contains("lease ran out 3 times"),
            "{}: a clear error: {error}",
            d.name()
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn each_lease_that_runs_out_is_counted(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let id = d.character("Hangs").await;
        let (queue, signals) = d.queue(16, Arc::new(SystemClock));
        queue.enqueue(&reward(id, "hang-1", 0, 5)).await.unwrap();
        let mut settings = config("w");
        settings.lease = Duration::from_millis(50);
        let mut worker = d.worker(signals, settings, Arc::new(SystemClock));
        drop(worker.claim(None).await.unwrap());
        tokio::time::sleep(Duration::from_millis(80)).await;
        drop(worker.claim(None).await.unwrap());
        let (expiries,): (i32,) = d
            .fetch_one("SELECT lease_expiries FROM persistence_retry_jobs", None)
            .await;
        assert_eq!(expiries, 1, "{}", d.name());
        // Under the limit the job still runs.
        tokio::time::sleep(Duration::from_millis(80)).await;
        worker.run_until_idle().await.unwrap();
        assert_eq!(d.experience(id).await, 5, "{}", d.name());
    }
}

/// A worker that starts claims the jobs already due under a committed lease, so a job that
/// killed the previous process inside its one-transaction settle leaves a trace when it kills
/// this one too.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_starting_worker_claims_due_jobs_under_a_lease(pool: PgPool) {
    let id = character(&pool, "Restarted").await;
    let (queue, _) = RetryQueue::new(pg(&pool), 16, Arc::new(SystemClock));
    queue.enqueue(&reward(id, "start-1", 0, 5)).await.unwrap();
    // The job's character is locked, so its settle waits: the worker is "in" the job.
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM characters WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *lock)
        .await
        .unwrap();
    let (_, signals) = RetryQueue::new(pg(&pool), 16, Arc::new(SystemClock));
    let worker = RetryWorker::new(
        pg(&pool),
        shardkeep_testkit::model::LedgerModel::handle(),
        signals,
        config("w"),
        Arc::new(SystemClock),
    );
    let cancel = CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let leased: bool =
            sqlx::query_scalar("SELECT lease_token IS NOT NULL FROM persistence_retry_jobs")
                .fetch_one(&pool)
                .await
                .unwrap();
        if leased {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the starting worker's first claim wrote no lease"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    running.abort();
    lock.rollback().await.unwrap();
}

/// Jobs whose shared lease ran out (one of them crashed the worker holding them all) are
/// claimed again one per lease, so a second crash is counted against that job alone.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn jobs_from_a_lapsed_batch_are_claimed_again_one_per_lease(pool: PgPool) {
    let (blocked, other) = (
        character(&pool, "Blocked").await,
        character(&pool, "Other").await,
    );
    let (queue, signals) = RetryQueue::new(pg(&pool), 16, Arc::new(SystemClock));
    queue
        .enqueue(&reward(blocked, "batch-1", 0, 5))
        .await
        .unwrap();
    queue
        .enqueue(&reward(other, "batch-2", 0, 5))
        .await
        .unwrap();
    let mut settings = config("w");
    settings.lease = Duration::from_millis(50);
    let mut worker = RetryWorker::new(
        pg(&pool),
        shardkeep_testkit::model::LedgerModel::handle(),
        signals,
        settings,
        Arc::new(SystemClock),
    );
    // One worker takes both under one lease and dies.
    assert_eq!(worker.claim(None).await.unwrap().len(), 2);
    tokio::time::sleep(Duration::from_millis(80)).await;
    let old_token: uuid::Uuid =
        sqlx::query_scalar("SELECT lease_token FROM persistence_retry_jobs LIMIT 1")
            .fetch_one(&pool)
            .await
            .unwrap();
    // The first job's settle waits on its character: the worker is "in" that job.
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM characters WHERE id = $1 FOR UPDATE")
        .bind(blocked)
        .execute(&mut *lock)
        .await
        .unwrap();
    let running = tokio::spawn(async move { worker.poll_once().await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let tokens: Vec<Option<uuid::Uuid>> = loop {
        let tokens: Vec<Option<uuid::Uuid>> = sqlx::query_scalar(
            "SELECT lease_token FROM persistence_retry_jobs ORDER BY created_at",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        if tokens.first() != Some(&Some(old_token)) {
            break tokens;
        }
        assert!(tokio::time::Instant::now() < deadline, "never re-leased");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(tokens.len(), 2);
    assert_ne!(
        tokens[0], tokens[1],
        "the blocked job holds a lease of its own, not one shared with the other"
    );
    lock.rollback().await.unwrap();
    running.await.unwrap().unwrap();
    assert_eq!(experience(&pool, blocked).await, 5);
    assert_eq!(experience(&pool, other).await, 5);
}

/// The count is of lease expiries in a row: an attempt that ends (here, failing on a missing
/// character) starts it again, so expiries spread over a long life never add up to a limit.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_settled_attempt_resets_the_lease_expiry_count(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let (queue, signals) = d.queue(16, Arc::new(SystemClock));
        queue
            .enqueue(&reward(uuid::Uuid::now_v7(), "gone-1", 0, 5))
            .await
            .unwrap();
        let mut settings = config("w");
        settings.lease = Duration::from_millis(50);
        let mut worker = d.worker(signals, settings, Arc::new(SystemClock));
        for _ in 0..2 {
            drop(worker.claim(None).await.unwrap());
            tokio::time::sleep(Duration::from_millis(80)).await;
        }
        worker.poll_once().await.unwrap();
        let (attempts, expiries): (i32, i32) = d
            .fetch_one(
                "SELECT attempt_count, lease_expiries FROM persistence_retry_jobs",
                None,
            )
            .await;
        assert_eq!((attempts, expiries), (1, 0), "{}", d.name());
    }
}
