//! Jobs that crash or hang the worker holding them: every lease that runs out is counted, and a
//! job over the limit is dead-lettered with a clear error instead of being leased forever.
//! Every test runs on each driver; a model that panics inside the settle stands for a job that
//! crashes its worker.

use std::sync::Arc;
use std::time::Duration;

use shardkeep::clock::SystemClock;
use shardkeep::model::{Anchor, GameModel, ModelHandle};
use shardkeep_testkit::JobDrivers;
use shardkeep_testkit::model::{LedgerEffect, LedgerModel};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::retry_jobs::{config, reward};

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

/// The ledger model, except that a reward of [`CRASHING_GRANT`] experience panics inside the
/// settle: the job kills the worker task holding it, as a job that crashes its process would.
#[derive(Debug, Clone, Copy)]
struct CrashingModel;

/// The grant that crashes the worker applying it.
const CRASHING_GRANT: i64 = 666;

impl GameModel for CrashingModel {
    type State = serde_json::Map<String, serde_json::Value>;
    type Effect = LedgerEffect;

    fn apply_effect(
        &self,
        state: &mut Self::State,
        anchor: &mut Anchor,
        effect: &LedgerEffect,
    ) -> Result<bool, String> {
        if let LedgerEffect::CombatRewards { experience, .. } = effect {
            assert_ne!(*experience, CRASHING_GRANT, "the job crashes its worker");
        }
        LedgerModel.apply_effect(state, anchor, effect)
    }
}

/// Runs `run` on a task of its own and expects it to die of the crashing job.
async fn crashes<F: std::future::Future + Send + 'static>(run: F)
where
    F::Output: Send,
{
    let died = tokio::spawn(run).await;
    assert!(
        died.is_err_and(|e| e.is_panic()),
        "the job crashed its worker"
    );
}

/// A worker that starts claims the jobs already due under a committed lease, so a job that
/// killed the previous process inside its one-transaction settle leaves a trace when it kills
/// this one too.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_starting_worker_claims_due_jobs_under_a_lease(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let id = d.character("Restarted").await;
        let (queue, _) = d.queue(16, Arc::new(SystemClock));
        queue
            .enqueue(&reward(id, "start-1", 0, CRASHING_GRANT))
            .await
            .unwrap();
        // A process starting after a crash: no signal of the job survived, its first poll finds
        // it.
        let (_, signals) = d.queue(16, Arc::new(SystemClock));
        let worker = d.worker_for(
            ModelHandle::new(CrashingModel),
            signals,
            config("w"),
            Arc::new(SystemClock),
        );
        // The run loop outlives the panicking settle; the lease its first claim wrote stays.
        let running = tokio::spawn(worker.run(CancellationToken::new()));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let expiries = loop {
            let (leased, expiries): (bool, i32) = d
                .fetch_one(
                    "SELECT lease_token IS NOT NULL, lease_expiries FROM persistence_retry_jobs",
                    None,
                )
                .await;
            if leased {
                break expiries;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}: the starting worker's first claim wrote no lease that outlives its crash",
                d.name()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        running.abort();
        assert_eq!(expiries, 0, "{}", d.name());
        assert_eq!(d.experience(id).await, 0, "{}", d.name());
    }
}

/// Jobs whose shared lease ran out (one of them crashed the worker holding them all) are
/// claimed again one per lease, so a second crash is counted against that job alone.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn jobs_from_a_lapsed_batch_are_claimed_again_one_per_lease(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let (crashing, other) = (d.character("Crashing").await, d.character("Other").await);
        let (queue, signals) = d.queue(16, Arc::new(SystemClock));
        queue
            .enqueue(&reward(crashing, "batch-1", 0, CRASHING_GRANT))
            .await
            .unwrap();
        queue
            .enqueue(&reward(other, "batch-2", 0, 5))
            .await
            .unwrap();
        let mut settings = config("w");
        settings.lease = Duration::from_millis(50);
        let mut worker = d.worker_for(
            ModelHandle::new(CrashingModel),
            signals,
            settings.clone(),
            Arc::new(SystemClock),
        );
        // One worker takes both under one lease and dies.
        assert_eq!(worker.claim(None).await.unwrap().len(), 2, "{}", d.name());
        drop(worker);
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert_eq!(
            shared_leases(&d, crashing).await,
            1,
            "{}: one lease holds both",
            d.name()
        );
        // The next worker finds both lapsed, takes the crashing job first and dies in it.
        let (_, signals) = d.queue(16, Arc::new(SystemClock));
        let mut next = d.worker_for(
            ModelHandle::new(CrashingModel),
            signals,
            settings.clone(),
            Arc::new(SystemClock),
        );
        crashes(async move { next.poll_once().await }).await;
        let (leased, expiries): (bool, i32) = d
            .fetch_one(
                "SELECT lease_token IS NOT NULL, lease_expiries FROM persistence_retry_jobs
                  WHERE character_id = $1",
                Some(crashing),
            )
            .await;
        assert!(leased, "{}: the crashing job was leased again", d.name());
        assert_eq!(expiries, 1, "{}", d.name());
        assert_eq!(
            shared_leases(&d, crashing).await,
            0,
            "{}: the crashing job holds a lease of its own, not one shared with the other",
            d.name()
        );
        // Its lease runs out again: counted against it alone; the other job still lands.
        tokio::time::sleep(Duration::from_millis(80)).await;
        let (_, signals) = d.queue(16, Arc::new(SystemClock));
        let mut last = d.worker_for(
            ModelHandle::new(CrashingModel),
            signals,
            settings,
            Arc::new(SystemClock),
        );
        crashes(async move { last.run_until_idle().await }).await;
        let (crashing_expiries,): (i32,) = d
            .fetch_one(
                "SELECT lease_expiries FROM persistence_retry_jobs WHERE character_id = $1",
                Some(crashing),
            )
            .await;
        assert_eq!(crashing_expiries, 2, "{}", d.name());
        assert_eq!(d.experience(other).await, 5, "{}", d.name());
    }
}

/// How many other jobs hold the same lease as the job of `character`.
async fn shared_leases(d: &shardkeep_testkit::JobDriver, character: uuid::Uuid) -> i64 {
    d.fetch_one::<(i64,)>(
        "SELECT count(*) FROM persistence_retry_jobs a
           JOIN persistence_retry_jobs b ON b.lease_token = a.lease_token
          WHERE a.character_id = $1 AND b.character_id <> a.character_id",
        Some(character),
    )
    .await
    .0
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
