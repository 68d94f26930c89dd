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
    for i in 0..online {
        let id = uuid::Uuid::new_v4();
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
                v.into()
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
    let mut worst = 0f64;
    let mut total = 0f64;
    for _ in 0..80 {
        let t = Instant::now();
        shard.tick();
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        worst = worst.max(ms);
        if ms > 120.0 {
            println!("slow tick {} {:.1} ms", shard.pulse_count(), ms);
        }
        total += ms;
        tokio::task::yield_now().await;
    }
    println!("tick: mean {:.1} ms, worst {:.1} ms", total / 80.0, worst);
}
