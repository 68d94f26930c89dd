//! The composition root: services built from two backends and a model, workers spawned under
//! one token and shut down through it.

use std::time::Duration;

use shardkeep::{Services, ServicesConfig, ServicesError};
use std::sync::Arc;

use shardkeep::clock::SystemClock;
use shardkeep_testkit::model::LedgerModel;
use shardkeep_testkit::{JobDriver, JobDrivers, TestRedis};
use sqlx::PgPool;

use super::retry_jobs::{pg, reward};

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn built_services_run_the_workers_until_shutdown(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        services_run_on(&d, &redis).await;
    }
}

/// Every handle on one driver: built, its workers spawned, a retry job applied, the instance
/// registered, a claim bounded by the model's schema, and a clean shutdown.
async fn services_run_on(d: &JobDriver, redis: &TestRedis) {
    let mut config = ServicesConfig::new("it-services", "game_server");
    config.retry.poll_interval = Duration::from_millis(50);
    let mut services = services_on(d, redis, config);
    let id = d.character("A").await;
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
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while d.experience(id).await != 7 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the services' retry worker applied the job ({})",
            d.name()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let registered = services.coord.registry_list().await.unwrap().instances;
    assert!(
        registered.iter().any(|r| r.instance_id == "it-services"),
        "maintenance registered the instance: {registered:?} ({})",
        d.name()
    );
    let loaded = services.loader.claim_and_load(id, 0).await.unwrap();
    assert_eq!(loaded.snapshot.state["experience"], 7);
    // The journal takes a cleanup durably in the same store.
    assert_eq!(services.journal.queue().depths().await.unwrap().pending, 0);
    // The character store's claims are bounded by the model's schema, like the loader's.
    d.execute(
        "UPDATE characters SET schema_version = 2 WHERE id = $1",
        Some(id),
    )
    .await
    .unwrap();
    let refused = services.characters.claim(id, 0).await;
    assert!(
        matches!(
            refused,
            Err(shardkeep::character::StoreError::SchemaNewer { .. })
        ),
        "{refused:?} ({})",
        d.name()
    );
    assert_eq!(
        workers.shutdown(Duration::from_secs(10)).await,
        Vec::<&str>::new(),
        "{}",
        d.name()
    );
    assert!(cancel.is_cancelled());
    assert_eq!(d.experience(id).await, 7);
}

/// Services over `d`'s stores (the fast tier named by `redis`'s keys), as a game server builds
/// them.
pub(crate) fn services_on(d: &JobDriver, redis: &TestRedis, config: ServicesConfig) -> Services {
    match d {
        JobDriver::Postgres(pool) => {
            Services::build(pg(pool), redis.backend(), LedgerModel::handle(), config).unwrap()
        }
        JobDriver::Embedded(db) => Services::embedded(
            db.clone(),
            redis.keys(),
            LedgerModel::handle(),
            config,
            Arc::new(SystemClock),
        )
        .unwrap(),
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn workers_that_failed_to_start_can_start_again_with_their_retry_signals(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        start_again_on(&d, &redis).await;
    }
}

async fn start_again_on(d: &JobDriver, redis: &TestRedis) {
    let config = |instance: &str| {
        let mut config = ServicesConfig::new(instance, "game_server");
        config.retry.poll_interval = Duration::from_secs(3600);
        config.journal_worker.consumer_id = Some("journal-0".into());
        config.journal_queue.heartbeat_ttl = shardkeep::ttl::Ttl::from_static_secs(1);
        config
    };
    let mut first = services_on(d, redis, config("first"));
    let mut second = services_on(d, redis, config("second"));
    let cancel = tokio_util::sync::CancellationToken::new();
    let running = first.spawn_workers(cancel.clone()).await.unwrap();
    // The journal consumer id is held by the first: the second cannot start yet, and keeps
    // what it needs to start later.
    for _ in 0..2 {
        let refused = second.spawn_workers(cancel.child_token()).await;
        assert!(
            matches!(refused, Err(ServicesError::Journal(_))),
            "{}: {refused:?}",
            d.name()
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
    let id = d.character("B").await;
    second.retry.enqueue(&reward(id, "k", 0, 5)).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while d.experience(id).await != 5 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}: the signal reached the worker that started late",
            d.name()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.shutdown(Duration::from_secs(10)).await;
}
