//! What the journal worker's depth report costs as consumers grow: depth reports per second on a
//! queue with one consumer holding one entry, against a queue with many consumers each holding
//! one, both measured while all of them are alive. Work that walks every consumer slows down
//! with their number; a report that costs O(1) does not.

use std::time::Instant;

use shardkeep::queue::{WorkQueue, WorkQueueConfig};

use super::{BenchEnv, BenchError, Goal, Progress, Row, Unit, rate};

const BENCH: &str = "depth";

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct DepthConfig {
    /// Consumers in the second measurement.
    pub consumers: usize,
    /// Depth reports timed in each measurement.
    pub reports: usize,
}

/// Both measurements.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct DepthReport {
    /// Consumers in the second measurement.
    pub consumers: usize,
    /// Depth reports per second with one consumer.
    pub one: f64,
    /// Depth reports per second with `consumers` consumers.
    pub many: f64,
}

async fn consumers_holding_one_each(
    queue: &WorkQueue<u64>,
    count: usize,
    progress: &Progress,
) -> Result<Vec<shardkeep::queue::Consumer<u64>>, BenchError> {
    let mut consumers = Vec::with_capacity(count);
    for n in 0..count {
        queue.append(n as u64).await.map_err(BenchError::other)?;
        let mut consumer = queue.consumer().await.map_err(BenchError::other)?;
        let leased = consumer.lease_batch(1).await.map_err(BenchError::other)?;
        if leased.len() != 1 {
            return Err(BenchError::Other(format!(
                "consumer {n} leased {}",
                leased.len()
            )));
        }
        consumers.push(consumer);
        progress.tick(BENCH, || format!("{n} of {count} consumers registered"));
    }
    Ok(consumers)
}

async fn reports_per_second(
    queue: &WorkQueue<u64>,
    reports: usize,
    expected: u64,
) -> Result<f64, BenchError> {
    let started = Instant::now();
    for _ in 0..reports {
        let depths = queue.depths().await.map_err(BenchError::other)?;
        if depths.processing != expected {
            return Err(BenchError::Other(format!(
                "the report counts {} entries in processing, {expected} are held",
                depths.processing
            )));
        }
    }
    Ok(rate(reports as u64, started.elapsed()))
}

/// Measures both.
pub async fn run(
    env: &BenchEnv,
    config: DepthConfig,
    progress: &Progress,
) -> Result<DepthReport, BenchError> {
    let small: WorkQueue<u64> =
        WorkQueue::new(env.redis.clone(), "depth-one", WorkQueueConfig::default())
            .map_err(BenchError::other)?;
    let _one = consumers_holding_one_each(&small, 1, progress).await?;
    let large: WorkQueue<u64> =
        WorkQueue::new(env.redis.clone(), "depth-many", WorkQueueConfig::default())
            .map_err(BenchError::other)?;
    progress.step(
        BENCH,
        format!("registering {} consumers, one entry each", config.consumers),
    );
    let _many = consumers_holding_one_each(&large, config.consumers, progress).await?;
    // Both queues are measured with every consumer alive (their heartbeats load the same Redis
    // and runtime either way), in alternating halves, so the ratio is the report's own cost.
    let half = (config.reports / 2).max(1);
    let (mut one, mut many) = (0.0, 0.0);
    for round in 1..=2 {
        progress.step(
            BENCH,
            format!("depth reports, 1 consumer (half {round} of 2)"),
        );
        one += reports_per_second(&small, half, 1).await? / 2.0;
        progress.step(
            BENCH,
            format!(
                "depth reports, {} consumers (half {round} of 2)",
                config.consumers
            ),
        );
        many += reports_per_second(&large, half, config.consumers as u64).await? / 2.0;
    }
    Ok(DepthReport {
        consumers: config.consumers,
        one,
        many,
    })
}

/// The report's row.
pub fn rows(r: &DepthReport) -> Vec<Row> {
    vec![Row::higher_is_better(
        BENCH,
        format!(
            "journal depth reports, {} consumers",
            super::table::thousands(r.consumers as f64)
        ),
        r.many,
        "the same, 1 consumer",
        r.one,
        Unit::PerSecond,
        Goal::AtLeast(0.8),
    )]
}
