//! The benchmark report of embedded mode, for `shardkeep bench` on `DATABASE_URL=sqlite:…`
//! with no servers: batched CAS saves on the file against a plain batched update of the same
//! rows on the same engine (its limit for the write), for a fresh and a realistic document, and
//! the online characters one embedded shard sustains at the default cadences. Every store is a
//! scratch file removed afterwards.

use std::time::Duration;

use shardkeep::character::StateJson;
use uuid::Uuid;

use super::capacity::{self, CapacityConfig};
use super::documents::{self, DocumentKind};
use super::embedded_cas::{cas_batched, raw_update_batched};
use super::ladder::snapshot;
use super::table::{Goal, Row, Table, Unit};
use super::{BenchError, Progress};

/// How much the embedded report measures.
#[derive(Debug, Clone, Copy)]
pub struct EmbeddedBenchConfig {
    /// Characters the save benchmarks cycle through.
    pub rows: usize,
    /// Rows per batched save.
    pub batch: usize,
    /// How long each save benchmark runs.
    pub window: Duration,
    /// Online characters of the capacity run.
    pub online: usize,
    /// How long the capacity run holds them.
    pub sustain: Duration,
}

impl EmbeddedBenchConfig {
    /// The full report.
    pub fn full() -> Self {
        Self {
            rows: 20_000,
            batch: 256,
            window: Duration::from_secs(5),
            online: 200_000,
            sustain: Duration::from_secs(70),
        }
    }

    /// A quick run that exercises every step (tests, CI).
    pub fn smoke() -> Self {
        Self {
            rows: 1_000,
            batch: 128,
            window: Duration::from_millis(400),
            online: 960,
            sustain: Duration::from_millis(1_500),
        }
    }
}

/// Runs the embedded report.
pub async fn run(config: EmbeddedBenchConfig, progress: &Progress) -> Result<Table, BenchError> {
    let mut table = Table::default();
    for kind in [DocumentKind::Fresh, DocumentKind::Realistic] {
        let state = match kind {
            DocumentKind::Realistic => documents::realistic_state(),
            _ => documents::template_state(),
        };
        let bytes = serde_json::to_vec(&state).map(|v| v.len()).unwrap_or(0);
        let encoded = StateJson::from(&state);
        let snapshots: Vec<_> = (0..config.rows)
            .map(|n| snapshot(Uuid::now_v7(), &format!("emb{n}"), &encoded))
            .collect();
        let cas = cas_batched(&snapshots, config.batch, config.window, progress).await?;
        let raw = raw_update_batched(&snapshots, config.batch, config.window, progress).await?;
        table.push(Row::higher_is_better(
            "ladder",
            format!(
                "batched CAS saves, rows, embedded SQLite ({} doc, {bytes} B)",
                kind.label()
            ),
            cas,
            "UPDATE … FROM (VALUES …) on SQLite, same rows, no fence",
            raw,
            Unit::PerSecond,
            Goal::AtLeast(0.5),
        ));
    }
    let run = CapacityConfig {
        online: config.online,
        sustain: config.sustain,
        embedded: true,
    };
    let template = documents::template_state();
    let report = capacity::run(None, run, DocumentKind::Fresh, &template, progress).await?;
    table.rows.extend(capacity::rows(&report));
    Ok(table)
}
