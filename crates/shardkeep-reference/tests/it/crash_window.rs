//! The crash window a shard exports: how old the newest durable copy of its residents is, per
//! tier. A Postgres outage grows the row age while checkpoints keep the Redis age small; an
//! outage of the embedded file grows both, since both tiers are in it.

use std::time::{Duration, Instant};

use shardkeep_reference::shard::ShardConfig;
use sqlx::PgPool;

use crate::faultable::{Driver, Faultable};
use crate::support::{boot_with, login, pump_until};

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_store_outage_shows_as_a_growing_age_of_each_tier_it_takes(pool: PgPool) {
    for driver in Driver::ALL {
        let stores = Faultable::new(&pool, driver).await;
        let name = stores.stores.driver();
        let mut config = ShardConfig::new("shard-w", "zone-0");
        config.checkpoint_pulses = 2;
        config.flush_pulses = 4;
        let mut shard = boot_with(stores.shard_stores.clone(), &stores.stores, config, &[0], 1);
        let id = stores.stores.new_character("Windowed").await;
        login(&stores.stores, &mut shard, id, "s-w").await;
        // Both tiers land.
        pump_until(&mut shard, Duration::from_secs(5), |s| {
            s.saver().stats().row_landed >= 1 && s.saver().stats().checkpoint_landed >= 1
        })
        .await;
        let fresh = shard.saver().landed().measure(Instant::now(), &[id]);
        assert!(
            fresh.row_worst < Duration::from_secs(2),
            "{name}: {fresh:?}"
        );
        stores.outage.cut();
        let cut_at = Instant::now();
        pump_until(&mut shard, Duration::from_secs(10), |_| {
            cut_at.elapsed() > Duration::from_millis(1_500)
        })
        .await;
        let during = shard.saver().landed().measure(Instant::now(), &[id]);
        assert!(
            during.row_worst >= Duration::from_millis(1_500),
            "{name}: the row age grows through the outage: {during:?}"
        );
        if stores.checkpoints_share_the_outage() {
            assert!(
                during.checkpoint_worst >= Duration::from_millis(1_500),
                "{name}: the checkpoints are in the file too: {during:?}"
            );
        } else {
            assert!(
                during.checkpoint_worst < Duration::from_secs(1),
                "{name}: checkpoints still land: {during:?}"
            );
        }
        stores.outage.heal();
        // Healed, both tiers catch up.
        pump_until(&mut shard, Duration::from_secs(10), |s| {
            let now = s.saver().landed().measure(Instant::now(), &[id]);
            now.row_worst < Duration::from_secs(2) && now.checkpoint_worst < Duration::from_secs(1)
        })
        .await;
    }
}
