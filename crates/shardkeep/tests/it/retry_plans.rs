//! The retry worker's statements stay on their indexes as the tables grow: a settle never scans
//! the whole queue or every recorded effect (read off Postgres's own scan counters).

use std::sync::Arc;
use std::time::Duration;

use shardkeep::PostgresBackend;
use shardkeep::clock::{Clock, SystemClock};
use shardkeep::retry::{RetryQueue, RetryWorker};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

use super::retry_jobs::{config, pg, reward};

/// `(sequential scans, index scans)` of `table`, as flushed so far.
async fn scans(pool: &PgPool, table: &str) -> (i64, i64) {
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_as(
        "SELECT COALESCE(seq_scan, 0), COALESCE(idx_scan, 0)
           FROM pg_stat_user_tables WHERE relname = $1",
    )
    .bind(table)
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// Closes the worker's own pool and waits until its backend (`worker_pid`) has exited, which
/// flushes its counters, and `table`'s index scans have moved past `before`; returns the
/// counters then.
async fn flushed(
    pool: &PgPool,
    worker_pool: PgPool,
    worker_pid: i32,
    table: &str,
    before: (i64, i64),
) -> (i64, i64) {
    worker_pool.close().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let alive: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
                .bind(worker_pid)
                .fetch_one(pool)
                .await
                .unwrap();
        let now = scans(pool, table).await;
        if !alive && now.1 > before.1 {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{table}'s counters never moved"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The backend pid of a one-connection pool.
async fn backend_pid(worker_pool: &PgPool) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(worker_pool)
        .await
        .unwrap()
}

/// A one-connection pool for the worker, with `settings`. `plan_cache_mode =
/// force_generic_plan` makes Postgres run the generic (cached) plan of every statement, the plan
/// it settles on after a few executions when that looks no costlier than planning each call: a
/// statement must stay on its indexes in that form too.
async fn one_connection(pool: &PgPool, settings: &[(&str, &str)]) -> PgPool {
    let options = pool
        .connect_options()
        .as_ref()
        .clone()
        .options(settings.iter().copied());
    PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap()
}

/// Characters with no state to speak of, `n` of them.
async fn characters(pool: &PgPool, n: i64) -> Vec<Uuid> {
    sqlx::query_scalar(
        "INSERT INTO characters (id, account_id, name, state)
         SELECT gen_random_uuid(), gen_random_uuid(), 'c' || g, '{\"experience\": 0}'
           FROM generate_series(1, $1) g
         RETURNING id",
    )
    .bind(n)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A batch of 120 reward jobs looks each key up through the primary key, with 20,000 effects of
/// other characters recorded (Postgres planned the join the lookup used to be as a hash join
/// over the whole table once a batch held many keys).
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_full_batch_never_scans_every_recorded_effect(pool: PgPool) {
    sqlx::query(
        "INSERT INTO character_job_effects
                (character_id, idempotency_key, owner_epoch, issue_seq, job_kind, payload, row_version)
         SELECT gen_random_uuid(), 'old-' || g, 0, 0, 'combat_rewards', '{}', 1
           FROM generate_series(1, 20000) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (queue, _unread) = RetryQueue::new(pg(&pool), 1, Arc::clone(&clock));
    for (n, id) in characters(&pool, 120).await.into_iter().enumerate() {
        queue
            .enqueue(&reward(id, &format!("k{n}"), 0, 1))
            .await
            .unwrap();
    }
    let before = scans(&pool, "character_job_effects").await;
    let worker_pool = one_connection(&pool, &[]).await;
    let pid = backend_pid(&worker_pool).await;
    let (_queue, signals) = RetryQueue::new(pg(&pool), 1, Arc::clone(&clock));
    let mut worker = RetryWorker::new(
        PostgresBackend::from_pool(worker_pool.clone()),
        shardkeep_testkit::model::LedgerModel::handle(),
        signals,
        config("w"),
        clock,
    );
    assert_eq!(worker.poll_once().await.unwrap(), 120);
    drop(worker);
    let after = flushed(&pool, worker_pool, pid, "character_job_effects", before).await;
    assert_eq!(
        after.0, before.0,
        "the settle scanned every recorded effect"
    );
}

/// Signaled claims find their rows through the id index, whatever the queue holds: the
/// statement they shared with the poll (`$2 IS NULL OR retry_job_id = ANY($2)`) had a cached
/// plan that scanned the whole table, here 5,000 rows of a backlog due later.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn signaled_claims_never_scan_the_whole_queue(pool: PgPool) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let ids = characters(&pool, 10).await;
    sqlx::query(
        "INSERT INTO persistence_retry_jobs (retry_job_id, job_kind, character_id, payload,
             next_attempt_at, session_impact, source, idempotency_key, owner_epoch, origin, issued_at)
         SELECT gen_random_uuid(), 'combat_rewards', $1, '{}', now() + interval '1 hour', 'none',
                'backlog', 'b-' || g, 0, 'combat_rewards', now()
           FROM generate_series(1, 5000) g",
    )
    .bind(ids[0])
    .execute(&pool)
    .await
    .unwrap();
    let worker_pool = one_connection(&pool, &[("plan_cache_mode", "force_generic_plan")]).await;
    let pid = backend_pid(&worker_pool).await;
    let (queue, signals) = RetryQueue::new(pg(&pool), 64, Arc::clone(&clock));
    let mut worker = RetryWorker::new(
        PostgresBackend::from_pool(worker_pool.clone()),
        shardkeep_testkit::model::LedgerModel::handle(),
        signals,
        config("w"),
        clock,
    );
    let before = scans(&pool, "persistence_retry_jobs").await;
    for (n, id) in ids.iter().enumerate() {
        queue
            .enqueue(&reward(*id, &format!("s{n}"), 0, 1))
            .await
            .unwrap();
        assert_eq!(worker.drain_signals().await.unwrap(), 1);
    }
    drop(worker);
    let after = flushed(&pool, worker_pool, pid, "persistence_retry_jobs", before).await;
    assert_eq!(
        after.0, before.0,
        "a signaled claim scanned the whole queue"
    );
}

/// Every claim statement's generic plan (the one a cached statement may run) walks an index
/// over a large backlog: a poll reads the claimable index in its order, and the lease's update
/// finds the claimed rows by id. With 100,000 jobs waiting, the lease's update used to join the
/// claimed rows against a sequential scan of the whole table, since the generic plan cannot
/// know how few rows the claim's limit lets through.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn every_claim_plan_walks_an_index_over_a_large_backlog(pool: PgPool) {
    sqlx::query(
        "INSERT INTO persistence_retry_jobs (retry_job_id, job_kind, character_id, payload,
             next_attempt_at, session_impact, source, idempotency_key, owner_epoch, origin,
             issued_at, lease_token, lease_owner, lease_expires_at)
         SELECT gen_random_uuid(), 'combat_rewards', gen_random_uuid(), '{}',
                now() + interval '1 hour', 'none', 'backlog', 'b-' || g, 0, 'combat_rewards',
                now(),
                CASE WHEN g % 10 = 0 THEN gen_random_uuid() END,
                CASE WHEN g % 10 = 0 THEN 'elsewhere' END,
                CASE WHEN g % 10 = 0 THEN now() + interval '1 hour' END
           FROM generate_series(1, 100000) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE persistence_retry_jobs")
        .execute(&pool)
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let faults = shardkeep_testkit::claim_plans::claim_plan_faults(&mut conn)
        .await
        .unwrap();
    assert!(faults.is_empty(), "{faults:?}");
}

/// A statement the plan check cannot explain is an error that leaves nothing prepared on the
/// connection it borrowed (a pooled connection goes back to other users).
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_plan_check_that_fails_leaves_no_statement_prepared(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap();
    // Prepared with one parameter, executed with three: EXPLAIN EXECUTE refuses it.
    let broken = shardkeep::retry::ClaimStatement {
        name: "broken",
        sql: "SELECT $1::timestamptz",
        param_types: "timestamptz",
        poll: false,
    };
    let outcome = shardkeep_testkit::claim_plans::statement_plan_faults(&mut conn, &[broken]).await;
    // The explain is what failed (a statement that never got prepared would prove nothing).
    let error = outcome
        .expect_err("the explain of a mismatched EXECUTE fails")
        .to_string();
    assert!(error.contains("wrong number of parameters"), "{error}");
    let prepared: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM pg_prepared_statements WHERE name LIKE 'shardkeep_claim_check_%'",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    assert!(prepared.is_empty(), "left prepared: {prepared:?}");
}

/// A poll finds its due rows through the partial indexes, however many jobs wait for later: the
/// claim's `lease_token IS NULL OR lease_expires_at <= $1` matched neither index, so every poll
/// scanned and sorted the whole queue (here 20,000 rows due in an hour and 200 leased rows whose
/// lease is still running).
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_poll_never_scans_a_backlog_that_is_not_due(pool: PgPool) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let ids = characters(&pool, 10).await;
    sqlx::query(
        "INSERT INTO persistence_retry_jobs (retry_job_id, job_kind, character_id, payload,
             next_attempt_at, session_impact, source, idempotency_key, owner_epoch, origin,
             issued_at, lease_token, lease_owner, lease_expires_at)
         SELECT gen_random_uuid(), 'combat_rewards', $1, '{}', now() + interval '1 hour', 'none',
                'backlog', 'b-' || g, 0, 'combat_rewards', now(),
                CASE WHEN g <= 200 THEN gen_random_uuid() END,
                CASE WHEN g <= 200 THEN 'elsewhere' END,
                CASE WHEN g <= 200 THEN now() + interval '1 hour' END
           FROM generate_series(1, 20000) g",
    )
    .bind(ids[0])
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE persistence_retry_jobs")
        .execute(&pool)
        .await
        .unwrap();
    let worker_pool = one_connection(&pool, &[("plan_cache_mode", "force_generic_plan")]).await;
    let pid = backend_pid(&worker_pool).await;
    let (queue, _signals) = RetryQueue::new(pg(&pool), 64, Arc::clone(&clock));
    let (_, other_signals) = RetryQueue::new(pg(&pool), 64, Arc::clone(&clock));
    let mut worker = RetryWorker::new(
        PostgresBackend::from_pool(worker_pool.clone()),
        shardkeep_testkit::model::LedgerModel::handle(),
        other_signals,
        config("w"),
        clock,
    );
    let before = scans(&pool, "persistence_retry_jobs").await;
    for (n, id) in ids.iter().enumerate() {
        queue
            .enqueue(&reward(*id, &format!("p{n}"), 0, 1))
            .await
            .unwrap();
        assert_eq!(worker.poll_once().await.unwrap(), 1);
    }
    assert_eq!(worker.poll_once().await.unwrap(), 0, "nothing else is due");
    drop(worker);
    let after = flushed(&pool, worker_pool, pid, "persistence_retry_jobs", before).await;
    assert_eq!(after.0, before.0, "a poll scanned the whole queue");
}

/// `(rows read by sequential scans, rows fetched through indexes)` of `table`.
async fn rows_read(pool: &PgPool, table: &str) -> (i64, i64) {
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_as(
        "SELECT COALESCE(seq_tup_read, 0), COALESCE(idx_tup_fetch, 0)
           FROM pg_stat_user_tables WHERE relname = $1",
    )
    .bind(table)
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// The depth counts read a bounded number of rows however many jobs wait (they counted every
/// row of the queue on every poll and every console refresh), and the leased ones exactly.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn depth_counts_read_a_bounded_part_of_a_large_queue(pool: PgPool) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let ids = characters(&pool, 1).await;
    sqlx::query(
        "INSERT INTO persistence_retry_jobs (retry_job_id, job_kind, character_id, payload,
             next_attempt_at, session_impact, source, idempotency_key, owner_epoch, origin,
             issued_at, lease_token, lease_owner, lease_expires_at)
         SELECT gen_random_uuid(), 'combat_rewards', $1, '{}', now() + interval '1 hour', 'none',
                'backlog', 'b-' || g, 0, 'combat_rewards', now(),
                CASE WHEN g <= 200 THEN gen_random_uuid() END,
                CASE WHEN g <= 200 THEN 'elsewhere' END,
                CASE WHEN g <= 200 THEN now() + interval '1 hour' END
           FROM generate_series(1, 30000) g",
    )
    .bind(ids[0])
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE persistence_retry_jobs")
        .execute(&pool)
        .await
        .unwrap();
    let counting_pool = one_connection(&pool, &[]).await;
    let pid = backend_pid(&counting_pool).await;
    let (queue, _signals) =
        RetryQueue::new(PostgresBackend::from_pool(counting_pool.clone()), 1, clock);
    let before = rows_read(&pool, "persistence_retry_jobs").await;
    let (jobs, _dead) = queue.depths().await.unwrap();
    counting_pool.close().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let after = loop {
        let alive: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
                .bind(pid)
                .fetch_one(&pool)
                .await
                .unwrap();
        let now = rows_read(&pool, "persistence_retry_jobs").await;
        if !alive && now != before {
            break now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "counters never moved"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let read = (after.0 - before.0) + (after.1 - before.1);
    assert!(
        read <= 10_001 + 200,
        "the counts read {read} rows of 30,000"
    );
    // Past the bound the total is Postgres's live-row statistic, an estimate: never below what
    // the bounded scan saw, and here it may count the insert twice (its report and ANALYZE's
    // race), so it is held to the order of the queue only.
    assert!((10_001..=60_000).contains(&jobs), "{jobs} jobs counted");
}
