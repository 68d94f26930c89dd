//! The job effects recorded beside character rows (`character_job_effects`): which keys a batch
//! has seen before, the sequenced effects a settle orders against, and the records it adds.
//! What the rows mean, and when they are pruned, is in `docs/bookkeeping.md`.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use super::apply::RecordedEffect;
use super::job::PersistenceRetryPayload;

/// Most sequenced effects read for one settle or one load (per character, far more than a live
/// copy leaves between two of its writes).
pub(crate) const MAX_EFFECTS_READ: i64 = 4096;

/// The `(character, key)` pairs among `pairs` whose effect is already recorded.
pub(crate) async fn recorded_keys(
    tx: &mut sqlx::PgConnection,
    pairs: &[(Uuid, String)],
) -> Result<HashSet<(Uuid, String)>, sqlx::Error> {
    if pairs.is_empty() {
        return Ok(HashSet::new());
    }
    let (characters, keys): (Vec<Uuid>, Vec<&str>) =
        pairs.iter().map(|(c, k)| (*c, k.as_str())).unzip();
    // One primary-key probe per pair: the LIMIT keeps the planner from turning the lookup into a
    // hash join over the whole table once a batch holds many pairs.
    let found: Vec<(Uuid, String)> = sqlx::query_as(
        "SELECT e.character_id, e.idempotency_key
           FROM UNNEST($1::uuid[], $2::text[]) AS k(character_id, idempotency_key)
           CROSS JOIN LATERAL (
               SELECT character_id, idempotency_key FROM character_job_effects e
                WHERE e.character_id = k.character_id AND e.idempotency_key = k.idempotency_key
                LIMIT 1
           ) e",
    )
    .bind(&characters)
    .bind(&keys)
    .fetch_all(&mut *tx)
    .await?;
    Ok(found.into_iter().collect())
}

type EffectRow = (Uuid, String, i64, i64, i64, serde_json::Value);

/// The sequenced effects recorded for each of `characters` under the epoch given with it, in
/// issue order (the newest [`MAX_EFFECTS_READ`] when there are more). An effect whose payload no
/// longer decodes is left out (it cannot be replayed).
pub(crate) async fn sequenced(
    conn: &mut sqlx::PgConnection,
    characters: &[(Uuid, i64)],
) -> Result<HashMap<Uuid, Vec<RecordedEffect>>, sqlx::Error> {
    if characters.is_empty() {
        return Ok(HashMap::new());
    }
    let (ids, epochs): (Vec<Uuid>, Vec<i64>) = characters.iter().copied().unzip();
    let rows: Vec<EffectRow> = sqlx::query_as(
        "SELECT e.character_id, e.idempotency_key, e.owner_epoch, e.issue_seq, e.row_version,
                e.payload
           FROM UNNEST($1::uuid[], $2::int8[]) AS c(id, epoch)
           CROSS JOIN LATERAL (
               SELECT * FROM character_job_effects e
                WHERE e.character_id = c.id AND e.owner_epoch = c.epoch AND e.issue_seq > 0
                  AND e.payload IS NOT NULL
                ORDER BY e.issue_seq DESC, e.applied_order DESC
                LIMIT $3
           ) e
          ORDER BY e.character_id, e.issue_seq, e.applied_order",
    )
    .bind(&ids)
    .bind(&epochs)
    .bind(MAX_EFFECTS_READ)
    .fetch_all(&mut *conn)
    .await?;
    let mut by_character: HashMap<Uuid, Vec<RecordedEffect>> = HashMap::new();
    for row in rows {
        if let Some((character_id, effect)) = decode(row) {
            by_character.entry(character_id).or_default().push(effect);
        }
    }
    Ok(by_character)
}

/// The effects recorded for each of `characters` at a row version past the one given with it,
/// oldest first (the first [`MAX_EFFECTS_READ`] of each): what a state job's dump made at that
/// version may not hold. One whose payload no longer decodes is left out.
pub(crate) async fn recorded_after(
    conn: &mut sqlx::PgConnection,
    characters: &[(Uuid, i64)],
) -> Result<HashMap<Uuid, Vec<RecordedEffect>>, sqlx::Error> {
    if characters.is_empty() {
        return Ok(HashMap::new());
    }
    let (ids, versions): (Vec<Uuid>, Vec<i64>) = characters.iter().copied().unzip();
    let rows: Vec<EffectRow> = sqlx::query_as(
        "SELECT e.character_id, e.idempotency_key, e.owner_epoch, e.issue_seq, e.row_version,
                e.payload
           FROM UNNEST($1::uuid[], $2::int8[]) AS c(id, after)
           CROSS JOIN LATERAL (
               SELECT * FROM character_job_effects e
                WHERE e.character_id = c.id AND e.row_version > c.after
                  AND e.payload IS NOT NULL AND e.job_kind <> 'gameplay_state'
                ORDER BY e.row_version, e.applied_order
                LIMIT $3
           ) e
          ORDER BY e.character_id, e.row_version, e.applied_order",
    )
    .bind(&ids)
    .bind(&versions)
    .bind(MAX_EFFECTS_READ)
    .fetch_all(&mut *conn)
    .await?;
    let mut by_character: HashMap<Uuid, Vec<RecordedEffect>> = HashMap::new();
    for row in rows {
        if let Some((character_id, effect)) = decode(row) {
            by_character.entry(character_id).or_default().push(effect);
        }
    }
    Ok(by_character)
}

/// One recorded row as an effect, when its payload decodes.
pub(crate) fn decode(row: EffectRow) -> Option<(Uuid, RecordedEffect)> {
    let (character_id, key, owner_epoch, issue_seq, row_version, payload) = row;
    let payload = PersistenceRetryPayload::decode(payload, None).ok()?;
    Some((
        character_id,
        RecordedEffect {
            key,
            owner_epoch,
            issue_seq: u64::try_from(issue_seq).ok()?,
            row_version,
            payload,
        },
    ))
}

/// An applied job's record, to insert with the batch.
#[derive(Debug, Clone)]
pub(crate) struct NewRecord {
    pub(crate) character_id: Uuid,
    pub(crate) key: String,
    pub(crate) owner_epoch: i64,
    pub(crate) issue_seq: u64,
    pub(crate) payload: PersistenceRetryPayload,
}

/// Most bytes of payloads sent in one INSERT (see the settle's `UPDATE_CHUNK_BYTES`: a bind
/// message past the socket's first send buffer stalls on the server's delayed ACK).
const INSERT_CHUNK_BYTES: usize = 10 * 1024;

/// Inserts the records of a batch's applied jobs, in statements of bounded size; `versions`
/// gives each character's row version after the batch.
pub(crate) async fn insert(
    tx: &mut sqlx::PgConnection,
    records: &[NewRecord],
    versions: &HashMap<Uuid, i64>,
) -> Result<(), sqlx::Error> {
    let mut start = 0;
    let mut bytes = 0;
    for (n, record) in records.iter().enumerate() {
        bytes += 96 + record.key.len() + payload_len(&record.payload);
        if bytes >= INSERT_CHUNK_BYTES || n + 1 == records.len() {
            insert_chunk(tx, &records[start..=n], versions).await?;
            start = n + 1;
            bytes = 0;
        }
    }
    Ok(())
}

fn payload_len(payload: &PersistenceRetryPayload) -> usize {
    crate::model::encoded_len(payload.encoded())
}

async fn insert_chunk(
    tx: &mut sqlx::PgConnection,
    records: &[NewRecord],
    versions: &HashMap<Uuid, i64>,
) -> Result<(), sqlx::Error> {
    if records.is_empty() {
        return Ok(());
    }
    let mut characters = Vec::with_capacity(records.len());
    let mut keys = Vec::with_capacity(records.len());
    let mut epochs = Vec::with_capacity(records.len());
    let mut seqs = Vec::with_capacity(records.len());
    let mut kinds = Vec::with_capacity(records.len());
    let mut payloads = Vec::with_capacity(records.len());
    let mut row_versions = Vec::with_capacity(records.len());
    for r in records {
        characters.push(r.character_id);
        keys.push(r.key.as_str());
        epochs.push(r.owner_epoch);
        seqs.push(i64::try_from(r.issue_seq).unwrap_or(i64::MAX));
        kinds.push(r.payload.kind());
        payloads.push(sqlx::types::Json(&r.payload));
        row_versions.push(versions.get(&r.character_id).copied().unwrap_or(0));
    }
    sqlx::query(
        "INSERT INTO character_job_effects
                (character_id, idempotency_key, owner_epoch, issue_seq, job_kind, payload, row_version)
         SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::int8[], $4::int8[], $5::text[], $6::jsonb[], $7::int8[])
         ON CONFLICT (character_id, idempotency_key) DO NOTHING",
    )
    .bind(&characters)
    .bind(&keys)
    .bind(&epochs)
    .bind(&seqs)
    .bind(&kinds)
    .bind(&payloads)
    .bind(&row_versions)
    .execute(&mut *tx)
    .await?;
    Ok(())
}
