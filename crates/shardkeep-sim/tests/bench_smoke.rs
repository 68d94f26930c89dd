//! The benchmarks run end to end on tiny settings (no timing is asserted here; the numbers come
//! from `shardkeep bench`).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use shardkeep_sim::bench::BenchEnv;
use shardkeep_sim::bench::ladder::{self, LadderBenchConfig};

async fn env() -> BenchEnv {
    let database_url = std::env::var("DATABASE_URL").unwrap();
    BenchEnv::setup(&database_url, &shardkeep_testkit::redis_url())
        .await
        .unwrap()
}

#[tokio::test]
async fn the_ladder_bench_runs_every_step_and_cleans_up() {
    let env = env().await;
    let namespace = env.redis.keys().namespace().to_owned();
    let report = ladder::run(
        &env,
        LadderBenchConfig {
            rows: 300,
            window: Duration::from_millis(200),
            batch: 100,
            online: 400,
            sustain: Duration::from_millis(1500),
        },
    )
    .await
    .unwrap();
    for rate in [
        report.raw_update,
        report.cas_single,
        report.cas_batched,
        report.raw_set,
        report.checkpoint,
    ] {
        assert!(rate > 0.0);
    }
    let sustain = report.sustain.unwrap();
    assert_eq!(
        (sustain.online, sustain.dropped, sustain.failed),
        (400, 0, 0)
    );
    assert!(sustain.checkpoints_per_second > 0.0);
    env.teardown().await;
    let redis = shardkeep_testkit::TestRedis::new().await;
    let mut raw = redis.raw().await;
    let (_, left): (u64, Vec<String>) = redis::cmd("SCAN")
        .arg(0)
        .arg("MATCH")
        .arg(format!("{namespace}:*"))
        .arg("COUNT")
        .arg(100_000)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(left.is_empty(), "teardown leaves no keys");
}

#[tokio::test]
async fn the_audit_bench_runs_every_step() {
    let env = env().await;
    let database_url = std::env::var("DATABASE_URL").unwrap();
    let report = shardkeep_sim::bench::audit::run(
        &env,
        &database_url,
        shardkeep_sim::bench::audit::AuditBenchConfig {
            events: 300,
            burst: 100,
            slowdown: Duration::from_millis(2),
        },
    )
    .await
    .unwrap();
    assert!(report.batched > 0.0 && report.single_row > 0.0);
    assert!(report.batched_dropped <= 100 && report.single_row_dropped <= 100);
    env.teardown().await;
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
    let aged = shardkeep_sim::bench::aging::age_character(&env, plan)
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
