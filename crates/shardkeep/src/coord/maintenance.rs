//! The periodic keyspace upkeep every long-running instance does: keep its registry entry
//! alive, remove transfer markers of transfers no longer pending, and prune presence and registry
//! index members whose records expired; in the embedded store, delete expired records. Each step is bounded and independent: one failing (a Redis
//! hiccup) is logged and the others still run.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Coordination, InstanceRecord};
use crate::ttl::Ttl;

/// Most keys one step examines per pass.
pub const MAINTENANCE_MAX_EXAMINED: usize = 10_000;

/// What one maintenance pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MaintenancePass {
    /// The registration had lapsed (or never existed) and was written again.
    pub registered: bool,
    /// Transfer markers removed (their transfers no longer pending).
    pub markers_removed: usize,
    /// Presence index members removed.
    pub presence_pruned: usize,
    /// Registry index members removed.
    pub registry_pruned: usize,
    /// Expired records deleted from the embedded store's file (Redis expires its own keys).
    pub expired_swept: u64,
    /// Steps that failed (logged).
    pub failed_steps: u32,
}

/// One pass: heartbeat (registering again when the entry lapsed), reconcile transfer markers
/// against pending transfers, prune presence, list (and so prune) the registry, and in the
/// embedded store sweep expired records.
pub async fn maintain_once(
    coord: &Coordination,
    record: &InstanceRecord,
    ttl: Ttl,
) -> MaintenancePass {
    let mut pass = MaintenancePass::default();
    match coord.registry_heartbeat(&record.instance_id, ttl).await {
        Ok(true) => {}
        Ok(false) | Err(_) => match coord.registry_register(record, ttl).await {
            Ok(()) => pass.registered = true,
            Err(err) => {
                pass.failed_steps += 1;
                tracing::warn!(event = "registry_register_failed", error = %err);
            }
        },
    }
    match coord
        .transfer_markers_reconcile_pending(MAINTENANCE_MAX_EXAMINED)
        .await
    {
        Ok(report) => pass.markers_removed = report.removed.len(),
        Err(err) => {
            pass.failed_steps += 1;
            tracing::warn!(event = "transfer_reconcile_failed", error = %err);
        }
    }
    match coord.presence_prune(MAINTENANCE_MAX_EXAMINED).await {
        Ok(pruned) => pass.presence_pruned = pruned.removed,
        Err(err) => {
            pass.failed_steps += 1;
            tracing::warn!(event = "presence_prune_failed", error = %err);
        }
    }
    match coord.registry_list().await {
        Ok(listing) => pass.registry_pruned = listing.pruned,
        Err(err) => {
            pass.failed_steps += 1;
            tracing::warn!(event = "registry_prune_failed", error = %err);
        }
    }
    // Expired records go in short batches until none is left or the sweep's time budget
    // runs out, so the backlog cannot outgrow a fixed count per pass.
    match coord.sweep_expired(usize::MAX).await {
        Ok(swept) => pass.expired_swept = swept,
        Err(err) => {
            pass.failed_steps += 1;
            tracing::warn!(event = "expired_sweep_failed", error = %err);
        }
    }
    if pass.markers_removed > 0 {
        tracing::info!(
            event = "transfer_markers_reconciled",
            removed = pass.markers_removed
        );
    }
    pass
}

/// Runs [`maintain_once`] every `period` until `cancel` fires, calling `on_pass` after each.
/// The registration lives for three periods, so one missed pass does not drop it.
pub async fn run_maintenance(
    coord: Coordination,
    record: InstanceRecord,
    period: Duration,
    cancel: CancellationToken,
    mut on_pass: impl FnMut(MaintenancePass) + Send,
) {
    let ttl = Ttl::try_from(period.saturating_mul(3)).unwrap_or(Ttl::from_static_secs(90));
    loop {
        on_pass(maintain_once(&coord, &record, ttl).await);
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
    }
}
