//! The benchmark report of embedded mode, for `shardkeep bench` on `DATABASE_URL=sqlite:…`
//! with no servers: batched CAS saves on the file against a plain batched update of the same
//! rows on the same engine (its limit for the write), for a fresh document, the document of a
//! character aged through the library on the file, and a realistic document, and the online
//! characters one embedded shard sustains at the default cadences. Every store is a scratch
//! file removed afterwards.

use std::time::Duration;

use shardkeep::character::StateJson;
use uuid::Uuid;

use super::aging::{self, AgingPlan, AgingStores};
use super::capacity::{self, CapacityConfig};
use super::documents::{self, DocumentKind};
use super::embedded_cas::{ScratchFile, cas_batched, raw_update_batched};
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
    /// Sessions of the aged character (each a login, 100 rewards, 10 item moves, a flush); 0
    /// leaves the aged document out.
    pub aging_logins: usize,
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
            aging_logins: 1_000,
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
            aging_logins: 5,
        }
    }
}

/// A character aged through `logins` sessions of the library on a scratch file: its document
/// and a fresh one holding the same items, with the report's row comparing their sizes.
async fn aged_documents(
    logins: usize,
    table: &mut Table,
    progress: &Progress,
) -> Result<(serde_json::Value, serde_json::Value), BenchError> {
    progress.step(
        "aging",
        format!("aging a character through {logins} sessions of the library on a file"),
    );
    let scratch = ScratchFile::new().await?;
    let plan = AgingPlan {
        rewards: logins * 100,
        item_moves: logins * 10,
        logins,
        ..AgingPlan::default()
    };
    let aged = aging::age_on(AgingStores::embedded(&scratch.db), plan, progress).await?;
    table.note(format!(
        "aged character (embedded): {} rewards ({} also as retry jobs), {} item moves, {} \
         logins, aged in {:.1} s; {} bookkeeping rows left beside it",
        plan.rewards,
        aged.jobs,
        plan.item_moves,
        plan.logins,
        aged.took.as_secs_f64(),
        aged.bookkeeping_rows
    ));
    let (aged_bytes, fresh_bytes) = (
        aged.state.to_string().len(),
        aged.fresh_state.to_string().len(),
    );
    table.push(Row::lower_is_better(
        "aging",
        "aged state document, embedded",
        aged_bytes as f64,
        "a fresh document holding the same items",
        fresh_bytes as f64,
        Unit::Bytes,
        Goal::AtLeast(1.0 / 1.1),
    ));
    Ok((aged.fresh_state, aged.state))
}

/// Runs the embedded report.
pub async fn run(config: EmbeddedBenchConfig, progress: &Progress) -> Result<Table, BenchError> {
    let mut table = Table::default();
    let mut documents = vec![(DocumentKind::Fresh, documents::template_state())];
    if config.aging_logins > 0 {
        let (fresh, aged) = aged_documents(config.aging_logins, &mut table, progress).await?;
        documents = vec![(DocumentKind::Fresh, fresh), (DocumentKind::Aged, aged)];
    }
    documents.push((DocumentKind::Realistic, documents::realistic_state()));
    let mut fresh_cas = None;
    for (kind, state) in documents {
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
        match (kind, fresh_cas) {
            (DocumentKind::Fresh, _) => fresh_cas = Some(cas),
            (DocumentKind::Aged, Some(fresh)) => table.push(Row::higher_is_better(
                "ladder",
                "batched CAS saves, rows, embedded SQLite (aged doc)",
                cas,
                "the same, fresh doc",
                fresh,
                Unit::PerSecond,
                Goal::AtLeast(0.9),
            )),
            _ => {}
        }
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
