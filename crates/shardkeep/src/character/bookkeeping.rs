//! Pruning shardkeep's bookkeeping beside the character rows (`docs/bookkeeping.md`): job
//! effects a live write has superseded, unsequenced job keys past their dedupe window, and
//! item-load and item-release ledger entries and transfer activations past theirs. Each pass
//! deletes a bounded batch per table, so a long backlog drains over several passes without one
//! long statement.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::backend::PostgresBackend;

/// Most rows one pass deletes from each table.
pub const PRUNE_BATCH: i64 = 10_000;

/// How long bookkeeping that no live write supersedes is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BookkeepingRetention {
    /// Unsequenced job keys (jobs issued without a copy's issue sequence): a duplicate of such a
    /// job arriving within this window is refused.
    pub unsequenced_effects: Duration,
    /// Item-load and item-release ledger entries: a floor copy that a crash rolled back, picked
    /// up within this window of its owner's reload, is refused as a phantom; a job of a releaser
    /// applied within this window of a transfer leaves the transferred item out.
    pub item_loads: Duration,
    /// Transfer activations recorded by settled `transfer_activation` jobs: a transfer source
    /// waiting for its activation asks for its record, and a dead-lettered activation job's
    /// detail tells whether the activation landed anyway. Kept as long as dead letters are by
    /// default (30 days).
    pub transfer_activations: Duration,
}

impl BookkeepingRetention {
    /// How stale an item-load entry's load time may grow before a load writes it again (an
    /// eighth of the retention): a load that finds it fresher only raises the epoch, which
    /// touches no index. The prune waits this much longer than the retention, so an entry is
    /// still only removed once its last load is older than the retention.
    pub fn item_load_refresh(&self) -> Duration {
        self.item_loads / 8
    }
}

impl Default for BookkeepingRetention {
    fn default() -> Self {
        Self {
            unsequenced_effects: Duration::from_secs(7 * 24 * 3600),
            item_loads: Duration::from_secs(30 * 24 * 3600),
            transfer_activations: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// What one prune pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Job-effect rows deleted.
    pub effects: u64,
    /// Item-load ledger rows deleted.
    pub item_loads: u64,
    /// Item-release ledger rows deleted.
    pub item_releases: u64,
    /// Transfer activation rows deleted.
    pub transfer_activations: u64,
}

/// Rows the bookkeeping tables hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BookkeepingSizes {
    /// `character_job_effects` rows.
    pub effects: i64,
    /// `item_loads` rows.
    pub item_loads: i64,
    /// `item_releases` rows.
    pub item_releases: i64,
    /// `transfer_activations` rows.
    pub transfer_activations: i64,
}

/// Handle on the bookkeeping tables, in Postgres or in the embedded store's file. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct Bookkeeping {
    tables: Tables,
}

/// Where the tables are.
#[derive(Debug, Clone)]
enum Tables {
    Postgres(PostgresBackend),
    Embedded {
        db: crate::backend::SqliteBackend,
        clock: std::sync::Arc<dyn crate::clock::Clock>,
    },
}

// A sequenced effect is superseded once the row holds a live write that holds it (same copy,
// issue mark at or past it) or a live write by a later copy (its content accounts for every
// earlier copy's jobs, and an earlier copy's job can no longer apply). An unsequenced one is kept
// for its dedupe window; checkpoints live far shorter, so replay never needs it past that.
const PRUNE_EFFECTS: &str = "
WITH doomed AS (
    SELECT e.character_id, e.idempotency_key
      FROM character_job_effects e
      LEFT JOIN characters c ON c.id = e.character_id
     WHERE c.id IS NULL
        OR (e.issue_seq > 0 AND (e.owner_epoch < c.live_issue_epoch
                                 OR (e.owner_epoch = c.live_issue_epoch
                                     AND e.issue_seq <= c.live_issue_mark)))
        OR (e.issue_seq = 0 AND e.applied_at < now() - make_interval(secs => $1))
     LIMIT $2
)
DELETE FROM character_job_effects e
 USING doomed d
 WHERE e.character_id = d.character_id AND e.idempotency_key = d.idempotency_key";

const PRUNE_ITEM_LOADS: &str = "
WITH doomed AS (
    SELECT item_id, character_id FROM item_loads
     WHERE loaded_at < now() - make_interval(secs => $1)
     LIMIT $2
)
DELETE FROM item_loads l
 USING doomed d
 WHERE l.item_id = d.item_id AND l.character_id = d.character_id";

const PRUNE_ITEM_RELEASES: &str = "
WITH doomed AS (
    SELECT character_id, item_id FROM item_releases
     WHERE released_at < now() - make_interval(secs => $1)
     LIMIT $2
)
DELETE FROM item_releases r
 USING doomed d
 WHERE r.character_id = d.character_id AND r.item_id = d.item_id";

const PRUNE_ACTIVATIONS: &str = "
WITH doomed AS (
    SELECT character_id, transfer_token FROM transfer_activations
     WHERE activated_at < now() - make_interval(secs => $1)
     LIMIT $2
)
DELETE FROM transfer_activations a
 USING doomed d
 WHERE a.character_id = d.character_id AND a.transfer_token = d.transfer_token";

impl Bookkeeping {
    /// A handle over `pg`.
    pub fn new(pg: PostgresBackend) -> Self {
        Self {
            tables: Tables::Postgres(pg),
        }
    }

    /// A handle over the embedded store's file, ages read against the system clock.
    pub fn embedded(db: crate::backend::SqliteBackend) -> Self {
        Self {
            tables: Tables::Embedded {
                db,
                clock: std::sync::Arc::new(crate::clock::SystemClock),
            },
        }
    }

    /// The same handle reading ages against `clock` (the embedded store's only; Postgres reads
    /// its own time).
    pub fn with_clock(mut self, clock: std::sync::Arc<dyn crate::clock::Clock>) -> Self {
        if let Tables::Embedded { clock: held, .. } = &mut self.tables {
            *held = clock;
        }
        self
    }

    /// One pass: at most [`PRUNE_BATCH`] rows from each table.
    pub async fn prune_once(
        &self,
        retention: BookkeepingRetention,
    ) -> Result<PruneReport, sqlx::Error> {
        let report = match &self.tables {
            Tables::Postgres(pg) => Self::prune_postgres(pg, retention).await?,
            Tables::Embedded { db, clock } => {
                super::bookkeeping_sqlite::prune_once(db, clock.as_ref(), retention).await?
            }
        };
        for (table, rows) in [
            ("character_job_effects", report.effects),
            ("item_loads", report.item_loads),
            ("item_releases", report.item_releases),
            ("transfer_activations", report.transfer_activations),
        ] {
            metrics::counter!(crate::telemetry::BOOKKEEPING_PRUNED_TOTAL, "table" => table)
                .increment(rows);
        }
        Ok(report)
    }

    async fn prune_postgres(
        pg: &PostgresBackend,
        retention: BookkeepingRetention,
    ) -> Result<PruneReport, sqlx::Error> {
        let effects = sqlx::query(PRUNE_EFFECTS)
            .bind(retention.unsequenced_effects.as_secs_f64())
            .bind(PRUNE_BATCH)
            .execute(pg.exec())
            .await?
            .rows_affected();
        let item_loads = sqlx::query(PRUNE_ITEM_LOADS)
            .bind((retention.item_loads + retention.item_load_refresh()).as_secs_f64())
            .bind(PRUNE_BATCH)
            .execute(pg.exec())
            .await?
            .rows_affected();
        let item_releases = sqlx::query(PRUNE_ITEM_RELEASES)
            .bind(retention.item_loads.as_secs_f64())
            .bind(PRUNE_BATCH)
            .execute(pg.exec())
            .await?
            .rows_affected();
        let transfer_activations = sqlx::query(PRUNE_ACTIVATIONS)
            .bind(retention.transfer_activations.as_secs_f64())
            .bind(PRUNE_BATCH)
            .execute(pg.exec())
            .await?
            .rows_affected();
        Ok(PruneReport {
            effects,
            item_loads,
            item_releases,
            transfer_activations,
        })
    }

    /// How many rows each table holds (a full count: for tests and occasional inspection).
    pub async fn sizes(&self) -> Result<BookkeepingSizes, sqlx::Error> {
        let pg = match &self.tables {
            Tables::Postgres(pg) => pg,
            Tables::Embedded { db, .. } => return super::bookkeeping_sqlite::sizes(db).await,
        };
        let (effects, item_loads, item_releases, transfer_activations) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM character_job_effects), (SELECT count(*) FROM item_loads),
                    (SELECT count(*) FROM item_releases), (SELECT count(*) FROM transfer_activations)",
        )
        .fetch_one(pg.exec())
        .await?;
        Ok(BookkeepingSizes {
            effects,
            item_loads,
            item_releases,
            transfer_activations,
        })
    }
}

/// Prunes every `period` until `cancel` fires, passing each pass's outcome to `on_pass`. A pass
/// that deleted a full batch runs again at once (a backlog drains without waiting periods).
pub async fn run_bookkeeping_prune(
    bookkeeping: Bookkeeping,
    retention: BookkeepingRetention,
    period: Duration,
    cancel: CancellationToken,
    mut on_pass: impl FnMut(&Result<PruneReport, sqlx::Error>) + Send,
) {
    loop {
        let pass = bookkeeping.prune_once(retention).await;
        if let Err(err) = &pass {
            tracing::warn!(event = "bookkeeping_prune_failed", error = %err);
        }
        on_pass(&pass);
        let backlog = pass.as_ref().is_ok_and(|r| {
            [
                r.effects,
                r.item_loads,
                r.item_releases,
                r.transfer_activations,
            ]
            .iter()
            .any(|n| *n >= PRUNE_BATCH.unsigned_abs())
        });
        if backlog && !cancel.is_cancelled() {
            continue;
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
    }
}
