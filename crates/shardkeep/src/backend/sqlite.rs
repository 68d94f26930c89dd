//! The embedded store: one SQLite file in WAL mode, for a game with one shard process, a
//! laptop or a first look, with no Postgres or Redis to run. Selected by a `DATABASE_URL` of
//! the form `sqlite:<path>` (sqlx's convention). Its schema (`migrations_sqlite/`) holds the
//! tables of the Postgres schema and, in the same file, what Redis holds otherwise.
//!
//! A file that cannot be opened or created, one that is not a SQLite database, and one written
//! by a newer shardkeep each fail with one line naming the setting and the path.

use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::sqlite::{SqliteSynchronous, SqliteTransaction};

use super::ConnectError;
use super::one_line;
use super::postgres::AppliedMigration;

/// The embedded store's migrations.
pub static SQLITE_MIGRATOR: Migrator = sqlx::migrate!("./migrations_sqlite");

/// True when `url` selects the embedded store (`sqlite:<path>`, `sqlite://<path>`).
pub fn is_sqlite_url(url: &str) -> bool {
    url.trim_start()
        .get(..7)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("sqlite:"))
}

/// Each connection's page cache, in KiB (SQLite reads a negative `cache_size` as KiB): at most
/// 64 MiB over the pool's four connections.
const CACHE_KIB: i64 = -16 * 1024;

/// How long a statement waits for the file's write lock before it fails.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// A pool over the embedded store's file. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SqliteBackend {
    pool: SqlitePool,
    path: String,
    /// Until when every call fails (the outage fault hook), shared by clones.
    outage_until: std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>,
    /// Until when every write hangs before it starts (the stall fault hook), shared by clones.
    stall_until: std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>,
    /// Taken before a write transaction borrows a connection: writers of this process queue
    /// here, in order, instead of each holding a pooled connection while SQLite's busy handler
    /// waits for the file's write lock (four waiting writers would leave no connection for a
    /// read).
    write_turn: std::sync::Arc<tokio::sync::Mutex<()>>,
}

/// A write transaction of the embedded store, holding this process's write turn until it
/// commits or rolls back. Dereferences to the connection it runs on.
///
/// Dropped unfinished (a refused or read-only exit), it rolls back on a task of its own that
/// keeps the write turn until the rollback is done: the next writer of this process never
/// finds the file's write lock still held by it and waits in SQLite's busy handler.
#[derive(Debug)]
pub struct WriteTransaction {
    /// `Some` until commit or rollback.
    tx: Option<SqliteTransaction<'static>>,
    turn: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl WriteTransaction {
    /// Commits, then gives the write turn to the next writer.
    pub async fn commit(mut self) -> Result<(), sqlx::Error> {
        match self.tx.take() {
            Some(tx) => tx.commit().await,
            None => Ok(()),
        }
    }

    /// Rolls back now, then gives the write turn to the next writer.
    pub async fn rollback(mut self) -> Result<(), sqlx::Error> {
        match self.tx.take() {
            Some(tx) => tx.rollback().await,
            None => Ok(()),
        }
    }

    fn open(&self) -> &SqliteTransaction<'static> {
        self.tx
            .as_ref()
            .expect("a write transaction is open until it ends")
    }
}

impl Drop for WriteTransaction {
    fn drop(&mut self) {
        let (Some(tx), turn) = (self.tx.take(), self.turn.take()) else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = tx.rollback().await;
                drop(turn);
            });
        }
    }
}

impl std::ops::Deref for WriteTransaction {
    type Target = sqlx::SqliteConnection;

    fn deref(&self) -> &Self::Target {
        self.open()
    }
}

impl std::ops::DerefMut for WriteTransaction {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.tx
            .as_mut()
            .expect("a write transaction is open until it ends")
    }
}

/// The error every call of the embedded store returns while an outage is injected.
pub const OUTAGE_MESSAGE: &str = "embedded store unavailable (injected outage)";

impl SqliteBackend {
    /// Opens (creating it when missing) the file `url` names, in WAL mode with full syncs, and
    /// checks that it is a SQLite database not written by a newer shardkeep. `setting` names
    /// where the URL came from, for the error.
    pub async fn connect(setting: &'static str, url: &str) -> Result<Self, ConnectError> {
        let path = url
            .trim()
            .trim_start_matches("sqlite://")
            .trim_start_matches("sqlite:")
            .split('?')
            .next()
            .unwrap_or_default()
            .to_owned();
        let fail = |reason: String| ConnectError {
            setting,
            target: url.to_owned(),
            reason,
        };
        if path.is_empty() || path == ":memory:" {
            return Err(fail(
                "name a file, e.g. sqlite:shardkeep.db (an in-memory database would be lost with \
                 the process)"
                    .into(),
            ));
        }
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| fail(one_line(&e)))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT)
            // A page cache larger than SQLite's 2 MB default, so a write finds more of the pages
            // it touches in memory. No memory map: an I/O error on a mapped file arrives as a
            // signal that ends the process, where a read's error is a failed call.
            .pragma("cache_size", CACHE_KIB.to_string());
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(BUSY_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(|e| fail(open_failure(&path, &e)))?;
        let backend = Self {
            pool,
            path,
            outage_until: Default::default(),
            stall_until: Default::default(),
            write_turn: Default::default(),
        };
        // Reading the schema catalogue is what tells a file that is not a database.
        sqlx::query("SELECT count(*) FROM sqlite_master")
            .execute(&backend.pool)
            .await
            .map_err(|e| fail(open_failure(&backend.path, &e)))?;
        if let Some(newer) = backend
            .newer_versions()
            .await
            .map_err(|e| fail(open_failure(&backend.path, &e)))?
        {
            backend.pool.close().await;
            return Err(fail(format!(
                "{} was written by a newer shardkeep (schema version {newer}; this build knows up \
                 to {}): upgrade shardkeep to use it",
                backend_path_label(url),
                latest_version()
            )));
        }
        Ok(backend)
    }

    /// The file's path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The pool, bypassing the outage hook (tests and tools that inspect the file).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The pool for one call of a store adapter: an error while an outage is injected.
    pub fn reader(&self) -> Result<&SqlitePool, sqlx::Error> {
        self.available()?;
        Ok(&self.pool)
    }

    /// Opens a write transaction once this process's earlier writers are done: it takes the
    /// file's write lock at once (`BEGIN IMMEDIATE`), so a transaction that reads and then
    /// writes never fails on a lock upgrade. An error while an outage is injected.
    pub async fn begin(&self) -> Result<WriteTransaction, sqlx::Error> {
        self.available()?;
        self.wait_out_stall().await;
        let turn = self.write_turn.clone().lock_owned().await;
        self.available()?;
        let tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        Ok(WriteTransaction {
            tx: Some(tx),
            turn: Some(turn),
        })
    }

    /// The store-outage fault hook: every call of the store adapters (through [`Self::reader`]
    /// and [`Self::begin`]) fails for `stretch` from now, as a lost database server's would.
    /// A transaction already open runs to its end. Shared by every clone of this backend.
    pub fn fail_for(&self, stretch: Duration) {
        if let Ok(mut until) = self.outage_until.lock() {
            *until = std::time::Instant::now().checked_add(stretch);
        }
    }

    /// The stall fault hook: every write transaction opened in the next `stretch` hangs until
    /// the stretch ends (a disk that stops taking writes; callers see their own timeouts), then
    /// goes on. Reads are not held. Shared by every clone of this backend.
    pub fn stall_writes_for(&self, stretch: Duration) {
        if let Ok(mut until) = self.stall_until.lock() {
            *until = std::time::Instant::now().checked_add(stretch);
        }
    }

    /// Ends an injected outage or stall at once.
    pub fn end_outage(&self) {
        for hook in [&self.outage_until, &self.stall_until] {
            if let Ok(mut until) = hook.lock() {
                *until = None;
            }
        }
    }

    /// Waits while a stall is injected, checking often so that [`Self::end_outage`] ends it.
    async fn wait_out_stall(&self) {
        loop {
            let stalled = self
                .stall_until
                .lock()
                .map(|until| until.is_some_and(|t| std::time::Instant::now() < t))
                .unwrap_or(false);
            if !stalled {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn available(&self) -> Result<(), sqlx::Error> {
        let down = self
            .outage_until
            .lock()
            .map(|until| until.is_some_and(|t| std::time::Instant::now() < t))
            .unwrap_or(false);
        if down {
            return Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                OUTAGE_MESSAGE,
            )));
        }
        Ok(())
    }

    /// Applies every embedded migration not yet applied (in one transaction each, the file's
    /// write lock serialising concurrent migrators), returning the ones it applied.
    pub async fn migrate(&self) -> Result<Vec<AppliedMigration>, sqlx::migrate::MigrateError> {
        let before = self.applied_versions().await?;
        SQLITE_MIGRATOR.run(&self.pool).await?;
        Ok(SQLITE_MIGRATOR
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
        Ok(SQLITE_MIGRATOR
            .iter()
            .filter(|m| !m.migration_type.is_down_migration())
            .all(|m| applied.contains(&m.version)))
    }

    /// Checks that the file answers a query (failing while an outage is injected, as every
    /// call of the store adapters does).
    pub async fn ping(&self) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT 1")
            .execute(self.reader()?)
            .await
            .map(|_| ())
    }

    /// Closes the pool (the WAL is checkpointed into the file when the last connection goes).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    async fn applied_versions(&self) -> Result<Vec<i64>, sqlx::Error> {
        let exists: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
        )
        .fetch_one(&self.pool)
        .await?;
        if exists == 0 {
            return Ok(Vec::new());
        }
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success ORDER BY version")
            .fetch_all(&self.pool)
            .await
    }

    /// The highest applied version this build does not know, if any.
    async fn newer_versions(&self) -> Result<Option<i64>, sqlx::Error> {
        let known: Vec<i64> = SQLITE_MIGRATOR.iter().map(|m| m.version).collect();
        Ok(self
            .applied_versions()
            .await?
            .into_iter()
            .filter(|v| !known.contains(v))
            .max())
    }
}

/// The newest schema version this build knows.
fn latest_version() -> i64 {
    SQLITE_MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

fn backend_path_label(url: &str) -> String {
    let path = url
        .trim()
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    format!("the file {path}")
}

/// Why the file could not be used, in words an operator can act on.
fn open_failure(path: &str, err: &sqlx::Error) -> String {
    if let sqlx::Error::Database(db) = err {
        match db.code().as_deref() {
            // SQLITE_NOTADB (26), and SQLITE_CORRUPT (11).
            Some("26") => {
                return format!(
                    "{path} is not a SQLite database (corrupted, or another kind of file)"
                );
            }
            Some("11") => return format!("{path} is corrupted: {}", db.message()),
            // SQLITE_CANTOPEN (14).
            Some("14") => {
                return format!(
                    "cannot open or create {path}: {} (does its directory exist, and may this \
                     user write there?)",
                    db.message()
                );
            }
            _ => {}
        }
    }
    one_line(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_urls_are_told_apart() {
        assert!(is_sqlite_url("sqlite:shardkeep.db"));
        assert!(is_sqlite_url("sqlite:///var/lib/shardkeep.db"));
        assert!(is_sqlite_url("SQLite:x.db"));
        assert!(!is_sqlite_url("postgres://x@h/db"));
        assert!(!is_sqlite_url("sqlit"));
        assert!(!is_sqlite_url(""));
    }
}
