//! Enqueues made at the same time are stored together, each still answered for its own job.

use std::sync::Arc;

use shardkeep::clock::SystemClock;
use shardkeep::retry::RetryQueue;
use shardkeep_testkit::{JobDriver, JobDrivers};
use sqlx::PgPool;
use tokio::task::JoinSet;

use super::retry_jobs::{config, reward};

/// 100 enqueues at once (one of them the same job twice) each return once stored, every job is
/// stored once, and the worker applies every one.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn enqueues_at_once_are_each_stored_once(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let id = d.character("Aria").await;
        let (queue, signals) = d.queue(256, Arc::new(SystemClock));
        let twice = reward(id, "twice", 0, 1);
        let mut enqueues = JoinSet::new();
        for n in 0..99 {
            let (queue, job) = (queue.clone(), reward(id, &format!("k{n}"), 0, 1));
            enqueues.spawn(async move { queue.enqueue(&job).await.map(|_| ()) });
        }
        for _ in 0..2 {
            let (queue, job) = (queue.clone(), twice.clone());
            enqueues.spawn(async move { queue.enqueue(&job).await.map(|_| ()) });
        }
        while let Some(done) = enqueues.join_next().await {
            done.unwrap().unwrap();
        }
        assert_eq!(d.count("persistence_retry_jobs").await, 100, "{}", d.name());
        let mut worker = d.worker(signals, config("w"), Arc::new(SystemClock));
        worker.run_until_idle().await.unwrap();
        assert_eq!(d.experience(id).await, 100, "{}", d.name());
    }
}

/// Makes the store refuse a job whose key is `k20`: Postgres refuses a NUL byte in text (the
/// key is given one), the embedded store a trigger's abort.
async fn refuse_key_20(d: &JobDriver) -> String {
    match d {
        JobDriver::Postgres(_) => "bad\0key".to_owned(),
        JobDriver::Embedded(db) => {
            sqlx::query(
                "CREATE TRIGGER refuse_k20 BEFORE INSERT ON persistence_retry_jobs
                 WHEN NEW.idempotency_key = 'k20'
                 BEGIN SELECT RAISE(ABORT, 'refused for the test'); END",
            )
            .execute(db.pool())
            .await
            .unwrap();
            "k20".to_owned()
        }
    }
}

/// A job the store refuses fails alone: the jobs enqueued with it are stored, and their callers
/// told so.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_job_the_store_refuses_fails_alone(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let id = d.character("Aria").await;
        let (queue, _signals) = d.queue(256, Arc::new(SystemClock));
        let refused = refuse_key_20(&d).await;
        let mut enqueues = JoinSet::new();
        for n in 0..40 {
            let key = if n == 20 {
                refused.clone()
            } else {
                format!("k{n}")
            };
            let (queue, job) = (queue.clone(), reward(id, &key, 0, 1));
            enqueues.spawn(async move { (n, queue.enqueue(&job).await.is_ok()) });
        }
        while let Some(done) = enqueues.join_next().await {
            let (n, stored_ok) = done.unwrap();
            assert_eq!(stored_ok, n != 20, "{}: job {n}", d.name());
        }
        assert_eq!(d.count("persistence_retry_jobs").await, 39, "{}", d.name());
    }
}

/// A caller that stops waiting (its task aborted mid-enqueue, here the first, whose enqueue
/// started the insert) cuts no one else off: every other job enqueued with it is stored and
/// answered.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_caller_that_stops_waiting_cuts_no_one_off(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let id = d.character("Aria").await;
        let (queue, _signals) = d.queue(256, Arc::new(SystemClock));
        let mut enqueues = JoinSet::new();
        let mut quitter = None;
        for n in 0..30 {
            let (queue, job) = (queue.clone(), reward(id, &format!("k{n}"), 0, 1));
            let handle = enqueues.spawn(async move { queue.enqueue(&job).await.map(|_| ()) });
            if n == 0 {
                quitter = Some(handle);
            }
        }
        tokio::task::yield_now().await;
        quitter.unwrap().abort();
        let (mut answered, mut aborted) = (0, 0);
        while let Some(done) = enqueues.join_next().await {
            match done {
                Ok(result) => {
                    result.unwrap();
                    answered += 1;
                }
                Err(err) => {
                    assert!(err.is_cancelled());
                    aborted += 1;
                }
            }
        }
        assert!(answered >= 29 && answered + aborted == 30, "{}", d.name());
        let rows = d.count("persistence_retry_jobs").await;
        assert!(rows >= 29, "{}: {rows} stored", d.name());
    }
}

/// With the store out of reach (Postgres: every connection attempt hangs; the file: every
/// call fails), enqueues made together all fail within about one pool timeout (a failed batch
/// used to be retried job by job, one pool timeout each), and nothing is stored.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_outage_fails_a_batch_at_once(pool: PgPool) {
    use shardkeep_testkit::faults::{FaultProxy, ProxyMode};
    use std::time::{Duration, Instant};
    let drivers = shardkeep_testkit::JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let id = d.character("Aria").await;
        let proxy = FaultProxy::start(shardkeep_testkit::pg_addr())
            .await
            .unwrap();
        let queue = match &d {
            shardkeep_testkit::JobDriver::Postgres(pool) => {
                let (options, pooler) = shardkeep_testkit::proxied_options(pool, &proxy);
                let cut = shardkeep::PostgresBackend::pool_options(2)
                    .acquire_timeout(Duration::from_millis(300))
                    .connect_lazy_with(options);
                proxy.set_mode(ProxyMode::Stall);
                RetryQueue::new(
                    shardkeep::PostgresBackend::from_pool_through(cut, pooler),
                    64,
                    Arc::new(SystemClock),
                )
                .0
            }
            shardkeep_testkit::JobDriver::Embedded(_) => {
                let cut = shardkeep::SqliteBackend::connect("DATABASE_URL", drivers.sqlite.url())
                    .await
                    .unwrap();
                cut.fail_for(Duration::from_secs(3_600));
                RetryQueue::embedded(cut, 64, Arc::new(SystemClock)).0
            }
        };
        let started = Instant::now();
        let mut enqueues = JoinSet::new();
        for n in 0..20 {
            let (queue, job) = (queue.clone(), reward(id, &format!("k{n}"), 0, 1));
            enqueues.spawn(async move { queue.enqueue(&job).await.is_err() });
        }
        while let Some(done) = enqueues.join_next().await {
            assert!(done.unwrap(), "{}: nothing can be stored", d.name());
        }
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{}: failing took {:?}",
            d.name(),
            started.elapsed()
        );
        assert_eq!(d.count("persistence_retry_jobs").await, 0, "{}", d.name());
    }
}
