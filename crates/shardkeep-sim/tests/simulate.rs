//! The simulator end to end on small sizes with every fault on: the invariants hold, each fault
//! left its trace in the report, and the scratch stores are gone afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use shardkeep_sim::{self as sim, FaultSet, SimConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_run_with_every_fault_keeps_every_invariant() {
    let database_url = std::env::var("DATABASE_URL").unwrap();
    // In the PgBouncer pass the run reaches Postgres through PgBouncer in transaction mode.
    let run_url = shardkeep_testkit::pgbouncer::pass_database_url("postgres");
    let config = SimConfig {
        pg_pooler: shardkeep_testkit::pgbouncer::pass_pooler(),
        duration: Duration::from_secs(12),
        players: 120,
        shards: 3,
        seed: 3,
        faults: FaultSet::all(),
        ..SimConfig::default()
    };
    let report = sim::run(config, &run_url, &shardkeep_testkit::redis_url(), |_| {})
        .await
        .unwrap();
    let failed: Vec<_> = report.invariants.iter().filter(|i| !i.holds).collect();
    assert!(report.passed, "{report}\n{failed:?}");
    assert_eq!(report.invariants.len(), 8);
    for invariant in &report.invariants {
        assert!(invariant.checked > 0, "{} checked nothing", invariant.name);
    }
    // Every tier was written, fences fired, jobs and entries flowed, faults happened.
    assert!(report.tiers.iter().all(|t| t.landed > 0), "{report}");
    assert!(report.retry.applied > 0 && report.journal.processed > 0);
    assert!(report.audit_total() > 0);
    assert!(report.transfers.committed > 0);
    assert!(
        report.activity["instance entries"] > 0,
        "players walk into the reference world's instance"
    );
    // kill-shard kills one, double-crash a shard and its replacement.
    assert_eq!(report.faults["shards_killed"], 3, "{}", report.faults);
    assert!(
        report.faults["zombies_made"].as_u64().unwrap() > 0,
        "{}",
        report.faults
    );
    assert!(report.retry.dead_lettered >= 3, "the planted retry poison");
    assert!(
        report.journal.dead_lettered >= 3,
        "the planted journal poison"
    );
    assert!(report.ownership_fences > 0, "the zombies met their fence");
    let scratch = report.run["scratch_database"].as_str().unwrap();
    assert!(scratch.starts_with("shardkeep_sim_"));
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_database WHERE datname = $1")
        .bind(scratch)
        .fetch_one(&sqlx::PgPool::connect(&database_url).await.unwrap())
        .await
        .unwrap();
    assert_eq!(left, 0, "the scratch database is dropped");
    let namespace = report.run["redis_namespace"].as_str().unwrap();
    let backend = shardkeep_testkit::redis_backend("raw").await;
    let keys = shardkeep_testkit::keys_matching(&backend, &format!("*{namespace}*")).await;
    assert!(keys.is_empty(), "keys left behind: {keys:?}");
}

#[tokio::test]
async fn bad_sizes_are_refused_before_touching_a_store() {
    let config = SimConfig {
        players: 0,
        ..SimConfig::default()
    };
    let err = sim::run(
        config,
        "postgres://nowhere:1/none",
        "redis://nowhere:1",
        |_| {},
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("players"), "{err}");
}
