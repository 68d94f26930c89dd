//! Transfer activation markers: proof that a target game server activated a transfer token, and
//! their reconciliation against the tokens still pending.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use redis::AsyncCommands;

use super::embedded::{self, RecordFile};
use super::{CoordError, Coordination, decode, encode};
use crate::backend::redis::ScanCursor;
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
    /// The source starts transfer `token`: the transfer is pending (its activation marker is
    /// kept) until [`Coordination::transfer_complete`] or `ttl`. Call it before storing the
    /// handoff, so no marker can exist for a transfer that is not pending.
    pub async fn transfer_begin(&self, token: &str, ttl: Ttl) -> Result<(), CoordError> {
        let key = self.keys().transfer_pending(token)?;
        if let Some(file) = self.file() {
            return file.set(&key, b"1", ttl).await;
        }
        // A pending record a failover lost would leave the marker of a transfer that is not
        // pending: on a cluster it counts once a replica holds it.
        let mut pipe = redis::pipe();
        pipe.pset_ex(key, 1, ttl.as_millis()).ignore();
        let () = self.redis()?.query_confirmed(pipe).await?;
        Ok(())
    }

    /// True while transfer `token` is pending.
    pub async fn transfer_is_pending(&self, token: &str) -> Result<bool, CoordError> {
        let key = self.keys().transfer_pending(token)?;
        if let Some(file) = self.file() {
            return file.exists(&key).await;
        }
        Ok(self.conn()?.exists(key).await?)
    }

    /// The source completes transfer `token` (it has seen the activation): the transfer is no
    /// longer pending and its marker goes. A marker left behind by a failure here is removed by
    /// the next reconciliation, since the transfer is no longer pending.
    pub async fn transfer_complete(&self, token: &str) -> Result<(), CoordError> {
        let pending = self.keys().transfer_pending(token)?;
        let marker = self.keys().transfer_activated(token)?;
        if let Some(file) = self.file() {
            return file.delete(&[&pending, &marker]).await.map(drop);
        }
        // A completion a failover undid would leave the transfer pending until its TTL: on a
        // cluster it counts once a replica has it.
        let mut pipe = redis::pipe();
        pipe.unlink(&pending).ignore().unlink(&marker).ignore();
        let () = self.redis()?.query_confirmed(pipe).await?;
        Ok(())
    }

    /// Records that `activation.transfer_token` was activated, expiring after `ttl`.
    pub async fn transfer_marker_set(
        &self,
        activation: &TransferActivation,
        ttl: Ttl,
    ) -> Result<(), CoordError> {
        let key = self.keys().transfer_activated(&activation.transfer_token)?;
        let body = encode(activation)?;
        if let Some(file) = self.file() {
            return file.set(&key, &body, ttl).await;
        }
        // The source waits for this marker: one a failover lost would keep it waiting (and the
        // transfer pending) until the pending record's TTL. On a cluster it counts once a
        // replica has it.
        let mut pipe = redis::pipe();
        pipe.pset_ex(&key, body, ttl.as_millis()).ignore();
        let () = self.redis()?.query_confirmed(pipe).await?;
        Ok(())
    }

    /// The marker for `token`, if present.
    pub async fn transfer_marker_get(
        &self,
        token: &str,
    ) -> Result<Option<TransferActivation>, CoordError> {
        let key = self.keys().transfer_activated(token)?;
        let raw: Option<Vec<u8>> = match self.file() {
            Some(file) => file.get(&key).await?,
            None => self.conn()?.get(&key).await?,
        };
        raw.map(|raw| decode(&key, &raw)).transpose()
    }

    /// Reconciliation as `serve` and every shard run it: a marker is live while its transfer is
    /// pending ([`Coordination::transfer_begin`] until [`Coordination::transfer_complete`] or the
    /// pending record's TTL), whether or not its handoff has been taken. Markers of transfers no
    /// longer pending are removed. Each page of the bounded SCAN is checked and cleaned on its
    /// own, so a marker written while the pass runs is judged by its own pending record, never
    /// by a list taken before it existed. Examines at most `max_examined` markers.
    pub async fn transfer_markers_reconcile_pending(
        &self,
        max_examined: usize,
    ) -> Result<TransferReconcile, CoordError> {
        self.reconcile_markers(Liveness::Pending, max_examined)
            .await
    }

    /// Removes every marker whose token is not in `live_pending` (the caller's own view of its
    /// pending transfers, which must include every transfer begun before the call), walking
    /// the family with a bounded SCAN that examines at most `max_examined` keys.
    pub async fn transfer_markers_reconcile(
        &self,
        live_pending: &HashSet<String>,
        max_examined: usize,
    ) -> Result<TransferReconcile, CoordError> {
        self.reconcile_markers(Liveness::Listed(live_pending), max_examined)
            .await
    }

    /// The one reconciliation walk: each SCAN page is judged by `liveness` and its stale
    /// markers unlinked before the next page is read.
    async fn reconcile_markers(
        &self,
        liveness: Liveness<'_>,
        max_examined: usize,
    ) -> Result<TransferReconcile, CoordError> {
        if let Some(file) = self.file() {
            return self.reconcile_in_file(file, liveness, max_examined).await;
        }
        let pattern = self.keys().transfer_activated_pattern();
        let mut report = TransferReconcile::default();
        let mut conn = self.conn()?;
        let mut cursor = ScanCursor::START;
        loop {
            let (next, keys) = self
                .redis()?
                .scan_page(cursor, &pattern, self.config().scan_count)
                .await?;
            report.examined += keys.len();
            // A key that is not a marker this keyspace wrote has nothing to keep it.
            let tokens: Vec<Option<String>> = keys
                .iter()
                .map(|k| self.keys().transfer_token_of(k))
                .collect();
            let live = self.live_tokens(&mut conn, &tokens, &liveness).await?;
            let stale: Vec<(String, String)> = keys
                .into_iter()
                .zip(tokens)
                .filter_map(|(key, token)| match token {
                    Some(token) if live.contains(&token) => None,
                    Some(token) => Some((key, token)),
                    None => Some((key.clone(), key)),
                })
                .collect();
            self.unlink_markers(&mut conn, stale, &mut report).await?;
            cursor = next;
            if cursor.is_start() {
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

    /// The reconciliation in the embedded store's file: pages of markers in key order, each
    /// judged and cleaned in one write transaction (so a pending record written meanwhile is
    /// seen by the page it concerns), expired markers swept as well.
    async fn reconcile_in_file(
        &self,
        file: &RecordFile,
        liveness: Liveness<'_>,
        max_examined: usize,
    ) -> Result<TransferReconcile, CoordError> {
        let pattern = self.keys().transfer_activated_pattern();
        let prefix = pattern.trim_end_matches('*');
        let mut report = TransferReconcile::default();
        let mut after: Option<String> = None;
        loop {
            let page = file
                .page(prefix, after.as_deref(), self.config().scan_count.max(1))
                .await?;
            let Some((last, _)) = page.last() else {
                report.complete = true;
                break;
            };
            after = Some(last.clone());
            report.examined += page.len();
            let (mut tx, now) = file.begin().await?;
            for (key, _) in &page {
                let token = self.keys().transfer_token_of(key);
                let live = match (&token, &liveness) {
                    (None, _) => false,
                    (Some(token), Liveness::Listed(live)) => live.contains(token),
                    (Some(token), Liveness::Pending) => {
                        let pending = self.keys().transfer_pending(token)?;
                        embedded::read(&mut tx, &pending, now).await?.is_some()
                    }
                };
                if !live && embedded::remove(&mut tx, key, now).await? {
                    let token = token.unwrap_or_else(|| key.clone());
                    if !report.removed.contains(&token) {
                        report.removed.push(token);
                    }
                }
            }
            tx.commit().await?;
            if report.examined >= max_examined {
                break;
            }
        }
        file.sweep(prefix, max_examined).await?;
        metrics::counter!(crate::telemetry::TRANSFER_MARKERS_REMOVED_TOTAL)
            .increment(report.removed.len() as u64);
        Ok(report)
    }

    /// Which of one page's tokens belong to live transfers.
    async fn live_tokens(
        &self,
        conn: &mut crate::backend::redis::RedisConn,
        tokens: &[Option<String>],
        liveness: &Liveness<'_>,
    ) -> Result<HashSet<String>, CoordError> {
        let named: Vec<&String> = tokens.iter().flatten().collect();
        match liveness {
            Liveness::Listed(live) => Ok(named
                .into_iter()
                .filter(|t| live.contains(*t))
                .cloned()
                .collect()),
            Liveness::Pending if named.is_empty() => Ok(HashSet::new()),
            Liveness::Pending => {
                let mut pipe = redis::pipe();
                for token in &named {
                    pipe.exists(self.keys().transfer_pending(token)?);
                }
                let pending: Vec<bool> = pipe.query_async(conn).await?;
                Ok(named
                    .into_iter()
                    .zip(pending)
                    .filter(|(_, p)| *p)
                    .map(|(t, _)| t.clone())
                    .collect())
            }
        }
    }

    async fn unlink_markers(
        &self,
        conn: &mut crate::backend::redis::RedisConn,
        stale: Vec<(String, String)>,
        report: &mut TransferReconcile,
    ) -> Result<(), CoordError> {
        if stale.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for (key, _) in &stale {
            pipe.unlink(key);
        }
        let removed: Vec<i64> = pipe.query_async(conn).await?;
        for ((_, token), n) in stale.into_iter().zip(removed) {
            if n > 0 && !report.removed.contains(&token) {
                report.removed.push(token);
            }
        }
        Ok(())
    }
}

/// What keeps a marker.
enum Liveness<'a> {
    /// Its transfer's pending record.
    Pending,
    /// The caller's list of pending tokens.
    Listed(&'a HashSet<String>),
}
