//! Scoped handoffs with consumed markers: a handoff token can be taken exactly once, even after
//! its payload expired, and moving it between scopes keeps its remaining TTL.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{AsyncCommands, Script, Value};

use super::embedded::{self, RecordFile};
use super::{CoordError, Coordination, check_payload};
use crate::keyspace::HandoffScope;
use crate::telemetry;
use crate::ttl::Ttl;

static TAKE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/handoff_take.lua")));
static MOVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/handoff_move.lua")));

/// Most scopes one take may try.
pub const MAX_TAKE_SCOPES: usize = 16;

/// Result of taking a handoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandoffTake {
    /// The payload, and the scope it was found under. The token is now consumed.
    Taken {
        /// Where the payload was stored.
        scope: HandoffScope,
        /// The stored bytes.
        payload: Vec<u8>,
    },
    /// The token was taken before; its payload is gone for good.
    AlreadyConsumed,
    /// No scope holds a payload for this token (never stored, or expired untaken).
    NotFound,
}

/// Result of moving a handoff between scopes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandoffMove {
    /// Moved; the destination keeps this remaining TTL.
    Moved {
        /// TTL carried over from the source.
        remaining: Duration,
    },
    /// The token was already consumed; nothing moved.
    AlreadyConsumed,
    /// The source scope holds nothing for this token.
    NotFound,
}

impl Coordination {
    /// Stores a handoff payload for `token` under `scope`, expiring after `ttl`.
    pub async fn handoff_put(
        &self,
        token: &str,
        scope: &HandoffScope,
        payload: &[u8],
        ttl: Ttl,
    ) -> Result<(), CoordError> {
        check_payload("handoff payload", payload.len())?;
        let key = self.keys().handoff(token, scope)?;
        if let Some(file) = self.file() {
            return file.set(&key, payload, ttl).await;
        }
        let mut conn = self.conn()?;
        let () = conn.pset_ex(key, payload, ttl.as_millis()).await?;
        Ok(())
    }

    /// Takes the handoff for `token` from the first of `scopes` (tried instance, placement, port)
    /// that holds one, and marks the token consumed — atomically, in one script.
    pub async fn handoff_take(
        &self,
        token: &str,
        scopes: &[HandoffScope],
    ) -> Result<HandoffTake, CoordError> {
        if scopes.is_empty() || scopes.len() > MAX_TAKE_SCOPES {
            return Err(CoordError::InvalidInput(format!(
                "a take needs 1 to {MAX_TAKE_SCOPES} scopes, got {}",
                scopes.len()
            )));
        }
        let mut ordered = scopes.to_vec();
        ordered.sort_by_key(HandoffScope::rank);
        ordered.dedup();
        let outcome = match self.file() {
            Some(file) => self.take_from_file(file, token, ordered).await?,
            None => self.take_from_redis(token, &ordered).await?,
        };
        let label = match &outcome {
            HandoffTake::Taken { .. } => "taken",
            HandoffTake::AlreadyConsumed => "already_consumed",
            HandoffTake::NotFound => "not_found",
        };
        metrics::counter!(telemetry::HANDOFF_TAKES_TOTAL, "outcome" => label).increment(1);
        Ok(outcome)
    }

    /// The take on Redis: one script.
    async fn take_from_redis(
        &self,
        token: &str,
        ordered: &[HandoffScope],
    ) -> Result<HandoffTake, CoordError> {
        let mut call = TAKE.prepare_invoke();
        call.key(self.keys().handoff_consumed(token)?);
        for scope in ordered {
            call.key(self.keys().handoff(token, scope)?);
        }
        call.arg(self.config().consumed_marker_ttl.as_millis());
        // A take a failover loses would bring the payload back for a second take: on a cluster
        // the consumed marker must reach a replica before the payload is handed out.
        // Unconfirmed, the take fails closed (the token stays consumed on the master).
        let reply: Vec<Value> = self.redis()?.invoke_confirmed(&TAKE, &call).await?;
        decode_take(&reply, ordered)
    }

    /// The take in the embedded store's file: one write transaction deciding as the script
    /// does (consumed first; else the first scope holding a payload, every scope's payload
    /// removed and the token marked consumed).
    async fn take_from_file(
        &self,
        file: &RecordFile,
        token: &str,
        ordered: Vec<HandoffScope>,
    ) -> Result<HandoffTake, CoordError> {
        let consumed = self.keys().handoff_consumed(token)?;
        let keys = ordered
            .iter()
            .map(|scope| self.keys().handoff(token, scope))
            .collect::<Result<Vec<_>, _>>()?;
        let (mut tx, now) = file.begin().await?;
        if embedded::read(&mut tx, &consumed, now).await?.is_some() {
            return Ok(HandoffTake::AlreadyConsumed);
        }
        let mut found = None;
        for (scope, key) in ordered.into_iter().zip(&keys) {
            if let Some((payload, _)) = embedded::read(&mut tx, key, now).await? {
                found = Some((scope, payload));
                break;
            }
        }
        let Some((scope, payload)) = found else {
            return Ok(HandoffTake::NotFound);
        };
        for key in &keys {
            embedded::remove(&mut tx, key, now).await?;
        }
        let marker_expiry = embedded::expiry(now, self.config().consumed_marker_ttl);
        embedded::put(&mut tx, &consumed, b"1", Some(marker_expiry)).await?;
        tx.commit().await?;
        Ok(HandoffTake::Taken { scope, payload })
    }

    /// Moves `token`'s handoff from `from` to `to`, keeping its remaining TTL, atomically.
    pub async fn handoff_move(
        &self,
        token: &str,
        from: &HandoffScope,
        to: &HandoffScope,
    ) -> Result<HandoffMove, CoordError> {
        if let Some(file) = self.file() {
            return self.move_in_file(file, token, from, to).await;
        }
        let reply: Vec<Value> = MOVE
            .key(self.keys().handoff_consumed(token)?)
            .key(self.keys().handoff(token, from)?)
            .key(self.keys().handoff(token, to)?)
            .invoke_async(&mut self.conn()?)
            .await?;
        match reply.as_slice() {
            [tag] if is(tag, "consumed") => Ok(HandoffMove::AlreadyConsumed),
            [tag] if is(tag, "missing") => Ok(HandoffMove::NotFound),
            [tag, Value::Int(ms)] if is(tag, "moved") => Ok(HandoffMove::Moved {
                remaining: Duration::from_millis(u64::try_from(*ms).unwrap_or(0)),
            }),
            other => Err(CoordError::Protocol(format!("handoff move: {other:?}"))),
        }
    }

    /// The move in the embedded store's file, deciding as the script does.
    async fn move_in_file(
        &self,
        file: &RecordFile,
        token: &str,
        from: &HandoffScope,
        to: &HandoffScope,
    ) -> Result<HandoffMove, CoordError> {
        let consumed = self.keys().handoff_consumed(token)?;
        let (source, destination) = (
            self.keys().handoff(token, from)?,
            self.keys().handoff(token, to)?,
        );
        let (mut tx, now) = file.begin().await?;
        if embedded::read(&mut tx, &consumed, now).await?.is_some() {
            return Ok(HandoffMove::AlreadyConsumed);
        }
        let Some((payload, expires)) = embedded::read_expiring(&mut tx, &source, now).await? else {
            return Ok(HandoffMove::NotFound);
        };
        // The destination keeps the very instant the source expires at.
        let remaining = expires.map(|at| (at - now).max(0) / 1000);
        if source != destination {
            embedded::put(&mut tx, &destination, &payload, expires).await?;
            embedded::remove(&mut tx, &source, now).await?;
            tx.commit().await?;
        }
        Ok(HandoffMove::Moved {
            remaining: Duration::from_millis(
                remaining.and_then(|ms| u64::try_from(ms).ok()).unwrap_or(0),
            ),
        })
    }

    /// True when `token` has been consumed.
    pub async fn handoff_is_consumed(&self, token: &str) -> Result<bool, CoordError> {
        let key = self.keys().handoff_consumed(token)?;
        if let Some(file) = self.file() {
            return file.exists(&key).await;
        }
        Ok(self.conn()?.exists(key).await?)
    }
}

/// True when a script reply element is the bulk string `tag`.
pub(crate) fn is(value: &Value, tag: &str) -> bool {
    matches!(value, Value::BulkString(b) if b == tag.as_bytes())
        || matches!(value, Value::SimpleString(s) if s == tag)
}

/// Interprets the take script's reply against the scopes it was given.
fn decode_take(reply: &[Value], ordered: &[HandoffScope]) -> Result<HandoffTake, CoordError> {
    match reply {
        [tag] if is(tag, "consumed") => Ok(HandoffTake::AlreadyConsumed),
        [tag] if is(tag, "missing") => Ok(HandoffTake::NotFound),
        [tag, Value::BulkString(index), Value::BulkString(payload)] if is(tag, "taken") => {
            let index: usize = std::str::from_utf8(index)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| CoordError::Protocol("take index".into()))?;
            let scope = ordered
                .get(index.wrapping_sub(1))
                .cloned()
                .ok_or_else(|| CoordError::Protocol(format!("take index {index}")))?;
            Ok(HandoffTake::Taken {
                scope,
                payload: payload.clone(),
            })
        }
        other => Err(CoordError::Protocol(format!("handoff take: {other:?}"))),
    }
}
