//! Names and descriptions of every metric shardkeep emits through the `metrics` facade.
//!
//! The library only records; the binary installs an exporter. Counters end in `_total`,
//! durations in `_seconds`.

/// Handoff takes, labelled `outcome` (taken, already_consumed, not_found).
pub const HANDOFF_TAKES_TOTAL: &str = "shardkeep_handoff_takes_total";
/// Writes a Redis Cluster master acknowledged that no replica confirmed in time (`WAIT`).
pub const REDIS_UNREPLICATED_TOTAL: &str = "shardkeep_redis_unreplicated_writes_total";
/// Cluster connections replaced because they had stopped working.
pub const REDIS_RECONNECTS_TOTAL: &str = "shardkeep_redis_cluster_reconnects_total";
/// Commands Redis refused for lack of memory (`OOM` replies).
pub const REDIS_OOM_ERRORS_TOTAL: &str = "shardkeep_redis_oom_errors_total";
/// Presence index members removed as stale.
pub const PRESENCE_PRUNED_TOTAL: &str = "shardkeep_presence_pruned_total";
/// Registry index members removed as stale.
pub const REGISTRY_PRUNED_TOTAL: &str = "shardkeep_registry_pruned_total";
/// Transfer activation markers removed by reconciliation.
pub const TRANSFER_MARKERS_REMOVED_TOTAL: &str = "shardkeep_transfer_markers_removed_total";
/// Nonce registrations, labelled `outcome` (registered, replayed).
pub const NONCE_REGISTRATIONS_TOTAL: &str = "shardkeep_nonce_registrations_total";
/// Loads that went on without writing their items to the item-load ledger.
pub const ITEM_LOADS_UNRECORDED_TOTAL: &str = "shardkeep_item_loads_unrecorded_total";
/// Bookkeeping rows pruned, labelled `table` (character_job_effects, item_loads).
pub const BOOKKEEPING_PRUNED_TOTAL: &str = "shardkeep_bookkeeping_pruned_total";
/// Keys deleted by admin cleanup, labelled `target`.
pub const CLEANUP_DELETED_TOTAL: &str = "shardkeep_cleanup_deleted_total";

/// Checkpoint reads that failed (Redis down or corrupt value); the row was used instead.
pub const CHECKPOINT_READ_FAILURES_TOTAL: &str = "shardkeep_checkpoint_read_failures_total";

/// Saver requests waiting.
pub const SAVER_QUEUE_DEPTH: &str = "shardkeep_saver_queue_depth";
/// Saver requests dropped at enqueue, labelled `reason` and `cause` (full, closed).
pub const SAVER_DROPPED_TOTAL: &str = "shardkeep_saver_dropped_total";
/// CAS saves that lost the version race, labelled `reason`.
pub const SAVER_CONFLICTS_TOTAL: &str = "shardkeep_saver_conflicts_total";
/// CAS saves fenced by a newer owner.
pub const SAVER_OWNERSHIP_LOST_TOTAL: &str = "shardkeep_saver_ownership_lost_total";
/// Checkpoint writes refused by the ownership guard.
pub const CHECKPOINT_REFUSED_TOTAL: &str = "shardkeep_checkpoint_refused_total";
/// Saver writes that failed, labelled `tier` (redis, postgres).
pub const SAVER_WRITE_FAILURES_TOTAL: &str = "shardkeep_saver_write_failures_total";
/// Logout final saves written to neither the row nor a retry job (no retry queue configured, or
/// too many pending); their checkpoints still hold them.
pub const SAVER_FINAL_DROPPED_TOTAL: &str = "shardkeep_saver_final_dropped_total";
/// Handoffs whose carried snapshot was refused: a newer owner had superseded the copy that
/// dumped it (a zombie handed the player off).
pub const HANDOFF_SUPERSEDED_TOTAL: &str = "shardkeep_handoff_superseded_total";
/// Logout final saves that outlasted the outage budget and became durable retry jobs.
pub const SAVER_FINAL_QUEUED_AS_JOB_TOTAL: &str = "shardkeep_saver_final_queued_as_job_total";
/// Saves a row refused for its schema while the writing copy still owned it (a worker of a newer
/// model upgraded the row), by reason; a final one goes on as a state job.
pub const SAVER_ROW_SCHEMA_NEWER_TOTAL: &str = "shardkeep_saver_row_schema_newer_total";
/// Retry jobs a claim settled before minting the next owner (its predecessor's queued writes).
pub const RETRY_SETTLED_AT_CLAIM_TOTAL: &str = "shardkeep_retry_settled_at_claim_total";
/// Retry jobs left, uncounted, for a worker of a newer model.
pub const RETRY_DEFERRED_TOTAL: &str = "shardkeep_retry_deferred_total";
/// Duration of one batched CAS save.
pub const SAVER_FLUSH_SECONDS: &str = "shardkeep_saver_flush_seconds";
/// Placement writes refused because a newer owner wrote the record.
pub const PLACEMENT_STALE_TOTAL: &str = "shardkeep_placement_stale_total";
/// Placement updates dropped at enqueue.
pub const PLACEMENT_DROPPED_TOTAL: &str = "shardkeep_placement_dropped_total";

/// Retry jobs enqueued, labelled `kind`.
pub const RETRY_ENQUEUED_TOTAL: &str = "shardkeep_retry_enqueued_total";
/// Retry jobs stored but not signaled, labelled `reason` (queue_full, queue_closed).
pub const RETRY_DURABLE_ONLY_TOTAL: &str = "shardkeep_retry_durable_only_total";
/// Retry jobs claimed.
pub const RETRY_CLAIMED_TOTAL: &str = "shardkeep_retry_claimed_total";
/// Stream-close cleanups that could not be appended to the journal.
pub const CLEANUP_ENQUEUE_FAILURES_TOTAL: &str = "shardkeep_cleanup_enqueue_failures_total";
/// Work-queue consumers that registered again (after their heartbeat lapsed), by queue.
pub const QUEUE_CONSUMERS_REREGISTERED_TOTAL: &str = "shardkeep_queue_consumers_reregistered_total";
/// Workers that lost their consumer identity and started over as a new incarnation, labelled
/// `queue`.
pub const QUEUE_CONSUMER_RESTARTS_TOTAL: &str = "shardkeep_queue_consumer_restarts_total";
/// Entries the recovery backstop returned from unregistered processing lists, by queue.
pub const QUEUE_BACKSTOP_RECOVERED_TOTAL: &str = "shardkeep_queue_backstop_recovered_total";
/// Seconds since an online character's last landed write — the data a crash would lose — by
/// `shard`, `tier` (`checkpoint`, `row`) and `stat` (`worst`, `p99`).
pub const UNSAVED_CHANGE_AGE_SECONDS: &str = "shardkeep_unsaved_change_age_seconds";
/// Dead letters removed by retention, by `kind` (`retry`, `journal`).
pub const DEAD_LETTERS_PRUNED_TOTAL: &str = "shardkeep_dead_letters_pruned_total";
/// Retry jobs claimed again after their lease ran out (the worker holding them crashed or hung).
pub const RETRY_LEASE_EXPIRIES_TOTAL: &str = "shardkeep_retry_lease_expiries_total";
/// Retry job outcomes, labelled `outcome` (applied, already_applied, superseded, retrying,
/// dead_lettered, stale).
pub const RETRY_OUTCOMES_TOTAL: &str = "shardkeep_retry_outcomes_total";
/// Journal entries handled by the journal worker, labelled `outcome` (applied,
/// skipped_reconnected, skipped_stale, failed, dead_lettered: a failure that ran out of attempts).
pub const JOURNAL_OUTCOMES_TOTAL: &str = "shardkeep_journal_outcomes_total";
/// Retry dead letters requeued.
pub const RETRY_REQUEUED_TOTAL: &str = "shardkeep_retry_requeued_total";
/// Retry rows, labelled `state` (pending, leased).
pub const RETRY_ROWS: &str = "shardkeep_retry_rows";

/// Work-queue depths, labelled `queue` and `state` (pending, processing, dead).
pub const QUEUE_DEPTH: &str = "shardkeep_queue_depth";
/// Appends refused because a queue was at its cap, labelled `queue`.
pub const QUEUE_FULL_TOTAL: &str = "shardkeep_queue_full_total";
/// Entries returned to pending from dead consumers, labelled `queue`.
pub const QUEUE_RECOVERED_TOTAL: &str = "shardkeep_queue_recovered_total";
/// Entries dead-lettered, labelled `queue` and `cause` (attempts, undecodable, poison).
pub const QUEUE_DEAD_LETTERS_TOTAL: &str = "shardkeep_queue_dead_letters_total";
/// Dead letters requeued, labelled `queue`.
pub const QUEUE_REQUEUED_TOTAL: &str = "shardkeep_queue_requeued_total";

/// Audit events waiting.
pub const AUDIT_QUEUE_DEPTH: &str = "shardkeep_audit_queue_depth";
/// Audit events dropped at enqueue.
pub const AUDIT_DROPPED_TOTAL: &str = "shardkeep_audit_dropped_total";
/// Events per audit batch.
pub const AUDIT_BATCH_SIZE: &str = "shardkeep_audit_batch_size";

/// Registers a description for every metric, for exporters that show them.
pub fn describe() {
    use metrics::describe_counter;
    describe_counter!(HANDOFF_TAKES_TOTAL, "Handoff takes by outcome.");
    describe_counter!(
        REDIS_UNREPLICATED_TOTAL,
        "Cluster writes no replica confirmed in time (treated as failed writes)."
    );
    describe_counter!(
        REDIS_RECONNECTS_TOTAL,
        "Redis Cluster connections replaced because they had stopped working (no node connection left, or failing with no success for a stretch)."
    );
    describe_counter!(
        REDIS_OOM_ERRORS_TOTAL,
        "Redis commands refused with OOM (maxmemory reached under noeviction)."
    );
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
    describe_counter!(
        ITEM_LOADS_UNRECORDED_TOTAL,
        "Loads that went on without their item-load ledger entries."
    );
    describe_counter!(
        RETRY_LEASE_EXPIRIES_TOTAL,
        "Retry jobs claimed again after their lease ran out (a worker crashed or hung on them)."
    );
    describe_counter!(
        CLEANUP_ENQUEUE_FAILURES_TOTAL,
        "Stream-close cleanups that could not be appended to the journal."
    );
    describe_counter!(
        QUEUE_CONSUMERS_REREGISTERED_TOTAL,
        "Work-queue consumers that registered again after their heartbeat lapsed, by queue."
    );
    describe_counter!(
        QUEUE_CONSUMER_RESTARTS_TOTAL,
        "Workers that lost their consumer identity and started over as a new incarnation."
    );
    describe_counter!(
        JOURNAL_OUTCOMES_TOTAL,
        "Journal entries handled by the journal worker, by outcome."
    );
    describe_counter!(
        QUEUE_BACKSTOP_RECOVERED_TOTAL,
        "Entries the recovery backstop returned from unregistered processing lists, by queue."
    );
    metrics::describe_gauge!(
        UNSAVED_CHANGE_AGE_SECONDS,
        metrics::Unit::Seconds,
        "Seconds since online characters' last landed checkpoint or row write (worst, p99)."
    );
    describe_counter!(
        DEAD_LETTERS_PRUNED_TOTAL,
        "Dead letters removed by retention, by kind."
    );
    describe_counter!(
        BOOKKEEPING_PRUNED_TOTAL,
        "Bookkeeping rows pruned by the maintenance pass, by table."
    );
}

/// Touches every metric once (counters at zero, gauges unset to zero) with its usual labels, so
/// an exporter shows each family from the start rather than after its first event. `queues`
/// names the work queues whose series to show (the journal's is
/// [`crate::journal::JOURNAL_QUEUE`]).
pub fn register_all(queues: &[&'static str]) {
    use metrics::{counter, gauge};
    for name in [
        PRESENCE_PRUNED_TOTAL,
        REGISTRY_PRUNED_TOTAL,
        TRANSFER_MARKERS_REMOVED_TOTAL,
        CHECKPOINT_READ_FAILURES_TOTAL,
        SAVER_OWNERSHIP_LOST_TOTAL,
        CHECKPOINT_REFUSED_TOTAL,
        SAVER_FINAL_DROPPED_TOTAL,
        SAVER_FINAL_QUEUED_AS_JOB_TOTAL,
        HANDOFF_SUPERSEDED_TOTAL,
        PLACEMENT_STALE_TOTAL,
        PLACEMENT_DROPPED_TOTAL,
        RETRY_CLAIMED_TOTAL,
        RETRY_REQUEUED_TOTAL,
        AUDIT_DROPPED_TOTAL,
        ITEM_LOADS_UNRECORDED_TOTAL,
        RETRY_LEASE_EXPIRIES_TOTAL,
        CLEANUP_ENQUEUE_FAILURES_TOTAL,
        REDIS_UNREPLICATED_TOTAL,
        REDIS_RECONNECTS_TOTAL,
        REDIS_OOM_ERRORS_TOTAL,
    ] {
        counter!(name).increment(0);
    }
    for kind in ["retry", "journal"] {
        counter!(DEAD_LETTERS_PRUNED_TOTAL, "kind" => kind).increment(0);
    }
    for outcome in ["taken", "already_consumed", "not_found"] {
        counter!(HANDOFF_TAKES_TOTAL, "outcome" => outcome).increment(0);
    }
    for table in [
        "character_job_effects",
        "item_loads",
        "item_releases",
        "transfer_activations",
    ] {
        counter!(BOOKKEEPING_PRUNED_TOTAL, "table" => table).increment(0);
    }
    for outcome in ["registered", "replayed"] {
        counter!(NONCE_REGISTRATIONS_TOTAL, "outcome" => outcome).increment(0);
    }
    for target in ["presence", "handoff", "registry"] {
        counter!(CLEANUP_DELETED_TOTAL, "target" => target).increment(0);
    }
    counter!(RETRY_DEFERRED_TOTAL).increment(0);
    counter!(RETRY_SETTLED_AT_CLAIM_TOTAL).increment(0);
    for reason in ["flush", "final"] {
        counter!(SAVER_ROW_SCHEMA_NEWER_TOTAL, "reason" => reason).increment(0);
    }
    for reason in ["checkpoint", "flush", "final"] {
        counter!(SAVER_DROPPED_TOTAL, "reason" => reason, "cause" => "full").increment(0);
        counter!(SAVER_CONFLICTS_TOTAL, "reason" => reason).increment(0);
    }
    for tier in ["redis", "postgres"] {
        counter!(SAVER_WRITE_FAILURES_TOTAL, "tier" => tier).increment(0);
    }
    for reason in ["queue_full", "queue_closed"] {
        counter!(RETRY_DURABLE_ONLY_TOTAL, "reason" => reason).increment(0);
    }
    for outcome in [
        "applied",
        "already_applied",
        "superseded",
        "retrying",
        "dead_lettered",
        "stale",
        "unsettled",
    ] {
        counter!(RETRY_OUTCOMES_TOTAL, "outcome" => outcome).increment(0);
    }
    for state in ["pending", "leased"] {
        gauge!(RETRY_ROWS, "state" => state).set(0.0);
    }
    for outcome in [
        "applied",
        "skipped_reconnected",
        "skipped_stale",
        "failed",
        "dead_lettered",
    ] {
        counter!(JOURNAL_OUTCOMES_TOTAL, "outcome" => outcome).increment(0);
    }
    for &queue in queues {
        for state in ["pending", "processing", "dead"] {
            gauge!(QUEUE_DEPTH, "queue" => queue, "state" => state).set(0.0);
        }
        counter!(QUEUE_RECOVERED_TOTAL, "queue" => queue).increment(0);
        counter!(QUEUE_CONSUMERS_REREGISTERED_TOTAL, "queue" => queue).increment(0);
        counter!(QUEUE_CONSUMER_RESTARTS_TOTAL, "queue" => queue).increment(0);
        counter!(QUEUE_BACKSTOP_RECOVERED_TOTAL, "queue" => queue).increment(0);
        counter!(QUEUE_FULL_TOTAL, "queue" => queue).increment(0);
        counter!(QUEUE_REQUEUED_TOTAL, "queue" => queue).increment(0);
        for cause in ["attempts", "undecodable", "poison"] {
            counter!(QUEUE_DEAD_LETTERS_TOTAL, "queue" => queue, "cause" => cause).increment(0);
        }
    }
    gauge!(SAVER_QUEUE_DEPTH).set(0.0);
    gauge!(AUDIT_QUEUE_DEPTH).set(0.0);
}
