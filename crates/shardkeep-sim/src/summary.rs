//! The report's numbers: the counters of the run, the saver and worker stats, and the audit
//! rows, gathered into a [`SimReport`].

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;

use serde_json::json;
use uuid::Uuid;

use super::faults::PlannedFault;
use super::report::{JournalCounts, RetryCounts, SimReport, TierCounts, TransferCounts};
use super::world::{Counters, World, get};
use shardkeep::journal::JournalStats;
use shardkeep::retry::RetryStats;

pub(super) async fn audit_counts(world: &World) -> BTreeMap<String, u64> {
    world.env.probe().audit_counts().await
}

/// (acquirer, item) of every `item_transferred` audit row that moved an item between two
/// characters: a character taking back what an earlier copy of it put down is on the record
/// too (subject and actor alike), but it explains no move into that character's row.
pub(super) async fn transfer_audit(world: &World) -> HashSet<(Uuid, Uuid)> {
    world.env.probe().transfer_audit().await
}

#[allow(clippy::too_many_arguments)]
pub(super) fn build_report(
    world: &World,
    plan: &[PlannedFault],
    retry: &RetryStats,
    journal: &JournalStats,
    audit_events: BTreeMap<String, u64>,
    invariants: Vec<super::report::Invariant>,
    passed: bool,
    scans: u64,
) -> SimReport {
    let c: &Counters = &world.counters;
    let saver = world.saver_totals();
    let (transfers_gone, evicted, voided) = world
        .with_ledger(|l| (l.transfers_gone, l.evicted, l.voided))
        .unwrap_or_default();
    let config = &world.config;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let activity = [
        ("logins", get(&c.logins)),
        ("login retries", get(&c.login_retries)),
        (
            "logins waiting for the last copy to leave",
            get(&c.logins_waiting_for_last_copy),
        ),
        ("resumes", get(&c.resumes)),
        ("logouts", get(&c.logouts)),
        ("disconnects", get(&c.disconnects)),
        ("link-dead timeouts", get(&c.linkdead_timeouts)),
        ("walks", get(&c.walks)),
        ("instance entries", get(&c.instance_entries)),
        ("handoffs", get(&c.handoffs)),
        ("handoff retries", get(&c.handoff_retries)),
        ("handoffs lost", get(&c.handoffs_lost)),
        ("zombie handoffs refused", get(&c.handoffs_superseded)),
        ("transfers completed", get(&c.transfers_completed)),
        (
            "handoffs left pending by a killed source (their lifetime ends them)",
            get(&c.transfers_orphaned),
        ),
        ("fights", get(&c.fights)),
        ("deaths", get(&c.deaths)),
        ("item moves", get(&c.item_moves)),
        ("floor items decayed", get(&c.floor_items_decayed)),
        (
            "loot and pickups refused (inventory full)",
            get(&c.inventory_full),
        ),
        ("appearance changes", get(&c.appearance_changes)),
        ("equipment changes", get(&c.equipment_changes)),
        ("keyspace upkeep passes", get(&c.upkeep_passes)),
        (
            "bookkeeping rows pruned",
            world.bookkeeping_pruned.get().map_or(0, |n| get(n)),
        ),
        ("upkeep steps failed", get(&c.upkeep_failed_steps)),
        ("upkeep markers removed", get(&c.upkeep_markers_removed)),
        ("upkeep registrations", get(&c.upkeep_registrations)),
        ("logout saves made retry jobs", saver.final_queued_as_job),
        (
            "logout saves unsaved at shutdown",
            get(&c.finals_unsaved_at_shutdown),
        ),
        ("players parked at the end", world.parked_count() as u64),
        ("row scans", scans),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let embedded = world.env.servers().is_none();
    let (checkpoint_tier, row_tier) = if embedded {
        ("checkpoint (file)", "row (file CAS)")
    } else {
        ("checkpoint (Redis)", "row (Postgres CAS)")
    };
    SimReport {
        run: json!({
            "stores": if embedded {
                "embedded: one SQLite file; store outages fail every call of it for their stretch"
            } else {
                "Postgres and Redis, each behind a fault proxy"
            },
            "scratch_database": world.env.scratch_name(),
            "redis_namespace": world.env.keys.namespace(),
            "duration_secs": config.duration.as_secs_f64(),
            "shards": config.shards,
            "players": config.players,
            "seed": config.seed,
            "faults": config.faults.to_string(),
            "pulse_ms": config.pulse.as_millis() as u64,
            "checkpoint_every_pulses": config.checkpoint_pulses,
            "flush_every_pulses": config.flush_pulses,
            "retention": if config.serves == 0 {
                super::env::RETENTION_NOTE
            } else {
                super::env::SERVES_RETENTION_NOTE
            },
            "workers": if config.serves == 0 {
                "in this process (as serve runs them)".to_owned()
            } else {
                format!("in {} serve processes beside it (counts from their /metrics)", config.serves)
            },
            "floor items decay after": format!("{} s", super::host_faults::FLOOR_LIFETIME.as_secs()),
            "inventory holds at most": format!("{} items", super::play::INVENTORY_CAP),
            "autovacuum": if embedded {
                "n/a (embedded: the file reuses its freed pages)".to_owned()
            } else if c.autovacuum_off.load(Ordering::Relaxed) {
                format!(
                    "off on this server: the simulator vacuumed the churned tables itself ({} passes, one a minute)",
                    get(&c.stand_in_vacuums)
                )
            } else {
                "on".to_owned()
            },
        }),
        tiers: vec![
            TierCounts {
                tier: checkpoint_tier.into(),
                attempted: saver.checkpoint_attempted,
                landed: saver.checkpoint_landed,
                dropped: saver.dropped_checkpoint,
                failed: saver.checkpoint_failed,
            },
            TierCounts {
                tier: row_tier.into(),
                attempted: saver.row_attempted,
                landed: saver.row_landed,
                dropped: saver.dropped_row + saver.final_dropped,
                failed: saver.row_failed,
            },
        ],
        conflicts: saver.row_conflicts,
        ownership_fences: saver.row_ownership_lost + saver.checkpoint_refused + evicted,
        retry: RetryCounts {
            queued: get(&c.retry_enqueued),
            applied: load(&retry.applied),
            already_applied: load(&retry.already_applied),
            superseded: load(&retry.superseded),
            retried: load(&retry.retried),
            dead_lettered: load(&retry.dead_lettered),
        },
        journal: JournalCounts {
            appended: get(&c.journal_appended),
            processed: load(&journal.processed),
            skipped_reconnected: load(&journal.skipped_reconnected),
            skipped_stale: load(&journal.skipped_stale),
            dead_lettered: load(&journal.dead_lettered),
        },
        transfers: TransferCounts {
            detected: transfers_gone.0 + transfers_gone.1,
            committed: transfers_gone.0,
            refused: transfers_gone.1,
            voided,
        },
        audit_events,
        activity,
        faults: json!({
            "planned": plan,
            "injected": get(&c.faults_injected),
            "shards_killed": get(&c.shards_killed),
            "zombies_made": get(&c.zombies_made),
            "zombie_evictions": get(&c.evictions),
            "poison_planted": get(&c.poison_planted),
            "journal_entries_held_by_crashed_workers": get(&c.journal_held_by_crash),
            "redis_failovers": get(&c.redis_failovers),
            "serves_killed": get(&c.serves_killed),
        }),
        invariants,
        passed,
        series: Default::default(),
    }
}
