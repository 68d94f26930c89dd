//! A stand-in for autovacuum on a server that has it off (test machines often do): the tables
//! shardkeep churns (retry jobs, job effects, item lineage, transfer activations, the rows
//! themselves) are vacuumed every minute, as autovacuum would keep them, so a long run
//! measures shardkeep and not a server left without its maintenance. The report says so.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::world::{World, bump};

/// Time between the stand-in's passes.
pub(super) const PASS_EVERY: Duration = Duration::from_secs(60);

/// The tables a run updates and deletes from all the time.
const CHURNED: [&str; 6] = [
    "persistence_retry_jobs",
    "character_job_effects",
    "item_loads",
    "item_releases",
    "transfer_activations",
    "characters",
];

/// Vacuums the churned tables every [`PASS_EVERY`] until the run halts, when autovacuum is off.
pub(super) async fn spawn_if_needed(world: &Arc<World>) {
    // The embedded store's file has no autovacuum to be off (its freed pages are reused).
    let Some(pg) = world.env.servers().map(|s| s.pg_direct.clone()) else {
        return;
    };
    if pg.autovacuum_on().await.ok() != Some(false) {
        return;
    }
    world.counters.autovacuum_off.store(true, Ordering::Relaxed);
    let world = Arc::clone(world);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = world.halt.cancelled() => return,
                () = tokio::time::sleep(PASS_EVERY) => {}
            }
            // One table at a time, so one that fails does not hold back the others.
            let mut vacuumed = true;
            for table in CHURNED {
                let statement = format!("VACUUM (ANALYZE) {table}");
                if let Err(err) = sqlx::query(sqlx::AssertSqlSafe(statement))
                    .execute(pg.exec())
                    .await
                {
                    vacuumed = false;
                    tracing::warn!(event = "sim_vacuum_failed", table, error = %err);
                }
            }
            if vacuumed {
                bump(&world.counters.stand_in_vacuums);
            }
        }
    });
}
