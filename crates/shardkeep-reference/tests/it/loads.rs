//! The loader as the reference game meets it: a stale owner's checkpoint never outranks the
//! live row, a login fails closed when Postgres is unreachable and loads the row when Redis is,
//! and a handoff payload whose stated epoch is not its snapshot's is refused.

use std::time::Duration;

use serde_json::json;
use shardkeep::character::{
    CharacterSnapshot, CheckpointWrite, HandoffPayload, LoadSource, SaveOutcome,
};
use sqlx::PgPool;

use crate::faultable::{FaultableServices, faultable_checkpoints};
use crate::scene::{Driver, Scene};

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
async fn login_fails_closed_when_postgres_is_unreachable(pool: PgPool) {
    use shardkeep::character::{CharacterLoader, LoadError};
    for driver in Driver::ALL {
        let faultable = FaultableServices::new(&pool, driver).await;
        let id = crate::live_support::new_character(&faultable.own, "Aria").await;
        faultable.outage.cut();
        let loader = CharacterLoader::new(
            faultable.shard.characters.clone(),
            Some(faultable.own.checkpoints.clone()),
            shardkeep_reference::game::ReferenceModel::handle(),
            Duration::from_secs(2),
        );
        let err = loader.claim_and_load(id, 0).await.unwrap_err();
        assert!(
            matches!(err, LoadError::Store { .. } | LoadError::Timeout(_)),
            "{err}"
        );
        let (_, epoch) = faultable
            .own
            .characters
            .version_of(id)
            .await
            .unwrap()
            .unwrap();
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
