//! Test support for shardkeep's integration tests.
//!
//! Postgres: tests take a fresh database with every migration applied from
//! `#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]`.
//! Redis: [`TestRedis::new`] gives each test its own namespace on the server named by `REDIS_URL`
//! (default `redis://127.0.0.1:6379`), and deletes every key of that namespace when dropped, so
//! tests run in parallel and leave nothing behind.

//!
//! - [`faults`] — a TCP proxy that stalls or cuts a store connection (tests and the simulator).
//! - [`mod@coord_drivers`] — coordination records on each driver, for the conformance tests.
//! - [`embedded`] — the embedded store on a temporary file, and the drivers of each tier.
//! - [`fixtures`] — characters for tests.
//! - [`model`] — a small game model for tests of the core that need one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod claim_plans;
pub mod cluster;
pub mod coord_drivers;
pub mod embedded;
pub mod faults;
pub mod fixtures;
pub mod job_drivers;
pub mod model;
pub mod pgbouncer;

pub use coord_drivers::{CoordDriver, coord_drivers};
pub use embedded::{AuditDrivers, CharacterDrivers, CheckpointDrivers, TestSqlite};
pub use job_drivers::{JobDriver, JobDrivers};
pub use pgbouncer::pg;

use shardkeep::backend::redis::{RedisConn, RedisTimeouts, ScanCursor};
use shardkeep::{Coordination, CoordinationConfig, Keyspace, RedisBackend};

/// Address of the Redis server tests use.
pub fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// The standalone Redis server the benchmarks' peers use: `REDIS_STANDALONE_URL` when the suite
/// runs on a cluster, else [`redis_url`].
pub fn standalone_redis_url() -> String {
    std::env::var("REDIS_STANDALONE_URL").unwrap_or_else(|_| redis_url())
}

/// The Redis Cluster the suite runs on, when it does.
pub fn cluster_redis_url() -> Option<String> {
    redis_is_cluster().then(redis_url)
}

/// A Redis URL on which nothing listens (a port that was just free).
pub fn unreachable_redis_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    let port = listener.local_addr().expect("local addr").port();
    drop(listener);
    format!("redis://127.0.0.1:{port}")
}

/// A fresh namespace on the test Redis server, removed on drop.
pub struct TestRedis {
    url: String,
    keys: Keyspace,
    backend: RedisBackend,
    stop: tokio_util::sync::CancellationToken,
    /// Other handles on this namespace (through fault proxies), closed with it.
    others: std::sync::Mutex<Vec<RedisBackend>>,
}

/// The stop signals of the namespaces alive in this process, by namespace.
static NAMESPACE_STOPS: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<String, tokio_util::sync::CancellationToken>>,
> = std::sync::LazyLock::new(Default::default);

/// A token cancelled when the test namespace `namespace` is removed (its [`TestRedis`] dropped),
/// for background writers that a test leaves running (a shard's saver and placement writer):
/// they stop before the namespace is swept, so nothing is written into it afterwards. A
/// namespace no [`TestRedis`] owns gets a token that is never cancelled.
pub fn namespace_stop(namespace: &str) -> tokio_util::sync::CancellationToken {
    let stops = NAMESPACE_STOPS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    stops
        .get(namespace)
        .map(tokio_util::sync::CancellationToken::child_token)
        .unwrap_or_default()
}

impl TestRedis {
    /// Connects with a new unique namespace.
    pub async fn new() -> Self {
        Self::with_url(redis_url()).await
    }

    /// Connects to `url` with a new unique namespace.
    pub async fn with_url(url: String) -> Self {
        let ns = format!("t-{}", uuid::Uuid::new_v4().simple());
        let keys = Keyspace::new(&ns).expect("test namespace is valid");
        let backend =
            RedisBackend::connect("REDIS_URL", &url, keys.clone(), RedisTimeouts::default())
                .await
                .unwrap_or_else(|e| panic!("tests need Redis (run scripts/test): {e}"));
        let stop = tokio_util::sync::CancellationToken::new();
        NAMESPACE_STOPS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(ns, stop.clone());
        Self {
            url,
            keys,
            backend,
            stop,
            others: std::sync::Mutex::default(),
        }
    }

    /// Closes `backend` (another handle on this namespace, such as one through a fault proxy)
    /// when this namespace is swept, as its own handle is: a writer left running on it writes
    /// nothing into the namespace afterwards.
    pub fn closes_with(&self, backend: &RedisBackend) {
        self.others
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(backend.clone());
    }

    /// The server URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The namespace's keyspace.
    pub fn keys(&self) -> &Keyspace {
        &self.keys
    }

    /// The backend handle, bound to this namespace.
    pub fn backend(&self) -> RedisBackend {
        self.backend.clone()
    }

    /// Coordination primitives in this namespace with default tunables.
    pub fn coordination(&self) -> Coordination {
        Coordination::new(self.backend(), CoordinationConfig::default())
    }

    /// A raw connection (routed by key on a cluster), for assertions on stored keys.
    pub async fn raw(&self) -> RedisConn {
        self.backend.conn()
    }

    /// Every key of this namespace, sorted (SCAN on every master, so it also works under a
    /// no-KEYS ACL and on a cluster).
    pub async fn all_keys(&self) -> Vec<String> {
        let mut found = Vec::new();
        for pattern in self.keys.namespace_patterns() {
            found.extend(keys_matching(&self.backend, &pattern).await);
        }
        found.sort();
        found.dedup();
        found
    }
}

/// Every key matching `pattern` on every master of `backend`'s deployment.
pub async fn keys_matching(backend: &RedisBackend, pattern: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut cursor = ScanCursor::START;
    loop {
        let (next, page) = backend
            .scan_page(cursor, pattern, 1000)
            .await
            .expect("scan");
        found.extend(page);
        cursor = next;
        if cursor.is_start() {
            break;
        }
    }
    found
}

/// A backend on the test deployment (`REDIS_URL`) bound to `namespace`, for raw reads and
/// sweeps outside a [`TestRedis`].
pub async fn redis_backend(namespace: &str) -> RedisBackend {
    let keys = Keyspace::new(namespace).expect("valid namespace");
    RedisBackend::connect("REDIS_URL", &redis_url(), keys, RedisTimeouts::default())
        .await
        .unwrap_or_else(|e| panic!("tests need Redis (run scripts/test): {e}"))
}

/// True when the tests run against a Redis Cluster (`REDIS_URL` lists several seed nodes).
pub fn redis_is_cluster() -> bool {
    redis_url().contains(',')
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        // Writers left running stop first: they are suspended while this runs, and find the
        // signal the next time they are polled, before they write again. Every clone of the
        // namespace's handle is closed, so a writer that does not watch the signal (a runtime
        // or workers a test left running) has each later command refused: nothing is written
        // into the namespace after its sweep.
        self.stop.cancel();
        self.backend.close();
        for other in self
            .others
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
        {
            other.close();
        }
        NAMESPACE_STOPS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(self.keys.namespace());
        // The sweep needs the async client (a cluster is walked master by master); it runs on
        // a runtime of its own so a test's runtime may be shutting down.
        let backend = self.backend.clone();
        let url = self.url.clone();
        let keys = self.keys.clone();
        let mut closed = vec![self.backend.clone()];
        closed.extend(
            self.others
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .cloned(),
        );
        let sweep = std::thread::spawn(move || {
            // Commands let through before the close reach the server first, so the sweep
            // finds what they wrote: their answers, or 200 ms (a command whose answer waits
            // for this thread's runtime, or a blocking read, was on the server long before).
            let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
            while closed.iter().any(|b| b.in_flight() > 0) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                drop(backend);
                if let Ok(fresh) =
                    RedisBackend::connect("REDIS_URL", &url, keys, RedisTimeouts::default()).await
                {
                    fresh.purge_namespace().await;
                }
            });
        });
        let _ = sweep.join();
    }
}

/// A private `redis-server` on a free port with a chosen eviction policy (the shared test
/// server's settings are never changed), killed on drop.
pub struct PrivateRedis {
    child: std::process::Child,
    /// Its URL.
    pub url: String,
}

impl PrivateRedis {
    /// Starts one whose `maxmemory-policy` is `policy`.
    pub async fn start(policy: &str) -> Self {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "no", "--maxmemory-policy", policy])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("the suite needs redis-server installed (scripts/test says how)");
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Self {
            child,
            url: format!("redis://127.0.0.1:{port}"),
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the stores of this pass reach Postgres (for a [`faults::FaultProxy`] in front of it):
/// `DATABASE_URL`'s server, or the suite's PgBouncer in the PgBouncer pass.
pub fn pg_addr() -> std::net::SocketAddr {
    let url = match pgbouncer::pass_pooler() {
        shardkeep::backend::postgres::PgPooler::None => {
            std::env::var("DATABASE_URL").expect("tests run with DATABASE_URL set")
        }
        _ => pgbouncer::pgbouncer_url("postgres"),
    };
    let options: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    let host = if options.get_host().starts_with('/') {
        "127.0.0.1"
    } else {
        options.get_host()
    };
    format!("{host}:{}", options.get_port()).parse().unwrap()
}

/// Connect options for `pool`'s database reached through `proxy` (started in front of
/// [`pg_addr`]), and the pooler to build the backend with: this pass's settings, so a fault
/// test goes through PgBouncer in the PgBouncer pass like every other store.
pub fn proxied_options(
    pool: &sqlx::PgPool,
    proxy: &faults::FaultProxy,
) -> (
    sqlx::postgres::PgConnectOptions,
    shardkeep::backend::postgres::PgPooler,
) {
    let pooler = pgbouncer::pass_pooler();
    let options = match pooler {
        shardkeep::backend::postgres::PgPooler::None => (*pool.connect_options()).clone(),
        _ => pgbouncer::bouncer_options(pool, pooler),
    }
    .host("127.0.0.1")
    .port(proxy.addr().port());
    (options, pooler)
}

/// A backend over a small pool (two connections, connected now) of [`proxied_options`].
pub async fn proxied_pg(
    pool: &sqlx::PgPool,
    proxy: &faults::FaultProxy,
) -> shardkeep::PostgresBackend {
    let (options, pooler) = proxied_options(pool, proxy);
    let proxied = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(std::time::Duration::from_millis(500))
        .connect_with(options)
        .await
        .unwrap();
    shardkeep::PostgresBackend::from_pool_through(proxied, pooler)
}
