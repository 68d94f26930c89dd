//! The workers `serve` runs, started in process for a run from the run's services (connected
//! through the fault proxies), and each shard's keyspace upkeep.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use uuid::Uuid;

use super::world::{World, bump};
use shardkeep::coord::{InstanceRecord, run_maintenance};
use shardkeep::journal::JournalStats;
use shardkeep::retry::RetryStats;

/// Starts the run's `serve` processes (with `--serves`) and reads their counters every second
/// until the run halts.
pub(super) async fn start_serves(world: &Arc<World>) -> Result<(), super::SimError> {
    let (Some(binary), count) = (world.config.serve_binary.clone(), world.config.serves) else {
        return Ok(());
    };
    if count == 0 {
        return Ok(());
    }
    let Some((database_url, redis_url)) = world.env.serve_urls() else {
        return Err(super::SimError::Setup(
            "serve processes need Postgres and Redis (not embedded mode)".into(),
        ));
    };
    let launch = super::serves::ServeLaunch {
        binary,
        database_url,
        redis_url,
        namespace: world.env.keys.namespace().to_owned(),
        pg_pooler: world.config.pg_pooler.as_str().to_owned(),
        log_dir: world.env.serve_log_dir(),
    };
    let fleet = Arc::new(super::serves::ServeFleet::start(launch, count).await?);
    let _ = world.serves.set(Arc::clone(&fleet));
    let halt = world.halt.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = halt.cancelled() => return,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            fleet.read_metrics().await;
        }
    });
    Ok(())
}

/// How often each shard runs its keyspace upkeep (and `serve` its maintenance).
pub(super) const UPKEEP_PERIOD: Duration = Duration::from_secs(5);

/// The workers `serve` runs, spawned from the run's [`shardkeep::Services`] (built over the
/// proxies): the retry worker (the queue-full fault holds it through its pause handle), the
/// journal worker, maintenance, bookkeeping pruning and dead-letter retention; and each
/// shard's own keyspace upkeep.
pub(super) async fn start_workers(
    world: &Arc<World>,
) -> Result<(Arc<RetryStats>, Arc<JournalStats>), shardkeep::ServicesError> {
    let services = world.services.lock().ok().and_then(|mut s| s.take());
    let Some(mut services) = services else {
        return Err(shardkeep::ServicesError::WorkersRunning);
    };
    if world.config.serves > 0 {
        for index in 0..world.config.shards {
            start_upkeep(world, index);
        }
        return Ok((Arc::default(), Arc::default()));
    }
    let workers = services.spawn_workers(world.halt.child_token()).await?;
    let _ = world.retry_pause.set(workers.retry_pause.clone());
    let _ = world
        .bookkeeping_pruned
        .set(Arc::clone(&workers.bookkeeping_pruned));
    let stats = (
        Arc::clone(&workers.retry_stats),
        Arc::clone(&workers.journal_stats),
    );
    for index in 0..world.config.shards {
        start_upkeep(world, index);
    }
    Ok(stats)
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
