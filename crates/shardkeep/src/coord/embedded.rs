//! Coordination records in the embedded store's file: one row per key of the Redis keyspace
//! (`coord_records`), with an optional expiry. A row past its expiry is invisible at once —
//! every read asks for live rows only — and deleted by [`RecordFile::sweep`] (maintenance) or by
//! the next write of its key. What a Lua script does atomically on Redis is one write
//! transaction here (the file's write lock), so the same decisions hold.
//!
//! Redis keeps index sets to find records without a scan; the file finds them by key prefix, so
//! it keeps no indexes.

use std::sync::Arc;

use sqlx::SqliteConnection;

use super::CoordError;
use crate::backend::SqliteBackend;
use crate::clock::Clock;
use crate::ttl::Ttl;

/// Live rows only (`?now`: microseconds since the epoch).
macro_rules! live {
    ($now:literal) => {
        concat!("(expires_at IS NULL OR expires_at > ", $now, ")")
    };
}

/// The records' file. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct RecordFile {
    db: SqliteBackend,
    clock: Arc<dyn Clock>,
}

/// A live record: its value and remaining lifetime in milliseconds (`None`: no expiry).
pub(crate) type Live = (Vec<u8>, Option<i64>);

impl RecordFile {
    pub(crate) fn new(db: SqliteBackend, clock: Arc<dyn Clock>) -> Self {
        Self { db, clock }
    }

    /// Microseconds since the epoch, as expiries are stored.
    pub(crate) fn now(&self) -> i64 {
        self.clock.now().timestamp_micros()
    }

    /// Checks that the file answers.
    pub(crate) async fn ping(&self) -> Result<(), CoordError> {
        sqlx::query("SELECT 1").execute(self.db.reader()?).await?;
        Ok(())
    }

    /// Opens a write transaction and reads the time its decisions are made at.
    pub(crate) async fn begin(
        &self,
    ) -> Result<(crate::backend::sqlite::WriteTransaction, i64), CoordError> {
        let tx = self.db.begin().await?;
        Ok((tx, self.now()))
    }

    /// The live record at `key`.
    pub(crate) async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, CoordError> {
        Ok(sqlx::query_scalar(concat!(
            "SELECT value FROM coord_records WHERE key = ?1 AND ",
            live!("?2")
        ))
        .bind(key)
        .bind(self.now())
        .fetch_optional(self.db.reader()?)
        .await?)
    }

    /// The live record at `key` with its remaining lifetime.
    pub(crate) async fn get_live(&self, key: &str) -> Result<Option<Live>, CoordError> {
        let mut conn = self.db.reader()?.acquire().await?;
        read(&mut conn, key, self.now()).await
    }

    /// Whether a live record is at `key`.
    pub(crate) async fn exists(&self, key: &str) -> Result<bool, CoordError> {
        Ok(self.get(key).await?.is_some())
    }

    /// Writes `value` at `key`, expiring after `ttl`.
    pub(crate) async fn set(&self, key: &str, value: &[u8], ttl: Ttl) -> Result<(), CoordError> {
        self.set_many(&[(key, value)], ttl).await
    }

    /// Writes every `(key, value)` of `records`, expiring after `ttl`, in one transaction.
    pub(crate) async fn set_many(
        &self,
        records: &[(&str, &[u8])],
        ttl: Ttl,
    ) -> Result<(), CoordError> {
        let (mut tx, now) = self.begin().await?;
        for (key, value) in records {
            put(&mut tx, key, value, Some(expiry(now, ttl))).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Writes `value` at `key` only when no live record is there; true when written.
    pub(crate) async fn set_new(
        &self,
        key: &str,
        value: &[u8],
        ttl: Ttl,
    ) -> Result<bool, CoordError> {
        let (mut tx, now) = self.begin().await?;
        let written = if read(&mut tx, key, now).await?.is_some() {
            false
        } else {
            put(&mut tx, key, value, Some(expiry(now, ttl))).await?;
            true
        };
        tx.commit().await?;
        Ok(written)
    }

    /// Deletes the records at `keys`; how many of them were live.
    pub(crate) async fn delete(&self, keys: &[&str]) -> Result<u64, CoordError> {
        let (mut tx, now) = self.begin().await?;
        let mut live = 0;
        for key in keys {
            live += u64::from(remove(&mut tx, key, now).await?);
        }
        tx.commit().await?;
        Ok(live)
    }

    /// Moves the expiry of the live record at `key` to `ttl` from now; false when there is none.
    pub(crate) async fn refresh(&self, key: &str, ttl: Ttl) -> Result<bool, CoordError> {
        Ok(self.refresh_many(&[key], ttl).await?.first() == Some(&true))
    }

    /// [`RecordFile::refresh`] of each of `keys`, in one write transaction: per key, in order,
    /// true when a live record was there.
    pub(crate) async fn refresh_many(
        &self,
        keys: &[&str],
        ttl: Ttl,
    ) -> Result<Vec<bool>, CoordError> {
        let (mut tx, now) = self.begin().await?;
        let mut found = Vec::with_capacity(keys.len());
        for key in keys {
            let done = sqlx::query(concat!(
                "UPDATE coord_records SET expires_at = ?3 WHERE key = ?1 AND ",
                live!("?2")
            ))
            .bind(key)
            .bind(now)
            .bind(expiry(now, ttl))
            .execute(&mut *tx)
            .await?;
            found.push(done.rows_affected() == 1);
        }
        tx.commit().await?;
        Ok(found)
    }

    /// Live records whose key starts with `prefix`, after `after` (exclusive), in key order, at
    /// most `limit`.
    pub(crate) async fn page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, CoordError> {
        Ok(sqlx::query_as(concat!(
            "SELECT key, value FROM coord_records
              WHERE key >= ?1 AND key < ?1 || x'FF' AND key > ?2 AND ",
            live!("?3"),
            " ORDER BY key LIMIT ?4"
        ))
        .bind(prefix)
        .bind(after.unwrap_or(""))
        .bind(self.now())
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(self.db.reader()?)
        .await?)
    }

    /// Keys of live records matching the glob `pattern` (`*`, `?`, `[..]` as Redis reads them),
    /// after `after` (exclusive), in key order, at most `limit`. The literal part before the
    /// first wildcard bounds the walk to a key range.
    pub(crate) async fn keys_matching(
        &self,
        pattern: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, CoordError> {
        let prefix = literal_prefix(pattern);
        Ok(sqlx::query_scalar(concat!(
            "SELECT key FROM coord_records
              WHERE key >= ?1 AND key < ?1 || x'FF' AND key > ?2 AND key GLOB ?3 AND ",
            live!("?4"),
            " ORDER BY key LIMIT ?5"
        ))
        .bind(prefix)
        .bind(after.unwrap_or(""))
        .bind(pattern)
        .bind(self.now())
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(self.db.reader()?)
        .await?)
    }

    /// Deletes the records at `keys` in one transaction; the keys that were live.
    pub(crate) async fn delete_reporting(
        &self,
        keys: &[String],
    ) -> Result<Vec<String>, CoordError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let (mut tx, now) = self.begin().await?;
        let mut live = Vec::new();
        for key in keys {
            if remove(&mut tx, key, now).await? {
                live.push(key.clone());
            }
        }
        tx.commit().await?;
        Ok(live)
    }

    /// Deletes up to `limit` expired records whose key starts with `prefix` (every family when
    /// empty), in batches of [`SWEEP_BATCH`], each its own short write transaction (a large
    /// backlog never holds the file's write lock for long), stopping early at a batch that
    /// comes back short or after [`SWEEP_BUDGET`]; how many went.
    pub(crate) async fn sweep(&self, prefix: &str, limit: usize) -> Result<u64, CoordError> {
        let started = std::time::Instant::now();
        let mut swept = 0u64;
        while (swept as usize) < limit && started.elapsed() < SWEEP_BUDGET {
            let batch = SWEEP_BATCH.min(limit - swept as usize);
            let (mut tx, now) = self.begin().await?;
            let done = sqlx::query(
                "DELETE FROM coord_records WHERE key IN (
                     SELECT key FROM coord_records
                      WHERE expires_at <= ?1 AND key >= ?2 AND key < ?2 || x'FF'
                      LIMIT ?3)",
            )
            .bind(now)
            .bind(prefix)
            .bind(i64::try_from(batch).unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await?
            .rows_affected();
            tx.commit().await?;
            swept += done;
            if (done as usize) < batch {
                break;
            }
        }
        Ok(swept)
    }
}

/// Expired records one sweep transaction deletes.
pub(crate) const SWEEP_BATCH: usize = 500;
/// Longest one sweep call goes on.
pub(crate) const SWEEP_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);

/// The part of a glob pattern before its first wildcard.
pub(crate) fn literal_prefix(pattern: &str) -> &str {
    let end = pattern.find(['*', '?', '[', '\\']).unwrap_or(pattern.len());
    &pattern[..end]
}

/// The instant `ttl` after `now` (microseconds).
pub(crate) fn expiry(now: i64, ttl: Ttl) -> i64 {
    let micros = i64::try_from(ttl.as_millis().saturating_mul(1000)).unwrap_or(i64::MAX);
    now.saturating_add(micros)
}

/// The live record at `key` with its absolute expiry (microseconds; `None`: never), inside a
/// transaction.
pub(crate) async fn read_expiring(
    conn: &mut SqliteConnection,
    key: &str,
    now: i64,
) -> Result<Option<(Vec<u8>, Option<i64>)>, CoordError> {
    Ok(sqlx::query_as(concat!(
        "SELECT value, expires_at FROM coord_records WHERE key = ?1 AND ",
        live!("?2")
    ))
    .bind(key)
    .bind(now)
    .fetch_optional(&mut *conn)
    .await?)
}

/// The live record at `key` with its remaining lifetime in milliseconds, inside a transaction.
pub(crate) async fn read(
    conn: &mut SqliteConnection,
    key: &str,
    now: i64,
) -> Result<Option<Live>, CoordError> {
    let row: Option<(Vec<u8>, Option<i64>)> = sqlx::query_as(concat!(
        "SELECT value, expires_at FROM coord_records WHERE key = ?1 AND ",
        live!("?2")
    ))
    .bind(key)
    .bind(now)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(row.map(|(value, expires)| (value, expires.map(|at| (at - now).max(0) / 1000))))
}

/// Writes `value` at `key` with the absolute expiry `expires_at` (microseconds; `None`: never),
/// inside a transaction.
pub(crate) async fn put(
    conn: &mut SqliteConnection,
    key: &str,
    value: &[u8],
    expires_at: Option<i64>,
) -> Result<(), CoordError> {
    sqlx::query(
        "INSERT INTO coord_records (key, value, expires_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at",
    )
    .bind(key)
    .bind(value)
    .bind(expires_at)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Replaces the value of the record at `key`, keeping its expiry, inside a transaction.
pub(crate) async fn replace_value(
    conn: &mut SqliteConnection,
    key: &str,
    value: &[u8],
) -> Result<(), CoordError> {
    sqlx::query("UPDATE coord_records SET value = ?2 WHERE key = ?1")
        .bind(key)
        .bind(value)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Deletes the record at `key` inside a transaction; true when it was live.
pub(crate) async fn remove(
    conn: &mut SqliteConnection,
    key: &str,
    now: i64,
) -> Result<bool, CoordError> {
    let expires: Option<Option<i64>> =
        sqlx::query_scalar("DELETE FROM coord_records WHERE key = ?1 RETURNING expires_at")
            .bind(key)
            .fetch_optional(&mut *conn)
            .await?;
    Ok(matches!(expires, Some(None)) || matches!(expires, Some(Some(at)) if at > now))
}
