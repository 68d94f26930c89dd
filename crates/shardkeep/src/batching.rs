//! Requests that arrive together are carried out together: each caller's request waits in a
//! list, and up to a few tasks each take what waits (bounded by the operation: entries, bytes,
//! one per key) into one round trip, then tell every caller its own outcome. A caller still
//! returns only once its request is done. The round trips run in tasks of their own, so a caller
//! that stops waiting (a timeout) does not cut off the others' batch — its own request may still
//! be carried out, as one whose reply was lost.
//!
//! The claim of a login storm, item-load records and work-queue appends go through this.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// One kind of batched operation.
pub(crate) trait BatchOp: Send + Sync + 'static {
    /// One caller's request.
    type Request: Send + 'static;
    /// What one caller is told.
    type Outcome: Send + 'static;

    /// Whether `next` may join `batch` (never called for an empty batch: the first request
    /// always goes).
    fn fits(&self, batch: &[Self::Request], next: &Self::Request) -> bool;

    /// Carries out `batch`; one outcome per request, in order.
    fn run(&self, batch: &[Self::Request]) -> impl Future<Output = Vec<Self::Outcome>> + Send;

    /// The outcome of a request whose task stopped before answering (a panic, no runtime).
    fn lost(&self) -> Self::Outcome;
}

struct Waiting<O: BatchOp> {
    request: O::Request,
    done: oneshot::Sender<O::Outcome>,
}

struct State<O: BatchOp> {
    waiting: VecDeque<Waiting<O>>,
    running: usize,
}

/// The requests waiting for one operation, shared by the handle's clones.
pub(crate) struct Batcher<O: BatchOp> {
    state: Mutex<State<O>>,
    op: O,
    most_running: usize,
}

impl<O: BatchOp> std::fmt::Debug for Batcher<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("most_running", &self.most_running)
            .finish_non_exhaustive()
    }
}

impl<O: BatchOp> Batcher<O> {
    /// Batches for `op`, with at most `most_running` round trips at once (the next batch
    /// gathers while one is in flight).
    pub(crate) fn new(op: O, most_running: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                waiting: VecDeque::new(),
                running: 0,
            }),
            op,
            most_running: most_running.max(1),
        })
    }

    /// Carries out `request` with whatever else waits; resolves with its own outcome.
    pub(crate) async fn submit(self: &Arc<Self>, request: O::Request) -> O::Outcome {
        let (done, outcome) = oneshot::channel();
        let start = {
            let mut state = self.lock();
            state.waiting.push_back(Waiting { request, done });
            let start = state.running < self.most_running;
            if start {
                state.running += 1;
            }
            start
        };
        if start {
            // The slot exists before the task does: a task dropped before it first runs still
            // hands its place back (and another takes over what waits).
            let slot = Slot {
                batcher: Arc::clone(self),
                held: true,
                started: false,
            };
            tokio::spawn(run_waiting(slot));
        }
        outcome.await.unwrap_or_else(|_| self.op.lost())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<O>> {
        // A list and a count, consistent after every step: a panic elsewhere while holding the
        // lock leaves nothing half-done.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes the next batch, oldest first: its requests and where each answer goes. A request
    /// that does not fit keeps its place for the next batch (the search for ones that do looks
    /// a little further, past duplicate keys). Empty when nothing waits (the task then ends).
    fn take_batch(&self) -> (Vec<O::Request>, Vec<oneshot::Sender<O::Outcome>>) {
        let mut state = self.lock();
        let (mut requests, mut dones) = (Vec::new(), Vec::new());
        let mut later = VecDeque::new();
        while let Some(next) = state.waiting.pop_front() {
            // A caller that stopped waiting needs nothing done (its request may or may not be
            // carried out, as far as it knows): it is dropped here rather than carried out late.
            if next.done.is_closed() {
                continue;
            }
            if !requests.is_empty() && !self.op.fits(&requests, &next.request) {
                later.push_back(next);
                if later.len() >= LOOK_PAST {
                    break;
                }
                continue;
            }
            requests.push(next.request);
            dones.push(next.done);
        }
        while let Some(next) = later.pop_back() {
            state.waiting.push_front(next);
        }
        if requests.is_empty() {
            state.running -= 1;
        }
        (requests, dones)
    }
}

/// A batching task: takes batches until nothing waits.
async fn run_waiting<O: BatchOp>(mut slot: Slot<O>) {
    slot.started = true;
    let batcher = Arc::clone(&slot.batcher);
    loop {
        let (requests, dones) = batcher.take_batch();
        if requests.is_empty() {
            slot.held = false;
            return;
        }
        let mut outcomes = batcher.op.run(&requests).await.into_iter();
        for done in dones {
            let _ = done.send(outcomes.next().unwrap_or_else(|| batcher.op.lost()));
        }
    }
}

/// The outcomes of a batch that failed as a whole on Postgres (no connection, a full pool):
/// every request fails at once, the first with the error, the rest with its words.
pub(crate) fn all_failed<T>(err: sqlx::Error, count: usize) -> Vec<Result<T, sqlx::Error>> {
    let reason = err.to_string();
    let mut outcomes = Vec::with_capacity(count);
    outcomes.push(Err(err));
    outcomes
        .extend((1..count).map(|_| Err(sqlx::Error::Io(std::io::Error::other(reason.clone())))));
    outcomes
}

/// Requests passed over (not fitting the batch) before a batch stops looking for more.
const LOOK_PAST: usize = 64;

/// A task's place among the running ones. A task that ends without handing it back (a panic,
/// an abort) gives it up on drop, and a new task takes over what waits. A task dropped before
/// it ever ran was refused by a runtime shutting down: nothing takes over then (a new task
/// would be refused in turn), and the waiting callers are told.
struct Slot<O: BatchOp> {
    batcher: Arc<Batcher<O>>,
    held: bool,
    started: bool,
}

impl<O: BatchOp> Drop for Slot<O> {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let mut state = self.batcher.lock();
        state.running = state.running.saturating_sub(1);
        if state.waiting.is_empty() {
            return;
        }
        if !self.started {
            state.waiting.clear();
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                state.running += 1;
                drop(state);
                runtime.spawn(run_waiting(Slot {
                    batcher: Arc::clone(&self.batcher),
                    held: true,
                    started: false,
                }));
            }
            // No runtime left: the waiting callers are told (their channels close).
            Err(_) => state.waiting.clear(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;

    use super::*;

    /// Records each batch; keys that repeat may not share one; `u32::MAX` panics the run;
    /// [`GATED`] waits for the gate.
    const GATED: u32 = 1_000;

    #[derive(Default)]
    struct Recording {
        batches: StdMutex<Vec<Vec<u32>>>,
        gate: tokio::sync::Notify,
    }

    impl BatchOp for Arc<Recording> {
        type Request = u32;
        type Outcome = Option<u32>;

        fn fits(&self, batch: &[u32], next: &u32) -> bool {
            batch.len() < 8 && !batch.contains(next)
        }

        async fn run(&self, batch: &[u32]) -> Vec<Option<u32>> {
            tokio::task::yield_now().await;
            if batch.contains(&GATED) {
                self.gate.notified().await;
            }
            assert!(!batch.contains(&u32::MAX), "a failing operation");
            if let Ok(mut batches) = self.batches.lock() {
                batches.push(batch.to_vec());
            }
            batch.iter().map(|n| Some(n * 10)).collect()
        }

        fn lost(&self) -> Option<u32> {
            None
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_caller_gets_its_own_outcome_and_batches_respect_fits() {
        let recording = Arc::new(Recording::default());
        let batcher = Batcher::new(Arc::clone(&recording), 2);
        let calls = (0..100u32).map(|n| {
            let batcher = Arc::clone(&batcher);
            // Every key twice: the two must land in different batches.
            async move { (n % 50, batcher.submit(n % 50).await) }
        });
        for (n, outcome) in futures::future::join_all(calls).await {
            assert_eq!(outcome, Some(n * 10));
        }
        let batches = recording
            .batches
            .lock()
            .map(|b| b.clone())
            .unwrap_or_default();
        assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), 100);
        for batch in &batches {
            assert!(batch.len() <= 8, "{batch:?}");
            let mut keys = batch.clone();
            keys.sort_unstable();
            keys.dedup();
            assert_eq!(keys.len(), batch.len(), "a key twice in {batch:?}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_whose_caller_stopped_waiting_is_not_carried_out_late() {
        let recording = Arc::new(Recording::default());
        let batcher = Batcher::new(Arc::clone(&recording), 1);
        let first = {
            let batcher = Arc::clone(&batcher);
            tokio::spawn(async move { batcher.submit(GATED).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        // Waits behind the held batch, then its caller gives up.
        let given_up =
            tokio::time::timeout(std::time::Duration::from_millis(50), batcher.submit(5)).await;
        assert!(given_up.is_err());
        recording.gate.notify_one();
        assert_eq!(first.await.ok().flatten(), Some(GATED * 10));
        assert_eq!(batcher.submit(6).await, Some(60));
        let batches = recording
            .batches
            .lock()
            .map(|b| b.clone())
            .unwrap_or_default();
        assert!(
            batches.iter().all(|b| !b.contains(&5)),
            "carried out after its caller left: {batches:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_that_panics_answers_its_callers_as_lost_and_the_rest_go_on() {
        let recording = Arc::new(Recording::default());
        let batcher = Batcher::new(Arc::clone(&recording), 1);
        let doomed = {
            let batcher = Arc::clone(&batcher);
            tokio::spawn(async move { batcher.submit(u32::MAX).await })
        };
        assert_eq!(doomed.await.ok().flatten(), None, "lost");
        assert_eq!(batcher.submit(7).await, Some(70), "a new task took over");
    }

    #[test]
    fn a_runtime_shutting_down_mid_batch_tells_the_waiting_and_keeps_the_batcher_usable() {
        let recording = Arc::new(Recording::default());
        let batcher = Batcher::new(Arc::clone(&recording), 1);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        // One batch held in flight, one request waiting behind it, then the runtime goes.
        let held = Arc::clone(&batcher);
        drop(runtime.spawn(async move { held.submit(GATED).await }));
        std::thread::sleep(std::time::Duration::from_millis(50));
        let waiting = Arc::clone(&batcher);
        drop(runtime.spawn(async move { waiting.submit(7).await }));
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(runtime);
        assert!(batcher.lock().waiting.is_empty(), "no request left behind");
        assert_eq!(batcher.lock().running, 0, "no place left taken");
        let again = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(again.block_on(batcher.submit(8)), Some(80));
    }
}
