//! A run from start to end: set up the scratch stores, create the characters, start the workers,
//! the shard hosts, the players, the scanner and the faults; play; settle; check; report.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::oneshot;
use tokio::time::Instant;
use uuid::Uuid;

use super::agent::Agent;
use super::checks::{self, Dangling, EndState, Observed};
use super::env::SimEnv;
use super::faults;
use super::host::Host;
use super::inbound::{Inbound, SettleStep};
use super::order_checks::{self, OrderObserved};
use super::report::SimReport;
use super::series;
use super::summary::{audit_counts, build_report, transfer_audit};
use super::world::{World, get};
use super::{SimConfig, SimError, SimProgress};
use shardkeep::character::NewCharacter;
use shardkeep::journal::{JournalStats, SessionJournal};
use shardkeep::retry::RetryStats;
use shardkeep_reference::game::Catalog;
use shardkeep_reference::game::items::ItemJson;
use shardkeep_reference::game::state::StateDocument;
use shardkeep_reference::game::world::{instance_entrance, reference_world};
use shardkeep_reference::shard::ZoneDirectory;

/// Signal channel depth of the retry queue (small, so the queue-full fault saturates it).
const SIGNAL_DEPTH: usize = 64;
/// Time between scans of the rows.
const SCAN_INTERVAL: Duration = Duration::from_secs(2);
/// The stretch the live saves-per-second rate is taken over.
const RATE_WINDOW: Duration = Duration::from_secs(3);
/// Bound on each wait of the settle phase.
const SETTLE_BOUND: Duration = Duration::from_secs(60);
/// Most reconciling passes of the settle (2 s apart).
const MOST_RECONCILES: usize = 10;

/// Runs a simulation against `database_url` and `redis_url` (a scratch database and namespace
/// are created and removed), reporting progress to `progress` twice a second.
pub async fn run(
    config: SimConfig,
    database_url: &str,
    redis_url: &str,
    progress: impl Fn(&SimProgress) + Send + Sync + 'static,
) -> Result<SimReport, SimError> {
    config.validate()?;
    let cluster = shardkeep::backend::redis::redis_seeds(redis_url).is_ok_and(|s| s.len() > 1);
    if config.faults.contains(super::Fault::RedisFailover) && !cluster {
        return Err(SimError::Setup(
            "the redis-failover fault needs a Redis Cluster: set REDIS_URL to its seed nodes \
             (comma-separated redis:// URLs)"
                .into(),
        ));
    }
    progress(&SimProgress {
        phase: "setup",
        duration: config.duration,
        ..SimProgress::default()
    });
    let run_id = Uuid::now_v7().simple().to_string()[20..].to_owned();
    let env = SimEnv::setup(
        database_url,
        config.pg_pooler,
        redis_url,
        &run_id,
        SIGNAL_DEPTH,
    )
    .await?;
    run_in(config, env, progress).await
}

/// Runs a simulation in embedded mode: everything in a scratch SQLite file under the system's
/// temporary directory (removed afterwards unless kept), no Postgres or Redis. The store-outage
/// faults fail every call of the file for their stretch.
pub async fn run_embedded(
    mut config: SimConfig,
    progress: impl Fn(&SimProgress) + Send + Sync + 'static,
) -> Result<SimReport, SimError> {
    config.embedded = true;
    config.validate()?;
    progress(&SimProgress {
        phase: "setup",
        duration: config.duration,
        ..SimProgress::default()
    });
    let run_id = Uuid::now_v7().simple().to_string()[20..].to_owned();
    let env = SimEnv::embedded(&run_id, SIGNAL_DEPTH).await?;
    run_in(config, env, progress).await
}

/// Runs the simulation in `env`, then tears it down.
async fn run_in(
    config: SimConfig,
    env: SimEnv,
    progress: impl Fn(&SimProgress) + Send + Sync + 'static,
) -> Result<SimReport, SimError> {
    let keep = config.keep;
    let world = match prepare(config, env).await {
        Ok(world) => world,
        Err((err, env)) => {
            env.teardown(keep).await;
            return Err(err);
        }
    };
    let workers = match super::workers::start_workers(&world).await {
        Ok(stats) => stats,
        Err(err) => {
            world.halt.cancel();
            world.env.teardown(keep).await;
            return Err(SimError::Setup(format!("starting the workers: {err}")));
        }
    };
    if let Err(err) = super::workers::start_serves(&world).await {
        world.halt.cancel();
        world.env.teardown(keep).await;
        return Err(err);
    }
    let report = play(Arc::clone(&world), workers, Arc::new(progress)).await;
    world.halt.cancel();
    // Let the workers see the halt and stop writing before the keys go.
    tokio::time::sleep(Duration::from_millis(500)).await;
    world.env.teardown(keep).await;
    Ok(report)
}

/// The starting state of a character: a few identified items, nothing earned yet.
fn starting_state(catalog: &Catalog) -> serde_json::Value {
    let item = |proto: &str| ItemJson {
        proto: proto.to_owned(),
        delta: Default::default(),
        contents: Vec::new(),
        id: Some(Uuid::now_v7()),
    };
    let mut doc = StateDocument::default();
    for proto in ["sword", "helm", "mail", "herb", "gem"] {
        if catalog.get(proto).is_some() {
            doc.inventory.push(item(proto));
        }
    }
    serde_json::to_value(doc).unwrap_or_else(|_| json!({}))
}

async fn prepare(config: SimConfig, env: SimEnv) -> Result<Arc<World>, (SimError, SimEnv)> {
    let catalog = Arc::new(Catalog::reference());
    let zones = reference_world(config.shards * config.zones_per_shard);
    let (instances, ring): (Vec<_>, Vec<_>) = zones.into_iter().partition(|z| z.instance);
    let mut shard_zones = vec![Vec::new(); config.shards];
    for (n, zone) in ring.into_iter().enumerate() {
        // Neighbouring zones belong to different shards, so zone crossings are handoffs.
        shard_zones[n % config.shards].push(zone);
    }
    for instance in instances {
        // An instance is shard-local: it lives beside the zone it is entered from.
        let host = instance_entrance(&instance).and_then(|entrance| {
            shard_zones
                .iter()
                .position(|zones| zones.iter().any(|z| z.id == entrance))
        });
        if let Some(host) = host {
            shard_zones[host].push(instance);
        }
    }
    let store = env.direct_characters();
    for index in 0..config.players {
        let agent = Agent::new(index, config.seed, config.shards);
        let created = store
            .create(&NewCharacter {
                character_id: agent.character_id,
                account_id: agent.account_id,
                name: agent.name.clone(),
                zone_ref: None,
                room_ref: None,
                state: starting_state(&catalog).into(),
                chargen: None,
                schema_version: 1,
            })
            .await;
        if let Err(err) = created {
            return Err((SimError::Setup(format!("creating characters: {err}")), env));
        }
    }
    Ok(Arc::new(World::new(
        config,
        env,
        ZoneDirectory::new(),
        catalog,
        shard_zones,
    )))
}

type Progress = Arc<dyn Fn(&SimProgress) + Send + Sync>;

async fn play(
    world: Arc<World>,
    (retry_stats, journal_stats): (Arc<RetryStats>, Arc<JournalStats>),
    progress: Progress,
) -> SimReport {
    let config = world.config.clone();
    for index in 0..config.shards {
        let host = Host::start(&world, index);
        tokio::spawn(host.run());
    }
    world.in_transit.store(config.players, Ordering::Relaxed);
    let ramp = 3000 / config.players.max(1) as u64;
    for index in 0..config.players {
        let agent = Agent::new(index, config.seed, config.shards);
        super::travel::go_offline(&world, agent, ramp * index as u64);
    }
    let observed = Arc::new(Mutex::new(Observed::default()));
    let order_observed = Arc::new(Mutex::new(OrderObserved::default()));
    let scanner = spawn_scanner(&world, &observed, &order_observed);
    super::vacuum::spawn_if_needed(&world).await;
    let plan = faults::plan(config.seed, config.duration, &config.faults, config.shards);
    let start = Instant::now();
    let injector = tokio::spawn(faults::inject(Arc::clone(&world), plan.clone(), start));
    let direct_journal = world.env.direct_journal();
    // The live rate is taken over the last few seconds: the hosts copy their savers' counters
    // once a second, all at once, so a half-second window read 0 every other time.
    let mut recent: std::collections::VecDeque<(Instant, u64)> = std::collections::VecDeque::new();
    let interval = series::interval_for(config.duration);
    let mut sampler = series::Sampler::default();
    let mut samples = Vec::new();
    let mut next_sample = interval;
    while start.elapsed() < config.duration {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let totals = world.saver_totals();
        let saves = totals.checkpoint_landed + totals.row_landed;
        recent.push_back((Instant::now(), saves));
        while recent.len() > 2 && recent[0].0.elapsed() > RATE_WINDOW {
            recent.pop_front();
        }
        let rate = recent.front().map_or(0, |(at, then)| {
            let secs = at.elapsed().as_secs_f64().max(0.001);
            (saves.saturating_sub(*then) as f64 / secs) as u64
        });
        let retry_depth = retry_depth(&world).await;
        let journal_depth = journal_depth(direct_journal.as_ref()).await;
        if start.elapsed() >= next_sample {
            next_sample += interval;
            let (table_bytes, redis_memory_bytes) = series::read_store_sizes(&world.env).await;
            let readings = series::StoreReadings {
                retry_depth,
                journal_depth,
                redis_memory_bytes,
                table_bytes,
            };
            let at = start.elapsed().as_secs_f64();
            let scanned = observed.lock().map_or(0, |o| o.approx_bytes());
            let checker = world.with_ledger(|l| l.approx_bytes() + scanned);
            samples.push(sampler.sample(at, saves, totals.write_latency, readings, checker));
        }
        progress(&SimProgress {
            phase: "play",
            elapsed: start.elapsed().min(config.duration),
            duration: config.duration,
            online: world.online_total(),
            saves_per_sec: rate,
            retry_depth,
            journal_depth,
            faults_injected: get(&world.counters.faults_injected),
        });
    }
    let stability = series::verdict_for(&samples, config.duration);
    let series = series::Series {
        interval_secs: interval.as_secs_f64(),
        samples,
        stability,
    };
    let report_progress = |phase: &'static str| {
        progress(&SimProgress {
            phase,
            elapsed: config.duration,
            duration: config.duration,
            online: world.online_total(),
            faults_injected: get(&world.counters.faults_injected),
            ..SimProgress::default()
        })
    };
    report_progress("settle");
    let settled = settle(&world, direct_journal.as_ref()).await;
    injector.abort();
    scanner.abort();
    // The serves stop once the stores are drained; their counts are the report's.
    let serves = match world.serves.get() {
        Some(fleet) => {
            fleet.stop().await;
            fleet.fill(&retry_stats, &journal_stats);
            Some(super::serves::no_live_work_taken(
                fleet,
                get(&world.counters.serves_killed),
            ))
        }
        None => None,
    };
    report_progress("check");
    let probe = world.env.probe();
    let rows = probe.read_rows().await.unwrap_or_default();
    let observed = {
        let mut observed = observed
            .lock()
            .map(|mut o| std::mem::take(&mut *o))
            .unwrap_or_default();
        observed.record(&rows);
        observed
    };
    let direct = world.env.direct_coord();
    order_checks::scan(&world.env, &probe, &direct, &order_observed).await;
    let order_observed = order_observed
        .lock()
        .map(|mut o| std::mem::take(&mut *o))
        .unwrap_or_default();
    let audit = audit_counts(&world).await;
    let transfer_audit = transfer_audit(&world).await;
    let (acked, destroyed, end_floors, placement_problems, claims, session_events) = world
        .with_ledger(|l| {
            (
                l.acked.clone(),
                l.destroyed.clone(),
                l.end_floors.clone(),
                l.placement_violations.clone(),
                l.claims.clone(),
                l.session_events.clone(),
            )
        })
        .unwrap_or_default();
    let rewards = world
        .with_ledger(|l| std::mem::take(&mut l.rewards))
        .unwrap_or_default();
    let item_loads = probe.read_item_loads().await.unwrap_or_default();
    let end = EndState {
        rows: &rows,
        observed: &observed,
        acked: &acked,
        end_floors: &end_floors,
        destroyed: &destroyed,
        transfer_audit: &transfer_audit,
        placement_problems: &placement_problems,
        dangling: &settled.dangling,
        rewards: &rewards,
        item_loads: &item_loads,
    };
    let releasers = world.env.probe().transfer_releasers().await;
    let crash_floors = world
        .with_ledger(|l| l.crash_floors.invariant(&releasers))
        .unwrap_or_else(|| super::crash_floors::CrashFloors::default().invariant(&releasers));
    let invariants = vec![
        checks::no_rollback(&end),
        crash_floors,
        checks::no_reward_twice(&end),
        checks::item_conservation(&end),
        checks::sessions_placed(&end, settled.sessions_checked),
        checks::nothing_dangling(&end),
        super::claims::no_superseded_handoff_adopted(&claims),
        order_checks::journal_order_kept(&world.env, &direct, &session_events, &order_observed)
            .await,
    ];
    let invariants: Vec<_> = invariants.into_iter().chain(serves).collect();
    let passed = invariants.iter().all(|i| i.holds) && rows.len() == config.players;
    let mut report = build_report(
        &world,
        &plan,
        &retry_stats,
        &journal_stats,
        audit,
        invariants,
        passed,
        observed.scans,
    );
    report.journal.dead_lettered = report
        .journal
        .dead_lettered
        .max(settled.dangling.journal.dead);
    // A claim settles the jobs still queued for the character it claims, dead-lettering what
    // cannot apply, outside any worker's counters: the table holds them all.
    let stored = probe
        .count("SELECT count(*) FROM persistence_job_dead_letters")
        .await
        .max(0);
    report.retry.dead_lettered = report
        .retry
        .dead_lettered
        .max(u64::try_from(stored).unwrap_or(0));
    report.series = series;
    report
}

fn spawn_scanner(
    world: &Arc<World>,
    observed: &Arc<Mutex<Observed>>,
    order_observed: &Arc<Mutex<OrderObserved>>,
) -> tokio::task::JoinHandle<()> {
    let world = Arc::clone(world);
    let observed = Arc::clone(observed);
    let order_observed = Arc::clone(order_observed);
    let coord = world.env.direct_coord();
    let probe = world.env.probe();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = world.halt.cancelled() => return,
                () = tokio::time::sleep(SCAN_INTERVAL) => {}
            }
            if let Ok(rows) = probe.read_rows().await
                && let Ok(mut observed) = observed.lock()
            {
                observed.record(&rows);
            }
            order_checks::scan(&world.env, &probe, &coord, &order_observed).await;
        }
    })
}

async fn retry_depth(world: &World) -> u64 {
    let n = world
        .env
        .probe()
        .count("SELECT count(*) FROM persistence_retry_jobs")
        .await;
    u64::try_from(n).unwrap_or(0)
}

async fn journal_depth(journal: Option<&SessionJournal>) -> u64 {
    match journal {
        Some(journal) => journal
            .queue()
            .depths()
            .await
            .map_or(0, |d| d.pending + d.processing),
        None => 0,
    }
}

/// What settling found.
struct Settled {
    dangling: Dangling,
    sessions_checked: u64,
}

/// Asks every host for one settle step and waits for the answers.
async fn each_host<T>(world: &World, step: impl Fn(oneshot::Sender<T>) -> SettleStep) -> Vec<T> {
    let mut replies = Vec::new();
    for host in world.host_ids() {
        let (tx, rx) = oneshot::channel();
        if world.send(&host, Inbound::Settle(step(tx))).is_ok() {
            replies.push(rx);
        }
    }
    let mut answers = Vec::new();
    for reply in replies {
        if let Ok(Ok(answer)) = tokio::time::timeout(SETTLE_BOUND, reply).await {
            answers.push(answer);
        }
    }
    answers
}

async fn wait_until(bound: Duration, mut done: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if done().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// Ends the run: faults healed, travellers landed, zombies fenced, placements re-asserted and
/// checked, shards shut down, workers drained, consumed markers reconciled.
async fn settle(world: &Arc<World>, journal: Option<&SessionJournal>) -> Settled {
    world.settling.store(true, Ordering::Relaxed);
    world.env.heal();
    world.hold_retry_worker(false);
    wait_until(SETTLE_BOUND, async || {
        world.in_transit.load(Ordering::Relaxed) == 0
    })
    .await;
    // Two passes at least; then more while zombies are still held (their flushes meet the
    // fence and evict them; a machine busy after the healed outages can take longer), up to a
    // bound, after which the placement check names each one left.
    for pass in 0..MOST_RECONCILES {
        let zombies: usize = each_host(world, SettleStep::Reconcile)
            .await
            .into_iter()
            .sum();
        tokio::time::sleep(Duration::from_secs(2)).await;
        if pass >= 1 && zombies == 0 {
            break;
        }
        if pass + 1 == MOST_RECONCILES {
            tracing::warn!(event = "sim_zombies_held_at_settle", zombies);
        }
    }
    each_host(world, SettleStep::RefreshPlacements).await;
    let checked = each_host(world, SettleStep::CheckPlacements).await;
    let sessions_checked = checked.iter().map(|(n, _)| *n).sum();
    let problems: Vec<String> = checked.into_iter().flat_map(|(_, p)| p).collect();
    world.with_ledger(|l| l.placement_violations = problems);
    each_host(world, SettleStep::Shutdown).await;
    wait_until(SETTLE_BOUND, async || {
        world.in_transit.load(Ordering::Relaxed) == 0
    })
    .await;
    let probe = world.env.probe();
    wait_until(SETTLE_BOUND, async || {
        let pending = probe
            .count("SELECT count(*) FROM persistence_retry_jobs")
            .await;
        pending == 0 && journal_depth(journal).await == 0
    })
    .await;
    let coord = world.env.direct_coord();
    wait_until(SETTLE_BOUND, async || {
        world.counters.transfers_awaiting.load(Ordering::Relaxed) == 0
    })
    .await;
    if let Err(err) = coord.transfer_markers_reconcile_pending(100_000).await {
        tracing::warn!(event = "sim_marker_reconcile_failed", error = %err);
    }
    let orphaned = world
        .with_ledger(|l| l.orphaned_transfers.clone())
        .unwrap_or_default();
    let (pending_transfers, stale_markers) = checks::transfer_leftovers(&coord, &orphaned)
        .await
        .unwrap_or((usize::MAX, usize::MAX));
    let count = |sql: &'static str| {
        let probe = probe.clone();
        async move { probe.count(sql).await }
    };
    let dangling = Dangling {
        retry_leased: count(
            "SELECT count(*) FROM persistence_retry_jobs WHERE lease_token IS NOT NULL",
        )
        .await,
        retry_pending: count("SELECT count(*) FROM persistence_retry_jobs").await,
        journal: match journal {
            Some(j) => j.queue().depths().await.unwrap_or_default(),
            None => Default::default(),
        },
        untaken_handoffs: checks::untaken_handoffs(&coord).await.unwrap_or(usize::MAX),
        pending_transfers,
        stale_markers,
    };
    Settled {
        dangling,
        sessions_checked,
    }
}
