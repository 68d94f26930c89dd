//! The death-storm benchmark: audit events per second through the batched auditor against one
//! INSERT per event, on the same Postgres in one run; then a burst against a store slowed by a
//! fault proxy, counting what the batched auditor and a one-row-per-round-trip auditor drop.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{BenchEnv, Progress, rate};
use shardkeep::audit::{AuditEvent, AuditStore, Auditor, AuditorConfig};
use shardkeep::backend::PostgresBackend;
use shardkeep_testkit::faults::{FaultProxy, ProxyMode};

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct AuditBenchConfig {
    /// Events in each throughput step.
    pub events: usize,
    /// Events in the slowed-store burst.
    pub burst: usize,
    /// Latency the proxy adds to every chunk, each way.
    pub slowdown: Duration,
}

/// The findings.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct AuditBenchReport {
    /// Events per second through the batched auditor.
    pub batched: f64,
    /// Events per second, one INSERT per event.
    pub single_row: f64,
    /// Burst events dropped by the batched auditor against the slowed store.
    pub batched_dropped: u64,
    /// Burst events dropped by a one-row auditor against the slowed store.
    pub single_row_dropped: u64,
    /// Burst size.
    pub burst: usize,
}

fn death(n: usize) -> AuditEvent {
    AuditEvent::died(
        Uuid::now_v7(),
        Uuid::now_v7(),
        None,
        json!({ "zone": "zone-0", "room": "r1", "n": n }),
    )
}

/// Runs every step.
pub async fn run(
    env: &BenchEnv,
    database_url: &str,
    config: AuditBenchConfig,
    progress: &Progress,
) -> Result<AuditBenchReport, String> {
    progress.step(
        "audit",
        format!("{} deaths through the batched auditor", config.events),
    );
    let store = AuditStore::new(env.pg.clone());
    // Batched: keep the queue fed without overflowing it, and time until everything is written.
    let auditor = Auditor::spawn(
        store.clone(),
        AuditorConfig::default(),
        CancellationToken::new(),
    );
    let started = Instant::now();
    for n in 0..config.events {
        while auditor.depth() >= 250 {
            tokio::task::yield_now().await;
        }
        auditor.emit(death(n));
        progress.tick("audit", || {
            format!("{} of {} deaths emitted, batched", n + 1, config.events)
        });
    }
    auditor.barrier(Duration::from_secs(120)).await;
    let batched = rate(auditor.stats().recorded, started.elapsed());

    progress.step(
        "audit",
        format!("{} deaths, one INSERT each", config.events),
    );
    let started = Instant::now();
    for n in 0..config.events {
        store.record(&[death(n)]).await.map_err(|e| e.to_string())?;
        progress.tick("audit", || {
            format!(
                "{} of {} deaths written, one INSERT each",
                n + 1,
                config.events
            )
        });
    }
    let single_row = rate(config.events as u64, started.elapsed());

    progress.step(
        "audit",
        format!(
            "a burst of {} deaths against a store slowed by {} ms, batched and one row a write",
            config.burst,
            config.slowdown.as_millis()
        ),
    );
    let (batched_dropped, single_row_dropped) = slowed(env, database_url, config).await?;
    Ok(AuditBenchReport {
        batched,
        single_row,
        batched_dropped,
        single_row_dropped,
        burst: config.burst,
    })
}

async fn slowed(
    env: &BenchEnv,
    database_url: &str,
    config: AuditBenchConfig,
) -> Result<(u64, u64), String> {
    let options: sqlx::postgres::PgConnectOptions = database_url
        .parse()
        .map_err(|e: sqlx::Error| e.to_string())?;
    let upstream = format!(
        "{}:{}",
        if options.get_host().starts_with('/') {
            "127.0.0.1"
        } else {
            options.get_host()
        },
        options.get_port()
    )
    .parse()
    .map_err(|e: std::net::AddrParseError| e.to_string())?;
    let proxy = FaultProxy::start(upstream)
        .await
        .map_err(|e| e.to_string())?;
    let slow_options = options
        .host("127.0.0.1")
        .port(proxy.addr().port())
        .database(env.database());
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(slow_options)
        .await
        .map_err(|e| e.to_string())?;
    let slow = AuditStore::new(PostgresBackend::from_pool(pool));
    proxy.set_mode(ProxyMode::Delay(config.slowdown));
    let mut dropped = Vec::new();
    for max_batch in [64, 1] {
        let auditor = Auditor::spawn(
            slow.clone(),
            AuditorConfig {
                max_batch,
                ..AuditorConfig::default()
            },
            CancellationToken::new(),
        );
        // A storm arrives over one second: a death every 1/burst seconds.
        let gap = Duration::from_secs(1) / u32::try_from(config.burst.max(1)).unwrap_or(u32::MAX);
        let mut tick = tokio::time::interval(gap);
        for n in 0..config.burst {
            tick.tick().await;
            auditor.emit(death(n));
        }
        auditor.barrier(Duration::from_secs(120)).await;
        dropped.push(auditor.stats().dropped);
    }
    Ok((dropped[0], dropped[1]))
}
