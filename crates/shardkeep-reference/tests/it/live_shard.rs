//! The reference shard on the live-copy runtime (`LiveShard`): players log in, pick items up
//! from each other (the runtime commits the transfer), walk into another shard's zone by
//! handoff, survive a crash through their checkpoint, and a zombie copy is evicted with what it
//! held and put down. On Postgres with Redis and on the embedded file.

use std::time::Duration;

use shardkeep::Services;
use shardkeep::live::{FinalSave, SessionStart};
use shardkeep_reference::live_shard::{ActionError, Gone, Pickup, Walk};
use shardkeep_reference::shard::ZoneDirectory;
use sqlx::PgPool;
use uuid::Uuid;

use super::live_support::{boot, gem, holds, new_character, row_items, tick_until};
use super::support::on_both_drivers;

async fn plays_through_the_runtime(services: Services, driver: &str) {
    let directory = ZoneDirectory::new();
    let mut a = boot(&services, "shard-a", &[0], &directory);
    let mut b = boot(&services, "shard-b", &[1], &directory);
    let (ana, bo, cy) = (
        new_character(&services, "Ana").await,
        new_character(&services, "Bo").await,
        new_character(&services, "Cy").await,
    );
    for id in [ana, bo, cy] {
        let entered = a.login(id, SessionStart::default()).await.unwrap();
        assert_eq!(
            (entered.zone.as_str(), entered.room.as_str()),
            ("zone-0", "r0")
        );
    }
    // Ana is rewarded a gem and drops it; Bo picks it up: a transfer the runtime commits.
    let first = Uuid::now_v7();
    a.grant(ana, gem(first)).unwrap();
    a.drop_item(ana, first).unwrap();
    assert_eq!(
        a.get_item(bo, first).unwrap(),
        Pickup::Transferring,
        "{driver}"
    );
    assert!(
        matches!(a.get_item(bo, first), Err(ActionError::NoSuchItem(_))),
        "{driver}: held by neither side meanwhile"
    );
    tick_until(&mut a, "the transfer", |a| holds(a, bo, first)).await;
    assert!(!holds(&a, ana, first), "{driver}");
    assert!(
        row_items(&services, bo).await.contains(&first),
        "{driver}: Bo's row holds it"
    );
    assert!(
        !row_items(&services, ana).await.contains(&first),
        "{driver}: Ana's does not"
    );
    // Her own drop, picked up by the same copy: a plain move.
    let second = Uuid::now_v7();
    a.grant(ana, gem(second)).unwrap();
    a.drop_item(ana, second).unwrap();
    assert_eq!(a.get_item(ana, second).unwrap(), Pickup::Moved, "{driver}");
    assert!(holds(&a, ana, second), "{driver}");
    // Bo walks east into zone-1, which shard-b hosts: handed off with the gem.
    let Walk::Leaving(departure) = a.walk(bo, "east").unwrap() else {
        panic!("{driver}: zone-1 is shard-b's");
    };
    assert_eq!(departure.target_shard, "shard-b");
    assert_eq!(a.location(bo), None, "{driver}: off shard-a's map");
    let ticket = departure.ticket().await.unwrap();
    let arrived = b
        .arrive(&ticket.token, SessionStart::default())
        .await
        .unwrap();
    assert_eq!(
        (arrived.zone.as_str(), arrived.room.as_str()),
        ("zone-1", "r0")
    );
    assert!(holds(&b, bo, first), "{driver}: the gem travelled");
    let mut out = b.logout(bo).unwrap();
    tick_until(&mut b, "Bo's final save", |_| out.outcome().is_some()).await;
    assert!(
        matches!(out.outcome(), Some(FinalSave::Saved { .. })),
        "{driver}"
    );
    let row = services.characters.load(bo).await.unwrap().unwrap();
    assert_eq!(row.zone_ref.as_deref(), Some("zone-1"), "{driver}");
    assert!(row_items(&services, bo).await.contains(&first), "{driver}");

    // Ana puts her gem into the chest in r2; Cy takes it out: a transfer again.
    for who in [ana, cy] {
        for _ in 0..2 {
            assert!(matches!(a.walk(who, "north").unwrap(), Walk::Moved { .. }));
        }
    }
    let chest = a
        .floors()
        .flat_map(|(_, floor)| floor.iter())
        .find(|f| f.room == "r2" && f.item.proto.container)
        .and_then(|f| f.item.id)
        .expect("the zone's reset put a chest in r2");
    a.put_item(ana, second, chest).unwrap();
    assert_eq!(
        a.get_from_container(cy, chest, second).unwrap(),
        Pickup::Transferring,
        "{driver}"
    );
    tick_until(&mut a, "the transfer out of the chest", |a| {
        holds(a, cy, second)
    })
    .await;
    assert!(row_items(&services, cy).await.contains(&second), "{driver}");
    assert_eq!(a.transfer_counts(), (2, 0), "{driver}");
    // Cy goes down into the crypt (an instance) and logs out there: saved at its entrance.
    assert!(matches!(a.walk(cy, "north").unwrap(), Walk::Moved { .. }));
    let Walk::Moved { zone, .. } = a.walk(cy, "down").unwrap() else {
        panic!("{driver}: the crypt is down from r3");
    };
    assert_eq!(zone, "crypt-0");
    let mut out = a.logout(cy).unwrap();
    tick_until(&mut a, "Cy's final save", |_| out.outcome().is_some()).await;
    let row = services.characters.load(cy).await.unwrap().unwrap();
    assert_eq!(
        (row.zone_ref.as_deref(), row.room_ref.as_deref()),
        (Some("zone-0"), Some("r3")),
        "{driver}: an instance is saved at its entrance"
    );

    // A crash: Ana's reward reached her checkpoint, not her row; the next shard loads it once.
    let third = Uuid::now_v7();
    a.grant(ana, gem(third)).unwrap();
    let checkpoints = a.runtime().saver().stats().checkpoint_landed;
    tick_until(&mut a, "a checkpoint", |a| {
        a.runtime().saver().stats().checkpoint_landed > checkpoints + 1
    })
    .await;
    a.kill();
    let mut a = boot(&services, "shard-a2", &[0], &directory);
    a.login(ana, SessionStart::default()).await.unwrap();
    let (gems, coins) = a
        .read(ana, |c| {
            let gems = c.items().iter().filter(|i| i.id == Some(third)).count();
            (gems, c.currency)
        })
        .unwrap();
    assert_eq!(gems, 1, "{driver}: the checkpointed reward, once");
    assert_eq!(coins, 15, "{driver}: three rewards of 5, each once");

    // A zombie: Ana drops a gem here, then logs in on shard-b. Cy's pickup of it meets the
    // newer claim (its releaser was superseded): voided, as an unsaved drop may be a phantom.
    // The zombie's next write meets the claim too: it is evicted with what it held.
    let fourth = Uuid::now_v7();
    a.grant(ana, gem(fourth)).unwrap();
    a.drop_item(ana, fourth).unwrap();
    let entered = a.login(cy, SessionStart::default()).await.unwrap();
    assert_eq!(entered.room, "r3", "{driver}");
    assert!(matches!(a.walk(cy, "south").unwrap(), Walk::Moved { .. }));
    b.login(ana, SessionStart::default()).await.unwrap();
    assert_eq!(
        a.get_item(cy, fourth).unwrap(),
        Pickup::Transferring,
        "{driver}"
    );
    // The eviction may come before or after the pickup's answer.
    let (mut voided, mut gone) = (Vec::new(), Vec::new());
    tick_until(&mut a, "the pickup's answer and the eviction", |a| {
        voided.extend(a.take_voided_items());
        gone.extend(a.take_gone());
        a.transfer_counts() == (0, 1) && gone.iter().any(|(copy, _)| copy.character_id == ana)
    })
    .await;
    assert!(!holds(&a, cy, fourth), "{driver}");
    assert!(
        voided.contains(&fourth),
        "{driver}: the pickup voided: {voided:?}"
    );
    assert!(
        gone.iter()
            .any(|(copy, why)| copy.character_id == ana && *why == Gone::Evicted),
        "{driver}: {gone:?}"
    );
    assert_eq!(a.location(ana), None, "{driver}");
    assert!(
        voided.contains(&third),
        "{driver}: what it held is voided: {voided:?}"
    );
    assert!(
        holds(&b, ana, third),
        "{driver}: the live copy keeps its own"
    );
    assert!(
        !row_items(&services, cy).await.contains(&fourth),
        "{driver}"
    );
    let report = b.shutdown(Duration::from_secs(10)).await;
    assert_eq!(report.unsaved_finals.total(), 0, "{driver}: {report:?}");
    a.kill();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn the_reference_shard_plays_through_the_runtime(pool: PgPool) {
    on_both_drivers(&pool, "it-live-shard", plays_through_the_runtime).await;
}

/// Between the runtime evicting a copy and the shard's next tick the player still stands on
/// the map: a pickup then is refused and the item stays where it lay. A walk into another
/// shard's zone waits for the player's pickup in flight.
async fn a_stale_or_busy_player_moves_nothing(services: Services, driver: &str) {
    let directory = ZoneDirectory::new();
    let mut a = boot(&services, "shard-a", &[0], &directory);
    let mut b = boot(&services, "shard-b", &[1], &directory);
    let (ana, bo) = (
        new_character(&services, "Ana").await,
        new_character(&services, "Bo").await,
    );
    for id in [ana, bo] {
        a.login(id, SessionStart::default()).await.unwrap();
    }
    let gem_id = Uuid::now_v7();
    a.grant(ana, gem(gem_id)).unwrap();
    a.drop_item(ana, gem_id).unwrap();
    assert_eq!(a.get_item(bo, gem_id).unwrap(), Pickup::Transferring);
    assert!(
        matches!(a.walk(bo, "east"), Err(ActionError::TransferPending(_))),
        "{driver}: the handoff waits for the pickup"
    );
    tick_until(&mut a, "the transfer", |a| holds(a, bo, gem_id)).await;
    // Ana walks to r3, where the zone's reset put ore, and logs in on shard-b: shard-a's flush
    // meets the claim and the runtime evicts its copy, which still stands in r3 until shard-a
    // ticks.
    for _ in 0..3 {
        assert!(matches!(a.walk(ana, "north").unwrap(), Walk::Moved { .. }));
    }
    let ore = a
        .floors()
        .flat_map(|(_, floor)| floor.iter())
        .find(|f| f.room == "r3" && f.item.released.is_none())
        .and_then(|f| f.item.id)
        .expect("the zone's reset put ore in r3");
    b.login(ana, SessionStart::default()).await.unwrap();
    let copy = a.copy_of(ana).unwrap();
    a.runtime().flush_all();
    for _ in 0..500 {
        if a.runtime().copy_of(ana) != Some(copy) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_ne!(a.runtime().copy_of(ana), Some(copy), "{driver}: evicted");
    assert_eq!(a.copy_of(ana), Some(copy), "{driver}: still on the map");
    // A spawned item is a plain move: the path that gave the item to a copy that was gone.
    assert!(a.get_item(ana, ore).is_err(), "{driver}");
    assert!(
        a.floors()
            .flat_map(|(_, floor)| floor.iter())
            .any(|f| f.item.id == Some(ore) && f.room == "r3"),
        "{driver}: the ore lies where it was"
    );
    a.kill();
    b.kill();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_stale_or_busy_player_moves_nothing_on_either_driver(pool: PgPool) {
    on_both_drivers(&pool, "it-live-shard", a_stale_or_busy_player_moves_nothing).await;
}
