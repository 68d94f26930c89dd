//! The reference game's retry effects applied by the core's worker through its model.

use std::sync::Arc;

use chrono::Utc;
use serde_json::json;
use shardkeep::clock::{Clock, SystemClock};
use shardkeep::retry::{
    IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload, RetryWorkerConfig,
};
use sqlx::PgPool;

fn config(owner: &str) -> RetryWorkerConfig {
    RetryWorkerConfig::new(owner)
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn each_payload_kind_applies_to_the_character_store(pool: PgPool) {
    let drivers = shardkeep_testkit::JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        each_payload_kind_on(&d).await;
    }
}

/// Location, appearance, equipment, a transfer activation and a whole-state flush, applied by
/// the retry worker on one driver.
async fn each_payload_kind_on(d: &shardkeep_testkit::JobDriver) {
    use shardkeep_reference::game::state::Appearance;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (queue, signals) = d.queue(64, Arc::clone(&clock));
    let id = d.character("A").await;
    // Effects no copy applied: offline grants (a copy's own are numbered).
    let envelope = |key: &str, origin| IdempotencyEnvelope {
        idempotency_key: key.into(),
        owner_epoch: shardkeep::retry::OFFLINE_EPOCH,
        origin,
        issued_at: Utc::now(),
        issue_seq: 0,
    };
    let jobs = vec![
        PersistenceRetryJob::new(
            PersistenceRetryPayload::effect(
                id,
                &shardkeep_reference::game::ReferenceEffect::CharacterLocation {
                    zone: "zone-3".into(),
                    room: "r2".into(),
                    position: Some([5, 6]),
                },
            )
            .unwrap(),
            envelope("loc", Origin::SessionCleanup),
            "journal",
            None,
        ),
        PersistenceRetryJob::new(
            PersistenceRetryPayload::effect(
                id,
                &shardkeep_reference::game::ReferenceEffect::CharacterAppearance {
                    appearance: Appearance {
                        hair: "silver".into(),
                        skin: "dark".into(),
                        outfit: "cloak".into(),
                    },
                },
            )
            .unwrap(),
            envelope("look", Origin::ClientAppearance),
            "client",
            None,
        ),
        PersistenceRetryJob::new(
            PersistenceRetryPayload::effect(
                id,
                &shardkeep_reference::game::ReferenceEffect::CharacterEquipment {
                    equipment: [(
                        shardkeep_reference::game::Slot::Head,
                        serde_json::from_value(json!({ "proto": "helm" })).unwrap(),
                    )]
                    .into(),
                },
            )
            .unwrap(),
            envelope("gear", Origin::ClientEquipment),
            "client",
            None,
        ),
        PersistenceRetryJob::new(
            PersistenceRetryPayload::transfer_activation(id, "xfer-1", "shard-2", "zone-5"),
            IdempotencyEnvelope {
                owner_epoch: 0,
                ..envelope("xfer", Origin::TransferActivation)
            },
            "transfer",
            None,
        ),
    ];
    for job in jobs {
        queue.enqueue(&job.unwrap()).await.unwrap();
    }
    let mut worker = d.worker_for(
        shardkeep_reference::game::ReferenceModel::handle(),
        signals,
        config("w"),
        clock,
    );
    worker.run_until_idle().await.unwrap();
    let row = d.characters().load(id).await.unwrap().unwrap();
    assert_eq!(
        (row.zone_ref.as_deref(), row.room_ref.as_deref()),
        (Some("zone-3"), Some("r2")),
        "{}",
        d.name()
    );
    assert_eq!(row.state["position"], json!([5, 6]));
    assert_eq!(row.state["appearance"]["hair"], "silver");
    assert_eq!(row.state["equipment"]["head"]["proto"], "helm");
    assert!(row.state_version >= 1);
    let (shard, zone): (String, String) = d
        .fetch_one(
            "SELECT target_shard, target_zone FROM transfer_activations
              WHERE transfer_token = 'xfer-1'",
            None,
        )
        .await;
    assert_eq!((shard.as_str(), zone.as_str()), ("shard-2", "zone-5"));

    let state = json!({ "experience": 999, "currency": 3 });
    let job = PersistenceRetryJob::new(
        PersistenceRetryPayload::gameplay_state(id, state.clone(), None, None),
        IdempotencyEnvelope {
            owner_epoch: 0,
            ..envelope("flush", Origin::GameplayState)
        },
        "saver",
        None,
    )
    .unwrap();
    queue.enqueue(&job).await.unwrap();
    worker.run_until_idle().await.unwrap();
    let row = d.characters().load(id).await.unwrap().unwrap();
    assert_eq!(row.state["experience"], 999);
    assert_eq!(
        row.zone_ref.as_deref(),
        Some("zone-3"),
        "no zone in the payload keeps the anchor"
    );
}
