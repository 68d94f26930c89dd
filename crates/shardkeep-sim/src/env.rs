//! The simulator's environment: a scratch database and namespace, fault proxies in front of
//! Postgres and Redis, the stores the shards and workers use through those proxies, and direct
//! connections the checker uses.

use std::net::SocketAddr;
use std::time::Duration;

use shardkeep::backend::postgres::PgPooler;

use super::SimError;
use shardkeep::audit::AuditStore;
use shardkeep::backend::redis::RedisTimeouts;
use shardkeep::backend::{PostgresBackend, RedisBackend};
use shardkeep::character::{
    BookkeepingRetention, CharacterLoader, CharacterStore, CheckpointStore,
};
use shardkeep::coord::Coordination;
use shardkeep::journal::{JournalWorkerConfig, SessionJournal};
use shardkeep::keyspace::Keyspace;
use shardkeep::placement::PlacementStore;
use shardkeep::queue::WorkQueueConfig;
use shardkeep::retry::RetryQueue;
use shardkeep::{Services, ServicesConfig};
use shardkeep_reference::game::ReferenceModel;

use super::workers::UPKEEP_PERIOD;
use shardkeep_reference::shard::ShardStores;
use shardkeep_testkit::faults::{FaultProxy, ProxySet};

/// Consumed-handoff markers in a run: twice the handoff payload's lifetime (a take retried
/// after a lost reply still finds its token consumed).
const CONSUMED_MARKER_TTL: shardkeep::Ttl = shardkeep::Ttl::from_static_secs(240);
/// Item-load and item-release ledgers, transfer activations and unsequenced job keys in a run:
/// longer than a phantom floor copy can still be committed — it decays after
/// `host_faults::FLOOR_LIFETIME`, its transfer retries for up to [`TRANSFER_WINDOW`], and a
/// zombie that released it after its owner's reload is evicted (its floor copies voided) within
/// a minute — and longer than any handoff.
const LEDGER_RETENTION: Duration = Duration::from_secs(360);
/// Longest a transfer of a floor item keeps retrying its commit (five attempts, each within the
/// shard's 30 s transfer budget).
const TRANSFER_WINDOW: Duration = Duration::from_secs(5 * 30);
const _: () = assert!(
    LEDGER_RETENTION.as_secs()
        >= super::host_faults::FLOOR_LIFETIME.as_secs() + TRANSFER_WINDOW.as_secs() + 60
);
/// The retention windows of a run whose workers run in `serve` processes: those prune with
/// serve's own defaults.
pub(super) const SERVES_RETENTION_NOTE: &str = "consumed handoff markers 4 min; the serve \
     processes prune with their defaults (item ledgers and transfer activations 30 days, \
     unsequenced job keys 7 days)";
/// The run's retention windows, as the report states them.
pub(super) const RETENTION_NOTE: &str = "compressed with time: consumed handoff markers 4 min, \
     item ledgers, transfer activations and unsequenced job keys 6 min";

/// Everything the simulation runs against.
pub(super) struct SimEnv {
    pub(super) db_url: String,
    /// Redis as given (a cluster's seed list, or one server).
    pub(super) redis_url: String,
    pub(super) keys: Keyspace,
    /// Direct connections (the checker, set-up), never faulted: the simulator's own Redis
    /// connection for what it reads raw, and its own pool as a backend.
    pub(super) redis_conn: shardkeep::backend::redis::RedisConn,
    pub(super) pg_direct: PostgresBackend,
    pub(super) redis_direct: RedisBackend,
    /// Connections through the fault proxies (the system under test).
    pub(super) pg: PostgresBackend,
    pub(super) redis: RedisBackend,
    pub(super) pg_proxy: FaultProxy,
    pub(super) redis_proxy: ProxySet,
    pub(super) coord: Coordination,
    pub(super) retry: RetryQueue,
    pub(super) journal: SessionJournal,
    pub(super) loader: CharacterLoader,
    /// The handles above and the workers `serve` runs, built once over the proxies; taken when
    /// the workers start.
    pub(super) services: Option<Services>,
}

fn addr_of(host: &str, port: u16) -> Result<SocketAddr, SimError> {
    let host = if host.starts_with('/') || host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    format!("{host}:{port}")
        .parse()
        .map_err(|e| SimError::Setup(format!("cannot proxy {host}:{port}: {e}")))
}

impl SimEnv {
    pub(super) async fn setup(
        database_url: &str,
        pooler: PgPooler,
        redis_url: &str,
        run: &str,
        signal_depth: usize,
    ) -> Result<Self, SimError> {
        let setup = |e: &dyn std::fmt::Display| SimError::Setup(e.to_string());
        let (server, _) = database_url.rsplit_once('/').unwrap_or((database_url, ""));
        let db_url = format!("{server}/shardkeep_sim_{run}");
        PostgresBackend::create_database_if_missing("DATABASE_URL", &db_url)
            .await
            .map_err(|e| setup(&e))?;
        let options: sqlx::postgres::PgConnectOptions =
            db_url.parse().map_err(|e: sqlx::Error| setup(&e))?;
        let options = PostgresBackend::options_for(options, pooler);
        let pool_direct = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options.clone())
            .await
            .map_err(|e| setup(&e))?;
        let pg_direct = PostgresBackend::from_pool_through(pool_direct, pooler);
        pg_direct.migrate().await.map_err(|e| setup(&e))?;
        let keys = Keyspace::new(&format!("sim-{run}")).map_err(|e| setup(&e))?;
        let redis_direct = RedisBackend::connect(
            "REDIS_URL",
            redis_url,
            keys.clone(),
            RedisTimeouts::default(),
        )
        .await
        .map_err(|e| setup(&e))?;

        let pg_proxy = FaultProxy::start(addr_of(options.get_host(), options.get_port())?)
            .await
            .map_err(|e| setup(&e))?;
        let proxied = options.host("127.0.0.1").port(pg_proxy.addr().port());
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(24)
            .acquire_timeout(Duration::from_secs(2))
            .connect_with(proxied)
            .await
            .map_err(|e| setup(&e))?;
        let pg = PostgresBackend::from_pool_through(pool, pooler);

        let redis_conn = redis_direct.conn();
        let timeouts = RedisTimeouts {
            connect: Duration::from_millis(500),
            response: Duration::from_millis(1500),
        };
        let (redis_proxy, redis) =
            shardkeep_testkit::faults::proxied_redis(redis_url, keys.clone(), timeouts)
                .await
                .map_err(|e| setup(&e))?;
        let mut config = ServicesConfig::new("sim-retry-worker", "serve");
        config.address = "sim://serve".into();
        config.retry_signal_depth = signal_depth;
        config.io_timeout = Duration::from_secs(2);
        config.retry.poll_interval = Duration::from_secs(1);
        config.retry.lease = Duration::from_secs(10);
        // Time is compressed: a crashed journal consumer's heartbeat lapses in 3 s, and dead
        // consumers are looked for every 2 s.
        config.journal_queue = WorkQueueConfig {
            heartbeat_ttl: shardkeep::ttl::Ttl::from_static_secs(3),
            ..WorkQueueConfig::default()
        };
        config.journal_worker = JournalWorkerConfig {
            recovery_interval: Duration::from_secs(2),
            ..JournalWorkerConfig::default()
        };
        config.maintenance_every = UPKEEP_PERIOD;
        // Time is compressed, retention windows too: minutes instead of days, so a long run
        // reaches the plateau of every bookkeeping table and key family well before the stretch
        // its stability verdict judges.
        config.coordination.consumed_marker_ttl = CONSUMED_MARKER_TTL;
        config.bookkeeping_retention = BookkeepingRetention {
            unsequenced_effects: LEDGER_RETENTION,
            item_loads: LEDGER_RETENTION,
            transfer_activations: LEDGER_RETENTION,
        };
        let services = Services::build(pg.clone(), redis.clone(), ReferenceModel::handle(), config)
            .map_err(|e| setup(&e))?;
        Ok(Self {
            db_url,
            redis_url: redis_url.to_owned(),
            keys,
            redis_conn,
            pg_direct,
            redis_direct,
            pg,
            redis,
            pg_proxy,
            redis_proxy,
            coord: services.coord.clone(),
            retry: services.retry.clone(),
            journal: services.journal.clone(),
            loader: services.loader.clone(),
            services: Some(services),
        })
    }

    /// The stores a shard writes through (the proxies).
    pub(super) fn shard_stores(&self) -> ShardStores {
        ShardStores {
            characters: Some(CharacterStore::new(self.pg.clone())),
            checkpoints: Some(CheckpointStore::new(self.redis.clone())),
            placement: Some(PlacementStore::new(self.redis.clone())),
            audit: Some(AuditStore::new(self.pg.clone())),
            retry: Some(self.retry.clone()),
        }
    }

    /// How a `serve` process reaches the run's stores: Postgres through the fault proxy, and
    /// standalone Redis too; a cluster directly (its node addresses are mapped to the proxies
    /// only inside this process).
    pub(super) fn serve_urls(&self) -> (String, String) {
        let database_url =
            shardkeep_testkit::faults::url_with_addr(&self.db_url, self.pg_proxy.addr());
        let redis_url = match self.redis_proxy.proxies() {
            [one] if !self.redis_direct.is_cluster() => {
                shardkeep_testkit::faults::url_with_addr(&self.redis_url, one.addr())
            }
            _ => self.redis_url.clone(),
        };
        (database_url, redis_url)
    }

    pub(super) fn loader(&self) -> CharacterLoader {
        self.loader.clone()
    }

    /// Drops the scratch database and the namespace's keys (unless kept).
    pub(super) async fn teardown(&self, keep: bool) {
        if keep {
            return;
        }
        self.pg.close().await;
        self.pg_direct.close().await;
        let _ = PostgresBackend::drop_database_if_exists("DATABASE_URL", &self.db_url).await;
        self.redis_direct.purge_namespace().await;
        let _ = std::fs::remove_dir_all(self.serve_log_dir());
    }

    /// Where the run's `serve` processes write their logs.
    pub(super) fn serve_log_dir(&self) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("{}-serves", self.keys.namespace()))
    }
}
