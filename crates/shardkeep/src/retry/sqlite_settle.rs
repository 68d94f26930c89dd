//! A settle's reads and writes of the character rows and of what is recorded beside them, in the
//! embedded store's file: the rows, their item releases and recorded effects, then the rows
//! written back, the effects recorded and the transfer activations. Each runs in the settle's
//! write transaction (`job_tx`), one prepared statement per row.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use super::apply::RecordedEffect;
use super::effects::{MAX_EFFECTS_READ, NewRecord, decode};
use super::job_tx::CharacterRow;
use super::settle_writes::{Activation, RowChunk};
use super::sqlite_jobs::marks;

/// The stored row columns, the document as text.
type StoredRow = (
    Uuid,
    i64,
    i64,
    String,
    Option<String>,
    Option<String>,
    i64,
    i64,
    i32,
    i32,
);

/// The rows of `ids`. A document that is not JSON fails the settle (the file was changed by
/// something else): nothing of the batch is written.
pub(super) async fn character_rows(
    conn: &mut sqlx::SqliteConnection,
    ids: &[Uuid],
) -> Result<Vec<CharacterRow>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "SELECT id, owner_epoch, state_version, state, zone_ref, room_ref, live_issue_epoch,
                live_issue_mark, schema_version, owner_schema_version
           FROM characters WHERE id IN ({})",
        marks(1, ids.len())
    );
    let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql));
    for id in ids {
        query = query.bind(*id);
    }
    let rows: Vec<StoredRow> = query.fetch_all(&mut *conn).await?;
    rows.into_iter()
        .map(
            |(id, epoch, version, state, zone, room, mark_epoch, mark, schema, owner)| {
                let state = serde_json::from_str(&state).map_err(|e| {
                    sqlx::Error::Decode(
                        format!(
                            "the state of character {id} in the embedded store is not JSON: {e}"
                        )
                        .into(),
                    )
                })?;
                Ok((
                    id, epoch, version, state, zone, room, mark_epoch, mark, schema, owner,
                ))
            },
        )
        .collect()
}

/// The items transfer commits took from each of `ids` (`(character, item)`).
pub(super) async fn released(
    conn: &mut sqlx::SqliteConnection,
    ids: &[Uuid],
) -> Result<Vec<(Uuid, Uuid)>, sqlx::Error> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "SELECT character_id, item_id FROM item_releases WHERE character_id IN ({})",
        marks(1, ids.len())
    );
    let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql));
    for id in ids {
        query = query.bind(*id);
    }
    query.fetch_all(&mut *conn).await
}

/// The sequenced effects recorded for each of `characters` under the epoch given with it, in
/// issue order (the newest [`MAX_EFFECTS_READ`]); one whose payload no longer decodes is left out.
pub(super) async fn sequenced(
    conn: &mut sqlx::SqliteConnection,
    characters: &[(Uuid, i64)],
) -> Result<HashMap<Uuid, Vec<RecordedEffect>>, sqlx::Error> {
    let mut by_character: HashMap<Uuid, Vec<RecordedEffect>> = HashMap::new();
    for (id, epoch) in characters {
        let rows: Vec<(String, i64, i64, i64, String)> = sqlx::query_as(
            "SELECT idempotency_key, owner_epoch, issue_seq, row_version, payload
               FROM character_job_effects
              WHERE character_id = ?1 AND owner_epoch = ?2 AND issue_seq > 0
                AND payload IS NOT NULL
              ORDER BY issue_seq DESC, applied_order DESC
              LIMIT ?3",
        )
        .bind(id)
        .bind(epoch)
        .bind(MAX_EFFECTS_READ)
        .fetch_all(&mut *conn)
        .await?;
        let effects = rows
            .into_iter()
            .rev()
            .filter_map(|(key, epoch, seq, version, payload)| {
                let payload = serde_json::from_str(&payload).ok()?;
                decode((*id, key, epoch, seq, version, payload)).map(|(_, effect)| effect)
            })
            .collect();
        by_character.insert(*id, effects);
    }
    Ok(by_character)
}

/// The effects recorded for each of `characters` at a row version past the one given with it,
/// oldest first (the first [`MAX_EFFECTS_READ`]); one whose payload no longer decodes is left out.
pub(super) async fn recorded_after(
    conn: &mut sqlx::SqliteConnection,
    characters: &[(Uuid, i64)],
) -> Result<HashMap<Uuid, Vec<RecordedEffect>>, sqlx::Error> {
    let mut by_character: HashMap<Uuid, Vec<RecordedEffect>> = HashMap::new();
    for (id, after) in characters {
        let rows: Vec<(String, i64, i64, i64, String)> = sqlx::query_as(
            "SELECT idempotency_key, owner_epoch, issue_seq, row_version, payload
               FROM character_job_effects
              WHERE character_id = ?1 AND row_version > ?2 AND payload IS NOT NULL
                AND job_kind <> 'gameplay_state'
              ORDER BY row_version, applied_order
              LIMIT ?3",
        )
        .bind(id)
        .bind(after)
        .bind(MAX_EFFECTS_READ)
        .fetch_all(&mut *conn)
        .await?;
        let effects = rows
            .into_iter()
            .filter_map(|(key, epoch, seq, version, payload)| {
                let payload = serde_json::from_str(&payload).ok()?;
                decode((*id, key, epoch, seq, version, payload)).map(|(_, effect)| effect)
            })
            .collect();
        by_character.insert(*id, effects);
    }
    Ok(by_character)
}

/// The `(character, key)` pairs among `pairs` whose effect is already recorded.
pub(super) async fn recorded_keys(
    conn: &mut sqlx::SqliteConnection,
    pairs: &[(Uuid, String)],
) -> Result<HashSet<(Uuid, String)>, sqlx::Error> {
    let mut found = HashSet::new();
    for (character_id, key) in pairs {
        let hit: Option<i64> = sqlx::query_scalar(
            "SELECT 1 FROM character_job_effects WHERE character_id = ?1 AND idempotency_key = ?2",
        )
        .bind(character_id)
        .bind(key)
        .fetch_optional(&mut *conn)
        .await?;
        if hit.is_some() {
            found.insert((*character_id, key.clone()));
        }
    }
    Ok(found)
}

/// Writes the rows of `chunk`, each one version on (stamped `now`, microseconds). As on
/// Postgres, an empty zone keeps the row's zone and room.
pub(super) async fn update_characters(
    conn: &mut sqlx::SqliteConnection,
    now: i64,
    chunk: &RowChunk<'_>,
) -> Result<(), sqlx::Error> {
    for (n, id) in chunk.ids.iter().enumerate() {
        let state =
            serde_json::to_string(chunk.states[n]).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
        sqlx::query(
            "UPDATE characters
                SET state = ?2, zone_ref = COALESCE(NULLIF(?3, ''), zone_ref),
                    room_ref = CASE WHEN NULLIF(?3, '') IS NULL THEN room_ref ELSE ?4 END,
                    live_issue_epoch = ?5, live_issue_mark = ?6,
                    live_version = CASE WHEN ?7 THEN state_version + 1 ELSE live_version END,
                    state_version = state_version + 1, schema_version = ?8, updated_at = ?9
              WHERE id = ?1",
        )
        .bind(id)
        .bind(state)
        .bind(chunk.zones[n])
        .bind(chunk.rooms[n])
        .bind(chunk.mark_epochs[n])
        .bind(chunk.marks[n])
        .bind(chunk.live[n])
        .bind(chunk.schemas[n])
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Records the batch's applied jobs (one already recorded under its key stays as it is), each
/// after the character's earlier records in the order they applied.
pub(super) async fn insert_effects(
    conn: &mut sqlx::SqliteConnection,
    now: i64,
    records: &[NewRecord],
    versions: &HashMap<Uuid, i64>,
) -> Result<(), sqlx::Error> {
    for r in records {
        let payload =
            serde_json::to_string(&r.payload).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
        sqlx::query(
            "INSERT INTO character_job_effects (character_id, idempotency_key, owner_epoch,
                 issue_seq, job_kind, payload, row_version, applied_order, applied_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7,
                     (SELECT coalesce(max(applied_order), 0) + 1 FROM character_job_effects
                       WHERE character_id = ?1), ?8)
             ON CONFLICT (character_id, idempotency_key) DO NOTHING",
        )
        .bind(r.character_id)
        .bind(&r.key)
        .bind(r.owner_epoch)
        .bind(i64::try_from(r.issue_seq).unwrap_or(i64::MAX))
        .bind(r.payload.kind())
        .bind(payload)
        .bind(versions.get(&r.character_id).copied().unwrap_or(0))
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Records transfer activations at `now` (one already recorded stays as it is).
pub(super) async fn insert_activations(
    conn: &mut sqlx::SqliteConnection,
    now: i64,
    activations: &[Activation],
) -> Result<(), sqlx::Error> {
    for (token, character_id, shard, zone, epoch) in activations {
        sqlx::query(
            "INSERT INTO transfer_activations (transfer_token, character_id, target_shard,
                 target_zone, owner_epoch, activated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (character_id, transfer_token) DO NOTHING",
        )
        .bind(token)
        .bind(character_id)
        .bind(shard)
        .bind(zone)
        .bind(epoch)
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}
