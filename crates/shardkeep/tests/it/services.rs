//! The composition root: services built from two backends and a model, workers spawned under
//! one token and shut down through it.

use std::time::Duration;

use shardkeep::{Services, ServicesConfig, ServicesError};
use shardkeep_testkit::TestRedis;
use shardkeep_testkit::model::LedgerModel;
use sqlx::PgPool;

use super::retry_jobs::{character, experience, pg, reward};
use super::retry_worker_loop::wait_for_experience;

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn built_services_run_the_workers_until_shutdown(pool: PgPool) {
    let redis = TestRedis::new().await;
    let mut config = ServicesConfig::new("it-services", "game_server");
    config.retry.poll_interval = Duration::from_millis(50);
    let mut services =
        Services::build(pg(&pool), redis.backend(), LedgerModel::handle(), config).unwrap();
    let id = character(&pool, "A").await;
    let cancel = tokio_util::sync::CancellationToken::new();
    let workers = services.spawn_workers(cancel.clone()).await.unwrap();
    assert!(matches!(
        services.spawn_workers(cancel.clone()).await,
        Err(ServicesError::WorkersRunning)
    ));
    services
        .retry
        .enqueue(&reward(id, "k", 0, 7))
        .await
        .unwrap();
    wait_for_experience(&pool, id, 7, "the services' retry worker applied the job").await;
    let registered = services.coord.registry_list().await.unwrap().instances;
    assert!(
        registered.iter().any(|r| r.instance_id == "it-services"),
        "maintenance registered the instance: {registered:?}"
    );
    let loaded = services.loader.claim_and_load(id, 0).await.unwrap();
    assert_eq!(loaded.snapshot.state["experience"], 7);
    // The character store's claims are bounded by the model's schema, like the loader's.
    sqlx::query("UPDATE characters SET schema_version = 2 WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    let refused = services.characters.claim(id, 0).await;
    assert!(
        matches!(
            refused,
            Err(shardkeep::character::StoreError::SchemaNewer { .. })
        ),
        "{refused:?}"
    );
    assert_eq!(
        workers.shutdown(Duration::from_secs(10)).await,
        Vec::<&str>::new()
    );
    assert!(cancel.is_cancelled());
    assert_eq!(experience(&pool, id).await, 7);
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn workers_that_failed_to_start_can_start_again_with_their_retry_signals(pool: PgPool) {
    let redis = TestRedis::new().await;
    let config = |instance: &str| {
        let mut config = ServicesConfig::new(instance, "game_server");
        config.retry.poll_interval = Duration::from_secs(3600);
        config.journal_worker.consumer_id = Some("journal-0".into());
        config.journal_queue.heartbeat_ttl = shardkeep::ttl::Ttl::from_static_secs(1);
        config
    };
    let mut first = Services::build(
        pg(&pool),
        redis.backend(),
        LedgerModel::handle(),
        config("first"),
    )
    .unwrap();
    let mut second = Services::build(
        pg(&pool),
        redis.backend(),
        LedgerModel::handle(),
        config("second"),
    )
    .unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    let running = first.spawn_workers(cancel.clone()).await.unwrap();
    // The journal consumer id is held by the first: the second cannot start yet, and keeps
    // what it needs to start later.
    for _ in 0..2 {
        let refused = second.spawn_workers(cancel.child_token()).await;
        assert!(
            matches!(refused, Err(ServicesError::Journal(_))),
            "{refused:?}"
        );
    }
    assert_eq!(
        running.shutdown(Duration::from_secs(10)).await,
        Vec::<&str>::new()
    );
    let later = tokio_util::sync::CancellationToken::new();
    let started = loop {
        match second.spawn_workers(later.clone()).await {
            Ok(workers) => break workers,
            Err(ServicesError::Journal(_)) => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(other) => panic!("{other}"),
        }
    };
    // The poll is an hour away: only the retry signal can wake the worker.
    let id = character(&pool, "B").await;
    second.retry.enqueue(&reward(id, "k", 0, 5)).await.unwrap();
    wait_for_experience(
        &pool,
        id,
        5,
        "the signal reached the worker that started late",
    )
    .await;
    started.shutdown(Duration::from_secs(10)).await;
}
