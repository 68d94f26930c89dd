//! A work queue in the embedded store's file (`queue_entries`, `queue_consumers`,
//! `queue_dead_letters`). What a Lua script does atomically on Redis is one write transaction
//! here, so the same decisions hold: a lease refreshes the consumer's heartbeat and takes the
//! oldest pending entries in one step; an entry moves (acked, retried, released, dead-lettered,
//! recovered) only while the consumer that asks still holds it; an incarnation whose id another
//! took over touches nothing.
//!
//! Entries are matched by their exact body within the holder's entries, as Redis matches list
//! elements, so a [`super::Leased`] needs nothing else to name its entry.

use std::sync::Arc;

use serde::Deserialize;
use sqlx::SqliteConnection;
use tokio::sync::Notify;
use uuid::Uuid;

use super::QueueError;
use crate::backend::SqliteBackend;
use crate::backend::sqlite::WriteTransaction;
use crate::clock::Clock;
use crate::ttl::Ttl;

/// Where a settled entry goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Destination {
    /// Back to pending, in its original order.
    Pending,
    /// Still held by the same consumer, with a new body.
    Held,
    /// To the dead letters, as the record with this id.
    Dead(Uuid),
}

/// How a heartbeat refresh ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Beat {
    /// Refreshed.
    Refreshed,
    /// The registration was gone and was written again.
    Reregistered,
    /// A live incarnation with another token holds the id.
    Lost,
}

/// One queue in the file. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct QueueFile {
    db: SqliteBackend,
    clock: Arc<dyn Clock>,
    queue: String,
    /// Woken when entries become pending, for blocking leases of this process.
    wake: Arc<Notify>,
}

/// Just the failure time of a dead letter body.
#[derive(Deserialize)]
struct FailedAt {
    failed_at: chrono::DateTime<chrono::Utc>,
}

impl QueueFile {
    pub(super) fn new(db: SqliteBackend, clock: Arc<dyn Clock>, queue: &str) -> Self {
        Self {
            db,
            clock,
            queue: queue.to_owned(),
            wake: Arc::new(Notify::new()),
        }
    }

    fn now(&self) -> i64 {
        self.clock.now().timestamp_micros()
    }

    fn deadline(&self, ttl: Ttl) -> i64 {
        crate::coord::embedded::expiry(self.now(), ttl)
    }

    /// Woken whenever entries become pending in this process.
    pub(super) fn wake(&self) -> &Notify {
        &self.wake
    }

    async fn begin(&self) -> Result<WriteTransaction, QueueError> {
        Ok(self.db.begin().await?)
    }

    /// Appends `bodies` at the newest end in one transaction, unless that would take pending
    /// past `cap`; false (nothing written) when it would.
    pub(super) async fn append(
        &self,
        bodies: &[Vec<u8>],
        cap: Option<usize>,
    ) -> Result<bool, QueueError> {
        let mut tx = self.begin().await?;
        if let Some(cap) = cap {
            let pending: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM queue_entries WHERE queue = ?1 AND holder IS NULL",
            )
            .bind(&self.queue)
            .fetch_one(&mut *tx)
            .await?;
            if usize::try_from(pending).unwrap_or(usize::MAX) + bodies.len() > cap {
                return Ok(false);
            }
        }
        for body in bodies {
            insert_pending(&mut tx, &self.queue, body).await?;
        }
        tx.commit().await?;
        self.wake.notify_waiters();
        Ok(true)
    }

    /// Whether any entry is pending (a read: a blocking lease asks before it writes).
    pub(super) async fn has_pending(&self) -> Result<bool, QueueError> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM queue_entries WHERE queue = ?1 AND holder IS NULL)",
        )
        .bind(&self.queue)
        .fetch_one(self.db.reader()?)
        .await?)
    }

    /// Pending, held and dead counts.
    pub(super) async fn depths(&self) -> Result<(u64, u64, u64), QueueError> {
        let (pending, held, dead): (i64, i64, i64) = sqlx::query_as(
            "SELECT
                 (SELECT count(*) FROM queue_entries WHERE queue = ?1 AND holder IS NULL),
                 (SELECT count(*) FROM queue_entries WHERE queue = ?1 AND holder IS NOT NULL),
                 (SELECT count(*) FROM queue_dead_letters WHERE queue = ?1)",
        )
        .bind(&self.queue)
        .fetch_one(self.db.reader()?)
        .await?;
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        Ok((count(pending), count(held), count(dead)))
    }

    /// Refreshes the heartbeat of consumer `id` for incarnation `token`.
    pub(super) async fn heartbeat(
        &self,
        id: &str,
        token: &str,
        ttl: Ttl,
    ) -> Result<Beat, QueueError> {
        let mut tx = self.begin().await?;
        let beat = beat(
            &mut tx,
            &self.queue,
            id,
            token,
            self.now(),
            self.deadline(ttl),
        )
        .await?;
        tx.commit().await?;
        Ok(beat)
    }

    /// Claims the id for `token` when no live incarnation holds it; otherwise the holder's
    /// remaining heartbeat in milliseconds.
    pub(super) async fn claim_identity(
        &self,
        id: &str,
        token: &str,
        ttl: Ttl,
    ) -> Result<Option<i64>, QueueError> {
        let mut tx = self.begin().await?;
        let now = self.now();
        let held: Option<i64> = sqlx::query_scalar(
            "SELECT beat_until FROM queue_consumers WHERE queue = ?1 AND id = ?2 AND beat_until > ?3",
        )
        .bind(&self.queue)
        .bind(id)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(until) = held {
            return Ok(Some((until - now) / 1000));
        }
        register(&mut tx, &self.queue, id, token, self.deadline(ttl)).await?;
        tx.commit().await?;
        Ok(None)
    }

    /// Acks `done` (one flag each: still held and removed) and leases up to `max` of the oldest
    /// pending entries for consumer `id`, refreshing its heartbeat, in one transaction; `None`
    /// when another incarnation holds the id (then nothing changed).
    pub(super) async fn ack_and_lease(
        &self,
        (id, token, ttl): (&str, &str, Ttl),
        done: &[&[u8]],
        max: usize,
    ) -> Result<Option<(Vec<bool>, Vec<Vec<u8>>)>, QueueError> {
        let mut tx = self.begin().await?;
        if beat(
            &mut tx,
            &self.queue,
            id,
            token,
            self.now(),
            self.deadline(ttl),
        )
        .await?
            == Beat::Lost
        {
            return Ok(None);
        }
        let mut acked = Vec::with_capacity(done.len());
        for raw in done {
            acked.push(remove_held(&mut tx, &self.queue, id, raw).await?.is_some());
        }
        let oldest: Vec<(i64, Vec<u8>)> = sqlx::query_as(
            "SELECT seq, body FROM queue_entries
              WHERE queue = ?1 AND holder IS NULL ORDER BY seq LIMIT ?2",
        )
        .bind(&self.queue)
        .bind(i64::try_from(max).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await?;
        if let (Some((first, _)), Some((last, _))) = (oldest.first(), oldest.last()) {
            sqlx::query(
                "UPDATE queue_entries SET holder = ?2
                  WHERE queue = ?1 AND holder IS NULL AND seq BETWEEN ?3 AND ?4",
            )
            .bind(&self.queue)
            .bind(id)
            .bind(first)
            .bind(last)
            .execute(&mut *tx)
            .await?;
        }
        let leased = oldest.into_iter().map(|(_, body)| body).collect();
        tx.commit().await?;
        Ok(Some((acked, leased)))
    }

    /// Removes the entries of `raws` held by `id`; one flag each.
    pub(super) async fn ack(&self, id: &str, raws: &[&[u8]]) -> Result<Vec<bool>, QueueError> {
        let mut tx = self.begin().await?;
        let mut acked = Vec::with_capacity(raws.len());
        for raw in raws {
            acked.push(remove_held(&mut tx, &self.queue, id, raw).await?.is_some());
        }
        tx.commit().await?;
        Ok(acked)
    }

    /// Moves the entry `raw` held by `id` to `destination` as `body`; false when `id` no longer
    /// holds it.
    pub(super) async fn settle(
        &self,
        id: &str,
        raw: &[u8],
        destination: Destination,
        body: &[u8],
    ) -> Result<bool, QueueError> {
        let mut tx = self.begin().await?;
        let Some(seq) = held_seq(&mut tx, &self.queue, id, raw).await? else {
            return Ok(false);
        };
        match destination {
            Destination::Pending | Destination::Held => {
                let holder = (destination == Destination::Held).then_some(id);
                sqlx::query("UPDATE queue_entries SET body = ?2, holder = ?3 WHERE seq = ?1")
                    .bind(seq)
                    .bind(body)
                    .bind(holder)
                    .execute(&mut *tx)
                    .await?;
            }
            Destination::Dead(dead_letter_id) => {
                sqlx::query("DELETE FROM queue_entries WHERE seq = ?1")
                    .bind(seq)
                    .execute(&mut *tx)
                    .await?;
                insert_dead(&mut tx, &self.queue, dead_letter_id, body).await?;
            }
        }
        tx.commit().await?;
        if destination == Destination::Pending {
            self.wake.notify_waiters();
        }
        Ok(true)
    }

    /// Returns every entry `id` holds to pending, in their original order; `None` when another
    /// incarnation holds the id. With `leave`, the consumer's registration goes too.
    pub(super) async fn hand_back(
        &self,
        id: &str,
        token: &str,
        leave: bool,
    ) -> Result<Option<usize>, QueueError> {
        let mut tx = self.begin().await?;
        let holder = live_token(&mut tx, &self.queue, id, self.now()).await?;
        if holder.is_some_and(|holder| holder != token) {
            return Ok(None);
        }
        let moved =
            sqlx::query("UPDATE queue_entries SET holder = NULL WHERE queue = ?1 AND holder = ?2")
                .bind(&self.queue)
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        if leave {
            sqlx::query("DELETE FROM queue_consumers WHERE queue = ?1 AND id = ?2")
                .bind(&self.queue)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        if moved > 0 {
            self.wake.notify_waiters();
        }
        Ok(Some(usize::try_from(moved).unwrap_or(usize::MAX)))
    }

    /// Registered consumers (at most `limit`), and the ids whose entries recovery may return:
    /// registrations past their heartbeat, and holders no registration names.
    pub(super) async fn lapsed(
        &self,
        limit: usize,
    ) -> Result<(usize, Vec<String>, usize), QueueError> {
        let reader = self.db.reader()?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let registered: i64 =
            sqlx::query_scalar("SELECT count(*) FROM queue_consumers WHERE queue = ?1")
                .bind(&self.queue)
                .fetch_one(reader)
                .await?;
        let mut lapsed: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM queue_consumers WHERE queue = ?1 AND beat_until <= ?2 ORDER BY id LIMIT ?3",
        )
        .bind(&self.queue)
        .bind(self.now())
        .bind(limit)
        .fetch_all(reader)
        .await?;
        let unregistered: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT holder FROM queue_entries e
              WHERE queue = ?1 AND holder IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM queue_consumers c
                                 WHERE c.queue = e.queue AND c.id = e.holder)
              LIMIT ?2",
        )
        .bind(&self.queue)
        .bind(limit)
        .fetch_all(reader)
        .await?;
        let found = unregistered.len();
        lapsed.extend(unregistered);
        Ok((usize::try_from(registered).unwrap_or(0), lapsed, found))
    }

    /// Returns the entries `consumer` holds, each as `successor` says (back to pending, or a
    /// dead letter with its id), and drops its registration, in one transaction. `holder`: the
    /// new incarnation's token when a restarted consumer takes its own id's entries back
    /// (refused unless it holds the id); `None` for recovery (refused while the heartbeat is
    /// live). `None` when refused; else (returned, dead-lettered).
    pub(super) async fn return_entries(
        &self,
        consumer: &str,
        holder: Option<&str>,
        successor: impl Fn(&[u8]) -> Result<(Vec<u8>, Option<Uuid>), QueueError>,
    ) -> Result<Option<(usize, usize)>, QueueError> {
        let mut tx = self.begin().await?;
        let live = live_token(&mut tx, &self.queue, consumer, self.now()).await?;
        if live.as_deref() != holder {
            return Ok(None);
        }
        let held: Vec<(i64, Vec<u8>)> = sqlx::query_as(
            "SELECT seq, body FROM queue_entries WHERE queue = ?1 AND holder = ?2 ORDER BY seq",
        )
        .bind(&self.queue)
        .bind(consumer)
        .fetch_all(&mut *tx)
        .await?;
        let (mut returned, mut dead) = (0, 0);
        for (seq, raw) in &held {
            let (body, dead_letter_id) = successor(raw)?;
            match dead_letter_id {
                Some(id) => {
                    sqlx::query("DELETE FROM queue_entries WHERE seq = ?1")
                        .bind(seq)
                        .execute(&mut *tx)
                        .await?;
                    insert_dead(&mut tx, &self.queue, id, &body).await?;
                    dead += 1;
                }
                None => {
                    sqlx::query("UPDATE queue_entries SET body = ?2, holder = NULL WHERE seq = ?1")
                        .bind(seq)
                        .bind(&body)
                        .execute(&mut *tx)
                        .await?;
                    returned += 1;
                }
            }
        }
        if holder.is_none() {
            sqlx::query("DELETE FROM queue_consumers WHERE queue = ?1 AND id = ?2")
                .bind(&self.queue)
                .bind(consumer)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        if returned > 0 {
            self.wake.notify_waiters();
        }
        Ok(Some((returned, dead)))
    }

    /// Dead-letter bodies, newest first, from `offset`, at most `limit`.
    pub(super) async fn dead_page(
        &self,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, QueueError> {
        Ok(sqlx::query_scalar(
            "SELECT body FROM queue_dead_letters WHERE queue = ?1 ORDER BY seq DESC LIMIT ?2 OFFSET ?3",
        )
        .bind(&self.queue)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .bind(i64::try_from(offset).unwrap_or(i64::MAX))
        .fetch_all(self.db.reader()?)
        .await?)
    }

    /// The dead letter with id `dead_letter_id`.
    pub(super) async fn dead_by_id(
        &self,
        dead_letter_id: Uuid,
    ) -> Result<Option<Vec<u8>>, QueueError> {
        Ok(sqlx::query_scalar(
            "SELECT body FROM queue_dead_letters WHERE queue = ?1 AND dead_letter_id = ?2",
        )
        .bind(&self.queue)
        .bind(dead_letter_id)
        .fetch_optional(self.db.reader()?)
        .await?)
    }

    /// Replaces the dead letter `raw` (id `dead_letter_id`) with the new pending entry `body`;
    /// false when it is no longer there (requeued or pruned meanwhile).
    pub(super) async fn requeue(
        &self,
        dead_letter_id: Uuid,
        raw: &[u8],
        body: &[u8],
    ) -> Result<bool, QueueError> {
        let mut tx = self.begin().await?;
        let removed = sqlx::query(
            "DELETE FROM queue_dead_letters
              WHERE queue = ?1 AND dead_letter_id = ?2 AND CAST(body AS BLOB) = ?3",
        )
        .bind(&self.queue)
        .bind(dead_letter_id)
        .bind(raw)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if removed == 0 {
            return Ok(false);
        }
        insert_pending(&mut tx, &self.queue, body).await?;
        tx.commit().await?;
        self.wake.notify_waiters();
        Ok(true)
    }

    /// Deletes up to `batch` of the oldest dead letters beyond the newest `keep`, and those
    /// that failed before `cutoff`; how many went.
    pub(super) async fn prune(
        &self,
        keep: usize,
        cutoff: chrono::DateTime<chrono::Utc>,
        batch: usize,
    ) -> Result<u64, QueueError> {
        let mut tx = self.begin().await?;
        let total: i64 =
            sqlx::query_scalar("SELECT count(*) FROM queue_dead_letters WHERE queue = ?1")
                .bind(&self.queue)
                .fetch_one(&mut *tx)
                .await?;
        let over = (total - i64::try_from(keep).unwrap_or(i64::MAX)).max(0);
        let batch = i64::try_from(batch).unwrap_or(i64::MAX);
        let done = sqlx::query(
            "DELETE FROM queue_dead_letters WHERE seq IN (
                 SELECT seq FROM queue_dead_letters WHERE queue = ?1
                  ORDER BY seq
                  LIMIT ?2)
                OR seq IN (
                 SELECT seq FROM queue_dead_letters WHERE queue = ?1 AND failed_at < ?3
                  ORDER BY seq LIMIT ?4)",
        )
        .bind(&self.queue)
        .bind(over.min(batch))
        .bind(cutoff.timestamp_micros())
        .bind(batch)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(done.rows_affected())
    }
}

async fn insert_pending(
    conn: &mut SqliteConnection,
    queue: &str,
    body: &[u8],
) -> Result<(), QueueError> {
    sqlx::query("INSERT INTO queue_entries (queue, body) VALUES (?1, ?2)")
        .bind(queue)
        .bind(body)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

async fn insert_dead(
    conn: &mut SqliteConnection,
    queue: &str,
    dead_letter_id: Uuid,
    body: &[u8],
) -> Result<(), QueueError> {
    let failed_at = serde_json::from_slice::<FailedAt>(body)
        .map(|f| f.failed_at.timestamp_micros())
        .unwrap_or(i64::MIN);
    sqlx::query(
        "INSERT INTO queue_dead_letters (queue, dead_letter_id, body, failed_at)
         VALUES (?1, ?2, ?3, ?4)",
    )
    .bind(queue)
    .bind(dead_letter_id)
    .bind(body)
    .bind(failed_at)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The sequence number of the entry `raw` that `id` holds.
async fn held_seq(
    conn: &mut SqliteConnection,
    queue: &str,
    id: &str,
    raw: &[u8],
) -> Result<Option<i64>, QueueError> {
    Ok(sqlx::query_scalar(
        "SELECT seq FROM queue_entries
          WHERE queue = ?1 AND holder = ?2 AND CAST(body AS BLOB) = ?3 LIMIT 1",
    )
    .bind(queue)
    .bind(id)
    .bind(raw)
    .fetch_optional(&mut *conn)
    .await?)
}

/// Deletes the entry `raw` that `id` holds; its sequence number when it was there.
async fn remove_held(
    conn: &mut SqliteConnection,
    queue: &str,
    id: &str,
    raw: &[u8],
) -> Result<Option<i64>, QueueError> {
    let Some(seq) = held_seq(conn, queue, id, raw).await? else {
        return Ok(None);
    };
    sqlx::query("DELETE FROM queue_entries WHERE seq = ?1")
        .bind(seq)
        .execute(&mut *conn)
        .await?;
    Ok(Some(seq))
}

/// The token of the incarnation whose live registration holds consumer id `id`.
async fn live_token(
    conn: &mut SqliteConnection,
    queue: &str,
    id: &str,
    now: i64,
) -> Result<Option<String>, QueueError> {
    Ok(sqlx::query_scalar(
        "SELECT token FROM queue_consumers WHERE queue = ?1 AND id = ?2 AND beat_until > ?3",
    )
    .bind(queue)
    .bind(id)
    .bind(now)
    .fetch_optional(&mut *conn)
    .await?)
}

/// Writes the registration of `id` for `token` with heartbeat deadline `until`.
async fn register(
    conn: &mut SqliteConnection,
    queue: &str,
    id: &str,
    token: &str,
    until: i64,
) -> Result<(), QueueError> {
    sqlx::query(
        "INSERT INTO queue_consumers (queue, id, token, beat_until) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (queue, id) DO UPDATE SET token = excluded.token, beat_until = excluded.beat_until",
    )
    .bind(queue)
    .bind(id)
    .bind(token)
    .bind(until)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The heartbeat decision, inside a transaction: lost while a live registration carries
/// another token; otherwise the registration is (re)written with the new deadline.
async fn beat(
    conn: &mut SqliteConnection,
    queue: &str,
    id: &str,
    token: &str,
    now: i64,
    until: i64,
) -> Result<Beat, QueueError> {
    let stored: Option<(String, i64)> = sqlx::query_as(
        "SELECT token, beat_until FROM queue_consumers WHERE queue = ?1 AND id = ?2",
    )
    .bind(queue)
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let outcome = match &stored {
        Some((holder, live_until)) if holder != token && *live_until > now => {
            return Ok(Beat::Lost);
        }
        Some(_) => Beat::Refreshed,
        None => Beat::Reregistered,
    };
    register(conn, queue, id, token, until).await?;
    Ok(outcome)
}
