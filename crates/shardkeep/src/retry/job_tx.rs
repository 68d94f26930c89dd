//! The retry jobs' driver: where the jobs are kept ([`JobStore`]: Postgres, or the embedded
//! store's SQLite file), and the transaction a settle runs in ([`JobTx`]), each step of it one
//! call with one statement per driver. The settle's decisions (`settle`, `at_claim`) are made
//! once, for both drivers.
//!
//! On Postgres a settle's rows are locked explicitly (`FOR UPDATE`, in id order); on the embedded
//! store the transaction holds the file's write lock from its start, which makes every read in
//! it a locked read.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use sqlx::Postgres;
use uuid::Uuid;

use super::apply::RecordedEffect;
use super::effects::{self, NewRecord};
use super::job::{PersistenceRetryJob, StoredJob};
use super::settle_writes::{Activation, OutcomeWrites, RowChunk};
use super::store::ClaimedRow;
use super::{sqlite_jobs, sqlite_settle};
use crate::backend::sqlite::WriteTransaction;
use crate::backend::{PostgresBackend, SqliteBackend};

/// A character row as a settle reads it: id, owner epoch, state version, document, zone, room,
/// issue mark (epoch, mark), document schema, owner's schema.
pub(super) type CharacterRow = (
    Uuid,
    i64,
    i64,
    serde_json::Value,
    Option<String>,
    Option<String>,
    i64,
    i64,
    i32,
    i32,
);

/// Where the retry jobs and dead letters are kept. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) enum JobStore {
    /// Postgres.
    Postgres(PostgresBackend),
    /// The embedded store's file.
    Embedded(SqliteBackend),
}

impl JobStore {
    /// Opens a transaction: on the embedded store, one holding the file's write lock.
    pub(super) async fn begin(&self) -> Result<OpenTx, sqlx::Error> {
        Ok(match self {
            Self::Postgres(pg) => OpenTx::Postgres(pg.begin().await?),
            Self::Embedded(db) => OpenTx::Embedded(db.begin().await?),
        })
    }

    /// Opens a settle's transaction: on Postgres one that holds a character's row at most
    /// `bound` however its worker fares (see `PostgresBackend::begin_bounded`); on the embedded
    /// store one holding the file's write lock (bounded by the worker's own timeout).
    pub(super) async fn begin_bounded(
        &self,
        bound: std::time::Duration,
    ) -> Result<OpenTx, sqlx::Error> {
        Ok(match self {
            Self::Postgres(pg) => OpenTx::Postgres(pg.begin_bounded(bound).await?),
            Self::Embedded(db) => OpenTx::Embedded(db.begin().await?),
        })
    }

    /// Stores `jobs` (each due at the instant given with it), all or none; a job stored already
    /// stays as it is.
    pub(super) async fn insert(
        &self,
        jobs: &[(&PersistenceRetryJob, DateTime<Utc>)],
    ) -> Result<(), sqlx::Error> {
        match self {
            Self::Postgres(pg) => {
                let mut conn = pg.session().await?;
                super::store::insert_jobs(&mut conn, jobs).await?;
                conn.finish().await
            }
            Self::Embedded(db) => {
                let mut tx = db.begin().await?;
                sqlite_jobs::insert_jobs(&mut tx, jobs).await?;
                tx.commit().await
            }
        }
    }

    /// Claims up to `limit` due jobs (only `ids` when given) under a new lease.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn claim(
        &self,
        ids: Option<&[Uuid]>,
        limit: i64,
        owner: &str,
        token: Uuid,
        now: DateTime<Utc>,
        lease: std::time::Duration,
    ) -> Result<Vec<ClaimedRow>, sqlx::Error> {
        match self {
            Self::Postgres(pg) => {
                super::store::claim(pg, ids, limit, owner, token, now, lease).await
            }
            Self::Embedded(db) => {
                sqlite_jobs::claim(db, ids, limit, owner, token, now, lease).await
            }
        }
    }

    /// Whether the activation of transfer `token` of `character_id` is recorded.
    pub(super) async fn activation_recorded(
        &self,
        character_id: Uuid,
        token: &str,
    ) -> Result<bool, sqlx::Error> {
        match self {
            Self::Postgres(pg) => {
                sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM transfer_activations
                                     WHERE character_id = $1 AND transfer_token = $2)",
                )
                .bind(character_id)
                .bind(token)
                .fetch_one(pg.exec())
                .await
            }
            Self::Embedded(db) => {
                sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM transfer_activations
                                     WHERE character_id = ?1 AND transfer_token = ?2)",
                )
                .bind(character_id)
                .bind(token)
                .fetch_one(db.reader()?)
                .await
            }
        }
    }
}

/// A transaction a settle or a requeue runs in, owned.
pub(super) enum OpenTx {
    /// A Postgres transaction.
    Postgres(sqlx::Transaction<'static, Postgres>),
    /// The embedded store's write transaction.
    Embedded(WriteTransaction),
}

impl OpenTx {
    /// The transaction's steps, writes stamped with `now`.
    pub(super) fn steps(&mut self, now: DateTime<Utc>) -> JobTx<'_> {
        match self {
            Self::Postgres(tx) => JobTx::Postgres(tx),
            Self::Embedded(tx) => JobTx::Embedded {
                conn: tx,
                now: now.timestamp_micros(),
            },
        }
    }

    /// Commits.
    pub(super) async fn commit(self) -> Result<(), sqlx::Error> {
        match self {
            Self::Postgres(tx) => tx.commit().await,
            Self::Embedded(tx) => tx.commit().await,
        }
    }

    /// Rolls back now (a dropped transaction rolls back later).
    pub(super) async fn rollback(self) -> Result<(), sqlx::Error> {
        match self {
            Self::Postgres(tx) => tx.rollback().await,
            Self::Embedded(tx) => tx.rollback().await,
        }
    }
}

/// One transaction's steps, on the store's driver.
pub(crate) enum JobTx<'t> {
    /// A Postgres transaction's connection.
    Postgres(&'t mut sqlx::PgConnection),
    /// The embedded store's write transaction, and the instant its writes are stamped with
    /// (microseconds since the epoch).
    Embedded {
        /// The connection.
        conn: &'t mut sqlx::SqliteConnection,
        /// Microseconds since the epoch.
        now: i64,
    },
}

impl<'t> JobTx<'t> {
    /// The steps of the embedded store's write transaction `conn`, stamped with `now`.
    pub(crate) fn embedded(conn: &'t mut sqlx::SqliteConnection, now: DateTime<Utc>) -> Self {
        Self::Embedded {
            conn,
            now: now.timestamp_micros(),
        }
    }

    /// Runs one statement with no parameters and no rows (a savepoint's).
    pub(super) async fn execute(&mut self, sql: &'static str) -> Result<(), sqlx::Error> {
        match self {
            Self::Postgres(conn) => sqlx::query(sql).execute(&mut **conn).await.map(drop),
            Self::Embedded { conn, .. } => sqlx::query(sql).execute(&mut **conn).await.map(drop),
        }
    }

    /// Those of `ids` still leased under `token`, locked.
    pub(super) async fn leased_to(
        &mut self,
        ids: &[Uuid],
        token: Uuid,
    ) -> Result<HashSet<Uuid>, sqlx::Error> {
        let found: Vec<Uuid> = match self {
            Self::Postgres(conn) => {
                sqlx::query_scalar(
                    "SELECT retry_job_id FROM persistence_retry_jobs
                      WHERE retry_job_id = ANY($1) AND lease_token = $2
                      ORDER BY retry_job_id
                        FOR UPDATE",
                )
                .bind(ids)
                .bind(token)
                .fetch_all(&mut **conn)
                .await?
            }
            Self::Embedded { conn, .. } => sqlite_jobs::leased_to(conn, ids, token).await?,
        };
        Ok(found.into_iter().collect())
    }

    /// Up to `limit` due jobs (only `ids` when given), locked for this transaction.
    pub(super) async fn lock_due(
        &mut self,
        ids: Option<&[Uuid]>,
        limit: i64,
        now: DateTime<Utc>,
    ) -> Result<Vec<ClaimedRow>, sqlx::Error> {
        match self {
            Self::Postgres(conn) => super::store::lock_due(conn, ids, limit, now).await,
            Self::Embedded { conn, .. } => sqlite_jobs::due(conn, ids, limit, now).await,
        }
    }

    /// Every job queued for `character_id`, locked, in id order, whatever its due time or lease.
    pub(super) async fn pending_for(
        &mut self,
        character_id: Uuid,
    ) -> Result<Vec<ClaimedRow>, sqlx::Error> {
        match self {
            Self::Postgres(conn) => super::at_claim::pending_for(conn, character_id).await,
            Self::Embedded { conn, .. } => sqlite_jobs::pending_for(conn, character_id).await,
        }
    }

    /// The rows of `ids`, locked in id order.
    pub(super) async fn character_rows(
        &mut self,
        ids: &[Uuid],
    ) -> Result<Vec<CharacterRow>, sqlx::Error> {
        match self {
            Self::Postgres(conn) => {
                sqlx::query_as(
                    "SELECT id, owner_epoch, state_version, state, zone_ref, room_ref,
                            live_issue_epoch, live_issue_mark, schema_version, owner_schema_version
                       FROM characters WHERE id = ANY($1) ORDER BY id FOR UPDATE",
                )
                .bind(ids)
                .fetch_all(&mut **conn)
                .await
            }
            Self::Embedded { conn, .. } => sqlite_settle::character_rows(conn, ids).await,
        }
    }

    /// The items transfer commits took from each of `ids` (`(character, item)`).
    pub(super) async fn released(
        &mut self,
        ids: &[Uuid],
    ) -> Result<Vec<(Uuid, Uuid)>, sqlx::Error> {
        match self {
            Self::Postgres(conn) => {
                sqlx::query_as(
                    "SELECT character_id, item_id FROM item_releases WHERE character_id = ANY($1)",
                )
                .bind(ids)
                .fetch_all(&mut **conn)
                .await
            }
            Self::Embedded { conn, .. } => sqlite_settle::released(conn, ids).await,
        }
    }

    /// The sequenced effects recorded for each of `characters` under the epoch given with it.
    pub(super) async fn sequenced(
        &mut self,
        characters: &[(Uuid, i64)],
    ) -> Result<HashMap<Uuid, Vec<RecordedEffect>>, sqlx::Error> {
        match self {
            Self::Postgres(conn) => effects::sequenced(conn, characters).await,
            Self::Embedded { conn, .. } => sqlite_settle::sequenced(conn, characters).await,
        }
    }

    /// The effects recorded for each of `characters` past the row version given with it.
    pub(super) async fn recorded_after(
        &mut self,
        characters: &[(Uuid, i64)],
    ) -> Result<HashMap<Uuid, Vec<RecordedEffect>>, sqlx::Error> {
        match self {
            Self::Postgres(conn) => effects::recorded_after(conn, characters).await,
            Self::Embedded { conn, .. } => sqlite_settle::recorded_after(conn, characters).await,
        }
    }

    /// The `(character, key)` pairs among `pairs` whose effect is already recorded.
    pub(super) async fn recorded_keys(
        &mut self,
        pairs: &[(Uuid, String)],
    ) -> Result<HashSet<(Uuid, String)>, sqlx::Error> {
        match self {
            Self::Postgres(conn) => effects::recorded_keys(conn, pairs).await,
            Self::Embedded { conn, .. } => sqlite_settle::recorded_keys(conn, pairs).await,
        }
    }

    /// Writes the rows of `chunk`, each one version on.
    pub(super) async fn update_characters(
        &mut self,
        chunk: &RowChunk<'_>,
    ) -> Result<(), sqlx::Error> {
        match self {
            Self::Postgres(conn) => super::settle_writes::update_characters(conn, chunk).await,
            Self::Embedded { conn, now } => {
                sqlite_settle::update_characters(conn, *now, chunk).await
            }
        }
    }

    /// Records what the batch's applied jobs did; `versions` gives each row's version after it.
    pub(super) async fn insert_effects(
        &mut self,
        records: &[NewRecord],
        versions: &HashMap<Uuid, i64>,
    ) -> Result<(), sqlx::Error> {
        match self {
            Self::Postgres(conn) => effects::insert(conn, records, versions).await,
            Self::Embedded { conn, now } => {
                sqlite_settle::insert_effects(conn, *now, records, versions).await
            }
        }
    }

    /// Records transfer activations (one already recorded stays as it is).
    pub(super) async fn insert_activations(
        &mut self,
        activations: &[Activation],
    ) -> Result<(), sqlx::Error> {
        if activations.is_empty() {
            return Ok(());
        }
        match self {
            Self::Postgres(conn) => {
                super::settle_writes::insert_activations(conn, activations).await
            }
            Self::Embedded { conn, now } => {
                sqlite_settle::insert_activations(conn, *now, activations).await
            }
        }
    }

    /// Deletes, reschedules, defers and dead-letters jobs as `writes` says.
    pub(super) async fn write_outcomes(
        &mut self,
        writes: &OutcomeWrites,
        now: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        match self {
            Self::Postgres(conn) => super::settle_writes::write_outcomes(conn, writes, now).await,
            Self::Embedded { conn, .. } => sqlite_jobs::write_outcomes(conn, writes, now).await,
        }
    }

    /// Stores `jobs` inside this transaction.
    pub(super) async fn insert_jobs(
        &mut self,
        jobs: &[(&PersistenceRetryJob, DateTime<Utc>)],
    ) -> Result<(), sqlx::Error> {
        match self {
            Self::Postgres(conn) => super::store::insert_jobs(conn, jobs).await,
            Self::Embedded { conn, .. } => sqlite_jobs::insert_jobs(conn, jobs).await,
        }
    }

    /// The job saved in the active dead letter `dead_letter_id`, locked.
    pub(super) async fn active_dead_letter(
        &mut self,
        dead_letter_id: Uuid,
    ) -> Result<Option<StoredJob>, sqlx::Error> {
        match self {
            Self::Postgres(conn) => super::store::active_dead_letter(conn, dead_letter_id).await,
            Self::Embedded { conn, .. } => {
                sqlite_jobs::active_dead_letter(conn, dead_letter_id).await
            }
        }
    }

    /// The owner epoch of `character_id`'s row, read under a share lock (a claim cannot slip in
    /// before the requeue commits); `None` when there is no row.
    pub(super) async fn owner_epoch(
        &mut self,
        character_id: Uuid,
    ) -> Result<Option<i64>, sqlx::Error> {
        match self {
            Self::Postgres(conn) => {
                sqlx::query_scalar("SELECT owner_epoch FROM characters WHERE id = $1 FOR SHARE")
                    .bind(character_id)
                    .fetch_optional(&mut **conn)
                    .await
            }
            Self::Embedded { conn, .. } => {
                sqlx::query_scalar("SELECT owner_epoch FROM characters WHERE id = ?1")
                    .bind(character_id)
                    .fetch_optional(&mut **conn)
                    .await
            }
        }
    }

    /// Marks the dead letter `dead_letter_id` requeued as `retry_job_id`.
    pub(super) async fn mark_requeued(
        &mut self,
        dead_letter_id: Uuid,
        retry_job_id: Uuid,
        now: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        match self {
            Self::Postgres(conn) => {
                super::store::mark_requeued(conn, dead_letter_id, retry_job_id, now).await
            }
            Self::Embedded { conn, now } => {
                sqlite_jobs::mark_requeued(conn, dead_letter_id, retry_job_id, *now).await
            }
        }
    }
}
