//! Shared set-up: the services' handles over a test database and namespace (or an embedded
//! file), the zones of a reference world, and a runner of a test body on both drivers.

use std::sync::Arc;

use serde_json::json;
use shardkeep::character::{CharacterLoader, CharacterStore, CheckpointStore, NewCharacter};
use shardkeep::{RedisBackend, Services, ServicesConfig};
use shardkeep_reference::game::ReferenceModel;
use shardkeep_reference::game::world::instance_entrance;
use shardkeep_reference::game::{ZoneDef, reference_world};
use sqlx::PgPool;
use uuid::Uuid;

#[derive(Clone)]
pub(crate) struct Stores {
    pub(crate) characters: CharacterStore,
    pub(crate) checkpoints: CheckpointStore,
    pub(crate) audit: shardkeep::audit::AuditStore,
    loader: CharacterLoader,
}

impl Stores {
    /// The handles of services built over the test's database and namespace, as a game
    /// server builds them (the tests drive the workers themselves when they need them).
    pub(crate) fn new(pool: &PgPool, redis: RedisBackend) -> Self {
        let services = Services::build(
            shardkeep_testkit::pg(pool),
            redis,
            ReferenceModel::handle(),
            ServicesConfig::new("it-shard", "game_server"),
        )
        .unwrap();
        Self {
            characters: services.characters.clone(),
            checkpoints: services.checkpoints.clone(),
            audit: services.audit.clone(),
            loader: services.loader.clone(),
        }
    }

    /// The handles of services built over the embedded store's file `sqlite` (rows,
    /// checkpoints, placement records and the audit trail all in it), as a game server in
    /// embedded mode builds them.
    pub(crate) fn embedded(sqlite: &shardkeep_testkit::TestSqlite) -> Self {
        let keys = shardkeep::Keyspace::new(&format!("t-{}", Uuid::now_v7().simple()))
            .expect("a test namespace");
        let services = Services::embedded(
            sqlite.backend(),
            &keys,
            ReferenceModel::handle(),
            ServicesConfig::new("it-shard", "game_server"),
            Arc::new(shardkeep::clock::SystemClock),
        )
        .unwrap();
        Self {
            characters: services.characters.clone(),
            checkpoints: services.checkpoints.clone(),
            audit: services.audit.clone(),
            loader: services.loader.clone(),
        }
    }

    pub(crate) fn loader(&self) -> CharacterLoader {
        self.loader.clone()
    }

    /// A brand-new character (never placed) with a starting kit from chargen.
    pub(crate) async fn new_character(&self, name: &str) -> Uuid {
        let id = Uuid::now_v7();
        self.characters
            .create(&NewCharacter {
                character_id: id,
                account_id: Uuid::now_v7(),
                name: name.into(),
                zone_ref: None,
                room_ref: None,
                state: json!({}).into(),
                chargen: Some(json!({ "items": ["bag"] })),
                schema_version: 1,
            })
            .await
            .unwrap();
        id
    }
}

/// Zones `ids` of a reference world of `total` zones, with the instances entered from them.
pub(crate) fn zones(ids: &[usize], total: usize) -> Vec<ZoneDef> {
    let world = reference_world(total);
    let hosted: Vec<String> = ids.iter().map(|i| format!("zone-{i}")).collect();
    world
        .into_iter()
        .enumerate()
        .filter(|(i, z)| {
            ids.contains(i)
                || instance_entrance(z).is_some_and(|entrance| hosted.iter().any(|h| h == entrance))
        })
        .map(|(_, z)| z)
        .collect()
}

pub(crate) use shardkeep_testkit::{pg_addr, proxied_pg};

/// Runs `body` over services on Postgres with Redis, then over services on a fresh embedded
/// store's file, naming each driver.
pub(crate) async fn on_both_drivers<F, Fut>(pool: &PgPool, process: &str, body: F)
where
    F: Fn(Services, &'static str) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let redis = shardkeep_testkit::TestRedis::new().await;
    let services = Services::build(
        shardkeep_testkit::pg(pool),
        redis.backend(),
        ReferenceModel::handle(),
        ServicesConfig::new(process, "game_server"),
    )
    .unwrap();
    body(services, "postgres").await;
    let sqlite = shardkeep_testkit::TestSqlite::new().await;
    let keys = shardkeep::Keyspace::new(&format!("t-{}", Uuid::now_v7().simple())).unwrap();
    let services = Services::embedded(
        sqlite.backend(),
        &keys,
        ReferenceModel::handle(),
        ServicesConfig::new(process, "game_server"),
        Arc::new(shardkeep::clock::SystemClock),
    )
    .unwrap();
    body(services, "embedded").await;
}
