//! Measures the CPU cost of one pulse of the reference shard on the live-copy runtime with many
//! online characters, its parts apart: the shard's own tick (the players whose affect or
//! cooldown runs out on it brought up to date, zone resets) with the runtime not pulsed, then
//! the runtime's pulse alone (the cadences' dumps handed to the saver), then one dump of
//! everyone. The characters live in a
//! scratch embedded file and log in through the runtime.
//! `cargo run --release --example tick_cost 100000`; set NO_TIMED=1 to drop the template's
//! affects and cooldowns.
#![allow(missing_docs, clippy::unwrap_used)]
use std::sync::Arc;
use std::time::Instant;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use shardkeep::{Keyspace, Services, ServicesConfig};
use shardkeep_reference::game::{Catalog, ReferenceModel, reference_world};
use shardkeep_reference::live_shard::{LiveShard, LiveShardConfig};
use shardkeep_reference::shard::ZoneDirectory;
use shardkeep_sim::bench::Progress;
use shardkeep_sim::bench::capacity::{embedded_population, log_everyone_in};
use shardkeep_sim::bench::documents::{template_state, with_timers_shifted};

/// Times `runs` calls of `step`, yielding between them; prints mean, p99 and worst.
async fn timed(what: &str, runs: usize, mut step: impl FnMut()) {
    let mut took = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        step();
        took.push(t.elapsed().as_secs_f64() * 1000.0);
        tokio::task::yield_now().await;
    }
    let mean = took.iter().sum::<f64>() / took.len() as f64;
    let p99 = shardkeep_sim::bench::percentile(&took, 0.99);
    let worst = took.iter().copied().fold(0.0, f64::max);
    println!("{what}: mean {mean:.1} ms, p99 {p99:.1} ms, worst {worst:.1} ms");
}

#[tokio::main]
async fn main() {
    let online: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let mut template = template_state();
    if std::env::var("NO_TIMED").is_ok() {
        template["affects"] = serde_json::json!([]);
        template["cooldowns"] = serde_json::json!({});
    }
    // Timers started at different moments, as in the capacity benchmark.
    let variants: Vec<serde_json::Value> =
        (0..97).map(|k| with_timers_shifted(&template, k)).collect();
    let (scratch, ids) = embedded_population(online, "p", &variants).await.unwrap();
    let keys = Keyspace::new(&format!("tick-{}", uuid::Uuid::now_v7().simple())).unwrap();
    let services = Services::embedded(
        scratch.db.clone(),
        &keys,
        ReferenceModel::handle(),
        ServicesConfig::new("tick-cost", "game_server"),
        Arc::new(shardkeep::clock::SystemClock),
    )
    .unwrap();
    let mut config = LiveShardConfig::new("probe", "zone-0");
    // The shard's tick never pulses the runtime here: the two are timed apart below.
    config.quiet_pulses = u64::MAX;
    let mut shard = LiveShard::boot(
        &services,
        config,
        reference_world(1),
        Arc::new(Catalog::reference()),
        ZoneDirectory::new(),
    )
    .unwrap();
    let t = Instant::now();
    let pulse = shardkeep::live::Cadence::default().pulse();
    log_everyone_in(&mut shard, &ids, pulse, &Progress::quiet())
        .await
        .unwrap();
    println!(
        "log {online} in through the runtime: {:?} ({:.0}/s)",
        t.elapsed(),
        online as f64 / t.elapsed().as_secs_f64()
    );
    timed(
        "shard tick without the runtime (timers, resets)",
        160,
        || shard.tick(),
    )
    .await;
    let runtime = shard.runtime().clone();
    timed("runtime pulse alone (cadence dumps)", 160, || {
        runtime.pulse()
    })
    .await;
    let t = Instant::now();
    let queued = runtime.flush_all();
    println!(
        "dump every character once: {:.2} µs each ({queued} queued)",
        t.elapsed().as_secs_f64() * 1e6 / online as f64
    );
    shard.kill();
}
