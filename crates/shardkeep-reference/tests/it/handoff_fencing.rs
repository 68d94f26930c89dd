//! A handoff carries the epoch its snapshot was dumped under; a destination adopts the carried
//! content only when that copy is still the row's owner, and otherwise loads the freshest
//! durable copy, so a zombie's handoff can never replace the live owner.

use std::time::Duration;

use shardkeep::character::{HandoffLoad, HandoffPayload, LoadSource};
use shardkeep::drain::BarrierOutcome;
use shardkeep::saver::SaveReason;
use shardkeep_reference::shard::{Arrival, WalkOutcome};
use shardkeep_testkit::TestRedis;
use sqlx::PgPool;

use crate::scene::{Driver, Scene};
use crate::support::{Stores, boot, login};

const BARRIER: Duration = Duration::from_secs(5);

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_handoff_from_a_superseded_copy_is_refused_and_the_live_copy_loads(pool: PgPool) {
    let redis = TestRedis::new().await;
    let sqlite = shardkeep_testkit::TestSqlite::new().await;
    for stores in [
        Stores::new(&pool, redis.backend()),
        Stores::embedded(&sqlite),
    ] {
        let id = stores.new_character("Aria").await;
        // Split brain over zone-0: the zombie logged in first, the live owner since.
        let mut zombie = boot(&stores, "shard-z", &[0], 2);
        let mut live = boot(&stores, "shard-l", &[0], 2);
        login(&stores, &mut zombie, id, "s-old").await;
        login(&stores, &mut live, id, "s-new").await;
        live.player_mut(id).unwrap().character.currency = 500;
        assert!(live.save_one(id, SaveReason::Flush));
        assert_eq!(live.saver().barrier(BARRIER).await, BarrierOutcome::Drained);
        // The zombie inflates its copy and walks east, handing the player off to zone-1's shard.
        zombie.player_mut(id).unwrap().character.currency = 9_999;
        let WalkOutcome::Handoff(handoff) = zombie.walk(id, "east").unwrap() else {
            panic!("zone-1 is not hosted by the zombie's shard");
        };
        let payload = HandoffPayload::new(handoff.snapshot);
        assert_eq!(payload.dumped_under_epoch, 1);
        let stored = payload.encode().unwrap();
        let carried = HandoffPayload::decode(&stored).unwrap();
        let load = stores
            .loader()
            .claim_for_handoff(carried.clone(), "h-zombie", 1)
            .await
            .unwrap();
        let HandoffLoad::Superseded {
            dumped_under_epoch,
            owner_epoch,
            loaded,
        } = load
        else {
            panic!("the destination adopted a superseded copy's content: {load:?}");
        };
        assert_eq!((dumped_under_epoch, owner_epoch), (1, 2));
        assert_eq!(
            loaded.snapshot.state["currency"], 500,
            "the live copy's content"
        );
        assert_eq!(loaded.snapshot.owner_epoch, 3);
        assert_ne!(loaded.source, LoadSource::Handoff);
        // The destination holds it now; the former live copy is fenced at its next save.
        let mut destination = boot(&stores, "shard-d", &[1], 2);
        destination
            .admit(
                loaded,
                Arrival::Handoff {
                    handoff_token: "h-zombie".into(),
                },
            )
            .unwrap();
        destination.redial("h-zombie", "s-d").unwrap();
        assert_eq!(destination.player(id).unwrap().character.currency, 500);
        live.player_mut(id).unwrap().character.currency = 501;
        assert!(live.save_one(id, SaveReason::Flush));
        live.saver().barrier(BARRIER).await;
        live.tick();
        assert!(
            live.player(id).is_none(),
            "the former live copy was evicted"
        );
        // A retry of the refused claim (its reply lost) is refused again.
        let again = stores
            .loader()
            .claim_for_handoff(carried, "h-zombie", 1)
            .await
            .unwrap();
        assert!(again.is_superseded());
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_handoff_claim_retried_after_a_lost_reply_is_still_adopted(pool: PgPool) {
    let redis = TestRedis::new().await;
    let sqlite = shardkeep_testkit::TestSqlite::new().await;
    for stores in [
        Stores::new(&pool, redis.backend()),
        Stores::embedded(&sqlite),
    ] {
        let id = stores.new_character("Aria").await;
        let mut source = boot(&stores, "shard-a", &[0], 2);
        login(&stores, &mut source, id, "s1").await;
        source.player_mut(id).unwrap().character.currency = 31;
        let WalkOutcome::Handoff(handoff) = source.walk(id, "east").unwrap() else {
            panic!("zone-1 is on another shard");
        };
        let carried = HandoffPayload::new(handoff.snapshot);
        // The first claim lands but its reply is lost: the destination never learns its epoch.
        let first = stores
            .loader()
            .claim_for_handoff(carried.clone(), "h-1", 1)
            .await
            .unwrap();
        assert!(!first.is_superseded());
        let retried = stores
            .loader()
            .claim_for_handoff(carried.clone(), "h-1", 1)
            .await
            .unwrap();
        let HandoffLoad::Adopted(loaded) = retried else {
            panic!("a retry of this handoff's own claim must adopt it: {retried:?}");
        };
        assert_eq!(loaded.snapshot.state["currency"], 31);
        assert_eq!(loaded.snapshot.owner_epoch, 3);
        // Another handoff token carrying the same (now superseded) copy is refused.
        assert!(
            stores
                .loader()
                .claim_for_handoff(carried, "h-2", 1)
                .await
                .unwrap()
                .is_superseded()
        );
    }
}

#[test]
fn a_payload_whose_stated_epoch_is_not_its_snapshots_is_refused() {
    let snapshot = shardkeep::character::CharacterSnapshot {
        character_id: uuid::Uuid::nil(),
        account_id: uuid::Uuid::nil(),
        name: "Aria".into(),
        zone_ref: None,
        room_ref: None,
        state: serde_json::json!({}).into(),
        chargen: None,
        state_version: 0,
        owner_epoch: 4,
        issue_mark: 0,
        schema_version: 1,
    };
    let mut payload = HandoffPayload::new(snapshot);
    payload.dumped_under_epoch = 5;
    assert!(HandoffPayload::decode(&payload.encode().unwrap()).is_err());
}

/// A handoff carries the character as of the shard's pulse: timers that lag while nothing wakes
/// the player are caught up before the dump, as they are for every save.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_handoff_carries_the_timers_as_of_the_current_pulse(pool: PgPool) {
    for driver in Driver::ALL {
        let Scene {
            stores,
            keep: _keep,
            ..
        } = Scene::new(&pool, driver).await;
        let id = stores.new_character("Aria").await;
        let mut source = boot(&stores, "shard-a", &[0], 2);
        login(&stores, &mut source, id, "s1").await;
        source.player_mut(id).unwrap().character.affects.push(
            shardkeep_reference::game::state::Affect {
                name: "haste".into(),
                remaining_pulses: 100,
                attribute_mods: Default::default(),
                pool_mods: Default::default(),
            },
        );
        for _ in 0..5 {
            source.tick();
        }
        let WalkOutcome::Handoff(handoff) = source.walk(id, "east").unwrap() else {
            panic!("zone-1 belongs to another shard");
        };
        let affects = &handoff.snapshot.state["affects"];
        assert_eq!(affects[0]["name"], "haste");
        assert_eq!(affects[0]["remaining_pulses"], 95, "{affects}");
    }
}
