//! Claims that arrive together are made together: a login storm (a killed shard's players
//! logging in elsewhere at once) becomes a few transactions of many characters each instead of a
//! transaction per player. Through [`crate::batching`], up to [`MOST_CLAIMING`] tasks each take
//! what waits (one claim per character, callers still waiting) into one transaction: a statement
//! that locks the rows in id order, skipping rows another transaction holds, and mints every
//! epoch that needs no settle, then the read of the effects since each content's dump, then the
//! commit — so an epoch is minted only together with the answer its caller needs. Every caller is
//! told its row, or that its claim must go the careful way (a job queued, a row locked, a
//! refusal, no row), which the store then takes alone (waiting for a lock as a claim always did,
//! without holding up anyone else's).

use std::collections::HashMap;

use uuid::Uuid;

use crate::backend::PostgresBackend;
use crate::batching::{BatchOp, Batcher, all_failed};

/// Most claiming tasks at once: the next batch gathers while one commits.
const MOST_CLAIMING: usize = 2;
/// Most characters one statement claims.
const MOST_ROWS: usize = 128;

/// One claim statement's row (see `store::CLAIM`).
pub(super) type ClaimTuple = (
    i64,
    Uuid,
    Uuid,
    String,
    Option<String>,
    Option<String>,
    super::StateJson,
    Option<serde_json::Value>,
    i64,
    i64,
    i64,
    bool,
    i64,
    i64,
    i32,
);

/// A claim's row, the effects since its content's dump and what the claim still owes;
/// `None`: not claimed here.
pub(super) type Claimed = Option<(ClaimTuple, serde_json::Value, Owed)>;

/// What a committed claim owes when its caller is gone (a timeout, a dropped connection),
/// called with the epoch it minted: the loader takes the checkpoint over, so the claim never
/// fences the checkpoint unread.
pub(crate) type ClaimDue = std::sync::Arc<dyn Fn(i64) + Send + Sync>;

/// A committed claim's debt: paid on drop (the due called with the minted epoch) unless the
/// caller settles it itself ([`Owed::settled`]). A claim answered to a caller that has gone is
/// dropped with its answer, so the debt is paid wherever the caller stopped.
pub(crate) struct Owed {
    due: Option<ClaimDue>,
    epoch: i64,
}

impl Owed {
    /// The claim's caller has done what the claim owed.
    pub(crate) fn settled(mut self) {
        self.due = None;
    }
}

impl Drop for Owed {
    fn drop(&mut self) {
        if let Some(due) = self.due.take() {
            due(self.epoch);
        }
    }
}

impl std::fmt::Debug for Owed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Owed")
            .field("epoch", &self.epoch)
            .field("due", &self.due.is_some())
            .finish()
    }
}

// The claims of many characters (`$1`, with their epoch floors `$2` and, for handoffs, the epoch
// the carried snapshot was dumped under `$3` and the token `$4`), each decided as the one-row
// claim decides it, rows locked first in id order (the global lock order) and rows another
// transaction holds skipped; only while no job of the character is queued ($6).
const CLAIM_MANY: &str = "
WITH input AS (
    SELECT * FROM UNNEST($1::uuid[], $2::int8[], $3::int8[], $4::text[])
        AS t(id, floor, dumped_epoch, token)
), prev AS (
    SELECT c.id, c.owner_epoch, c.handoff_claim FROM characters c
     WHERE c.id = ANY($1) ORDER BY c.id FOR UPDATE SKIP LOCKED
), decided AS (
    SELECT p.id, p.owner_epoch, i.floor, i.token,
           COALESCE(i.dumped_epoch = p.owner_epoch OR i.token = p.handoff_claim, false) AS adopt
      FROM prev p JOIN input i ON i.id = p.id
)
UPDATE characters c
   SET owner_epoch = GREATEST(d.owner_epoch, d.floor) + 1,
       lineage_epoch = CASE WHEN d.adopt THEN c.lineage_epoch
                            ELSE GREATEST(d.owner_epoch, d.floor) + 1 END,
       handoff_claim = CASE WHEN d.adopt THEN d.token END,
       owner_schema_version = COALESCE($5::int4, c.owner_schema_version),
       updated_at = now()
  FROM decided d
 WHERE c.id = d.id
   AND ($5::int4 IS NULL OR GREATEST(c.schema_version, c.owner_schema_version) <= $5::int4)
   AND NOT ($6::bool AND EXISTS (SELECT 1 FROM persistence_retry_jobs j WHERE j.character_id = c.id))
RETURNING c.owner_epoch, c.id, c.account_id, c.name, c.zone_ref, c.room_ref, c.state, c.chargen,
          c.state_version, d.owner_epoch, c.live_version, d.adopt, c.live_issue_epoch,
          c.live_issue_mark, c.schema_version";

// The job effects applied to each of `$1` since its row's content was dumped, read after the claim
// (its own statement: a claim that waited for a settle's lock reads the settled row, and only a
// statement started after that commit sees the settle's effect records too). A loader replays the
// previous owner's on a newer checkpoint: sequenced ones past the content's mark or of a later
// owner, unsequenced ones since the last live write; the newest 4,096, in order.
pub(super) const EFFECTS_SINCE_DUMP: &str = "
SELECT i.id, COALESCE((
    SELECT jsonb_agg(jsonb_build_array(e.idempotency_key, e.owner_epoch, e.issue_seq,
                                       e.row_version, e.payload)
                     ORDER BY e.owner_epoch, e.issue_seq, e.applied_order)
      FROM (SELECT e.* FROM character_job_effects e JOIN characters c ON c.id = e.character_id
             WHERE e.character_id = i.id AND e.payload IS NOT NULL
               AND CASE WHEN e.issue_seq = 0 THEN e.row_version > c.live_version
                        ELSE e.owner_epoch > c.live_issue_epoch
                             OR (e.owner_epoch = c.live_issue_epoch
                                 AND e.issue_seq > c.live_issue_mark) END
             ORDER BY e.owner_epoch DESC, e.issue_seq DESC, e.applied_order DESC
             LIMIT 4096) e), '[]'::jsonb)
  FROM UNNEST($1::uuid[]) AS i(id)";

/// The effects since the content's dump of each of `ids`.
pub(super) async fn effects_since_dump<'c, E>(
    conn: E,
    ids: &[Uuid],
) -> Result<HashMap<Uuid, serde_json::Value>, sqlx::Error>
where
    E: sqlx::PgExecutor<'c>,
{
    let rows: Vec<(Uuid, serde_json::Value)> = sqlx::query_as(EFFECTS_SINCE_DUMP)
        .bind(ids)
        .fetch_all(conn)
        .await?;
    Ok(rows.into_iter().collect())
}

/// One claim to make.
pub(super) struct ClaimRequest {
    character_id: Uuid,
    floor: i64,
    handoff: Option<(i64, String)>,
    due: Option<ClaimDue>,
}

/// Claims, made many to a statement.
pub(super) struct ClaimOp {
    pg: PostgresBackend,
    schema_ceiling: Option<u32>,
    unqueued_only: bool,
}

/// The store's claims that need no settle, batched.
pub(super) type ClaimBatcher = Batcher<ClaimOp>;

/// Claims on `pg`, bounded by `schema_ceiling`; `unqueued_only`: leave characters with a queued
/// job to the careful path.
pub(super) fn claim_batcher(
    pg: PostgresBackend,
    schema_ceiling: Option<u32>,
    unqueued_only: bool,
) -> std::sync::Arc<ClaimBatcher> {
    Batcher::new(
        ClaimOp {
            pg,
            schema_ceiling,
            unqueued_only,
        },
        MOST_CLAIMING,
    )
}

/// Claims `character_id` with whatever else waits; resolves once the claim committed (its row)
/// or was not made here (`None`). The batch runs in a task of its own: a claim that commits
/// after its caller stopped waiting pays `due` (see [`Owed`]).
pub(super) async fn claim(
    batcher: &std::sync::Arc<ClaimBatcher>,
    character_id: Uuid,
    floor: i64,
    handoff: Option<(i64, &str)>,
    due: Option<ClaimDue>,
) -> Result<Claimed, sqlx::Error> {
    batcher
        .submit(ClaimRequest {
            character_id,
            floor,
            handoff: handoff.map(|(epoch, token)| (epoch, token.to_owned())),
            due,
        })
        .await
}

impl BatchOp for ClaimOp {
    type Request = ClaimRequest;
    type Outcome = Result<Claimed, sqlx::Error>;

    fn fits(&self, batch: &[ClaimRequest], next: &ClaimRequest) -> bool {
        // One claim per character and statement.
        batch.len() < MOST_ROWS && batch.iter().all(|r| r.character_id != next.character_id)
    }

    async fn run(&self, batch: &[ClaimRequest]) -> Vec<Self::Outcome> {
        match self.claim_many(batch).await {
            Ok(mut claimed) => batch
                .iter()
                .map(|r| {
                    Ok(claimed.remove(&r.character_id).map(|(row, effects)| {
                        let owed = Owed {
                            due: r.due.clone(),
                            epoch: row.0,
                        };
                        (row, effects, owed)
                    }))
                })
                .collect(),
            // No connection (an outage, a full pool), a failed statement or a lost commit reply:
            // every claim fails at once. Whatever the transaction minted (only if a lost reply
            // hid its commit) is superseded by the retried claim, which mints the next epoch —
            // but the lost claim's take-over never happens, so the retried claim finds the
            // checkpoint fenced unread and loads the row: the crash window of a claim without
            // its take-over (the README's "What survives what").
            Err(err) => all_failed(err, batch.len()),
        }
    }

    fn lost(&self) -> Self::Outcome {
        Err(sqlx::Error::WorkerCrashed)
    }
}

impl ClaimOp {
    /// One transaction: the claims, then the effects of those claimed, then the commit.
    async fn claim_many(
        &self,
        batch: &[ClaimRequest],
    ) -> Result<HashMap<Uuid, (ClaimTuple, serde_json::Value)>, sqlx::Error> {
        let ids: Vec<Uuid> = batch.iter().map(|w| w.character_id).collect();
        let floors: Vec<i64> = batch.iter().map(|w| w.floor).collect();
        let dumped: Vec<Option<i64>> = batch
            .iter()
            .map(|w| w.handoff.as_ref().map(|(e, _)| *e))
            .collect();
        let tokens: Vec<Option<&str>> = batch
            .iter()
            .map(|w| w.handoff.as_ref().map(|(_, t)| t.as_str()))
            .collect();
        let mut tx = self.pg.begin().await?;
        let rows: Vec<ClaimTuple> = sqlx::query_as(CLAIM_MANY)
            .bind(&ids)
            .bind(&floors)
            .bind(&dumped)
            .bind(&tokens)
            .bind(
                self.schema_ceiling
                    .map(|v| i32::try_from(v).unwrap_or(i32::MAX)),
            )
            .bind(self.unqueued_only)
            .fetch_all(&mut *tx)
            .await?;
        if rows.is_empty() {
            // Nothing was changed: the transaction is rolled back as it is dropped, and a
            // failure to say so costs no claim its careful path.
            drop(tx);
            return Ok(HashMap::new());
        }
        let claimed: Vec<Uuid> = rows.iter().map(|r| r.1).collect();
        let mut effects = effects_since_dump(&mut *tx, &claimed).await?;
        tx.commit().await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let id = row.1;
                let effects = effects
                    .remove(&id)
                    .unwrap_or_else(|| serde_json::Value::Array(Vec::new()));
                (id, (row, effects))
            })
            .collect())
    }
}
