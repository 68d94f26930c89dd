//! Retry jobs end to end (enqueue → applied → deleted) for shardkeep, apalis-postgres 1.0 and
//! the raw per-job lifecycle, in one run against the same Postgres. Every system performs the
//! same job: an idempotent reward grant (record the key, add one experience point to a
//! character whose state document is a realistic one). Each queue runs with 2 jobs per
//! character (many characters) and with 200 (a character that keeps earning: the per-character
//! cost must not grow). Then shardkeep runs at a steady half of its measured maximum for the
//! signal-to-start latency.

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
use sqlx::PgPool;
use sqlx::migrate::MigrateDatabase;
use tokio::sync::Mutex;
use tokio::task::JoinSet;
use uuid::Uuid;

use super::{BenchEnv, BenchError, Goal, Progress, Row, Unit};

const BENCH: &str = "retry";

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

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct RetryBenchConfig {
    /// Jobs per run.
    pub jobs: usize,
    /// Producer lanes enqueueing one job at a time.
    pub producers: usize,
}

/// One run's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RetryRun {
    /// What ran.
    pub name: String,
    /// Jobs applied.
    pub jobs: usize,
    /// Seconds from the first enqueue to the last job applied.
    pub seconds: f64,
    /// Signal-to-start latency of every job, in milliseconds.
    #[serde(skip)]
    pub latencies_ms: Vec<f64>,
    /// Mean jobs per claimed batch (shardkeep only).
    pub mean_batch: Option<f64>,
}

impl RetryRun {
    /// Jobs per second.
    pub fn rate(&self) -> f64 {
        self.jobs as f64 / self.seconds.max(1e-9)
    }

    /// The `p` quantile of the signal-to-start latency.
    pub fn percentile(&self, p: f64) -> f64 {
        super::percentile(&self.latencies_ms, p)
    }
}

/// Every run of the benchmark.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RetryReport {
    /// Raw lifecycle, one job at a time.
    pub raw: RetryRun,
    /// apalis-postgres, 2 jobs per character.
    pub apalis_many: RetryRun,
    /// apalis-postgres, 200 jobs per character.
    pub apalis_few: RetryRun,
    /// shardkeep, 2 jobs per character.
    pub ours_many: RetryRun,
    /// shardkeep, 200 jobs per character.
    pub ours_few: RetryRun,
    /// shardkeep at a steady half of its maximum.
    pub steady: RetryRun,
}

fn micros_now() -> i64 {
    Utc::now().timestamp_micros()
}

/// `n` characters named `prefix…`, each with the realistic state document of the ladder
/// benchmark at 0 experience.
pub async fn characters(pool: &PgPool, prefix: &str, n: usize) -> Result<Vec<Uuid>, BenchError> {
    let mut state = super::documents::template_state();
    state["experience"] = 0.into();
    let rows = super::ladder::insert_rows(pool, n, prefix, &state).await?;
    Ok(rows.into_iter().map(|(id, _)| id).collect())
}

/// A one-experience reward grant for `character`, issued by its (epoch 1) copy as `seq`.
pub fn reward_job(
    character: Uuid,
    key: String,
    seq: u64,
) -> Result<PersistenceRetryJob, BenchError> {
    PersistenceRetryJob::new(
        PersistenceRetryPayload::effect(
            character,
            &shardkeep_reference::game::ReferenceEffect::CombatRewards {
                experience: 1,
                currency: 0,
                items: vec![],
            },
        )
        .map_err(BenchError::other)?,
        IdempotencyEnvelope {
            idempotency_key: key,
            owner_epoch: 1,
            origin: Origin::CombatRewards,
            issued_at: Utc::now(),
            issue_seq: seq,
        },
        "bench",
        None,
    )
    .map_err(BenchError::other)
}

/// The worker under test, on a pool of its own (16, as in `serve`).
pub async fn bench_worker(
    env: &BenchEnv,
    signals: RetrySignals,
    clock: Arc<dyn Clock>,
) -> Result<RetryWorker, BenchError> {
    let pool = env.pool_of(16).await?;
    Ok(RetryWorker::new(
        shardkeep::PostgresBackend::from_pool(pool),
        shardkeep_reference::game::ReferenceModel::handle(),
        signals,
        RetryWorkerConfig::new("bench"),
        clock,
    ))
}

/// Waits for every task; the first error (or panic) wins.
async fn join_all(mut tasks: JoinSet<Result<(), BenchError>>) -> Result<(), BenchError> {
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(BenchError::other)??;
    }
    Ok(())
}

/// One shardkeep run: `jobs` reward grants spread over `chars`, each character's in its live
/// copy's issue order, enqueued by `producers` lanes as fast as they go or at `pace` jobs/s,
/// through the worker loop `serve` runs.
pub async fn shardkeep_run(
    env: &BenchEnv,
    name: String,
    chars: &[Uuid],
    (jobs, producers): (usize, usize),
    pace: Option<f64>,
    progress: &Progress,
) -> Result<RetryRun, BenchError> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    // The producers share the game server's pool; the worker has its own, as in `serve`.
    let (queue, signals) = RetryQueue::new(env.pg.clone(), 1024, Arc::clone(&clock));
    let worker = bench_worker(env, signals, clock).await?;
    let stats = worker.stats();
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(worker.run(cancel.clone()));
    let prefix = format!("sk{}-", Uuid::now_v7().simple());
    let started = Instant::now();
    let tokio_start = tokio::time::Instant::now();
    let mut lanes = JoinSet::new();
    for p in 0..producers {
        let queue = queue.clone();
        let chars = chars.to_vec();
        let prefix = prefix.clone();
        lanes.spawn(async move {
            for i in (p..jobs).step_by(producers) {
                if let Some(rate) = pace {
                    let due = tokio_start + Duration::from_secs_f64(i as f64 / rate);
                    tokio::time::sleep_until(due).await;
                }
                let key = format!("{prefix}{i}-{}", micros_now());
                let seq = (i / chars.len()) as u64 + 1;
                let job = reward_job(chars[i % chars.len()], key, seq)?;
                queue.enqueue(&job).await.map_err(BenchError::other)?;
            }
            Ok(())
        });
    }
    join_all(lanes).await?;
    // Completion is read off the worker's counters (polling the characters table would load
    // the server the run is measuring); the totals are checked at the end.
    while RetryStats::get(&stats.applied) < jobs as u64 {
        tokio::time::sleep(Duration::from_millis(2)).await;
        progress.tick(BENCH, || {
            format!(
                "{name}: {} of {jobs} applied",
                RetryStats::get(&stats.applied)
            )
        });
    }
    let seconds = started.elapsed().as_secs_f64();
    cancel.cancel();
    task.await.map_err(BenchError::other)?;
    let batches = RetryStats::get(&stats.batches).max(1);
    let mean_batch = RetryStats::get(&stats.claimed) as f64 / batches as f64;
    // A job's effect is recorded by the transaction that starts applying it: `applied_at` is
    // that transaction's start.
    let rows: Vec<(String, chrono::DateTime<Utc>)> = sqlx::query_as(
        "SELECT idempotency_key, applied_at FROM character_job_effects
          WHERE idempotency_key LIKE $1 || '%'",
    )
    .bind(&prefix)
    .fetch_all(&env.pool)
    .await?;
    let latencies_ms = rows
        .iter()
        .filter_map(|(key, at)| {
            let enqueued: i64 = key.rsplit('-').next()?.parse().ok()?;
            Some((at.timestamp_micros() - enqueued) as f64 / 1000.0)
        })
        .collect();
    Ok(RetryRun {
        name,
        jobs,
        seconds,
        latencies_ms,
        mean_batch: Some(mean_batch),
    })
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Grant {
    character_id: Uuid,
    key: String,
    enqueued_micros: i64,
}

#[derive(Clone)]
struct ApalisCtx {
    pool: PgPool,
    done: Arc<AtomicUsize>,
    latencies: Arc<Mutex<Vec<f64>>>,
    jobs: usize,
}

async fn apalis_handle(
    grant: Grant,
    ctx: Data<ApalisCtx>,
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

async fn apalis_run(
    env: &BenchEnv,
    name: String,
    chars: &[Uuid],
    (jobs, producers): (usize, usize),
    progress: &Progress,
) -> Result<RetryRun, BenchError> {
    let (server, _) = env
        .database_url()
        .rsplit_once('/')
        .ok_or_else(|| BenchError::Other("DATABASE_URL has no database name".into()))?;
    let queue_url = format!("{server}/bench_apalis_{}", Uuid::new_v4().simple());
    sqlx::Postgres::create_database(&queue_url).await?;
    let result = apalis_on(env, &queue_url, name, chars, (jobs, producers), progress).await;
    let _ = sqlx::Postgres::force_drop_database(&queue_url).await;
    result
}

async fn apalis_on(
    env: &BenchEnv,
    queue_url: &str,
    name: String,
    chars: &[Uuid],
    (jobs, producers): (usize, usize),
    progress: &Progress,
) -> Result<RetryRun, BenchError> {
    let queue_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .connect(queue_url)
        .await?;
    PostgresStorage::setup(&queue_pool)
        .await
        .map_err(BenchError::other)?;
    let config = ApalisConfig::default().queue("bench").batch_size(128);
    let storage: PostgresStorage<Grant> = PostgresStorage::new(&queue_pool).with_config(config);
    let done = Arc::new(AtomicUsize::new(0));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(jobs)));
    let started = Instant::now();
    let mut lanes = JoinSet::new();
    for p in 0..producers {
        let mut sink = storage.clone();
        let chars = chars.to_vec();
        lanes.spawn(async move {
            for i in (p..jobs).step_by(producers) {
                let grant = Grant {
                    character_id: chars[i % chars.len()],
                    key: format!("ap-{}-{i}", chars.len()),
                    enqueued_micros: micros_now(),
                };
                sink.push(grant).await.map_err(BenchError::other)?;
            }
            Ok(())
        });
    }
    let ctx = ApalisCtx {
        pool: env.pool.clone(),
        done: Arc::clone(&done),
        latencies: Arc::clone(&latencies),
        jobs,
    };
    let worker = WorkerBuilder::new("bench-apalis")
        .backend(storage.with_pubsub())
        .data(ctx)
        .concurrency(16)
        .parallelize(tokio::spawn)
        .build(apalis_handle);
    let runner = tokio::spawn(worker.run());
    join_all(lanes).await?;
    while done.load(Ordering::SeqCst) < jobs {
        tokio::time::sleep(Duration::from_millis(2)).await;
        progress.tick(BENCH, || {
            format!("{name}: {} of {jobs} applied", done.load(Ordering::SeqCst))
        });
    }
    let seconds = started.elapsed().as_secs_f64();
    let _ = tokio::time::timeout(Duration::from_secs(10), runner).await;
    queue_pool.close().await;
    let latencies_ms = latencies.lock().await.clone();
    Ok(RetryRun {
        name,
        jobs,
        seconds,
        latencies_ms,
        mean_batch: None,
    })
}

async fn raw_run(
    pool: &PgPool,
    chars: &[Uuid],
    jobs: usize,
    progress: &Progress,
) -> Result<RetryRun, BenchError> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS raw_jobs (id uuid PRIMARY KEY, character_id uuid NOT NULL,
           key text NOT NULL, enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
           leased_at timestamptz, lease_owner text)",
    )
    .execute(pool)
    .await?;
    let mut latencies_ms = Vec::with_capacity(jobs);
    let started = Instant::now();
    for i in 0..jobs {
        let id = Uuid::now_v7();
        let key = format!("raw-{i}");
        let character = chars[i % chars.len()];
        sqlx::query("INSERT INTO raw_jobs (id, character_id, key) VALUES ($1, $2, $3)")
            .bind(id)
            .bind(character)
            .bind(&key)
            .execute(pool)
            .await?;
        let waited: f64 = sqlx::query_scalar(
            "UPDATE raw_jobs SET leased_at = clock_timestamp(), lease_owner = 'raw' WHERE id = $1
             RETURNING (extract(epoch FROM leased_at - enqueued_at) * 1000)::float8",
        )
        .bind(id)
        .fetch_one(pool)
        .await?;
        sqlx::query(GRANT)
            .bind(&key)
            .bind(character)
            .execute(pool)
            .await?;
        sqlx::query("DELETE FROM raw_jobs WHERE id = $1")
            .bind(id)
            .execute(pool)
            .await?;
        latencies_ms.push(waited);
        progress.tick(BENCH, || format!("raw lifecycle: {i} of {jobs}"));
    }
    Ok(RetryRun {
        name: "raw lifecycle, one at a time".into(),
        jobs,
        seconds: started.elapsed().as_secs_f64(),
        latencies_ms,
        mean_batch: None,
    })
}

async fn experience_total(pool: &PgPool) -> Result<i64, BenchError> {
    Ok(sqlx::query_scalar(
        "SELECT COALESCE(sum((state->>'experience')::bigint), 0)::bigint FROM characters
          WHERE name LIKE 'rb-%'",
    )
    .fetch_one(pool)
    .await?)
}

/// Runs every system; checks every job was granted exactly once.
pub async fn run(
    env: &BenchEnv,
    config: RetryBenchConfig,
    progress: &Progress,
) -> Result<RetryReport, BenchError> {
    let RetryBenchConfig { jobs, producers } = config;
    sqlx::query(GRANTS_TABLE).execute(&env.pool).await?;
    progress.step(BENCH, "inserting characters");
    let many = characters(&env.pool, "rb-many", (jobs / 2).max(1)).await?;
    let few = characters(&env.pool, "rb-few", (jobs / 200).max(1)).await?;
    progress.step(BENCH, "raw lifecycle, one job at a time");
    let raw_jobs = (jobs / 10).max(100);
    let raw = raw_run(&env.pool, &few, raw_jobs, progress).await?;
    let size = (jobs, producers);
    progress.step(BENCH, "apalis-postgres 1.0, 2 jobs per character");
    let apalis_many =
        apalis_run(env, "apalis-postgres, 2/char".into(), &many, size, progress).await?;
    progress.step(BENCH, "apalis-postgres 1.0, 200 jobs per character");
    let apalis_few = apalis_run(
        env,
        "apalis-postgres, 200/char".into(),
        &few,
        size,
        progress,
    )
    .await?;
    progress.step(BENCH, "shardkeep, 2 jobs per character");
    let ours_many =
        shardkeep_run(env, "shardkeep, 2/char".into(), &many, size, None, progress).await?;
    progress.step(BENCH, "shardkeep, 200 jobs per character");
    let ours_few = shardkeep_run(
        env,
        "shardkeep, 200/char".into(),
        &few,
        size,
        None,
        progress,
    )
    .await?;
    let max_rate = ours_many.rate().min(ours_few.rate());
    let steady_jobs = ((max_rate / 2.0) * 10.0)
        .min(jobs as f64)
        .max(jobs.min(1000) as f64) as usize;
    progress.step(
        BENCH,
        format!("shardkeep at a steady {:.0} jobs/s", max_rate / 2.0),
    );
    let steady = shardkeep_run(
        env,
        format!("shardkeep, steady {:.0}/s", max_rate / 2.0),
        &many,
        (steady_jobs, producers),
        Some(max_rate / 2.0),
        progress,
    )
    .await?;
    let total = experience_total(&env.pool).await?;
    let expected = (raw_jobs + 4 * jobs + steady_jobs) as i64;
    if total != expected {
        return Err(BenchError::Other(format!(
            "the systems granted {total} experience for {expected} jobs"
        )));
    }
    Ok(RetryReport {
        raw,
        apalis_many,
        apalis_few,
        ours_many,
        ours_few,
        steady,
    })
}

/// The report's rows.
pub fn rows(r: &RetryReport) -> Vec<Row> {
    let slower = if r.ours_many.rate() <= r.ours_few.rate() {
        &r.ours_many
    } else {
        &r.ours_few
    };
    vec![
        Row::higher_is_better(
            BENCH,
            "jobs end to end, 2 per character",
            r.ours_many.rate(),
            "apalis-postgres 1.0, the same jobs",
            r.apalis_many.rate(),
            Unit::PerSecond,
            Goal::AtLeast(3.0),
        ),
        Row::higher_is_better(
            BENCH,
            "jobs end to end, 200 per character",
            r.ours_few.rate(),
            "apalis-postgres 1.0, the same jobs",
            r.apalis_few.rate(),
            Unit::PerSecond,
            Goal::AtLeast(3.0),
        ),
        Row::higher_is_better(
            BENCH,
            "jobs end to end, 200 per character",
            r.ours_few.rate(),
            "shardkeep, 2 per character",
            r.ours_many.rate(),
            Unit::PerSecond,
            Goal::AtLeast(0.9),
        ),
        Row::higher_is_better(
            BENCH,
            format!("jobs end to end, slower case ({})", slower.name),
            slower.rate(),
            "raw lifecycle, one job at a time",
            r.raw.rate(),
            Unit::PerSecond,
            Goal::AtLeast(5.0),
        ),
        Row::lower_is_better(
            BENCH,
            format!("signal-to-start p99 at {:.0} jobs/s", r.steady.rate()),
            r.steady.percentile(0.99),
            "a 50 ms budget",
            50.0,
            Unit::Millis,
            Goal::AtLeast(1.0),
        ),
    ]
}
