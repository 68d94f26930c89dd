//! Retry jobs end to end (enqueue → applied → deleted) for shardkeep, apalis-postgres 1.0 and
//! the raw per-job lifecycle, in one run against the same Postgres. Every system performs the
//! same job: an idempotent reward grant (record the key, add one experience point to a
//! character whose state document is a realistic one). Each queue runs twice: with 2 jobs per
//! character (many characters) and with 200 (a character that keeps earning: the per-character
//! cost must not grow). Then shardkeep runs at a steady half of its measured maximum for the
//! signal-to-start latency. Prints jobs per second, latencies and the ratio lines.
//!
//! `cargo bench -p shardkeep-sim --bench retry` (needs DATABASE_URL and REDIS_URL; `JOBS` and
//! `PRODUCERS` override the sizes). For investigations: `SHARDKEEP_ONLY=1` skips the peers,
//! `ENQUEUE_ONLY=1` measures the producers alone, `STEADY_ONLY=RATE` runs the paced run alone
//! with its latency percentiles, and `SETTLES` / `SIGNAL_WAIT_MS` override the worker's
//! `settles_in_flight` / `max_signal_wait`.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use apalis::prelude::*;
use apalis_postgres::{Config as ApalisConfig, PostgresStorage};
use chrono::Utc;
use shardkeep::clock::{Clock, SystemClock};
use shardkeep::retry::{
    IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload, RetryQueue,
    RetrySignals, RetryStats, RetryWorker, RetryWorkerConfig,
};
use shardkeep_sim::bench::BenchEnv;
use sqlx::PgPool;
use sqlx::migrate::MigrateDatabase;
use tokio::sync::Mutex;
use uuid::Uuid;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The peers' key table (shardkeep keeps its own bookkeeping beside the rows).
const GRANTS_TABLE: &str = "CREATE TABLE IF NOT EXISTS bench_reward_grants (
    idempotency_key TEXT PRIMARY KEY, character_id UUID NOT NULL,
    granted_at TIMESTAMPTZ NOT NULL DEFAULT now())";

const GRANT: &str = "WITH g AS (
    INSERT INTO bench_reward_grants (idempotency_key, character_id) VALUES ($1, $2)
    ON CONFLICT DO NOTHING RETURNING character_id
)
UPDATE characters c SET state = jsonb_set(c.state, '{experience}', to_jsonb((c.state->>'experience')::bigint + 1)),
       state_version = c.state_version + 1, updated_at = now()
  FROM g WHERE c.id = g.character_id";

struct Result_ {
    name: String,
    jobs: usize,
    elapsed: Duration,
    latencies_ms: Vec<f64>,
}

impl Result_ {
    fn rate(&self) -> f64 {
        self.jobs as f64 / self.elapsed.as_secs_f64()
    }

    fn percentile(&self, p: f64) -> f64 {
        let mut v = self.latencies_ms.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        if v.is_empty() {
            return f64::NAN;
        }
        v[((v.len() - 1) as f64 * p).round() as usize]
    }

    fn print(&self) {
        println!(
            "retry: {:<40} {:>6} jobs in {:>6.2} s = {:>8.0} jobs/s; signal-to-start p50 {:>7.1} ms, p99 {:>7.1} ms",
            self.name,
            self.jobs,
            self.elapsed.as_secs_f64(),
            self.rate(),
            self.percentile(0.5),
            self.percentile(0.99)
        );
    }
}

fn micros_now() -> i64 {
    Utc::now().timestamp_micros()
}

/// `n` characters named `prefix…`, each with the realistic state document of the ladder
/// benchmark at 0 experience.
async fn characters(pool: &PgPool, prefix: &str, n: usize) -> Vec<Uuid> {
    let mut state = shardkeep_sim::bench::ladder::template_state();
    state["experience"] = 0.into();
    sqlx::query(
        "INSERT INTO characters (id, account_id, name, state)
         SELECT gen_random_uuid(), gen_random_uuid(), $1 || g, $2 FROM generate_series(1, $3) g",
    )
    .bind(prefix)
    .bind(state)
    .bind(n as i64)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query_scalar("SELECT id FROM characters WHERE name LIKE $1 || '%' ORDER BY id")
        .bind(prefix)
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn experience_total(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT COALESCE(sum((state->>'experience')::bigint), 0)::bigint FROM characters",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A one-experience reward grant for `character`, issued by its (epoch 0) copy as `seq`.
fn reward_job(character: Uuid, key: String, seq: u64) -> PersistenceRetryJob {
    PersistenceRetryJob::new(
        PersistenceRetryPayload::effect(
            character,
            &shardkeep_reference::game::ReferenceEffect::CombatRewards {
                experience: 1,
                currency: 0,
                items: vec![],
            },
        )
        .unwrap(),
        IdempotencyEnvelope {
            idempotency_key: key,
            owner_epoch: 0,
            origin: Origin::CombatRewards,
            issued_at: Utc::now(),
            issue_seq: seq,
        },
        "bench",
        None,
    )
    .unwrap()
}

/// One shardkeep run: `jobs` reward grants spread over `chars`, each character's in its live
/// copy's issue order, enqueued by `producers` lanes as fast as they go or at `pace` jobs/s.
async fn shardkeep_run(
    env: &BenchEnv,
    pool: &PgPool,
    name: String,
    chars: &[Uuid],
    jobs: usize,
    producers: usize,
    pace: Option<f64>,
) -> Result_ {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    // The producers share the game server's pool (8); the worker has its own, as in `serve`
    // (16), the way apalis's workers have theirs.
    let (queue, signals) = RetryQueue::new(env.pg.clone(), 1024, Arc::clone(&clock));
    let worker = bench_worker(pool, signals, clock).await;
    let stats = worker.stats();
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(worker.run(cancel.clone()));
    let prefix = format!("sk{}-", Uuid::now_v7().simple());
    let started = Instant::now();
    let tokio_start = tokio::time::Instant::now();
    let mut lanes = Vec::new();
    for p in 0..producers {
        let queue = queue.clone();
        let chars = chars.to_vec();
        let prefix = prefix.clone();
        lanes.push(tokio::spawn(async move {
            for i in (p..jobs).step_by(producers) {
                if let Some(rate) = pace {
                    let due = tokio_start + Duration::from_secs_f64(i as f64 / rate);
                    tokio::time::sleep_until(due).await;
                }
                let key = format!("{prefix}{i}-{}", micros_now());
                let seq = (i / chars.len()) as u64 + 1;
                let job = reward_job(chars[i % chars.len()], key, seq);
                queue.enqueue(&job).await.unwrap();
            }
        }));
    }
    for lane in lanes {
        lane.await.unwrap();
    }
    // Completion is read off the worker's counters (polling the characters table would load
    // the server the run is measuring); the totals are checked once at the end.
    while RetryStats::get(&stats.applied) < jobs as u64 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    cancel.cancel();
    task.await.unwrap();
    let batches = RetryStats::get(&stats.batches).max(1);
    let mean_batch = RetryStats::get(&stats.claimed) as f64 / batches as f64;
    // A job's effect is recorded by the transaction that starts applying it: `applied_at` is
    // that transaction's start.
    let rows: Vec<(String, chrono::DateTime<Utc>)> = sqlx::query_as(
        "SELECT idempotency_key, applied_at FROM character_job_effects
          WHERE idempotency_key LIKE $1 || '%'",
    )
    .bind(&prefix)
    .fetch_all(pool)
    .await
    .unwrap();
    let latencies_ms = rows
        .iter()
        .filter_map(|(key, at)| {
            let enqueued: i64 = key.rsplit('-').next()?.parse().ok()?;
            Some((at.timestamp_micros() - enqueued) as f64 / 1000.0)
        })
        .collect();
    Result_ {
        name: format!("{name} ({mean_batch:.0}/batch)"),
        jobs,
        elapsed,
        latencies_ms,
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Grant {
    character_id: Uuid,
    key: String,
    enqueued_micros: i64,
}

async fn apalis_run(
    database_url: &str,
    pool: &PgPool,
    name: String,
    chars: &[Uuid],
    jobs: usize,
    producers: usize,
) -> Result_ {
    let (server, _) = database_url.rsplit_once('/').unwrap();
    let queue_url = format!("{server}/bench_apalis_{}", Uuid::new_v4().simple());
    sqlx::Postgres::create_database(&queue_url).await.unwrap();
    let queue_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .connect(&queue_url)
        .await
        .unwrap();
    PostgresStorage::setup(&queue_pool).await.unwrap();
    let config = ApalisConfig::default().queue("bench").batch_size(128);
    let storage: PostgresStorage<Grant> = PostgresStorage::new(&queue_pool).with_config(config);
    let done = Arc::new(AtomicUsize::new(0));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(jobs)));
    let started = Instant::now();
    let mut lanes = Vec::new();
    for p in 0..producers {
        let mut sink = storage.clone();
        let chars = chars.to_vec();
        lanes.push(tokio::spawn(async move {
            for i in (p..jobs).step_by(producers) {
                let grant = Grant {
                    character_id: chars[i % chars.len()],
                    key: format!("ap-{}-{i}", chars.len()),
                    enqueued_micros: micros_now(),
                };
                sink.push(grant).await.unwrap();
            }
        }));
    }
    #[derive(Clone)]
    struct Ctx {
        pool: PgPool,
        done: Arc<AtomicUsize>,
        latencies: Arc<Mutex<Vec<f64>>>,
        jobs: usize,
    }
    async fn handle(
        grant: Grant,
        ctx: Data<Ctx>,
        worker: WorkerContext,
    ) -> Result<(), BoxDynError> {
        ctx.latencies
            .lock()
            .await
            .push((micros_now() - grant.enqueued_micros) as f64 / 1000.0);
        sqlx::query(GRANT)
            .bind(&grant.key)
            .bind(grant.character_id)
            .execute(&ctx.pool)
            .await?;
        if ctx.done.fetch_add(1, Ordering::SeqCst) + 1 >= ctx.jobs {
            worker.stop()?;
        }
        Ok(())
    }
    let ctx = Ctx {
        pool: pool.clone(),
        done: Arc::clone(&done),
        latencies: Arc::clone(&latencies),
        jobs,
    };
    let worker = WorkerBuilder::new("bench-apalis")
        .backend(storage.with_pubsub())
        .data(ctx)
        .concurrency(16)
        .parallelize(tokio::spawn)
        .build(handle);
    let runner = tokio::spawn(worker.run());
    for lane in lanes {
        lane.await.unwrap();
    }
    while done.load(Ordering::SeqCst) < jobs {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    let _ = tokio::time::timeout(Duration::from_secs(10), runner).await;
    queue_pool.close().await;
    let _ = sqlx::Postgres::force_drop_database(&queue_url).await;
    let latencies_ms = latencies.lock().await.clone();
    Result_ {
        name,
        jobs,
        elapsed,
        latencies_ms,
    }
}

async fn raw_run(pool: &PgPool, chars: &[Uuid], jobs: usize, producers: usize) -> Result_ {
    sqlx::query("CREATE TABLE IF NOT EXISTS raw_jobs (id uuid PRIMARY KEY, character_id uuid NOT NULL, key text NOT NULL, enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(), leased_at timestamptz, lease_owner text)")
        .execute(pool)
        .await
        .unwrap();
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(jobs)));
    let started = Instant::now();
    let mut lanes = Vec::new();
    for p in 0..producers {
        let pool = pool.clone();
        let chars = chars.to_vec();
        let latencies = Arc::clone(&latencies);
        lanes.push(tokio::spawn(async move {
            for i in (p..jobs).step_by(producers) {
                let id = Uuid::now_v7();
                let key = format!("raw{producers}-{i}");
                let character = chars[i % chars.len()];
                sqlx::query("INSERT INTO raw_jobs (id, character_id, key) VALUES ($1, $2, $3)")
                    .bind(id).bind(character).bind(&key).execute(&pool).await.unwrap();
                let waited: f64 = sqlx::query_scalar(
                    "UPDATE raw_jobs SET leased_at = clock_timestamp(), lease_owner = 'raw' WHERE id = $1
                     RETURNING (extract(epoch FROM leased_at - enqueued_at) * 1000)::float8",
                )
                .bind(id).fetch_one(&pool).await.unwrap();
                sqlx::query(GRANT).bind(&key).bind(character).execute(&pool).await.unwrap();
                sqlx::query("DELETE FROM raw_jobs WHERE id = $1").bind(id).execute(&pool).await.unwrap();
                latencies.lock().await.push(waited);
            }
        }));
    }
    for lane in lanes {
        lane.await.unwrap();
    }
    let elapsed = started.elapsed();
    let latencies_ms = latencies.lock().await.clone();
    Result_ {
        name: if producers == 1 {
            "raw lifecycle, one at a time".into()
        } else {
            format!("raw lifecycle, {producers} lanes")
        },
        jobs,
        elapsed,
        latencies_ms,
    }
}

/// The worker under test, on a pool of its own (16, as in `serve`), with `SETTLES` and
/// `SIGNAL_WAIT_MS` applied.
async fn bench_worker(pool: &PgPool, signals: RetrySignals, clock: Arc<dyn Clock>) -> RetryWorker {
    let worker_pool = shardkeep::PostgresBackend::pool_options(16)
        .connect_with(pool.connect_options().as_ref().clone())
        .await
        .unwrap();
    let mut config = RetryWorkerConfig::new("bench");
    config.settles_in_flight = env_usize("SETTLES", config.settles_in_flight);
    if let Ok(ms) = std::env::var("SIGNAL_WAIT_MS") {
        config.max_signal_wait = Duration::from_millis(ms.parse().unwrap());
    }
    RetryWorker::new(
        shardkeep::PostgresBackend::from_pool(worker_pool),
        shardkeep_reference::game::ReferenceModel::handle(),
        signals,
        config,
        clock,
    )
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let database_url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let jobs = env_usize("JOBS", 20_000);
    let producers = env_usize("PRODUCERS", 8);
    let env = BenchEnv::setup(&database_url, &redis_url)
        .await
        .expect("bench environment");
    let pool = PgPool::connect_with(env_options(&database_url, &env))
        .await
        .unwrap();
    sqlx::query(GRANTS_TABLE).execute(&pool).await.unwrap();
    let many = characters(&pool, "many", (jobs / 2).max(1)).await;
    let few = characters(&pool, "few", (jobs / 200).max(1)).await;
    println!(
        "bench retry: {jobs} jobs per run, {producers} producers enqueueing one job at a time; \
         {} characters (2 jobs each) and {} characters (200 jobs each), realistic state documents",
        many.len(),
        few.len()
    );
    println!(
        "  (raw lifecycle: INSERT, lease UPDATE, the grant, DELETE as separate statements per job)"
    );
    // ENQUEUE_ONLY=1 measures the producers alone (no worker): the ceiling the queue can reach.
    if std::env::var("ENQUEUE_ONLY").is_ok() {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let (queue, _signals) = RetryQueue::new(env.pg.clone(), 1, clock);
        let started = Instant::now();
        let mut lanes = Vec::new();
        for p in 0..producers {
            let queue = queue.clone();
            let chars = many.clone();
            lanes.push(tokio::spawn(async move {
                for i in (p..jobs).step_by(producers) {
                    let job = reward_job(chars[i % chars.len()], format!("eq-{i}"), 1);
                    queue.enqueue(&job).await.unwrap();
                }
            }));
        }
        for lane in lanes {
            lane.await.unwrap();
        }
        let rate = jobs as f64 / started.elapsed().as_secs_f64();
        println!("enqueue only: {jobs} jobs by {producers} producers = {rate:.0} jobs/s");
        pool.close().await;
        env.teardown().await;
        return;
    }
    // DRAIN_ONLY=1 stores and signals every job first, then times the worker alone.
    if std::env::var("DRAIN_ONLY").is_ok() {
        for (name, chars) in [("2/char", &many), ("200/char", &few)] {
            let clock: Arc<dyn Clock> = Arc::new(SystemClock);
            let (queue, signals) = RetryQueue::new(env.pg.clone(), jobs, Arc::clone(&clock));
            let prefix = format!("dr{}-", Uuid::now_v7().simple());
            for i in 0..jobs {
                let seq = (i / chars.len()) as u64 + 1;
                let job = reward_job(chars[i % chars.len()], format!("{prefix}{i}"), seq);
                queue.enqueue(&job).await.unwrap();
            }
            let worker = bench_worker(&pool, signals, clock).await;
            let stats = worker.stats();
            let cancel = tokio_util::sync::CancellationToken::new();
            let started = Instant::now();
            let task = tokio::spawn(worker.run(cancel.clone()));
            while RetryStats::get(&stats.applied) < jobs as u64 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let elapsed = started.elapsed();
            cancel.cancel();
            task.await.unwrap();
            let batch = RetryStats::get(&stats.claimed) as f64
                / RetryStats::get(&stats.batches).max(1) as f64;
            println!(
                "drain only, {name}: {jobs} jobs in {:.2} s = {:.0} jobs/s ({batch:.0}/batch)",
                elapsed.as_secs_f64(),
                jobs as f64 / elapsed.as_secs_f64()
            );
        }
        pool.close().await;
        env.teardown().await;
        return;
    }
    // STEADY_ONLY=RATE runs only the steady run at RATE jobs/s (latency investigations).
    if let Some(rate) = std::env::var("STEADY_ONLY")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
    {
        let steady_jobs = (rate * 10.0) as usize;
        let steady = shardkeep_run(
            &env,
            &pool,
            format!("shardkeep, steady {rate:.0}/s"),
            &many,
            steady_jobs,
            producers,
            Some(rate),
        )
        .await;
        steady.print();
        for p in [0.9, 0.95, 0.98, 0.99, 0.995, 0.999] {
            println!("  p{} {:.1} ms", p * 100.0, steady.percentile(p));
        }
        pool.close().await;
        env.teardown().await;
        return;
    }
    // SHARDKEEP_ONLY=1 skips the peers (for quick iterations; the ratio lines need them).
    if std::env::var("SHARDKEEP_ONLY").is_ok() {
        for (name, chars) in [("shardkeep, 2/char", &many), ("shardkeep, 200/char", &few)] {
            shardkeep_run(&env, &pool, name.into(), chars, jobs, producers, None)
                .await
                .print();
        }
        pool.close().await;
        env.teardown().await;
        return;
    }
    let raw = raw_run(&pool, &few, jobs, 1).await;
    raw.print();
    let raw_lanes = raw_run(&pool, &few, jobs, producers).await;
    raw_lanes.print();
    let apalis_many = apalis_run(
        &database_url,
        &pool,
        "apalis-postgres, 2/char".into(),
        &many,
        jobs,
        producers,
    )
    .await;
    apalis_many.print();
    let apalis_few = apalis_run(
        &database_url,
        &pool,
        "apalis-postgres, 200/char".into(),
        &few,
        jobs,
        producers,
    )
    .await;
    apalis_few.print();
    let ours_many = shardkeep_run(
        &env,
        &pool,
        "shardkeep, 2/char".into(),
        &many,
        jobs,
        producers,
        None,
    )
    .await;
    ours_many.print();
    let ours_few = shardkeep_run(
        &env,
        &pool,
        "shardkeep, 200/char".into(),
        &few,
        jobs,
        producers,
        None,
    )
    .await;
    ours_few.print();
    let max_rate = ours_many.rate().min(ours_few.rate());
    let steady_jobs = ((max_rate / 2.0) * 10.0).clamp(1000.0, jobs as f64) as usize;
    let steady = shardkeep_run(
        &env,
        &pool,
        format!("shardkeep, steady {:.0}/s", max_rate / 2.0),
        &many,
        steady_jobs,
        producers,
        Some(max_rate / 2.0),
    )
    .await;
    steady.print();
    let total = experience_total(&pool).await;
    assert_eq!(
        total,
        6 * jobs as i64 + steady_jobs as i64,
        "every system granted every job exactly once"
    );
    println!(
        "ratio: shardkeep 200 per character / 2 per character = {:.2}x jobs/s (goal >= 0.9x)",
        ours_few.rate() / ours_many.rate()
    );
    for (label, ours, apalis) in [
        ("2/char", &ours_many, &apalis_many),
        ("200/char", &ours_few, &apalis_few),
    ] {
        println!(
            "ratio: shardkeep / apalis-postgres 1.0, {label} = {:.1}x jobs/s (goal >= 3x)",
            ours.rate() / apalis.rate()
        );
    }
    println!(
        "ratio: shardkeep (slower case) / raw per-job lifecycle one at a time = {:.1}x jobs/s (goal >= 5x)",
        max_rate / raw.rate()
    );
    println!(
        "ratio: shardkeep (slower case) / raw per-job lifecycle in {producers} lanes = {:.1}x jobs/s",
        max_rate / raw_lanes.rate()
    );
    println!(
        "steady: signal-to-start p99 at half the measured maximum = {:.1} ms (goal < 50 ms)",
        steady.percentile(0.99)
    );
    pool.close().await;
    env.teardown().await;
}

/// Connect options for the bench's scratch database (same server as DATABASE_URL).
fn env_options(database_url: &str, env: &BenchEnv) -> sqlx::postgres::PgConnectOptions {
    let options: sqlx::postgres::PgConnectOptions = database_url.parse().unwrap();
    options.database(env.database())
}
