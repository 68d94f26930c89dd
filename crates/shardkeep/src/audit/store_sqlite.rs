//! The audit trail in the embedded store: the same idempotent inserts (one transaction per
//! batch, duplicates ignored by the same unique key) and the same newest-first keyset reads,
//! over the SQLite file's `character_audit` table.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::event::AuditEvent;
use super::store::{AuditCursor, AuditRow};
use crate::backend::SqliteBackend;

/// A row as the embedded schema stores it: payload as text, the instant in microseconds.
type StoredRow = (
    Uuid,
    i64,
    String,
    Uuid,
    String,
    String,
    Option<Uuid>,
    String,
    i64,
);

const SELECT_ROWS: &str =
    "SELECT id, seq, subject_type, subject_id, event_kind, dedup_key, actor_id, payload, at
       FROM character_audit";

/// The key names are unique by in the embedded store: trimmed, and lowercased one character
/// at a time, as Postgres's `lower()` folds (a capital sigma always becomes `σ`, never the
/// final form `ς` that lowercasing a whole word picks).
pub fn name_key(name: &str) -> String {
    name.trim().chars().flat_map(char::to_lowercase).collect()
}

/// Inserts `events` in one transaction, in order; duplicates are ignored. Returns rows inserted.
pub(super) async fn insert_many(
    db: &SqliteBackend,
    events: &[AuditEvent],
) -> Result<u64, sqlx::Error> {
    if events.is_empty() {
        return Ok(0);
    }
    // Stamped once the write lock is held, so a later batch never carries an earlier instant.
    let mut tx = db.begin().await?;
    let at = Utc::now().timestamp_micros();
    let inserted = insert_on(&mut tx, events, at).await?;
    tx.commit().await?;
    Ok(inserted)
}

/// Inserts `events` on `conn` (inside the caller's write transaction), in order, stamped `at`
/// (microseconds); duplicates are ignored. Returns rows inserted.
pub(crate) async fn insert_on(
    conn: &mut sqlx::SqliteConnection,
    events: &[AuditEvent],
    at: i64,
) -> Result<u64, sqlx::Error> {
    let mut inserted = 0;
    for event in events {
        let done = sqlx::query(
            "INSERT INTO character_audit
                 (id, subject_type, subject_id, event_kind, dedup_key, actor_id, payload, at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
             ON CONFLICT (subject_id, event_kind, dedup_key) DO NOTHING",
        )
        .bind(event.id)
        .bind(event.subject_type.as_str())
        .bind(event.subject_id)
        .bind(event.kind.as_str())
        .bind(&event.dedup_key)
        .bind(event.actor_id)
        .bind(event.payload.to_string())
        .bind(at)
        .execute(&mut *conn)
        .await?;
        inserted += done.rows_affected();
    }
    Ok(inserted)
}

/// Newest-first rows of a character, folded with `account`'s tier changes when given.
pub(super) async fn page_rows(
    db: &SqliteBackend,
    character_id: Uuid,
    account_id: Option<Uuid>,
    before: Option<AuditCursor>,
    limit: i64,
) -> Result<Vec<AuditRow>, sqlx::Error> {
    // Two statements, so a character's own trail walks its index in order rather than sorting
    // the rows an OR with the account's would gather.
    let subjects = if account_id.is_some() {
        "((subject_id = ?1 AND subject_type = 'character')
          OR (subject_id = ?2 AND subject_type = 'account' AND event_kind = 'tier_changed'))"
    } else {
        "subject_id = ?1 AND subject_type = 'character' AND ?2 IS NULL"
    };
    let sql = sqlx::AssertSqlSafe(format!(
        "{SELECT_ROWS}
          WHERE {subjects}
            AND (?3 IS NULL OR at < ?3 OR (at = ?3 AND seq < ?4))
          ORDER BY at DESC, seq DESC
          LIMIT ?5"
    ));
    let rows: Vec<StoredRow> = sqlx::query_as(sql)
        .bind(character_id)
        .bind(account_id)
        .bind(before.map(|c| c.at.timestamp_micros()))
        .bind(before.map_or(0, |c| c.seq))
        .bind(limit)
        .fetch_all(db.reader()?)
        .await?;
    rows.into_iter().map(decode).collect()
}

/// The id and owning account of the character named `name` (any case).
pub(super) async fn character_by_name(
    db: &SqliteBackend,
    name: &str,
) -> Result<Option<(Uuid, Uuid)>, sqlx::Error> {
    sqlx::query_as("SELECT id, account_id FROM characters WHERE name_key = ?1")
        .bind(name_key(name))
        .fetch_optional(db.reader()?)
        .await
}

fn decode(row: StoredRow) -> Result<AuditRow, sqlx::Error> {
    let (id, seq, subject_type, subject_id, event_kind, dedup_key, actor_id, payload, at) = row;
    let payload = serde_json::from_str(&payload).map_err(|e| sqlx::Error::ColumnDecode {
        index: "payload".into(),
        source: Box::new(e),
    })?;
    let at =
        DateTime::<Utc>::from_timestamp_micros(at).ok_or_else(|| sqlx::Error::ColumnDecode {
            index: "at".into(),
            source: format!("{at} µs is out of range").into(),
        })?;
    Ok(AuditRow {
        id,
        seq,
        subject_type,
        subject_id,
        event_kind,
        dedup_key,
        actor_id,
        payload,
        at,
    })
}

#[cfg(test)]
mod tests {
    use super::name_key;

    #[test]
    fn names_fold_as_postgres_lower_does() {
        assert_eq!(name_key("  Aria "), "aria");
        assert_eq!(name_key("ΟΔΟΣ"), "οδοσ");
        assert_eq!(name_key("οδος"), "οδος");
        assert_ne!(name_key("ΟΔΟΣ"), name_key("οδος"));
        assert_eq!(name_key("ÆLFRIC"), "ælfric");
    }
}
