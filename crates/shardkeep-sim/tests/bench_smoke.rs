//! The benchmarks run end to end on tiny settings (no timing is asserted here; the numbers come
//! from `shardkeep bench`).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::BTreeSet;

use shardkeep_sim::bench::all::{self, AllConfig, Engines};
use shardkeep_sim::bench::{BenchEnv, Goal, Progress, Unit};

async fn env() -> BenchEnv {
    let database_url = std::env::var("DATABASE_URL").unwrap();
    BenchEnv::setup(&database_url, &shardkeep_testkit::standalone_redis_url())
        .await
        .unwrap()
}

/// `bench all` on tiny sizes: every benchmark runs, each row carries finite figures, the
/// correctness checks inside the benchmarks hold, and no scratch database or key is left.
#[tokio::test]
async fn bench_all_runs_every_benchmark_and_cleans_up() {
    let database_url = std::env::var("DATABASE_URL").unwrap();
    let engines = Engines::new(&database_url, &shardkeep_testkit::standalone_redis_url())
        .with_cluster(shardkeep_testkit::cluster_redis_url().as_deref());
    let report = all::run(&engines, AllConfig::smoke(), &Progress::quiet())
        .await
        .unwrap();
    let benches: BTreeSet<&str> = report.table.rows.iter().map(|r| r.bench.as_str()).collect();
    for bench in [
        "aging", "ladder", "queue", "depth", "retry", "backlog", "login", "audit", "capacity",
    ] {
        assert!(benches.contains(bench), "no row of {bench}: {benches:?}");
    }
    for row in &report.table.rows {
        // A count set beside another without a goal (drops against drops) may be zero on both
        // sides; every rate and every goal's comparison was measured.
        let context_count = row.unit == Unit::Count && row.goal == Goal::None;
        assert!(
            row.shardkeep.is_finite()
                && row.measured.is_finite()
                && (row.measured > 0.0 || context_count),
            "{row:?}"
        );
    }
    for c in &report.capacity {
        assert_eq!((c.dropped, c.failed), (0, 0), "{c:?}");
        assert!(c.checkpoints_per_second > 0.0 && c.flush_rows_per_second > 0.0);
    }
    for l in &report.login {
        assert_eq!(l.from_checkpoint, l.players, "{l:?}");
    }
    assert_eq!(report.queue.len(), 2);
    if shardkeep_testkit::redis_is_cluster() {
        assert_eq!(
            report.queue_cluster.len(),
            2,
            "the queue ran on the cluster too"
        );
        assert!(
            report
                .queue_cluster
                .iter()
                .all(|q| q.batch_lease > 0.0 && q.drain > 0.0)
        );
    }
    let depth = report.depth.unwrap();
    assert!(depth.one > 0.0 && depth.many > 0.0);
    let text = report.table.render();
    assert!(text.contains("goals met"), "{text}");

    let scratch = engines.scratch();
    assert!(scratch.len() >= 8, "{scratch:?}");
    let pool = sqlx::PgPool::connect(&database_url).await.unwrap();
    let names: Vec<String> = scratch.iter().map(|(db, _)| db.clone()).collect();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_database WHERE datname = ANY($1)")
        .bind(&names)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "scratch databases left");
    let redis = shardkeep_testkit::TestRedis::new().await;
    let mut raw = redis.raw().await;
    // The peer's runs leave no entry in apalis's shared queue registry either.
    let registered: Vec<String> = redis::cmd("ZRANGE")
        .arg(shardkeep_sim::bench::queue::APALIS_QUEUES)
        .arg(0)
        .arg(-1)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        !registered.iter().any(|q| q.contains("bench-apalis-")),
        "apalis queues left registered: {registered:?}"
    );
    for (_, namespace) in &scratch {
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("*{namespace}*"))
                .arg("COUNT")
                .arg(10_000)
                .query_async(&mut raw)
                .await
                .unwrap();
            assert!(keys.is_empty(), "keys left in {namespace}: {keys:?}");
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
}

/// A character aged through the library (logins, rewards with some as retry jobs, item moves,
/// flushes, the maintenance pass) keeps a document the size of a fresh one holding the same
/// items, with none of shardkeep's bookkeeping in it and none left beside it.
#[tokio::test]
async fn an_aged_character_weighs_what_a_fresh_one_with_its_items_does() {
    let env = env().await;
    let plan = shardkeep_sim::bench::aging::AgingPlan {
        rewards: 3_000,
        item_moves: 300,
        logins: 30,
        job_every: 10,
    };
    let aged = shardkeep_sim::bench::aging::age_character(&env, plan, &Progress::quiet())
        .await
        .unwrap();
    assert_eq!(aged.jobs, 300);
    let fields = aged.state.as_object().unwrap();
    for old in ["reward_keys", "job_effects", "held_at_load"] {
        assert!(!fields.contains_key(old), "{old} is in the document");
    }
    let (aged_bytes, fresh_bytes) = (
        aged.state.to_string().len(),
        aged.fresh_state.to_string().len(),
    );
    assert!(
        aged_bytes * 10 <= fresh_bytes * 11,
        "aged {aged_bytes} bytes vs fresh {fresh_bytes}"
    );
    // Every reward once: the template's 48211 plus 30 sessions of 100 grants.
    let per_session: i64 = (0..100).map(|n: i64| 17 + n % 23).sum();
    assert_eq!(aged.state["experience"], 48_211 + 30 * per_session);
    // Only the item-load ledger's rows for its items are left beside it.
    let items = shardkeep_reference::game::state::stored_item_ids(&aged.state).len() as i64;
    assert_eq!(aged.bookkeeping_rows, items);
    env.teardown().await;
}
