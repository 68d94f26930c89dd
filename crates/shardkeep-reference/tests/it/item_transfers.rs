//! Cross-character item moves: drops, pickups and containers as audited transfers, and the
//! fences that keep a zombie's or a rolled-back copy's phantom out of another row.

use std::time::Duration;

use serde_json::json;
use shardkeep::audit::AuditEvent;
use shardkeep::drain::BarrierOutcome;
use shardkeep_reference::game::Item;
use shardkeep_reference::shard::ActionError;
use shardkeep_testkit::{JobDriver, TestRedis};
use sqlx::PgPool;
use uuid::Uuid;

use crate::faultable::Faultable;
use crate::scene::{Driver, Keep, Scene};
use crate::support::{Stores, boot, login};

pub(crate) struct Room {
    pub(crate) stores: Stores,
    pub(crate) shard: shardkeep_reference::shard::Shard,
    pub(crate) a: Uuid,
    pub(crate) b: Uuid,
    /// The rows underneath, to read back.
    pub(crate) rows: JobDriver,
    /// Kept alive for the whole test (see [`Keep`]).
    pub(crate) _keep: Keep,
}

/// Aria and Bran logged in on one shard over fresh stores of `driver`.
pub(crate) async fn two_players(pool: &PgPool, driver: Driver) -> Room {
    let Scene { stores, rows, keep } = Scene::new(pool, driver).await;
    let a = stores.new_character("Aria").await;
    let b = stores.new_character("Bran").await;
    let mut shard = boot(&stores, "shard-a", &[0], 1);
    login(&stores, &mut shard, a, "sa").await;
    login(&stores, &mut shard, b, "sb").await;
    Room {
        stores,
        shard,
        a,
        b,
        rows,
        _keep: keep,
    }
}

pub(crate) fn gem(shard: &mut shardkeep_reference::shard::Shard, owner: Uuid) -> Uuid {
    let proto = shard.catalog().get("gem").unwrap().clone();
    let item = Item::spawn(&proto);
    let id = item.id.unwrap();
    shard
        .player_mut(owner)
        .unwrap()
        .character
        .inventory
        .push(item);
    id
}

/// The item transfers on the audit trail: subject, actor and payload, in the order recorded.
pub(crate) async fn transfers(rows: &JobDriver) -> Vec<(Uuid, Option<Uuid>, serde_json::Value)> {
    rows.fetch_all(
        "SELECT subject_id, actor_id, payload FROM character_audit
          WHERE event_kind = 'item_transferred' ORDER BY seq",
        None,
    )
    .await
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn drop_then_get_by_another_player_is_a_transfer(pool: PgPool) {
    for driver in Driver::ALL {
        let Room {
            mut shard,
            a,
            b,
            _keep,
            rows,
            ..
        } = two_players(&pool, driver).await;
        let item = gem(&mut shard, a);
        shard.drop_item(a, item).unwrap();
        let event = shard.get_item(b, item).unwrap().expect("a transfer");
        assert_eq!((event.subject_id, event.actor_id), (b, Some(a)));
        assert!(
            shard
                .player(b)
                .unwrap()
                .character
                .inventory
                .iter()
                .all(|i| i.id != Some(item)),
            "held by neither until committed"
        );
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        let rows = transfers(&rows).await;
        assert_eq!(rows.len(), 1);
        let (subject, actor, payload) = &rows[0];
        assert_eq!((*subject, *actor), (b, Some(a)));
        assert_eq!(payload["item_ref"], "gem");
        assert_eq!(payload["item_id"], json!(item));
        assert_eq!(payload["stack"], 1);
        assert_eq!(
            (
                payload["acquirer_name"].clone(),
                payload["releaser_name"].clone()
            ),
            (json!("Bran"), json!("Aria"))
        );
        assert_eq!(payload["room"], "r0");
        assert!(
            shard
                .player(b)
                .unwrap()
                .character
                .inventory
                .iter()
                .any(|i| i.id == Some(item))
        );
    }
}

/// An item put down decays after the shard's floor lifetime — on the floor or in a container
/// lying there — and is reported as destroyed; what the zone spawned itself stays.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn put_down_items_decay_after_the_floor_lifetime(pool: PgPool) {
    let redis = TestRedis::new().await;
    let sqlite = shardkeep_testkit::TestSqlite::new().await;
    for stores in [
        Stores::new(&pool, redis.backend()),
        Stores::embedded(&sqlite),
    ] {
        let a = stores.new_character("Aria").await;
        let mut config = shardkeep_reference::shard::ShardConfig::new("shard-a", "zone-0");
        config.floor_lifetime_pulses = Some(60);
        let mut shard = crate::support::boot_with(stores.shard_stores(), &stores, config, &[0], 1);
        login(&stores, &mut shard, a, "sa").await;
        let floor_ids = |shard: &shardkeep_reference::shard::Shard| -> Vec<Uuid> {
            let mut ids = Vec::new();
            for zone in shard.zones() {
                for floor in &zone.entities.floor {
                    floor.item.walk(&mut |i| ids.extend(i.id));
                }
            }
            ids
        };
        let spawned = floor_ids(&shard);
        // To the chest the zone spawned in r2.
        shard.walk(a, "north").unwrap();
        shard.walk(a, "north").unwrap();
        let container = shard
            .zones()
            .flat_map(|z| z.entities.floor.iter())
            .find(|f| f.item.proto.proto_ref == "chest")
            .and_then(|f| f.item.id)
            .expect("zone 0 spawns a chest");
        let (dropped, put) = (gem(&mut shard, a), gem(&mut shard, a));
        shard.drop_item(a, dropped).unwrap();
        shard.put_item(a, put, container).unwrap();
        for _ in 0..40 {
            shard.tick();
        }
        assert!(shard.take_decayed_items().is_empty(), "too early");
        let ids = floor_ids(&shard);
        assert!(ids.contains(&dropped) && ids.contains(&put));
        for _ in 0..40 {
            shard.tick();
        }
        let mut decayed = shard.take_decayed_items();
        decayed.sort();
        let mut expected = vec![dropped, put];
        expected.sort();
        assert_eq!(decayed, expected);
        let ids = floor_ids(&shard);
        assert!(
            !ids.contains(&dropped) && !ids.contains(&put),
            "gone from the floor"
        );
        assert!(
            spawned.iter().all(|id| ids.contains(id)),
            "the zone's own items stay"
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn put_then_get_from_a_container_is_a_transfer(pool: PgPool) {
    for driver in Driver::ALL {
        let Room {
            mut shard,
            a,
            b,
            _keep,
            ..
        } = two_players(&pool, driver).await;
        // Both walk to the chest the zone spawned in r2.
        shard.walk(a, "north").unwrap();
        shard.walk(a, "north").unwrap();
        shard.walk(b, "north").unwrap();
        shard.walk(b, "north").unwrap();
        let chest = shard
            .zones()
            .find(|z| z.def.id == "zone-0")
            .unwrap()
            .entities
            .floor
            .iter()
            .find(|f| f.item.proto.proto_ref == "chest")
            .unwrap()
            .item
            .id
            .unwrap();
        let item = gem(&mut shard, a);
        shard.put_item(a, item, chest).unwrap();
        let event = shard
            .get_from_container(b, chest, item)
            .unwrap()
            .expect("a transfer");
        assert_eq!((event.subject_id, event.actor_id), (b, Some(a)));
        assert_eq!(event.payload["room"], "r2");
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn self_pickups_reset_spawns_and_engine_moves_record_nothing(pool: PgPool) {
    for driver in Driver::ALL {
        let Room {
            mut shard,
            a,
            b,
            _keep,
            rows,
            ..
        } = two_players(&pool, driver).await;
        // Self-pickup.
        let item = gem(&mut shard, a);
        shard.drop_item(a, item).unwrap();
        assert!(shard.get_item(a, item).unwrap().is_none());
        // A floor item no player released (the zone's ore in r3).
        shard.walk(b, "south").unwrap();
        let ore = shard
            .zones()
            .find(|z| z.def.id == "zone-0")
            .unwrap()
            .entities
            .floor
            .iter()
            .find(|f| f.item.proto.proto_ref == "ore")
            .unwrap()
            .item
            .id
            .unwrap();
        assert!(shard.get_item(b, ore).unwrap().is_none());
        // Released by A, then moved by the engine into B's room: the marker is gone.
        let other = gem(&mut shard, a);
        shard.drop_item(a, other).unwrap();
        shard.engine_move("zone-0", other, "r3").unwrap();
        assert!(shard.get_item(b, other).unwrap().is_none());
        shard.auditor().barrier(Duration::from_secs(5)).await;
        assert!(transfers(&rows).await.is_empty());
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn the_marker_names_the_most_recent_release(pool: PgPool) {
    for driver in Driver::ALL {
        let Room {
            mut shard,
            a,
            b,
            stores,
            _keep,
            ..
        } = two_players(&pool, driver).await;
        let c = stores.new_character("Cade").await;
        login(&stores, &mut shard, c, "sc").await;
        let item = gem(&mut shard, a);
        shard.drop_item(a, item).unwrap();
        assert_eq!(shard.get_item(b, item).unwrap().unwrap().actor_id, Some(a));
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        shard.drop_item(b, item).unwrap();
        assert_eq!(
            shard.get_item(c, item).unwrap().unwrap().actor_id,
            Some(b),
            "pickup cleared A's marker"
        );
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        assert_eq!(shard.transfer_counts(), (2, 0));
        assert!(
            shard
                .player(c)
                .unwrap()
                .character
                .inventory
                .iter()
                .any(|i| i.id == Some(item))
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn bound_items_cannot_cross_owners(pool: PgPool) {
    for driver in Driver::ALL {
        let Room {
            mut shard,
            a,
            _keep,
            ..
        } = two_players(&pool, driver).await;
        let proto = shard.catalog().get("amulet").unwrap().clone();
        let amulet = Item::spawn(&proto);
        let id = amulet.id.unwrap();
        shard
            .player_mut(a)
            .unwrap()
            .character
            .inventory
            .push(amulet.clone());
        // Bind on pickup: A drops its unbound amulet and picks it up again.
        shard.drop_item(a, id).unwrap();
        shard.get_item(a, id).unwrap();
        assert_eq!(shard.drop_item(a, id), Err(ActionError::Bound(id)));
        assert!(
            shard
                .player(a)
                .unwrap()
                .character
                .inventory
                .iter()
                .any(|i| i.id == Some(id))
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_storeless_shard_records_nothing_and_still_works(pool: PgPool) {
    use shardkeep::character::{CharacterSnapshot, LoadSource, LoadedCharacter};
    use shardkeep_reference::game::{Catalog, reference_world};
    use shardkeep_reference::shard::{Arrival, Shard, ShardConfig, ShardStores, ZoneDirectory};
    use std::sync::Arc;
    let mut shard = Shard::boot(
        ShardConfig::new("bare", "zone-0"),
        reference_world(1),
        Arc::new(Catalog::reference()),
        ShardStores::default(),
        ZoneDirectory::new(),
    );
    let mut ids = Vec::new();
    for name in ["Eph", "Emer"] {
        let id = Uuid::now_v7();
        let snapshot = CharacterSnapshot {
            character_id: id,
            account_id: Uuid::nil(),
            name: name.into(),
            zone_ref: None,
            room_ref: None,
            state: json!({}).into(),
            chargen: None,
            state_version: 0,
            owner_epoch: 0,
            issue_mark: 0,
            schema_version: 1,
        };
        shard
            .admit(
                LoadedCharacter {
                    snapshot,
                    source: LoadSource::Row,
                    brand_new: true,
                    origin: Default::default(),
                },
                Arrival::Login {
                    session_token: name.into(),
                },
            )
            .unwrap();
        ids.push(id);
    }
    let item = gem(&mut shard, ids[0]);
    shard.drop_item(ids[0], item).unwrap();
    assert!(
        shard.get_item(ids[1], item).unwrap().is_none(),
        "ephemeral players record nothing"
    );
    assert!(shard.die(ids[0], None).unwrap().is_some());
    assert_eq!(shard.auditor().stats(), Default::default());
    assert_eq!(
        shard.auditor().barrier(Duration::from_secs(1)).await,
        BarrierOutcome::Drained
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM character_audit")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_transfer_commits_both_rows_and_its_audit_row_together(pool: PgPool) {
    for driver in Driver::ALL {
        let Room {
            mut shard,
            a,
            b,
            stores,
            _keep,
            ..
        } = two_players(&pool, driver).await;
        let item = gem(&mut shard, a);
        shard.save_one(a, shardkeep::saver::SaveReason::Flush);
        shard.saver().barrier(Duration::from_secs(5)).await;
        shard.tick();
        let holds = |state: &serde_json::Value| state.to_string().contains(&item.to_string());
        assert!(holds(
            &stores.characters.load(a).await.unwrap().unwrap().state
        ));
        shard.drop_item(a, item).unwrap();
        shard.get_item(b, item).unwrap();
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        assert_eq!(shard.transfer_counts(), (1, 0));
        assert!(
            !holds(&stores.characters.load(a).await.unwrap().unwrap().state),
            "the releaser's row lost it"
        );
        assert!(
            holds(&stores.characters.load(b).await.unwrap().unwrap().state),
            "the acquirer's row holds it"
        );
        // The live copies carry the new row versions: their next flushes land without a conflict.
        shard.save_one(a, shardkeep::saver::SaveReason::Flush);
        shard.save_one(b, shardkeep::saver::SaveReason::Flush);
        shard.saver().barrier(Duration::from_secs(5)).await;
        assert_eq!(shard.saver().stats().row_conflicts, 0);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_zombies_released_item_never_reaches_another_row(pool: PgPool) {
    for driver in Driver::ALL {
        let Room {
            mut shard,
            a,
            b,
            stores,
            _keep,
            rows,
            ..
        } = two_players(&pool, driver).await;
        let item = gem(&mut shard, a);
        shard.save_one(a, shardkeep::saver::SaveReason::Flush);
        shard.saver().barrier(Duration::from_secs(5)).await;
        shard.tick();
        // A is claimed elsewhere: this copy is now a zombie that externalizes its gem.
        stores.characters.claim(a, 0).await.unwrap();
        shard.drop_item(a, item).unwrap();
        shard.get_item(b, item).unwrap();
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        assert_eq!(shard.transfer_counts(), (0, 1));
        let holds = |state: &serde_json::Value| state.to_string().contains(&item.to_string());
        assert!(!holds(
            &stores.characters.load(b).await.unwrap().unwrap().state
        ));
        assert!(
            holds(&stores.characters.load(a).await.unwrap().unwrap().state),
            "the live owner's row keeps it"
        );
        assert!(
            !shard
                .player(a)
                .unwrap()
                .character
                .inventory
                .iter()
                .any(|i| i.id == Some(item)),
            "not handed back to the zombie"
        );
        assert_eq!(
            shard.take_voided_items(),
            vec![item],
            "voided, and recorded"
        );
        assert!(
            transfers(&rows).await.is_empty(),
            "no audit row for a transfer that did not happen"
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_item_of_a_departed_releaser_leaves_its_row_on_pickup(pool: PgPool) {
    for driver in Driver::ALL {
        let Room {
            mut shard,
            a,
            b,
            stores,
            _keep,
            ..
        } = two_players(&pool, driver).await;
        let item = gem(&mut shard, a);
        shard.save_one(a, shardkeep::saver::SaveReason::Flush);
        shard.saver().barrier(Duration::from_secs(5)).await;
        shard.tick();
        shard.drop_item(a, item).unwrap();
        // A leaves; its final flush is lost, so its row still holds the gem.
        shard.saver().abort();
        shard.logout(a).unwrap();
        let holds = |state: &serde_json::Value| state.to_string().contains(&item.to_string());
        assert!(holds(
            &stores.characters.load(a).await.unwrap().unwrap().state
        ));
        shard.get_item(b, item).unwrap();
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        assert!(
            !holds(&stores.characters.load(a).await.unwrap().unwrap().state),
            "taken out of the departed row"
        );
        assert!(holds(
            &stores.characters.load(b).await.unwrap().unwrap().state
        ));
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_phantom_dropped_by_a_departed_zombie_is_voided_not_transferred(pool: PgPool) {
    for driver in Driver::ALL {
        let Room {
            mut shard,
            a,
            b,
            stores,
            _keep,
            rows,
            ..
        } = two_players(&pool, driver).await;
        let item = gem(&mut shard, a);
        shard.save_one(a, shardkeep::saver::SaveReason::Flush);
        shard.saver().barrier(Duration::from_secs(5)).await;
        shard.tick();
        // A is claimed elsewhere (the new owner loads the gem from the row); this copy drops its
        // phantom and leaves before anyone notices it is a zombie.
        stores.characters.claim(a, 0).await.unwrap();
        shard.drop_item(a, item).unwrap();
        shard.saver().abort();
        shard.logout(a).unwrap();
        shard.get_item(b, item).unwrap();
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        assert_eq!(shard.transfer_counts(), (0, 1));
        assert_eq!(shard.take_voided_items(), vec![item]);
        let holds = |state: &serde_json::Value| state.to_string().contains(&item.to_string());
        assert!(holds(
            &stores.characters.load(a).await.unwrap().unwrap().state
        ));
        assert!(!holds(
            &stores.characters.load(b).await.unwrap().unwrap().state
        ));
        let b_entry = shard.player(b).unwrap();
        assert!(
            !b_entry
                .character
                .inventory
                .iter()
                .any(|i| i.id == Some(item))
        );
        assert!(transfers(&rows).await.is_empty());
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_item_no_row_holds_transfers_even_after_its_releaser_moved_on(pool: PgPool) {
    for driver in Driver::ALL {
        let Room {
            mut shard,
            a,
            b,
            stores,
            _keep,
            rows,
            ..
        } = two_players(&pool, driver).await;
        // Never flushed: the only copy of the gem is the one A drops.
        let item = gem(&mut shard, a);
        stores.characters.claim(a, 0).await.unwrap();
        shard.drop_item(a, item).unwrap();
        shard.saver().abort();
        shard.logout(a).unwrap();
        shard.get_item(b, item).unwrap();
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        assert_eq!(shard.transfer_counts(), (1, 0));
        let holds = |state: &serde_json::Value| state.to_string().contains(&item.to_string());
        assert!(holds(
            &stores.characters.load(b).await.unwrap().unwrap().state
        ));
        assert_eq!(transfers(&rows).await.len(), 1);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_evicted_zombies_floor_items_are_voided(pool: PgPool) {
    for driver in Driver::ALL {
        let Room {
            mut shard,
            a,
            b,
            stores,
            _keep,
            ..
        } = two_players(&pool, driver).await;
        let item = gem(&mut shard, a);
        shard.save_one(a, shardkeep::saver::SaveReason::Flush);
        shard.saver().barrier(Duration::from_secs(5)).await;
        shard.tick();
        stores.characters.claim(a, 0).await.unwrap();
        shard.drop_item(a, item).unwrap();
        // The zombie's next flush is fenced and the copy is evicted with what it released.
        shard.save_one(a, shardkeep::saver::SaveReason::Flush);
        shard.saver().barrier(Duration::from_secs(5)).await;
        shard.tick();
        assert_eq!(shard.take_evictions().len(), 1);
        let voided = shard.take_voided_items();
        assert!(
            voided.contains(&item),
            "what it released, and what it held, leave with it: {voided:?}"
        );
        assert_eq!(
            shard.get_item(b, item),
            Err(shardkeep_reference::shard::ActionError::NoSuchItem(item))
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_transfer_dumps_again_after_a_write_of_the_same_owner(pool: PgPool) {
    for driver in Driver::ALL {
        let Room {
            mut shard,
            a,
            b,
            stores,
            _keep,
            ..
        } = two_players(&pool, driver).await;
        let item = gem(&mut shard, a);
        // A journal location write lands for both: their live versions are now behind their rows.
        for id in [a, b] {
            let epoch = shard.player(id).unwrap().character.owner_epoch;
            stores
                .characters
                .write_location(id, epoch, "zone-0", "r1")
                .await
                .unwrap();
        }
        shard.drop_item(a, item).unwrap();
        shard.get_item(b, item).unwrap();
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        assert_eq!(
            shard.transfer_counts(),
            (1, 0),
            "the live copies adopt the versions and dump again"
        );
        let holds = |state: &serde_json::Value| state.to_string().contains(&item.to_string());
        assert!(holds(
            &stores.characters.load(b).await.unwrap().unwrap().state
        ));
        // The live copies carry the versions of the transfer: their next flushes land cleanly.
        shard.save_one(a, shardkeep::saver::SaveReason::Flush);
        shard.save_one(b, shardkeep::saver::SaveReason::Flush);
        shard.saver().barrier(Duration::from_secs(5)).await;
        assert_eq!(shard.saver().stats().row_conflicts, 0);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn one_transfer_at_a_time_per_character(pool: PgPool) {
    for driver in Driver::ALL {
        let Room {
            mut shard,
            a,
            b,
            _keep,
            ..
        } = two_players(&pool, driver).await;
        let first = gem(&mut shard, a);
        let second = gem(&mut shard, a);
        shard.drop_item(a, first).unwrap();
        shard.drop_item(a, second).unwrap();
        shard.get_item(b, first).unwrap();
        assert_eq!(
            shard.get_item(b, second),
            Err(shardkeep_reference::shard::ActionError::TransferPending(b))
        );
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        assert!(
            shard.get_item(b, second).unwrap().is_some(),
            "the item stayed on the floor and transfers once the first settled"
        );
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        assert_eq!(shard.transfer_counts(), (2, 0));
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_releaser_that_handed_off_still_gives_up_its_item(pool: PgPool) {
    for driver in Driver::ALL {
        let Room {
            mut shard,
            a,
            b,
            stores,
            _keep,
            ..
        } = two_players(&pool, driver).await;
        let item = gem(&mut shard, a);
        shard.save_one(a, shardkeep::saver::SaveReason::Flush);
        shard.saver().barrier(Duration::from_secs(5)).await;
        shard.tick();
        let epoch = shard.player(a).unwrap().character.owner_epoch;
        shard.drop_item(a, item).unwrap();
        // A walks to another shard: the destination's claim continues A's lineage (its carried
        // snapshot descends from the copy that dropped the gem); the row still holds the gem.
        shard.saver().abort();
        shard.logout(a).unwrap();
        stores
            .characters
            .claim_for_handoff(a, epoch, epoch, "h-1")
            .await
            .unwrap();
        shard.get_item(b, item).unwrap();
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        assert_eq!(shard.transfer_counts(), (1, 0));
        assert!(shard.take_voided_items().is_empty());
        let holds = |state: &serde_json::Value| state.to_string().contains(&item.to_string());
        assert!(!holds(
            &stores.characters.load(a).await.unwrap().unwrap().state
        ));
        assert!(holds(
            &stores.characters.load(b).await.unwrap().unwrap().state
        ));
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_transfer_commit_retried_after_a_lost_reply_is_not_applied_twice(pool: PgPool) {
    use shardkeep::character::{Releaser, TransferCommit};
    for driver in Driver::ALL {
        let Scene {
            stores,
            rows,
            keep: _keep,
        } = Scene::new(&pool, driver).await;
        let a = stores.new_character("Aria").await;
        let b = stores.new_character("Bran").await;
        let mut releaser = stores.characters.load(a).await.unwrap().unwrap();
        let mut acquirer = stores.characters.load(b).await.unwrap().unwrap();
        let item = Uuid::now_v7();
        releaser.state = json!({}).into();
        acquirer.state = json!({ "inventory": [{ "proto": "gem", "id": item }] }).into();
        let event = AuditEvent::item_transferred(b, a, Uuid::now_v7(), json!({ "item_id": item }));
        let first = stores
            .characters
            .commit_transfer(
                &shardkeep_reference::game::ReferenceModel::handle(),
                Releaser::Held {
                    snapshot: &releaser,
                    item_id: Some(item),
                    released_epoch: 0,
                },
                &acquirer,
                &event,
            )
            .await
            .unwrap();
        assert!(
            matches!(first, TransferCommit::Committed { .. }),
            "{first:?}"
        );
        // The reply was lost: the shard tries again with the same transfer.
        let again = stores
            .characters
            .commit_transfer(
                &shardkeep_reference::game::ReferenceModel::handle(),
                Releaser::Held {
                    snapshot: &releaser,
                    item_id: Some(item),
                    released_epoch: 0,
                },
                &acquirer,
                &event,
            )
            .await
            .unwrap();
        assert_eq!(again, TransferCommit::AlreadyCommitted);
        assert_eq!(transfers(&rows).await.len(), 1);
        let version = stores.characters.version_of(b).await.unwrap().unwrap().0;
        assert_eq!(version, 1, "written once");
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_transfer_whose_outcome_stays_unknown_voids_the_item_on_the_record(pool: PgPool) {
    for driver in Driver::ALL {
        let faultable = Faultable::new(&pool, driver).await;
        let stores = &faultable.stores;
        // Only the rows' path is cut (on the embedded file the checkpoints stay on the test's own
        // connection, so the outage reaches the commit alone as it does on Postgres).
        let mut shard_stores = stores.shard_stores();
        shard_stores.characters = faultable.shard_stores.characters.clone();
        let mut config = shardkeep_reference::shard::ShardConfig::new("shard-a", "zone-0");
        config.saver.io_timeout = Duration::from_millis(500);
        config.transfer_budget = Duration::from_secs(1);
        let mut shard = crate::support::boot_with(shard_stores, stores, config, &[0], 1);
        let a = stores.new_character("Aria").await;
        let b = stores.new_character("Bran").await;
        login(stores, &mut shard, a, "sa").await;
        login(stores, &mut shard, b, "sb").await;
        let item = gem(&mut shard, a);
        shard.drop_item(a, item).unwrap();
        faultable.outage.cut();
        shard.get_item(b, item).unwrap();
        assert!(shard.settle_transfers(Duration::from_secs(10)).await);
        assert_eq!(shard.transfer_counts(), (0, 1));
        assert_eq!(shard.take_voided_items(), vec![item]);
        for id in [a, b] {
            let inventory = &shard.player(id).unwrap().character.inventory;
            assert!(
                !inventory.iter().any(|i| i.id == Some(item)),
                "held by neither"
            );
        }
        faultable.outage.heal();
    }
}

/// Claims `id` and admits the row (or a fresher checkpoint) on `shard`: a copy rehydrated after
/// its previous one died.
pub(crate) async fn rehydrate(
    stores: &Stores,
    shard: &mut shardkeep_reference::shard::Shard,
    id: Uuid,
    session: &str,
) {
    let loaded = stores.loader().claim_and_load(id, 0).await.unwrap();
    shard
        .admit(
            loaded,
            shardkeep_reference::shard::Arrival::Login {
                session_token: session.into(),
            },
        )
        .unwrap();
}

/// Which of `ids` hold `item` in their stored rows.
pub(crate) async fn rows_holding(stores: &Stores, ids: &[Uuid], item: Uuid) -> Vec<Uuid> {
    let mut holding = Vec::new();
    for id in ids {
        let row = stores.characters.load(*id).await.unwrap().unwrap();
        let doc: shardkeep_reference::game::StateDocument = row.state.decode().unwrap();
        let mut doc = doc;
        if shardkeep_reference::game::state::remove_stored_item(&mut doc, item) {
            holding.push(*id);
        }
    }
    holding
}

/// A's gem is saved, then A drops it and its copy dies before a save records the drop.
pub(crate) async fn drop_then_crash(room: &mut Room) -> Uuid {
    let item = gem(&mut room.shard, room.a);
    room.shard
        .save_one(room.a, shardkeep::saver::SaveReason::Flush);
    room.shard.saver().barrier(Duration::from_secs(5)).await;
    room.shard.tick();
    room.shard.drop_item(room.a, item).unwrap();
    room.shard.saver().abort();
    room.shard.logout(room.a).unwrap();
    item
}

/// A comes back on another shard from the row, gem and all, and hands the gem to a new player,
/// Cato, there (committed): returns that shard and Cato.
pub(crate) async fn restored_elsewhere_hands_it_on(
    stores: &Stores,
    a: Uuid,
    item: Uuid,
) -> (shardkeep_reference::shard::Shard, Uuid) {
    let mut other = boot(stores, "shard-b", &[1], 2);
    let c = stores.new_character("Cato").await;
    login(stores, &mut other, c, "sc").await;
    rehydrate(stores, &mut other, a, "sa2").await;
    other.drop_item(a, item).unwrap();
    other.get_item(c, item).unwrap();
    assert!(other.settle_transfers(Duration::from_secs(5)).await);
    assert_eq!(other.transfer_counts(), (1, 0));
    (other, c)
}

/// A's gem is saved, A drops it, the drop is saved, and A logs out and back in: a copy that
/// never held the gem, beside the gem its earlier copy put down.
pub(crate) async fn saved_drop_then_relogin(room: &mut Room) -> Uuid {
    let (shard, a) = (&mut room.shard, room.a);
    let item = gem(shard, a);
    shard.save_one(a, shardkeep::saver::SaveReason::Flush);
    shard.saver().barrier(Duration::from_secs(5)).await;
    shard.tick();
    shard.drop_item(a, item).unwrap();
    shard.logout(a).unwrap();
    shard.saver().barrier(Duration::from_secs(5)).await;
    shard.tick();
    rehydrate(&room.stores, shard, a, "sa2").await;
    item
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_rolled_back_release_is_voided_once_the_restored_copy_moved_the_item_on(pool: PgPool) {
    for driver in Driver::ALL {
        let mut room = two_players(&pool, driver).await;
        let item = drop_then_crash(&mut room).await;
        let Room {
            mut shard,
            a,
            b,
            stores,
            rows,
            ..
        } = room;
        let (_other, c) = restored_elsewhere_hands_it_on(&stores, a, item).await;
        // The gem the crash rolled back still lies on the first shard's floor: a phantom now.
        shard.get_item(b, item).unwrap();
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        assert_eq!(shard.transfer_counts(), (0, 1));
        assert_eq!(shard.take_voided_items(), vec![item]);
        assert_eq!(rows_holding(&stores, &[a, b, c], item).await, vec![c]);
        assert_eq!(transfers(&rows).await.len(), 1, "only C's pickup moved it");
        assert!(
            !shard
                .player(b)
                .unwrap()
                .character
                .inventory
                .iter()
                .any(|i| i.id == Some(item))
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_rolled_back_release_is_voided_while_the_restored_copy_holds_the_item(pool: PgPool) {
    for driver in Driver::ALL {
        let mut room = two_players(&pool, driver).await;
        let item = drop_then_crash(&mut room).await;
        let Room {
            mut shard,
            a,
            b,
            stores,
            rows,
            ..
        } = room;
        // A comes back on the same shard, holding the gem again, while its old drop lies there.
        rehydrate(&stores, &mut shard, a, "sa2").await;
        assert!(
            shard
                .player(a)
                .unwrap()
                .character
                .inventory
                .iter()
                .any(|i| i.id == Some(item))
        );
        shard.get_item(b, item).unwrap();
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        assert_eq!(shard.transfer_counts(), (0, 1));
        assert_eq!(shard.take_voided_items(), vec![item]);
        assert_eq!(rows_holding(&stores, &[a, b], item).await, vec![a]);
        assert!(transfers(&rows).await.is_empty());
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_release_saved_before_a_relogin_still_transfers(pool: PgPool) {
    for driver in Driver::ALL {
        let mut room = two_players(&pool, driver).await;
        // A new lineage that never held the gem.
        let item = saved_drop_then_relogin(&mut room).await;
        let Room {
            mut shard,
            a,
            b,
            stores,
            _keep,
            ..
        } = room;
        shard.get_item(b, item).unwrap();
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        assert_eq!(shard.transfer_counts(), (1, 0));
        assert_eq!(rows_holding(&stores, &[a, b], item).await, vec![b]);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_held_releaser_still_holding_the_item_gives_nothing(pool: PgPool) {
    use shardkeep::character::{Releaser, TransferCommit};
    for driver in Driver::ALL {
        let Scene {
            stores,
            rows,
            keep: _keep,
        } = Scene::new(&pool, driver).await;
        let a = stores.new_character("Aria").await;
        let b = stores.new_character("Bran").await;
        let mut releaser = stores.characters.load(a).await.unwrap().unwrap();
        let mut acquirer = stores.characters.load(b).await.unwrap().unwrap();
        let item = Uuid::now_v7();
        releaser.state = json!({ "inventory": [{ "proto": "gem", "id": item }] }).into();
        acquirer.state = json!({ "inventory": [{ "proto": "gem", "id": item }] }).into();
        let event = AuditEvent::item_transferred(b, a, Uuid::now_v7(), json!({ "item_id": item }));
        let side = Releaser::Held {
            snapshot: &releaser,
            item_id: Some(item),
            released_epoch: 0,
        };
        let outcome = stores
            .characters
            .commit_transfer(
                &shardkeep_reference::game::ReferenceModel::handle(),
                side,
                &acquirer,
                &event,
            )
            .await
            .unwrap();
        assert!(
            matches!(outcome, TransferCommit::ReleaserSuperseded { .. }),
            "{outcome:?}"
        );
        // Released at epoch 1 but a copy loaded at 3 held it (the item-load ledger says so): also a
        // phantom, even without it now.
        releaser.state = json!({}).into();
        stores
            .characters
            .record_item_loads(a, 3, &[item])
            .await
            .unwrap();
        let side = Releaser::Held {
            snapshot: &releaser,
            item_id: Some(item),
            released_epoch: 1,
        };
        let outcome = stores
            .characters
            .commit_transfer(
                &shardkeep_reference::game::ReferenceModel::handle(),
                side,
                &acquirer,
                &event,
            )
            .await
            .unwrap();
        assert!(
            matches!(outcome, TransferCommit::ReleaserSuperseded { .. }),
            "{outcome:?}"
        );
        assert!(transfers(&rows).await.is_empty());
        assert_eq!(stores.characters.version_of(b).await.unwrap().unwrap().0, 0);
        // A garbled releaser document is refused with a clear error, and nothing is written.
        releaser.state = json!({ "inventory": "not a list" }).into();
        let side = Releaser::Held {
            snapshot: &releaser,
            item_id: Some(item),
            released_epoch: 1,
        };
        let err = stores
            .characters
            .commit_transfer(
                &shardkeep_reference::game::ReferenceModel::handle(),
                side,
                &acquirer,
                &event,
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("releaser state"), "{err}");
        assert!(transfers(&rows).await.is_empty());
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_copy_that_replaced_the_acquirer_is_not_handed_the_item_again(pool: PgPool) {
    for driver in Driver::ALL {
        let Room {
            mut shard,
            a,
            b,
            stores,
            _keep,
            rows,
            ..
        } = two_players(&pool, driver).await;
        let item = gem(&mut shard, a);
        shard.drop_item(a, item).unwrap();
        shard.get_item(b, item).unwrap();
        // The commit lands, but before the shard hears of it B's copy is replaced by one loaded
        // from the row, which holds the gem already.
        for _ in 0..100 {
            if !transfers(&rows).await.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(transfers(&rows).await.len(), 1);
        let loaded = stores.loader().claim_and_load(b, 0).await.unwrap();
        assert!(shard.evict_if_older(b, loaded.snapshot.owner_epoch));
        shard
            .admit(
                loaded,
                shardkeep_reference::shard::Arrival::Login {
                    session_token: "sb2".into(),
                },
            )
            .unwrap();
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        assert_eq!(shard.transfer_counts(), (1, 0));
        let mut held = Vec::new();
        for i in &shard.player(b).unwrap().character.inventory {
            i.walk(&mut |i| held.extend(i.id.filter(|id| *id == item)));
        }
        assert_eq!(held, vec![item], "once, from the row");
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_save_dumped_before_the_release_cannot_land_after_the_pickup(pool: PgPool) {
    use shardkeep::character::{Releaser, SaveOutcome, TransferCommit};
    let redis = TestRedis::new().await;
    let sqlite = shardkeep_testkit::TestSqlite::new().await;
    for stores in [
        Stores::new(&pool, redis.backend()),
        Stores::embedded(&sqlite),
    ] {
        let a = stores.new_character("Aria").await;
        let b = stores.new_character("Bran").await;
        let item = Uuid::now_v7();
        // A's flush, dumped while A still carried the gem, is still on its way.
        let mut late_flush = stores.characters.load(a).await.unwrap().unwrap();
        late_flush.state = json!({ "inventory": [{ "proto": "gem", "id": item }] }).into();
        let mut acquirer = stores.characters.load(b).await.unwrap().unwrap();
        acquirer.state = json!({ "inventory": [{ "proto": "gem", "id": item }] }).into();
        let event = AuditEvent::item_transferred(b, a, Uuid::now_v7(), json!({ "item_id": item }));
        let side = Releaser::Departed {
            character_id: a,
            item_id: item,
            released_epoch: late_flush.owner_epoch,
        };
        let outcome = stores
            .characters
            .commit_transfer(
                &shardkeep_reference::game::ReferenceModel::handle(),
                side,
                &acquirer,
                &event,
            )
            .await
            .unwrap();
        assert!(
            matches!(
                outcome,
                TransferCommit::Committed {
                    releaser_version: Some(1),
                    ..
                }
            ),
            "{outcome:?}"
        );
        assert_eq!(
            stores.characters.save(&late_flush).await.unwrap(),
            SaveOutcome::VersionConflict(1)
        );
        assert_eq!(rows_holding(&stores, &[a, b], item).await, vec![b]);
    }
}

/// A's copy flushed and checkpointed the gem, dropped it and left the shard; its final save was
/// lost with the shard. B picks the gem up: the commit takes it out of A's row. A's next login
/// must not choose the checkpoint dumped before the drop (same epoch, the version of A's last
/// live write) over the row the commit wrote — that would put the gem in both rows.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_departed_releasers_checkpoint_cannot_bring_a_taken_item_back(pool: PgPool) {
    use shardkeep::character::{Releaser, SaveOutcome, TransferCommit};
    let redis = TestRedis::new().await;
    let sqlite = shardkeep_testkit::TestSqlite::new().await;
    for stores in [
        Stores::new(&pool, redis.backend()),
        Stores::embedded(&sqlite),
    ] {
        let a = stores.new_character("Aria").await;
        let b = stores.new_character("Bran").await;
        let item = Uuid::now_v7();
        let mut copy = stores.loader().claim_and_load(a, 0).await.unwrap().snapshot;
        copy.state = json!({ "inventory": [{ "proto": "gem", "id": item }] }).into();
        let SaveOutcome::Saved(version) = stores.characters.save(&copy).await.unwrap() else {
            panic!("the flush did not land");
        };
        copy.state_version = version;
        stores.checkpoints.write(&copy).await.unwrap();
        let mut acquirer = stores.characters.load(b).await.unwrap().unwrap();
        acquirer.state = json!({ "inventory": [{ "proto": "gem", "id": item }] }).into();
        let event = AuditEvent::item_transferred(b, a, Uuid::now_v7(), json!({ "item_id": item }));
        let outcome = stores
            .characters
            .commit_transfer(
                &shardkeep_reference::game::ReferenceModel::handle(),
                Releaser::Departed {
                    character_id: a,
                    item_id: item,
                    released_epoch: copy.owner_epoch,
                },
                &acquirer,
                &event,
            )
            .await
            .unwrap();
        assert!(
            matches!(outcome, TransferCommit::Committed { .. }),
            "{outcome:?}"
        );
        assert_eq!(rows_holding(&stores, &[a, b], item).await, vec![b]);
        // A logs in again, from whichever of the row and the checkpoint is fresher.
        let again = stores.loader().claim_and_load(a, 0).await.unwrap();
        let doc: shardkeep_reference::game::StateDocument = again.snapshot.state.decode().unwrap();
        let mut doc = doc;
        assert!(
            !shardkeep_reference::game::state::remove_stored_item(&mut doc, item),
            "A's new copy holds the gem B picked up (loaded from {:?})",
            again.source
        );
    }
}

/// A fight's loot is in the copy's memory at once and in its reward job, which the worker may
/// apply to the row only later. A drops the loot and leaves before that job lands; B picks the
/// loot up. Returns the stores, A, B, the item and the queue's signals (the job still queued).
async fn loot_taken_before_its_job_landed(
    scene: &Scene,
) -> (Uuid, Uuid, Uuid, shardkeep::retry::RetrySignals) {
    use shardkeep::character::{Releaser, TransferCommit};
    use shardkeep::clock::SystemClock;
    use shardkeep::retry::{
        IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload,
    };
    use shardkeep_reference::game::{ReferenceEffect, ReferenceModel};
    let stores = &scene.stores;
    let a = stores.new_character("Aria").await;
    let b = stores.new_character("Bran").await;
    let item = Uuid::now_v7();
    let copy = stores.loader().claim_and_load(a, 0).await.unwrap().snapshot;
    let loot = serde_json::from_value(json!({ "proto": "gem", "id": item })).unwrap();
    let reward = PersistenceRetryJob::new(
        PersistenceRetryPayload::effect(
            a,
            &ReferenceEffect::CombatRewards {
                experience: 5,
                currency: 0,
                items: vec![loot],
            },
        )
        .unwrap(),
        IdempotencyEnvelope {
            idempotency_key: "fight-1".into(),
            owner_epoch: copy.owner_epoch,
            origin: Origin::CombatRewards,
            issued_at: chrono::Utc::now(),
            issue_seq: copy.issue_mark + 1,
        },
        "test",
        None,
    )
    .unwrap();
    let (queue, signals) = scene.rows.queue(8, std::sync::Arc::new(SystemClock));
    queue.enqueue(&reward).await.unwrap();
    let mut acquirer = stores.characters.load(b).await.unwrap().unwrap();
    acquirer.state = json!({ "inventory": [{ "proto": "gem", "id": item }] }).into();
    let event = AuditEvent::item_transferred(b, a, Uuid::now_v7(), json!({ "item_id": item }));
    let outcome = stores
        .characters
        .commit_transfer(
            &ReferenceModel::handle(),
            Releaser::Departed {
                character_id: a,
                item_id: item,
                released_epoch: copy.owner_epoch,
            },
            &acquirer,
            &event,
        )
        .await
        .unwrap();
    assert!(
        matches!(outcome, TransferCommit::Committed { .. }),
        "{outcome:?}"
    );
    (a, b, item, signals)
}

/// The worker applies the releaser's reward job after the transfer: the rest of the reward
/// lands, the item stays with B.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_departed_releasers_queued_loot_cannot_bring_a_taken_item_back(pool: PgPool) {
    use shardkeep::clock::SystemClock;
    use shardkeep::retry::RetryWorkerConfig;
    for driver in Driver::ALL {
        let scene = Scene::new(&pool, driver).await;
        let (a, b, item, signals) = loot_taken_before_its_job_landed(&scene).await;
        let stores = &scene.stores;
        let mut worker = scene.rows.worker_for(
            shardkeep_reference::game::ReferenceModel::handle(),
            signals,
            RetryWorkerConfig::new("w"),
            std::sync::Arc::new(SystemClock),
        );
        assert_eq!(worker.run_until_idle().await.unwrap(), 1);
        assert_eq!(
            rows_holding(stores, &[a, b], item).await,
            vec![b],
            "the reward job put the gem B took back into A's row"
        );
        let row = stores
            .characters
            .load(a)
            .await
            .unwrap()
            .unwrap()
            .state
            .to_value();
        assert_eq!(
            row["experience"], 5,
            "the rest of the reward still lands: {row}"
        );
    }
}

/// A's next login settles the queued reward job in its claim: the new copy gets the experience,
/// not the gem.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_login_settling_the_releasers_loot_leaves_the_taken_item_out(pool: PgPool) {
    for driver in Driver::ALL {
        let scene = Scene::new(&pool, driver).await;
        let (a, b, item, _signals) = loot_taken_before_its_job_landed(&scene).await;
        let stores = &scene.stores;
        let again = stores.loader().claim_and_load(a, 0).await.unwrap().snapshot;
        let loaded = again.state.to_value();
        assert!(
            !loaded.to_string().contains(&item.to_string()),
            "the login brought the gem back: {loaded}"
        );
        assert_eq!(loaded["experience"], 5, "{loaded}");
        assert_eq!(rows_holding(stores, &[a, b], item).await, vec![b]);
        // A released nothing else, so its one release is the gem's.
        let (released,): (i64,) = scene
            .rows
            .fetch_one(
                "SELECT count(*) FROM item_releases WHERE character_id = $1",
                Some(a),
            )
            .await;
        assert_eq!(released, 1, "the release is on record");
    }
}

/// A player who logs out while an item they picked up waits for its commit keeps the item. The
/// logout's dump cannot hold it (the item is held by neither side until the commit answers),
/// and a final that finds its row moved by the commit writes its dump over it (rebased, or as
/// a job whose settle replays effects, not transfer commits): the logout waits for the commit.
/// (Postgres only: a row lock holds the commit back; the embedded file has no row locks.)
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_logout_while_a_pickup_commits_keeps_the_item(pool: PgPool) {
    let Room {
        mut shard,
        a,
        b,
        stores,
        _keep,
        ..
    } = two_players(&pool, Driver::Servers).await;
    let item = gem(&mut shard, a);
    shard.drop_item(a, item).unwrap();
    // Bran's row is locked: the pickup's commit waits for it.
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM characters WHERE id = $1 FOR UPDATE")
        .bind(b)
        .execute(&mut *lock)
        .await
        .unwrap();
    shard.get_item(b, item).unwrap().expect("a transfer");
    let epoch = shard.player(b).unwrap().character.owner_epoch;
    tokio::time::sleep(Duration::from_millis(100)).await;
    shard.logout(b).unwrap();
    assert!(
        shard.final_save_in_flight(b),
        "a login of Bran waits for the logout's save"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    lock.rollback().await.unwrap();
    assert!(shard.settle_transfers(Duration::from_secs(5)).await);
    assert_eq!(
        shard.saver().barrier(Duration::from_secs(5)).await,
        BarrierOutcome::Drained
    );
    assert!(!shard.final_save_in_flight(b));
    assert!(shard.player(b).is_none(), "Bran left");
    let departed = shard.take_departed_after_transfer();
    assert!(
        matches!(departed.as_slice(), [(id, e, items)] if *id == b && *e == epoch && items.contains(&item)),
        "the host is told Bran left with the gem: {departed:?}"
    );
    let row = stores.characters.load(b).await.unwrap().unwrap();
    assert!(
        row.state.to_string().contains(&item.to_string()),
        "the gem is in no row: {}",
        row.state
    );
    assert_eq!(shard.transfer_counts(), (1, 0));
}
