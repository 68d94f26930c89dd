//! A saver whose queue is full: logouts keep their final saves until there is room.

use std::time::Duration;

use shardkeep::saver::{SaveReason, SaverConfig};
use shardkeep_reference::shard::ShardConfig;
use shardkeep_testkit::TestRedis;
use shardkeep_testkit::faults::{FaultProxy, ProxyMode};
use sqlx::PgPool;

use crate::support::{Stores, boot_with, login, pg_addr, proxied_pg, rows_only};

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_logout_during_a_saver_backlog_keeps_its_final_until_there_is_room(pool: PgPool) {
    let redis = TestRedis::new().await;
    let stores = Stores::new(&pool, redis.backend());
    let proxy = FaultProxy::start(pg_addr()).await.unwrap();
    let slow_pool = proxied_pg(&pool, &proxy).await;
    let mut config = ShardConfig::new("shard-a", "zone-0");
    config.saver = SaverConfig {
        queue_depth: 2,
        max_batch: 1,
        io_timeout: Duration::from_secs(1),
        ..SaverConfig::default()
    };
    config.flush_pulses = 1_000;
    config.checkpoint_pulses = 1_000;
    let shard_stores = rows_only(slow_pool);
    let mut shard = boot_with(shard_stores, &stores, config, &[0], 1);
    let mut ids = Vec::new();
    for i in 0..3 {
        let id = stores.new_character(&format!("P{i}")).await;
        login(&stores, &mut shard, id, "s").await;
        shard.player_mut(id).unwrap().character.currency = 7;
        ids.push(id);
    }
    // The store stops answering and flushes fill the queue.
    proxy.set_mode(ProxyMode::Stall);
    for _ in 0..4 {
        shard.save_all(SaveReason::Flush);
    }
    let dropped_before = shard.saver().stats().dropped_row;
    for id in &ids {
        shard.logout(*id).unwrap();
    }
    assert!(shard.deferred_final_count() >= 1, "the queue had no room");
    assert_eq!(
        shard.saver().stats().dropped_row,
        dropped_before,
        "no final is dropped for a full queue"
    );
    proxy.set_mode(ProxyMode::Pass);
    for _ in 0..500 {
        shard.tick();
        if shard.deferred_final_count() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(shard.deferred_final_count(), 0);
    let report = shard.shutdown(Duration::from_secs(10)).await;
    assert_eq!(report.saver, shardkeep::drain::BarrierOutcome::Drained);
    for id in ids {
        let row = stores.characters.load(id).await.unwrap().unwrap();
        assert_eq!(row.state["currency"], 7, "the logout delta is durable");
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn shutdown_waits_for_room_for_every_final(pool: PgPool) {
    let redis = TestRedis::new().await;
    let stores = Stores::new(&pool, redis.backend());
    let mut config = ShardConfig::new("shard-a", "zone-0");
    config.saver = SaverConfig {
        queue_depth: 1,
        max_batch: 1,
        ..SaverConfig::default()
    };
    let mut shard = boot_with(stores.shard_stores(), &stores, config, &[0], 1);
    let mut ids = Vec::new();
    // More players than slices fit in the one-entry queue at once.
    for i in 0..(shardkeep_reference::shard::SHUTDOWN_FINAL_SLICE + 10) {
        let id = stores.new_character(&format!("P{i}")).await;
        login(&stores, &mut shard, id, "s").await;
        shard.player_mut(id).unwrap().character.currency = 3;
        ids.push(id);
    }
    shard.save_all(SaveReason::Flush);
    let report = shard.shutdown(Duration::from_secs(20)).await;
    assert_eq!(report.saver, shardkeep::drain::BarrierOutcome::Drained);
    let left: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM characters WHERE (state->>'currency')::bigint IS DISTINCT FROM 3",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(left, 0, "every final landed");
    assert_eq!(
        ids.len(),
        shardkeep_reference::shard::SHUTDOWN_FINAL_SLICE + 10
    );
}
