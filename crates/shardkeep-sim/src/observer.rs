//! What a shard's live-copy runtime tells the simulator: the row writes that landed (the
//! acknowledged versions no row may later fall behind), the closed streams made durable (the
//! cleanups of the session order checks), and the handoffs that left the shard and settled.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, Weak};

use uuid::Uuid;

use super::order_checks::SessionEvent;
use super::world::{World, bump};
use shardkeep::coord::SessionOrder;
use shardkeep::journal::SessionLifecycleEffectPlan;
use shardkeep::live::CopyId;
use shardkeep::saver::SaveReason;
use shardkeep_reference::shard::Observer;

/// One shard's observer (a new one per boot: a killed shard's handoffs die with it).
#[derive(Debug)]
pub(super) struct SimObserver {
    world: Weak<World>,
    /// Handoffs that left this shard and have not settled; `None` once the shard died.
    awaiting: Mutex<Option<HashSet<String>>>,
}

impl SimObserver {
    pub(super) fn new(world: Weak<World>) -> Self {
        Self {
            world,
            awaiting: Mutex::new(Some(HashSet::new())),
        }
    }

    /// A handoff left under `token`: the world waits for it to settle (or, when its shard died
    /// meanwhile, for its lifetime to end it).
    pub(super) fn left(&self, world: &World, token: &str) {
        let Ok(mut awaiting) = self.awaiting.lock() else {
            return;
        };
        match awaiting.as_mut() {
            Some(waiting) => {
                if waiting.insert(token.to_owned()) {
                    world
                        .counters
                        .transfers_awaiting
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
            None => orphaned(world, std::iter::once(token.to_owned())),
        }
    }

    /// The shard died: its handoffs will never settle here (nobody but their source completes
    /// them: their transfers end with their lifetime).
    pub(super) fn died(&self, world: &World) {
        let gone = self
            .awaiting
            .lock()
            .ok()
            .and_then(|mut awaiting| awaiting.take())
            .unwrap_or_default();
        world
            .counters
            .transfers_awaiting
            .fetch_sub(gone.len() as u64, Ordering::Relaxed);
        orphaned(world, gone);
    }
}

/// Handoffs whose source died before they settled.
fn orphaned(world: &World, tokens: impl IntoIterator<Item = String>) {
    let tokens: Vec<String> = tokens.into_iter().collect();
    world
        .counters
        .transfers_orphaned
        .fetch_add(tokens.len() as u64, Ordering::Relaxed);
    world.with_ledger(|ledger| ledger.orphaned_transfers.extend(tokens));
}

impl Observer for SimObserver {
    fn saved(&self, copy: CopyId, reason: SaveReason, version: i64) {
        let Some(world) = self.world.upgrade() else {
            return;
        };
        if reason.writes_row() {
            world.with_ledger(|ledger| {
                let acked = ledger.acked.entry(copy.character_id).or_insert(version);
                *acked = (*acked).max(version);
            });
        }
    }

    fn journaled(&self, character_id: Uuid, order: SessionOrder, plan: SessionLifecycleEffectPlan) {
        let Some(world) = self.world.upgrade() else {
            return;
        };
        let _ = plan;
        bump(&world.counters.journal_appended);
        world.with_ledger(|ledger| {
            ledger.session_events.push(SessionEvent {
                character_id,
                order,
                cleanup: true,
            })
        });
    }

    fn handed_off(&self, copy: CopyId, token: &str, activated: bool) {
        let Some(world) = self.world.upgrade() else {
            return;
        };
        tracing::debug!(event = "sim_transfer_settled", %token, character = %copy.character_id, activated);
        let removed = self
            .awaiting
            .lock()
            .is_ok_and(|mut awaiting| awaiting.as_mut().is_some_and(|w| w.remove(token)));
        if removed {
            world
                .counters
                .transfers_awaiting
                .fetch_sub(1, Ordering::Relaxed);
        }
        if activated {
            bump(&world.counters.transfers_completed);
        }
    }
}
