//! Faults that hit a host: a zombie copy left playing while its player logs in elsewhere, and a
//! crash that replaces the shard without flushing anything.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use rand::RngExt;
use uuid::Uuid;

use super::host::{Host, Phase};
use super::inbound::Inbound;
use super::observer::SimObserver;
use super::travel;
use super::world::{World, add_saver_stats, bump};
use shardkeep::live::{Cadence, LiveConfig};
use shardkeep_reference::live_shard::{LiveShard, LiveShardConfig};

impl Host {
    pub(super) fn zombify(&mut self, target: &str) {
        let candidates: Vec<Uuid> = self
            .bodies
            .iter()
            .filter(|(id, b)| {
                b.phase == (Phase::Attached { dead_until: None })
                    && b.agent.is_some()
                    && !self.shard.in_transfer(**id)
            })
            .map(|(id, _)| *id)
            .collect();
        if candidates.is_empty() {
            return;
        }
        let id = candidates[self.rng.random_range(0..candidates.len())];
        let Some(body) = self.bodies.get_mut(&id) else {
            return;
        };
        let Some(real) = body.agent.take() else {
            return;
        };
        body.agent = Some(real.zombie_copy());
        body.phase = Phase::Ghost;
        tracing::debug!(event = "sim_zombie", shard = %self.id, character = %id, %target);
        bump(&self.world.counters.zombies_made);
        self.world.in_transit.fetch_add(1, Ordering::Relaxed);
        travel::deliver(&self.world, target, Inbound::Login { agent: real });
    }

    /// Every item on this shard's floors, with who released it and at which epoch.
    pub(super) fn floor_releases(&self) -> Vec<(Uuid, Option<(Uuid, i64)>)> {
        let mut found = Vec::new();
        for (_, floor) in self.shard.floors() {
            for lying in floor {
                lying.item.walk(&mut |i| {
                    if let Some(id) = i.id {
                        found.push((id, i.released.as_ref().map(|r| (r.by, r.epoch))));
                    }
                });
            }
        }
        found
    }

    pub(super) fn floor_items(&self) -> Vec<Uuid> {
        self.floor_releases()
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    }

    pub(super) fn kill(&mut self, quiet: bool) {
        // Everything on this shard dies with it: floors, items between rows, and what its
        // players hold (what is durable elsewhere lives on there).
        let mut destroyed = self.floor_items();
        destroyed.extend(self.shard.held_items());
        destroyed.extend(self.shard.items_in_transfer());
        // Logouts whose final save has no outcome yet: what it carried dies with the shard
        // unless its checkpoint landed (then the next login holds it again).
        for leaving in self.leaving.values() {
            destroyed.extend(leaving.items.iter().copied());
        }
        destroyed.extend(self.shard.take_voided_items());
        let stats = self.shard.runtime().saver().stats();
        let transfers = self.shard.transfer_counts();
        self.world.with_ledger(|ledger| {
            ledger.destroyed.extend(destroyed);
            add_saver_stats(&mut ledger.saver_gone, &stats);
            ledger.transfers_gone.0 += transfers.0;
            ledger.transfers_gone.1 += transfers.1;
        });
        let crashed: Vec<(Uuid, i64)> = self
            .bodies
            .iter()
            .filter(|(_, b)| b.phase != Phase::Ghost)
            .filter_map(|(id, _)| self.shard.copy_of(*id).map(|c| (*id, c.owner_epoch)))
            .collect();
        let shard = self.id.clone();
        self.world.with_ledger(|ledger| {
            for (id, epoch) in &crashed {
                let what = format!("copy at epoch {epoch} killed on {shard}");
                ledger.crash_floors.crashed(*id, *epoch, &what);
            }
        });
        record_crash_floors(&self.world, &self.id, crashed);
        let bodies = std::mem::take(&mut self.bodies);
        for (_, body) in bodies {
            if body.phase == Phase::Ghost {
                continue;
            }
            if let Some(agent) = body.agent {
                let after = 300 + self.rng.random_range(0..1200);
                self.release(agent, after);
            }
        }
        let leaving = std::mem::take(&mut self.leaving);
        for (_, leaving) in leaving {
            if let Some(agent) = leaving.agent {
                self.release(agent, 500);
            }
        }
        let (replacement, observer) = boot(&self.world, self.index, quiet);
        let dead = std::mem::replace(&mut self.shard, replacement);
        dead.kill();
        std::mem::replace(&mut self.observer, observer).died(&self.world);
        if let Ok(mut live) = self.world.saver_live.lock() {
            live[self.index] = Default::default();
        }
        bump(&self.world.counters.shards_killed);
        tracing::info!(event = "sim_shard_killed", shard = %self.id);
    }
}

fn shard_config(world: &World, index: usize) -> LiveShardConfig {
    let zones = &world.shard_zones[index];
    let home = zones.first().map(|z| z.id.clone()).unwrap_or_default();
    let shard_id = World::shard_id(index);
    let pulse = world.config.pulse;
    let pulses = |n: u64| pulse.saturating_mul(u32::try_from(n).unwrap_or(u32::MAX));
    let mut live = LiveConfig::new(&shard_id);
    // The runtime is pulsed by the shard's tick, so its periods are the run's pulses.
    live.cadence = Cadence {
        pulse,
        checkpoint_every: pulses(world.config.checkpoint_pulses),
        flush_every: pulses(world.config.flush_pulses),
    };
    // Time is compressed: a logout save that a Postgres outage holds up for 2 s becomes a
    // durable retry job, as one held up for 60 s does in production.
    live.saver.final_outage_budget = FINAL_OUTAGE_BUDGET;
    live.io_timeout = travel::IO_BOUND;
    live.session_ttl = travel::SESSION_TTL;
    live.handoff_ttl = travel::HANDOFF_TTL;
    live.link_dead_for = pulses(super::play::LINK_DEAD_PULSES);
    let mut config = LiveShardConfig::new(&shard_id, &home);
    config.live = live;
    config.floor_lifetime_pulses = Some(
        (FLOOR_LIFETIME.as_millis() / pulse.as_millis().max(1))
            .try_into()
            .unwrap_or(u64::MAX),
    );
    config
}

/// How long an item put down stays on a floor before it decays: well inside the item-load
/// ledger's retention in a run (`env::RETENTION_NOTE`), so a phantom floor copy is always
/// gone before its owner's load record is pruned.
pub(super) const FLOOR_LIFETIME: std::time::Duration = std::time::Duration::from_secs(120);

/// How long a simulated logout save retries directly before it becomes a retry job.
const FINAL_OUTAGE_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);

/// Boots shard `index` with its zones on the run's stores (through the fault proxies), with a
/// new observer; `quiet` holds its cadences for a while (a replacement that a double crash
/// kills before it wrote anything).
pub(super) fn boot(world: &Arc<World>, index: usize, quiet: bool) -> (LiveShard, Arc<SimObserver>) {
    let observer = Arc::new(SimObserver::new(Arc::downgrade(world)));
    let mut config = shard_config(world, index);
    config.observer = Some(Arc::clone(&observer) as Arc<dyn shardkeep_reference::shard::Observer>);
    if quiet {
        config.quiet_pulses = QUIET_PULSES;
    }
    let shard = LiveShard::boot(
        &world.env.shard_services,
        config,
        world.shard_zones[index].clone(),
        Arc::clone(&world.catalog),
        world.directory.clone(),
    )
    .unwrap_or_else(|err| panic!("shard {index} cannot boot: {err}"));
    (shard, observer)
}

/// Pulses a double crash's replacement saves nothing on the cadences (longer than the gap
/// between its two crashes).
const QUIET_PULSES: u64 = 60;

/// Reads, in the background, the checkpoint of each character a crashed shard held: one still
/// guarded by the dead copy's epoch holds progress that copy made durable, which the next load
/// of the character must keep (a read that fails records nothing).
fn record_crash_floors(world: &Arc<World>, shard: &str, crashed: Vec<(Uuid, i64)>) {
    let checkpoints = world.env.sut_checkpoints();
    let world = Arc::clone(world);
    let shard = shard.to_owned();
    tokio::spawn(async move {
        for (id, epoch) in crashed {
            let read =
                tokio::time::timeout(std::time::Duration::from_secs(2), checkpoints.read_held(id))
                    .await;
            let Ok(Ok(Some(held))) = read else {
                continue;
            };
            // Only the copy's own dump: a checkpoint it took over at its load holds what an
            // earlier copy wrote, which this copy may not have loaded (the row can win).
            if held.held_by != epoch || held.snapshot.owner_epoch != epoch {
                continue;
            }
            let place = (held.snapshot.owner_epoch, held.snapshot.issue_mark);
            world.with_ledger(|ledger| {
                ledger.crash_floors.record(
                    id,
                    epoch,
                    place,
                    format!("copy at epoch {epoch} killed on {shard} (its checkpoint)"),
                )
            });
        }
    });
}
