//! Names and descriptions of every metric shardkeep emits through the `metrics` facade.
//!
//! The library only records; the binary installs an exporter. Counters end in `_total`,
//! durations in `_seconds`.

/// Handoff takes, labelled `outcome` (taken, already_consumed, not_found).
pub const HANDOFF_TAKES_TOTAL: &str = "shardkeep_handoff_takes_total";
/// Presence index members removed as stale.
pub const PRESENCE_PRUNED_TOTAL: &str = "shardkeep_presence_pruned_total";
/// Registry index members removed as stale.
pub const REGISTRY_PRUNED_TOTAL: &str = "shardkeep_registry_pruned_total";
/// Transfer activation markers removed by reconciliation.
pub const TRANSFER_MARKERS_REMOVED_TOTAL: &str = "shardkeep_transfer_markers_removed_total";
/// Nonce registrations, labelled `outcome` (registered, replayed).
pub const NONCE_REGISTRATIONS_TOTAL: &str = "shardkeep_nonce_registrations_total";
/// Keys deleted by admin cleanup, labelled `target`.
pub const CLEANUP_DELETED_TOTAL: &str = "shardkeep_cleanup_deleted_total";

/// Checkpoint reads that failed (Redis down or corrupt value); the row was used instead.
pub const CHECKPOINT_READ_FAILURES_TOTAL: &str = "shardkeep_checkpoint_read_failures_total";

/// Registers a description for every metric, for exporters that show them.
pub fn describe() {
    use metrics::describe_counter;
    describe_counter!(HANDOFF_TAKES_TOTAL, "Handoff takes by outcome.");
    describe_counter!(
        PRESENCE_PRUNED_TOTAL,
        "Stale presence index members removed."
    );
    describe_counter!(
        REGISTRY_PRUNED_TOTAL,
        "Stale registry index members removed."
    );
    describe_counter!(
        TRANSFER_MARKERS_REMOVED_TOTAL,
        "Transfer activation markers removed by reconciliation."
    );
    describe_counter!(
        NONCE_REGISTRATIONS_TOTAL,
        "Internal request nonces by outcome."
    );
    describe_counter!(
        CLEANUP_DELETED_TOTAL,
        "Keys deleted by admin cleanup, by target."
    );
}
