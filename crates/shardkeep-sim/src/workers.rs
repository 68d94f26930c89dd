//! The workers `serve` runs, started in process for a run and connected through the fault
//! proxies: the retry worker, the journal worker and each shard's keyspace upkeep.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use uuid::Uuid;

use super::world::{World, bump};
use shardkeep::character::CharacterStore;
use shardkeep::clock::SystemClock;
use shardkeep::coord::{InstanceRecord, run_maintenance};
use shardkeep::journal::{JournalStats, JournalWorker, JournalWorkerConfig};
use shardkeep::retry::{RetryStats, RetryWorker, RetryWorkerConfig};

/// How often each shard runs its keyspace upkeep.
const UPKEEP_PERIOD: Duration = Duration::from_secs(5);

/// The workers `serve` runs, in process and through the proxies.
pub(super) fn start_workers(world: &Arc<World>) -> (Arc<RetryStats>, Arc<JournalStats>) {
    let env = &world.env;
    let mut retry_config = RetryWorkerConfig::new("sim-retry-worker");
    retry_config.poll_interval = Duration::from_secs(1);
    retry_config.lease = Duration::from_secs(10);
    let signals = world.signals.lock().ok().and_then(|mut s| s.take());
    let mut retry_stats = Arc::new(RetryStats::default());
    if let Some(signals) = signals {
        let worker = RetryWorker::new(
            env.pg.clone(),
            shardkeep_reference::game::ReferenceModel::handle(),
            signals,
            retry_config,
            Arc::new(SystemClock),
        );
        retry_stats = worker.stats();
        // The loop `serve` runs; the queue-full fault holds it through its pause handle.
        let _ = world.retry_pause.set(worker.pause_handle());
        tokio::spawn(worker.run(world.halt.child_token()));
    }
    let journal_worker = JournalWorker::new(
        env.journal.clone(),
        env.coord.clone(),
        CharacterStore::new(env.pg.clone()),
        JournalWorkerConfig {
            recovery_interval: Duration::from_secs(2),
            ..JournalWorkerConfig::default()
        },
    );
    let journal_stats = journal_worker.stats();
    tokio::spawn(journal_worker.run(world.halt.child_token()));
    for index in 0..world.config.shards {
        start_upkeep(world, index);
    }
    start_bookkeeping_prune(world);
    (retry_stats, journal_stats)
}

/// The bookkeeping prune a `serve` instance runs, on the upkeep cadence, through the proxied
/// Postgres connection (its outages hit it too).
fn start_bookkeeping_prune(world: &Arc<World>) {
    let counters = Arc::clone(world);
    tokio::spawn(shardkeep::character::run_bookkeeping_prune(
        shardkeep::character::Bookkeeping::new(world.env.pg.clone()),
        shardkeep::character::BookkeepingRetention::default(),
        UPKEEP_PERIOD,
        world.halt.child_token(),
        move |pass| {
            if let Ok(report) = pass {
                counters
                    .counters
                    .bookkeeping_pruned
                    .fetch_add(report.effects + report.item_loads, Ordering::Relaxed);
            }
        },
    ));
}

/// Each shard's keyspace upkeep (registry heartbeat, transfer-marker reconciliation, presence
/// and registry pruning) on the cadence a game server would run it, through the Redis proxy.
fn start_upkeep(world: &Arc<World>, index: usize) {
    let shard_id = World::shard_id(index);
    let record = InstanceRecord {
        instance_id: format!("sim-{shard_id}-{}", Uuid::now_v7().simple()),
        service: "game_server".into(),
        address: format!("sim://{shard_id}"),
        shard_id: Some(shard_id),
        registered_at: chrono::Utc::now(),
    };
    let counters = Arc::clone(world);
    tokio::spawn(run_maintenance(
        world.env.coord.clone(),
        record,
        UPKEEP_PERIOD,
        world.halt.child_token(),
        move |pass| {
            let c = &counters.counters;
            bump(&c.upkeep_passes);
            c.upkeep_failed_steps
                .fetch_add(u64::from(pass.failed_steps), Ordering::Relaxed);
            c.upkeep_markers_removed
                .fetch_add(pass.markers_removed as u64, Ordering::Relaxed);
            if pass.registered {
                bump(&c.upkeep_registrations);
            }
        },
    ));
}
