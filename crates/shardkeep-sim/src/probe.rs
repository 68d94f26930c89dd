//! The checker's reads and the fault injector's raw writes, on whichever engine the run keeps
//! its rows in: Postgres, or the embedded store's file (SQLite: ids are 16-byte blobs,
//! instants microseconds, documents text). Never faulted.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::Value;
use shardkeep::SqliteBackend;
use shardkeep::backend::postgres::PostgresBackend;
use sqlx::Row;
use uuid::Uuid;

use super::checks::{RowView, view};

/// The durable store, read and written directly.
#[derive(Debug, Clone)]
pub(super) enum Probe {
    /// Postgres.
    Pg(PostgresBackend),
    /// The embedded store's file, opened apart from the system under test (its outage hook
    /// does not reach this pool).
    Sqlite(SqliteBackend),
}

/// A row's id and the order of its last cleanup location (epoch, microseconds).
pub(super) type LocationOrder = (Uuid, Option<i64>, Option<i64>);

impl Probe {
    /// Every character row, with the issue mark of its content and the sequenced job effects
    /// applied to it since (see `checks::read_rows`).
    pub(super) async fn read_rows(&self) -> Result<Vec<RowView>, sqlx::Error> {
        match self {
            Self::Pg(pg) => super::checks::read_rows(pg).await,
            Self::Sqlite(db) => {
                // One read transaction: the rows and their effects from one snapshot.
                let mut tx = db.pool().begin().await?;
                let rows = sqlx::query(
                    "SELECT id, state_version, state, live_issue_epoch, live_issue_mark
                       FROM characters",
                )
                .fetch_all(&mut *tx)
                .await?;
                let effects: Vec<(Uuid, i64, i64)> = sqlx::query_as(
                    "SELECT e.character_id, e.owner_epoch, e.issue_seq
                       FROM character_job_effects e JOIN characters c ON c.id = e.character_id
                      WHERE e.issue_seq > 0
                        AND (e.owner_epoch > c.live_issue_epoch
                             OR (e.owner_epoch = c.live_issue_epoch
                                 AND e.issue_seq > c.live_issue_mark))
                      ORDER BY e.character_id, e.owner_epoch, e.issue_seq",
                )
                .fetch_all(&mut *tx)
                .await?;
                tx.commit().await?;
                let mut beyond: HashMap<Uuid, (Vec<i64>, Vec<i64>)> = HashMap::new();
                for (id, epoch, seq) in effects {
                    let entry = beyond.entry(id).or_default();
                    entry.0.push(epoch);
                    entry.1.push(seq);
                }
                let mut views = Vec::with_capacity(rows.len());
                for row in rows {
                    let id: Uuid = row.try_get("id")?;
                    let state: String = row.try_get("state")?;
                    let state: Value = serde_json::from_str(&state)
                        .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
                    let (epochs, seqs) = beyond.remove(&id).unwrap_or_default();
                    views.push(view((
                        id,
                        row.try_get("state_version")?,
                        state,
                        row.try_get("live_issue_epoch")?,
                        row.try_get("live_issue_mark")?,
                        epochs,
                        seqs,
                    )));
                }
                Ok(views)
            }
        }
    }

    /// The item-load ledger: (item, character) → the highest epoch that loaded holding it.
    pub(super) async fn read_item_loads(&self) -> Result<HashMap<(Uuid, Uuid), i64>, sqlx::Error> {
        const SQL: &str = "SELECT item_id, character_id, loaded_epoch FROM item_loads";
        let rows: Vec<(Uuid, Uuid, i64)> = match self {
            Self::Pg(pg) => sqlx::query_as(SQL).fetch_all(pg.exec()).await?,
            Self::Sqlite(db) => sqlx::query_as(SQL).fetch_all(db.pool()).await?,
        };
        Ok(rows
            .into_iter()
            .map(|(item, character, epoch)| ((item, character), epoch))
            .collect())
    }

    /// `SELECT count(*) …` (the same text on both engines); -1 when it fails.
    pub(super) async fn count(&self, sql: &'static str) -> i64 {
        let counted = match self {
            Self::Pg(pg) => sqlx::query_scalar::<_, i64>(sql).fetch_one(pg.exec()).await,
            Self::Sqlite(db) => sqlx::query_scalar::<_, i64>(sql).fetch_one(db.pool()).await,
        };
        counted.unwrap_or(-1)
    }

    /// Every row's cleanup location order.
    pub(super) async fn location_orders(&self) -> Result<Vec<LocationOrder>, sqlx::Error> {
        const SQL: &str = "SELECT id, journal_location_epoch, journal_location_at FROM characters";
        match self {
            Self::Pg(pg) => {
                let rows: Vec<(Uuid, Option<i64>, Option<chrono::DateTime<chrono::Utc>>)> =
                    sqlx::query_as(SQL).fetch_all(pg.exec()).await?;
                Ok(rows
                    .into_iter()
                    .map(|(id, epoch, at)| (id, epoch, at.map(|at| at.timestamp_micros())))
                    .collect())
            }
            Self::Sqlite(db) => Ok(sqlx::query_as(SQL).fetch_all(db.pool()).await?),
        }
    }

    /// Audit rows per event kind.
    pub(super) async fn audit_counts(&self) -> BTreeMap<String, u64> {
        const SQL: &str = "SELECT event_kind, count(*) FROM character_audit GROUP BY event_kind";
        let rows: Vec<(String, i64)> = match self {
            Self::Pg(pg) => sqlx::query_as(SQL).fetch_all(pg.exec()).await,
            Self::Sqlite(db) => sqlx::query_as(SQL).fetch_all(db.pool()).await,
        }
        .unwrap_or_default();
        rows.into_iter()
            .map(|(k, n)| (k, n.max(0) as u64))
            .collect()
    }

    /// (acquirer, item) of every `item_transferred` audit row between two characters.
    /// Every item transfer's releaser and when it committed.
    pub(super) async fn transfer_releasers(&self) -> Vec<(Uuid, chrono::DateTime<chrono::Utc>)> {
        match self {
            Self::Pg(pg) => sqlx::query_as(
                "SELECT actor_id, at FROM character_audit
                  WHERE event_kind = 'item_transferred' AND actor_id IS NOT NULL",
            )
            .fetch_all(pg.exec())
            .await
            .unwrap_or_default(),
            Self::Sqlite(db) => {
                let rows: Vec<(Uuid, i64)> = sqlx::query_as(
                    "SELECT actor_id, at FROM character_audit
                      WHERE event_kind = 'item_transferred' AND actor_id IS NOT NULL",
                )
                .fetch_all(db.pool())
                .await
                .unwrap_or_default();
                rows.into_iter()
                    .filter_map(|(by, at)| Some((by, chrono::DateTime::from_timestamp_micros(at)?)))
                    .collect()
            }
        }
    }

    pub(super) async fn transfer_audit(&self) -> HashSet<(Uuid, Uuid)> {
        let rows: Vec<(Uuid, Option<String>)> = match self {
            Self::Pg(pg) => {
                sqlx::query_as(
                    "SELECT subject_id, payload->>'item_id' FROM character_audit
                      WHERE event_kind = 'item_transferred'
                        AND actor_id IS DISTINCT FROM subject_id",
                )
                .fetch_all(pg.exec())
                .await
            }
            Self::Sqlite(db) => {
                sqlx::query_as(
                    "SELECT subject_id, json_extract(payload, '$.item_id') FROM character_audit
                      WHERE event_kind = 'item_transferred' AND actor_id IS NOT subject_id",
                )
                .fetch_all(db.pool())
                .await
            }
        }
        .unwrap_or_default();
        rows.into_iter()
            .filter_map(|(subject, item)| Some((subject, item?.parse().ok()?)))
            .collect()
    }

    /// Bytes per table (the migrations' own table left out).
    pub(super) async fn table_bytes(&self) -> BTreeMap<String, u64> {
        let tables: Vec<(String, i64)> = match self {
            Self::Pg(pg) => {
                sqlx::query_as(
                    "SELECT c.relname::text, pg_total_relation_size(c.oid)
                       FROM pg_class c
                      WHERE c.relkind = 'r' AND c.relnamespace = 'public'::regnamespace
                        AND c.relname <> '_sqlx_migrations'",
                )
                .fetch_all(pg.exec())
                .await
            }
            Self::Sqlite(db) => {
                // Tables with their indexes, from the file's page statistics.
                sqlx::query_as(
                    "SELECT m.tbl_name, sum(d.pgsize) FROM dbstat d
                       JOIN sqlite_master m ON m.name = d.name
                      WHERE m.tbl_name NOT LIKE 'sqlite_%' AND m.tbl_name <> '_sqlx_migrations'
                      GROUP BY m.tbl_name",
                )
                .fetch_all(db.pool())
                .await
            }
        }
        .unwrap_or_default();
        tables
            .into_iter()
            .map(|(name, bytes)| (name, u64::try_from(bytes).unwrap_or(0)))
            .collect()
    }

    /// Some character's id.
    pub(super) async fn any_character(&self) -> Option<Uuid> {
        const SQL: &str = "SELECT id FROM characters LIMIT 1";
        match self {
            Self::Pg(pg) => sqlx::query_scalar(SQL).fetch_optional(pg.exec()).await,
            Self::Sqlite(db) => sqlx::query_scalar(SQL).fetch_optional(db.pool()).await,
        }
        .ok()
        .flatten()
    }

    /// Plants a retry job for `character` whose payload does not decode; true when stored.
    pub(super) async fn plant_poison_job(&self, character: Uuid, key: &str) -> bool {
        let payload = serde_json::json!({ "kind": "combat_rewards", "experience": "a lot" });
        let planted = match self {
            Self::Pg(pg) => sqlx::query(
                "INSERT INTO persistence_retry_jobs (retry_job_id, job_kind, character_id,
                         payload, next_attempt_at, session_impact, source, idempotency_key,
                         owner_epoch, origin, issued_at)
                     VALUES ($1, 'combat_rewards', $2, $3, now(), 'none', 'sim-poison', $4, 0,
                         'combat_rewards', now())",
            )
            .bind(Uuid::now_v7())
            .bind(character)
            .bind(payload)
            .bind(key)
            .execute(pg.exec())
            .await
            .map(|done| done.rows_affected()),
            Self::Sqlite(db) => sqlx::query(
                "INSERT INTO persistence_retry_jobs (retry_job_id, job_kind, character_id,
                         payload, next_attempt_at, session_impact, source, idempotency_key,
                         owner_epoch, origin, issued_at, created_at, updated_at)
                     VALUES (?1, 'combat_rewards', ?2, ?3, ?5, 'none', 'sim-poison', ?4, 0,
                         'combat_rewards', ?5, ?5, ?5)",
            )
            .bind(Uuid::now_v7())
            .bind(character)
            .bind(payload.to_string())
            .bind(key)
            .bind(chrono::Utc::now().timestamp_micros())
            .execute(db.pool())
            .await
            .map(|done| done.rows_affected()),
        };
        planted.is_ok()
    }
}
