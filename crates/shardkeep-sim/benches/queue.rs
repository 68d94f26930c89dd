//! Durable work queue throughput: entries per second through append → lease → ack with 1 and 4
//! consumers, in one run against the same Redis, for shardkeep's `WorkQueue` (both lease
//! variants: LMOVE polling with an in-process wake, and BLMOVE on a dedicated connection),
//! apalis-redis 1.0 (a worker per consumer, each with a unique name) and the raw command sequence
//! (LPUSH, LMOVE, LREM one at a time). Eight producer tasks append one entry at a time for every
//! system, keeping each backlog under 8,000 entries. The polling variant leases in batches of 64
//! (one script) and acks each batch in one script; apalis fetches in batches of 100.
//!
//! `cargo bench -p shardkeep-sim --bench queue` (needs REDIS_URL; `ENTRIES` overrides the size).

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

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

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BACKLOG: usize = 7_000;
/// Producer tasks, each appending one entry at a time (the same for every system).
const PRODUCERS: usize = 8;

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

async fn wait_all(done: &AtomicUsize, total: usize) {
    while done.load(Ordering::Relaxed) < total {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[derive(Clone, Copy)]
enum Lease {
    Polling,
    Blocking,
}

async fn shardkeep_run(redis_url: &str, entries: usize, consumers: usize, lease: Lease) -> f64 {
    let keys = Keyspace::new(&format!("bq-{}", uuid::Uuid::new_v4().simple())).unwrap();
    let backend = RedisBackend::connect("REDIS_URL", redis_url, keys, RedisTimeouts::default())
        .await
        .unwrap();
    let queue: WorkQueue<Work> =
        WorkQueue::new(backend, "bench", WorkQueueConfig::default()).unwrap();
    let done = Arc::new(AtomicUsize::new(0));
    let wake = Arc::new(Notify::new());
    let stop = tokio_util::sync::CancellationToken::new();
    let mut tasks = Vec::new();
    for _ in 0..consumers {
        let mut consumer = queue.consumer().await.unwrap();
        let (done, wake, stop) = (Arc::clone(&done), Arc::clone(&wake), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.is_cancelled() {
                match lease {
                    Lease::Polling => {
                        let batch = consumer.lease_batch(64).await.unwrap();
                        if batch.is_empty() {
                            tokio::select! {
                                () = wake.notified() => {}
                                () = tokio::time::sleep(Duration::from_millis(10)) => {}
                            }
                            continue;
                        }
                        let acked = consumer.ack_batch(&batch).await.unwrap();
                        done.fetch_add(acked.len(), Ordering::Relaxed);
                    }
                    Lease::Blocking => {
                        if let Some(leased) = consumer
                            .lease_blocking(Duration::from_millis(100))
                            .await
                            .unwrap()
                        {
                            consumer.ack(&leased).await.unwrap();
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
            consumer.shutdown().await.unwrap();
        }));
    }
    let started = Instant::now();
    let pushed = Arc::new(AtomicUsize::new(0));
    let mut producers = Vec::new();
    for _ in 0..PRODUCERS {
        let (queue, done, wake, pushed) = (
            queue.clone(),
            Arc::clone(&done),
            Arc::clone(&wake),
            Arc::clone(&pushed),
        );
        producers.push(tokio::spawn(async move {
            loop {
                let n = pushed.fetch_add(1, Ordering::Relaxed);
                if n >= entries {
                    break;
                }
                wait_for_room(&done, n).await;
                queue.append(work(n)).await.unwrap();
                wake.notify_one();
            }
        }));
    }
    for producer in producers {
        producer.await.unwrap();
    }
    wait_all(&done, entries).await;
    let rate = entries as f64 / started.elapsed().as_secs_f64();
    stop.cancel();
    for task in tasks {
        task.await.unwrap();
    }
    rate
}

async fn raw_run(redis_url: &str, entries: usize, consumers: usize) -> f64 {
    let client = redis::Client::open(redis_url).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let pending = format!("{{braw-{tag}}}:pending");
    let done = Arc::new(AtomicUsize::new(0));
    let stop = tokio_util::sync::CancellationToken::new();
    let mut tasks = Vec::new();
    for c in 0..consumers {
        let mut conn = conn.clone();
        let processing = format!("{{braw-{tag}}}:processing:{c}");
        let pending = pending.clone();
        let (done, stop) = (Arc::clone(&done), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.is_cancelled() {
                let item: Option<Vec<u8>> = redis::cmd("LMOVE")
                    .arg(&pending)
                    .arg(&processing)
                    .arg("RIGHT")
                    .arg("LEFT")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                match item {
                    Some(item) => {
                        let _: i64 = conn.lrem(&processing, 1, item).await.unwrap();
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    None => tokio::time::sleep(Duration::from_micros(500)).await,
                }
            }
        }));
    }
    let started = Instant::now();
    let pushed = Arc::new(AtomicUsize::new(0));
    let mut producers = Vec::new();
    for _ in 0..PRODUCERS {
        let (mut producer, pending, done, pushed) = (
            conn.clone(),
            pending.clone(),
            Arc::clone(&done),
            Arc::clone(&pushed),
        );
        producers.push(tokio::spawn(async move {
            loop {
                let n = pushed.fetch_add(1, Ordering::Relaxed);
                if n >= entries {
                    break;
                }
                wait_for_room(&done, n).await;
                let body = serde_json::to_vec(&work(n)).unwrap();
                let _: i64 = producer.lpush(&pending, body).await.unwrap();
            }
        }));
    }
    for producer in producers {
        producer.await.unwrap();
    }
    wait_all(&done, entries).await;
    let rate = entries as f64 / started.elapsed().as_secs_f64();
    stop.cancel();
    for task in tasks {
        task.await.unwrap();
    }
    rate
}

async fn apalis_run(redis_url: &str, entries: usize, consumers: usize) -> f64 {
    let conn = apalis_redis::connect(redis_url).await.unwrap();
    let queue_name = format!("bench-apalis-{}", uuid::Uuid::new_v4().simple());
    let config = ApalisConfig::default().queue(&queue_name).batch_size(100);
    let storage: RedisStorage<Work> = RedisStorage::new(conn).with_config(config);
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
    let mut producers = Vec::new();
    for _ in 0..PRODUCERS {
        let (mut sink, done, pushed) = (storage.clone(), Arc::clone(&done), Arc::clone(&pushed));
        producers.push(tokio::spawn(async move {
            loop {
                let n = pushed.fetch_add(1, Ordering::Relaxed);
                if n >= entries {
                    break;
                }
                wait_for_room(&done, n).await;
                sink.push(work(n)).await.unwrap();
            }
        }));
    }
    for producer in producers {
        producer.await.unwrap();
    }
    wait_all(&done, entries).await;
    let rate = entries as f64 / started.elapsed().as_secs_f64();
    for runner in runners {
        runner.abort();
    }
    let mut cleanup = apalis_redis::connect(redis_url).await.unwrap();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("*{queue_name}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut cleanup)
            .await
            .unwrap();
        if !keys.is_empty() {
            let _: i64 = redis::cmd("UNLINK")
                .arg(&keys)
                .query_async(&mut cleanup)
                .await
                .unwrap();
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    rate
}

#[tokio::main]
async fn main() {
    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let entries: usize = std::env::var("ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    println!(
        "bench queue: {entries} entries, append -> lease -> ack, {PRODUCERS} producers, backlog under 8,000"
    );
    let mut ours_by_consumers = Vec::new();
    for consumers in [1, 4] {
        let raw = raw_run(&redis_url, entries, consumers).await;
        let apalis = apalis_run(&redis_url, entries, consumers).await;
        let polling = shardkeep_run(&redis_url, entries, consumers, Lease::Polling).await;
        let blocking = shardkeep_run(&redis_url, entries, consumers, Lease::Blocking).await;
        println!("queue: {consumers} consumer(s): raw LPUSH/LMOVE/LREM {raw:>8.0}/s");
        println!("queue: {consumers} consumer(s): apalis-redis 1.0     {apalis:>8.0}/s");
        println!("queue: {consumers} consumer(s): shardkeep, batch lease + wake {polling:>8.0}/s");
        println!("queue: {consumers} consumer(s): shardkeep, BLMOVE       {blocking:>8.0}/s");
        let best = polling.max(blocking);
        println!(
            "ratio: {consumers} consumer(s): shardkeep / apalis-redis 1.0 = {:.1}x{}",
            best / apalis,
            if consumers == 4 { " (goal >= 2x)" } else { "" }
        );
        println!(
            "ratio: {consumers} consumer(s): shardkeep / raw command sequence = {:.2}x",
            best / raw
        );
        ours_by_consumers.push(best);
    }
}
