//! Account-side changes whose audit rows are written in the same transaction as the change, so
//! a change is never applied but unrecorded: creating accounts and characters, changing a tier.

use uuid::Uuid;

use super::event::{AuditEvent, SubjectType};
use super::store::insert_many;
use crate::backend::{PostgresBackend, SqliteBackend};
use crate::character::{CharacterStore, NewCharacter, StoreError};

/// An account's tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// A player.
    Player,
    /// A moderator (staff).
    Moderator,
    /// An administrator (staff).
    Admin,
}

impl Tier {
    /// Stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Player => "player",
            Self::Moderator => "moderator",
            Self::Admin => "admin",
        }
    }

    /// Parses a stored name.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Player, Self::Moderator, Self::Admin]
            .into_iter()
            .find(|t| t.as_str() == name)
    }

    /// True for staff tiers.
    pub fn is_staff(self) -> bool {
        !matches!(self, Self::Player)
    }
}

/// Handle on account operations. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AccountStore {
    driver: Driver,
}

/// Where accounts are kept.
#[derive(Debug, Clone)]
enum Driver {
    Postgres(PostgresBackend),
    Embedded(SqliteBackend),
}

impl AccountStore {
    /// Accounts over `pg`.
    pub fn new(pg: PostgresBackend) -> Self {
        Self {
            driver: Driver::Postgres(pg),
        }
    }

    /// Accounts in the embedded store's file.
    pub fn embedded(db: SqliteBackend) -> Self {
        Self {
            driver: Driver::Embedded(db),
        }
    }

    /// Creates an account and its `created` audit row, together.
    pub async fn create_account(&self, account_id: Uuid, tier: Tier) -> Result<(), StoreError> {
        let event = AuditEvent::created(
            SubjectType::Account,
            account_id,
            None,
            serde_json::json!({ "tier": tier.as_str() }),
        );
        let pg = match &self.driver {
            Driver::Postgres(pg) => pg,
            Driver::Embedded(db) => {
                return embedded::create_account(db, account_id, tier, event).await;
            }
        };
        let mut tx = pg.begin().await?;
        sqlx::query("INSERT INTO accounts (id, tier) VALUES ($1, $2)")
            .bind(account_id)
            .bind(tier.as_str())
            .execute(&mut *tx)
            .await?;
        insert_many(&mut tx, &[event]).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Creates a character and its `created` audit row, together.
    pub async fn create_character(
        &self,
        new: &NewCharacter,
        actor_id: Option<Uuid>,
    ) -> Result<(), StoreError> {
        let event = AuditEvent::created(
            SubjectType::Character,
            new.character_id,
            actor_id,
            serde_json::json!({ "name": new.name.trim(), "account_id": new.account_id }),
        );
        let pg = match &self.driver {
            Driver::Postgres(pg) => pg,
            Driver::Embedded(db) => return embedded::create_character(db, new, event).await,
        };
        let mut tx = pg.begin().await?;
        CharacterStore::create_in(&mut tx, new).await?;
        insert_many(&mut tx, &[event]).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Changes an account's tier, records the role change and its `tier_changed` audit row (keyed
    /// by the role change's id) — all in one transaction. Returns the role change's id.
    pub async fn change_tier(
        &self,
        account_id: Uuid,
        to: Tier,
        actor_id: Option<Uuid>,
    ) -> Result<Uuid, StoreError> {
        let pg = match &self.driver {
            Driver::Postgres(pg) => pg,
            Driver::Embedded(db) => {
                return embedded::change_tier(db, account_id, to, actor_id).await;
            }
        };
        let mut tx = pg.begin().await?;
        let from: Option<String> =
            sqlx::query_scalar("SELECT tier FROM accounts WHERE id = $1 FOR UPDATE")
                .bind(account_id)
                .fetch_optional(&mut *tx)
                .await?;
        let from = from.ok_or(StoreError::NotFound(account_id))?;
        let change_id = Uuid::now_v7();
        sqlx::query("UPDATE accounts SET tier = $2 WHERE id = $1")
            .bind(account_id)
            .bind(to.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO account_role_changes (id, account_id, from_tier, to_tier, actor_id) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(change_id)
        .bind(account_id)
        .bind(&from)
        .bind(to.as_str())
        .bind(actor_id)
        .execute(&mut *tx)
        .await?;
        insert_many(
            &mut tx,
            &[tier_changed(account_id, change_id, actor_id, &from, to)],
        )
        .await?;
        tx.commit().await?;
        Ok(change_id)
    }
}

/// The audit row of a tier change, keyed by the role change's id.
fn tier_changed(
    account_id: Uuid,
    change_id: Uuid,
    actor_id: Option<Uuid>,
    from: &str,
    to: Tier,
) -> AuditEvent {
    AuditEvent::tier_changed(
        account_id,
        change_id,
        actor_id,
        serde_json::json!({ "from": from, "to": to.as_str() }),
    )
}

/// The account operations on the embedded store: each in one write transaction of the file.
mod embedded {
    use chrono::Utc;
    use uuid::Uuid;

    use super::{Tier, tier_changed};
    use crate::audit::event::AuditEvent;
    use crate::audit::store_sqlite::insert_on;
    use crate::backend::SqliteBackend;
    use crate::character::{CharacterStore, NewCharacter, StoreError};

    pub(super) async fn create_account(
        db: &SqliteBackend,
        account_id: Uuid,
        tier: Tier,
        event: AuditEvent,
    ) -> Result<(), StoreError> {
        let mut tx = db.begin().await?;
        let now = Utc::now().timestamp_micros();
        sqlx::query("INSERT INTO accounts (id, tier, created_at) VALUES (?1, ?2, ?3)")
            .bind(account_id)
            .bind(tier.as_str())
            .bind(now)
            .execute(&mut *tx)
            .await?;
        insert_on(&mut tx, &[event], now).await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn create_character(
        db: &SqliteBackend,
        new: &NewCharacter,
        event: AuditEvent,
    ) -> Result<(), StoreError> {
        let mut tx = db.begin().await?;
        let now = Utc::now().timestamp_micros();
        CharacterStore::create_embedded_on(&mut tx, now, new).await?;
        insert_on(&mut tx, &[event], now).await?;
        tx.commit().await?;
        Ok(())
    }

    pub(super) async fn change_tier(
        db: &SqliteBackend,
        account_id: Uuid,
        to: Tier,
        actor_id: Option<Uuid>,
    ) -> Result<Uuid, StoreError> {
        // The write transaction holds the file's one write lock: no other change of the tier
        // reads in between, as the row lock does on Postgres.
        let mut tx = db.begin().await?;
        let from: Option<String> = sqlx::query_scalar("SELECT tier FROM accounts WHERE id = ?1")
            .bind(account_id)
            .fetch_optional(&mut *tx)
            .await?;
        let from = from.ok_or(StoreError::NotFound(account_id))?;
        let change_id = Uuid::now_v7();
        let now = Utc::now().timestamp_micros();
        sqlx::query("UPDATE accounts SET tier = ?2 WHERE id = ?1")
            .bind(account_id)
            .bind(to.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO account_role_changes
                 (id, account_id, from_tier, to_tier, actor_id, changed_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .bind(change_id)
        .bind(account_id)
        .bind(&from)
        .bind(to.as_str())
        .bind(actor_id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let event = tier_changed(account_id, change_id, actor_id, &from, to);
        insert_on(&mut tx, &[event], now).await?;
        tx.commit().await?;
        Ok(change_id)
    }
}
