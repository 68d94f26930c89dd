//! Item transfer commits at the store, as the reference game's rows hold them: a commit retried
//! after a lost reply, a releaser still holding the item, and the saves, checkpoints and queued
//! loot of a departed releaser that must not bring a taken item back. (The shard's side of
//! transfers is in `live_items` and the runtime's own tests.)

use serde_json::json;
use shardkeep::audit::AuditEvent;
use shardkeep_testkit::{JobDriver, TestRedis};
use sqlx::PgPool;
use uuid::Uuid;

use crate::scene::{Driver, Scene};
use crate::support::Stores;

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
