//! What the runtime still owes the stores: logout saves on their way (waiting for room in the
//! saver's queue, or in it without an answer yet, kept so a save the saver gives up becomes a
//! job here and a conflicting one is merged before it goes again) and closed streams whose
//! journal entry has not landed yet. Shutdown waits for both and reports what is left.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use uuid::Uuid;

use super::copies::CopyId;
use super::{Inner, LiveGame};
use crate::character::CharacterSnapshot;
use crate::saver::{SaveReason, Saver};

/// Final saves per saver queue entry when many are offered at once.
const FINAL_SLICE: usize = 256;

/// How a logout's final save ended, as far as [`super::Runtime::logout`] waited for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinalSave {
    /// In the row.
    Saved {
        /// The row's version now.
        version: i64,
    },
    /// A durable `gameplay_state` retry job (Postgres was out, or every rebase lost a race);
    /// the retry worker applies it under the copy's epoch fence.
    QueuedAsJob {
        /// The job.
        retry_job_id: Uuid,
    },
    /// A newer copy owns the character: nothing of this copy is written.
    Superseded,
    /// The character's row is gone.
    NotFound,
    /// No answer within the wait: the save is still on its way (queued, retrying through an
    /// outage, or becoming a job). It is never given up.
    Pending,
}

/// Logout saves on their way: waiting for room in the saver's queue, or in it without an answer
/// yet (kept, so a save the saver gives up becomes a job here), and who waits for each answer.
#[derive(Default)]
pub(crate) struct Finals {
    inner: Mutex<FinalsInner>,
}

#[derive(Default)]
struct FinalsInner {
    deferred: VecDeque<CharacterSnapshot>,
    /// By character: the copy's epoch and its final snapshot.
    retained: HashMap<Uuid, CharacterSnapshot>,
    /// Characters whose final save a task of the runtime is working on (a merge, a job).
    working: std::collections::HashSet<Uuid>,
    waiters: HashMap<CopyId, Vec<oneshot::Sender<FinalSave>>>,
}

impl Finals {
    fn lock(&self) -> std::sync::MutexGuard<'_, FinalsInner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes charge of a final save; its answer goes to the returned receiver.
    pub(crate) fn push(&self, snapshot: CharacterSnapshot) -> oneshot::Receiver<FinalSave> {
        let (tx, rx) = oneshot::channel();
        let copy = CopyId {
            character_id: snapshot.character_id,
            owner_epoch: snapshot.owner_epoch,
        };
        let mut finals = self.lock();
        finals.waiters.entry(copy).or_default().push(tx);
        finals
            .retained
            .insert(snapshot.character_id, snapshot.clone());
        finals.deferred.push_back(snapshot);
        rx
    }

    /// Offers the deferred finals to the saver, oldest first; a full queue keeps the rest for
    /// the next pulse, so a moment's backlog never costs a logout its delta.
    pub(crate) fn offer(&self, saver: &Saver) {
        let mut finals = self.lock();
        while !finals.deferred.is_empty() {
            let take = finals.deferred.len().min(FINAL_SLICE);
            let slice: Vec<CharacterSnapshot> = finals.deferred.drain(..take).collect();
            if let Err(back) = saver.offer_many(SaveReason::Final, slice) {
                for snapshot in back.into_iter().rev() {
                    finals.deferred.push_front(snapshot);
                }
                break;
            }
        }
    }

    /// The answer for `copy`'s final save arrived.
    pub(crate) fn resolve(&self, copy: CopyId, outcome: FinalSave) {
        let mut finals = self.lock();
        if finals
            .retained
            .get(&copy.character_id)
            .is_some_and(|s| s.owner_epoch == copy.owner_epoch)
        {
            finals.retained.remove(&copy.character_id);
        }
        for waiter in finals.waiters.remove(&copy).into_iter().flatten() {
            let _ = waiter.send(outcome.clone());
        }
    }

    /// Puts a rebased final save of a copy back in line (its answer still goes to whoever
    /// waits for the copy's logout).
    pub(crate) fn again(&self, snapshot: CharacterSnapshot) {
        let mut finals = self.lock();
        finals
            .retained
            .insert(snapshot.character_id, snapshot.clone());
        finals.deferred.push_back(snapshot);
    }

    /// The retained final of `copy` (the saver gave it up, or it lost a version race).
    pub(crate) fn retained(&self, copy: CopyId) -> Option<CharacterSnapshot> {
        self.lock()
            .retained
            .get(&copy.character_id)
            .filter(|s| s.owner_epoch == copy.owner_epoch)
            .cloned()
    }

    /// True while a final save of `character_id` is not answered: the saver then reports its
    /// conflicts back instead of rebasing it blindly.
    pub(crate) fn held(&self, character_id: Uuid) -> bool {
        self.lock().retained.contains_key(&character_id)
    }

    /// True while a final save of `character_id` waits here for room in the saver's queue or is
    /// being merged or made a job: a login must not claim the character meanwhile (the claim
    /// would load the older row and fence the save out). With the saver's own
    /// `final_in_flight`, this covers every step until the save is durable or answered.
    pub(crate) fn busy(&self, character_id: Uuid) -> bool {
        let finals = self.lock();
        finals.working.contains(&character_id)
            || finals
                .deferred
                .iter()
                .any(|s| s.character_id == character_id)
    }

    /// A task of the runtime takes `character_id`'s final save in hand (`true`) or lets go.
    pub(crate) fn working(&self, character_id: Uuid, on: bool) {
        let mut finals = self.lock();
        if on {
            finals.working.insert(character_id);
        } else {
            finals.working.remove(&character_id);
        }
    }

    /// Marks `character_id`'s final as being worked on (merged or made a job) until the guard
    /// answered is dropped, however the work ends (a stopped runtime drops it mid-way).
    pub(crate) fn hold_working(self: &Arc<Self>, character_id: Uuid) -> Working {
        self.working(character_id, true);
        Working {
            finals: Arc::clone(self),
            character_id,
        }
    }

    /// Finals not answered yet: in the runtime's hands, in the saver, or refused by a stopped
    /// saver.
    pub(crate) fn unanswered(&self) -> usize {
        self.lock().retained.len()
    }

    /// Finals in the runtime's hands: waiting for room in the saver's queue, or being merged
    /// or made a job.
    pub(crate) fn in_hand(&self) -> usize {
        let finals = self.lock();
        finals.deferred.len() + finals.working.len()
    }
}

/// Work a shutdown waits for, counted while it is on its way: closed streams whose journal
/// entry has not landed, handoffs whose source has not settled them.
pub(crate) struct Outstanding {
    pending: watch::Sender<usize>,
}

impl Default for Outstanding {
    fn default() -> Self {
        Self {
            pending: watch::channel(0).0,
        }
    }
}

impl Outstanding {
    fn begin(&self) {
        self.pending.send_modify(|n| *n += 1);
    }

    fn end(&self) {
        self.pending.send_modify(|n| *n = n.saturating_sub(1));
    }

    /// One piece of work, counted until the answer is dropped (whichever way its task ends).
    pub(crate) fn track(self: &std::sync::Arc<Self>) -> Tracked {
        self.begin();
        Tracked(std::sync::Arc::clone(self))
    }

    /// Waits until none is pending or `deadline`; how many are still pending.
    pub(crate) async fn settled_by(&self, deadline: tokio::time::Instant) -> usize {
        let mut pending = self.pending.subscribe();
        let _ = tokio::time::timeout_at(deadline, pending.wait_for(|n| *n == 0)).await;
        *self.pending.borrow()
    }
}

/// A piece of [`Outstanding`] work; dropping it ends it.
pub(crate) struct Tracked(std::sync::Arc<Outstanding>);

impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// A final being worked on, from [`Finals::hold_working`]: no longer once dropped.
pub(crate) struct Working {
    finals: Arc<Finals>,
    character_id: Uuid,
}

impl Drop for Working {
    fn drop(&mut self) {
        self.finals.working(self.character_id, false);
    }
}

/// The saver gave a final save up: it becomes a durable job here, retried until Postgres takes
/// it (or the runtime stops; its checkpoint holds it then).
pub(crate) fn final_as_job<G: LiveGame>(inner: &Arc<Inner<G>>, copy: CopyId) {
    let Some(snapshot) = inner.finals.retained(copy) else {
        // Answered meanwhile: in hand no more (its mark was set when the saver gave it up).
        inner.finals.working(copy.character_id, false);
        return;
    };
    let working = inner.finals.hold_working(copy.character_id);
    let background = inner.background.clone();
    let inner = Arc::clone(inner);
    background.spawn(async move {
        let _working = working;
        store_final_job(&inner, copy, &snapshot).await;
    });
}

/// Writes `snapshot` as a durable job, retrying until Postgres takes it or the runtime stops.
pub(crate) async fn store_final_job<G: LiveGame>(
    inner: &Arc<Inner<G>>,
    copy: CopyId,
    snapshot: &CharacterSnapshot,
) {
    let job = match crate::saver::final_job(snapshot) {
        Ok(job) => job,
        Err(err) => {
            tracing::error!(event = "final_job_invalid", character = %copy.character_id,
                error = %err, "its checkpoint holds the logout");
            return inner.finals.resolve(copy, FinalSave::Pending);
        }
    };
    let mut pause = Duration::from_millis(250);
    loop {
        let stored =
            tokio::time::timeout(inner.config.io_timeout, inner.stores.retry.enqueue(&job)).await;
        if matches!(stored, Ok(Ok(_))) {
            return inner.finals.resolve(
                copy,
                FinalSave::QueuedAsJob {
                    retry_job_id: job.retry_job_id(),
                },
            );
        }
        tokio::select! {
            () = inner.cancel.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(10));
    }
}
