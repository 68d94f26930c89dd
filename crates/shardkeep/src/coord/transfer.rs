//! Transfer activation markers: proof that a target game server activated a transfer token, and
//! their reconciliation against the tokens still pending.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use redis::AsyncCommands;

use super::{CoordError, Coordination, decode, encode};
use crate::ttl::Ttl;

/// What a marker records.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TransferActivation {
    /// The transfer token.
    pub transfer_token: String,
    /// The shard that activated it.
    pub target_shard: String,
    /// The zone it activated into.
    pub target_zone: String,
    /// When it was activated.
    pub activated_at: DateTime<Utc>,
}

/// What one reconciliation pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct TransferReconcile {
    /// Tokens whose markers were removed.
    pub removed: Vec<String>,
    /// Marker keys examined.
    pub examined: usize,
    /// False when the pass stopped at its bound before the SCAN finished.
    pub complete: bool,
}

impl Coordination {
    /// Records that `activation.transfer_token` was activated, expiring after `ttl`.
    pub async fn transfer_marker_set(
        &self,
        activation: &TransferActivation,
        ttl: Ttl,
    ) -> Result<(), CoordError> {
        let key = self.keys().transfer_activated(&activation.transfer_token)?;
        let body = encode(activation)?;
        let () = self.conn().pset_ex(key, body, ttl.as_millis()).await?;
        Ok(())
    }

    /// The marker for `token`, if present.
    pub async fn transfer_marker_get(
        &self,
        token: &str,
    ) -> Result<Option<TransferActivation>, CoordError> {
        let key = self.keys().transfer_activated(token)?;
        let raw: Option<Vec<u8>> = self.conn().get(&key).await?;
        raw.map(|raw| decode(&key, &raw)).transpose()
    }

    /// Reconciliation as a game server runs it: a token is live while its handoff has not been
    /// consumed, so markers of completed transfers are removed. Examines at most `max_examined`
    /// markers.
    pub async fn transfer_markers_reconcile_consumed(
        &self,
        max_examined: usize,
    ) -> Result<TransferReconcile, CoordError> {
        let pattern = self.keys().transfer_activated_pattern();
        let mut conn = self.conn();
        let mut tokens = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(self.config().scan_count)
                .query_async(&mut conn)
                .await?;
            tokens.extend(keys.iter().filter_map(|k| self.keys().transfer_token_of(k)));
            cursor = next;
            if cursor == 0 || tokens.len() >= max_examined {
                break;
            }
        }
        let mut live = HashSet::new();
        for chunk in tokens.chunks(256) {
            let mut pipe = redis::pipe();
            for token in chunk {
                pipe.exists(self.keys().handoff_consumed(token)?);
            }
            let consumed: Vec<bool> = pipe.query_async(&mut conn).await?;
            live.extend(
                chunk
                    .iter()
                    .zip(consumed)
                    .filter(|(_, c)| !c)
                    .map(|(t, _)| t.clone()),
            );
        }
        self.transfer_markers_reconcile(&live, max_examined).await
    }

    /// Removes every marker whose token is not in `live_pending`, walking the family with a
    /// bounded SCAN that examines at most `max_examined` keys.
    pub async fn transfer_markers_reconcile(
        &self,
        live_pending: &HashSet<String>,
        max_examined: usize,
    ) -> Result<TransferReconcile, CoordError> {
        let pattern = self.keys().transfer_activated_pattern();
        let mut report = TransferReconcile::default();
        let mut conn = self.conn();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(self.config().scan_count)
                .query_async(&mut conn)
                .await?;
            let mut stale = Vec::new();
            for key in keys {
                report.examined += 1;
                match self.keys().transfer_token_of(&key) {
                    Some(token) if live_pending.contains(&token) => {}
                    Some(token) => stale.push((key, token)),
                    None => stale.push((key.clone(), key)),
                }
            }
            if !stale.is_empty() {
                let keys: Vec<&String> = stale.iter().map(|(k, _)| k).collect();
                let mut pipe = redis::pipe();
                for key in &keys {
                    pipe.unlink(*key);
                }
                let removed: Vec<i64> = pipe.query_async(&mut conn).await?;
                for ((_, token), n) in stale.into_iter().zip(removed) {
                    if n > 0 && !report.removed.contains(&token) {
                        report.removed.push(token);
                    }
                }
            }
            cursor = next;
            if cursor == 0 {
                report.complete = true;
                break;
            }
            if report.examined >= max_examined {
                break;
            }
        }
        metrics::counter!(crate::telemetry::TRANSFER_MARKERS_REMOVED_TOTAL)
            .increment(report.removed.len() as u64);
        Ok(report)
    }
}
