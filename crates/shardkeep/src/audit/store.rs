//! The audit trail: idempotent inserts (batched, single, or inside the caller's Postgres
//! transaction) and newest-first reads by keyset pagination. Two drivers behind one
//! [`AuditStore`]: Postgres, and the embedded store's file (`store_sqlite`).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::event::AuditEvent;
use super::store_sqlite as embedded;
use crate::backend::{PostgresBackend, SqliteBackend};

/// Most rows one read returns.
pub const MAX_AUDIT_PAGE: i64 = 200;

/// One recorded event, as read back.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct AuditRow {
    /// Row id.
    pub id: Uuid,
    /// Insertion order.
    pub seq: i64,
    /// `character` or `account`.
    pub subject_type: String,
    /// The subject.
    pub subject_id: Uuid,
    /// What happened.
    pub event_kind: String,
    /// The idempotency key.
    pub dedup_key: String,
    /// Who did it.
    pub actor_id: Option<Uuid>,
    /// Details.
    pub payload: serde_json::Value,
    /// When it was recorded.
    pub at: DateTime<Utc>,
}

/// Where the next page starts: strictly older than this `(at, seq)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AuditCursor {
    /// Recorded at.
    pub at: DateTime<Utc>,
    /// Insertion order.
    pub seq: i64,
}

/// One page, newest first.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuditPage {
    /// The rows.
    pub rows: Vec<AuditRow>,
    /// Cursor of the next page, when there may be one.
    pub next: Option<AuditCursor>,
}

const INSERT_MANY: &str = "
INSERT INTO character_audit (id, subject_type, subject_id, event_kind, dedup_key, actor_id, payload)
SELECT id, subject_type, subject_id, event_kind, dedup_key, actor_id, payload
  FROM UNNEST($1::uuid[], $2::text[], $3::uuid[], $4::text[], $5::text[], $6::uuid[], $7::jsonb[])
       WITH ORDINALITY AS e(id, subject_type, subject_id, event_kind, dedup_key, actor_id, payload, ord)
 ORDER BY ord
ON CONFLICT (subject_id, event_kind, dedup_key) DO NOTHING";

/// Inserts `events` in one statement, in order; duplicates are ignored. Returns rows inserted.
pub(crate) async fn insert_many(
    conn: &mut sqlx::PgConnection,
    events: &[AuditEvent],
) -> Result<u64, sqlx::Error> {
    if events.is_empty() {
        return Ok(0);
    }
    let ids: Vec<Uuid> = events.iter().map(|e| e.id).collect();
    let types: Vec<&str> = events.iter().map(|e| e.subject_type.as_str()).collect();
    let subjects: Vec<Uuid> = events.iter().map(|e| e.subject_id).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let keys: Vec<&str> = events.iter().map(|e| e.dedup_key.as_str()).collect();
    let actors: Vec<Option<Uuid>> = events.iter().map(|e| e.actor_id).collect();
    let payloads: Vec<&serde_json::Value> = events.iter().map(|e| &e.payload).collect();
    let done = sqlx::query(INSERT_MANY)
        .bind(&ids)
        .bind(&types)
        .bind(&subjects)
        .bind(&kinds)
        .bind(&keys)
        .bind(&actors)
        .bind(&payloads)
        .execute(conn)
        .await?;
    Ok(done.rows_affected())
}

const SELECT_ROWS: &str =
    "SELECT id, seq, subject_type, subject_id, event_kind, dedup_key, actor_id, payload, at
  FROM character_audit";

/// Handle on the audit trail. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AuditStore {
    driver: Driver,
}

/// Where the trail is kept.
#[derive(Debug, Clone)]
enum Driver {
    Postgres(PostgresBackend),
    Embedded(SqliteBackend),
}

impl AuditStore {
    /// The trail over `pg`.
    pub fn new(pg: PostgresBackend) -> Self {
        Self {
            driver: Driver::Postgres(pg),
        }
    }

    /// The trail in the embedded store's file.
    pub fn embedded(db: SqliteBackend) -> Self {
        Self {
            driver: Driver::Embedded(db),
        }
    }

    /// The driver's name: `postgres` or `embedded`.
    pub fn driver(&self) -> &'static str {
        match self.driver {
            Driver::Postgres(_) => "postgres",
            Driver::Embedded(_) => "embedded",
        }
    }

    /// Records `events` in one round trip (one transaction in the embedded store); returns how
    /// many were new.
    pub async fn record(&self, events: &[AuditEvent]) -> Result<u64, sqlx::Error> {
        match &self.driver {
            Driver::Postgres(pg) => {
                let mut conn = pg.session().await?;
                let inserted = insert_many(&mut conn, events).await?;
                conn.finish().await?;
                Ok(inserted)
            }
            Driver::Embedded(db) => embedded::insert_many(db, events).await,
        }
    }

    /// A character's own trail, by its stable id (never by name).
    pub async fn character_page(
        &self,
        character_id: Uuid,
        before: Option<AuditCursor>,
        limit: i64,
    ) -> Result<AuditPage, sqlx::Error> {
        let limit = limit.clamp(1, MAX_AUDIT_PAGE);
        let pg = match &self.driver {
            Driver::Postgres(pg) => pg,
            Driver::Embedded(db) => {
                let rows = embedded::page_rows(db, character_id, None, before, limit).await?;
                return Ok(page(rows, limit));
            }
        };
        let sql = sqlx::AssertSqlSafe(format!(
            "{SELECT_ROWS}
              WHERE subject_id = $1 AND subject_type = 'character'
                AND ($2::timestamptz IS NULL OR (at, seq) < ($2, $3))
              ORDER BY at DESC, seq DESC
              LIMIT $4"
        ));
        let rows = sqlx::query_as(sql)
            .bind(character_id)
            .bind(before.map(|c| c.at))
            .bind(before.map_or(0, |c| c.seq))
            .bind(limit)
            .fetch_all(pg.exec())
            .await?;
        Ok(page(rows, limit))
    }

    /// A character's trail folded with its owning account's tier changes (and nothing from any
    /// other account).
    pub(crate) async fn character_with_account_page(
        &self,
        character_id: Uuid,
        account_id: Uuid,
        before: Option<AuditCursor>,
        limit: i64,
    ) -> Result<AuditPage, sqlx::Error> {
        let limit = limit.clamp(1, MAX_AUDIT_PAGE);
        let pg = match &self.driver {
            Driver::Postgres(pg) => pg,
            Driver::Embedded(db) => {
                let rows =
                    embedded::page_rows(db, character_id, Some(account_id), before, limit).await?;
                return Ok(page(rows, limit));
            }
        };
        let sql = sqlx::AssertSqlSafe(format!(
            "{SELECT_ROWS}
              WHERE ((subject_id = $1 AND subject_type = 'character')
                  OR (subject_id = $2 AND subject_type = 'account' AND event_kind = 'tier_changed'))
                AND ($3::timestamptz IS NULL OR (at, seq) < ($3, $4))
              ORDER BY at DESC, seq DESC
              LIMIT $5"
        ));
        let rows = sqlx::query_as(sql)
            .bind(character_id)
            .bind(account_id)
            .bind(before.map(|c| c.at))
            .bind(before.map_or(0, |c| c.seq))
            .bind(limit)
            .fetch_all(pg.exec())
            .await?;
        Ok(page(rows, limit))
    }

    /// The id and owning account of the character named `name` (any case).
    pub(crate) async fn character_by_name(
        &self,
        name: &str,
    ) -> Result<Option<(Uuid, Uuid)>, sqlx::Error> {
        match &self.driver {
            Driver::Postgres(pg) => {
                sqlx::query_as(
                    "SELECT id, account_id FROM characters WHERE lower(name) = lower(btrim($1))",
                )
                .bind(name)
                .fetch_optional(pg.exec())
                .await
            }
            Driver::Embedded(db) => embedded::character_by_name(db, name).await,
        }
    }
}

fn page(rows: Vec<AuditRow>, limit: i64) -> AuditPage {
    let next = (rows.len() as i64 == limit)
        .then(|| {
            rows.last().map(|r| AuditCursor {
                at: r.at,
                seq: r.seq,
            })
        })
        .flatten();
    AuditPage { rows, next }
}
