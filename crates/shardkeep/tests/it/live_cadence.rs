//! The save cadences keep their wall-clock periods when the pulse runs late (up to four pulses
//! late): a checkpoint period is a crash window the runtime promises in time, not in pulses.

use std::time::Duration;

use shardkeep::live::LiveConfig;
use shardkeep_testkit::{JobDrivers, TestRedis};
use sqlx::PgPool;

use super::live_runtime::Live;

/// A game whose tick runs four times slower than the pulse it configured (a shard overloaded,
/// or a tick that waits on something): each late pulse stands for the pulses it missed, so
/// every copy is still checkpointed once per checkpoint period of wall time instead of once
/// per four of them.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_late_pulse_keeps_the_checkpoint_period_in_wall_time(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let mut config = LiveConfig::new("shard-a");
        config.own_pulse = false;
        // Pulses of 20 ms, a checkpoint every 100 ms (five pulses).
        let live = Live::with(&d, &redis, config).await;
        let (_, copy) = live.player("Tamsin").await;
        let saver = live.runtime.saver().clone();
        let before = saver.stats().checkpoint_attempted;
        let ticks: i64 = 15;
        for step in 0..ticks {
            // Each tick comes four pulses' time after the last: 15 ticks span 12 periods.
            tokio::time::sleep(Duration::from_millis(80)).await;
            super::live_runtime::set(copy, &live.runtime, "experience", step);
            live.runtime.pulse();
        }
        let periods = 12;
        let checkpoints = saver.stats().checkpoint_attempted - before;
        assert!(
            checkpoints + 2 >= periods,
            "{}: {checkpoints} checkpoints in {periods} checkpoint periods",
            d.name()
        );
        live.stop().await;
    }
}
