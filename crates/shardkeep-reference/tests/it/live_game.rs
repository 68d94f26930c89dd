//! The reference game played through the live-copy runtime: landed by its landing table, its
//! creation kit taken once, its effects applied live exactly as the model applies them to the
//! stored document. On Postgres with Redis and on the embedded file.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use shardkeep::Services;
use shardkeep::character::NewCharacter;
use shardkeep::live::{FinalSave, Granted, LiveConfig, Runtime, SessionStart};
use shardkeep::model::{Anchor, GameModel};
use shardkeep_reference::game::{
    Catalog, ItemJson, ReferenceEffect, ReferenceModel, StateDocument,
};
use shardkeep_reference::shard::ReferenceGame;
use sqlx::PgPool;
use uuid::Uuid;

use super::live_support::create;
use super::support::{on_both_drivers, zones};

fn game() -> ReferenceGame {
    ReferenceGame::new(Arc::new(Catalog::reference()), zones(&[0, 1], 4), "zone-0").unwrap()
}

/// A character in `zone` (room r9), or never placed (`None`) with a starting kit (a bag) in
/// its creation input: a starting kit is for a first spawn, so only such a character has one.
async fn new_character(services: &Services, name: &str, zone: Option<&str>) -> Uuid {
    let kit = zone.is_none().then(|| json!({ "items": ["bag"] }));
    create(services, name, zone.map(|z| (z, "r9")), json!({}), kit).await
}

async fn plays_through_the_runtime(services: Services, driver: &str) {
    let runtime = Runtime::start(&services, game(), LiveConfig::new("shard-a")).unwrap();
    // A first spawn lands at home and takes its kit; the next login does not take it again.
    let id = new_character(&services, "Mira", None).await;
    for login in 0..2 {
        let copy = runtime
            .login(id, SessionStart::default())
            .await
            .unwrap()
            .copy;
        let bags = runtime
            .read(copy, |c| {
                c.inventory
                    .iter()
                    .filter(|i| i.proto.proto_ref == "bag")
                    .count()
            })
            .unwrap();
        assert_eq!(bags, 1, "{driver}: login {login}: one bag");
        let saved = runtime.logout(copy).await.unwrap();
        assert!(
            matches!(saved, FinalSave::Saved { .. }),
            "{driver}: {saved:?}"
        );
        let row = services.characters.load(id).await.unwrap().unwrap();
        assert_eq!(row.chargen, None, "{driver}: the kit is spent");
        assert_eq!(row.zone_ref.as_deref(), Some("zone-0"), "{driver}");
        assert_eq!(
            row.room_ref.as_deref(),
            Some("r0"),
            "{driver}: the start room"
        );
    }
    // A live grant and the model's job of the same effect reach the same document.
    let copy = runtime
        .login(id, SessionStart::default())
        .await
        .unwrap()
        .copy;
    let before = services.characters.load(id).await.unwrap().unwrap();
    let gem: ItemJson = serde_json::from_value(json!({ "proto": "gem" })).unwrap();
    let reward = ReferenceEffect::CombatRewards {
        experience: 10,
        currency: 5,
        items: vec![gem],
    };
    let granted = runtime.grant(copy, reward.clone()).await.unwrap();
    assert!(
        matches!(granted, Granted::Saved { .. }),
        "{driver}: {granted:?}"
    );
    let (xp, coins) = runtime.read(copy, |c| (c.experience, c.currency)).unwrap();
    assert_eq!((xp, coins), (10, 5), "{driver}");
    let after = services.characters.load(id).await.unwrap().unwrap();
    let mut by_job: StateDocument = before.state.decode().unwrap();
    let mut anchor = Anchor {
        zone_ref: before.zone_ref.clone(),
        room_ref: before.room_ref.clone(),
    };
    assert!(
        ReferenceModel
            .apply_effect(&mut by_job, &mut anchor, &reward)
            .unwrap()
    );
    let live: StateDocument = after.state.decode().unwrap();
    assert_eq!(live.experience, by_job.experience, "{driver}");
    assert_eq!(live.currency, by_job.currency, "{driver}");
    let protos = |doc: &StateDocument| {
        let mut protos: Vec<String> = doc.inventory.iter().map(|i| i.proto.clone()).collect();
        protos.sort();
        protos
    };
    assert_eq!(protos(&live), protos(&by_job), "{driver}");
    runtime.logout(copy).await.unwrap();
    // Saved in a zone this shard does not host: landed at home.
    let far = new_character(&services, "Nils", Some("zone-3")).await;
    let copy = runtime
        .login(far, SessionStart::default())
        .await
        .unwrap()
        .copy;
    runtime.logout(copy).await.unwrap();
    let row = services.characters.load(far).await.unwrap().unwrap();
    assert_eq!(row.zone_ref.as_deref(), Some("zone-0"), "{driver}");
    assert_eq!(
        row.room_ref.as_deref(),
        Some("r0"),
        "{driver}: the home zone's start room"
    );
    // A placed character whose row still holds creation input (a first spawn's logout save
    // that went down as a retry job leaves it) is not given the kit again.
    let placed = Uuid::now_v7();
    services
        .characters
        .create(&NewCharacter {
            character_id: placed,
            account_id: Uuid::now_v7(),
            name: "Orla".into(),
            zone_ref: Some("zone-1".into()),
            room_ref: Some("r1".into()),
            state: json!({}).into(),
            chargen: Some(json!({ "items": ["bag"] })),
            schema_version: 1,
        })
        .await
        .unwrap();
    let copy = runtime
        .login(placed, SessionStart::default())
        .await
        .unwrap()
        .copy;
    let bags = runtime
        .read(copy, |c| {
            c.inventory
                .iter()
                .filter(|i| i.proto.proto_ref == "bag")
                .count()
        })
        .unwrap();
    assert_eq!(bags, 0, "{driver}: no kit past a first spawn");
    runtime.logout(copy).await.unwrap();
    let row = services.characters.load(placed).await.unwrap().unwrap();
    assert_eq!(
        (row.zone_ref.as_deref(), row.room_ref.as_deref()),
        (Some("zone-1"), Some("r1")),
        "{driver}: landed where it was saved"
    );
    let report = runtime.shutdown(Duration::from_secs(10)).await;
    assert_eq!(report.unsaved_finals.total(), 0, "{driver}: {report:?}");
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn the_reference_game_plays_through_the_runtime(pool: PgPool) {
    on_both_drivers(&pool, "it-live-game", plays_through_the_runtime).await;
}
