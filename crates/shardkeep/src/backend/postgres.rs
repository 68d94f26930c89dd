//! The Postgres connection pool and the embedded migrations.

use std::time::Duration;

use std::str::FromStr;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Executor, PgPool, Postgres, Transaction};

use super::pg_exec::{self, PINNED_BEGIN};
pub use super::pg_exec::{PgExec, PgPooler, PgSession, UnknownPooler};
use super::{ConnectError, one_line, redact_url};

/// The SQL migrations, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// A cheap-to-clone handle on the Postgres pool.
#[derive(Debug, Clone)]
pub struct PostgresBackend {
    pool: PgPool,
    pooler: PgPooler,
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

/// The key of the transaction-scoped advisory lock migrations take through a pooler.
const MIGRATION_LOCK: i64 = 0x7368_6172_646b_6565; // "shardkee"

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

    /// `options` adjusted for `pooler`: through a transaction-mode pooler no statement cache
    /// (a cached statement lives on one server only) and no `extra_float_digits` startup
    /// parameter (PgBouncer refuses startup parameters it does not track).
    pub fn options_for(options: PgConnectOptions, pooler: PgPooler) -> PgConnectOptions {
        if pooler.pins_transactions() {
            options.statement_cache_capacity(0).extra_float_digits(None)
        } else {
            options
        }
    }

    /// Connects to `url` (named by `setting` in errors), failing within `timeout`.
    pub async fn connect(
        setting: &'static str,
        url: &str,
        max_connections: u32,
        timeout: Duration,
    ) -> Result<Self, ConnectError> {
        Self::connect_through(setting, url, max_connections, timeout, PgPooler::None).await
    }

    /// Connects to `url` with `pooler` between shardkeep and Postgres (see [`PgPooler`]).
    pub async fn connect_through(
        setting: &'static str,
        url: &str,
        max_connections: u32,
        timeout: Duration,
        pooler: PgPooler,
    ) -> Result<Self, ConnectError> {
        let fail = |reason: String| ConnectError {
            setting,
            target: redact_url(url),
            reason,
        };
        let options = PgConnectOptions::from_str(url).map_err(|e| fail(one_line(&e)))?;
        let options = Self::options_for(options, pooler);
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
        Ok(Self { pool, pooler })
    }

    /// Creates the database named in `url` when it does not exist; true when it created it.
    /// Works through a transaction-mode pooler too: the check runs in its own transaction on
    /// the server's `postgres` database and the creation is one plain statement.
    pub async fn create_database_if_missing(
        setting: &'static str,
        url: &str,
    ) -> Result<bool, ConnectError> {
        let work = async {
            let (name, mut conn) = maintenance_connection(url).await?;
            let mut tx = conn.begin_with(PINNED_BEGIN).await?;
            let exists: bool =
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                    .bind(&name)
                    .fetch_one(&mut *tx)
                    .await?;
            tx.commit().await?;
            if !exists {
                let create = format!("CREATE DATABASE {}", quoted(&name));
                conn.execute(sqlx::AssertSqlSafe(create)).await?;
            }
            conn.close().await?;
            Ok::<_, sqlx::Error>(!exists)
        };
        work.await.map_err(|e| connect_error(setting, url, &e))
    }

    /// Drops the database named in `url` when it exists, ending its sessions first (Postgres
    /// 13 and later); plain statements only, so a transaction-mode pooler passes them.
    pub async fn drop_database_if_exists(
        setting: &'static str,
        url: &str,
    ) -> Result<(), ConnectError> {
        let work = async {
            let (name, mut conn) = maintenance_connection(url).await?;
            let drop = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", quoted(&name));
            conn.execute(sqlx::AssertSqlSafe(drop)).await?;
            conn.close().await
        };
        work.await.map_err(|e| connect_error(setting, url, &e))
    }

    /// Wraps an existing pool that reaches Postgres with no pooler between (tests get one per
    /// fresh database).
    pub fn from_pool(pool: PgPool) -> Self {
        Self::from_pool_through(pool, PgPooler::None)
    }

    /// Wraps an existing pool that reaches Postgres through `pooler`; its connect options should
    /// come from [`PostgresBackend::options_for`].
    pub fn from_pool_through(pool: PgPool, pooler: PgPooler) -> Self {
        Self { pool, pooler }
    }

    /// What stands between this pool and Postgres.
    pub fn pooler(&self) -> PgPooler {
        self.pooler
    }

    /// An executor for one statement at a time, safe for the pooler (see [`PgExec`]).
    pub fn exec(&self) -> PgExec<'_> {
        PgExec {
            pool: &self.pool,
            pooler: self.pooler,
        }
    }

    /// Whether the server runs autovacuum. shardkeep's retry jobs, job effects and item lineage
    /// are updated and deleted all the time; without autovacuum their tables and the rows'
    /// TOAST only grow (a 30-minute simulation on such a server bloats `characters` 50-fold).
    pub async fn autovacuum_on(&self) -> Result<bool, sqlx::Error> {
        let setting: String = sqlx::query_scalar("SHOW autovacuum")
            .fetch_one(self.exec())
            .await?;
        Ok(setting == "on")
    }

    /// Opens a transaction, the way the pooler needs.
    pub async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        pg_exec::begin(&self.pool, self.pooler).await
    }

    /// Opens a transaction that cannot hold its locks longer than `bound`: Postgres ends a
    /// statement of it that runs longer (`statement_timeout`), and ends the session when the
    /// transaction sits idle longer (`idle_in_transaction_session_timeout`: its client hung, its
    /// process stalled, its network went away), releasing every row it locked. Set in the
    /// statement that opens the transaction, so it costs no round trip.
    pub async fn begin_bounded(
        &self,
        bound: std::time::Duration,
    ) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        pg_exec::begin_bounded(&self.pool, self.pooler, bound).await
    }

    /// A connection for a few statements in a row (see [`PgSession`]).
    pub async fn session(&self) -> Result<PgSession, sqlx::Error> {
        PgSession::open(&self.pool, self.pooler).await
    }

    /// Applies every embedded migration not yet applied, returning the ones it applied.
    ///
    /// All of them run inside one transaction (each in a savepoint of it) holding a
    /// transaction-scoped advisory lock: concurrent migrators wait for each other, the one that
    /// waited finds the work done and reports nothing applied, and a failed migration leaves
    /// the schema as it was. Through a transaction-mode pooler the one transaction also keeps
    /// every statement on one server, where sqlx's session-scoped lock would be left held on
    /// whichever server took it.
    pub async fn migrate(&self) -> Result<Vec<AppliedMigration>, sqlx::migrate::MigrateError> {
        let migrator = Migrator {
            migrations: MIGRATOR.migrations.clone(),
            ignore_missing: MIGRATOR.ignore_missing,
            locking: false,
            no_tx: MIGRATOR.no_tx,
            table_name: MIGRATOR.table_name.clone(),
            create_schemas: MIGRATOR.create_schemas.clone(),
        };
        if self.pooler.pins_transactions() {
            let mut tx = self.begin().await?;
            let before = migrate_in(&migrator, &mut tx).await?;
            tx.commit().await?;
            return Ok(newly_applied(&before));
        }
        // Without a pooler sqlx's own session lock is taken as well (first, released after
        // the commit), so a migrator that takes only that one (`sqlx migrate run`, an older
        // shardkeep) still waits for this one.
        use sqlx::migrate::Migrate;
        let mut conn = self.pool.acquire().await?;
        conn.lock().await?;
        let applied = async {
            let mut tx = conn.begin().await?;
            let before = migrate_in(&migrator, &mut tx).await?;
            tx.commit().await?;
            Ok::<_, sqlx::migrate::MigrateError>(before)
        }
        .await;
        conn.unlock().await?;
        Ok(newly_applied(&applied?))
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
        let mut conn = self.session().await?;
        let versions = applied_versions(&mut conn).await?;
        conn.finish().await?;
        Ok(versions)
    }

    /// Checks that a connection can be acquired and answer a query.
    pub async fn ping(&self) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT 1")
            .execute(self.exec())
            .await
            .map(|_| ())
    }

    /// Closes the pool.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// Runs `migrator` inside `tx` under the transaction-scoped migration lock; the versions that
/// were applied before.
async fn migrate_in(
    migrator: &Migrator,
    tx: &mut sqlx::PgConnection,
) -> Result<Vec<i64>, sqlx::migrate::MigrateError> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *tx)
        .await?;
    let before = applied_versions(tx).await?;
    migrator.run_direct(None, tx, false).await?;
    Ok(before)
}

/// The embedded migrations not among `before`.
fn newly_applied(before: &[i64]) -> Vec<AppliedMigration> {
    MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration() && !before.contains(&m.version))
        .map(|m| AppliedMigration {
            version: m.version,
            description: m.description.to_string(),
        })
        .collect()
}

/// The database `url` names (like libpq, the user's own when it names none) and a connection to
/// the same server's `postgres` database to create or drop it from, set up for a
/// transaction-mode pooler (it works without one too).
async fn maintenance_connection(url: &str) -> Result<(String, sqlx::PgConnection), sqlx::Error> {
    let options = PgConnectOptions::from_str(url)?;
    let name = options
        .get_database()
        .filter(|name| !name.is_empty())
        .unwrap_or(options.get_username())
        .to_owned();
    let maintenance =
        PostgresBackend::options_for(options.database("postgres"), PgPooler::Transaction);
    Ok((name, maintenance.connect().await?))
}

/// `name` as a quoted SQL identifier.
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A failure to use `url` (named by `setting`), in one line with the password redacted.
fn connect_error(setting: &'static str, url: &str, err: &sqlx::Error) -> ConnectError {
    ConnectError {
        setting,
        target: redact_url(url),
        reason: one_line(err),
    }
}

/// The versions `_sqlx_migrations` records as applied (none before the first migration).
async fn applied_versions(conn: &mut sqlx::PgConnection) -> Result<Vec<i64>, sqlx::Error> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    if !exists {
        return Ok(Vec::new());
    }
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
        .fetch_all(&mut *conn)
        .await
}

#[cfg(test)]
mod tests {
    use super::connection_lost;

    #[test]
    fn a_database_name_is_quoted_as_an_identifier() {
        assert_eq!(super::quoted("shardkeep"), "\"shardkeep\"");
        assert_eq!(super::quoted("a\"b"), "\"a\"\"b\"");
    }

    #[test]
    fn every_migration_can_run_inside_the_one_migration_transaction() {
        let outside: Vec<i64> = super::MIGRATOR
            .iter()
            .filter(|m| m.no_tx)
            .map(|m| m.version)
            .collect();
        assert!(
            outside.is_empty(),
            "migrations {outside:?} need to run outside a transaction; PostgresBackend::migrate \
             runs them all in one"
        );
    }

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
