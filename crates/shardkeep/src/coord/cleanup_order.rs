//! The order of a character's session cleanups. Retries, recoveries and requeues can deliver
//! the journal's cleanups in any order; each carries its place (the epoch of the copy whose
//! stream closed, when it closed, its entry id), and a per-character mark records the newest
//! place seen. A cleanup older than the mark is stale: its side effects would undo newer ones,
//! so they are skipped. The presence refresh checks the mark in the same script that writes,
//! so a newer cleanup arriving meanwhile still wins.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use redis::Script;
use uuid::Uuid;

use super::presence::PresenceRecord;
use super::{CoordError, Coordination, encode};
use crate::ttl::Ttl;

static ORDER: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/cleanup_order.lua")));

/// How long a character's cleanup mark is kept after its last cleanup (a cleanup older than
/// this, say a dead letter requeued much later, is no longer recognised as stale by it; the
/// row's own location order still is).
pub const CLEANUP_ORDER_TTL: Ttl = Ttl::from_static_secs(7 * 24 * 60 * 60);

/// A cleanup's place in its character's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanupOrder {
    /// The epoch of the copy whose stream closed (a later copy always comes later).
    pub owner_epoch: i64,
    /// When the stream closed (orders the sessions of one copy).
    pub closed_at: DateTime<Utc>,
    /// The journal entry (breaks a tie).
    pub entry_id: Uuid,
}

/// Where a cleanup stood when it was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderCheck {
    /// Newest seen (or a retry of the newest): its effects apply.
    Current,
    /// A newer cleanup of the character was seen: its effects are skipped.
    Stale,
}

impl Coordination {
    /// Takes `order`'s place as the newest cleanup of `character_id`, unless a newer one was
    /// seen.
    pub async fn cleanup_order_claim(
        &self,
        character_id: &str,
        order: &CleanupOrder,
    ) -> Result<OrderCheck, CoordError> {
        let mark = self.keys().presence_cleanup_order(character_id)?;
        let current: i64 = ORDER
            .key(mark)
            .arg(order.owner_epoch)
            .arg(order.closed_at.timestamp_micros())
            .arg(order.entry_id.to_string())
            .arg(CLEANUP_ORDER_TTL.as_millis())
            .invoke_async(&mut self.conn())
            .await?;
        Ok(check(current))
    }

    /// Writes `record` (as [`Self::presence_put`] does) only while `order` is still the newest
    /// cleanup of its character, checked and written in one step.
    pub async fn presence_put_ordered(
        &self,
        record: &PresenceRecord,
        order: &CleanupOrder,
    ) -> Result<OrderCheck, CoordError> {
        let ttl = Ttl::from_millis((record.expires_at - Utc::now()).num_milliseconds())?;
        let keys = self.keys();
        let current: i64 = ORDER
            .key(keys.presence_cleanup_order(&record.character_id)?)
            .key(keys.presence_account(&record.account_id)?)
            .key(keys.presence_character(&record.character_id)?)
            .key(keys.presence_account_index())
            .key(keys.presence_character_index())
            .arg(order.owner_epoch)
            .arg(order.closed_at.timestamp_micros())
            .arg(order.entry_id.to_string())
            .arg(CLEANUP_ORDER_TTL.as_millis())
            .arg(encode(record)?)
            .arg(ttl.as_millis())
            .arg(&record.account_id)
            .arg(&record.character_id)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(check(current))
    }
}

fn check(current: i64) -> OrderCheck {
    if current == 1 {
        OrderCheck::Current
    } else {
        OrderCheck::Stale
    }
}
