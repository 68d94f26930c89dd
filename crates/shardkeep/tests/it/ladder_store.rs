use std::collections::HashSet;

use redis::AsyncCommands;
use serde_json::json;
use shardkeep::character::{
    CharacterLoader, CharacterSnapshot, CheckpointWrite, LoadSource, SaveOutcome, StoreError,
};
use shardkeep_testkit::{CharacterDrivers, TestRedis};
use sqlx::PgPool;
use uuid::Uuid;

pub(crate) use shardkeep_testkit::fixtures::{created, new_character};

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn concurrent_claimers_never_share_an_epoch(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let row = created(&store, "Aria").await;
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(
                    async move { store.claim(row.character_id, 0).await.unwrap().new_epoch },
                )
            })
            .collect();
        let mut epochs = HashSet::new();
        for task in tasks {
            assert!(
                epochs.insert(task.await.unwrap()),
                "an epoch was minted twice"
            );
        }
        assert_eq!(epochs.len(), 32);
        assert_eq!(epochs.iter().max(), Some(&32));
        let (_, epoch) = store.version_of(row.character_id).await.unwrap().unwrap();
        assert_eq!(epoch, 32);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn claim_raises_the_row_to_the_directory_floor(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let row = created(&store, "Aria").await;
        let first = store.claim(row.character_id, 10).await.unwrap();
        assert_eq!((first.new_epoch, first.row.owner_epoch), (11, 0));
        let second = store.claim(row.character_id, 3).await.unwrap();
        assert_eq!(
            (second.new_epoch, second.row.owner_epoch),
            (12, 11),
            "a lower floor never lowers"
        );
        assert!(matches!(
            store.claim(Uuid::now_v7(), 0).await,
            Err(StoreError::NotFound(_))
        ));
        assert!(matches!(
            store.claim(row.character_id, -1).await,
            Err(StoreError::InvalidInput(_))
        ));
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn save_reports_each_outcome_in_one_round_trip(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let row = created(&store, "Aria").await;
        let epoch = store.claim(row.character_id, 0).await.unwrap().new_epoch;
        let mut snap = CharacterSnapshot {
            owner_epoch: epoch,
            ..row.clone()
        };
        snap.state = json!({ "gold": 2 }).into();
        assert_eq!(store.save(&snap).await.unwrap(), SaveOutcome::Saved(1));
        // Same expected version again: somebody (we) wrote since.
        assert_eq!(
            store.save(&snap).await.unwrap(),
            SaveOutcome::VersionConflict(1)
        );
        // A newer owner claims: the old epoch is fenced even at the right version.
        let newer = store.claim(row.character_id, 0).await.unwrap().new_epoch;
        snap.state_version = 1;
        assert_eq!(
            store.save(&snap).await.unwrap(),
            SaveOutcome::OwnershipLost(newer)
        );
        let missing = CharacterSnapshot {
            character_id: Uuid::now_v7(),
            ..snap.clone()
        };
        assert_eq!(store.save(&missing).await.unwrap(), SaveOutcome::NotFound);
        let stored = store.load(row.character_id).await.unwrap().unwrap();
        assert_eq!(stored.state, json!({ "gold": 2 }));
        assert_eq!(stored.state_version, 1);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn batched_save_gives_one_outcome_per_row(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let mut snaps = Vec::new();
        for name in ["A1", "A2", "A3"] {
            let row = created(&store, name).await;
            let epoch = store.claim(row.character_id, 0).await.unwrap().new_epoch;
            snaps.push(CharacterSnapshot {
                owner_epoch: epoch,
                state: json!({ "name": name }).into(),
                ..row
            });
        }
        snaps[1].state_version = 7; // stale token
        store.claim(snaps[2].character_id, 0).await.unwrap(); // newer owner elsewhere
        let missing = CharacterSnapshot {
            character_id: Uuid::now_v7(),
            ..snaps[0].clone()
        };
        snaps.push(missing);
        let refs: Vec<&CharacterSnapshot> = snaps.iter().collect();
        let outcomes = store.save_many(&refs).await.unwrap();
        let outcomes: Vec<SaveOutcome> = outcomes.into_iter().map(|(_, o)| o).collect();
        assert_eq!(
            outcomes,
            vec![
                SaveOutcome::Saved(1),
                SaveOutcome::VersionConflict(0),
                SaveOutcome::OwnershipLost(2),
                SaveOutcome::NotFound
            ]
        );
        let duplicate = [&snaps[0], &snaps[0]];
        assert!(matches!(
            store.save_many(&duplicate).await,
            Err(StoreError::InvalidInput(_))
        ));
        assert_eq!(
            store
                .load(snaps[1].character_id)
                .await
                .unwrap()
                .unwrap()
                .state_version,
            0
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_instance_save_keeps_the_zone_anchor_and_its_room(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let row = created(&store, "Aria").await;
        let epoch = store.claim(row.character_id, 0).await.unwrap().new_epoch;
        for zone_ref in [None, Some(String::new())] {
            let version = store.version_of(row.character_id).await.unwrap().unwrap().0;
            let snap = CharacterSnapshot {
                owner_epoch: epoch,
                state_version: version,
                zone_ref: zone_ref.clone(),
                room_ref: Some("instance-room-7".into()),
                ..row.clone()
            };
            assert!(matches!(
                store.save(&snap).await.unwrap(),
                SaveOutcome::Saved(_)
            ));
            let stored = store.load(row.character_id).await.unwrap().unwrap();
            assert_eq!(stored.zone_ref.as_deref(), Some("midgaard"), "{zone_ref:?}");
            assert_eq!(stored.room_ref.as_deref(), Some("market"));
        }
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn chargen_is_cleared_by_the_save_that_persists_the_built_state(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let row = created(&store, "Aria").await;
        assert!(row.chargen.is_some());
        let epoch = store.claim(row.character_id, 0).await.unwrap().new_epoch;
        let built = CharacterSnapshot {
            owner_epoch: epoch,
            chargen: None,
            state: json!({ "class": "ranger", "built": true }).into(),
            ..row.clone()
        };
        assert_eq!(store.save(&built).await.unwrap(), SaveOutcome::Saved(1));
        let stored = store.load(row.character_id).await.unwrap().unwrap();
        assert_eq!(stored.chargen, None);
        assert_eq!(stored.state["built"], true);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn names_are_unique_without_regard_to_case(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        created(&store, "Aria").await;
        let err = store.create(&new_character("aRIA")).await.unwrap_err();
        assert!(matches!(err, StoreError::NameTaken(_)));
        let err = store.create(&new_character("   ")).await.unwrap_err();
        assert!(matches!(err, StoreError::InvalidInput(_)));
        assert!(store.load_by_name(" aria ").await.unwrap().is_some());
    }
}

/// Every field set to a non-default value.
fn full_snapshot(row: &CharacterSnapshot, epoch: i64) -> CharacterSnapshot {
    CharacterSnapshot {
        character_id: row.character_id,
        account_id: row.account_id,
        name: row.name.clone(),
        zone_ref: Some("darkwood".into()),
        room_ref: Some("clearing".into()),
        state: json!({ "attributes": { "str": 14 }, "inventory": [{ "proto": "sword" }] }).into(),
        chargen: Some(json!({ "pending": true })),
        state_version: row.state_version,
        owner_epoch: epoch,
        issue_mark: 7,
        schema_version: 3,
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn drift_guard_every_field_survives_both_tiers(pool: PgPool) {
    let redis = TestRedis::new().await;
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let checkpoints = drivers.checkpoints_for(&store, &redis);
        let row = created(&store, "Aria").await;
        let epoch = store.claim(row.character_id, 0).await.unwrap().new_epoch;
        let snap = full_snapshot(&row, epoch);
        // Guard against a field silently left at its default by this test itself.
        assert_ne!(snap.account_id, Uuid::nil());
        assert!(snap.zone_ref.is_some() && snap.room_ref.is_some() && snap.chargen.is_some());
        assert_ne!(snap.owner_epoch, 0);
        let as_json = serde_json::to_value(&snap).unwrap();
        assert_eq!(
            as_json.as_object().unwrap().len(),
            11,
            "a new field needs this test extended"
        );

        assert_eq!(
            checkpoints.write(&snap).await.unwrap(),
            CheckpointWrite::Written
        );
        assert_eq!(
            checkpoints.read(row.character_id).await.unwrap(),
            Some(snap.clone())
        );

        assert_eq!(store.save(&snap).await.unwrap(), SaveOutcome::Saved(1));
        let back = store.load(row.character_id).await.unwrap().unwrap();
        assert_eq!(
            back,
            CharacterSnapshot {
                state_version: 1,
                ..snap.clone()
            }
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_corrupt_checkpoint_falls_back_to_the_row(pool: PgPool) {
    let redis = TestRedis::new().await;
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let checkpoints = drivers.checkpoints_for(&store, &redis);
        let row = created(&store, "Aria").await;
        if store.driver() == "postgres" {
            let mut raw = redis.raw().await;
            let key = redis.keys().checkpoint(row.character_id);
            let () = raw
                .hset_multiple(&key, &[("epoch", "0"), ("snapshot", "{broken")])
                .await
                .unwrap();
        } else {
            sqlx::query(
                "INSERT INTO checkpoints (character_id, owner_epoch, schema, snapshot, expires_at)
             VALUES (?1, 0, 1, '{broken', ?2)",
            )
            .bind(row.character_id)
            .bind(i64::MAX)
            .execute(drivers.sqlite.backend().pool())
            .await
            .unwrap();
        }
        assert!(checkpoints.read(row.character_id).await.is_err());
        let loader = CharacterLoader::new(
            store,
            Some(checkpoints),
            shardkeep_testkit::model::LedgerModel::handle(),
            std::time::Duration::from_secs(5),
        );
        let loaded = loader.claim_and_load(row.character_id, 0).await.unwrap();
        assert_eq!(loaded.source, LoadSource::Row);
        assert_eq!(loaded.snapshot.state, row.state);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn racing_saves_of_one_version_land_once_and_the_rest_see_the_winner(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let row = created(&store, "Aria").await;
        let epoch = store.claim(row.character_id, 0).await.unwrap().new_epoch;
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let store = store.clone();
                let mut snap = CharacterSnapshot {
                    owner_epoch: epoch,
                    ..row.clone()
                };
                snap.state = json!({ "writer": i }).into();
                tokio::spawn(async move {
                    if i % 2 == 0 {
                        store.save(&snap).await.unwrap()
                    } else {
                        store.save_many(&[&snap]).await.unwrap()[0].1
                    }
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.unwrap());
        }
        assert_eq!(
            outcomes
                .iter()
                .filter(|o| **o == SaveOutcome::Saved(1))
                .count(),
            1
        );
        assert_eq!(
            outcomes
                .iter()
                .filter(|o| **o == SaveOutcome::VersionConflict(1))
                .count(),
            15,
            "losers are told the winner's version exactly: {outcomes:?}"
        );
    }
}
