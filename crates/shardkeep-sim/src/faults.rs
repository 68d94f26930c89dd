//! The fault plan (pure: a function of the seed, the duration and the faults chosen) and its
//! injection. Outages cut the simulator's own proxies, never a shared server; every fault ends
//! before the run settles.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::rngs::Xoshiro256PlusPlus as SimRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use uuid::Uuid;

use super::env::{Engines, Outage};
use super::inbound::Inbound;
use super::world::{World, bump};
use super::{Fault, FaultSet};

/// One planned fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(super) struct PlannedFault {
    /// Offset from the start of play.
    #[serde(serialize_with = "as_secs")]
    pub(super) at: Duration,
    /// Which fault.
    #[serde(serialize_with = "as_name")]
    pub(super) fault: Fault,
    /// How long it lasts (outages and queue-full).
    #[serde(serialize_with = "as_secs")]
    pub(super) length: Duration,
    /// The shard it hits (kill-shard, zombie).
    pub(super) shard: Option<usize>,
}

fn as_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 10.0).round() / 10.0)
}

fn as_name<S: serde::Serializer>(f: &Fault, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(f.as_str())
}

/// Between the two crashes of a double crash.
const DOUBLE_CRASH_GAP: Duration = Duration::from_millis(2500);

/// Zombie copies one zombie fault makes.
pub(super) const ZOMBIES_PER_FAULT: usize = 3;
/// Undecodable retry rows and journal entries one poison fault plants.
pub(super) const POISON_PER_FAULT: usize = 3;

/// The faults of a run, in time order, recurring at a steady rate through it. They start after
/// 15 % of the play time (10 s at most) and stop 25 % before its end (20 s at most), so every
/// fault of a long soak keeps coming back and the run settles with every fault over.
pub(super) fn plan(
    seed: u64,
    duration: Duration,
    faults: &FaultSet,
    shards: usize,
) -> Vec<PlannedFault> {
    let mut rng = SimRng::seed_from_u64(seed ^ 0xFA17_5EED);
    let secs = duration.as_secs_f64();
    let (start, end) = ((secs * 0.15).min(10.0), (secs * 0.75).max(secs - 20.0));
    let last_end = (secs * 0.9).max(secs - 10.0);
    let mut planned = Vec::new();
    for fault in faults.iter() {
        let per_minute = match fault {
            Fault::KillShard
            | Fault::DoubleCrash
            | Fault::RedisOutage
            | Fault::PostgresOutage
            | Fault::QueueFull => 2.0,
            Fault::Zombie => 4.0,
            Fault::Poison | Fault::WorkerCrash | Fault::RedisFailover | Fault::KillServe => 2.0,
        };
        if fault == Fault::Zombie && shards < 2 {
            continue;
        }
        let count = ((secs / 60.0) * per_minute).round().max(1.0) as usize;
        for n in 0..count {
            // Spread evenly, jittered inside each slot.
            let slot = (end - start) / count as f64;
            let at = start + slot * n as f64 + rng.random_range(0.0..slot.max(0.001));
            let length = match fault {
                Fault::RedisOutage | Fault::PostgresOutage => {
                    rng.random_range(2.0..4.0f64).min(slot.max(0.5))
                }
                Fault::QueueFull => rng.random_range(3.0..5.0f64).min(slot.max(0.5)),
                _ => 0.0,
            }
            .min((last_end - at).max(0.0));
            let shard = matches!(fault, Fault::KillShard | Fault::DoubleCrash | Fault::Zombie)
                .then(|| rng.random_range(0..shards.max(1)));
            planned.push(PlannedFault {
                at: Duration::from_secs_f64(at),
                fault,
                length: Duration::from_secs_f64(length),
                shard,
            });
        }
    }
    planned.sort_by_key(|p| p.at);
    planned
}

/// Injects `planned` relative to `start`.
pub(super) async fn inject(
    world: Arc<World>,
    planned: Vec<PlannedFault>,
    start: tokio::time::Instant,
) {
    let mut tasks = Vec::new();
    for fault in planned {
        let world = Arc::clone(&world);
        tasks.push(tokio::spawn(async move {
            tokio::select! {
                () = world.halt.cancelled() => return,
                () = tokio::time::sleep_until(start + fault.at) => {}
            }
            if world.is_settling() {
                return;
            }
            bump(&world.counters.faults_injected);
            tracing::info!(event = "sim_fault", fault = %fault.fault, at = ?fault.at, length = ?fault.length);
            apply(&world, &fault).await;
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
}

async fn apply(world: &Arc<World>, fault: &PlannedFault) {
    let shard = World::shard_id(fault.shard.unwrap_or(0));
    match fault.fault {
        Fault::RedisOutage => outage(world, Outage::Redis, fault.length).await,
        Fault::PostgresOutage => outage(world, Outage::Postgres, fault.length).await,
        Fault::QueueFull => {
            world.hold_retry_worker(true);
            hold(world, fault.length).await;
            world.hold_retry_worker(false);
        }
        Fault::KillShard => {
            let _ = world.send(&shard, Inbound::Kill { quiet: false });
        }
        Fault::DoubleCrash => {
            // The replacement boots with its cadences held; it dies once its players are back
            // (they log in again 0.3–1.5 s after a crash) and before any cadence wrote.
            let _ = world.send(&shard, Inbound::Kill { quiet: true });
            tokio::select! {
                () = world.halt.cancelled() => return,
                () = tokio::time::sleep(DOUBLE_CRASH_GAP) => {}
            }
            if !world.is_settling() {
                let _ = world.send(&shard, Inbound::Kill { quiet: false });
            }
        }
        Fault::Zombie => {
            let hosts = world.host_ids();
            let Some(position) = hosts.iter().position(|h| *h == shard) else {
                return;
            };
            let target = hosts[(position + 1) % hosts.len()].clone();
            for _ in 0..ZOMBIES_PER_FAULT {
                let _ = world.send(
                    &shard,
                    Inbound::Zombify {
                        target: target.clone(),
                    },
                );
            }
        }
        Fault::Poison => plant_poison(world).await,
        Fault::WorkerCrash => crash_a_journal_worker(world).await,
        Fault::RedisFailover => fail_over_a_master(world).await,
        Fault::KillServe => kill_a_serve(world).await,
    }
}

/// SIGKILLs one of the run's `serve` processes and starts it again 1–2 s later: another
/// process recovers what it held (its journal entries once its heartbeat lapses, its leased
/// retry jobs once their lease runs out).
async fn kill_a_serve(world: &World) {
    let Some(fleet) = world.serves.get() else {
        return;
    };
    let pick = world.counters.serves_killed.load(Ordering::Relaxed) as usize;
    let down = Duration::from_millis(1000 + (pick as u64 * 397) % 1000);
    if let Some(index) = fleet.kill_and_restart(pick, down).await {
        bump(&world.counters.serves_killed);
        tracing::info!(event = "sim_serve_killed", serve = index);
    }
}

/// One of the cluster's replicas takes over its master's slots at once, without waiting for the
/// master to hand over (the master is then its replica). The clients follow the MOVED replies;
/// what the old master had not passed on is gone.
async fn fail_over_a_master(world: &World) {
    let pick = world.counters.redis_failovers.load(Ordering::Relaxed) as usize;
    let Some(servers) = world.env.servers() else {
        return;
    };
    match shardkeep_testkit::cluster::fail_over(&servers.redis_direct, pick).await {
        Ok(promoted) => {
            bump(&world.counters.redis_failovers);
            tracing::info!(event = "sim_redis_failover", promoted = %promoted);
        }
        Err(err) => tracing::warn!(event = "sim_redis_failover_failed", error = %err),
    }
}

/// Entries a crashing journal worker holds when it dies.
pub(super) const CRASH_HELD: usize = 64;

/// A second journal consumer competes with the run's worker for two seconds, leasing entries
/// as they arrive and finishing none, then dies holding them (no clean shutdown); the run's
/// worker goes on with later entries and recovers these once the dead consumer's heartbeat
/// lapses.
async fn crash_a_journal_worker(world: &World) {
    let queue = world.env.journal.queue();
    let Ok(mut doomed) = queue.consumer().await else {
        return;
    };
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    let mut held = 0;
    while held < CRASH_HELD && tokio::time::Instant::now() < until && !world.halt.is_cancelled() {
        match doomed.lease_blocking(Duration::from_millis(200)).await {
            Ok(Some(_)) => held += 1,
            Ok(None) => {}
            Err(_) => break,
        }
    }
    world
        .counters
        .journal_held_by_crash
        .fetch_add(held as u64, Ordering::Relaxed);
    doomed.abandon();
}

async fn hold(world: &World, length: Duration) {
    tokio::select! {
        () = world.halt.cancelled() => {}
        () = tokio::time::sleep(length) => {}
    }
}

async fn outage(world: &World, which: Outage, length: Duration) {
    world.outage_mark(true);
    world.env.outage_begin(which, length);
    hold(world, length).await;
    world.env.outage_end(which);
    world.outage_mark(false);
}

/// Plants retry rows whose payload does not decode and journal entries that are not entries,
/// straight into the stores (the way a bad deploy or a corrupted write would).
async fn plant_poison(world: &World) {
    let probe = world.env.probe();
    if let Some(character) = probe.any_character().await {
        for n in 0..POISON_PER_FAULT {
            let key = format!("poison:{}:{n}", Uuid::now_v7());
            if probe.plant_poison_job(character, &key).await {
                bump(&world.counters.poison_planted);
            }
        }
    }
    for n in 0..POISON_PER_FAULT {
        let body = format!("{{\"not\": \"an entry {n}\"");
        if plant_poison_entry(world, body.as_bytes()).await {
            bump(&world.counters.poison_planted);
        }
    }
}

/// Puts `body` at the newest end of the journal's pending entries, underneath the queue.
async fn plant_poison_entry(world: &World, body: &[u8]) -> bool {
    let queue = shardkeep::journal::JOURNAL_QUEUE;
    match &world.env.engines {
        Engines::Servers(s) => {
            let Ok(keys) = world.env.keys.queue(queue) else {
                return false;
            };
            let mut conn = s.redis_conn.clone();
            let planted: redis::RedisResult<i64> = redis::cmd("LPUSH")
                .arg(&keys.pending)
                .arg(body)
                .query_async(&mut conn)
                .await;
            planted.is_ok()
        }
        Engines::Embedded(f) => {
            sqlx::query("INSERT INTO queue_entries (queue, body) VALUES (?1, ?2)")
                .bind(shardkeep::queue::embedded_queue_name(
                    &world.env.keys,
                    queue,
                ))
                .bind(body)
                .execute(f.direct.pool())
                .await
                .is_ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_is_a_function_of_the_seed_and_ends_before_settling() {
        let duration = Duration::from_secs(60);
        let all = FaultSet::all();
        let a = plan(9, duration, &all, 3);
        assert_eq!(a, plan(9, duration, &all, 3));
        assert_ne!(a, plan(10, duration, &all, 3));
        for fault in Fault::ALL {
            assert!(a.iter().any(|p| p.fault == fault), "{fault} planned");
        }
        for p in &a {
            assert!(p.at >= Duration::from_secs(9), "{p:?}");
            assert!(p.at + p.length <= Duration::from_secs(54), "{p:?}");
            assert!(p.shard.is_none_or(|s| s < 3));
        }
        assert!(a.windows(2).all(|w| w[0].at <= w[1].at));
    }

    #[test]
    fn a_soak_keeps_every_fault_coming_back_until_near_its_end() {
        let duration = Duration::from_secs(1800);
        let plan = plan(3, duration, &FaultSet::all(), 3);
        for fault in Fault::ALL {
            let at: Vec<Duration> = plan
                .iter()
                .filter(|p| p.fault == fault)
                .map(|p| p.at)
                .collect();
            assert!(at.len() >= 60, "{fault}: {}", at.len());
            assert!(at[0] <= Duration::from_secs(60), "{fault} starts early");
            assert!(
                at[at.len() - 1] >= Duration::from_secs(1740),
                "{fault} still comes in the last minutes"
            );
            // No gap longer than two slots: the fault recurs through the run.
            let longest = at.windows(2).map(|w| w[1] - w[0]).max().unwrap();
            assert!(
                longest <= Duration::from_secs(120),
                "{fault}: gap {longest:?}"
            );
        }
        for p in &plan {
            assert!(p.at + p.length <= Duration::from_secs(1790), "{p:?}");
        }
    }

    #[test]
    fn no_faults_plan_nothing_and_one_shard_makes_no_zombies() {
        assert!(plan(1, Duration::from_secs(60), &FaultSet::default(), 3).is_empty());
        let zombie: FaultSet = "zombie".parse().unwrap();
        assert!(plan(1, Duration::from_secs(60), &zombie, 1).is_empty());
    }
}
