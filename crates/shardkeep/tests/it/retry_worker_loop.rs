//! The retry worker's run loop: one slow batch (or a slow poll) never holds up the signaled
//! jobs of other characters, a quiet worker keeps polling and a held one claims nothing (on
//! each driver).
//!
//! The two slow-settle tests run on Postgres only, where a held row lock stands for the slow
//! settle and the settles of other rows go past it. The embedded store has one writer: a settle
//! holds the file's write lock for its whole transaction, so every other settle waits for it
//! by design, and there is no row-level hold-up to prove absent.

use std::sync::Arc;
use std::time::Duration;

use shardkeep::clock::{Clock, SystemClock};
use shardkeep::retry::{EnqueueOutcome, RetryQueue, RetryWorker};
use shardkeep_testkit::{JobDriver, JobDrivers};
use sqlx::PgPool;
use uuid::Uuid;

use super::retry_jobs::{character, config, experience, pg, reward};

/// Holds `id`'s row lock until the returned transaction ends, so a settle touching it waits.
async fn hold_row(pool: &PgPool, id: Uuid) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM characters WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx
}

/// Waits until some session of this database waits on a row lock (the worker reached the held
/// row).
async fn wait_until_blocked(pool: &PgPool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting > 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker never reached the held row"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(crate) async fn wait_for_experience(pool: &PgPool, id: Uuid, want: i64, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while experience(pool, id).await != want {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The poll claims a job whose character is locked and waits on it; a job signaled meanwhile for
/// another character is still applied at once (the poll used to run inside the loop that reads
/// the signals, holding them up until the lock went).
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_poll_waiting_on_a_locked_row_does_not_hold_up_signaled_jobs(pool: PgPool) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (queue, signals) = RetryQueue::new(pg(&pool), 16, Arc::clone(&clock));
    // A queue whose signals nobody reads: its jobs are found by the poll only.
    let (unsignaled, _unread) = RetryQueue::new(pg(&pool), 16, Arc::clone(&clock));
    let (locked, free) = (character(&pool, "A").await, character(&pool, "B").await);
    let blocker = hold_row(&pool, locked).await;
    unsignaled
        .enqueue(&reward(locked, "polled", 0, 1))
        .await
        .unwrap();
    let mut cfg = config("w");
    cfg.poll_interval = Duration::from_millis(50);
    let worker = RetryWorker::new(
        pg(&pool),
        shardkeep_testkit::model::LedgerModel::handle(),
        signals,
        cfg,
        clock,
    );
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(worker.run(cancel.clone()));
    wait_until_blocked(&pool).await;
    queue
        .enqueue(&reward(free, "signaled", 0, 2))
        .await
        .unwrap();
    wait_for_experience(&pool, free, 2, "the signaled job waited for the poll").await;
    assert_eq!(experience(&pool, locked).await, 0, "the lock is still held");
    blocker.rollback().await.unwrap();
    wait_for_experience(&pool, locked, 1, "the polled job never landed").await;
    cancel.cancel();
    task.await.unwrap();
}

/// A signaled batch waits on a locked character; a job signaled next for another character
/// starts a batch of its own beside it instead of waiting for the first to finish.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_slow_batch_does_not_hold_up_the_next_signaled_jobs(pool: PgPool) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (queue, signals) = RetryQueue::new(pg(&pool), 16, Arc::clone(&clock));
    let (locked, free) = (character(&pool, "A").await, character(&pool, "B").await);
    let (unsignaled, _unread) = RetryQueue::new(pg(&pool), 16, Arc::clone(&clock));
    unsignaled
        .enqueue(&reward(free, "marker", 0, 10))
        .await
        .unwrap();
    let mut cfg = config("w");
    cfg.poll_interval = Duration::from_secs(60);
    let worker = RetryWorker::new(
        pg(&pool),
        shardkeep_testkit::model::LedgerModel::handle(),
        signals,
        cfg,
        clock,
    );
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(worker.run(cancel.clone()));
    // The first poll (at start) is over once it has applied a job only it could find; after
    // that, only signals reach the worker.
    wait_for_experience(&pool, free, 10, "the first poll never ran").await;
    let blocker = hold_row(&pool, locked).await;
    queue.enqueue(&reward(locked, "slow", 0, 1)).await.unwrap();
    wait_until_blocked(&pool).await;
    queue.enqueue(&reward(free, "next", 0, 2)).await.unwrap();
    wait_for_experience(&pool, free, 12, "the next job waited for the slow batch").await;
    assert_eq!(experience(&pool, locked).await, 0, "the lock is still held");
    blocker.rollback().await.unwrap();
    wait_for_experience(&pool, locked, 1, "the slow job never landed").await;
    cancel.cancel();
    task.await.unwrap();
}

/// Waits up to 5 s for `id`'s experience on driver `d` to reach `want`.
async fn wait_on(d: &JobDriver, id: Uuid, want: i64, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while d.experience(id).await != want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}: {what}",
            d.name()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A quiet worker keeps polling: a job whose signal never arrives, stored well after the first
/// poll, is applied within a couple of poll intervals (the loop used to stop polling after the
/// first poll until some signal woke it).
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_quiet_worker_keeps_polling(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let (_queue, signals) = d.queue(16, Arc::clone(&clock));
        let (unsignaled, _unread) = d.queue(16, Arc::clone(&clock));
        let id = d.character("A").await;
        let mut cfg = config("w");
        cfg.poll_interval = Duration::from_millis(100);
        let worker = d.worker(signals, cfg, clock);
        let cancel = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(worker.run(cancel.clone()));
        tokio::time::sleep(Duration::from_millis(500)).await;
        unsignaled.enqueue(&reward(id, "late", 0, 4)).await.unwrap();
        wait_on(&d, id, 4, "the worker stopped polling").await;
        cancel.cancel();
        task.await.unwrap();
    }
}

/// A held worker claims nothing: its signal channel fills and producers fall back to
/// durable-only; released, the same loop applies everything, signaled and polled alike.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_held_worker_claims_nothing_until_released(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let (queue, signals) = d.queue(2, Arc::clone(&clock));
        let id = d.character("A").await;
        let mut cfg = config("w");
        cfg.poll_interval = Duration::from_millis(50);
        let worker = d.worker(signals, cfg, clock);
        let pause = worker.pause_handle();
        pause.set(true);
        assert!(pause.is_held());
        let cancel = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(worker.run(cancel.clone()));
        let mut outcomes = Vec::new();
        for n in 0..5 {
            outcomes.push(
                queue
                    .enqueue(&reward(id, &format!("held-{n}"), 0, 1))
                    .await
                    .unwrap(),
            );
        }
        assert!(
            outcomes
                .iter()
                .any(|o| matches!(o, EnqueueOutcome::DurableOnly(_))),
            "{}: the channel filled: {outcomes:?}",
            d.name()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            d.experience(id).await,
            0,
            "{}: nothing was claimed while held",
            d.name()
        );
        pause.set(false);
        wait_on(&d, id, 5, "released, the worker applied every job").await;
        cancel.cancel();
        task.await.unwrap();
    }
}
