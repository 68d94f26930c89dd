//! A runtime that stops writes nothing afterwards: a killed one (a crash) leaves its writes in
//! the background where they stood, as a dead process does.

use std::time::Duration;

use serde_json::Map;
use shardkeep::backend::redis::RedisTimeouts;
use shardkeep::live::{LiveConfig, Runtime, SessionStart, Stored};
use shardkeep::model::Anchor;
use shardkeep::{Services, ServicesConfig};
use shardkeep_testkit::TestRedis;
use shardkeep_testkit::faults::{ProxyControl, ProxyMode, proxied_redis};
use shardkeep_testkit::model::LedgerModel;
use sqlx::PgPool;
use uuid::Uuid;

/// A login's session records are written in the background, one command after another. A
/// runtime killed while they are on their way (Redis answering slowly) sends none of the rest:
/// the login's presence, its second command, never appears. Postgres with Redis only (the
/// embedded store keeps its records in its file, in the login's own transaction).
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_killed_runtime_sends_nothing_more_of_its_background_writes(pool: PgPool) {
    let redis = TestRedis::new().await;
    let (proxies, slow) =
        proxied_redis(redis.url(), redis.keys().clone(), RedisTimeouts::default())
            .await
            .unwrap();
    redis.closes_with(&slow);
    let services = Services::build(
        shardkeep_testkit::pg(&pool),
        slow,
        LedgerModel::handle(),
        ServicesConfig::new("it-stops", "game_server"),
    )
    .unwrap();
    let mut config = LiveConfig::new("shard-a");
    config.own_pulse = false;
    let runtime = Runtime::start(&services, Stored::new(LedgerModel, Map::new), config).unwrap();
    let id = runtime
        .create("Wren", Uuid::now_v7(), Anchor::default())
        .await
        .unwrap();
    // Each chunk either way is held 400 ms: the marker's command lands after 400 ms and is
    // answered after 800, and only then does the presence's go out.
    proxies.set_mode(ProxyMode::Delay(Duration::from_millis(400)));
    runtime.login(id, SessionStart::default()).await.unwrap();
    runtime.kill();
    proxies.set_mode(ProxyMode::Pass);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let presence: Vec<String> = redis
        .all_keys()
        .await
        .into_iter()
        .filter(|k| k.contains(":presence}:character:"))
        .collect();
    assert!(
        presence.is_empty(),
        "the killed runtime wrote presence: {presence:?}"
    );
}
