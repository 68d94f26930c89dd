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
    assert_eq!(
        workers.shutdown(Duration::from_secs(10)).await,
        Vec::<&str>::new()
    );
    assert!(cancel.is_cancelled());
    assert_eq!(experience(&pool, id).await, 7);
}
