//! Account-side changes whose audit rows are written in the same transaction as the change, so
//! a change is never applied but unrecorded: creating accounts and characters, changing a tier.

use uuid::Uuid;

use super::event::{AuditEvent, SubjectType};
use super::store::insert_many;
use crate::backend::PostgresBackend;
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
    pg: PostgresBackend,
}

impl AccountStore {
    /// Accounts over `pg`.
    pub fn new(pg: PostgresBackend) -> Self {
        Self { pg }
    }

    /// Creates an account and its `created` audit row, together.
    pub async fn create_account(&self, account_id: Uuid, tier: Tier) -> Result<(), StoreError> {
        let mut tx = self.pg.begin().await?;
        sqlx::query("INSERT INTO accounts (id, tier) VALUES ($1, $2)")
            .bind(account_id)
            .bind(tier.as_str())
            .execute(&mut *tx)
            .await?;
        let event = AuditEvent::created(
            SubjectType::Account,
            account_id,
            None,
            serde_json::json!({ "tier": tier.as_str() }),
        );
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
        let mut tx = self.pg.begin().await?;
        CharacterStore::create_in(&mut tx, new).await?;
        let event = AuditEvent::created(
            SubjectType::Character,
            new.character_id,
            actor_id,
            serde_json::json!({ "name": new.name.trim(), "account_id": new.account_id }),
        );
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
        let mut tx = self.pg.begin().await?;
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
        let event = AuditEvent::tier_changed(
            account_id,
            change_id,
            actor_id,
            serde_json::json!({ "from": from, "to": to.as_str() }),
        );
        insert_many(&mut tx, &[event]).await?;
        tx.commit().await?;
        Ok(change_id)
    }
}
