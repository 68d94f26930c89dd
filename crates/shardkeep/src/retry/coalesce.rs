//! Enqueues that arrive together are stored together: each caller's job waits in a list, and up
//! to [`MOST_INSERTING`] insert tasks each take what waits (bounded by rows and bytes) into one
//! statement and one commit, then tell every caller its outcome. A caller still returns only once
//! its own job is committed. If a batch fails, its jobs are stored one by one, so a job Postgres
//! refuses fails alone. The inserts run in tasks of their own: a caller that stops waiting (a
//! timeout) does not cut off the others' batch, and its own job may still be stored — as an
//! enqueue whose reply was lost, which the same job enqueued again stores once.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio::sync::oneshot;

use super::job::PersistenceRetryJob;
use super::store;
use crate::backend::PostgresBackend;

/// Most insert tasks at once: the next batch gathers while one commits.
pub(crate) const MOST_INSERTING: usize = 2;
/// Most jobs one statement stores.
const MOST_ROWS: usize = 64;
/// Most payload bytes one statement carries (see the settle's chunk size: a statement past one
/// TLS record stalls on the server's delayed ACK). A larger job goes alone.
const MOST_BYTES: usize = 12 * 1024;

type Outcome = Result<(), sqlx::Error>;

#[derive(Debug)]
struct Waiting {
    job: PersistenceRetryJob,
    now: DateTime<Utc>,
    bytes: usize,
    done: oneshot::Sender<Outcome>,
}

#[derive(Debug, Default)]
struct State {
    waiting: std::collections::VecDeque<Waiting>,
    inserting: usize,
}

/// The jobs waiting to be stored, shared by a queue's clones.
#[derive(Debug, Default)]
pub(crate) struct Coalescer {
    state: Mutex<State>,
}

impl Coalescer {
    /// Stores `job` (due at `now`) with whatever else waits; resolves once it is committed or
    /// has failed.
    pub(crate) async fn insert(
        self: &Arc<Self>,
        pg: &PostgresBackend,
        job: &PersistenceRetryJob,
        now: DateTime<Utc>,
    ) -> Outcome {
        let (done, outcome) = oneshot::channel();
        let envelope = job.envelope();
        let bytes = [
            192,
            crate::model::encoded_len(job.payload().encoded()),
            envelope.idempotency_key.len(),
            job.source().len(),
            job.session_token().map_or(0, str::len),
            job.realm_id().map_or(0, str::len),
            job.payload().zone_id().map_or(0, str::len),
        ]
        .into_iter()
        .fold(0usize, usize::saturating_add);
        let start = {
            let mut state = self.lock();
            state.waiting.push_back(Waiting {
                job: job.clone(),
                now,
                bytes,
                done,
            });
            let start = state.inserting < MOST_INSERTING;
            if start {
                state.inserting += 1;
            }
            start
        };
        if start {
            tokio::spawn(Arc::clone(self).insert_waiting(pg.clone()));
        }
        outcome.await.unwrap_or(Err(sqlx::Error::WorkerCrashed))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a list and a count, consistent after every step: a panic elsewhere
        // while holding the lock leaves nothing half-done.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes the next batch; none when nothing waits (this task then ends).
    fn take_batch(&self) -> Vec<Waiting> {
        let mut state = self.lock();
        let mut batch = Vec::new();
        let mut bytes = 0;
        while let Some(next) = state.waiting.front() {
            if !batch.is_empty() && (batch.len() >= MOST_ROWS || bytes + next.bytes > MOST_BYTES) {
                break;
            }
            bytes += next.bytes;
            batch.extend(state.waiting.pop_front());
        }
        if batch.is_empty() {
            state.inserting -= 1;
        }
        batch
    }

    async fn insert_waiting(self: Arc<Self>, pg: PostgresBackend) {
        let mut slot = Slot {
            coalescer: Arc::clone(&self),
            pg: pg.clone(),
            held: true,
        };
        loop {
            let batch = self.take_batch();
            if batch.is_empty() {
                slot.held = false;
                return;
            }
            let rows: Vec<(&PersistenceRetryJob, DateTime<Utc>)> =
                batch.iter().map(|w| (&w.job, w.now)).collect();
            let together = insert(&pg, &rows).await;
            drop(rows);
            match together {
                Ok(()) => batch.into_iter().for_each(|w| drop(w.done.send(Ok(())))),
                // Postgres refused the statement or a value would not encode: one of the jobs
                // may be at fault, so each is stored on its own.
                Err(sqlx::Error::Database(_) | sqlx::Error::Encode(_)) if batch.len() > 1 => {
                    for waiting in batch {
                        let alone = insert(&pg, &[(&waiting.job, waiting.now)]).await;
                        let _ = waiting.done.send(alone);
                    }
                }
                // No connection (an outage, a full pool): every job fails at once, so callers
                // learn it within one attempt rather than one per job.
                Err(err) => {
                    let reason = err.to_string();
                    let mut batch = batch.into_iter();
                    if let Some(first) = batch.next() {
                        let _ = first.done.send(Err(err));
                    }
                    for waiting in batch {
                        let lost = std::io::Error::other(reason.clone());
                        let _ = waiting.done.send(Err(sqlx::Error::Io(lost)));
                    }
                }
            }
        }
    }
}

/// An insert task's place among the [`MOST_INSERTING`]. A task that ends without handing it back
/// (a panic, an abort) gives it up on drop, and a new task takes over what waits.
struct Slot {
    coalescer: Arc<Coalescer>,
    pg: PostgresBackend,
    held: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let mut state = self.coalescer.lock();
        state.inserting = state.inserting.saturating_sub(1);
        if state.waiting.is_empty() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                state.inserting += 1;
                drop(state);
                runtime.spawn(Arc::clone(&self.coalescer).insert_waiting(self.pg.clone()));
            }
            // No runtime left: the waiting callers are told (their channels close).
            Err(_) => state.waiting.clear(),
        }
    }
}

async fn insert(pg: &PostgresBackend, rows: &[(&PersistenceRetryJob, DateTime<Utc>)]) -> Outcome {
    let mut conn = pg.pool().acquire().await?;
    store::insert_jobs(&mut conn, rows).await
}
