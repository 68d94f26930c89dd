use std::time::Duration;

use serde_json::json;
use shardkeep::character::{
    CharacterSnapshot, CheckpointWrite, HandoffLoad, HandoffPayload, LoadSource, SaveOutcome,
};
use shardkeep::drain::BarrierOutcome;
use shardkeep::saver::{SaveReason, SaverConfig, SaverEvent};
use shardkeep_reference::shard::gate::route_login;
use shardkeep_reference::shard::{
    EvictionCause, LandingCase, ShardConfig, ShardStores, WalkOutcome,
};
use shardkeep_testkit::TestRedis;
use sqlx::PgPool;

use crate::faultable::{Faultable, faultable_checkpoints};
use crate::scene::{Driver, Scene};
use crate::support::{Stores, boot, boot_with, login, pump_until};

const BARRIER: Duration = Duration::from_secs(5);

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_stale_owner_never_lands_a_flush_final_or_checkpoint(pool: PgPool) {
    let redis = TestRedis::new().await;
    let sqlite = shardkeep_testkit::TestSqlite::new().await;
    for stores in [
        Stores::new(&pool, redis.backend()),
        Stores::embedded(&sqlite),
    ] {
        let driver = stores.driver();
        let id = stores.new_character("Aria").await;
        // Split brain: two shards both host zone-0 and both admit the character.
        let mut zombie = boot(&stores, "shard-a", &[0], 1);
        let mut live = boot(&stores, "shard-b", &[0], 1);
        login(&stores, &mut zombie, id, "s-old").await;
        login(&stores, &mut live, id, "s-new").await;
        let zombie_epoch = zombie.player(id).unwrap().character.owner_epoch;
        let live_epoch = live.player(id).unwrap().character.owner_epoch;
        assert_eq!((zombie_epoch, live_epoch), (1, 2), "{driver}");

        live.player_mut(id).unwrap().character.currency = 500;
        assert!(live.save_one(id, SaveReason::Flush));
        assert_eq!(live.saver().barrier(BARRIER).await, BarrierOutcome::Drained);

        // The zombie externalizes wealth and tries every path down the ladder — even rebased onto
        // the live row's version, so only the epoch fence stands between it and the row.
        let (row_version, _) = stores.characters.version_of(id).await.unwrap().unwrap();
        zombie.player_mut(id).unwrap().character.state_version = row_version;
        zombie.player_mut(id).unwrap().character.currency = 9_999;
        assert!(zombie.save_one(id, SaveReason::Checkpoint));
        assert!(zombie.save_one(id, SaveReason::Flush));
        zombie.logout(id).unwrap();
        assert_eq!(
            zombie.saver().barrier(BARRIER).await,
            BarrierOutcome::Drained
        );
        let stats = zombie.saver().stats();
        assert_eq!(stats.row_landed, 0, "{driver}");
        assert_eq!(stats.checkpoint_landed, 0, "{driver}");
        assert!(
            stats.checkpoint_refused >= 1 && stats.row_ownership_lost >= 1,
            "{stats:?}"
        );
        assert_eq!(
            stats.final_dropped, 0,
            "an ownership loss is terminal, never rebased"
        );

        // Even a rebased snapshot (the final path's response to a version loss) is fenced.
        let (current_version, _) = stores.characters.version_of(id).await.unwrap().unwrap();
        let mut rebased = stores.characters.load(id).await.unwrap().unwrap();
        rebased.owner_epoch = zombie_epoch;
        rebased.state_version = current_version;
        rebased.state = json!({ "currency": 9_999 }).into();
        assert_eq!(
            stores.characters.save(&rebased).await.unwrap(),
            SaveOutcome::OwnershipLost(live_epoch)
        );

        // The live owner's state is what loads.
        let row = stores.characters.load(id).await.unwrap().unwrap();
        assert_eq!(row.state["currency"], 500);
        let checkpoint = stores.checkpoints.read(id).await.unwrap().unwrap();
        assert_eq!(
            (checkpoint.owner_epoch, checkpoint.state["currency"].clone()),
            (live_epoch, json!(500))
        );
        live.logout(id).unwrap();
        assert_eq!(live.saver().barrier(BARRIER).await, BarrierOutcome::Drained);
        let loaded = stores.loader().claim_and_load(id, 0).await.unwrap();
        assert_eq!(loaded.snapshot.state["currency"], 500);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_zombie_is_evicted_when_its_writes_are_refused(pool: PgPool) {
    let redis = TestRedis::new().await;
    let sqlite = shardkeep_testkit::TestSqlite::new().await;
    for stores in [
        Stores::new(&pool, redis.backend()),
        Stores::embedded(&sqlite),
    ] {
        let driver = stores.driver();
        let id = stores.new_character("Aria").await;
        let mut zombie = boot(&stores, "shard-a", &[0], 1);
        let mut live = boot(&stores, "shard-b", &[0], 1);
        login(&stores, &mut zombie, id, "s1").await;
        login(&stores, &mut live, id, "s2").await;
        live.save_one(id, SaveReason::Flush);
        assert_eq!(live.saver().barrier(BARRIER).await, BarrierOutcome::Drained);
        zombie.save_one(id, SaveReason::Checkpoint);
        pump_until(&mut zombie, Duration::from_secs(5), |s| {
            s.player(id).is_none()
        })
        .await;
        let evictions = zombie.take_evictions();
        assert_eq!(evictions.len(), 1, "{driver}");
        assert_eq!(
            evictions[0].cause,
            EvictionCause::DoubleOwn { stored_epoch: 2 }
        );
        assert!(live.player(id).is_some(), "the live copy is untouched");
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn freshness_tie_goes_to_the_checkpoint_and_a_newer_row_wins(pool: PgPool) {
    let redis = TestRedis::new().await;
    let sqlite = shardkeep_testkit::TestSqlite::new().await;
    for stores in [
        Stores::new(&pool, redis.backend()),
        Stores::embedded(&sqlite),
    ] {
        let driver = stores.driver();
        let id = stores.new_character("Aria").await;
        let mut shard = boot(&stores, "shard-a", &[0], 1);
        login(&stores, &mut shard, id, "s1").await;
        shard.player_mut(id).unwrap().character.currency = 42;
        shard.save_one(id, SaveReason::Checkpoint);
        assert_eq!(
            shard.saver().barrier(BARRIER).await,
            BarrierOutcome::Drained
        );
        shard.kill(); // crash: the checkpoint is the only copy of the new content

        // Tie at (epoch 1, version 0): the checkpoint's content loads.
        let loaded = stores.loader().claim_and_load(id, 0).await.unwrap();
        assert_eq!(loaded.source, LoadSource::Checkpoint, "{driver}");
        assert_eq!(loaded.snapshot.state["currency"], 42);
        assert_eq!(
            (loaded.snapshot.state_version, loaded.snapshot.owner_epoch),
            (0, 2)
        );

        // The epoch-2 owner flushes new content (row at version 1), then a checkpoint at the old
        // version 0 with older content reappears: the row's higher version wins.
        let mut flushed = loaded.snapshot.clone();
        flushed.state = json!({ "currency": 77 }).into();
        assert_eq!(
            stores.characters.save(&flushed).await.unwrap(),
            SaveOutcome::Saved(1)
        );
        let mut old = flushed.clone();
        old.state = json!({ "currency": 1 }).into();
        assert_eq!(
            stores.checkpoints.write(&old).await.unwrap(),
            CheckpointWrite::Written
        );
        let loaded = stores.loader().claim_and_load(id, 0).await.unwrap();
        assert_eq!(loaded.source, LoadSource::Row);
        assert_eq!(loaded.snapshot.state["currency"], 77);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_stale_owners_checkpoint_never_outranks_the_live_row(pool: PgPool) {
    for driver in Driver::ALL {
        let Scene {
            stores,
            keep: _keep,
            ..
        } = Scene::new(&pool, driver).await;
        let id = stores.new_character("Aria").await;
        let stale_epoch = stores.characters.claim(id, 0).await.unwrap().new_epoch;
        let live = stores.characters.claim(id, 0).await.unwrap();
        let mut live_snapshot = CharacterSnapshot {
            owner_epoch: live.new_epoch,
            state: json!({ "who": "live" }).into(),
            ..live.row.clone()
        };
        assert_eq!(
            stores.characters.save(&live_snapshot).await.unwrap(),
            SaveOutcome::Saved(1)
        );
        live_snapshot.state_version = 1;
        // A stale owner's checkpoint at a much higher version, written before the live owner's.
        let zombie = CharacterSnapshot {
            owner_epoch: stale_epoch,
            state_version: 50,
            state: json!({ "who": "zombie" }).into(),
            ..live_snapshot.clone()
        };
        assert_eq!(
            stores.checkpoints.write(&zombie).await.unwrap(),
            CheckpointWrite::Written
        );
        let loaded = stores.loader().claim_and_load(id, 0).await.unwrap();
        assert_eq!(loaded.source, LoadSource::Row);
        assert_eq!(loaded.snapshot.state["who"], "live");
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_zone_walk_then_logout_then_login_lands_in_the_walked_to_zone(pool: PgPool) {
    for driver in Driver::ALL {
        let Scene {
            stores,
            keep: _keep,
            ..
        } = Scene::new(&pool, driver).await;
        let id = stores.new_character("Aria").await;
        let mut shard = boot(&stores, "shard-a", &[0, 1], 2);
        let first = login(&stores, &mut shard, id, "s1").await;
        assert_eq!(
            (first.zone.as_str(), first.case),
            ("zone-0", LandingCase::BrandNew)
        );
        assert_eq!(
            shard.walk(id, "east").unwrap(),
            WalkOutcome::Moved {
                zone: "zone-1".into(),
                room: "r0".into()
            }
        );
        shard.walk(id, "north").unwrap();
        shard.logout(id).unwrap();
        assert_eq!(
            shard.saver().barrier(BARRIER).await,
            BarrierOutcome::Drained
        );
        let row = stores.characters.load(id).await.unwrap().unwrap();
        assert_eq!(
            (row.zone_ref.as_deref(), row.room_ref.as_deref()),
            (Some("zone-1"), Some("r1"))
        );
        assert_eq!(
            row.chargen, None,
            "chargen was applied and cleared by the final CAS"
        );

        let again = login(&stores, &mut shard, id, "s2").await;
        assert_eq!(
            (again.zone.as_str(), again.room.as_str(), again.case),
            ("zone-1", "r1", LandingCase::Rehydrate)
        );
        assert_eq!(
            shard.player(id).unwrap().character.inventory.len(),
            1,
            "the chargen kit persisted"
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_link_dead_reconnect_after_a_walk_attaches_to_the_held_session(pool: PgPool) {
    for driver in Driver::ALL {
        let Scene {
            stores,
            keep: _keep,
            ..
        } = Scene::new(&pool, driver).await;
        let id = stores.new_character("Aria").await;
        let mut shard = boot(&stores, "shard-a", &[0, 1], 2);
        login(&stores, &mut shard, id, "s1").await;
        shard.walk(id, "east").unwrap();
        shard.player_mut(id).unwrap().character.currency = 7;
        shard.detach(id).unwrap();
        let (_, epoch_before) = stores.characters.version_of(id).await.unwrap().unwrap();

        let resumed = login(&stores, &mut shard, id, "s2").await;
        assert_eq!(
            (resumed.zone.as_str(), resumed.case),
            ("zone-1", LandingCase::Resumed)
        );
        assert_eq!(shard.residency().len(), 1, "no second copy");
        assert_eq!(
            shard.player(id).unwrap().character.currency,
            7,
            "the held copy, not a reload"
        );
        let (_, epoch_after) = stores.characters.version_of(id).await.unwrap().unwrap();
        assert_eq!(epoch_before, epoch_after, "a resume claims nothing");
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn login_routes_through_the_directory_after_a_rebalance(pool: PgPool) {
    for driver in Driver::ALL {
        let Scene {
            stores,
            keep: _keep,
            ..
        } = Scene::new(&pool, driver).await;
        let id = stores.new_character("Aria").await;
        let mut a = boot(&stores, "shard-a", &[0, 1], 2);
        login(&stores, &mut a, id, "s1").await;
        a.walk(id, "east").unwrap();
        a.logout(id).unwrap();
        assert_eq!(a.shutdown(BARRIER).await.saver, BarrierOutcome::Drained);
        // zone-1 moves to shard-b while the player is offline.
        let mut b = boot(&stores, "shard-b", &[1], 2);
        let route = route_login(
            stores.placement.as_ref(),
            &stores.characters,
            &stores.directory,
            id,
        )
        .await
        .unwrap();
        assert_eq!(
            (route.shard.as_deref(), route.zone.as_deref(), route.held),
            (Some("shard-b"), Some("zone-1"), false)
        );
        assert_eq!(
            route.floor, 1,
            "the tombstone keeps the epoch as the next claim's floor"
        );
        let landed = login(&stores, &mut b, id, "s2").await;
        assert_eq!(
            (landed.zone.as_str(), landed.case),
            ("zone-1", LandingCase::Rehydrate)
        );
        assert_eq!(b.player(id).unwrap().character.owner_epoch, 2);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_unhosted_zone_ref_lands_home_with_a_warning(pool: PgPool) {
    for driver in Driver::ALL {
        let Scene {
            stores,
            keep: _keep,
            ..
        } = Scene::new(&pool, driver).await;
        let id = stores.new_character("Aria").await;
        let mut a = boot(&stores, "shard-a", &[0, 1], 2);
        login(&stores, &mut a, id, "s1").await;
        a.walk(id, "east").unwrap();
        a.logout(id).unwrap();
        a.shutdown(BARRIER).await;
        let mut c = boot(&stores, "shard-c", &[0], 2);
        let loaded = stores.loader().claim_and_load(id, 0).await.unwrap();
        let landed = c
            .admit(
                loaded,
                shardkeep_reference::shard::Arrival::Login {
                    session_token: "s2".into(),
                },
            )
            .unwrap();
        assert_eq!(
            (landed.zone.as_str(), landed.case),
            ("zone-0", LandingCase::UnhostedZone)
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_cross_shard_handoff_carries_the_snapshot_and_the_destination_claims(pool: PgPool) {
    for driver in Driver::ALL {
        let Scene {
            stores,
            keep: _keep,
            ..
        } = Scene::new(&pool, driver).await;
        let id = stores.new_character("Aria").await;
        let mut a = boot(&stores, "shard-a", &[0], 2);
        let mut b = boot(&stores, "shard-b", &[1], 2);
        login(&stores, &mut a, id, "s1").await;
        a.player_mut(id).unwrap().character.currency = 31;
        let WalkOutcome::Handoff(handoff) = a.walk(id, "east").unwrap() else {
            panic!("zone-1 is on shard-b");
        };
        assert_eq!(handoff.target_shard.as_deref(), Some("shard-b"));
        assert!(a.player(id).is_none());
        let loaded = stores
            .loader()
            .claim_for_handoff(HandoffPayload::new(handoff.snapshot), "h-1", 1)
            .await
            .unwrap();
        let HandoffLoad::Adopted(loaded) = loaded else {
            panic!("the live copy's own handoff is adopted: {loaded:?}");
        };
        b.admit(
            loaded,
            shardkeep_reference::shard::Arrival::Handoff {
                handoff_token: "h-1".into(),
            },
        )
        .unwrap();
        assert!(
            !b.save_one(id, SaveReason::Flush),
            "a pending arrival is not saved"
        );
        let landed = b.redial("h-1", "s2").unwrap();
        assert_eq!(
            (landed.zone.as_str(), landed.case),
            ("zone-1", LandingCase::HandoffRedial)
        );
        assert_eq!(b.player(id).unwrap().character.currency, 31);
        assert_eq!(b.player(id).unwrap().character.owner_epoch, 2);
        assert!(b.redial("h-1", "s3").is_err());
        assert_eq!(
            a.saver().stats().row_attempted,
            0,
            "the source removed it without saving"
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn final_flushes_queued_before_shutdown_are_durable_when_it_returns(pool: PgPool) {
    for driver in Driver::ALL {
        let Scene {
            stores,
            keep: _keep,
            ..
        } = Scene::new(&pool, driver).await;
        let mut shard = boot(&stores, "shard-a", &[0], 1);
        let mut ids = Vec::new();
        // More players than the saver's queue holds entries: the finals must still all land.
        let players = SaverConfig::default().queue_depth as i64 + 44;
        for i in 0..players {
            let id = stores.new_character(&format!("P{i}")).await;
            login(&stores, &mut shard, id, &format!("s{i}")).await;
            shard.player_mut(id).unwrap().character.experience = 1000 + i;
            ids.push(id);
        }
        let saver = shard.saver().clone();
        let report = shard.shutdown(BARRIER).await;
        assert_eq!(report.finalized, players as usize);
        assert_eq!(
            saver.stats().dropped_row,
            0,
            "no final save dropped at the queue"
        );
        assert_eq!(
            (report.saver, report.placement),
            (BarrierOutcome::Drained, BarrierOutcome::Drained)
        );
        for (i, id) in ids.iter().enumerate() {
            let row = stores.characters.load(*id).await.unwrap().unwrap();
            assert_eq!(row.state["experience"], 1000 + i as i64);
            assert_eq!(row.state_version, 1);
            let placement = stores
                .placement
                .as_ref()
                .unwrap()
                .read(*id)
                .await
                .unwrap()
                .unwrap();
            assert!(placement.is_tombstone() && placement.owner_epoch == 1);
        }
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_saturated_saver_drops_without_blocking_and_the_zone_keeps_ticking(pool: PgPool) {
    for driver in Driver::ALL {
        let faultable = Faultable::new(&pool, driver).await;
        let (stores, outage) = (&faultable.stores, &faultable.outage);
        let mut config = ShardConfig::new("shard-a", "zone-0");
        config.saver = SaverConfig {
            queue_depth: 8,
            max_batch: 4,
            io_timeout: Duration::from_secs(2),
            ..SaverConfig::default()
        };
        let shard_stores = faultable.rows_only();
        let mut shard = boot_with(shard_stores, stores, config, &[0], 1);
        for i in 0..20 {
            let id = stores.new_character(&format!("P{i}")).await;
            login(stores, &mut shard, id, "s").await;
        }
        outage.stall();
        let pulses_before = shard.pulse_count();
        // Enqueue is synchronous and never waits: a thousand flush rounds return promptly even
        // though the store answers nothing.
        tokio::time::timeout(Duration::from_secs(5), async {
            for _ in 0..50 {
                shard.save_all(SaveReason::Flush);
                shard.tick();
            }
        })
        .await
        .expect("enqueue and tick never block on a stalled store");
        assert_eq!(shard.pulse_count(), pulses_before + 50);
        let stats = shard.saver().stats();
        assert!(stats.dropped_row > 500, "{stats:?}");
        assert!(shard.saver().depth() <= 8);
        outage.heal();
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_postgres_outage_during_a_flush_recovers_at_the_next_cadence(pool: PgPool) {
    for driver in Driver::ALL {
        let faultable = Faultable::new(&pool, driver).await;
        let (stores, outage) = (&faultable.stores, &faultable.outage);
        let mut config = ShardConfig::new("shard-a", "zone-0");
        config.saver.io_timeout = Duration::from_secs(1);
        config.checkpoint_pulses = 1_000;
        config.flush_pulses = 3;
        let shard_stores = faultable.rows_only();
        let mut shard = boot_with(shard_stores, stores, config, &[0], 1);
        let id = stores.new_character("Aria").await;
        login(stores, &mut shard, id, "s").await;
        shard.player_mut(id).unwrap().character.currency = 5;
        outage.cut();
        for _ in 0..3 {
            shard.tick();
        }
        assert_eq!(
            shard.saver().barrier(BARRIER).await,
            BarrierOutcome::Drained
        );
        assert!(shard.saver().stats().row_failed >= 1);
        assert_eq!(
            stores
                .characters
                .load(id)
                .await
                .unwrap()
                .unwrap()
                .state_version,
            0
        );
        outage.heal();
        pump_until(&mut shard, Duration::from_secs(10), |s| {
            s.player(id).is_some_and(|p| p.character.state_version >= 1)
        })
        .await;
        let row = stores.characters.load(id).await.unwrap().unwrap();
        assert_eq!(row.state["currency"], 5);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_logout_during_a_postgres_outage_lands_its_final_save_once_it_heals(pool: PgPool) {
    for driver in Driver::ALL {
        let faultable = Faultable::new(&pool, driver).await;
        let (stores, outage) = (&faultable.stores, &faultable.outage);
        let mut config = ShardConfig::new("shard-a", "zone-0");
        config.saver.io_timeout = Duration::from_secs(1);
        let shard_stores = faultable.rows_only();
        let mut shard = boot_with(shard_stores, stores, config, &[0], 1);
        let id = stores.new_character("Aria").await;
        login(stores, &mut shard, id, "s").await;
        shard.player_mut(id).unwrap().character.currency = 42;
        outage.cut();
        shard.logout(id).unwrap();
        assert_eq!(
            shard.saver().barrier(Duration::from_secs(2)).await,
            BarrierOutcome::TimedOut,
            "the barrier covers the final save retrying in the background"
        );
        assert_eq!(shard.saver().unsaved_finals().pending, 1);
        assert!(
            shard.saver().stats().row_failed >= 1,
            "the first attempt failed"
        );
        // A journal location write lands meanwhile and moves the row's version.
        let epoch = stores.characters.version_of(id).await.unwrap().unwrap().1;
        stores
            .characters
            .write_location(id, epoch, "zone-0", "r2")
            .await
            .unwrap();
        outage.heal();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let row = stores.characters.load(id).await.unwrap().unwrap();
            if row.state["currency"] == 42 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the final save never landed"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            shard.saver().barrier(BARRIER).await,
            BarrierOutcome::Drained
        );
        shard.tick();
        let events = shard.take_saver_events();
        assert!(
            events.iter().any(|e| matches!(
                e,
                SaverEvent::Saved {
                    reason: SaveReason::Final,
                    ..
                }
            )),
            "{events:?}"
        );
        assert_eq!(shard.saver().stats().final_dropped, 0);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_redis_outage_during_a_checkpoint_recovers_at_the_next_cadence(pool: PgPool) {
    for driver in Driver::ALL {
        let (scene, checkpoints, outage) = faultable_checkpoints(&pool, driver).await;
        let stores = &scene.stores;
        let mut config = ShardConfig::new("shard-a", "zone-0");
        config.saver.io_timeout = Duration::from_secs(1);
        config.checkpoint_pulses = 2;
        config.flush_pulses = 1_000_000;
        let shard_stores = ShardStores {
            characters: Some(stores.characters.clone()),
            checkpoints: Some(checkpoints),
            placement: None,
            audit: None,
            retry: None,
        };
        let mut shard = boot_with(shard_stores, stores, config, &[0], 1);
        let id = stores.new_character("Aria").await;
        login(stores, &mut shard, id, "s").await;
        shard.player_mut(id).unwrap().character.currency = 9;
        outage.cut();
        shard.tick();
        shard.tick();
        assert_eq!(
            shard.saver().barrier(BARRIER).await,
            BarrierOutcome::Drained
        );
        assert!(shard.saver().stats().checkpoint_failed >= 1);
        assert!(stores.checkpoints.read(id).await.unwrap().is_none());
        outage.heal();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            shard.tick();
            shard.tick();
            shard.saver().barrier(BARRIER).await;
            if let Some(checkpoint) = stores.checkpoints.read(id).await.unwrap() {
                assert_eq!(checkpoint.state["currency"], 9);
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "checkpoints never recovered"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn cadences_are_staggered_and_reach_every_player_once_per_period(pool: PgPool) {
    for driver in Driver::ALL {
        let Scene {
            stores,
            keep: _keep,
            ..
        } = Scene::new(&pool, driver).await;
        let mut config = ShardConfig::new("shard-a", "zone-0");
        config.checkpoint_pulses = 4;
        config.flush_pulses = 8;
        let mut shard = boot_with(stores.shard_stores(), &stores, config, &[0], 1);
        let mut ids = Vec::new();
        for i in 0..40 {
            let id = stores.new_character(&format!("P{i}")).await;
            login(&stores, &mut shard, id, "s").await;
            ids.push(id);
        }
        let mut previous = 0;
        for _ in 0..8 {
            shard.tick();
            assert_eq!(
                shard.saver().barrier(BARRIER).await,
                BarrierOutcome::Drained
            );
            // No pulse carries everyone: the load is spread over the period.
            let attempted = shard.saver().stats().checkpoint_attempted;
            assert!(
                attempted - previous < 40,
                "one pulse wrote {} checkpoints",
                attempted - previous
            );
            previous = attempted;
        }
        let stats = shard.saver().stats();
        assert_eq!(
            stats.row_attempted, 40,
            "one flush per player per flush period"
        );
        assert!(
            (40..=120).contains(&stats.checkpoint_attempted),
            "{stats:?}"
        );
        for id in ids {
            assert_eq!(
                stores
                    .characters
                    .load(id)
                    .await
                    .unwrap()
                    .unwrap()
                    .state_version,
                1
            );
        }
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn placement_writes_are_fenced_and_logout_leaves_a_tombstone(pool: PgPool) {
    use shardkeep::placement::{PlacementRecord, PlacementWrite};
    for driver in Driver::ALL {
        let Scene {
            stores,
            keep: _keep,
            ..
        } = Scene::new(&pool, driver).await;
        let id = stores.new_character("Aria").await;
        let mut shard = boot(&stores, "shard-a", &[0, 1], 2);
        login(&stores, &mut shard, id, "s").await;
        shard.walk(id, "east").unwrap();
        assert_eq!(
            shard.saver().barrier(BARRIER).await,
            BarrierOutcome::Drained
        );
        let report = shard.shutdown(BARRIER).await;
        assert_eq!(report.placement, BarrierOutcome::Drained);
        let record = stores
            .placement
            .as_ref()
            .unwrap()
            .read(id)
            .await
            .unwrap()
            .unwrap();
        assert!(record.is_tombstone());
        assert_eq!((record.shard_id, record.owner_epoch), (None, 1));
        let stale = PlacementRecord {
            character_id: id,
            shard_id: Some("zombie".into()),
            zone_id: Some("zone-0".into()),
            owner_epoch: 0,
            updated_at: chrono::Utc::now(),
        };
        assert_eq!(
            stores
                .placement
                .as_ref()
                .unwrap()
                .write(&stale)
                .await
                .unwrap(),
            PlacementWrite::Stale { stored_epoch: 1 }
        );
        assert!(
            stores
                .placement
                .as_ref()
                .unwrap()
                .read(id)
                .await
                .unwrap()
                .unwrap()
                .is_tombstone()
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn login_fails_closed_when_postgres_is_unreachable(pool: PgPool) {
    use shardkeep::character::{CharacterLoader, LoadError};
    for driver in Driver::ALL {
        let faultable = Faultable::new(&pool, driver).await;
        let stores = &faultable.stores;
        let id = stores.new_character("Aria").await;
        faultable.outage.cut();
        let loader = CharacterLoader::new(
            faultable.shard_stores.characters.clone().unwrap(),
            Some(stores.checkpoints.clone()),
            shardkeep_reference::game::ReferenceModel::handle(),
            Duration::from_secs(2),
        );
        let err = loader.claim_and_load(id, 0).await.unwrap_err();
        assert!(
            matches!(err, LoadError::Store { .. } | LoadError::Timeout(_)),
            "{err}"
        );
        let (_, epoch) = stores.characters.version_of(id).await.unwrap().unwrap();
        assert_eq!(epoch, 0, "nothing was claimed");
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn login_loads_the_row_when_redis_is_down(pool: PgPool) {
    use shardkeep::character::CharacterLoader;
    for driver in Driver::ALL {
        let (scene, checkpoints, outage) = faultable_checkpoints(&pool, driver).await;
        let stores = &scene.stores;
        let id = stores.new_character("Aria").await;
        outage.cut();
        let loader = CharacterLoader::new(
            stores.characters.clone(),
            Some(checkpoints),
            shardkeep_reference::game::ReferenceModel::handle(),
            Duration::from_secs(2),
        );
        let loaded = loader.claim_and_load(id, 0).await.unwrap();
        assert_eq!(loaded.source, LoadSource::Row);
        assert_eq!(loaded.snapshot.owner_epoch, 1);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_flush_conflict_makes_the_zone_redump_at_the_current_version(pool: PgPool) {
    for driver in Driver::ALL {
        let Scene {
            stores,
            keep: _keep,
            ..
        } = Scene::new(&pool, driver).await;
        let id = stores.new_character("Aria").await;
        // No cadence saves: only the flush below may write, so the versions are exact.
        let mut config = ShardConfig::new("shard-a", "zone-0");
        config.flush_pulses = 1_000_000;
        config.checkpoint_pulses = 1_000_000;
        let mut shard = boot_with(stores.shard_stores(), &stores, config, &[0], 1);
        login(&stores, &mut shard, id, "s").await;
        // Another legitimate writer of the same epoch (a recovered job) moves the row on.
        let mut external = stores.characters.load(id).await.unwrap().unwrap();
        external.state = json!({ "by": "job" }).into();
        assert_eq!(
            stores.characters.save(&external).await.unwrap(),
            SaveOutcome::Saved(1)
        );
        shard.player_mut(id).unwrap().character.currency = 88;
        shard.save_one(id, SaveReason::Flush);
        pump_until(&mut shard, Duration::from_secs(5), |s| {
            s.player(id).is_some_and(|p| p.character.state_version == 2)
        })
        .await;
        let row = stores.characters.load(id).await.unwrap().unwrap();
        assert_eq!(
            (row.state_version, row.state["currency"].clone()),
            (2, json!(88))
        );
        assert!(shard.saver().stats().row_conflicts >= 1);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_final_flush_conflict_for_a_departed_player_rebases_and_lands(pool: PgPool) {
    for driver in Driver::ALL {
        let Scene {
            stores,
            keep: _keep,
            ..
        } = Scene::new(&pool, driver).await;
        let id = stores.new_character("Aria").await;
        let mut shard = boot(&stores, "shard-a", &[0], 1);
        login(&stores, &mut shard, id, "s").await;
        let mut external = stores.characters.load(id).await.unwrap().unwrap();
        external.state = json!({ "by": "job" }).into();
        stores.characters.save(&external).await.unwrap();
        shard.player_mut(id).unwrap().character.currency = 66;
        shard.logout(id).unwrap();
        assert_eq!(
            shard.saver().barrier(BARRIER).await,
            BarrierOutcome::Drained
        );
        let row = stores.characters.load(id).await.unwrap().unwrap();
        assert_eq!(
            (row.state_version, row.state["currency"].clone()),
            (2, json!(66))
        );
        let stats = shard.saver().stats();
        assert_eq!(
            (stats.row_conflicts, stats.row_landed, stats.final_dropped),
            (1, 1, 0)
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_final_flush_out_of_retries_is_dropped_and_said_so(pool: PgPool) {
    for driver in Driver::ALL {
        let Scene {
            stores,
            keep: _keep,
            ..
        } = Scene::new(&pool, driver).await;
        let id = stores.new_character("Aria").await;
        let mut config = ShardConfig::new("shard-a", "zone-0");
        config.saver.final_retries = 0;
        let mut shard = boot_with(stores.shard_stores(), &stores, config, &[0], 1);
        login(&stores, &mut shard, id, "s").await;
        let external = stores.characters.load(id).await.unwrap().unwrap();
        stores.characters.save(&external).await.unwrap();
        shard.logout(id).unwrap();
        assert_eq!(
            shard.saver().barrier(BARRIER).await,
            BarrierOutcome::Drained
        );
        assert_eq!(shard.saver().stats().final_dropped, 1);
        shard.tick();
        assert!(shard.take_saver_events().iter().any(|e| matches!(
            e,
            shardkeep::saver::SaverEvent::FinalDropped { character_id, .. } if *character_id == id
        )));
        assert_eq!(
            stores
                .characters
                .load(id)
                .await
                .unwrap()
                .unwrap()
                .state_version,
            1
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn zones_repop_at_boot_and_on_the_repop_timer(pool: PgPool) {
    for driver in Driver::ALL {
        let Scene {
            stores,
            keep: _keep,
            ..
        } = Scene::new(&pool, driver).await;
        let mut shard = boot(&stores, "shard-a", &[0], 1);
        let floor = |s: &shardkeep_reference::shard::Shard| {
            s.zones()
                .find(|z| z.def.id == "zone-0")
                .unwrap()
                .entities
                .floor
                .len()
        };
        assert_eq!(
            floor(&shard),
            3,
            "boot spawned the chest and two heaps of ore"
        );
        shard.zone_mut("zone-0").unwrap().entities.floor.pop();
        for _ in 0..239 {
            shard.tick();
        }
        assert_eq!(floor(&shard), 2);
        shard.tick();
        assert_eq!(floor(&shard), 3, "the repop pulse topped the zone up");
        for _ in 0..240 {
            shard.tick();
        }
        assert_eq!(floor(&shard), 3, "a full zone stays as it is");
    }
}
