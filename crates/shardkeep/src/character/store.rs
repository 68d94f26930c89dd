//! The Postgres character store: create, claim (mint the next owner epoch), load, and the
//! compare-and-swap save, single and batched. Every fence sits in the statement that writes.

use uuid::Uuid;

use super::checkpoint_sqlite::SharedClock;
use super::claim_batch::{ClaimBatcher, ClaimTuple, claim_batcher, effects_since_dump};
use super::snapshot::{CharacterSnapshot, IssueMark, SaveOutcome, classify_save};
use super::store_sqlite as embedded;
use crate::backend::{PostgresBackend, SqliteBackend};
use crate::retry::apply::RecordedEffect;

/// Most characters one batched save accepts.
pub const MAX_SAVE_BATCH: usize = 1024;

/// A character store call failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Postgres failed or could not be reached.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    /// The name is already taken (names are unique without regard to case).
    #[error("the character name {0:?} is taken")]
    NameTaken(String),
    /// No character with this id.
    #[error("no character with id {0}")]
    NotFound(Uuid),
    /// The call's input was invalid; nothing was written.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The stored document, or the model of the copy that owns the character, is of a newer
    /// schema than this process's model: it is not loaded for play (and nothing was claimed).
    #[error(
        "character {character_id} is stored or owned at schema version {stored}, newer than \
         this process's model (version {supported}): deploy the newer game before loading it"
    )]
    SchemaNewer {
        /// The character.
        character_id: Uuid,
        /// The version stored.
        stored: u32,
        /// The newest version this process's model reads.
        supported: u32,
    },
}

/// A character to create.
#[derive(Debug, Clone, PartialEq)]
pub struct NewCharacter {
    /// Its id.
    pub character_id: Uuid,
    /// Owning account.
    pub account_id: Uuid,
    /// Display name.
    pub name: String,
    /// Initial zone anchor (`None`: the shard's home zone on first login).
    pub zone_ref: Option<String>,
    /// Initial room.
    pub room_ref: Option<String>,
    /// Initial state document.
    pub state: super::StateJson,
    /// Content-driven chargen input, applied on first spawn.
    pub chargen: Option<serde_json::Value>,
    /// The game's schema version of `state`.
    pub schema_version: u32,
}

/// The releasing side of an item transfer.
#[derive(Debug, Clone, Copy)]
pub enum Releaser<'a> {
    /// Still held by the acquirer's shard: its current snapshot (already without the item).
    /// When that copy holds the item after all, or was loaded holding it after the release
    /// (a crash rolled the release back), the released item is a phantom.
    Held {
        /// The releaser's current snapshot.
        snapshot: &'a CharacterSnapshot,
        /// The released item, when it has an identity.
        item_id: Option<Uuid>,
        /// The owner epoch of the copy that released it.
        released_epoch: i64,
    },
    /// Gone from the shard. If the row's owner descends from the copy that released the item
    /// (`released_epoch` within the current lineage: the same copy, or later copies it handed
    /// off to), the row loses the item when it holds it. Otherwise the transfer commits only
    /// when the row does not hold the item: an unrelated owner holding it means the released
    /// one may be a zombie's phantom.
    Departed {
        /// The releasing character.
        character_id: Uuid,
        /// The item.
        item_id: Uuid,
        /// The owner epoch of the copy that released it.
        released_epoch: i64,
    },
}

/// How a transfer commit ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferCommit {
    /// Both sides and the audit row landed together.
    Committed {
        /// The releaser's row version now (when it was written).
        releaser_version: Option<i64>,
        /// The acquirer's row version now.
        acquirer_version: i64,
    },
    /// Nothing was written; why.
    Rejected(String),
    /// Nothing was written: the releasing copy is no longer the owner, so the released item
    /// may be a zombie's phantom and must not enter another row.
    ReleaserSuperseded {
        /// The releaser row's epoch.
        current_epoch: i64,
    },
    /// This transfer (its audit row's key) committed before: an earlier attempt whose reply was
    /// lost. Nothing was written again.
    AlreadyCommitted,
    /// Nothing was written: a row moved since its snapshot was dumped (a retry job, a location
    /// write). The live copy adopts the current version, as for a flush conflict, and dumps
    /// again; an older snapshot must never overwrite what landed since.
    VersionRace {
        /// The releaser row's version, when its save raced.
        releaser_current: Option<i64>,
        /// The acquirer row's version, when its save raced.
        acquirer_current: Option<i64>,
    },
}

/// How a location write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocationWrite {
    /// Written.
    Written,
    /// A newer owner holds the character; nothing was written.
    Superseded {
        /// The row's epoch.
        current_epoch: i64,
    },
    /// The row already holds a newer location; nothing was written. `newer_cleanup`: a later
    /// session cleanup's (this cleanup is older than one already applied); otherwise a live
    /// write of a newer state than the writer knew (or this very cleanup's, written before).
    Stale {
        /// A newer session cleanup wrote the row's location.
        newer_cleanup: bool,
    },
    /// No such character.
    NotFound,
}

/// Where a session cleanup's location write stands in its character's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocationOrder {
    /// The epoch of the copy whose stream closed (also the ownership fence).
    pub owner_epoch: i64,
    /// When the stream closed.
    pub closed_at: chrono::DateTime<chrono::Utc>,
    /// The copy's row version when the stream closed (its last write it knew of landed); a row
    /// whose last live write is newer holds a newer location. `None`: not known.
    pub known_version: Option<i64>,
}

/// Result of a claim: the new epoch and the row as it was just before the claim.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedRow {
    /// The epoch minted for the claimant; it names exactly one live copy.
    pub new_epoch: i64,
    /// The row's version right after its last live write (retry jobs and location writes
    /// since then moved `state_version` only).
    pub live_version: i64,
    /// The row, with the owner epoch it had before this claim (what freshness compares).
    pub row: CharacterSnapshot,
    /// The issue mark of the content the row holds (its last live write, or a state job's).
    pub content_mark: IssueMark,
    /// The job effects applied to the row since its content was dumped (see the claim), by
    /// epoch and issue order.
    pub(crate) effects: Vec<RecordedEffect>,
}

/// The claim's effect list, `[[key, epoch, seq, row_version, payload], …]`, as effects. One that does
/// not decode is skipped with a log line (replay is best effort: the row itself holds it).
fn decode_effects(character_id: Uuid, effects: serde_json::Value) -> Vec<RecordedEffect> {
    let list: Vec<(String, i64, i64, i64, serde_json::Value)> = match serde_json::from_value(
        effects,
    ) {
        Ok(list) => list,
        Err(err) => {
            tracing::warn!(event = "job_effects_unreadable", character = %character_id, error = %err);
            return Vec::new();
        }
    };
    list.into_iter()
        .filter_map(|(key, epoch, seq, version, payload)| {
            crate::retry::effects::decode((character_id, key, epoch, seq, version, payload))
        })
        .map(|(_, effect)| effect)
        .collect()
}

/// Result of a handoff's claim.
#[derive(Debug, Clone, PartialEq)]
pub struct HandoffClaim {
    /// The claim: the new epoch and the row as it was just before.
    pub claimed: ClaimedRow,
    /// True when the carried content is adopted (its copy still owned the row); false when a
    /// newer owner had superseded that copy, so the destination must load a durable copy.
    pub adopted: bool,
}

/// Handle on the `characters` table, in Postgres or in the embedded store's file. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct CharacterStore {
    rows: Rows,
    /// The claimant's model version: the newest schema a claim accepts, recorded as the owner's
    /// schema. `None` (the default): no limit, and the owner's schema is left as it was.
    schema_ceiling: Option<u32>,
    /// The claimant's model, with which a claim first settles the character's pending retry
    /// jobs. `None` (the default): a claim leaves them to the workers (and supersedes them).
    model: Option<crate::model::ModelHandle>,
    /// How many times a job's lease may have run out for the claim still to apply it (the
    /// workers' limit).
    lease_expiry_limit: u32,
}

/// Where the rows are kept.
#[derive(Debug, Clone)]
enum Rows {
    Postgres {
        pg: PostgresBackend,
        /// Claims that need no settle, made together with those arriving at the same time.
        claims: std::sync::Arc<ClaimBatcher>,
        /// Item-load records, written together with those arriving at the same time.
        item_loads: std::sync::Arc<super::item_loads::ItemLoadBatcher>,
    },
    Embedded {
        db: SqliteBackend,
        clock: SharedClock,
        /// How stale an item-load entry's load time may be before a load writes it again.
        item_load_refresh: std::time::Duration,
    },
}

type RowTuple = (
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
    i32,
);

/// One row of the batched save's answer: id, locked version, epoch and schema, new version if
/// saved.
type BatchRow = (Uuid, Option<i64>, Option<i64>, Option<i32>, Option<i64>);

/// The single save's answer: new version if saved, else the locked version, epoch and schema.
type SaveRow = (Option<i64>, Option<i64>, Option<i64>, Option<i32>);

/// A character's name, trimmed, once it is 1 to 64 characters.
fn check_name(name: &str) -> Result<&str, StoreError> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > 64 {
        return Err(StoreError::InvalidInput(
            "a name is 1 to 64 characters".into(),
        ));
    }
    Ok(name)
}

/// A snapshot's schema version as stored.
pub(super) fn schema_of(snapshot: &CharacterSnapshot) -> i32 {
    i32::try_from(snapshot.schema_version).unwrap_or(i32::MAX)
}

/// A snapshot's issue mark as stored (a mark past `i64::MAX` is clamped; none is that large).
pub(super) fn mark_of(snapshot: &CharacterSnapshot) -> i64 {
    i64::try_from(snapshot.issue_mark).unwrap_or(i64::MAX)
}

fn snapshot_of(row: RowTuple) -> CharacterSnapshot {
    let (
        character_id,
        account_id,
        name,
        zone_ref,
        room_ref,
        state,
        chargen,
        state_version,
        owner_epoch,
        issue_mark,
        schema_version,
    ) = row;
    CharacterSnapshot {
        character_id,
        account_id,
        name,
        zone_ref,
        room_ref,
        state,
        chargen,
        state_version,
        owner_epoch,
        issue_mark: u64::try_from(issue_mark).unwrap_or(0),
        schema_version: u32::try_from(schema_version).unwrap_or(1),
    }
}

// The update runs first and holds its own row locks; only rows it did not update are then
// locked and read (`FOR UPDATE` waits out a concurrent writer and returns the newest version),
// so every outcome is decided exactly, in the same statement, without a separate racing read.
const SAVE_ONE: &str = "
WITH upd AS (
    UPDATE characters c
       SET state = $4,
           chargen = $5,
           zone_ref = COALESCE(NULLIF($6, ''), c.zone_ref),
           room_ref = CASE WHEN NULLIF($6, '') IS NULL THEN c.room_ref ELSE $7 END,
           state_version = c.state_version + 1,
           live_version = c.state_version + 1,
           live_issue_epoch = $3,
           live_issue_mark = $8,
           schema_version = $9,
           updated_at = now()
     WHERE c.id = $1 AND c.state_version = $2 AND c.owner_epoch <= $3 AND c.schema_version <= $9
 RETURNING c.state_version
), missed AS (
    SELECT state_version, owner_epoch, schema_version FROM characters
     WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM upd)
       FOR UPDATE
)
SELECT (SELECT state_version FROM upd), (SELECT state_version FROM missed),
       (SELECT owner_epoch FROM missed), (SELECT schema_version FROM missed)";

// Rows are locked first, in id order (the one global lock order of every statement that locks
// several characters), whatever order the batch lists them in: the update's one-time filter
// counts the `locked` CTE, which runs (locking every row, sorted) before the update scans
// anything, so it only ever touches rows it already holds, and two overlapping batches, or a
// batch and a transfer, never deadlock. (Joining the CTE instead lets a generic plan rescan it
// per row: quadratic.)
const SAVE_MANY: &str = "
WITH input AS (
    SELECT * FROM UNNEST($1::uuid[], $2::int8[], $3::int8[], $4::jsonb[], $5::jsonb[], $6::text[], $7::text[],
                         $8::int8[], $9::int4[])
        AS t(id, expected, epoch, state, chargen, zone_ref, room_ref, issue_mark, schema_version)
), locked AS (
    SELECT c.id FROM characters c WHERE c.id = ANY($1) ORDER BY c.id FOR UPDATE
), upd AS (
    UPDATE characters c
       SET state = i.state,
           chargen = i.chargen,
           zone_ref = COALESCE(NULLIF(i.zone_ref, ''), c.zone_ref),
           room_ref = CASE WHEN NULLIF(i.zone_ref, '') IS NULL THEN c.room_ref ELSE i.room_ref END,
           state_version = c.state_version + 1,
           live_version = c.state_version + 1,
           live_issue_epoch = i.epoch,
           live_issue_mark = i.issue_mark,
           schema_version = i.schema_version,
           updated_at = now()
      FROM input i
     WHERE c.id = i.id AND c.state_version = i.expected AND c.owner_epoch <= i.epoch
       AND c.schema_version <= i.schema_version
       AND (SELECT count(*) FROM locked) >= 0
 RETURNING c.id, c.state_version
), missed AS (
    SELECT c.id, c.state_version, c.owner_epoch, c.schema_version
      FROM characters c JOIN input i ON i.id = c.id
     WHERE NOT EXISTS (SELECT 1 FROM upd WHERE upd.id = i.id)
     ORDER BY c.id
       FOR UPDATE OF c
)
SELECT i.id, m.state_version, m.owner_epoch, m.schema_version, upd.state_version
  FROM input i
  LEFT JOIN upd ON upd.id = i.id
  LEFT JOIN missed m ON m.id = i.id";

// One statement mints the epoch and, for a handoff ($3: the epoch its snapshot was dumped under,
// $4: its token), decides under the row lock whether the carried content is adopted: only when
// the copy that dumped it still owns the row, or this very handoff's earlier claim (whose reply
// was lost) does. An adopted handoff continues the lineage; anything else starts a new one.
// (Claims that need no settle go through `claim_batch`'s statement of many characters instead.)
const CLAIM: &str = "
WITH prev AS (
    SELECT id, owner_epoch, handoff_claim FROM characters WHERE id = $1 FOR UPDATE
), decided AS (
    SELECT id, owner_epoch,
           COALESCE($3::int8 = owner_epoch OR $4::text = handoff_claim, false) AS adopt
      FROM prev
)
UPDATE characters c
   SET owner_epoch = GREATEST(d.owner_epoch, $2) + 1,
       lineage_epoch = CASE WHEN d.adopt THEN c.lineage_epoch
                            ELSE GREATEST(d.owner_epoch, $2) + 1 END,
       handoff_claim = CASE WHEN d.adopt THEN $4::text END,
       owner_schema_version = COALESCE($5::int4, c.owner_schema_version),
       updated_at = now()
  FROM decided d
 WHERE c.id = d.id
   AND ($5::int4 IS NULL OR GREATEST(c.schema_version, c.owner_schema_version) <= $5::int4)
RETURNING c.owner_epoch, c.id, c.account_id, c.name, c.zone_ref, c.room_ref, c.state, c.chargen,
          c.state_version, d.owner_epoch, c.live_version, d.adopt, c.live_issue_epoch,
          c.live_issue_mark, c.schema_version";

/// The claim's answer from the claim statement's row and the effects read after it.
fn claimed_from(character_id: Uuid, row: ClaimTuple, effects: serde_json::Value) -> HandoffClaim {
    let (
        new_epoch,
        id,
        account,
        name,
        zone,
        room,
        state,
        chargen,
        version,
        previous,
        live,
        adopted,
        mark_epoch,
        mark,
        schema,
    ) = row;
    let content_mark = IssueMark {
        epoch: mark_epoch,
        seq: u64::try_from(mark).unwrap_or(0),
    };
    let previous_mark = if mark_epoch == previous { mark } else { 0 };
    HandoffClaim {
        claimed: ClaimedRow {
            new_epoch,
            live_version: live,
            content_mark,
            effects: decode_effects(character_id, effects),
            row: snapshot_of((
                id,
                account,
                name,
                zone,
                room,
                state,
                chargen,
                version,
                previous,
                previous_mark,
                schema,
            )),
        },
        adopted,
    }
}

const SELECT_BY_ID: &str = "SELECT id, account_id, name, zone_ref, room_ref, state, chargen, \
    state_version, owner_epoch, CASE WHEN live_issue_epoch = owner_epoch THEN live_issue_mark \
    ELSE 0 END, schema_version FROM characters WHERE id = $1";

const SELECT_BY_NAME: &str = "SELECT id, account_id, name, zone_ref, room_ref, state, chargen, \
    state_version, owner_epoch, CASE WHEN live_issue_epoch = owner_epoch THEN live_issue_mark \
    ELSE 0 END, schema_version FROM characters WHERE lower(name) = lower(btrim($1))";

impl CharacterStore {
    /// A store over `pg`.
    pub fn new(pg: PostgresBackend) -> Self {
        Self::over(Rows::Postgres {
            claims: claim_batcher(pg.clone(), None, false),
            item_loads: super::item_loads::item_load_batcher(
                pg.clone(),
                super::BookkeepingRetention::default().item_load_refresh(),
            ),
            pg,
        })
    }

    /// A store over the embedded store's file, stamping its rows by the system clock. Every
    /// call answers as the Postgres store's does, except a claim for a model, which refuses a
    /// character with retry jobs queued rather than settle them (the embedded store has no
    /// retry jobs of its own yet).
    pub fn embedded(db: SqliteBackend) -> Self {
        Self::over(Rows::Embedded {
            db,
            clock: std::sync::Arc::new(crate::clock::SystemClock),
            item_load_refresh: super::BookkeepingRetention::default().item_load_refresh(),
        })
    }

    /// The same store stamping the embedded store's rows by `clock` (the Postgres store
    /// stamps by the database's own time).
    pub fn with_clock(mut self, clock: std::sync::Arc<dyn crate::clock::Clock>) -> Self {
        if let Rows::Embedded { clock: held, .. } = &mut self.rows {
            *held = clock;
        }
        self
    }

    /// The driver's name: `postgres` or `embedded`.
    pub fn driver(&self) -> &'static str {
        match self.rows {
            Rows::Postgres { .. } => "postgres",
            Rows::Embedded { .. } => "embedded",
        }
    }

    /// Rebuilds the claim batcher after the claim's settings changed.
    fn rebatch_claims(&mut self) {
        let (ceiling, settles) = (self.schema_ceiling, self.model.is_some());
        if let Rows::Postgres { pg, claims, .. } = &mut self.rows {
            *claims = claim_batcher(pg.clone(), ceiling, settles);
        }
    }

    fn over(rows: Rows) -> Self {
        Self {
            rows,
            schema_ceiling: None,
            model: None,
            lease_expiry_limit: crate::retry::worker::LEASE_EXPIRY_LIMIT,
        }
    }

    /// The same store, claiming for a process whose model is at `schema_version`: a claim is
    /// refused ([`StoreError::SchemaNewer`], decided in the claim's statement, nothing minted)
    /// when the row's document or the model of its current owner is newer, and otherwise
    /// records `schema_version` as the new owner's. The loader sets it from the game's model.
    pub fn with_schema_ceiling(mut self, schema_version: u32) -> Self {
        self.schema_ceiling = Some(schema_version);
        self.rebatch_claims();
        self
    }

    /// The same store, recording item loads for a ledger pruned after `retention`
    /// ([`super::BookkeepingRetention::item_loads`]): an entry's load time is refreshed once it
    /// is older than [`super::BookkeepingRetention::item_load_refresh`] of it.
    pub fn with_item_load_retention(mut self, retention: std::time::Duration) -> Self {
        let retention = super::BookkeepingRetention {
            item_loads: retention,
            ..super::BookkeepingRetention::default()
        };
        match &mut self.rows {
            Rows::Postgres { pg, item_loads, .. } => {
                *item_loads =
                    super::item_loads::item_load_batcher(pg.clone(), retention.item_load_refresh());
            }
            Rows::Embedded {
                item_load_refresh, ..
            } => *item_load_refresh = retention.item_load_refresh(),
        }
        self
    }

    /// The same store, with the workers' limit on how many times a job's lease may have run
    /// out for a claim still to apply it (a job past it crashed or hung the workers that took
    /// it, and is dead-lettered unapplied).
    pub fn with_lease_expiry_limit(mut self, limit: u32) -> Self {
        self.lease_expiry_limit = limit;
        self
    }

    /// The same store, claiming for a process that plays `model`: claims are bounded by its
    /// schema version (see [`Self::with_schema_ceiling`]), and each claim first settles, in its
    /// own transaction, the retry jobs still queued for the character, so the acknowledged writes
    /// of a copy that died before they applied land instead of being superseded by the claim.
    /// The loader and [`crate::Services`] build their store this way.
    pub fn for_model(self, model: crate::model::ModelHandle) -> Self {
        let mut store = self.with_schema_ceiling(model.schema_version());
        store.model = Some(model);
        store.rebatch_claims();
        store
    }

    /// Creates a character; its state starts at version 0 and epoch 0.
    pub async fn create(&self, new: &NewCharacter) -> Result<(), StoreError> {
        let pg = match &self.rows {
            Rows::Postgres { pg, .. } => pg,
            Rows::Embedded { db, clock, .. } => {
                check_name(&new.name)?;
                return embedded::create(db, clock.as_ref(), new).await;
            }
        };
        let mut conn = pg.session().await?;
        Self::create_in(&mut conn, new).await?;
        Ok(conn.finish().await?)
    }

    /// Creates a character on `conn` of the embedded store (inside the caller's write
    /// transaction), stamped `now` (microseconds).
    pub(crate) async fn create_embedded_on(
        conn: &mut sqlx::SqliteConnection,
        now: i64,
        new: &NewCharacter,
    ) -> Result<(), StoreError> {
        check_name(&new.name)?;
        embedded::create_on(conn, now, new).await
    }

    /// Creates a character on `conn` (inside the caller's transaction, when it has one).
    pub(crate) async fn create_in(
        conn: &mut sqlx::PgConnection,
        new: &NewCharacter,
    ) -> Result<(), StoreError> {
        let name = check_name(&new.name)?;
        let zone_ref = new.zone_ref.as_deref().filter(|z| !z.is_empty());
        sqlx::query(
            "INSERT INTO characters (id, account_id, name, zone_ref, room_ref, state, chargen,
                                     schema_version)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(new.character_id)
        .bind(new.account_id)
        .bind(name)
        .bind(zone_ref)
        .bind(zone_ref.and(new.room_ref.as_deref()))
        .bind(&new.state)
        .bind(&new.chargen)
        .bind(i32::try_from(new.schema_version.max(1)).unwrap_or(i32::MAX))
        .execute(conn)
        .await
        .map_err(|e| match &e {
            sqlx::Error::Database(db) if db.constraint() == Some("characters_name_ci") => {
                StoreError::NameTaken(name.to_owned())
            }
            _ => StoreError::Database(e),
        })?;
        Ok(())
    }

    /// Mints the next owner epoch for `character_id` — `max(row, floor) + 1`, in one statement —
    /// and returns it with the row as it stood before the claim. The new copy's content starts
    /// over from stored state (a login), so a new lineage begins.
    ///
    /// A claim that starts a playing copy goes through a store built with [`Self::for_model`]
    /// (as the loader's and [`crate::Services`]' are): only such a claim records the owner's
    /// schema and first settles the character's queued retry jobs. On a plain store, jobs the
    /// previous owner left queued are superseded by the claim.
    pub async fn claim(&self, character_id: Uuid, floor: i64) -> Result<ClaimedRow, StoreError> {
        Ok(self.claim_with(character_id, floor, None).await?.claimed)
    }

    /// The claim of a handoff (`handoff_token`) whose snapshot was dumped by the copy at
    /// `dumped_under_epoch`. The carried content is adopted, and the lineage continues, only
    /// when that copy is still the row's owner (or this handoff's own earlier claim is, when its
    /// reply was lost); otherwise the claim still mints the destination's epoch, a new lineage
    /// begins, and the answer says the carried content must not be used.
    pub async fn claim_for_handoff(
        &self,
        character_id: Uuid,
        floor: i64,
        dumped_under_epoch: i64,
        handoff_token: &str,
    ) -> Result<HandoffClaim, StoreError> {
        if handoff_token.is_empty() {
            return Err(StoreError::InvalidInput(
                "a handoff claim needs its token".into(),
            ));
        }
        self.claim_with(
            character_id,
            floor,
            Some((dumped_under_epoch, handoff_token)),
        )
        .await
    }

    /// [`Self::claim_for_handoff`], with what a claim made in a batch owes if its caller goes
    /// before paying it (see [`Self::claim_batched`]): `None` for a claim made the careful way.
    pub(crate) async fn claim_for_handoff_owing(
        &self,
        character_id: Uuid,
        floor: i64,
        dumped_under_epoch: i64,
        handoff_token: &str,
        due: Option<super::claim_batch::ClaimDue>,
        bound: Option<std::time::Duration>,
    ) -> Result<(HandoffClaim, Option<super::claim_batch::Owed>), StoreError> {
        if handoff_token.is_empty() {
            return Err(StoreError::InvalidInput(
                "a handoff claim needs its token".into(),
            ));
        }
        self.claim_owing(
            character_id,
            floor,
            Some((dumped_under_epoch, handoff_token)),
            due,
            bound,
        )
        .await
    }

    /// The newest schema the row's document or owner is at, and whether retry jobs are queued
    /// for the character, read without a lock; `None` when there is no row.
    async fn schema_and_backlog(
        conn: &mut sqlx::PgConnection,
        character_id: Uuid,
    ) -> Result<Option<(u32, bool)>, sqlx::Error> {
        let found: Option<(i32, bool)> = sqlx::query_as(
            "SELECT GREATEST(schema_version, owner_schema_version),
                    EXISTS (SELECT 1 FROM persistence_retry_jobs WHERE character_id = $1)
               FROM characters WHERE id = $1",
        )
        .bind(character_id)
        .fetch_optional(&mut *conn)
        .await?;
        Ok(found.map(|(schema, queued)| (u32::try_from(schema).unwrap_or(u32::MAX), queued)))
    }

    /// Why a claim of a row stored or owned at `stored` is refused: `None` when not (missing
    /// rows are told apart by the caller).
    fn schema_refusal(&self, character_id: Uuid, stored: u32) -> Option<StoreError> {
        let supported = self.schema_ceiling?;
        (stored > supported).then_some(StoreError::SchemaNewer {
            character_id,
            stored,
            supported,
        })
    }

    async fn claim_with(
        &self,
        character_id: Uuid,
        floor: i64,
        handoff: Option<(i64, &str)>,
    ) -> Result<HandoffClaim, StoreError> {
        // Owing nothing (no due): its debt is dropped unpaid.
        Ok(self
            .claim_owing(character_id, floor, handoff, None, None)
            .await?
            .0)
    }

    /// The claim, batched when it can be ([`Self::claim_batched`], with the debt it answers) and
    /// made the careful way otherwise (no debt: it runs in the caller's task, bounded in
    /// Postgres by `bound` when given; see [`Self::claim_careful`]).
    async fn claim_owing(
        &self,
        character_id: Uuid,
        floor: i64,
        handoff: Option<(i64, &str)>,
        due: Option<super::claim_batch::ClaimDue>,
        bound: Option<std::time::Duration>,
    ) -> Result<(HandoffClaim, Option<super::claim_batch::Owed>), StoreError> {
        if let Some((claimed, owed)) = self
            .claim_batched(character_id, floor, handoff, due)
            .await?
        {
            return Ok((claimed, Some(owed)));
        }
        let claimed = self
            .claim_careful(character_id, floor, handoff, bound)
            .await?;
        Ok((claimed, None))
    }

    /// The claim made together with those arriving at the same time, in a task of the batch's
    /// own (a caller that stops waiting cannot interrupt it: a claim committed after its caller
    /// has gone pays `due` with the epoch it minted). Most claims find no job queued and no lock
    /// on the row: they are made in one transaction of many characters that also reads the
    /// effects since each content's dump. `None`: not claimed here — a job queued (the
    /// statement's snapshot sees it, so a job a worker is settling right now counts), its row
    /// locked, a refusal, no row at all, or the embedded store — and the claim must go the
    /// careful way ([`Self::claim_careful`]). The answer's [`Owed`] is paid on drop unless
    /// settled.
    pub(crate) async fn claim_batched(
        &self,
        character_id: Uuid,
        floor: i64,
        handoff: Option<(i64, &str)>,
        due: Option<super::claim_batch::ClaimDue>,
    ) -> Result<Option<(HandoffClaim, super::claim_batch::Owed)>, StoreError> {
        if floor < 0 {
            return Err(StoreError::InvalidInput(format!(
                "epoch floor {floor} is negative"
            )));
        }
        let Rows::Postgres { claims, .. } = &self.rows else {
            return Ok(None);
        };
        Ok(
            super::claim_batch::claim(claims, character_id, floor, handoff, due)
                .await?
                .map(|(row, effects, owed)| (claimed_from(character_id, row, effects), owed)),
        )
    }

    /// The claim made alone: it settles the character's queued jobs first and waits for a lock
    /// held on its row; on the embedded store, every claim. Runs in the caller's task.
    ///
    /// With a `bound`, Postgres itself ends a statement of the claim that runs longer and a
    /// transaction left idle longer (rolled back: no epoch minted), so its caller need not
    /// drop it at a deadline of its own. A claim dropped while its commit is on its way may
    /// still commit, minting an epoch whose copy never takes the checkpoint over.
    pub(crate) async fn claim_careful(
        &self,
        character_id: Uuid,
        floor: i64,
        handoff: Option<(i64, &str)>,
        bound: Option<std::time::Duration>,
    ) -> Result<HandoffClaim, StoreError> {
        if floor < 0 {
            return Err(StoreError::InvalidInput(format!(
                "epoch floor {floor} is negative"
            )));
        }
        let pg = match &self.rows {
            Rows::Postgres { pg, .. } => pg,
            Rows::Embedded { db, clock, .. } => {
                let settles = self.model.as_ref().map(|m| (m, self.lease_expiry_limit));
                let claimed = embedded::claim(
                    db,
                    clock.as_ref(),
                    (character_id, floor, handoff),
                    self.schema_ceiling,
                    settles,
                )
                .await?;
                let (row, effects, settled) = claimed.ok_or(StoreError::NotFound(character_id))?;
                settled.report(character_id);
                return Ok(claimed_from(character_id, row, effects));
            }
        };
        let mut tx = match bound {
            Some(bound) => pg.begin_bounded(bound).await?,
            None => pg.begin().await?,
        };
        let mut settled = crate::retry::SettledAtClaim::default();
        if let Some(model) = &self.model {
            // A claim the schema refuses settles nothing, and a character with no queued job
            // needs no settle: both read first, in one plain read (the claim statement checks
            // the schema again under the lock).
            let (stored, queued) = Self::schema_and_backlog(&mut tx, character_id)
                .await?
                .ok_or(StoreError::NotFound(character_id))?;
            if let Some(refused) = self.schema_refusal(character_id, stored) {
                return Err(refused);
            }
            if queued {
                settled = crate::retry::settle_before_claim(
                    &mut crate::retry::job_tx::JobTx::Postgres(&mut tx),
                    model,
                    character_id,
                    self.lease_expiry_limit,
                    chrono::Utc::now(),
                )
                .await?;
            }
        }
        let row = Self::claim_statement(
            &mut *tx,
            (character_id, floor, handoff),
            self.schema_ceiling,
        )
        .await?;
        let Some(row) = row else {
            // Missing, or refused for its schema (the row is locked by the claim's first step).
            let stored = Self::schema_and_backlog(&mut tx, character_id).await?;
            tx.rollback().await?;
            return Err(match stored {
                Some((stored, _)) => {
                    self.schema_refusal(character_id, stored)
                        .unwrap_or(StoreError::SchemaNewer {
                            character_id,
                            stored,
                            supported: self.schema_ceiling.unwrap_or(u32::MAX),
                        })
                }
                None => StoreError::NotFound(character_id),
            });
        };
        let effects = effects_since_dump(&mut *tx, &[character_id])
            .await?
            .remove(&character_id)
            .unwrap_or_else(|| serde_json::Value::Array(Vec::new()));
        tx.commit().await?;
        settled.report(character_id);
        Ok(claimed_from(character_id, row, effects))
    }

    /// The one-character claim statement on `conn`. `None` when nothing was claimed (no row, or
    /// refused for its schema).
    async fn claim_statement<'c, E>(
        conn: E,
        (character_id, floor, handoff): (Uuid, i64, Option<(i64, &str)>),
        schema_ceiling: Option<u32>,
    ) -> Result<Option<ClaimTuple>, sqlx::Error>
    where
        E: sqlx::PgExecutor<'c>,
    {
        sqlx::query_as(CLAIM)
            .bind(character_id)
            .bind(floor)
            .bind(handoff.map(|(epoch, _)| epoch))
            .bind(handoff.map(|(_, token)| token))
            .bind(schema_ceiling.map(|v| i32::try_from(v).unwrap_or(i32::MAX)))
            .fetch_optional(conn)
            .await
    }

    /// The row of `character_id`, if it exists.
    pub async fn load(&self, character_id: Uuid) -> Result<Option<CharacterSnapshot>, StoreError> {
        let pg = match &self.rows {
            Rows::Postgres { pg, .. } => pg,
            Rows::Embedded { db, .. } => return embedded::load(db, character_id).await,
        };
        let row: Option<RowTuple> = sqlx::query_as(SELECT_BY_ID)
            .bind(character_id)
            .fetch_optional(pg.exec())
            .await?;
        Ok(row.map(snapshot_of))
    }

    /// The job effects recorded for `character_id` at a row version past `after`, oldest
    /// first: what landed under a live copy that last learned version `after`.
    pub(crate) async fn effects_applied_since(
        &self,
        character_id: Uuid,
        after: i64,
    ) -> Result<Vec<RecordedEffect>, StoreError> {
        match &self.rows {
            Rows::Postgres { pg, .. } => {
                super::effects_since::on_postgres(pg, character_id, after).await
            }
            Rows::Embedded { db, .. } => {
                super::effects_since::on_sqlite(db, character_id, after).await
            }
        }
    }

    /// The items transfer commits took from `character_id` and that have not come back (the
    /// item-release ledger).
    pub(crate) async fn released_items(&self, character_id: Uuid) -> Result<Vec<Uuid>, StoreError> {
        Ok(match &self.rows {
            Rows::Postgres { pg, .. } => {
                sqlx::query_scalar("SELECT item_id FROM item_releases WHERE character_id = $1")
                    .bind(character_id)
                    .fetch_all(pg.exec())
                    .await?
            }
            Rows::Embedded { db, .. } => {
                sqlx::query_scalar("SELECT item_id FROM item_releases WHERE character_id = ?1")
                    .bind(character_id)
                    .fetch_all(db.reader()?)
                    .await?
            }
        })
    }

    /// The row of the character named `name` (any case), if it exists.
    pub async fn load_by_name(&self, name: &str) -> Result<Option<CharacterSnapshot>, StoreError> {
        let pg = match &self.rows {
            Rows::Postgres { pg, .. } => pg,
            Rows::Embedded { db, .. } => return embedded::load_by_name(db, name).await,
        };
        let row: Option<RowTuple> = sqlx::query_as(SELECT_BY_NAME)
            .bind(name)
            .fetch_optional(pg.exec())
            .await?;
        Ok(row.map(snapshot_of))
    }

    /// Compare-and-swap save of one snapshot, decided in one round trip.
    pub async fn save(&self, snapshot: &CharacterSnapshot) -> Result<SaveOutcome, StoreError> {
        let pg = match &self.rows {
            Rows::Postgres { pg, .. } => pg,
            Rows::Embedded { db, clock, .. } => {
                let mut saved = embedded::save_many(db, clock.as_ref(), &[snapshot]).await?;
                return Ok(saved
                    .pop()
                    .map_or(SaveOutcome::NotFound, |(_, outcome)| outcome));
            }
        };
        let mut conn = pg.session().await?;
        let outcome = Self::save_in(&mut conn, snapshot).await?;
        conn.finish().await?;
        Ok(outcome)
    }

    /// The compare-and-swap save on `conn` (inside the caller's transaction, when it has one).
    pub(super) async fn save_in(
        conn: &mut sqlx::PgConnection,
        snapshot: &CharacterSnapshot,
    ) -> Result<SaveOutcome, StoreError> {
        let zone_ref = snapshot.zone_ref.as_deref().filter(|z| !z.is_empty());
        let (saved, version, epoch, schema): SaveRow = sqlx::query_as(SAVE_ONE)
            .bind(snapshot.character_id)
            .bind(snapshot.state_version)
            .bind(snapshot.owner_epoch)
            .bind(&snapshot.state)
            .bind(&snapshot.chargen)
            .bind(zone_ref)
            .bind(zone_ref.and(snapshot.room_ref.as_deref()))
            .bind(mark_of(snapshot))
            .bind(schema_of(snapshot))
            .fetch_one(conn)
            .await?;
        Ok(classify_save(
            version.zip(epoch).zip(schema).map(|((v, e), s)| (v, e, s)),
            saved,
            (snapshot.owner_epoch, schema_of(snapshot)),
        ))
    }

    /// Compare-and-swap save of many snapshots in one statement, one outcome per snapshot (in
    /// input order). Ids must be distinct; at most [`MAX_SAVE_BATCH`].
    pub async fn save_many(
        &self,
        snapshots: &[&CharacterSnapshot],
    ) -> Result<Vec<(Uuid, SaveOutcome)>, StoreError> {
        if snapshots.is_empty() {
            return Ok(Vec::new());
        }
        if snapshots.len() > MAX_SAVE_BATCH {
            return Err(StoreError::InvalidInput(format!(
                "a batch holds at most {MAX_SAVE_BATCH} snapshots, got {}",
                snapshots.len()
            )));
        }
        let mut ids = Vec::with_capacity(snapshots.len());
        let mut seen = std::collections::HashSet::with_capacity(snapshots.len());
        for s in snapshots {
            if !seen.insert(s.character_id) {
                return Err(StoreError::InvalidInput(format!(
                    "character {} appears twice in one batch",
                    s.character_id
                )));
            }
            ids.push(s.character_id);
        }
        let pg = match &self.rows {
            Rows::Postgres { pg, .. } => pg,
            Rows::Embedded { db, clock, .. } => {
                return embedded::save_many(db, clock.as_ref(), snapshots).await;
            }
        };
        let expected: Vec<i64> = snapshots.iter().map(|s| s.state_version).collect();
        let epochs: Vec<i64> = snapshots.iter().map(|s| s.owner_epoch).collect();
        let states: Vec<&super::StateJson> = snapshots.iter().map(|s| &s.state).collect();
        let chargens: Vec<Option<&serde_json::Value>> =
            snapshots.iter().map(|s| s.chargen.as_ref()).collect();
        let zones: Vec<Option<&str>> = snapshots
            .iter()
            .map(|s| s.zone_ref.as_deref().filter(|z| !z.is_empty()))
            .collect();
        let rooms: Vec<Option<&str>> = snapshots
            .iter()
            .zip(&zones)
            .map(|(s, z)| z.and(s.room_ref.as_deref()))
            .collect();
        let marks: Vec<i64> = snapshots.iter().map(|s| mark_of(s)).collect();
        let schemas: Vec<i32> = snapshots.iter().map(|s| schema_of(s)).collect();
        let rows: Vec<BatchRow> = sqlx::query_as(SAVE_MANY)
            .bind(&ids)
            .bind(&expected)
            .bind(&epochs)
            .bind(&states)
            .bind(&chargens)
            .bind(&zones)
            .bind(&rooms)
            .bind(&marks)
            .bind(&schemas)
            .fetch_all(pg.exec())
            .await?;
        let by_id: std::collections::HashMap<Uuid, SaveOutcome> = rows
            .into_iter()
            .map(|(id, version, epoch, schema, saved)| {
                let current = version.zip(epoch).zip(schema).map(|((v, e), s)| (v, e, s));
                let writer = snapshots
                    .iter()
                    .find(|s| s.character_id == id)
                    .map_or((i64::MAX, i32::MAX), |s| (s.owner_epoch, schema_of(s)));
                (id, classify_save(current, saved, writer))
            })
            .collect();
        Ok(ids
            .into_iter()
            .map(|id| (id, by_id.get(&id).copied().unwrap_or(SaveOutcome::NotFound)))
            .collect())
    }

    /// Writes a location (zone, room) for `character_id`, fenced by `owner_epoch`; the version
    /// moves on so a live copy's next flush re-dumps over it.
    pub async fn write_location(
        &self,
        character_id: Uuid,
        owner_epoch: i64,
        zone: &str,
        room: &str,
    ) -> Result<LocationWrite, StoreError> {
        self.write_location_inner(character_id, owner_epoch, None, zone, room)
            .await
    }

    /// A session cleanup's location write: fenced by the epoch like any write, and applied only
    /// when newer than what the row holds, decided in the one statement that writes: newer than
    /// the last cleanup location written (by `(epoch, closed_at)`), and no live write of a newer
    /// state than the copy knew at close. An older one answers [`LocationWrite::Stale`].
    pub async fn write_location_ordered(
        &self,
        character_id: Uuid,
        order: LocationOrder,
        zone: &str,
        room: &str,
    ) -> Result<LocationWrite, StoreError> {
        self.write_location_inner(character_id, order.owner_epoch, Some(order), zone, room)
            .await
    }

    async fn write_location_inner(
        &self,
        character_id: Uuid,
        owner_epoch: i64,
        order: Option<LocationOrder>,
        zone: &str,
        room: &str,
    ) -> Result<LocationWrite, StoreError> {
        if zone.is_empty() {
            return Err(StoreError::InvalidInput("zone must not be empty".into()));
        }
        let pg = match &self.rows {
            Rows::Postgres { pg, .. } => pg,
            Rows::Embedded { db, clock, .. } => {
                return embedded::write_location(
                    db,
                    clock.as_ref(),
                    (character_id, owner_epoch),
                    order,
                    zone,
                    room,
                )
                .await;
            }
        };
        let (written, current_epoch, newer_cleanup): (i64, Option<i64>, Option<bool>) = sqlx::query_as(
            "WITH upd AS (
                 UPDATE characters SET zone_ref = $3, room_ref = $4, state_version = state_version + 1,
                        journal_location_epoch = COALESCE($5, journal_location_epoch),
                        journal_location_at = COALESCE($6, journal_location_at),
                        updated_at = now()
                  WHERE id = $1 AND owner_epoch <= $2
                    AND ($6::timestamptz IS NULL OR journal_location_epoch IS NULL
                         OR (journal_location_epoch, journal_location_at) < ($5::int8, $6::timestamptz))
                    AND ($7::int8 IS NULL OR live_version <= $7)
              RETURNING 1
             )
             SELECT (SELECT count(*) FROM upd),
                    (SELECT owner_epoch FROM characters WHERE id = $1),
                    (SELECT (journal_location_epoch, journal_location_at) > ($5::int8, $6::timestamptz)
                       FROM characters WHERE id = $1)",
        )
        .bind(character_id)
        .bind(owner_epoch)
        .bind(zone)
        .bind(room)
        .bind(order.map(|o| o.owner_epoch))
        .bind(order.map(|o| o.closed_at))
        .bind(order.and_then(|o| o.known_version))
        .fetch_one(pg.exec())
        .await?;
        Ok(match (written, current_epoch) {
            (1, _) => LocationWrite::Written,
            (_, None) => LocationWrite::NotFound,
            (_, Some(epoch)) if epoch > owner_epoch => LocationWrite::Superseded {
                current_epoch: epoch,
            },
            (_, Some(_)) => LocationWrite::Stale {
                newer_cleanup: newer_cleanup.unwrap_or(false),
            },
        })
    }

    /// Opens the transaction of an item-transfer commit on the store's driver.
    pub(super) async fn transfer_tx(&self) -> Result<super::transfer_tx::TransferTx, StoreError> {
        match &self.rows {
            Rows::Postgres { pg, .. } => {
                Ok(super::transfer_tx::TransferTx::Postgres(pg.begin().await?))
            }
            Rows::Embedded { db, clock, .. } => {
                super::transfer_tx::embedded(db, clock.as_ref()).await
            }
        }
    }

    /// Writes item-load records (distinct items): on Postgres with the records of other loads
    /// arriving at the same time, in the embedded store in a transaction of their own.
    pub(super) async fn record_item_loads_of(
        &self,
        copy: (Uuid, i64),
        items: Vec<Uuid>,
    ) -> Result<(), StoreError> {
        match &self.rows {
            Rows::Postgres { item_loads, .. } => {
                Ok(item_loads.submit((copy.0, copy.1, items)).await?)
            }
            Rows::Embedded {
                db,
                clock,
                item_load_refresh,
            } => {
                embedded::record_item_loads(db, clock.as_ref(), copy, &items, *item_load_refresh)
                    .await
            }
        }
    }

    /// The row's current `(state_version, owner_epoch)`.
    pub async fn version_of(&self, character_id: Uuid) -> Result<Option<(i64, i64)>, StoreError> {
        let pg = match &self.rows {
            Rows::Postgres { pg, .. } => pg,
            Rows::Embedded { db, .. } => return embedded::version_of(db, character_id).await,
        };
        Ok(
            sqlx::query_as("SELECT state_version, owner_epoch FROM characters WHERE id = $1")
                .bind(character_id)
                .fetch_optional(pg.exec())
                .await?,
        )
    }
}
