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

/// True when `err` says the connection to Postgres failed or went away, not the statement: I/O,
/// TLS or protocol failures, the pool's own errors, SQLSTATE class 08 (connection exception)
/// and the server shutting down or starting up (57P01–57P03). The same statement may well
/// succeed on another connection.
pub(crate) fn connection_lost(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || ["57P01", "57P02", "57P03"].contains(&code.as_ref())
        }),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        _ => false,
    }
}

/// A pooled connection idle longer than this is checked with a round trip before it is handed
/// out; one used more recently is handed out as it is.
pub const PING_AFTER_IDLE: Duration = Duration::from_secs(2);

impl PostgresBackend {
    /// Pool settings shardkeep uses: at most `max_connections`, and a liveness round trip only
    /// for connections idle longer than [`PING_AFTER_IDLE`]. sqlx's default checks every
    /// connection on every checkout, which doubles the round trips of a one-statement write
    /// (an enqueue) on a busy pool, where connections are never idle long; a connection that
    /// broke since its last use fails its statement, and the pool then replaces it.
    pub fn pool_options(max_connections: u32) -> PgPoolOptions {
        PgPoolOptions::new()
            .max_connections(max_connections)
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for > PING_AFTER_IDLE {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
    }

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
        let pool = Self::pool_options(max_connections)
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

#[cfg(test)]
mod tests {
    use super::connection_lost;

    #[test]
    fn a_lost_connection_is_told_from_a_failed_statement() {
        assert!(connection_lost(&sqlx::Error::Io(std::io::Error::other(
            "reset"
        ))));
        assert!(connection_lost(&sqlx::Error::PoolTimedOut));
        assert!(connection_lost(&sqlx::Error::Protocol(
            "unexpected message".into()
        )));
        assert!(!connection_lost(&sqlx::Error::RowNotFound));
        assert!(!connection_lost(&sqlx::Error::ColumnNotFound(
            "state".into()
        )));
    }
}
