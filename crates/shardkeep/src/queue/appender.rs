//! Appends that arrive together go to Redis together (through [`crate::batching`]): up to
//! [`MOST_SENDING`] tasks each take what waits (bounded by entries and bytes) into one `LPUSH`
//! (one script for a capped queue, which takes what fits and refuses the rest), then tell every
//! caller its outcome. A caller still returns only once its own entry is in the list, so an
//! append made after another returned lands after it (one producer awaiting each append keeps
//! its order). Appends in flight together have no order between them: two batches may be sent
//! at once and land either way round.

use std::sync::Arc;

use redis::Script;

use crate::backend::RedisBackend;
use crate::batching::{BatchOp, Batcher};

/// Most send tasks at once: the next batch gathers while one is in flight.
const MOST_SENDING: usize = 2;
/// Most entries one command carries.
const MOST_ENTRIES: usize = 256;
/// Most bytes one command carries (a larger entry goes alone).
const MOST_BYTES: usize = 256 * 1024;

/// How one append ended.
#[derive(Debug, Clone)]
pub(super) enum Appended {
    /// In the pending list.
    Stored,
    /// Refused: the pending list is at its cap.
    Full,
    /// Redis failed; the entry may or may not be in the list.
    Failed {
        /// What Redis said.
        kind: redis::ErrorKind,
        /// Its words.
        detail: String,
    },
}

/// Appends of encoded entries to one pending list.
pub(super) struct AppendOp {
    redis: RedisBackend,
    pending: String,
    cap: Option<usize>,
    script: &'static Script,
}

/// A queue's appends, batched.
pub(super) type Appender = Batcher<AppendOp>;

/// Appends to `pending` (capped at `cap` entries when set, through `script`).
pub(super) fn appender(
    redis: RedisBackend,
    pending: String,
    cap: Option<usize>,
    script: &'static Script,
) -> Arc<Appender> {
    Batcher::new(
        AppendOp {
            redis,
            pending,
            cap,
            script,
        },
        MOST_SENDING,
    )
}

impl BatchOp for AppendOp {
    type Request = Vec<u8>;
    type Outcome = Appended;

    fn fits(&self, batch: &[Vec<u8>], next: &Vec<u8>) -> bool {
        let bytes: usize = batch.iter().map(Vec::len).sum();
        batch.len() < MOST_ENTRIES && bytes + next.len() <= MOST_BYTES
    }

    async fn run(&self, batch: &[Vec<u8>]) -> Vec<Appended> {
        match self.send(batch).await {
            Ok(accepted) => (0..batch.len())
                .map(|n| {
                    if n < accepted {
                        Appended::Stored
                    } else {
                        Appended::Full
                    }
                })
                .collect(),
            Err(err) => batch
                .iter()
                .map(|_| Appended::Failed {
                    kind: err.kind(),
                    detail: err.to_string(),
                })
                .collect(),
        }
    }

    fn lost(&self) -> Appended {
        Appended::Failed {
            kind: redis::ErrorKind::Io,
            detail: "the append task stopped".into(),
        }
    }
}

impl AppendOp {
    /// Sends one batch; how many of its entries (from the first) were stored.
    async fn send(&self, batch: &[Vec<u8>]) -> redis::RedisResult<usize> {
        // On a cluster an append is stored once a replica holds it too: a failover then keeps
        // it. Unconfirmed, the batch fails; appended again, an entry may be there twice, which
        // the queue's at-least-once delivery already allows.
        let mut pipe = redis::pipe();
        match self.cap {
            None => {
                let cmd = pipe.cmd("LPUSH").arg(&self.pending);
                for body in batch {
                    cmd.arg(body);
                }
                let (_,): (i64,) = self.redis.query_confirmed(pipe).await?;
                Ok(batch.len())
            }
            Some(cap) => {
                let mut call = self.script.prepare_invoke();
                call.key(&self.pending).arg(cap);
                for body in batch {
                    call.arg(body);
                }
                let accepted: i64 = self.redis.invoke_confirmed(self.script, &call).await?;
                Ok(usize::try_from(accepted).unwrap_or(0))
            }
        }
    }
}
