//! Shared set-up for shard-level tests: stores over a test database and namespace, shard boot,
//! login through the real gate, and a pump that runs pulses until a condition holds.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use shardkeep::character::{CharacterLoader, CharacterStore, CheckpointStore, NewCharacter};
use shardkeep::placement::PlacementStore;
use shardkeep::{PostgresBackend, RedisBackend, Services, ServicesConfig};
use shardkeep_reference::game::ReferenceModel;
use shardkeep_reference::game::world::instance_entrance;
use shardkeep_reference::game::{Catalog, ZoneDef, reference_world};
use shardkeep_reference::shard::gate::route_login;
use shardkeep_reference::shard::{
    Admitted, Arrival, Shard, ShardConfig, ShardStores, ZoneDirectory,
};
use sqlx::PgPool;
use uuid::Uuid;

#[derive(Clone)]
pub(crate) struct Stores {
    /// Stops the shards booted over these stores when the test's namespace is removed.
    stop: tokio_util::sync::CancellationToken,
    pub(crate) characters: CharacterStore,
    pub(crate) checkpoints: CheckpointStore,
    /// Placement records.
    pub(crate) placement: Option<PlacementStore>,
    pub(crate) audit: shardkeep::audit::AuditStore,
    pub(crate) directory: ZoneDirectory,
    loader: CharacterLoader,
}

impl Stores {
    /// The handles of services built over the test's database and namespace, as a game
    /// server builds them (the tests drive the workers themselves when they need them).
    pub(crate) fn new(pool: &PgPool, redis: RedisBackend) -> Self {
        let stop = shardkeep_testkit::namespace_stop(redis.keys().namespace());
        let services = Services::build(
            shardkeep_testkit::pg(pool),
            redis,
            ReferenceModel::handle(),
            ServicesConfig::new("it-shard", "game_server"),
        )
        .unwrap();
        Self {
            stop,
            characters: services.characters.clone(),
            checkpoints: services.checkpoints.clone(),
            placement: Some(services.placement.clone()),
            audit: services.audit.clone(),
            directory: ZoneDirectory::new(),
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
            stop: tokio_util::sync::CancellationToken::new(),
            characters: services.characters.clone(),
            checkpoints: services.checkpoints.clone(),
            placement: Some(services.placement.clone()),
            audit: services.audit.clone(),
            directory: ZoneDirectory::new(),
            loader: services.loader.clone(),
        }
    }

    /// Where the stores are: `servers` or `embedded`.
    pub(crate) fn driver(&self) -> &'static str {
        self.characters.driver()
    }

    pub(crate) fn shard_stores(&self) -> ShardStores {
        ShardStores {
            characters: Some(self.characters.clone()),
            checkpoints: Some(self.checkpoints.clone()),
            placement: self.placement.clone(),
            audit: Some(self.audit.clone()),
            retry: None,
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

pub(crate) fn boot(stores: &Stores, shard_id: &str, zone_ids: &[usize], total: usize) -> Shard {
    boot_with(
        stores.shard_stores(),
        stores,
        ShardConfig::new(shard_id, &format!("zone-{}", zone_ids[0])),
        zone_ids,
        total,
    )
}

pub(crate) fn boot_with(
    shard_stores: ShardStores,
    stores: &Stores,
    config: ShardConfig,
    zone_ids: &[usize],
    total: usize,
) -> Shard {
    let mut config = config;
    config.stop_with = Some(stores.stop.child_token());
    Shard::boot(
        config,
        zones(zone_ids, total),
        Arc::new(Catalog::reference()),
        shard_stores,
        stores.directory.clone(),
    )
}

/// A login through the gate: resume a held copy, else claim, load and admit.
pub(crate) async fn login(stores: &Stores, shard: &mut Shard, id: Uuid, session: &str) -> Admitted {
    if let Some(resumed) = shard.resume(id, session) {
        return resumed;
    }
    // A logout's final save of this character still on its way here: the claim waits for it.
    pump_until(shard, Duration::from_secs(20), |s| {
        !s.final_save_in_flight(id)
    })
    .await;
    let route = route_login(
        stores.placement.as_ref(),
        &stores.characters,
        &stores.directory,
        id,
    )
    .await
    .unwrap();
    let loaded = stores
        .loader()
        .claim_and_load(id, route.floor)
        .await
        .unwrap();
    shard
        .admit(
            loaded,
            Arrival::Login {
                session_token: session.into(),
            },
        )
        .unwrap()
}

/// Runs pulses (yielding to the saver) until `done` holds, failing after `limit`.
pub(crate) async fn pump_until(
    shard: &mut Shard,
    limit: Duration,
    mut done: impl FnMut(&mut Shard) -> bool,
) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done(shard) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not reached within {limit:?}"
        );
        shard.tick();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub(crate) use shardkeep_testkit::{pg_addr, proxied_pg};

/// Rows, checkpoints and retry jobs: rows and jobs over `pool` (e.g. one behind a fault proxy),
/// checkpoints in `redis`. No worker takes the retry signals; jobs wait in their table.
pub(crate) fn rows_checkpoints_and_jobs(pg: PostgresBackend, redis: RedisBackend) -> ShardStores {
    let (retry, _signals) =
        shardkeep::retry::RetryQueue::new(pg.clone(), 16, Arc::new(shardkeep::clock::SystemClock));
    ShardStores {
        characters: Some(CharacterStore::new(pg)),
        checkpoints: Some(CheckpointStore::new(redis)),
        placement: None,
        audit: None,
        retry: Some(retry),
    }
}

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
