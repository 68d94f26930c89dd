//! A retry job keeps its attempts when the connections its settle gets have broken: only a
//! failure of the job itself counts. (The worker also rules a lost connection met by a job's
//! own settle `Unsettled` rather than a failure; sqlx already drops a pooled connection whose
//! socket closed, so this test guards the property end to end rather than that one branch.)

use std::sync::Arc;
use std::time::Duration;

use shardkeep::PostgresBackend;
use shardkeep::clock::{Clock, SystemClock};
use shardkeep::retry::{JobOutcome, RetryQueue, RetryWorker};
use shardkeep_testkit::faults::{FaultProxy, ProxyMode};
use sqlx::PgPool;

use super::retry_jobs::{character, config, pg, reward};

/// Both pooled connections break (Postgres restarted, a proxy dropped them) while the worker
/// holds a leased batch whose job is on its last attempt, and the pool skips the liveness round
/// trip for connections used moments ago: the job must not be dead-lettered for it.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn broken_connections_cost_a_job_none_of_its_attempts(pool: PgPool) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let id = character(&pool, "Aria").await;
    let (queue, signals) = RetryQueue::new(pg(&pool), 8, Arc::clone(&clock));
    queue.enqueue(&reward(id, "last-try", 0, 5)).await.unwrap();
    let cfg = config("w");
    sqlx::query("UPDATE persistence_retry_jobs SET attempt_count = $1")
        .bind(cfg.retry_limit as i32 - 1)
        .execute(&pool)
        .await
        .unwrap();

    let proxy = FaultProxy::start(shardkeep_testkit::pg_addr())
        .await
        .unwrap();
    let (options, pooler) = shardkeep_testkit::proxied_options(&pool, &proxy);
    let proxied = PostgresBackend::pool_options(2)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(options)
        .await
        .unwrap();
    let mut worker = RetryWorker::new(
        PostgresBackend::from_pool_through(proxied.clone(), pooler),
        shardkeep_testkit::model::LedgerModel::handle(),
        signals,
        cfg,
        clock,
    );
    let batch = worker.claim(None).await.unwrap();
    assert_eq!(batch.len(), 1);
    // Both pooled connections open and idle, then dropped by the proxy, which lets new ones in.
    let (a, b) = (
        proxied.acquire().await.unwrap(),
        proxied.acquire().await.unwrap(),
    );
    drop((a, b));
    proxy.set_mode(ProxyMode::Cut);
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.set_mode(ProxyMode::Pass);

    let outcomes = worker.settle_batch(&batch).await;
    assert!(
        matches!(
            outcomes[..],
            [JobOutcome::Unsettled(_)] | [JobOutcome::Applied]
        ),
        "got {outcomes:?}"
    );
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM persistence_job_dead_letters")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(dead, 0, "a broken connection dead-lettered the job");
}
