//! One call from a game's configuration to a running shard: connect the stores (Postgres and
//! Redis, or one SQLite file), apply the migrations when asked, build the services, spawn their
//! workers and start the runtime; and one call to stop it all in order.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{LiveConfig, LiveGame, Runtime, ShutdownReport, StartError};
use crate::backend::redis::RedisTimeouts;
use crate::backend::sqlite::is_sqlite_url;
use crate::{
    ConnectError, Keyspace, PostgresBackend, RedisBackend, Services, ServicesConfig, ServicesError,
    SqliteBackend, Workers,
};

/// Where a shard keeps its characters and how it runs.
#[derive(Debug, Clone)]
pub struct Launch {
    /// Postgres (`postgres://…`), or a SQLite file (`sqlite:<path>`: embedded mode, no Redis).
    pub database_url: String,
    /// Redis beside Postgres (a comma-separated list of seeds for a cluster); `None` in
    /// embedded mode.
    pub redis_url: Option<String>,
    /// Prefix of every Redis key (and embedded record) of the game.
    pub namespace: String,
    /// Apply shardkeep's migrations (or create the file) first. Without it, a database with
    /// migrations pending is refused ([`LaunchError::MigrationsPending`]).
    pub migrate: bool,
    /// Postgres connections of the process.
    pub max_connections: u32,
    /// The services and their workers (the instance id is the shard's, made unique).
    pub services: ServicesConfig,
    /// The runtime.
    pub live: LiveConfig,
}

impl Launch {
    /// A shard `shard_id` over `database_url` (and `redis_url` beside Postgres), with the
    /// defaults of every part.
    pub fn new(database_url: &str, redis_url: Option<&str>, shard_id: &str) -> Self {
        let instance = format!("{shard_id}-{}", uuid::Uuid::now_v7().simple());
        let mut services = ServicesConfig::new(&instance, "game_server");
        services.shard_id = Some(shard_id.to_owned());
        Self {
            database_url: database_url.to_owned(),
            redis_url: redis_url.map(str::to_owned),
            namespace: "shardkeep".into(),
            migrate: false,
            max_connections: 16,
            services,
            live: LiveConfig::new(shard_id),
        }
    }
}

/// A shard could not be launched; nothing is left running.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A store could not be reached (the message names the setting and what was tried).
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// A SQLite file beside a Redis URL, or Postgres without one.
    #[error("{0}")]
    Stores(&'static str),
    /// The namespace cannot prefix keys.
    #[error("namespace: {0}")]
    Namespace(#[from] crate::KeyError),
    /// The migrations failed.
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The database has migrations this build needs that were never applied (a runtime on an
    /// older schema would misread what it loads: an embedded file without its take-over column
    /// loads every character from its row). Run `shardkeep migrate`, or set [`Launch::migrate`].
    #[error(
        "the {store} schema is behind this build (migrations pending): run `shardkeep migrate` \
         first, or launch with `migrate` set"
    )]
    MigrationsPending {
        /// `Postgres` or `SQLite`.
        store: &'static str,
    },
    /// Which migrations the database holds could not be read.
    #[error("reading the {store} schema's migrations: {source}")]
    SchemaUnreadable {
        /// `Postgres` or `SQLite`.
        store: &'static str,
        /// The failure.
        source: sqlx::Error,
    },
    /// The services or their workers could not start.
    #[error(transparent)]
    Services(#[from] ServicesError),
    /// The runtime refused its configuration.
    #[error(transparent)]
    Start(#[from] StartError),
}

/// A running shard: its runtime, the services behind it and their workers.
pub struct Launched<G: LiveGame> {
    /// The runtime the game plays through.
    pub runtime: Runtime<G>,
    /// The handles behind it (for what the runtime does not cover: audit reads, operators).
    pub services: Services,
    workers: Workers,
    cancel: CancellationToken,
}

impl<G: LiveGame> std::fmt::Debug for Launched<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launched")
            .field("runtime", &self.runtime)
            .finish_non_exhaustive()
    }
}

impl<G: LiveGame> Runtime<G> {
    /// Connects, migrates when asked (and otherwise refuses a schema with migrations pending),
    /// builds the services with the game's model, spawns their workers and starts the runtime.
    /// Must run inside a tokio runtime.
    pub async fn launch(launch: Launch, game: G) -> Result<Launched<G>, LaunchError> {
        let model = game.model();
        let keys = Keyspace::new(&launch.namespace)?;
        let timeout = launch.live.io_timeout;
        let mut services = if is_sqlite_url(&launch.database_url) {
            if launch.redis_url.is_some() {
                return Err(LaunchError::Stores(
                    "a SQLite DATABASE_URL (embedded mode) keeps everything in its file: give no \
                     REDIS_URL beside it",
                ));
            }
            let db = SqliteBackend::connect("DATABASE_URL", &launch.database_url).await?;
            if launch.migrate {
                db.migrate().await?;
            }
            refuse_pending("SQLite", db.migrations_current().await)?;
            let clock = Arc::new(crate::clock::SystemClock);
            Services::embedded(db, &keys, model, launch.services, clock)?
        } else {
            let Some(redis_url) = &launch.redis_url else {
                return Err(LaunchError::Stores(
                    "a Postgres DATABASE_URL needs a REDIS_URL beside it",
                ));
            };
            let pg = PostgresBackend::connect(
                "DATABASE_URL",
                &launch.database_url,
                launch.max_connections,
                timeout,
            )
            .await?;
            if launch.migrate {
                pg.migrate().await?;
            }
            refuse_pending("Postgres", pg.migrations_current().await)?;
            let redis =
                RedisBackend::connect("REDIS_URL", redis_url, keys, RedisTimeouts::default())
                    .await?;
            Services::build(pg, redis, model, launch.services)?
        };
        let cancel = CancellationToken::new();
        let workers = services.spawn_workers(cancel.clone()).await?;
        let runtime = match Runtime::start(&services, game, launch.live) {
            Ok(runtime) => runtime,
            Err(err) => {
                cancel.cancel();
                workers.shutdown(timeout).await;
                return Err(err.into());
            }
        };
        Ok(Launched {
            runtime,
            services,
            workers,
            cancel,
        })
    }
}

/// A runtime starts only on a schema with every migration of this build applied.
fn refuse_pending(
    store: &'static str,
    current: Result<bool, sqlx::Error>,
) -> Result<(), LaunchError> {
    match current {
        Ok(true) => Ok(()),
        Ok(false) => Err(LaunchError::MigrationsPending { store }),
        Err(source) => Err(LaunchError::SchemaUnreadable { store, source }),
    }
}

impl<G: LiveGame> Launched<G> {
    /// Stops in order, within `bound` for each step: the runtime saves everyone and reports
    /// what is not durable, then the workers finish the work in hand, then the pools close.
    pub async fn shutdown(self, bound: Duration) -> ShutdownReport {
        let report = self.runtime.shutdown(bound).await;
        self.cancel.cancel();
        let late = self.workers.shutdown(bound).await;
        if !late.is_empty() {
            tracing::warn!(
                event = "workers_late",
                ?late,
                "stopped before their work was done"
            );
        }
        self.services.stores.close().await;
        report
    }
}
