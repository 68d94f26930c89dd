//! Durable work queue throughput: entries per second through append → lease → ack with 1 and 4
//! consumers, in one run against the same Redis, for shardkeep's `WorkQueue` (batch leases, each
//! batch acked by the call that leases the next, with an in-process wake when the queue runs
//! dry; and BLMOVE on a dedicated connection), apalis-redis 1.0 (a worker per
//! consumer, each with a unique name) and the raw command sequence (LPUSH, LMOVE, LREM one at a
//! time). The same producer tasks append one entry at a time for every system, keeping each
//! backlog under 7,000 entries.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use apalis::prelude::*;
use apalis_redis::{Config as ApalisConfig, RedisStorage};
use redis::AsyncCommands;
use shardkeep::backend::redis::RedisTimeouts;
use shardkeep::queue::{WorkQueue, WorkQueueConfig};
use shardkeep::{Keyspace, RedisBackend};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{BenchError, Goal, Progress, Row, Unit, rate};

const BENCH: &str = "queue";
const BACKLOG: usize = 7_000;
/// Entries a shardkeep consumer leases at once.
const LEASE: usize = 64;
/// How long a consumer whose last batch came back short waits before asking again.
const LINGER: Duration = Duration::from_millis(1);

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct QueueBenchConfig {
    /// Entries per run.
    pub entries: usize,
    /// Producer tasks, each appending one entry at a time (the same for every system).
    pub producers: usize,
    /// Times each system runs; each rate is the median.
    pub rounds: usize,
}

/// Entries per second of every system, by consumer count (medians over the rounds).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct QueueRates {
    /// Consumers.
    pub consumers: usize,
    /// Raw LPUSH / LMOVE / LREM, one at a time.
    pub raw: f64,
    /// apalis-redis 1.0.
    pub apalis: f64,
    /// shardkeep, batch lease with an in-process wake.
    pub batch_lease: f64,
    /// shardkeep, BLMOVE on a dedicated connection.
    pub blocking: f64,
    /// shardkeep, consumers alone draining a queue filled beforehand (batch lease).
    pub drain: f64,
}

impl QueueRates {
    /// shardkeep's better lease variant.
    pub fn best(&self) -> f64 {
        self.batch_lease.max(self.blocking)
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Work {
    n: usize,
    payload: String,
}

fn work(n: usize) -> Work {
    Work {
        n,
        payload: "x".repeat(64),
    }
}

async fn wait_for_room(done: &AtomicUsize, pushed: usize) {
    while pushed.saturating_sub(done.load(Ordering::Relaxed)) >= BACKLOG {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

async fn wait_all(done: &AtomicUsize, total: usize, progress: &Progress, what: &str) {
    while done.load(Ordering::Relaxed) < total {
        tokio::time::sleep(Duration::from_millis(1)).await;
        progress.tick(BENCH, || {
            format!("{what}: {} of {total}", done.load(Ordering::Relaxed))
        });
    }
}

/// Waits for every task; the first error (or panic) wins.
async fn join_all(mut tasks: JoinSet<Result<(), BenchError>>) -> Result<(), BenchError> {
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(BenchError::other)??;
    }
    Ok(())
}

/// A work queue in a namespace of its own (purged by the caller).
async fn scratch_queue(redis_url: &str) -> Result<(RedisBackend, WorkQueue<Work>), BenchError> {
    let keys = Keyspace::new(&format!("bq-{}", uuid::Uuid::new_v4().simple()))
        .map_err(BenchError::other)?;
    let backend =
        RedisBackend::connect("REDIS_URL", redis_url, keys, RedisTimeouts::default()).await?;
    let queue: WorkQueue<Work> =
        WorkQueue::new(backend.clone(), "bench", WorkQueueConfig::default())
            .map_err(BenchError::other)?;
    Ok((backend, queue))
}

#[derive(Clone, Copy)]
enum Lease {
    Batch,
    Blocking,
}

async fn shardkeep_run(
    redis_url: &str,
    config: QueueBenchConfig,
    consumers: usize,
    lease: Lease,
    progress: &Progress,
) -> Result<f64, BenchError> {
    let (backend, queue) = scratch_queue(redis_url).await?;
    let done = Arc::new(AtomicUsize::new(0));
    let wake = Arc::new(Notify::new());
    let stop = CancellationToken::new();
    let mut tasks = JoinSet::new();
    for _ in 0..consumers {
        let mut consumer = queue.consumer().await.map_err(BenchError::other)?;
        let (done, wake, stop) = (Arc::clone(&done), Arc::clone(&wake), stop.clone());
        tasks.spawn(async move {
            let mut batch = Vec::new();
            while !stop.is_cancelled() {
                match lease {
                    Lease::Batch => {
                        if batch.is_empty() {
                            batch = consumer
                                .lease_batch(LEASE)
                                .await
                                .map_err(BenchError::other)?;
                            if batch.is_empty() {
                                // Woken by an append (or after 10 ms), then a moment for more
                                // to gather: an idle consumer never spins on empty leases.
                                tokio::select! {
                                    () = wake.notified() => {}
                                    () = tokio::time::sleep(Duration::from_millis(10)) => {}
                                }
                                tokio::time::sleep(LINGER).await;
                            }
                            continue;
                        }
                        // The finished batch is acked by the call that leases the next one.
                        let (acked, next) = consumer
                            .ack_and_lease(&batch, LEASE)
                            .await
                            .map_err(BenchError::other)?;
                        done.fetch_add(acked.len(), Ordering::Relaxed);
                        // A short batch means the consumers are ahead of the producers: let the
                        // next one gather for a moment instead of asking for each entry alone.
                        let short = next.len() < LEASE;
                        batch = next;
                        if short {
                            tokio::time::sleep(LINGER).await;
                        }
                    }
                    Lease::Blocking => {
                        if let Some(leased) = consumer
                            .lease_blocking(Duration::from_millis(100))
                            .await
                            .map_err(BenchError::other)?
                        {
                            consumer.ack(&leased).await.map_err(BenchError::other)?;
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
            consumer
                .ack_batch(&batch)
                .await
                .map_err(BenchError::other)?;
            consumer.shutdown().await.map_err(BenchError::other)
        });
    }
    let started = Instant::now();
    let pushed = Arc::new(AtomicUsize::new(0));
    let mut producers = JoinSet::new();
    for _ in 0..config.producers {
        let (queue, done, wake, pushed) = (
            queue.clone(),
            Arc::clone(&done),
            Arc::clone(&wake),
            Arc::clone(&pushed),
        );
        let entries = config.entries;
        producers.spawn(async move {
            loop {
                let n = pushed.fetch_add(1, Ordering::Relaxed);
                if n >= entries {
                    return Ok(());
                }
                wait_for_room(&done, n).await;
                queue.append(work(n)).await.map_err(BenchError::other)?;
                wake.notify_one();
            }
        });
    }
    join_all(producers).await?;
    wait_all(&done, config.entries, progress, "shardkeep").await;
    let rate = rate(config.entries as u64, started.elapsed());
    stop.cancel();
    join_all(tasks).await?;
    backend.purge_namespace().await;
    Ok(rate)
}

async fn raw_run(
    redis_url: &str,
    config: QueueBenchConfig,
    consumers: usize,
    progress: &Progress,
) -> Result<f64, BenchError> {
    let conn = scratch_backend(redis_url).await?.conn();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let pending = format!("{{braw-{tag}}}:pending");
    let done = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let mut tasks = JoinSet::new();
    for c in 0..consumers {
        let mut conn = conn.clone();
        let processing = format!("{{braw-{tag}}}:processing:{c}");
        let pending = pending.clone();
        let (done, stop) = (Arc::clone(&done), stop.clone());
        tasks.spawn(async move {
            while !stop.is_cancelled() {
                let item: Option<Vec<u8>> = redis::cmd("LMOVE")
                    .arg(&pending)
                    .arg(&processing)
                    .arg("RIGHT")
                    .arg("LEFT")
                    .query_async(&mut conn)
                    .await?;
                match item {
                    Some(item) => {
                        let _: i64 = conn.lrem(&processing, 1, item).await?;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    None => tokio::time::sleep(Duration::from_micros(500)).await,
                }
            }
            Ok(())
        });
    }
    let started = Instant::now();
    let pushed = Arc::new(AtomicUsize::new(0));
    let mut producers = JoinSet::new();
    for _ in 0..config.producers {
        let (mut producer, pending, done, pushed) = (
            conn.clone(),
            pending.clone(),
            Arc::clone(&done),
            Arc::clone(&pushed),
        );
        let entries = config.entries;
        producers.spawn(async move {
            loop {
                let n = pushed.fetch_add(1, Ordering::Relaxed);
                if n >= entries {
                    return Ok(());
                }
                wait_for_room(&done, n).await;
                let body = serde_json::to_vec(&work(n)).map_err(BenchError::other)?;
                let _: i64 = producer.lpush(&pending, body).await?;
            }
        });
    }
    join_all(producers).await?;
    wait_all(&done, config.entries, progress, "raw").await;
    let rate = rate(config.entries as u64, started.elapsed());
    stop.cancel();
    join_all(tasks).await?;
    Ok(rate)
}

async fn apalis_run(
    redis_url: &str,
    config: QueueBenchConfig,
    consumers: usize,
    progress: &Progress,
) -> Result<f64, BenchError> {
    let conn = apalis_redis::connect(redis_url)
        .await
        .map_err(BenchError::other)?;
    let queue_name = format!("bench-apalis-{}", uuid::Uuid::new_v4().simple());
    let apalis_config = ApalisConfig::default().queue(&queue_name).batch_size(100);
    let storage: RedisStorage<Work> = RedisStorage::new(conn).with_config(apalis_config);
    let done = Arc::new(AtomicUsize::new(0));
    async fn handle(_item: Work, done: Data<Arc<AtomicUsize>>) -> Result<(), BoxDynError> {
        done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    let mut runners = Vec::new();
    for c in 0..consumers {
        let worker = WorkerBuilder::new(format!("{queue_name}-worker-{c}"))
            .backend(storage.clone())
            .data(Arc::clone(&done))
            .build(handle);
        runners.push(tokio::spawn(worker.run()));
    }
    let started = Instant::now();
    let pushed = Arc::new(AtomicUsize::new(0));
    let mut producers = JoinSet::new();
    for _ in 0..config.producers {
        let (mut sink, done, pushed) = (storage.clone(), Arc::clone(&done), Arc::clone(&pushed));
        let entries = config.entries;
        producers.spawn(async move {
            loop {
                let n = pushed.fetch_add(1, Ordering::Relaxed);
                if n >= entries {
                    return Ok(());
                }
                wait_for_room(&done, n).await;
                sink.push(work(n)).await.map_err(BenchError::other)?;
            }
        });
    }
    join_all(producers).await?;
    wait_all(&done, config.entries, progress, "apalis-redis").await;
    let rate = rate(config.entries as u64, started.elapsed());
    for runner in runners {
        runner.abort();
    }
    sweep(redis_url, &format!("*{queue_name}*")).await?;
    forget_apalis_queue(redis_url, &queue_name).await?;
    Ok(rate)
}

/// The sorted set in which apalis-redis registers every queue, outside the queue's own keys.
pub const APALIS_QUEUES: &str = "core:apalis:queues:list";

/// Takes the run's queue out of apalis's shared registry (the set goes with its last member).
async fn forget_apalis_queue(redis_url: &str, queue_name: &str) -> Result<(), BenchError> {
    let backend = scratch_backend(redis_url).await?;
    let mut conn = backend.conn();
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(APALIS_QUEUES)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await?;
    let ours: Vec<&String> = members.iter().filter(|m| m.contains(queue_name)).collect();
    if !ours.is_empty() {
        let _: i64 = redis::cmd("ZREM")
            .arg(APALIS_QUEUES)
            .arg(&ours)
            .query_async(&mut conn)
            .await?;
    }
    Ok(())
}

/// Unlinks every key matching `pattern` (a peer's keys after its run).
async fn sweep(redis_url: &str, pattern: &str) -> Result<(), BenchError> {
    let backend = scratch_backend(redis_url).await?;
    let mut conn = backend.conn();
    let mut cursor = shardkeep::backend::redis::ScanCursor::START;
    loop {
        let (next, keys) = backend.scan_page(cursor, pattern, 1000).await?;
        if !keys.is_empty() {
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.unlink(key).ignore();
            }
            let () = pipe.query_async(&mut conn).await?;
        }
        cursor = next;
        if cursor.is_start() {
            return Ok(());
        }
    }
}

/// A connection to the deployment at `redis_url` for raw work outside any namespace.
async fn scratch_backend(redis_url: &str) -> Result<RedisBackend, BenchError> {
    let keys = Keyspace::new("bench-raw").map_err(BenchError::other)?;
    Ok(RedisBackend::connect("REDIS_URL", redis_url, keys, RedisTimeouts::default()).await?)
}

/// Fills a queue with `config.entries`, then times `consumers` draining it (batch lease, the
/// next batch leased by the call that acks the last): what the consumers alone sustain, where
/// the end-to-end runs are bound by their producers.
async fn shardkeep_drain(
    redis_url: &str,
    config: QueueBenchConfig,
    consumers: usize,
    progress: &Progress,
) -> Result<f64, BenchError> {
    let (backend, queue) = scratch_queue(redis_url).await?;
    let pushed = Arc::new(AtomicUsize::new(0));
    let mut producers = JoinSet::new();
    for _ in 0..config.producers {
        let (queue, pushed) = (queue.clone(), Arc::clone(&pushed));
        let entries = config.entries;
        producers.spawn(async move {
            loop {
                let n = pushed.fetch_add(1, Ordering::Relaxed);
                if n >= entries {
                    return Ok(());
                }
                queue.append(work(n)).await.map_err(BenchError::other)?;
            }
        });
    }
    join_all(producers).await?;
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    let mut leased_by = Vec::new();
    for _ in 0..consumers {
        leased_by.push(queue.consumer().await.map_err(BenchError::other)?);
    }
    let started = Instant::now();
    for mut consumer in leased_by {
        let done = Arc::clone(&done);
        tasks.spawn(async move {
            let mut batch = consumer
                .lease_batch(LEASE)
                .await
                .map_err(BenchError::other)?;
            while !batch.is_empty() {
                let (acked, next) = consumer
                    .ack_and_lease(&batch, LEASE)
                    .await
                    .map_err(BenchError::other)?;
                done.fetch_add(acked.len(), Ordering::Relaxed);
                batch = next;
            }
            consumer.shutdown().await.map_err(BenchError::other)
        });
    }
    join_all(tasks).await?;
    wait_all(&done, config.entries, progress, "shardkeep drain").await;
    let rate = rate(config.entries as u64, started.elapsed());
    backend.purge_namespace().await;
    Ok(rate)
}

/// Runs every system with 1 and with 4 consumers.
pub async fn run(
    redis_url: &str,
    config: QueueBenchConfig,
    progress: &Progress,
) -> Result<Vec<QueueRates>, BenchError> {
    let mut all = Vec::new();
    for consumers in [1, 4] {
        let mut rounds = Vec::new();
        for round in 1..=config.rounds.max(1) {
            let mut rates = QueueRates {
                consumers,
                ..QueueRates::default()
            };
            let step = |what: &str| {
                progress.step(
                    BENCH,
                    format!("{consumers} consumer(s), round {round}: {what}"),
                )
            };
            step("raw LPUSH/LMOVE/LREM");
            rates.raw = raw_run(redis_url, config, consumers, progress).await?;
            step("apalis-redis 1.0");
            rates.apalis = apalis_run(redis_url, config, consumers, progress).await?;
            step("shardkeep, batch lease");
            rates.batch_lease =
                shardkeep_run(redis_url, config, consumers, Lease::Batch, progress).await?;
            // One entry per round trip: a tenth of the entries is plenty to time it.
            step("shardkeep, BLMOVE (a tenth of the entries)");
            let tenth = QueueBenchConfig {
                entries: (config.entries / 10).max(10),
                ..config
            };
            rates.blocking =
                shardkeep_run(redis_url, tenth, consumers, Lease::Blocking, progress).await?;
            step("shardkeep, consumers draining a filled queue");
            rates.drain = shardkeep_drain(redis_url, config, consumers, progress).await?;
            rounds.push(rates);
        }
        all.push(medians(consumers, &rounds));
    }
    Ok(all)
}

/// Every rate's median over the rounds (zero for a rate a run did not measure).
fn medians(consumers: usize, rounds: &[QueueRates]) -> QueueRates {
    let median = |pick: fn(&QueueRates) -> f64| {
        let mut v: Vec<f64> = rounds.iter().map(pick).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    QueueRates {
        consumers,
        raw: median(|r| r.raw),
        apalis: median(|r| r.apalis),
        batch_lease: median(|r| r.batch_lease),
        blocking: median(|r| r.blocking),
        drain: median(|r| r.drain),
    }
}

/// shardkeep's queue alone (batch lease end to end, and draining a filled queue) on a Redis
/// Cluster, 1 and 4 consumers, medians over the rounds. The peers speak to one server only.
pub async fn cluster_run(
    cluster_url: &str,
    config: QueueBenchConfig,
    progress: &Progress,
) -> Result<Vec<QueueRates>, BenchError> {
    let mut all = Vec::new();
    for consumers in [1, 4] {
        let mut rounds = Vec::new();
        for round in 1..=config.rounds.max(1) {
            progress.step(
                BENCH,
                format!("Redis Cluster, {consumers} consumer(s), round {round}"),
            );
            rounds.push(QueueRates {
                consumers,
                batch_lease: shardkeep_run(cluster_url, config, consumers, Lease::Batch, progress)
                    .await?,
                drain: shardkeep_drain(cluster_url, config, consumers, progress).await?,
                ..QueueRates::default()
            });
        }
        all.push(medians(consumers, &rounds));
    }
    Ok(all)
}

/// Rows of the cluster runs, each against the same measure on the standalone server.
pub fn cluster_rows(cluster: &[QueueRates], standalone: &[QueueRates]) -> Vec<Row> {
    let mut rows = Vec::new();
    for c in cluster {
        let Some(s) = standalone.iter().find(|s| s.consumers == c.consumers) else {
            continue;
        };
        rows.push(Row::higher_is_better(
            BENCH,
            format!(
                "Redis Cluster, {} consumer(s): append → lease → ack",
                c.consumers
            ),
            c.batch_lease,
            "standalone Redis",
            s.batch_lease,
            Unit::PerSecond,
            Goal::None,
        ));
        rows.push(Row::higher_is_better(
            BENCH,
            format!(
                "Redis Cluster, {} consumer(s): drain a filled queue",
                c.consumers
            ),
            c.drain,
            "standalone Redis",
            s.drain,
            Unit::PerSecond,
            Goal::None,
        ));
    }
    rows
}

/// The report's rows.
pub fn rows(rates: &[QueueRates], label: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    for r in rates {
        let who = format!("{}{} consumer(s)", label, r.consumers);
        rows.push(Row::higher_is_better(
            BENCH,
            format!("{who}: append → lease → ack"),
            r.best(),
            "apalis-redis 1.0",
            r.apalis,
            Unit::PerSecond,
            if r.consumers == 4 {
                Goal::AtLeast(2.5)
            } else {
                Goal::None
            },
        ));
        rows.push(Row::higher_is_better(
            BENCH,
            format!("{who}: append → lease → ack"),
            r.best(),
            "raw LPUSH / LMOVE / LREM",
            r.raw,
            Unit::PerSecond,
            Goal::None,
        ));
        rows.push(Row::higher_is_better(
            BENCH,
            format!("{who}: one entry per BLMOVE"),
            r.blocking,
            "batch lease",
            r.batch_lease,
            Unit::PerSecond,
            Goal::None,
        ));
    }
    if let (Some(one), Some(four)) = (
        rates.iter().find(|r| r.consumers == 1),
        rates.iter().find(|r| r.consumers == 4),
    ) {
        rows.push(Row::higher_is_better(
            BENCH,
            format!("{label}4 consumers"),
            four.best(),
            "1 consumer",
            one.best(),
            Unit::PerSecond,
            Goal::AtLeast(1.0),
        ));
        rows.push(Row::higher_is_better(
            BENCH,
            format!("{label}4 consumers draining a filled queue"),
            four.drain,
            "1 consumer",
            one.drain,
            Unit::PerSecond,
            Goal::AtLeast(1.0),
        ));
    }
    rows
}
