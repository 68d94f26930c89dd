//! The end of a run on a host: reconcile (zombies meet their fence), re-assert and check
//! placements, and shut down (transfers settled, floors recorded, everyone logged out).

use std::sync::atomic::Ordering;
use std::time::Duration;

use uuid::Uuid;

use super::host::{Host, Phase};
use super::inbound::SettleStep;
use super::world::add_saver_stats;

impl Host {
    pub(super) async fn settle(&mut self, step: SettleStep) {
        match step {
            SettleStep::Reconcile(reply) => {
                self.shard.runtime().flush_all();
                let mut zombies = 0;
                for (id, body) in &self.bodies {
                    if body.phase == Phase::Ghost
                        && let Some(copy) = self.shard.copy_of(*id)
                        && !matches!(self.ghost(*id, copy.owner_epoch).await, Ghost::Owner)
                    {
                        zombies += 1;
                    }
                }
                let _ = reply.send(zombies);
            }
            SettleStep::RefreshPlacements(reply) => {
                self.shard.runtime().refresh_placements();
                self.shard
                    .runtime()
                    .placement_barrier(Duration::from_secs(5))
                    .await;
                let _ = reply.send(());
            }
            SettleStep::CheckPlacements(reply) => {
                let _ = reply.send(self.check_placements().await);
            }
            SettleStep::Shutdown(reply) => {
                self.shutdown().await;
                let _ = reply.send(());
            }
        }
    }

    /// Live sessions (attached or link-dead) whose placement record is missing or names another
    /// copy, and zombie copies still playing.
    async fn check_placements(&self) -> (u64, Vec<String>) {
        let placement = self.world.env.direct_placement();
        let mut problems = Vec::new();
        let mut checked = 0;
        for (id, body) in &self.bodies {
            let Some(copy) = self.shard.copy_of(*id) else {
                continue;
            };
            let epoch = copy.owner_epoch;
            if body.phase == Phase::Ghost {
                match self.ghost(*id, epoch).await {
                    Ghost::Owner => {}
                    Ghost::Superseded(owner) => {
                        problems.push(format!(
                            "{id}: a zombie copy at epoch {epoch} still plays on {} (the row's \
                             owner epoch is {owner:?})",
                            self.id
                        ));
                        continue;
                    }
                    Ghost::Unreadable(err) => {
                        problems.push(format!("{id}: row unreadable: {err}"));
                        continue;
                    }
                }
            }
            // Placement names the zone the copy is saved in (inside an instance, its entrance).
            let Some(zone) = self
                .shard
                .runtime()
                .anchor(copy)
                .ok()
                .and_then(|(anchor, _)| anchor.zone_ref)
            else {
                continue;
            };
            checked += 1;
            match placement.read(*id).await {
                Ok(Some(record))
                    if record.shard_id.as_deref() == Some(self.id.as_str())
                        && record.zone_id.as_deref() == Some(zone.as_str())
                        && record.owner_epoch == epoch => {}
                Ok(other) => problems.push(format!(
                    "{id}: live on {}/{zone} at epoch {epoch}, placement says {other:?}",
                    self.id
                )),
                Err(err) => problems.push(format!("{id}: placement unreadable: {err}")),
            }
        }
        (checked, problems)
    }

    pub(super) async fn shutdown(&mut self) {
        // Every pickup answers first (a transfer retries through an outage for its budget), so
        // the floors recorded are the last ones; one still unanswered is recorded destroyed
        // (a crash would take it: it is in no row until its commit lands).
        self.shard.settle(Duration::from_secs(40)).await;
        self.shard.tick();
        self.record_outcomes();
        let unanswered = self.shard.items_in_transfer();
        self.world
            .with_ledger(|ledger| ledger.destroyed.extend(unanswered));
        let floors = self.floor_releases();
        let bodies = std::mem::take(&mut self.bodies);
        for (_, body) in bodies {
            if body.phase != Phase::Ghost
                && let Some(agent) = body.agent
            {
                self.world.park(agent);
            }
        }
        let leaving: Vec<Uuid> = self.leaving.keys().copied().collect();
        for id in leaving {
            self.finish_logout(id);
        }
        let transfers = self.shard.transfer_counts();
        // The runtime logs every player out (its stream journaled, its final save queued) and
        // waits for the saves, journal entries, handoffs and placements.
        let report = self.shard.shutdown(Duration::from_secs(20)).await;
        tracing::info!(event = "sim_shard_shutdown", shard = %self.id, finalized = report.finalized,
            saver = ?report.saver, unsaved_finals = report.unsaved_finals.total(),
            unjournaled = report.unjournaled, unsettled_handoffs = report.unsettled_handoffs,
            placement = ?report.placement, unfinished_writes = report.unfinished_writes);
        self.world
            .counters
            .finals_unsaved_at_shutdown
            .fetch_add(report.unsaved_finals.total() as u64, Ordering::Relaxed);
        let stats = self.shard.runtime().saver().stats();
        self.world.with_ledger(|ledger| {
            ledger.destroyed.extend(floors.iter().map(|(id, _)| *id));
            ledger.end_floors.extend(floors);
            add_saver_stats(&mut ledger.saver_gone, &stats);
            ledger.transfers_gone.0 += transfers.0;
            ledger.transfers_gone.1 += transfers.1;
        });
        if let Ok(mut live) = self.world.saver_live.lock() {
            live[self.index] = Default::default();
        }
        self.world.online[self.index].store(0, Ordering::Relaxed);
    }
}

/// What a copy whose player went to log in elsewhere (a zombie in the making) is at the end.
enum Ghost {
    /// It still owns the character: the login elsewhere never claimed (it failed, and the
    /// settle parked the player), so it is a live session like any other.
    Owner,
    /// A newer claim superseded it (the row's owner epoch, or none for a row not found).
    Superseded(Option<i64>),
    /// The row could not be read.
    Unreadable(String),
}

impl Host {
    async fn ghost(&self, id: Uuid, epoch: i64) -> Ghost {
        let read = tokio::time::timeout(Duration::from_secs(5), self.world.store.version_of(id));
        match read.await {
            Ok(Ok(Some((_, owner)))) if owner == epoch => Ghost::Owner,
            Ok(Ok(found)) => Ghost::Superseded(found.map(|(_, owner)| owner)),
            Ok(Err(err)) => Ghost::Unreadable(err.to_string()),
            Err(_) => Ghost::Unreadable("timed out".into()),
        }
    }
}
