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

use super::embedded::{self, RecordFile};
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
        if let Some(file) = self.file() {
            return order_in_file(file, &mark, order, None).await;
        }
        let mut call = ORDER.key(mark);
        call.arg(order.owner_epoch)
            .arg(order.at.timestamp_micros())
            .arg(order.event_id.to_string())
            .arg(SESSION_ORDER_TTL.as_millis());
        // The mark is what makes an older event stale: one a failover lost would let an older
        // cleanup apply after a newer one. On a cluster it counts once a replica holds it.
        let current: i64 = self.redis()?.invoke_confirmed(&ORDER, &call).await?;
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
        if let Some(file) = self.file() {
            let presence = PresenceWrite {
                keys: [
                    keys.presence_account(&record.account_id)?,
                    keys.presence_character(&record.character_id)?,
                ],
                body: encode(record)?,
                ttl,
            };
            let mark = keys.presence_session_order(&record.character_id)?;
            return order_in_file(file, &mark, order, Some(presence)).await;
        }
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
        let current: i64 = self.redis()?.invoke_confirmed(&ORDER, &call).await?;
        Ok(check(current))
    }
}

impl Coordination {
    /// The newest session event seen for `character_id` — (owner epoch, microseconds, event
    /// id) — when a mark is stored and reads as one (checks and diagnostics).
    pub async fn session_order_mark(
        &self,
        character_id: &str,
    ) -> Result<Option<(i64, i64, String)>, CoordError> {
        let mark = self.keys().presence_session_order(character_id)?;
        if let Some(file) = self.file() {
            return Ok(file
                .get(&mark)
                .await?
                .and_then(|raw| serde_json::from_slice::<serde_json::Value>(&raw).ok())
                .and_then(|value| stored_place(&value)));
        }
        let (epoch, at, entry): (Option<i64>, Option<i64>, Option<String>) = redis::cmd("HMGET")
            .arg(&mark)
            .arg("epoch")
            .arg("at")
            .arg("entry")
            .query_async(&mut self.conn()?)
            .await?;
        Ok(match (epoch, at, entry) {
            (Some(epoch), Some(at), Some(entry)) => Some((epoch, at, entry)),
            _ => None,
        })
    }

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
        if let Some(file) = self.file() {
            let key = self.keys().resume_ledger(&record.session_token)?;
            return resume_in_file(file, &key, order, Some((encode(&body)?, ttl))).await;
        }
        let stored: i64 = RESUME
            .key(self.keys().resume_ledger(&record.session_token)?)
            .arg("store")
            .arg(order.owner_epoch)
            .arg(order.at.timestamp_micros())
            .arg(order.event_id.to_string())
            .arg(encode(&body)?)
            .arg(ttl.as_millis())
            .invoke_async(&mut self.conn()?)
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
        if let Some(file) = self.file() {
            let key = self.keys().resume_ledger(session_token)?;
            let done = resume_in_file(file, &key, order, None).await?;
            return Ok(done == OrderCheck::Current);
        }
        let taken: i64 = RESUME
            .key(self.keys().resume_ledger(session_token)?)
            .arg("take_back")
            .arg(order.owner_epoch)
            .arg(order.at.timestamp_micros())
            .arg(order.event_id.to_string())
            .invoke_async(&mut self.conn()?)
            .await?;
        Ok(taken == 1)
    }
}

/// A place in a character's order of session events, comparable: epoch, then time, then id.
type Place = (i64, i64, String);

fn place_of(order: &SessionOrder) -> Place {
    (
        order.owner_epoch,
        order.at.timestamp_micros(),
        order.event_id.to_string(),
    )
}

/// A stored place, when it decodes (`[epoch, micros, id]`); a corrupt one is taken over like a
/// missing one, never compared.
fn stored_place(value: &serde_json::Value) -> Option<Place> {
    let [epoch, at, id] = value.as_array()?.as_slice() else {
        return None;
    };
    Some((epoch.as_i64()?, at.as_i64()?, id.as_str()?.to_owned()))
}

/// The presence records an ordered presence write stores with the mark.
struct PresenceWrite {
    keys: [String; 2],
    body: Vec<u8>,
    ttl: Ttl,
}

/// The order claim in the embedded store's file, in one write transaction deciding as the
/// script does: an event at or after the mark takes it (and writes `presence`, when given); an
/// older one is stale and writes nothing.
async fn order_in_file(
    file: &RecordFile,
    mark: &str,
    order: &SessionOrder,
    presence: Option<PresenceWrite>,
) -> Result<OrderCheck, CoordError> {
    let mine = place_of(order);
    let (mut tx, now) = file.begin().await?;
    let stored = embedded::read(&mut tx, mark, now)
        .await?
        .and_then(|(raw, _)| serde_json::from_slice(&raw).ok())
        .and_then(|value: serde_json::Value| stored_place(&value));
    if stored.is_some_and(|stored| mine < stored) {
        return Ok(OrderCheck::Stale);
    }
    let value = serde_json::json!([mine.0, mine.1, mine.2]).to_string();
    let mark_expiry = embedded::expiry(now, SESSION_ORDER_TTL);
    embedded::put(&mut tx, mark, value.as_bytes(), Some(mark_expiry)).await?;
    if let Some(presence) = presence {
        let expires = embedded::expiry(now, presence.ttl);
        for key in &presence.keys {
            embedded::put(&mut tx, key, &presence.body, Some(expires)).await?;
        }
    }
    tx.commit().await?;
    Ok(OrderCheck::Current)
}

/// The ordered resume ledger in the embedded store's file, deciding as the script does. With
/// `store` (the record and its TTL): stored unless a newer event stored the present one
/// (`Current` when stored). Without: the record is deleted only if this very event stored it
/// (`Current` when deleted).
async fn resume_in_file(
    file: &RecordFile,
    key: &str,
    order: &SessionOrder,
    store: Option<(Vec<u8>, Ttl)>,
) -> Result<OrderCheck, CoordError> {
    let mine = place_of(order);
    let (mut tx, now) = file.begin().await?;
    let stored = embedded::read(&mut tx, key, now)
        .await?
        .and_then(|(raw, _)| serde_json::from_slice::<serde_json::Value>(&raw).ok())
        .and_then(|value| value.get("order").and_then(stored_place));
    let done = match store {
        Some((body, ttl)) => {
            if stored.is_some_and(|stored| mine < stored) {
                return Ok(OrderCheck::Stale);
            }
            embedded::put(&mut tx, key, &body, Some(embedded::expiry(now, ttl))).await?;
            true
        }
        None => stored.as_ref() == Some(&mine) && embedded::remove(&mut tx, key, now).await?,
    };
    tx.commit().await?;
    Ok(if done {
        OrderCheck::Current
    } else {
        OrderCheck::Stale
    })
}

fn check(current: i64) -> OrderCheck {
    if current == 1 {
        OrderCheck::Current
    } else {
        OrderCheck::Stale
    }
}
