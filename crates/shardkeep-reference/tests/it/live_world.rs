//! Where players of the reference shard on the runtime land and stand: a walk across zones is
//! saved where it ended, a reconnect resumes the copy still held, a login follows its zone to
//! the shard that hosts it now (or lands home when no shard here hosts it), and zones reset on
//! their timer. On Postgres with Redis and on the embedded file.

use std::time::Duration;

use shardkeep::Services;
use shardkeep::live::{FinalSave, SessionStart};
use shardkeep_reference::live_shard::{LiveShard, Walk};
use shardkeep_reference::shard::ZoneDirectory;
use shardkeep_reference::shard::gate::route_login;
use sqlx::PgPool;
use uuid::Uuid;

use super::live_support::{boot_in, brand_new, config, create, lying, tick_until};
use super::support::on_both_drivers;

/// A shard of a two-zone world hosting `ids`.
fn boot(services: &Services, shard: &str, ids: &[usize], directory: &ZoneDirectory) -> LiveShard {
    let home = format!("zone-{}", ids[0]);
    boot_in(services, config(shard, &home), ids, 2, directory)
}

fn moved_to(walk: Walk) -> (String, String) {
    match walk {
        Walk::Moved { zone, room } => (zone, room),
        other => panic!("expected a move inside the shard, got {other:?}"),
    }
}

/// Logs `id` out of `shard` and waits for its final save, which must land.
async fn log_out_saved(shard: &mut LiveShard, id: Uuid, driver: &str) {
    let mut out = shard.logout(id).unwrap();
    tick_until(shard, "the final save", |_| out.outcome().is_some()).await;
    assert!(
        matches!(out.outcome(), Some(FinalSave::Saved { .. })),
        "{driver}: {:?}",
        out.outcome()
    );
}

async fn walks_then_logs_out(services: Services, driver: &str) {
    let directory = ZoneDirectory::new();
    let mut shard = boot(&services, "shard-a", &[0, 1], &directory);
    let id = brand_new(&services, "Aria").await;
    let first = shard.login(id, SessionStart::default()).await.unwrap();
    assert!(first.admitted.brand_new, "{driver}");
    assert_eq!((first.zone.as_str(), first.room.as_str()), ("zone-0", "r0"));
    assert_eq!(
        moved_to(shard.walk(id, "east").unwrap()),
        ("zone-1".into(), "r0".into()),
        "{driver}"
    );
    assert_eq!(
        moved_to(shard.walk(id, "north").unwrap()),
        ("zone-1".into(), "r1".into())
    );
    log_out_saved(&mut shard, id, driver).await;
    let row = services.characters.load(id).await.unwrap().unwrap();
    assert_eq!(
        (row.zone_ref.as_deref(), row.room_ref.as_deref()),
        (Some("zone-1"), Some("r1")),
        "{driver}"
    );
    assert_eq!(
        row.chargen, None,
        "{driver}: applied, then cleared by a save"
    );
    let again = shard.login(id, SessionStart::default()).await.unwrap();
    assert!(!again.admitted.brand_new, "{driver}");
    assert_eq!(
        (again.zone.as_str(), again.room.as_str()),
        ("zone-1", "r1"),
        "{driver}"
    );
    assert_eq!(
        shard.read(id, |c| c.items().len()).unwrap(),
        1,
        "{driver}: the starting bag, once"
    );
    shard.kill();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_walk_across_zones_is_saved_where_it_ended_and_logs_in_there(pool: PgPool) {
    on_both_drivers(&pool, "it-live-world", walks_then_logs_out).await;
}

async fn reconnects_after_a_walk(services: Services, driver: &str) {
    let directory = ZoneDirectory::new();
    let mut shard = boot(&services, "shard-a", &[0, 1], &directory);
    let id = brand_new(&services, "Aria").await;
    let first = shard.login(id, SessionStart::default()).await.unwrap();
    shard.walk(id, "east").unwrap();
    shard.update(id, |c| c.currency = 7).unwrap();
    shard.detach(id, &first.admitted.session_token, 0).unwrap();
    let again = shard
        .login(
            id,
            SessionStart {
                token: Some("s2".into()),
            },
        )
        .await
        .unwrap();
    assert!(again.admitted.resumed.is_some(), "{driver}: resumed");
    assert_eq!(
        again.admitted.copy, first.admitted.copy,
        "{driver}: the same copy, no new claim"
    );
    assert_eq!(again.zone, "zone-1", "{driver}: where it stood");
    assert_eq!(shard.players(), vec![id], "{driver}: no second copy");
    assert_eq!(
        shard.read(id, |c| c.currency).unwrap(),
        7,
        "{driver}: the held copy, not a reload"
    );
    let row = services.characters.load(id).await.unwrap().unwrap();
    assert_eq!(
        row.owner_epoch, first.admitted.copy.owner_epoch,
        "{driver}: a resume claims nothing"
    );
    shard.kill();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_reconnect_after_a_walk_resumes_the_held_copy(pool: PgPool) {
    on_both_drivers(&pool, "it-live-world", reconnects_after_a_walk).await;
}

async fn follows_its_zone(services: Services, driver: &str) {
    let directory = ZoneDirectory::new();
    let mut a = boot(&services, "shard-a", &[0, 1], &directory);
    let id = brand_new(&services, "Aria").await;
    let first = a.login(id, SessionStart::default()).await.unwrap();
    a.walk(id, "east").unwrap();
    log_out_saved(&mut a, id, driver).await;
    let report = a.shutdown(Duration::from_secs(10)).await;
    assert_eq!(report.unsaved_finals.total(), 0, "{driver}: {report:?}");
    // zone-1 moves to shard-b while the player is offline.
    let mut b = boot(&services, "shard-b", &[1], &directory);
    let route = route_login(
        Some(&services.placement),
        &services.characters,
        &directory,
        id,
    )
    .await
    .unwrap();
    assert_eq!(
        (route.shard.as_deref(), route.zone.as_deref(), route.held),
        (Some("shard-b"), Some("zone-1"), false),
        "{driver}"
    );
    let landed = b.login(id, SessionStart::default()).await.unwrap();
    assert_eq!(landed.zone, "zone-1", "{driver}");
    assert!(
        landed.admitted.copy.owner_epoch > first.admitted.copy.owner_epoch,
        "{driver}: a new claim"
    );
    log_out_saved(&mut b, id, driver).await;
    b.kill();
    // No shard hosts zone-1 now but one homed in zone-0: the login lands home.
    let mut c = boot(&services, "shard-c", &[0], &directory);
    let home = c.login(id, SessionStart::default()).await.unwrap();
    assert_eq!(
        (home.zone.as_str(), home.room.as_str()),
        ("zone-0", "r0"),
        "{driver}"
    );
    c.kill();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_login_follows_its_zone_to_the_shard_hosting_it_or_lands_home(pool: PgPool) {
    on_both_drivers(&pool, "it-live-world", follows_its_zone).await;
}

async fn resets_zones(services: Services, driver: &str) {
    let directory = ZoneDirectory::new();
    let mut shard = boot(&services, "shard-a", &[0], &directory);
    let spawned = |s: &LiveShard| {
        s.floors()
            .filter(|(zone, _)| zone.id == "zone-0")
            .map(|(_, floor)| floor.len())
            .sum::<usize>()
    };
    assert_eq!(
        spawned(&shard),
        3,
        "{driver}: boot spawned the chest and two heaps of ore"
    );
    let id = brand_new(&services, "Aria").await;
    shard.login(id, SessionStart::default()).await.unwrap();
    shard.walk(id, "south").unwrap();
    let ore = lying(&shard, "ore", "r3");
    shard.get_item(id, ore).unwrap();
    assert_eq!(spawned(&shard), 2, "{driver}");
    while shard.pulse_count() < 239 {
        shard.tick();
    }
    assert_eq!(spawned(&shard), 2, "{driver}: not before the repop pulse");
    shard.tick();
    assert_eq!(
        spawned(&shard),
        3,
        "{driver}: the repop pulse topped the zone up"
    );
    for _ in 0..240 {
        shard.tick();
    }
    assert_eq!(spawned(&shard), 3, "{driver}: a full zone stays as it is");
    shard.kill();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn zones_repop_at_boot_and_on_the_repop_timer(pool: PgPool) {
    on_both_drivers(&pool, "it-live-world", resets_zones).await;
}

async fn carries_current_timers(services: Services, driver: &str) {
    let directory = ZoneDirectory::new();
    let mut a = boot(&services, "shard-a", &[0], &directory);
    let mut b = boot(&services, "shard-b", &[1], &directory);
    let id = brand_new(&services, "Aria").await;
    a.login(id, SessionStart::default()).await.unwrap();
    a.update(id, |c| {
        c.affects.push(shardkeep_reference::game::state::Affect {
            name: "haste".into(),
            remaining_pulses: 100,
            attribute_mods: Default::default(),
            pool_mods: Default::default(),
        });
    })
    .unwrap();
    for _ in 0..5 {
        a.tick();
    }
    let Walk::Leaving(departure) = a.walk(id, "east").unwrap() else {
        panic!("{driver}: zone-1 is shard-b's");
    };
    let ticket = departure.ticket().await.unwrap();
    b.arrive(&ticket.token, SessionStart::default())
        .await
        .unwrap();
    let haste = b
        .read(id, |c| {
            c.affects
                .iter()
                .find(|x| x.name == "haste")
                .map(|x| x.remaining_pulses)
        })
        .unwrap();
    assert_eq!(haste, Some(95), "{driver}: as of the source's last pulse");
    a.kill();
    b.kill();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_handoff_carries_the_timers_as_of_the_current_pulse(pool: PgPool) {
    on_both_drivers(&pool, "it-live-world", carries_current_timers).await;
}

/// The event kinds of `character` on the audit trail, oldest first, once there are `count`.
async fn audit_kinds(services: &Services, character: Uuid, count: usize) -> Vec<String> {
    for _ in 0..500 {
        let page = services
            .audit
            .character_page(character, None, 200)
            .await
            .unwrap();
        if page.rows.len() >= count {
            return page.rows.into_iter().rev().map(|r| r.event_kind).collect();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{count} audit rows of {character} not within 5 s");
}

async fn deaths_latch(services: Services, driver: &str) {
    let directory = ZoneDirectory::new();
    let mut shard = boot(&services, "shard-a", &[0], &directory);
    let id = brand_new(&services, "Aria").await;
    shard.login(id, SessionStart::default()).await.unwrap();
    assert!(shard.die(id, None).unwrap().is_some(), "{driver}");
    assert!(
        shard.die(id, None).unwrap().is_none(),
        "{driver}: the latch holds until respawn"
    );
    log_out_saved(&mut shard, id, driver).await;
    shard.login(id, SessionStart::default()).await.unwrap();
    assert!(
        shard.die(id, None).unwrap().is_some(),
        "{driver}: a new session starts unlatched"
    );
    shard.respawn(id).unwrap();
    assert!(shard.die(id, None).unwrap().is_some(), "{driver}");
    assert_eq!(
        audit_kinds(&services, id, 3).await,
        vec!["died", "died", "died"],
        "{driver}"
    );
    shard.kill();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn each_death_is_recorded_once_until_respawn(pool: PgPool) {
    on_both_drivers(&pool, "it-live-world", deaths_latch).await;
}

/// A player's timers run down lazily (a pulse visits only the players whose timer runs out on
/// it) and read, save and expire exactly as a countdown pulse by pulse would: an affect's
/// attribute bonus holds until its last pulse and goes on it, a cooldown given later by the
/// game runs from that pulse, and a checkpoint in between writes the timers as of its pulse.
async fn lazy_timers(services: Services, driver: &str) {
    let directory = ZoneDirectory::new();
    let mut shard = boot(&services, "shard-a", &[0], &directory);
    let id = brand_new(&services, "Aria").await;
    shard.login(id, SessionStart::default()).await.unwrap();
    let base = shard.read(id, |c| c.attributes["str"]).unwrap();
    shard
        .update(id, |c| {
            c.affects.push(shardkeep_reference::game::state::Affect {
                name: "might".into(),
                remaining_pulses: 30,
                attribute_mods: [("str".to_owned(), 5)].into(),
                pool_mods: Default::default(),
            });
            c.recompute();
        })
        .unwrap();
    let state = |s: &LiveShard| {
        s.read(id, |c| {
            (
                c.attributes["str"],
                c.affects.first().map(|a| a.remaining_pulses),
                c.cooldowns.get("kick").copied(),
            )
        })
        .unwrap()
    };
    for _ in 0..10 {
        shard.tick();
    }
    assert_eq!(state(&shard), (base + 5, Some(20), None), "{driver}");
    shard
        .update(id, |c| c.cooldowns.insert("kick".into(), 15))
        .unwrap();
    for _ in 0..14 {
        shard.tick();
    }
    // A save at this pulse, nothing having looked since the cooldown began: the row holds the
    // timers as of now.
    let copy = shard.copy_of(id).unwrap();
    shard.runtime().save_now(copy).await.unwrap();
    let row = services.characters.load(id).await.unwrap().unwrap();
    assert_eq!(row.state["affects"][0]["remaining_pulses"], 6, "{driver}");
    assert_eq!(row.state["cooldowns"]["kick"], 1, "{driver}");
    assert_eq!(state(&shard), (base + 5, Some(6), Some(1)), "{driver}");
    shard.tick();
    assert_eq!(
        state(&shard),
        (base + 5, Some(5), None),
        "{driver}: the cooldown ran out"
    );
    for _ in 0..4 {
        shard.tick();
    }
    assert_eq!(state(&shard), (base + 5, Some(1), None), "{driver}");
    shard.tick();
    // Read through the runtime without catching up: the pulse that ran it out did it.
    let (strength, affects) = shard
        .runtime()
        .read(copy, |c| (c.attributes["str"], c.affects.len()))
        .unwrap();
    assert_eq!(
        (strength, affects),
        (base, 0),
        "{driver}: the affect ran out on its pulse"
    );
    shard.kill();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn timers_run_down_lazily_as_a_countdown_would(pool: PgPool) {
    on_both_drivers(&pool, "it-live-world", lazy_timers).await;
}

/// A character loaded when the shard has long been running starts its timers from the shard's
/// pulse (not from pulse 0, which would run them out at its first look), keeps them through a
/// grant (the game replays the character), and saves them as of the pulse it saves on.
async fn timers_from_a_late_login(services: Services, driver: &str) {
    let directory = ZoneDirectory::new();
    let mut shard = boot(&services, "shard-a", &[0], &directory);
    for _ in 0..50 {
        shard.tick();
    }
    let state = serde_json::json!({
        "affects": [{ "name": "might", "remaining_pulses": 30, "attribute_mods": { "str": 5 } }],
    });
    let id = create(&services, "Late", Some(("zone-0", "r0")), state, None).await;
    shard.login(id, SessionStart::default()).await.unwrap();
    let might = |s: &LiveShard| {
        s.read(id, |c| c.affects.first().map(|a| a.remaining_pulses))
            .unwrap()
    };
    assert_eq!(might(&shard), Some(30), "{driver}: as stored");
    shard
        .grant(id, super::live_support::gem(Uuid::now_v7()))
        .unwrap();
    for _ in 0..5 {
        shard.tick();
    }
    let copy = shard.copy_of(id).unwrap();
    shard.runtime().save_now(copy).await.unwrap();
    let row = services.characters.load(id).await.unwrap().unwrap();
    assert_eq!(row.state["affects"][0]["remaining_pulses"], 25, "{driver}");
    assert_eq!(might(&shard), Some(25), "{driver}");
    shard.kill();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_late_login_starts_its_timers_from_the_shards_pulse(pool: PgPool) {
    on_both_drivers(&pool, "it-live-world", timers_from_a_late_login).await;
}
