//! The crash window a shard exports: how old the newest durable copy of its residents is, per
//! tier. A Postgres outage grows the row age while checkpoints keep the Redis age small.

use std::time::{Duration, Instant};

use shardkeep_reference::shard::ShardConfig;
use shardkeep_testkit::TestRedis;
use shardkeep_testkit::faults::{FaultProxy, ProxyMode};
use sqlx::PgPool;

use crate::support::{
    Stores, boot_with, login, pg_addr, proxied_pg, pump_until, rows_checkpoints_and_jobs,
};

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_postgres_outage_shows_as_a_growing_row_age(pool: PgPool) {
    let redis = TestRedis::new().await;
    let stores = Stores::new(&pool, redis.backend());
    let proxy = FaultProxy::start(pg_addr()).await.unwrap();
    let shard_pool = proxied_pg(&pool, &proxy).await;
    let mut config = ShardConfig::new("shard-w", "zone-0");
    config.checkpoint_pulses = 2;
    config.flush_pulses = 4;
    let mut shard = boot_with(
        rows_checkpoints_and_jobs(shard_pool, redis.backend()),
        &stores,
        config,
        &[0],
        1,
    );
    let id = stores.new_character("Windowed").await;
    login(&stores, &mut shard, id, "s-w").await;
    // Both tiers land.
    pump_until(&mut shard, Duration::from_secs(5), |s| {
        s.saver().stats().row_landed >= 1 && s.saver().stats().checkpoint_landed >= 1
    })
    .await;
    let fresh = shard.saver().landed().measure(Instant::now(), &[id]);
    assert!(fresh.row_worst < Duration::from_secs(2), "{fresh:?}");
    // Postgres stops answering; checkpoints go on.
    proxy.set_mode(ProxyMode::Cut);
    let cut_at = Instant::now();
    pump_until(&mut shard, Duration::from_secs(10), |_| {
        cut_at.elapsed() > Duration::from_millis(1_500)
    })
    .await;
    let during = shard.saver().landed().measure(Instant::now(), &[id]);
    assert!(
        during.row_worst >= Duration::from_millis(1_500),
        "the row age grows through the outage: {during:?}"
    );
    assert!(
        during.checkpoint_worst < Duration::from_secs(1),
        "checkpoints still land: {during:?}"
    );
    proxy.set_mode(ProxyMode::Pass);
}
