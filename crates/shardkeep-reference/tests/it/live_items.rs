//! Items of the reference shard on the runtime: who a transfer names on the audit trail, what
//! is a plain move (a copy's own drop, what the zone spawned, what the engine moved), the
//! release mark naming the latest holder, bound items, and floors that decay. On Postgres with
//! Redis and on the embedded file.

use serde_json::json;
use shardkeep::Services;
use shardkeep::live::SessionStart;
use shardkeep_reference::live_shard::{ActionError, LiveShard, Pickup};
use shardkeep_reference::shard::ZoneDirectory;
use sqlx::PgPool;
use uuid::Uuid;

use super::live_support::{
    boot, boot_in, config, floor_ids, give_gem, holds, lying, new_character, reward_of, tick_until,
    transfers_to,
};
use super::support::on_both_drivers;

/// A shard hosting zone-0 with Aria, Bran and Cade logged in, in r0.
async fn three_players(services: &Services) -> (LiveShard, [Uuid; 3]) {
    let mut shard = boot(services, "shard-a", &[0], &ZoneDirectory::new());
    let mut ids = [Uuid::nil(); 3];
    for (slot, name) in ids.iter_mut().zip(["Aria", "Bran", "Cade"]) {
        *slot = new_character(services, name).await;
        shard.login(*slot, SessionStart::default()).await.unwrap();
    }
    (shard, ids)
}

async fn names_both_sides(services: Services, driver: &str) {
    let (mut shard, [a, b, c]) = three_players(&services).await;
    let item = give_gem(&mut shard, a);
    shard.drop_item(a, item).unwrap();
    assert_eq!(shard.get_item(b, item).unwrap(), Pickup::Transferring);
    tick_until(&mut shard, "the first transfer", |s| holds(s, b, item)).await;
    let first = transfers_to(&services, b).await;
    assert_eq!(first.len(), 1, "{driver}: {first:?}");
    let (actor, payload) = &first[0];
    assert_eq!(*actor, Some(a), "{driver}");
    assert_eq!(payload["item_ref"], "gem", "{driver}");
    assert_eq!(payload["item_id"], json!(item), "{driver}");
    assert_eq!(payload["stack"], 1, "{driver}");
    assert_eq!(
        (
            payload["acquirer_name"].clone(),
            payload["releaser_name"].clone()
        ),
        (json!("Bran"), json!("Aria")),
        "{driver}"
    );
    assert_eq!(payload["room"], "r0", "{driver}");
    // Bran drops it in turn: the mark names him now, not Aria.
    shard.drop_item(b, item).unwrap();
    assert_eq!(shard.get_item(c, item).unwrap(), Pickup::Transferring);
    tick_until(&mut shard, "the second transfer", |s| holds(s, c, item)).await;
    let second = transfers_to(&services, c).await;
    assert_eq!(second.len(), 1, "{driver}: {second:?}");
    assert_eq!(
        second[0].0,
        Some(b),
        "{driver}: the latest release is named"
    );
    assert_eq!(shard.transfer_counts(), (2, 0), "{driver}");
    assert!(
        !holds(&shard, a, item) && !holds(&shard, b, item),
        "{driver}"
    );
    shard.kill();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_transfer_names_both_sides_and_the_mark_names_the_latest_release(pool: PgPool) {
    on_both_drivers(&pool, "it-live-items", names_both_sides).await;
}

async fn plain_moves(services: Services, driver: &str) {
    let (mut shard, [a, b, c]) = three_players(&services).await;
    // A copy's own drop.
    let own = give_gem(&mut shard, a);
    shard.drop_item(a, own).unwrap();
    assert_eq!(shard.get_item(a, own).unwrap(), Pickup::Moved, "{driver}");
    assert!(holds(&shard, a, own), "{driver}");
    // What the zone spawned (ore in r3) is nobody's release.
    shard.walk(b, "south").unwrap();
    let ore = lying(&shard, "ore", "r3");
    assert_eq!(shard.get_item(b, ore).unwrap(), Pickup::Moved, "{driver}");
    // Put down by Aria, then moved by the engine into Bran's room: the mark is gone.
    let carried = give_gem(&mut shard, a);
    shard.drop_item(a, carried).unwrap();
    shard.engine_move("zone-0", carried, "r3").unwrap();
    assert_eq!(
        shard.get_item(b, carried).unwrap(),
        Pickup::Moved,
        "{driver}"
    );
    assert!(holds(&shard, b, carried), "{driver}");
    // One real transfer afterwards, waited for: it is the only one on the trail.
    let given = give_gem(&mut shard, a);
    shard.drop_item(a, given).unwrap();
    assert_eq!(shard.get_item(c, given).unwrap(), Pickup::Transferring);
    tick_until(&mut shard, "the transfer", |s| holds(s, c, given)).await;
    assert_eq!(transfers_to(&services, c).await.len(), 1, "{driver}");
    assert!(
        transfers_to(&services, b).await.is_empty(),
        "{driver}: plain moves record nothing"
    );
    assert!(transfers_to(&services, a).await.is_empty(), "{driver}");
    assert_eq!(shard.transfer_counts(), (1, 0), "{driver}");
    shard.kill();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn own_drops_spawns_and_engine_moves_are_plain_moves(pool: PgPool) {
    on_both_drivers(&pool, "it-live-items", plain_moves).await;
}

async fn bound_stays(services: Services, driver: &str) {
    let (mut shard, [a, b, _]) = three_players(&services).await;
    let amulet = Uuid::now_v7();
    shard.grant(a, reward_of("amulet", amulet)).unwrap();
    // Bound on pickup: Aria drops her unbound amulet and picks it up again.
    shard.drop_item(a, amulet).unwrap();
    assert_eq!(shard.get_item(a, amulet).unwrap(), Pickup::Moved);
    assert_eq!(
        shard.drop_item(a, amulet),
        Err(ActionError::Bound(amulet)),
        "{driver}"
    );
    assert!(holds(&shard, a, amulet), "{driver}");
    assert!(!holds(&shard, b, amulet), "{driver}");
    shard.kill();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn bound_items_cannot_cross_owners(pool: PgPool) {
    on_both_drivers(&pool, "it-live-items", bound_stays).await;
}

async fn floors_decay(services: Services, driver: &str) {
    let mut live = config("shard-a", "zone-0");
    live.floor_lifetime_pulses = Some(60);
    let mut shard = boot_in(&services, live, &[0], 4, &ZoneDirectory::new());
    let a = new_character(&services, "Aria").await;
    shard.login(a, SessionStart::default()).await.unwrap();
    let spawned = floor_ids(&shard);
    // To the chest the zone spawned in r2.
    shard.walk(a, "north").unwrap();
    shard.walk(a, "north").unwrap();
    let chest = lying(&shard, "chest", "r2");
    let (dropped, put) = (give_gem(&mut shard, a), give_gem(&mut shard, a));
    shard.drop_item(a, dropped).unwrap();
    shard.put_item(a, put, chest).unwrap();
    for _ in 0..40 {
        shard.tick();
    }
    assert!(shard.take_decayed_items().is_empty(), "{driver}: too early");
    let ids = floor_ids(&shard);
    assert!(ids.contains(&dropped) && ids.contains(&put), "{driver}");
    for _ in 0..40 {
        shard.tick();
    }
    let mut decayed = shard.take_decayed_items();
    decayed.sort();
    let mut expected = vec![dropped, put];
    expected.sort();
    assert_eq!(decayed, expected, "{driver}");
    let ids = floor_ids(&shard);
    assert!(
        !ids.contains(&dropped) && !ids.contains(&put),
        "{driver}: gone from the floor"
    );
    assert!(
        spawned.iter().all(|id| ids.contains(id)),
        "{driver}: the zone's own items stay"
    );
    shard.kill();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn put_down_items_decay_after_the_floor_lifetime(pool: PgPool) {
    on_both_drivers(&pool, "it-live-items", floors_decay).await;
}

async fn evicted_floor(services: Services, driver: &str) {
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
    let item = give_gem(&mut a, ana);
    a.drop_item(ana, item).unwrap();
    // Ana logs in elsewhere: shard-a's copy is a zombie, evicted at its next write.
    b.login(ana, SessionStart::default()).await.unwrap();
    a.runtime().flush_all();
    let mut voided = Vec::new();
    tick_until(&mut a, "the eviction", |a| {
        voided.extend(a.take_voided_items());
        a.location(ana).is_none()
    })
    .await;
    assert!(
        voided.contains(&item),
        "{driver}: what the zombie put down leaves the world: {voided:?}"
    );
    assert!(
        matches!(a.get_item(bo, item), Err(ActionError::NoSuchItem(_))),
        "{driver}: nobody picks it up"
    );
    assert!(!floor_ids(&a).contains(&item), "{driver}");
    a.kill();
    b.kill();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn what_an_evicted_zombie_put_down_is_voided(pool: PgPool) {
    on_both_drivers(&pool, "it-live-items", evicted_floor).await;
}
