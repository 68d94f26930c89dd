//! The simulator's environment: a scratch database and namespace with fault proxies in front of
//! Postgres and Redis — or, in embedded mode, a scratch SQLite file whose outage hook is the
//! store fault — the stores the shards and workers use through them, and direct connections
//! the checker uses.

use std::net::SocketAddr;
use std::time::Duration;

use shardkeep::backend::postgres::PgPooler;

use std::sync::Arc;

use super::SimError;
use super::probe::Probe;
use shardkeep::SqliteBackend;
use shardkeep::backend::redis::RedisTimeouts;
use shardkeep::backend::{PostgresBackend, RedisBackend};
use shardkeep::character::{
    BookkeepingRetention, CharacterLoader, CharacterStore, CheckpointStore,
};
use shardkeep::clock::{Clock, SystemClock};
use shardkeep::coord::Coordination;
use shardkeep::coord::CoordinationConfig;
use shardkeep::journal::{JournalWorkerConfig, SessionJournal};
use shardkeep::keyspace::Keyspace;
use shardkeep::placement::PlacementStore;
use shardkeep::queue::WorkQueueConfig;
use shardkeep::retry::RetryQueue;
use shardkeep::{Services, ServicesConfig};
use shardkeep_reference::game::ReferenceModel;
use shardkeep_testkit::faults::{ProxyControl, ProxyMode};

use super::workers::UPKEEP_PERIOD;
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

/// Which store an outage fault cuts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outage {
    /// Redis (or, embedded, the file).
    Redis,
    /// Postgres (or, embedded, the file).
    Postgres,
}

/// Everything the simulation runs against.
pub(super) struct SimEnv {
    pub(super) keys: Keyspace,
    /// The engines: Postgres and Redis behind fault proxies, or the embedded store's file.
    pub(super) engines: Engines,
    pub(super) coord: Coordination,
    pub(super) retry: RetryQueue,
    pub(super) journal: SessionJournal,
    pub(super) loader: CharacterLoader,
    /// The handles above and the workers `serve` runs, built once over the proxies; taken when
    /// the workers start.
    pub(super) services: Option<Services>,
    /// The same handles for the shards' live-copy runtimes (their retry jobs signal those
    /// workers).
    pub(super) shard_services: Services,
}

/// The engines of a run.
pub(super) enum Engines {
    /// Postgres and Redis.
    Servers(Box<Servers>),
    /// One SQLite file (embedded mode).
    Embedded(Box<EmbeddedFile>),
}

/// Postgres and Redis, through fault proxies and directly.
pub(super) struct Servers {
    pub(super) db_url: String,
    /// Redis as given (a cluster's seed list, or one server).
    pub(super) redis_url: String,
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
}

/// The embedded store's file, opened twice: once for the system under test (its outage hook
/// is the store-outage fault) and once for the checker.
pub(super) struct EmbeddedFile {
    dir: std::path::PathBuf,
    pub(super) db: SqliteBackend,
    pub(super) direct: SqliteBackend,
    /// Until when the injected outage lasts (outages may overlap; the latest end wins).
    outage_until: std::sync::Mutex<Option<tokio::time::Instant>>,
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
        let config = services_config(signal_depth);
        let services = Services::build(pg.clone(), redis.clone(), ReferenceModel::handle(), config)
            .map_err(|e| setup(&e))?;
        let servers = Servers {
            db_url,
            redis_url: redis_url.to_owned(),
            redis_conn,
            pg_direct,
            redis_direct,
            pg,
            redis,
            pg_proxy,
            redis_proxy,
        };
        Ok(Self::over(
            keys,
            Engines::Servers(Box::new(servers)),
            services,
        ))
    }

    /// A run's environment in a fresh embedded store's file under the system's temporary
    /// directory (removed at teardown unless kept).
    pub(super) async fn embedded(run: &str, signal_depth: usize) -> Result<Self, SimError> {
        let setup = |e: &dyn std::fmt::Display| SimError::Setup(e.to_string());
        let dir = std::env::temp_dir().join(format!("shardkeep_sim_{run}"));
        std::fs::create_dir_all(&dir).map_err(|e| setup(&e))?;
        let url = format!("sqlite:{}", dir.join("sim.db").display());
        let db = SqliteBackend::connect("DATABASE_URL", &url)
            .await
            .map_err(|e| setup(&e))?;
        db.migrate().await.map_err(|e| setup(&e))?;
        let direct = SqliteBackend::connect("DATABASE_URL", &url)
            .await
            .map_err(|e| setup(&e))?;
        let keys = Keyspace::new(&format!("sim-{run}")).map_err(|e| setup(&e))?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let services = Services::embedded(
            db.clone(),
            &keys,
            ReferenceModel::handle(),
            services_config(signal_depth),
            clock,
        )
        .map_err(|e| setup(&e))?;
        let file = EmbeddedFile {
            dir,
            db,
            direct,
            outage_until: std::sync::Mutex::new(None),
        };
        Ok(Self::over(
            keys,
            Engines::Embedded(Box::new(file)),
            services,
        ))
    }

    fn over(keys: Keyspace, engines: Engines, services: Services) -> Self {
        Self {
            keys,
            engines,
            coord: services.coord.clone(),
            retry: services.retry.clone(),
            journal: services.journal.clone(),
            loader: services.loader.clone(),
            shard_services: services.share(),
            services: Some(services),
        }
    }
}

/// The services' tunables in a run: time is compressed.
fn services_config(signal_depth: usize) -> ServicesConfig {
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
    config
}

impl SimEnv {
    /// The checkpoint store a shard writes through (the proxies, or the faulted file).
    pub(super) fn sut_checkpoints(&self) -> CheckpointStore {
        match &self.engines {
            Engines::Servers(s) => CheckpointStore::new(s.redis.clone()),
            Engines::Embedded(f) => CheckpointStore::embedded(f.db.clone()),
        }
    }

    /// The character store of the system under test.
    pub(super) fn sut_characters(&self) -> CharacterStore {
        match &self.engines {
            Engines::Servers(s) => CharacterStore::new(s.pg.clone()),
            Engines::Embedded(f) => CharacterStore::embedded(f.db.clone()),
        }
    }

    /// Placement records of the system under test.
    pub(super) fn sut_placement(&self) -> PlacementStore {
        match &self.engines {
            Engines::Servers(s) => PlacementStore::new(s.redis.clone()),
            Engines::Embedded(f) => {
                PlacementStore::embedded(f.db.clone(), self.keys.clone(), Arc::new(SystemClock))
            }
        }
    }

    /// The durable store, read and written directly (never faulted).
    pub(super) fn probe(&self) -> Probe {
        match &self.engines {
            Engines::Servers(s) => Probe::Pg(s.pg_direct.clone()),
            Engines::Embedded(f) => Probe::Sqlite(f.direct.clone()),
        }
    }

    /// The character store, directly (set-up).
    pub(super) fn direct_characters(&self) -> CharacterStore {
        match &self.engines {
            Engines::Servers(s) => CharacterStore::new(s.pg_direct.clone()),
            Engines::Embedded(f) => CharacterStore::embedded(f.direct.clone()),
        }
    }

    /// Coordination records, directly (the checker).
    pub(super) fn direct_coord(&self) -> Coordination {
        match &self.engines {
            Engines::Servers(s) => {
                Coordination::new(s.redis_direct.clone(), CoordinationConfig::default())
            }
            Engines::Embedded(f) => Coordination::embedded(
                f.direct.clone(),
                self.keys.clone(),
                CoordinationConfig::default(),
                Arc::new(SystemClock),
            ),
        }
    }

    /// The journal, directly (depths).
    pub(super) fn direct_journal(&self) -> Option<SessionJournal> {
        match &self.engines {
            Engines::Servers(s) => {
                SessionJournal::new(s.redis_direct.clone(), WorkQueueConfig::default()).ok()
            }
            Engines::Embedded(f) => SessionJournal::embedded(
                f.direct.clone(),
                &self.keys,
                WorkQueueConfig::default(),
                Arc::new(SystemClock),
            )
            .ok(),
        }
    }

    /// Placement records, directly (the settle's checks).
    pub(super) fn direct_placement(&self) -> PlacementStore {
        match &self.engines {
            Engines::Servers(s) => PlacementStore::new(s.redis_direct.clone()),
            Engines::Embedded(f) => {
                PlacementStore::embedded(f.direct.clone(), self.keys.clone(), Arc::new(SystemClock))
            }
        }
    }

    /// The servers, when the run has them.
    pub(super) fn servers(&self) -> Option<&Servers> {
        match &self.engines {
            Engines::Servers(s) => Some(s),
            Engines::Embedded(_) => None,
        }
    }

    /// Fails the store named by `which` for `length`: a proxy cut, or the file's outage hook
    /// (both outage faults reach the one file; overlapping outages last until the later end).
    pub(super) fn outage_begin(&self, which: Outage, length: Duration) {
        match &self.engines {
            Engines::Servers(s) => match which {
                Outage::Redis => s.redis_proxy.set_mode(ProxyMode::Cut),
                Outage::Postgres => s.pg_proxy.set_mode(ProxyMode::Cut),
            },
            Engines::Embedded(f) => {
                let end = tokio::time::Instant::now() + length;
                if let Ok(mut until) = f.outage_until.lock() {
                    let end = until.map_or(end, |u| u.max(end));
                    *until = Some(end);
                    f.db.fail_for(end - tokio::time::Instant::now());
                }
            }
        }
    }

    /// Ends the outage of `which` (on the file, only once no other outage lasts longer).
    pub(super) fn outage_end(&self, which: Outage) {
        match &self.engines {
            Engines::Servers(s) => match which {
                Outage::Redis => s.redis_proxy.set_mode(ProxyMode::Pass),
                Outage::Postgres => s.pg_proxy.set_mode(ProxyMode::Pass),
            },
            Engines::Embedded(f) => {
                if let Ok(until) = f.outage_until.lock()
                    && until.is_none_or(|u| u <= tokio::time::Instant::now())
                {
                    f.db.end_outage();
                }
            }
        }
    }

    /// Ends every injected outage now (the settle).
    pub(super) fn heal(&self) {
        match &self.engines {
            Engines::Servers(s) => {
                s.pg_proxy.set_mode(ProxyMode::Pass);
                s.redis_proxy.set_mode(ProxyMode::Pass);
            }
            Engines::Embedded(f) => {
                if let Ok(mut until) = f.outage_until.lock() {
                    *until = None;
                }
                f.db.end_outage();
            }
        }
    }

    /// Where the run's rows are kept, for the report: the scratch database or the file.
    pub(super) fn scratch_name(&self) -> String {
        match &self.engines {
            Engines::Servers(s) => s.db_url.rsplit('/').next().unwrap_or_default().to_owned(),
            Engines::Embedded(f) => f.dir.join("sim.db").display().to_string(),
        }
    }

    /// How a `serve` process reaches the run's stores: Postgres through the fault proxy, and
    /// standalone Redis too; a cluster directly (its node addresses are mapped to the proxies
    /// only inside this process).
    pub(super) fn serve_urls(&self) -> Option<(String, String)> {
        let s = self.servers()?;
        let database_url = shardkeep_testkit::faults::url_with_addr(&s.db_url, s.pg_proxy.addr());
        let redis_url = match s.redis_proxy.proxies() {
            [one] if !s.redis_direct.is_cluster() => {
                shardkeep_testkit::faults::url_with_addr(&s.redis_url, one.addr())
            }
            _ => s.redis_url.clone(),
        };
        Some((database_url, redis_url))
    }

    pub(super) fn loader(&self) -> CharacterLoader {
        self.loader.clone()
    }

    /// Drops the scratch database and the namespace's keys (unless kept).
    pub(super) async fn teardown(&self, keep: bool) {
        if keep {
            return;
        }
        match &self.engines {
            Engines::Servers(s) => {
                s.pg.close().await;
                s.pg_direct.close().await;
                let _ = PostgresBackend::drop_database_if_exists("DATABASE_URL", &s.db_url).await;
                s.redis_direct.purge_namespace().await;
            }
            Engines::Embedded(f) => {
                f.db.close().await;
                f.direct.close().await;
                let _ = std::fs::remove_dir_all(&f.dir);
            }
        }
        let _ = std::fs::remove_dir_all(self.serve_log_dir());
    }

    /// Where the run's `serve` processes write their logs.
    pub(super) fn serve_log_dir(&self) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("{}-serves", self.keys.namespace()))
    }
}
