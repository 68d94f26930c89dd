//! Appends that arrive together go to Redis together: each caller's encoded entry waits in a
//! list, and up to [`MOST_SENDING`] tasks each take what waits (bounded by entries and bytes)
//! into one `LPUSH` (one script for a capped queue), then tell every caller its outcome. A caller
//! still returns only once its own entry is in the list; entries keep the order they arrived in,
//! so one producer's appends keep theirs. The sends run in tasks of their own: a caller that
//! stops waiting does not cut off the others' batch (its own entry may still land, as an append
//! whose reply was lost).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use redis::Script;
use tokio::sync::oneshot;

use crate::backend::RedisBackend;

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

#[derive(Debug)]
struct Waiting {
    body: Vec<u8>,
    done: oneshot::Sender<Appended>,
}

#[derive(Debug, Default)]
struct State {
    waiting: VecDeque<Waiting>,
    sending: usize,
}

/// The entries waiting to be appended, shared by a queue's clones.
#[derive(Debug)]
pub(super) struct Appender {
    state: Mutex<State>,
    redis: RedisBackend,
    pending: String,
    cap: Option<usize>,
    script: &'static Script,
}

impl Appender {
    /// Appends to `pending` (capped at `cap` entries when set, through `script`).
    pub(super) fn new(
        redis: RedisBackend,
        pending: String,
        cap: Option<usize>,
        script: &'static Script,
    ) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::default(),
            redis,
            pending,
            cap,
            script,
        })
    }

    /// Appends `body` with whatever else waits; resolves once it is in the list, refused or
    /// failed.
    pub(super) async fn append(self: &Arc<Self>, body: Vec<u8>) -> Appended {
        let (done, outcome) = oneshot::channel();
        let start = {
            let mut state = self.lock();
            state.waiting.push_back(Waiting { body, done });
            let start = state.sending < MOST_SENDING;
            if start {
                state.sending += 1;
            }
            start
        };
        if start {
            tokio::spawn(Arc::clone(self).send_waiting());
        }
        outcome.await.unwrap_or(Appended::Failed {
            kind: redis::ErrorKind::Io,
            detail: "the append task stopped".into(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A list and a count, consistent after every step: a panic elsewhere while holding the
        // lock leaves nothing half-done.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes the next batch, oldest first; none when nothing waits (the task then ends).
    fn take_batch(&self) -> Vec<Waiting> {
        let mut state = self.lock();
        let mut batch = Vec::new();
        let mut bytes = 0;
        while let Some(next) = state.waiting.front() {
            if !batch.is_empty()
                && (batch.len() >= MOST_ENTRIES || bytes + next.body.len() > MOST_BYTES)
            {
                break;
            }
            bytes += next.body.len();
            batch.extend(state.waiting.pop_front());
        }
        if batch.is_empty() {
            state.sending -= 1;
        }
        batch
    }

    async fn send_waiting(self: Arc<Self>) {
        let mut slot = Slot {
            appender: Arc::clone(&self),
            held: true,
        };
        loop {
            let batch = self.take_batch();
            if batch.is_empty() {
                slot.held = false;
                return;
            }
            let stored = self.send(&batch).await;
            for (n, waiting) in batch.into_iter().enumerate() {
                let outcome = match &stored {
                    Ok(accepted) if n < *accepted => Appended::Stored,
                    Ok(_) => Appended::Full,
                    Err(err) => Appended::Failed {
                        kind: err.kind(),
                        detail: err.to_string(),
                    },
                };
                let _ = waiting.done.send(outcome);
            }
        }
    }

    /// Sends one batch; how many of its entries (from the first) were stored.
    async fn send(&self, batch: &[Waiting]) -> redis::RedisResult<usize> {
        let mut conn = self.redis.conn();
        match self.cap {
            None => {
                let mut cmd = redis::cmd("LPUSH");
                cmd.arg(&self.pending);
                for waiting in batch {
                    cmd.arg(&waiting.body);
                }
                let _: i64 = cmd.query_async(&mut conn).await?;
                Ok(batch.len())
            }
            Some(cap) => {
                let mut call = self.script.prepare_invoke();
                call.key(&self.pending).arg(cap);
                for waiting in batch {
                    call.arg(&waiting.body);
                }
                let accepted: i64 = call.invoke_async(&mut conn).await?;
                Ok(usize::try_from(accepted).unwrap_or(0))
            }
        }
    }
}

/// A send task's place among the [`MOST_SENDING`]. A task that ends without handing it back
/// (a panic, an abort) gives it up on drop, and a new task takes over what waits.
struct Slot {
    appender: Arc<Appender>,
    held: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let mut state = self.appender.lock();
        state.sending = state.sending.saturating_sub(1);
        if state.waiting.is_empty() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                state.sending += 1;
                drop(state);
                runtime.spawn(Arc::clone(&self.appender).send_waiting());
            }
            // No runtime left: the waiting callers are told (their channels close).
            Err(_) => state.waiting.clear(),
        }
    }
}
