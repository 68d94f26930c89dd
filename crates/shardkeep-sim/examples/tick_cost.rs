//! Measures one shard pulse with many online characters and no stores: the pure CPU cost of a
//! pulse (timed effects, the save wheel, dumps). `cargo run --release --example tick_cost 250000`;
//! set NO_TIMED=1 to drop the template's affects and cooldowns.
#![allow(missing_docs, clippy::unwrap_used)]
use std::sync::Arc;
use std::time::Instant;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use shardkeep::character::{CharacterSnapshot, LoadSource, LoadedCharacter};
use shardkeep_reference::game::{Catalog, reference_world};
use shardkeep_reference::shard::{Arrival, Shard, ShardConfig, ShardStores, ZoneDirectory};

#[tokio::main]
async fn main() {
    let online: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(250_000);
    let mut shard = Shard::boot(
        ShardConfig::new("probe", "zone-0"),
        reference_world(1),
        Arc::new(Catalog::reference()),
        ShardStores::default(),
        ZoneDirectory::new(),
    );
    let t = Instant::now();
    let mut first = None;
    for i in 0..online {
        let id = uuid::Uuid::new_v4();
        first.get_or_insert(id);
        let snapshot = CharacterSnapshot {
            character_id: id,
            account_id: uuid::Uuid::nil(),
            name: format!("p{i}"),
            zone_ref: Some("zone-0".into()),
            room_ref: Some("r0".into()),
            state: {
                let mut v = shardkeep_sim::bench::documents::template_state();
                if std::env::var("NO_TIMED").is_ok() {
                    v["affects"] = serde_json::json!([]);
                    v["cooldowns"] = serde_json::json!({});
                }
                // Timers started at different moments, as in the capacity benchmark.
                shardkeep_sim::bench::documents::with_timers_shifted(&v, (i % 97) as u32).into()
            },
            chargen: None,
            state_version: 0,
            owner_epoch: 1,
            issue_mark: 0,
            schema_version: 1,
        };
        let loaded = LoadedCharacter {
            snapshot,
            source: LoadSource::Row,
            brand_new: false,
            origin: Default::default(),
        };
        shard
            .admit(
                loaded,
                Arrival::Login {
                    session_token: id.to_string(),
                },
            )
            .unwrap();
    }
    println!("admit {online}: {:?}", t.elapsed());
    if let Some(id) = first {
        let character = &shard.player(id).unwrap().character;
        let t = Instant::now();
        for _ in 0..100_000 {
            std::hint::black_box(
                shardkeep_reference::game::dump_character(
                    character,
                    Some("zone-0"),
                    Some("r0"),
                    Default::default(),
                )
                .unwrap(),
            );
        }
        println!(
            "dump one character: {:.2} µs",
            t.elapsed().as_secs_f64() * 1e6 / 100_000.0
        );
        let t = Instant::now();
        for _ in 0..100_000 {
            std::hint::black_box(
                shardkeep::character::StateJson::encode(&std::hint::black_box(1u8)).unwrap(),
            );
        }
        println!(
            "encode a byte: {:.3} µs",
            t.elapsed().as_secs_f64() * 1e6 / 100_000.0
        );
    }
    let t = Instant::now();
    shard.save_all(shardkeep::saver::SaveReason::Checkpoint);
    println!(
        "dump every character once: {:.2} µs each",
        t.elapsed().as_secs_f64() * 1e6 / online as f64
    );
    let mut pulses = Vec::new();
    for _ in 0..160 {
        let t = Instant::now();
        shard.tick();
        pulses.push(t.elapsed().as_secs_f64() * 1000.0);
        let _ = shard.take_saver_events();
        tokio::task::yield_now().await;
    }
    let mean = pulses.iter().sum::<f64>() / pulses.len() as f64;
    let p99 = shardkeep_sim::bench::percentile(&pulses, 0.99);
    let worst = pulses.iter().copied().fold(0.0, f64::max);
    println!("tick: mean {mean:.1} ms, p99 {p99:.1} ms, worst {worst:.1} ms");
}
