//! The Postgres connection pool and the embedded migrations.

use std::time::Duration;

use std::str::FromStr;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};

use super::{ConnectError, one_line, redact_url};

/// The SQL migrations, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// A cheap-to-clone handle on the Postgres pool.
#[derive(Debug, Clone)]
pub struct PostgresBackend {
    pool: PgPool,
}

/// One migration that [`PostgresBackend::migrate`] applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedMigration {
    /// Its version number.
    pub version: i64,
    /// Its description (from the file name).
    pub description: String,
}

impl PostgresBackend {
    /// Connects to `url` (named by `setting` in errors), failing within `timeout`.
    pub async fn connect(
        setting: &'static str,
        url: &str,
        max_connections: u32,
        timeout: Duration,
    ) -> Result<Self, ConnectError> {
        let fail = |reason: String| ConnectError {
            setting,
            target: redact_url(url),
            reason,
        };
        let options = PgConnectOptions::from_str(url).map_err(|e| fail(one_line(&e)))?;
        // One direct connection first, so an unreachable server reports its real cause
        // (refused, unknown host, bad password) rather than a pool timeout.
        let probe = tokio::time::timeout(timeout, options.connect())
            .await
            .map_err(|_| fail(format!("no answer within {} s", timeout.as_secs())))?
            .map_err(|e| fail(one_line(&e)))?;
        probe.close().await.map_err(|e| fail(one_line(&e)))?;
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(timeout)
            .connect_with(options)
            .await
            .map_err(|e| fail(one_line(&e)))?;
        Ok(Self { pool })
    }

    /// Creates the database named in `url` when it does not exist; true when it created it.
    pub async fn create_database_if_missing(
        setting: &'static str,
        url: &str,
    ) -> Result<bool, ConnectError> {
        use sqlx::migrate::MigrateDatabase;
        let fail = |reason: String| ConnectError {
            setting,
            target: redact_url(url),
            reason,
        };
        if sqlx::Postgres::database_exists(url)
            .await
            .map_err(|e| fail(one_line(&e)))?
        {
            return Ok(false);
        }
        sqlx::Postgres::create_database(url)
            .await
            .map_err(|e| fail(one_line(&e)))?;
        Ok(true)
    }

    /// Wraps an existing pool (tests get one per fresh database).
    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool }
    }

    /// The pool, for store adapters inside this crate.
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies every embedded migration not yet applied, returning the ones it applied.
    pub async fn migrate(&self) -> Result<Vec<AppliedMigration>, sqlx::migrate::MigrateError> {
        let before = self.applied_versions().await?;
        MIGRATOR.run(&self.pool).await?;
        Ok(MIGRATOR
            .iter()
            .filter(|m| !m.migration_type.is_down_migration() && !before.contains(&m.version))
            .map(|m| AppliedMigration {
                version: m.version,
                description: m.description.to_string(),
            })
            .collect())
    }

    /// True when every embedded migration has been applied.
    pub async fn migrations_current(&self) -> Result<bool, sqlx::Error> {
        let applied = self.applied_versions().await?;
        Ok(MIGRATOR
            .iter()
            .filter(|m| !m.migration_type.is_down_migration())
            .all(|m| applied.contains(&m.version)))
    }

    async fn applied_versions(&self) -> Result<Vec<i64>, sqlx::Error> {
        let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
            .fetch_one(&self.pool)
            .await?;
        if !exists {
            return Ok(Vec::new());
        }
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
            .fetch_all(&self.pool)
            .await
    }

    /// Checks that a connection can be acquired and answer a query.
    pub async fn ping(&self) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map(|_| ())
    }

    /// Closes the pool.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}
