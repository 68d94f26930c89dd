//! The character store in the embedded store's file: create, claim, load, the compare-and-swap
//! save and the location writes over the SQLite `characters` table. Every write is one
//! `BEGIN IMMEDIATE` transaction, so the file's write lock makes each decision atomic as the
//! Postgres statements' row locks do: the fence is checked in the statement that writes, and
//! what a refused write is told is read under the same lock.

use uuid::Uuid;

use super::StateJson;
use super::checkpoint_sqlite::micros;
use super::claim_batch::ClaimTuple;
use super::snapshot::{CharacterSnapshot, SaveOutcome, classify_save};
use super::store::{LocationOrder, LocationWrite, NewCharacter, StoreError, mark_of, schema_of};
use crate::audit::name_key;
use crate::backend::SqliteBackend;
use crate::clock::Clock;
use crate::retry::SettledAtClaim;
use crate::retry::job_tx::JobTx;

/// A row as the embedded schema stores it: the state and chargen documents as text.
type StoredRow = (
    Uuid,
    Uuid,
    String,
    Option<String>,
    Option<String>,
    String,
    Option<String>,
    i64,
    i64,
    i64,
    i64,
);

/// The columns of a row, as a snapshot reads them (the issue mark counts for its owner only).
macro_rules! select_row {
    ($filter:literal) => {
        concat!(
            "SELECT id, account_id, name, zone_ref, room_ref, state, chargen, state_version, \
             owner_epoch, CASE WHEN live_issue_epoch = owner_epoch THEN live_issue_mark \
             ELSE 0 END, schema_version FROM characters WHERE ",
            $filter
        )
    };
}

/// A stored document that does not parse: the file was changed by something else.
pub(super) fn corrupt(character_id: Uuid, what: &str, err: &serde_json::Error) -> StoreError {
    StoreError::Database(sqlx::Error::Decode(
        format!("the {what} of character {character_id} in the embedded store is not JSON: {err}")
            .into(),
    ))
}

fn documents(
    character_id: Uuid,
    state: String,
    chargen: Option<String>,
) -> Result<(StateJson, Option<serde_json::Value>), StoreError> {
    let state = StateJson::parse(state).map_err(|e| corrupt(character_id, "state", &e))?;
    let chargen = chargen
        .map(|text| serde_json::from_str(&text))
        .transpose()
        .map_err(|e| corrupt(character_id, "chargen", &e))?;
    Ok((state, chargen))
}

fn snapshot_of(row: StoredRow) -> Result<CharacterSnapshot, StoreError> {
    let (id, account_id, name, zone_ref, room_ref, state, chargen, version, epoch, mark, schema) =
        row;
    let (state, chargen) = documents(id, state, chargen)?;
    Ok(CharacterSnapshot {
        character_id: id,
        account_id,
        name,
        zone_ref,
        room_ref,
        state,
        chargen,
        state_version: version,
        owner_epoch: epoch,
        issue_mark: u64::try_from(mark).unwrap_or(0),
        schema_version: u32::try_from(schema).unwrap_or(1),
    })
}

fn chargen_text(chargen: Option<&serde_json::Value>) -> Option<String> {
    chargen.map(serde_json::Value::to_string)
}

/// Creates a character at version 0 and epoch 0.
pub(super) async fn create(
    db: &SqliteBackend,
    clock: &dyn Clock,
    new: &NewCharacter,
) -> Result<(), StoreError> {
    let mut tx = db.begin().await?;
    create_on(&mut tx, micros(clock), new).await?;
    tx.commit().await?;
    Ok(())
}

/// Creates a character at version 0 and epoch 0 on `conn` (inside the caller's write
/// transaction), stamped `now` (microseconds).
pub(super) async fn create_on(
    conn: &mut sqlx::SqliteConnection,
    now: i64,
    new: &NewCharacter,
) -> Result<(), StoreError> {
    let name = new.name.trim();
    let zone_ref = new.zone_ref.as_deref().filter(|z| !z.is_empty());
    sqlx::query(
        "INSERT INTO characters (id, account_id, name, name_key, zone_ref, room_ref, state,
                                 chargen, schema_version, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?10)",
    )
    .bind(new.character_id)
    .bind(new.account_id)
    .bind(name)
    .bind(name_key(name))
    .bind(zone_ref)
    .bind(zone_ref.and(new.room_ref.as_deref()))
    .bind(new.state.as_str())
    .bind(chargen_text(new.chargen.as_ref()))
    .bind(i32::try_from(new.schema_version.max(1)).unwrap_or(i32::MAX))
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(|e| match &e {
        sqlx::Error::Database(db) if db.is_unique_violation() && db.message().contains("name") => {
            StoreError::NameTaken(name.to_owned())
        }
        _ => StoreError::Database(e),
    })?;
    Ok(())
}

/// The row of `character_id`, if any.
pub(super) async fn load(
    db: &SqliteBackend,
    character_id: Uuid,
) -> Result<Option<CharacterSnapshot>, StoreError> {
    let row: Option<StoredRow> = sqlx::query_as(select_row!("id = ?1"))
        .bind(character_id)
        .fetch_optional(db.reader()?)
        .await?;
    row.map(snapshot_of).transpose()
}

/// The row of the character named `name` (any case), if any.
pub(super) async fn load_by_name(
    db: &SqliteBackend,
    name: &str,
) -> Result<Option<CharacterSnapshot>, StoreError> {
    let row: Option<StoredRow> = sqlx::query_as(select_row!("name_key = ?1"))
        .bind(name_key(name))
        .fetch_optional(db.reader()?)
        .await?;
    row.map(snapshot_of).transpose()
}

/// The row's `(state_version, owner_epoch)`.
pub(super) async fn version_of(
    db: &SqliteBackend,
    character_id: Uuid,
) -> Result<Option<(i64, i64)>, StoreError> {
    Ok(
        sqlx::query_as("SELECT state_version, owner_epoch FROM characters WHERE id = ?1")
            .bind(character_id)
            .fetch_optional(db.reader()?)
            .await?,
    )
}

/// Most snapshots one batched compare-and-swap statement saves (nine parameters each).
const SAVES_PER_STATEMENT: usize = 128;

/// The fenced update of one or more rows (`?1`: now, then nine parameters a snapshot: id,
/// expected version, epoch, state, chargen, zone, room, issue mark, schema): a row is written
/// only at the version the snapshot was dumped from, by an owner at or above its epoch, with a
/// document at or above its schema. The rows saved come back with their new version (the
/// right-hand sides read the row as it was, so `live_version` takes the new one).
fn save_batch(rows: usize) -> String {
    let mut values = String::new();
    for row in 0..rows {
        let first = 2 + row * 9;
        if row > 0 {
            values.push_str(", ");
        }
        let params: Vec<String> = (first..first + 9).map(|n| format!("?{n}")).collect();
        values.push('(');
        values.push_str(&params.join(", "));
        values.push(')');
    }
    // VALUES columns are `column1` … `column9` in SQLite (a subquery takes no column list).
    format!(
        "UPDATE characters
            SET state = v.column4,
                chargen = v.column5,
                zone_ref = COALESCE(NULLIF(v.column6, ''), characters.zone_ref),
                room_ref = CASE WHEN NULLIF(v.column6, '') IS NULL THEN characters.room_ref
                                ELSE v.column7 END,
                state_version = characters.state_version + 1,
                live_version = characters.state_version + 1,
                live_issue_epoch = v.column3,
                live_issue_mark = v.column8,
                schema_version = v.column9,
                updated_at = ?1
           FROM (VALUES {values}) AS v
          WHERE characters.id = v.column1 AND characters.state_version = v.column2
            AND characters.owner_epoch <= v.column3 AND characters.schema_version <= v.column9
      RETURNING id, state_version"
    )
}

/// Compare-and-swap saves of `snapshots` (distinct ids, checked by the caller) in one
/// transaction, one outcome each, in order: many rows to a statement, and a read only for a
/// row a save did not land on (what it was refused for).
pub(super) async fn save_many(
    db: &SqliteBackend,
    clock: &dyn Clock,
    snapshots: &[&CharacterSnapshot],
) -> Result<Vec<(Uuid, SaveOutcome)>, StoreError> {
    let mut tx = db.begin().await?;
    let now = micros(clock);
    let mut outcomes = Vec::with_capacity(snapshots.len());
    for chunk in snapshots.chunks(SAVES_PER_STATEMENT) {
        save_chunk(&mut tx, now, chunk, &mut outcomes).await?;
    }
    tx.commit().await?;
    Ok(outcomes)
}

/// One statement of [`save_many`] (or [`save_on`]'s single row), its outcomes appended in order.
async fn save_chunk(
    conn: &mut sqlx::SqliteConnection,
    now: i64,
    chunk: &[&CharacterSnapshot],
    outcomes: &mut Vec<(Uuid, SaveOutcome)>,
) -> Result<(), StoreError> {
    // Only the one-row and the full statement stay prepared: other lengths are the tails of
    // batches, and would crowd the connection's statement cache with a shape per length.
    let mut statement = sqlx::query_as(sqlx::AssertSqlSafe(save_batch(chunk.len())))
        .persistent(chunk.len() == 1 || chunk.len() == SAVES_PER_STATEMENT)
        .bind(now);
    for snapshot in chunk {
        let zone_ref = snapshot.zone_ref.as_deref().filter(|z| !z.is_empty());
        statement = statement
            .bind(snapshot.character_id)
            .bind(snapshot.state_version)
            .bind(snapshot.owner_epoch)
            .bind(snapshot.state.as_str())
            .bind(chargen_text(snapshot.chargen.as_ref()))
            .bind(zone_ref)
            .bind(zone_ref.and(snapshot.room_ref.as_deref()))
            .bind(mark_of(snapshot))
            .bind(schema_of(snapshot));
    }
    let saved: Vec<(Uuid, i64)> = statement.fetch_all(&mut *conn).await?;
    let saved: std::collections::HashMap<Uuid, i64> = saved.into_iter().collect();
    for snapshot in chunk {
        let id = snapshot.character_id;
        let landed = saved.get(&id).copied();
        let current: Option<(i64, i64, i32)> = match landed {
            Some(_) => None,
            None => {
                sqlx::query_as(
                    "SELECT state_version, owner_epoch, schema_version FROM characters
                      WHERE id = ?1",
                )
                .bind(id)
                .fetch_optional(&mut *conn)
                .await?
            }
        };
        let writer = (snapshot.owner_epoch, schema_of(snapshot));
        outcomes.push((id, classify_save(current, landed, writer)));
    }
    Ok(())
}

/// The compare-and-swap save of `snapshot` on `conn` (inside the caller's write transaction),
/// stamped `now`.
pub(super) async fn save_on(
    conn: &mut sqlx::SqliteConnection,
    now: i64,
    snapshot: &CharacterSnapshot,
) -> Result<SaveOutcome, StoreError> {
    let mut outcomes = Vec::with_capacity(1);
    save_chunk(conn, now, &[snapshot], &mut outcomes).await?;
    Ok(outcomes
        .pop()
        .map_or(SaveOutcome::NotFound, |(_, outcome)| outcome))
}

/// The claimed row's columns the claim's answer takes from the update.
type ClaimedColumns = (
    Uuid,
    String,
    Option<String>,
    Option<String>,
    String,
    Option<String>,
    i64,
    i64,
    i64,
    i64,
    i64,
);

/// What the claim needs to know about the row before it writes.
type Before = (i64, Option<String>, i64, i64);

/// Mints the next owner epoch of `character_id` (`max(row, floor) + 1`) and answers as the
/// Postgres claim statement does: the claim's row and the effects since its content's dump, or
/// `None` when there is no row. A handoff's content is adopted only when the copy that dumped
/// it still owns the row, or this handoff's own earlier claim does. Refused, with nothing
/// minted, when the row's document or owner is of a newer schema than `schema_ceiling`. A
/// claimant that plays a model (`settles`: the model and the workers' lease-expiry limit) first
/// settles the retry jobs still queued for the character, in the same transaction, as the
/// Postgres claim does; what that did is reported once the claim commits.
pub(super) async fn claim(
    db: &SqliteBackend,
    clock: &dyn Clock,
    (character_id, floor, handoff): (Uuid, i64, Option<(i64, &str)>),
    schema_ceiling: Option<u32>,
    settles: Option<(&crate::model::ModelHandle, u32)>,
) -> Result<Option<(ClaimTuple, serde_json::Value, SettledAtClaim)>, StoreError> {
    let mut tx = db.begin().await?;
    let before: Option<Before> = sqlx::query_as(
        "SELECT owner_epoch, handoff_claim, max(schema_version, owner_schema_version),
                EXISTS (SELECT 1 FROM persistence_retry_jobs WHERE character_id = ?1)
           FROM characters WHERE id = ?1",
    )
    .bind(character_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((previous, claimed_by, stored_schema, queued)) = before else {
        return Ok(None);
    };
    let stored_schema = u32::try_from(stored_schema).unwrap_or(u32::MAX);
    if let Some(supported) = schema_ceiling
        && stored_schema > supported
    {
        return Err(StoreError::SchemaNewer {
            character_id,
            stored: stored_schema,
            supported,
        });
    }
    let mut settled = SettledAtClaim::default();
    if let Some((model, lease_expiry_limit)) = settles
        && queued != 0
    {
        let now = clock.now();
        settled = crate::retry::settle_before_claim(
            &mut JobTx::embedded(&mut tx, now),
            model,
            character_id,
            lease_expiry_limit,
            now,
        )
        .await?;
        // The settle writes documents and marks only, never the owner or the handoff claim:
        // what was read above still decides the claim.
    }
    let adopt = handoff.is_some_and(|(dumped_under, token)| {
        dumped_under == previous || claimed_by.as_deref() == Some(token)
    });
    let new_epoch = previous.max(floor).saturating_add(1);
    let row: ClaimedColumns = sqlx::query_as(
        "UPDATE characters
            SET owner_epoch = ?2,
                lineage_epoch = CASE WHEN ?3 THEN lineage_epoch ELSE ?2 END,
                handoff_claim = CASE WHEN ?3 THEN ?4 END,
                owner_schema_version = COALESCE(?5, owner_schema_version),
                updated_at = ?6
          WHERE id = ?1
      RETURNING account_id, name, zone_ref, room_ref, state, chargen, state_version,
                live_version, live_issue_epoch, live_issue_mark, schema_version",
    )
    .bind(character_id)
    .bind(new_epoch)
    .bind(adopt)
    .bind(handoff.map(|(_, token)| token))
    .bind(schema_ceiling.map(i64::from))
    .bind(micros(clock))
    .fetch_one(&mut *tx)
    .await?;
    let effects = effects_since_dump(&mut tx, character_id).await?;
    let (account, name, zone, room, state, chargen, version, live, mark_epoch, mark, schema) = row;
    // Decoded before the commit: a row whose documents do not parse is claimed by nobody (the
    // transaction rolls back when dropped), rather than minted an epoch no copy can load.
    let (state, chargen) = documents(character_id, state, chargen)?;
    tx.commit().await?;
    let tuple: ClaimTuple = (
        new_epoch,
        character_id,
        account,
        name,
        zone,
        room,
        state,
        chargen,
        version,
        previous,
        live,
        adopt,
        mark_epoch,
        mark,
        i32::try_from(schema).unwrap_or(i32::MAX),
    );
    Ok(Some((tuple, effects, settled)))
}

/// The job effects applied to the row since its content was dumped, as the Postgres claim
/// reads them: `[[key, epoch, seq, row_version, payload], …]`, the newest 4,096 in order. An
/// effect whose payload does not parse is left out (replay is best effort: the row holds it).
async fn effects_since_dump(
    conn: &mut sqlx::SqliteConnection,
    character_id: Uuid,
) -> Result<serde_json::Value, StoreError> {
    let rows: Vec<(String, i64, i64, i64, String)> = sqlx::query_as(
        "SELECT e.idempotency_key, e.owner_epoch, e.issue_seq, e.row_version, e.payload
           FROM character_job_effects e JOIN characters c ON c.id = e.character_id
          WHERE e.character_id = ?1 AND e.payload IS NOT NULL
            AND CASE WHEN e.issue_seq = 0 THEN e.row_version > c.live_version
                     ELSE e.owner_epoch > c.live_issue_epoch
                          OR (e.owner_epoch = c.live_issue_epoch
                              AND e.issue_seq > c.live_issue_mark) END
          ORDER BY e.owner_epoch DESC, e.issue_seq DESC, e.applied_order DESC
          LIMIT 4096",
    )
    .bind(character_id)
    .fetch_all(&mut *conn)
    .await?;
    let effects = rows
        .into_iter()
        .rev()
        .filter_map(|(key, epoch, seq, version, payload)| {
            let payload: serde_json::Value = serde_json::from_str(&payload).ok()?;
            Some(serde_json::json!([key, epoch, seq, version, payload]))
        })
        .collect();
    Ok(serde_json::Value::Array(effects))
}

/// A location write fenced by `owner_epoch`; a session cleanup's (`order`) lands only when newer
/// than the last cleanup location written and no live write of a newer state than the copy
/// knew at close landed.
pub(super) async fn write_location(
    db: &SqliteBackend,
    clock: &dyn Clock,
    (character_id, owner_epoch): (Uuid, i64),
    order: Option<LocationOrder>,
    zone: &str,
    room: &str,
) -> Result<LocationWrite, StoreError> {
    let closed_at = order.map(|o| o.closed_at.timestamp_micros());
    let mut tx = db.begin().await?;
    let written = sqlx::query(
        "UPDATE characters
            SET zone_ref = ?3, room_ref = ?4, state_version = state_version + 1,
                journal_location_epoch = COALESCE(?5, journal_location_epoch),
                journal_location_at = COALESCE(?6, journal_location_at),
                updated_at = ?8
          WHERE id = ?1 AND owner_epoch <= ?2
            AND (?6 IS NULL OR journal_location_epoch IS NULL
                 OR journal_location_epoch < ?5
                 OR (journal_location_epoch = ?5 AND journal_location_at < ?6))
            AND (?7 IS NULL OR live_version <= ?7)",
    )
    .bind(character_id)
    .bind(owner_epoch)
    .bind(zone)
    .bind(room)
    .bind(order.map(|o| o.owner_epoch))
    .bind(closed_at)
    .bind(order.and_then(|o| o.known_version))
    .bind(micros(clock))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    let current: Option<(i64, Option<i64>, Option<i64>)> = sqlx::query_as(
        "SELECT owner_epoch, journal_location_epoch, journal_location_at FROM characters
          WHERE id = ?1",
    )
    .bind(character_id)
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(match (written, current) {
        (1, _) => LocationWrite::Written,
        (_, None) => LocationWrite::NotFound,
        (_, Some((epoch, _, _))) if epoch > owner_epoch => LocationWrite::Superseded {
            current_epoch: epoch,
        },
        (_, Some((_, written_epoch, written_at))) => LocationWrite::Stale {
            newer_cleanup: match (order, written_epoch.zip(written_at), closed_at) {
                (Some(order), Some(written), Some(closed_at)) => {
                    written > (order.owner_epoch, closed_at)
                }
                _ => false,
            },
        },
    })
}

/// Records that the copy at `owner_epoch` started out holding `items` (distinct): an entry
/// keeps the highest epoch, and its load time moves only when older than `refresh`.
pub(super) async fn record_item_loads(
    db: &SqliteBackend,
    clock: &dyn Clock,
    (character_id, owner_epoch): (Uuid, i64),
    items: &[Uuid],
    refresh: std::time::Duration,
) -> Result<(), StoreError> {
    let mut tx = db.begin().await?;
    let now = micros(clock);
    let stale_before = now.saturating_sub(i64::try_from(refresh.as_micros()).unwrap_or(i64::MAX));
    for item in items {
        sqlx::query(
            "INSERT INTO item_loads (item_id, character_id, loaded_epoch, loaded_at)
             VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (character_id, item_id) DO UPDATE
                SET loaded_epoch = max(item_loads.loaded_epoch, excluded.loaded_epoch),
                    loaded_at = CASE WHEN item_loads.loaded_at < ?5 THEN excluded.loaded_at
                                     ELSE item_loads.loaded_at END
              WHERE item_loads.loaded_epoch < excluded.loaded_epoch
                 OR item_loads.loaded_at < ?5",
        )
        .bind(item)
        .bind(character_id)
        .bind(owner_epoch)
        .bind(now)
        .bind(stale_before)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
