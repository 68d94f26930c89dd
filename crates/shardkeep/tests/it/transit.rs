//! The handoff protocol's steps as a host that drives its own retries runs them
//! (`shardkeep::live::Transit`): on Postgres with Redis and on the embedded store's file.

use std::sync::Arc;

use shardkeep::character::{HandoffLoad, HandoffPayload};
use shardkeep::clock::{Clock, SystemClock};
use shardkeep::keyspace::HandoffScope;
use shardkeep::live::Transit;
use shardkeep::live::transit::{Activation, Taken};
use shardkeep::retry::RetryWorkerConfig;
use shardkeep::ttl::Ttl;
use shardkeep::{Services, ServicesConfig};
use shardkeep_testkit::{JobDriver, JobDrivers, TestRedis};
use sqlx::PgPool;

use super::services::services_on;

fn transit(services: &Services) -> Transit {
    Transit::new(
        services.coord.clone(),
        services.loader.clone(),
        services.retry.clone(),
        Ttl::from_static_secs(60),
        Ttl::from_static_secs(60),
    )
}

/// A source hands a copy to shard b: only b takes it, once; b's claim adopts it; the source
/// waits until the activation is seen — here from its durable record alone, as after a Redis
/// failover that lost the marker — and then completes the transfer.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_handoff_runs_step_by_step_and_its_record_stands_in_for_a_lost_marker(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        steps_on(&d, &redis).await;
    }
}

async fn steps_on(d: &JobDriver, redis: &TestRedis) {
    let name = d.name();
    let services = services_on(d, redis, ServicesConfig::new("it-transit", "game_server"));
    let transit = transit(&services);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (_, signals) = d.queue(8, Arc::clone(&clock));
    let mut worker = d.worker(signals, RetryWorkerConfig::new("w"), clock);
    let id = d.character("Ilsa").await;
    let source = services
        .loader
        .claim_and_load(id, 0)
        .await
        .unwrap()
        .snapshot;
    let payload = HandoffPayload::new(source.clone());
    let token = uuid::Uuid::now_v7().simple().to_string();

    transit.send(&token, &payload, "shard-b").await.unwrap();
    assert_eq!(
        transit.activation(id, &token).await.unwrap(),
        Activation::Waiting,
        "{name}"
    );
    assert_eq!(
        transit.take(&token, "shard-c").await.unwrap(),
        Taken::Gone,
        "{name}: another shard takes nothing"
    );
    let Taken::Carried(carried) = transit.take(&token, "shard-b").await.unwrap() else {
        panic!("{name}: shard b takes the payload");
    };
    assert_eq!(*carried, payload, "{name}");
    assert_eq!(
        transit.take(&token, "shard-b").await.unwrap(),
        Taken::Gone,
        "{name}: taken once"
    );
    let HandoffLoad::Adopted(loaded) = transit.claim(&carried, &token).await.unwrap() else {
        panic!("{name}: the copy that dumped it still owned the character");
    };
    assert!(loaded.snapshot.owner_epoch > source.owner_epoch, "{name}");

    // The marker never lands (a failover lost it); the durable record ends the wait.
    let activation = Transit::activation_now(&token, "shard-b", "zone-1");
    let record =
        Transit::activation_record(&activation, id, loaded.snapshot.owner_epoch, "shard-b")
            .unwrap();
    services.retry.enqueue(&record).await.unwrap();
    worker.run_until_idle().await.unwrap();
    assert_eq!(
        transit.activation(id, &token).await.unwrap(),
        Activation::Activated,
        "{name}: the record stands in for the marker"
    );
    transit.complete(&token).await.unwrap();

    // With its marker, a second transfer is activated without a record.
    let again = uuid::Uuid::now_v7().simple().to_string();
    transit.send(&again, &payload, "shard-b").await.unwrap();
    transit
        .mark_activation(&Transit::activation_now(&again, "shard-b", "zone-1"))
        .await
        .unwrap();
    assert_eq!(
        transit.activation(id, &again).await.unwrap(),
        Activation::Activated,
        "{name}"
    );
    transit.complete(&again).await.unwrap();
}

/// A handoff that cannot arrive is ended by completing it: its source sees it ended, not
/// waiting. An unreadable payload is taken once and reported as such, never as a copy.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_abandoned_transfer_ends_and_an_unreadable_payload_is_reported(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let name = d.name();
        let services = services_on(&d, &redis, ServicesConfig::new("it-transit", "game_server"));
        let transit = transit(&services);
        let id = d.character("Juno").await;
        let source = services
            .loader
            .claim_and_load(id, 0)
            .await
            .unwrap()
            .snapshot;
        let token = uuid::Uuid::now_v7().simple().to_string();
        transit
            .send(&token, &HandoffPayload::new(source), "shard-b")
            .await
            .unwrap();
        transit.complete(&token).await.unwrap();
        assert_eq!(
            transit.activation(id, &token).await.unwrap(),
            Activation::Ended,
            "{name}"
        );

        let garbled = uuid::Uuid::now_v7().simple().to_string();
        services
            .coord
            .handoff_put(
                &garbled,
                &HandoffScope::Placement("shard-b".into()),
                b"{\"not\": \"a payload\"",
                Ttl::from_static_secs(60),
            )
            .await
            .unwrap();
        assert_eq!(
            transit.take(&garbled, "shard-b").await.unwrap(),
            Taken::Unreadable,
            "{name}"
        );
        assert_eq!(
            transit.take(&garbled, "shard-b").await.unwrap(),
            Taken::Gone,
            "{name}"
        );
    }
}
