//! Enqueues that arrive together are stored together: each caller's job waits in a list, and up
//! to [`MOST_INSERTING`] insert tasks each take what waits (bounded by rows and bytes) into one
//! statement and one commit, then tell every caller its outcome. A caller still returns only once
//! its own job is committed. If a batch fails, its jobs are stored one by one, so a job Postgres
//! refuses fails alone. The inserts run in tasks of their own: a caller that stops waiting (a
//! timeout) does not cut off the others' batch, and its own job may still be stored — as an
//! enqueue whose reply was lost, which the same job enqueued again stores once.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::job::PersistenceRetryJob;
use super::job_tx::JobStore;
use crate::batching::{BatchOp, Batcher, all_failed};

/// Most insert tasks at once: the next batch gathers while one commits.
pub(crate) const MOST_INSERTING: usize = 2;
/// Most jobs one statement stores.
const MOST_ROWS: usize = 64;
/// Most payload bytes one statement carries (see the settle's chunk size: a statement past one
/// TLS record stalls on the server's delayed ACK). A larger job goes alone.
const MOST_BYTES: usize = 12 * 1024;

type Outcome = Result<(), sqlx::Error>;

/// One job to store: due at `now`, about `bytes` on the wire.
pub(crate) struct Insert {
    job: PersistenceRetryJob,
    now: DateTime<Utc>,
    bytes: usize,
}

/// Inserts of retry jobs, many to a statement.
pub(crate) struct InsertOp {
    jobs: JobStore,
}

/// The jobs waiting to be stored, shared by a queue's clones.
pub(crate) type Coalescer = Batcher<InsertOp>;

/// Job inserts on `jobs`.
pub(crate) fn coalescer(jobs: JobStore) -> Arc<Coalescer> {
    Batcher::new(InsertOp { jobs }, MOST_INSERTING)
}

/// Stores `job` (due at `now`) with whatever else waits; resolves once it is committed or has
/// failed.
pub(crate) async fn insert_job(
    coalescer: &Arc<Coalescer>,
    job: &PersistenceRetryJob,
    now: DateTime<Utc>,
) -> Outcome {
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
    coalescer
        .submit(Insert {
            job: job.clone(),
            now,
            bytes,
        })
        .await
}

impl BatchOp for InsertOp {
    type Request = Insert;
    type Outcome = Outcome;

    fn fits(&self, batch: &[Insert], next: &Insert) -> bool {
        let bytes: usize = batch.iter().map(|i| i.bytes).sum();
        batch.len() < MOST_ROWS && bytes + next.bytes <= MOST_BYTES
    }

    async fn run(&self, batch: &[Insert]) -> Vec<Outcome> {
        let rows: Vec<(&PersistenceRetryJob, DateTime<Utc>)> =
            batch.iter().map(|i| (&i.job, i.now)).collect();
        match self.jobs.insert(&rows).await {
            Ok(()) => batch.iter().map(|_| Ok(())).collect(),
            // Postgres refused the statement or a value would not encode: one of the jobs may
            // be at fault, so each is stored on its own.
            Err(sqlx::Error::Database(_) | sqlx::Error::Encode(_)) if batch.len() > 1 => {
                let mut outcomes = Vec::with_capacity(batch.len());
                for row in &rows {
                    outcomes.push(self.jobs.insert(std::slice::from_ref(row)).await);
                }
                outcomes
            }
            // No connection (an outage, a full pool): every job fails at once, so callers learn
            // it within one attempt rather than one per job.
            Err(err) => all_failed(err, batch.len()),
        }
    }

    fn lost(&self) -> Outcome {
        Err(sqlx::Error::WorkerCrashed)
    }
}
