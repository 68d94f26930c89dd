//! The logout final saves still on their way to Postgres after the saver's queue let go of them
//! (retrying through an outage, or becoming a durable retry job). The saver's barrier waits for
//! them, so a shutdown never reports `Drained` while a logout's changes are not yet durable.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio::time::Instant;
use uuid::Uuid;

/// Most final saves kept retrying at once; one beyond it is given up (its checkpoint keeps it).
pub const MAX_PENDING_FINALS: usize = 10_000;

/// Final saves not yet durable, as a shutdown reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct UnsavedFinals {
    /// Logout saves still in the saver's queue, not yet attempted (neither their row nor their
    /// checkpoint is written).
    pub queued: usize,
    /// Logout saves attempted whose changes are in neither the row nor a retry job yet.
    pub pending: usize,
    /// How many of the `pending` ones the Redis checkpoint holds (a login prefers it over the
    /// older row).
    pub checkpointed: usize,
    /// Logout saves a shutdown could not even queue (the saver's queue stayed full to the end
    /// of its bound); their checkpoints hold what the last cadence wrote.
    pub dropped: usize,
}

impl UnsavedFinals {
    /// Logout saves not yet durable in Postgres: queued, pending or dropped.
    pub fn total(&self) -> usize {
        self.queued + self.pending + self.dropped
    }
}

#[derive(Debug, Default)]
struct Entries {
    next: u64,
    /// Ticket → (character, whether its checkpoint was written).
    live: HashMap<u64, (Uuid, bool)>,
    /// Final saves still in the saver's queue, per character.
    queued: HashMap<Uuid, usize>,
    /// Their total.
    queued_total: usize,
}

/// The registry of pending final saves, and of those still queued, by character. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub(super) struct PendingFinals {
    entries: Arc<Mutex<Entries>>,
    count: Arc<watch::Sender<usize>>,
}

impl Default for PendingFinals {
    fn default() -> Self {
        Self {
            entries: Arc::default(),
            count: Arc::new(watch::channel(0).0),
        }
    }
}

/// One pending final save; dropping it (landed, fenced, queued as a job, or abandoned with the
/// shard) removes it from the registry.
#[derive(Debug)]
pub(super) struct PendingTicket {
    id: u64,
    registry: PendingFinals,
}

impl Drop for PendingTicket {
    fn drop(&mut self) {
        self.registry.end(self.id);
    }
}

impl PendingFinals {
    /// Final saves of `characters` entered the saver's queue.
    pub(super) fn queued(&self, characters: impl IntoIterator<Item = Uuid>) {
        if let Ok(mut entries) = self.entries.lock() {
            for character in characters {
                *entries.queued.entry(character).or_default() += 1;
                entries.queued_total += 1;
            }
        }
    }

    /// Queued final saves of `characters` were taken off the queue (by the drainer, or handed
    /// back by a full queue).
    pub(super) fn dequeued(&self, characters: impl IntoIterator<Item = Uuid>) {
        if let Ok(mut entries) = self.entries.lock() {
            for character in characters {
                let Some(n) = entries.queued.get_mut(&character) else {
                    continue;
                };
                *n -= 1;
                if *n == 0 {
                    entries.queued.remove(&character);
                }
                entries.queued_total -= 1;
            }
        }
    }

    /// True while a final save of `character_id` is queued or pending: its changes are in
    /// neither its row nor a retry job yet, so a claim now would load without them.
    pub(super) fn in_flight(&self, character_id: Uuid) -> bool {
        self.entries.lock().is_ok_and(|entries| {
            entries.queued.contains_key(&character_id)
                || entries.live.values().any(|(c, _)| *c == character_id)
        })
    }

    /// Registers a final save of `character_id`; `None` when [`MAX_PENDING_FINALS`] are pending.
    pub(super) fn begin(&self, character_id: Uuid, checkpointed: bool) -> Option<PendingTicket> {
        let Ok(mut entries) = self.entries.lock() else {
            return None;
        };
        if entries.live.len() >= MAX_PENDING_FINALS {
            return None;
        }
        entries.next += 1;
        let id = entries.next;
        entries.live.insert(id, (character_id, checkpointed));
        self.count.send_replace(entries.live.len());
        Some(PendingTicket {
            id,
            registry: self.clone(),
        })
    }

    fn end(&self, id: u64) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.live.remove(&id);
            self.count.send_replace(entries.live.len());
        }
    }

    /// What is queued and pending now.
    pub(super) fn unsaved(&self) -> UnsavedFinals {
        self.entries
            .lock()
            .map(|entries| UnsavedFinals {
                queued: entries.queued_total,
                pending: entries.live.len(),
                checkpointed: entries.live.values().filter(|(_, c)| *c).count(),
                dropped: 0,
            })
            .unwrap_or_default()
    }

    /// Waits until nothing is pending or `deadline` passes; true when nothing is pending.
    pub(super) async fn settled_by(&self, deadline: Instant) -> bool {
        let mut count = self.count.subscribe();
        tokio::time::timeout_at(deadline, count.wait_for(|n| *n == 0))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn tickets_count_until_dropped_and_the_wait_sees_the_last_one_go() {
        let pending = PendingFinals::default();
        let (one, two) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let a = pending.begin(one, true);
        let b = pending.begin(one, false);
        pending.queued([two, two, Uuid::from_u128(3)]);
        pending.dequeued([Uuid::from_u128(3)]);
        assert!(pending.in_flight(one) && pending.in_flight(two));
        assert!(!pending.in_flight(Uuid::from_u128(3)));
        assert_eq!(
            pending.unsaved(),
            UnsavedFinals {
                queued: 2,
                pending: 2,
                checkpointed: 1,
                dropped: 0,
            }
        );
        pending.dequeued([two, two, two]);
        assert!(
            !pending.in_flight(two),
            "dequeued more than queued is not negative"
        );
        let soon = Instant::now() + Duration::from_millis(20);
        assert!(!pending.settled_by(soon).await);
        drop(a);
        let waiter = {
            let pending = pending.clone();
            tokio::spawn(async move {
                pending
                    .settled_by(Instant::now() + Duration::from_secs(5))
                    .await
            })
        };
        assert!(pending.in_flight(one), "one ticket of it is still pending");
        drop(b);
        assert!(waiter.await.unwrap());
        assert!(!pending.in_flight(one));
        assert_eq!(pending.unsaved(), UnsavedFinals::default());
    }

    #[test]
    fn the_registry_is_bounded() {
        let pending = PendingFinals::default();
        let tickets: Vec<_> = (0..MAX_PENDING_FINALS)
            .map(|n| pending.begin(Uuid::from_u128(n as u128), true))
            .collect();
        assert!(tickets.iter().all(Option::is_some));
        assert!(pending.begin(Uuid::nil(), true).is_none());
    }
}
