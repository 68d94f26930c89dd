//! The transaction of one item-transfer commit, on the store's driver: each step the commit
//! takes (in `item_moves`) as one call here, so the commit's decisions are made once for
//! Postgres and the embedded store alike.

use sqlx::Postgres;
use uuid::Uuid;

use super::checkpoint_sqlite::micros;
use super::snapshot::{CharacterSnapshot, SaveOutcome};
use super::store::{CharacterStore, StoreError};
use super::store_sqlite;
use crate::audit::AuditEvent;
use crate::backend::sqlite::WriteTransaction;

/// What a departed releaser's row holds for the commit to judge: its document, owner epoch,
/// lineage epoch, document schema and owner's schema.
pub(super) type DepartedRowFacts = (serde_json::Value, i64, i64, i32, i32);

/// One transfer commit's transaction.
pub(super) enum TransferTx {
    /// A Postgres transaction; rows are locked explicitly, in id order.
    Postgres(sqlx::Transaction<'static, Postgres>),
    /// The embedded store's write transaction (the file's write lock is held throughout), and
    /// the instant its writes are stamped with.
    Embedded {
        /// The transaction.
        tx: WriteTransaction,
        /// Microseconds since the epoch.
        now: i64,
    },
}

impl TransferTx {
    /// Locks both characters' rows (Postgres: in id order, the global lock order), then says
    /// whether this transfer's audit row is already there (an earlier attempt committed).
    pub(super) async fn lock_and_find(
        &mut self,
        characters: [Uuid; 2],
        audit: &AuditEvent,
    ) -> Result<bool, StoreError> {
        let found: Option<i64> = match self {
            Self::Postgres(tx) => {
                sqlx::query("SELECT id FROM characters WHERE id = ANY($1) ORDER BY id FOR UPDATE")
                    .bind(characters)
                    .fetch_all(&mut **tx)
                    .await?;
                sqlx::query_scalar(
                    "SELECT seq FROM character_audit
                      WHERE subject_id = $1 AND event_kind = $2 AND dedup_key = $3",
                )
                .bind(audit.subject_id)
                .bind(audit.kind.as_str())
                .bind(&audit.dedup_key)
                .fetch_optional(&mut **tx)
                .await?
            }
            Self::Embedded { tx, .. } => {
                sqlx::query_scalar(
                    "SELECT seq FROM character_audit
                      WHERE subject_id = ?1 AND event_kind = ?2 AND dedup_key = ?3",
                )
                .bind(audit.subject_id)
                .bind(audit.kind.as_str())
                .bind(&audit.dedup_key)
                .fetch_optional(&mut **tx)
                .await?
            }
        };
        Ok(found.is_some())
    }

    /// The fenced compare-and-swap save of `snapshot`.
    pub(super) async fn save(
        &mut self,
        snapshot: &CharacterSnapshot,
    ) -> Result<SaveOutcome, StoreError> {
        match self {
            Self::Postgres(tx) => CharacterStore::save_in(tx, snapshot).await,
            Self::Embedded { tx, now } => store_sqlite::save_on(tx, *now, snapshot).await,
        }
    }

    /// Whether a copy of `character_id` later than `released_epoch` started out holding
    /// `item_id` (the item-load ledger).
    pub(super) async fn loaded_after(
        &mut self,
        character_id: Uuid,
        item_id: Uuid,
        released_epoch: i64,
    ) -> Result<bool, StoreError> {
        // The same statement on both drivers but for its parameter marks.
        Ok(match self {
            Self::Postgres(tx) => {
                sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM item_loads
                                     WHERE item_id = $1 AND character_id = $2 AND loaded_epoch > $3)",
                )
                .bind(item_id)
                .bind(character_id)
                .bind(released_epoch)
                .fetch_one(&mut **tx)
                .await?
            }
            Self::Embedded { tx, .. } => {
                sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM item_loads
                                     WHERE item_id = ?1 AND character_id = ?2 AND loaded_epoch > ?3)",
                )
                .bind(item_id)
                .bind(character_id)
                .bind(released_epoch)
                .fetch_one(&mut **tx)
                .await?
            }
        })
    }

    /// The departed releaser's row, locked; `None` when there is none. A document the embedded
    /// file holds that is not JSON fails the commit (the file was changed by something else).
    pub(super) async fn departed_row(
        &mut self,
        character_id: Uuid,
    ) -> Result<Option<DepartedRowFacts>, StoreError> {
        match self {
            Self::Postgres(tx) => Ok(sqlx::query_as(
                "SELECT state, owner_epoch, lineage_epoch, schema_version, owner_schema_version
                   FROM characters WHERE id = $1 FOR UPDATE",
            )
            .bind(character_id)
            .fetch_optional(&mut **tx)
            .await?),
            Self::Embedded { tx, .. } => {
                let row: Option<(String, i64, i64, i32, i32)> = sqlx::query_as(
                    "SELECT state, owner_epoch, lineage_epoch, schema_version, owner_schema_version
                       FROM characters WHERE id = ?1",
                )
                .bind(character_id)
                .fetch_optional(&mut **tx)
                .await?;
                row.map(|(state, epoch, lineage, schema, owner_schema)| {
                    let state = serde_json::from_str(&state)
                        .map_err(|e| store_sqlite::corrupt(character_id, "state", &e))?;
                    Ok((state, epoch, lineage, schema, owner_schema))
                })
                .transpose()
            }
        }
    }

    /// Writes the departed releaser's row: `state` (with the model's schema) when given, else
    /// only the version moved on; `live_version` follows when the departed copy still owns the
    /// row. Returns the row's version after.
    pub(super) async fn write_departed(
        &mut self,
        character_id: Uuid,
        state: Option<(&serde_json::Value, u32)>,
        departed_owns: bool,
    ) -> Result<i64, StoreError> {
        let schema = state.map(|(_, schema)| i32::try_from(schema).unwrap_or(i32::MAX));
        Ok(match self {
            Self::Postgres(tx) => {
                sqlx::query_scalar(
                    "UPDATE characters SET state = COALESCE($2, state),
                            schema_version = COALESCE($3, schema_version),
                            state_version = state_version + 1,
                            live_version = CASE WHEN $4 THEN state_version + 1 ELSE live_version END,
                            updated_at = now()
                      WHERE id = $1 RETURNING state_version",
                )
                .bind(character_id)
                .bind(state.map(|(state, _)| state))
                .bind(schema)
                .bind(departed_owns)
                .fetch_one(&mut **tx)
                .await?
            }
            Self::Embedded { tx, now } => {
                sqlx::query_scalar(
                    "UPDATE characters SET state = COALESCE(?2, state),
                            schema_version = COALESCE(?3, schema_version),
                            state_version = state_version + 1,
                            live_version = CASE WHEN ?4 THEN state_version + 1 ELSE live_version END,
                            updated_at = ?5
                      WHERE id = ?1 RETURNING state_version",
                )
                .bind(character_id)
                .bind(state.map(|(state, _)| state.to_string()))
                .bind(schema)
                .bind(departed_owns)
                .bind(*now)
                .fetch_one(&mut **tx)
                .await?
            }
        })
    }

    /// Records in the item-release ledger that `item_id` left `releaser` (at the releasing
    /// copy's epoch) for `acquirer`; the acquirer's own entry for it goes (an item moving back
    /// to a character it once left is that character's again).
    pub(super) async fn record_release(
        &mut self,
        (releaser, acquirer): (Uuid, Uuid),
        item_id: Uuid,
        released_epoch: i64,
    ) -> Result<(), StoreError> {
        match self {
            Self::Postgres(tx) => {
                sqlx::query(
                    "INSERT INTO item_releases (character_id, item_id, released_epoch)
                     VALUES ($1, $2, $3)
                     ON CONFLICT (character_id, item_id) DO UPDATE
                        SET released_epoch = GREATEST(item_releases.released_epoch,
                                                      EXCLUDED.released_epoch),
                            released_at = now()",
                )
                .bind(releaser)
                .bind(item_id)
                .bind(released_epoch)
                .execute(&mut **tx)
                .await?;
                sqlx::query("DELETE FROM item_releases WHERE character_id = $1 AND item_id = $2")
                    .bind(acquirer)
                    .bind(item_id)
                    .execute(&mut **tx)
                    .await?;
            }
            Self::Embedded { tx, now } => {
                sqlx::query(
                    "INSERT INTO item_releases (character_id, item_id, released_epoch, released_at)
                     VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (character_id, item_id) DO UPDATE
                        SET released_epoch = max(item_releases.released_epoch,
                                                 excluded.released_epoch),
                            released_at = excluded.released_at",
                )
                .bind(releaser)
                .bind(item_id)
                .bind(released_epoch)
                .bind(*now)
                .execute(&mut **tx)
                .await?;
                sqlx::query("DELETE FROM item_releases WHERE character_id = ?1 AND item_id = ?2")
                    .bind(acquirer)
                    .bind(item_id)
                    .execute(&mut **tx)
                    .await?;
            }
        }
        Ok(())
    }

    /// Inserts the transfer's audit row.
    pub(super) async fn insert_audit(&mut self, audit: &AuditEvent) -> Result<(), StoreError> {
        let events = std::slice::from_ref(audit);
        match self {
            Self::Postgres(tx) => crate::audit::store::insert_many(tx, events).await?,
            Self::Embedded { tx, now } => {
                crate::audit::store_sqlite::insert_on(tx, events, *now).await?
            }
        };
        Ok(())
    }

    /// Commits everything the commit wrote.
    pub(super) async fn commit(self) -> Result<(), StoreError> {
        match self {
            Self::Postgres(tx) => tx.commit().await?,
            Self::Embedded { tx, .. } => tx.commit().await?,
        }
        Ok(())
    }
}

/// Opens the transaction of a transfer commit on the embedded store's file, stamped by `clock`
/// once the write lock is held.
pub(super) async fn embedded(
    db: &crate::backend::SqliteBackend,
    clock: &dyn crate::clock::Clock,
) -> Result<TransferTx, StoreError> {
    let tx = db.begin().await?;
    Ok(TransferTx::Embedded {
        tx,
        now: micros(clock),
    })
}
