//! Batched CAS saves on the embedded store: the ladder's batched step on a scratch SQLite file
//! (WAL, full syncs) holding the same characters, so the report puts it beside Postgres's.

use std::time::Instant;

use uuid::Uuid;

use super::{BenchError, Progress, rate};
use shardkeep::SqliteBackend;
use shardkeep::character::{CharacterSnapshot, CharacterStore, SaveOutcome};

const BENCH: &str = "ladder";

/// A scratch embedded store: a migrated SQLite file in a directory removed when dropped.
pub struct ScratchFile {
    dir: std::path::PathBuf,
    /// The store over the file.
    pub db: SqliteBackend,
}

impl ScratchFile {
    /// A fresh, migrated file under the system's temporary directory.
    pub async fn new() -> Result<Self, BenchError> {
        let dir = std::env::temp_dir().join(format!("shardkeep-bench-{}", Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).map_err(BenchError::other)?;
        let url = format!("sqlite:{}", dir.join("bench.db").display());
        let opened = SqliteBackend::connect("DATABASE_URL", &url).await;
        let db = match opened {
            Ok(db) => db,
            Err(err) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(BenchError::other(err));
            }
        };
        let scratch = Self { dir, db };
        scratch.db.migrate().await.map_err(BenchError::other)?;
        Ok(scratch)
    }

    /// Inserts a row for each of `snapshots` (at version 0 under epoch 1), in one transaction.
    pub async fn insert(&self, snapshots: &[CharacterSnapshot]) -> Result<(), BenchError> {
        let mut tx = self.db.begin().await.map_err(BenchError::other)?;
        for s in snapshots {
            sqlx::query(
                "INSERT INTO characters (id, account_id, name, name_key, zone_ref, room_ref, state,
                                         owner_epoch, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?3, ?4, ?5, ?6, 1, 0, 0)",
            )
            .bind(s.character_id)
            .bind(s.account_id)
            .bind(&s.name)
            .bind(&s.zone_ref)
            .bind(&s.room_ref)
            .bind(s.state.as_str())
            .execute(&mut *tx)
            .await
            .map_err(BenchError::other)?;
        }
        tx.commit().await.map_err(BenchError::other)
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Rows per second the embedded store's batched CAS saves write over `window`, `batch` rows to
/// a call, cycling through `snapshots` (each at version 0 under epoch 1, as the ladder made
/// them).
pub async fn cas_batched(
    snapshots: &[CharacterSnapshot],
    batch: usize,
    window: std::time::Duration,
    progress: &Progress,
) -> Result<f64, BenchError> {
    progress.step(BENCH, "CAS saves, batched, on the embedded store's file");
    let scratch = ScratchFile::new().await?;
    scratch.insert(snapshots).await?;
    let db = &scratch.db;
    let store = CharacterStore::embedded(db.clone());
    let mut snapshots = snapshots.to_vec();
    for s in &mut snapshots {
        s.state_version = 0;
        s.owner_epoch = 1;
    }
    let batch = batch.clamp(1, snapshots.len().max(1));
    let (mut cursor, mut done) = (0usize, 0u64);
    let started = Instant::now();
    while started.elapsed() < window && !snapshots.is_empty() {
        let start = (cursor * batch) % snapshots.len();
        let range = start..(start + batch).min(snapshots.len());
        cursor += 1;
        let refs: Vec<&CharacterSnapshot> = snapshots[range].iter().collect();
        let outcomes = store.save_many(&refs).await.map_err(BenchError::other)?;
        for (offset, (_, outcome)) in outcomes.into_iter().enumerate() {
            if let SaveOutcome::Saved(v) = outcome {
                snapshots[start + offset].state_version = v;
                done += 1;
            }
        }
    }
    let measured = rate(done, started.elapsed());
    db.close().await;
    Ok(measured)
}

/// Rows per second a plain batched update of the same rows and columns writes on a scratch file
/// of its own: `UPDATE … FROM (VALUES …)` with no version, epoch or schema check and nothing
/// returned, `batch` rows to a transaction, the statements the same size as the store's. The
/// engine's limit for what [`cas_batched`] does.
pub async fn raw_update_batched(
    snapshots: &[CharacterSnapshot],
    batch: usize,
    window: std::time::Duration,
    progress: &Progress,
) -> Result<f64, BenchError> {
    progress.step(BENCH, "plain batched UPDATE on the embedded store's file");
    let scratch = ScratchFile::new().await?;
    scratch.insert(snapshots).await?;
    let db = &scratch.db;
    let batch = batch.clamp(1, snapshots.len().max(1));
    let (mut cursor, mut done) = (0usize, 0u64);
    let started = Instant::now();
    while started.elapsed() < window && !snapshots.is_empty() {
        let start = (cursor * batch) % snapshots.len();
        let rows = &snapshots[start..(start + batch).min(snapshots.len())];
        cursor += 1;
        let mut tx = db.begin().await.map_err(BenchError::other)?;
        for chunk in rows.chunks(RAW_ROWS_PER_STATEMENT) {
            let sql = raw_update(chunk.len());
            let mut statement = sqlx::query(sqlx::AssertSqlSafe(sql))
                .persistent(chunk.len() == RAW_ROWS_PER_STATEMENT)
                .bind(chrono::Utc::now().timestamp_micros());
            for s in chunk {
                statement = statement
                    .bind(s.character_id)
                    .bind(s.state.as_str())
                    .bind(s.chargen.as_ref().map(|c| c.to_string()))
                    .bind(&s.zone_ref)
                    .bind(&s.room_ref)
                    .bind(s.owner_epoch)
                    .bind(i64::try_from(s.issue_mark).unwrap_or(i64::MAX))
                    .bind(s.schema_version);
            }
            done += statement
                .execute(&mut *tx)
                .await
                .map_err(BenchError::other)?
                .rows_affected();
        }
        tx.commit().await.map_err(BenchError::other)?;
    }
    let measured = rate(done, started.elapsed());
    db.close().await;
    Ok(measured)
}

/// Rows to one statement of [`raw_update_batched`], as many as the store puts in one.
const RAW_ROWS_PER_STATEMENT: usize = 128;

fn raw_update(rows: usize) -> String {
    let values: Vec<String> = (0..rows)
        .map(|row| {
            let first = 2 + row * 8;
            let params: Vec<String> = (first..first + 8).map(|n| format!("?{n}")).collect();
            format!("({})", params.join(", "))
        })
        .collect();
    format!(
        "UPDATE characters
            SET state = v.column2, chargen = v.column3, zone_ref = v.column4,
                room_ref = v.column5,
                state_version = characters.state_version + 1,
                live_version = characters.state_version + 1,
                live_issue_epoch = v.column6, live_issue_mark = v.column7,
                schema_version = v.column8,
                updated_at = ?1
           FROM (VALUES {}) AS v
          WHERE characters.id = v.column1",
        values.join(", ")
    )
}
