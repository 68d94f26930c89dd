//! A saver whose queue is full: logouts keep their final saves until there is room, on each
//! driver.

use std::time::Duration;

use shardkeep::saver::{SaveReason, SaverConfig};
use shardkeep_reference::shard::{ShardConfig, ShardStores};
use sqlx::PgPool;

use crate::faultable::{Driver, Faultable};
use crate::support::{boot_with, login};

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_logout_during_a_saver_backlog_keeps_its_final_until_there_is_room(pool: PgPool) {
    for driver in Driver::ALL {
        let faultable = Faultable::new(&pool, driver).await;
        let (stores, name) = (&faultable.stores, faultable.stores.driver());
        let mut config = ShardConfig::new("shard-a", "zone-0");
        config.saver = SaverConfig {
            queue_depth: 2,
            max_batch: 1,
            io_timeout: Duration::from_secs(1),
            ..SaverConfig::default()
        };
        config.flush_pulses = 1_000;
        config.checkpoint_pulses = 1_000;
        // Rows only, over the path the test stalls.
        let shard_stores = ShardStores {
            characters: faultable.shard_stores.characters.clone(),
            ..ShardStores::default()
        };
        let mut shard = boot_with(shard_stores, stores, config, &[0], 1);
        let mut ids = Vec::new();
        for i in 0..3 {
            let id = stores.new_character(&format!("P{i}")).await;
            login(stores, &mut shard, id, "s").await;
            shard.player_mut(id).unwrap().character.currency = 7;
            ids.push(id);
        }
        // The store stops answering and flushes fill the queue.
        faultable.outage.stall();
        for _ in 0..4 {
            shard.save_all(SaveReason::Flush);
        }
        let dropped_before = shard.saver().stats().dropped_row;
        for id in &ids {
            shard.logout(*id).unwrap();
        }
        assert!(
            shard.deferred_final_count() >= 1,
            "{name}: the queue had no room"
        );
        assert_eq!(
            shard.saver().stats().dropped_row,
            dropped_before,
            "{name}: no final is dropped for a full queue"
        );
        faultable.outage.heal();
        for _ in 0..500 {
            shard.tick();
            if shard.deferred_final_count() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(shard.deferred_final_count(), 0, "{name}");
        let report = shard.shutdown(Duration::from_secs(10)).await;
        assert_eq!(
            report.saver,
            shardkeep::drain::BarrierOutcome::Drained,
            "{name}"
        );
        for id in ids {
            let row = stores.characters.load(id).await.unwrap().unwrap();
            assert_eq!(
                row.state["currency"], 7,
                "{name}: the logout delta is durable"
            );
        }
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn shutdown_waits_for_room_for_every_final(pool: PgPool) {
    for driver in Driver::ALL {
        let faultable = Faultable::new(&pool, driver).await;
        let (stores, name) = (&faultable.stores, faultable.stores.driver());
        let mut config = ShardConfig::new("shard-a", "zone-0");
        config.saver = SaverConfig {
            queue_depth: 1,
            max_batch: 1,
            ..SaverConfig::default()
        };
        let mut shard = boot_with(stores.shard_stores(), stores, config, &[0], 1);
        let mut ids = Vec::new();
        // More players than slices fit in the one-entry queue at once.
        for i in 0..(shardkeep_reference::shard::SHUTDOWN_FINAL_SLICE + 10) {
            let id = stores.new_character(&format!("P{i}")).await;
            login(stores, &mut shard, id, "s").await;
            shard.player_mut(id).unwrap().character.currency = 3;
            ids.push(id);
        }
        shard.save_all(SaveReason::Flush);
        let report = shard.shutdown(Duration::from_secs(20)).await;
        assert_eq!(
            report.saver,
            shardkeep::drain::BarrierOutcome::Drained,
            "{name}"
        );
        for id in &ids {
            let row = stores.characters.load(*id).await.unwrap().unwrap();
            assert_eq!(row.state["currency"], 3, "{name}: every final landed");
        }
        assert_eq!(
            ids.len(),
            shardkeep_reference::shard::SHUTDOWN_FINAL_SLICE + 10
        );
    }
}
