//! Admin cleanup of the presence, handoff and registry targets: dry runs count, deletes walk with
//! SCAN and UNLINK in bounded batches. No code path issues `KEYS`.

use std::collections::HashSet;

use redis::AsyncCommands;

use super::embedded::RecordFile;
use super::{CoordError, Coordination};
use crate::backend::redis::ScanCursor;
use crate::keyspace::families::CleanupTarget;

/// Most keys one delete call removes.
pub const MAX_DELETE_PER_CALL: usize = 10_000;
/// Most keys one dry run examines.
pub const MAX_DRY_RUN_EXAMINED: usize = 1_000_000;
/// Keys per UNLINK batch.
pub const DELETE_BATCH: usize = 200;

/// What a cleanup call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CleanupMode {
    /// Count matching keys; change nothing.
    DryRun,
    /// Delete matching keys, up to the per-call limit.
    Delete,
}

/// What a cleanup call found or removed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CleanupReport {
    /// The target.
    pub target: String,
    /// The mode it ran in.
    pub mode: CleanupMode,
    /// Keys matched (dry run) or examined for deletion.
    pub matched: u64,
    /// Keys deleted (always 0 in a dry run).
    pub deleted: u64,
    /// The deleted keys.
    pub deleted_keys: Vec<String>,
    /// False when the call stopped at its bound; call again to continue.
    pub complete: bool,
}

impl Coordination {
    /// Runs cleanup on the target named `target`; deletes at most `limit` keys (clamped to
    /// 1..=[`MAX_DELETE_PER_CALL`]).
    pub async fn cleanup_run(
        &self,
        target: &str,
        mode: CleanupMode,
        limit: usize,
    ) -> Result<CleanupReport, CoordError> {
        let descriptor = self.keys().cleanup_target(target).ok_or_else(|| {
            CoordError::InvalidInput(format!("unknown cleanup target {target:?}"))
        })?;
        let limit = limit.clamp(1, MAX_DELETE_PER_CALL);
        let mut report = CleanupReport {
            target: descriptor.name.to_owned(),
            mode,
            matched: 0,
            deleted: 0,
            deleted_keys: Vec::new(),
            complete: false,
        };
        match (mode, self.file()) {
            (CleanupMode::DryRun, None) => self.cleanup_count(&descriptor, &mut report).await?,
            (CleanupMode::Delete, None) => {
                self.cleanup_delete(&descriptor, limit, &mut report).await?
            }
            (CleanupMode::DryRun, Some(file)) => {
                count_in_file(file, self.config().scan_count, &descriptor, &mut report).await?
            }
            (CleanupMode::Delete, Some(file)) => {
                let page = self.config().scan_count;
                delete_in_file(file, page, &descriptor, limit, &mut report).await?
            }
        }
        metrics::counter!(crate::telemetry::CLEANUP_DELETED_TOTAL, "target" => descriptor.name)
            .increment(report.deleted);
        Ok(report)
    }

    /// Every live key matching the glob `pattern`, at most `max`, walked in bounded pages (on
    /// Redis with SCAN over every master). For checks and diagnostics; the order is unspecified.
    pub async fn keys_matching(
        &self,
        pattern: &str,
        max: usize,
    ) -> Result<Vec<String>, CoordError> {
        let page = self.config().scan_count.max(1);
        let mut found = Vec::new();
        if let Some(file) = self.file() {
            loop {
                let room = max.saturating_sub(found.len()).min(page);
                let keys = file
                    .keys_matching(pattern, found.last().map(String::as_str), room)
                    .await?;
                let done = keys.len() < room || room == 0;
                found.extend(keys);
                if done {
                    return Ok(found);
                }
            }
        }
        let mut cursor = ScanCursor::START;
        loop {
            let (next, keys) = self.scan_page(cursor, pattern).await?;
            found.extend(keys);
            cursor = next;
            if cursor.is_start() || found.len() >= max {
                found.truncate(max);
                return Ok(found);
            }
        }
    }

    /// One page of the walk over every master.
    async fn scan_page(
        &self,
        cursor: ScanCursor,
        pattern: &str,
    ) -> Result<(ScanCursor, Vec<String>), CoordError> {
        Ok(self
            .redis()?
            .scan_page(cursor, pattern, self.config().scan_count)
            .await?)
    }

    async fn cleanup_count(
        &self,
        target: &CleanupTarget,
        report: &mut CleanupReport,
    ) -> Result<(), CoordError> {
        let mut conn = self.conn()?;
        for key in &target.exact_keys {
            if conn.exists(key).await? {
                report.matched += 1;
            }
        }
        let mut seen = HashSet::new();
        for pattern in &target.scan_patterns {
            let mut cursor = ScanCursor::START;
            loop {
                let (next, keys) = self.scan_page(cursor, pattern).await?;
                seen.extend(keys);
                cursor = next;
                if cursor.is_start() {
                    break;
                }
                if seen.len() >= MAX_DRY_RUN_EXAMINED {
                    report.matched += seen.len() as u64;
                    return Ok(());
                }
            }
        }
        report.matched += seen.len() as u64;
        report.complete = true;
        Ok(())
    }

    async fn cleanup_delete(
        &self,
        target: &CleanupTarget,
        limit: usize,
        report: &mut CleanupReport,
    ) -> Result<(), CoordError> {
        for pattern in &target.scan_patterns {
            let mut cursor = ScanCursor::START;
            loop {
                let (next, keys) = self.scan_page(cursor, pattern).await?;
                report.matched += keys.len() as u64;
                for batch in keys.chunks(DELETE_BATCH) {
                    let room = limit.saturating_sub(report.deleted_keys.len());
                    let batch = &batch[..batch.len().min(room)];
                    self.unlink_batch(batch, report).await?;
                }
                cursor = next;
                if report.deleted_keys.len() >= limit {
                    return Ok(());
                }
                if cursor.is_start() {
                    break;
                }
            }
        }
        let room = limit.saturating_sub(report.deleted_keys.len());
        let exact: Vec<String> = target.exact_keys.iter().take(room).cloned().collect();
        report.matched += exact.len() as u64;
        self.unlink_batch(&exact, report).await?;
        report.complete = exact.len() == target.exact_keys.len();
        Ok(())
    }

    /// UNLINKs `keys` as one pipelined batch of single-key commands (so it also runs on a
    /// cluster), recording the keys that still existed.
    async fn unlink_batch(
        &self,
        keys: &[String],
        report: &mut CleanupReport,
    ) -> Result<(), CoordError> {
        if keys.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.unlink(key);
        }
        let removed: Vec<i64> = pipe.query_async(&mut self.conn()?).await?;
        for (key, n) in keys.iter().zip(removed) {
            if n > 0 {
                report.deleted += 1;
                report.deleted_keys.push(key.clone());
            }
        }
        Ok(())
    }
}

/// A dry run over the embedded store's records: the same counts, walking each pattern's key
/// range in pages.
async fn count_in_file(
    file: &RecordFile,
    page: usize,
    target: &CleanupTarget,
    report: &mut CleanupReport,
) -> Result<(), CoordError> {
    for key in &target.exact_keys {
        if file.exists(key).await? {
            report.matched += 1;
        }
    }
    let mut seen = HashSet::new();
    for pattern in &target.scan_patterns {
        let mut after: Option<String> = None;
        loop {
            let keys = file.keys_matching(pattern, after.as_deref(), page).await?;
            let last_page = keys.len() < page.max(1);
            after = keys.last().cloned();
            seen.extend(keys);
            if seen.len() >= MAX_DRY_RUN_EXAMINED {
                report.matched += seen.len() as u64;
                return Ok(());
            }
            if last_page {
                break;
            }
        }
    }
    report.matched += seen.len() as u64;
    report.complete = true;
    Ok(())
}

/// Deletes matching records from the embedded store, at most `limit`, patterns first and the
/// exact keys last, as on Redis.
async fn delete_in_file(
    file: &RecordFile,
    page: usize,
    target: &CleanupTarget,
    limit: usize,
    report: &mut CleanupReport,
) -> Result<(), CoordError> {
    for pattern in &target.scan_patterns {
        loop {
            let room = limit.saturating_sub(report.deleted_keys.len());
            if room == 0 {
                return Ok(());
            }
            let batch = page.clamp(1, DELETE_BATCH).min(room);
            let keys = file.keys_matching(pattern, None, batch).await?;
            report.matched += keys.len() as u64;
            let deleted = file.delete_reporting(&keys).await?;
            report.deleted += deleted.len() as u64;
            report.deleted_keys.extend(deleted);
            if keys.len() < batch {
                break;
            }
        }
    }
    let room = limit.saturating_sub(report.deleted_keys.len());
    let exact: Vec<String> = target.exact_keys.iter().take(room).cloned().collect();
    report.matched += exact.len() as u64;
    let deleted = file.delete_reporting(&exact).await?;
    report.deleted += deleted.len() as u64;
    report.deleted_keys.extend(deleted);
    report.complete = exact.len() == target.exact_keys.len();
    Ok(())
}
