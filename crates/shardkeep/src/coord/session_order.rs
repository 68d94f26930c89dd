//! The order of a character's session events: sessions starting and streams closing. Retries,
//! recoveries and requeues can deliver the journal's cleanups in any order, and a cleanup can
//! arrive after the character's next session began; each event carries its place (the epoch of
//! the copy, when it happened, its id), and a per-character mark records the newest place seen.
//! A cleanup older than the mark is stale: its side effects would undo newer ones, so they are
//! skipped. Presence writes check the mark in the same script that writes, so a newer event
//! arriving meanwhile still wins.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use redis::Script;
use uuid::Uuid;

use super::presence::PresenceRecord;
use super::resume::ResumeLedgerRecord;
use super::{CoordError, Coordination, encode};
use crate::ttl::Ttl;

static ORDER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/ints.lua"),
        include_str!("lua/session_order.lua")
    ))
});
static RESUME: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/resume_ordered.lua")));

/// How long a character's order mark is kept after its last session event (a cleanup older
/// than this, say a dead letter requeued much later, is no longer recognised as stale by it; the
/// row's own location order still is).
pub const SESSION_ORDER_TTL: Ttl = Ttl::from_static_secs(7 * 24 * 60 * 60);

/// A session event's place in its character's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionOrder {
    /// The epoch of the copy the session drives (a later copy always comes later).
    pub owner_epoch: i64,
    /// When the session started, or its stream closed (orders the events of one copy).
    pub at: DateTime<Utc>,
    /// The event's id (a journal entry's id for a cleanup); breaks a tie.
    pub event_id: Uuid,
}

/// Where an event stood when it was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderCheck {
    /// Newest seen (or a retry of the newest): its effects apply.
    Current,
    /// A newer event of the character was seen: its effects are skipped.
    Stale,
}

impl Coordination {
    /// Takes `order`'s place as the newest session event of `character_id`, unless a newer one
    /// was seen (then nothing is written). Calling it again for the same event checks it.
    pub async fn session_order_claim(
        &self,
        character_id: &str,
        order: &SessionOrder,
    ) -> Result<OrderCheck, CoordError> {
        let mark = self.keys().presence_session_order(character_id)?;
        let mut call = ORDER.key(mark);
        call.arg(order.owner_epoch)
            .arg(order.at.timestamp_micros())
            .arg(order.event_id.to_string())
            .arg(SESSION_ORDER_TTL.as_millis());
        // The mark is what makes an older event stale: one a failover lost would let an older
        // cleanup apply after a newer one. On a cluster it counts once a replica holds it.
        let current: i64 = self.redis().invoke_confirmed(&ORDER, &call).await?;
        Ok(check(current))
    }

    /// Writes `record` (as [`Self::presence_put`] does) only while `order` is still the newest
    /// session event of its character, checked, taken and written in one step. A session start
    /// writes its presence this way too, so a cleanup of an earlier session arriving later is
    /// stale.
    pub async fn presence_put_ordered(
        &self,
        record: &PresenceRecord,
        order: &SessionOrder,
    ) -> Result<OrderCheck, CoordError> {
        let ttl = Ttl::from_millis((record.expires_at - Utc::now()).num_milliseconds())?;
        let keys = self.keys();
        let mut call = ORDER.key(keys.presence_session_order(&record.character_id)?);
        call.key(keys.presence_account(&record.account_id)?)
            .key(keys.presence_character(&record.character_id)?)
            .key(keys.presence_account_index())
            .key(keys.presence_character_index())
            .arg(order.owner_epoch)
            .arg(order.at.timestamp_micros())
            .arg(order.event_id.to_string())
            .arg(SESSION_ORDER_TTL.as_millis())
            .arg(encode(record)?)
            .arg(ttl.as_millis())
            .arg(&record.account_id)
            .arg(&record.character_id);
        // It takes the session-order mark too: confirmed like `session_order_claim`.
        let current: i64 = self.redis().invoke_confirmed(&ORDER, &call).await?;
        Ok(check(current))
    }
}

impl Coordination {
    /// Stores `record` (expiring after `ttl`) as the resume ledger written by the session event
    /// at `order`, unless a newer event's ledger is stored under the same session token.
    pub async fn resume_store_ordered(
        &self,
        record: &ResumeLedgerRecord,
        ttl: Ttl,
        order: &SessionOrder,
    ) -> Result<OrderCheck, CoordError> {
        let mut body = serde_json::to_value(record).map_err(|source| CoordError::Decode {
            key: record.session_token.clone(),
            source,
        })?;
        if let Some(map) = body.as_object_mut() {
            map.insert(
                "order".into(),
                serde_json::json!([
                    order.owner_epoch,
                    order.at.timestamp_micros(),
                    order.event_id.to_string()
                ]),
            );
        }
        let stored: i64 = RESUME
            .key(self.keys().resume_ledger(&record.session_token)?)
            .arg("store")
            .arg(order.owner_epoch)
            .arg(order.at.timestamp_micros())
            .arg(order.event_id.to_string())
            .arg(encode(&body)?)
            .arg(ttl.as_millis())
            .invoke_async(&mut self.conn())
            .await?;
        Ok(check(stored))
    }

    /// Deletes the resume ledger of `session_token` only if the event at `order` stored it (a
    /// cleanup found stale after its store takes its own record back, never a newer one's).
    pub async fn resume_take_back(
        &self,
        session_token: &str,
        order: &SessionOrder,
    ) -> Result<bool, CoordError> {
        let taken: i64 = RESUME
            .key(self.keys().resume_ledger(session_token)?)
            .arg("take_back")
            .arg(order.owner_epoch)
            .arg(order.at.timestamp_micros())
            .arg(order.event_id.to_string())
            .invoke_async(&mut self.conn())
            .await?;
        Ok(taken == 1)
    }
}

fn check(current: i64) -> OrderCheck {
    if current == 1 {
        OrderCheck::Current
    } else {
        OrderCheck::Stale
    }
}
