//! The request and response bodies of every `/v1/internal` route, defined once: the handlers
//! serialize them, the CLI deserializes them, and the OpenAPI document is generated from them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// Every failure: `{"error": {"code", "message"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// A stable code and a human-readable message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable, machine-readable code (e.g. `bad_signature`, `not_found`).
    pub code: String,
    /// For people.
    pub message: String,
}

/// What an operator checks before a requeue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OperatorChecks {
    /// What the failed work meant for the player's session (`none`, `logout_blocked`, …).
    pub session_impact: String,
    /// The session the work belonged to.
    pub session_token: Option<String>,
    /// Whether that session token is active again (a requeue would act on a live session).
    pub session_active_again: bool,
    /// Whether the work deletes a resume ledger (`null` when the entry cannot be read).
    pub deletes_resume_ledger: Option<bool>,
    /// Whether a transfer activation it carries is already confirmed (`null` when unknown).
    pub transfer_already_confirmed: Option<bool>,
}

/// A persistence retry dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RetryDeadLetter {
    /// Dead letter id.
    pub dead_letter_id: Uuid,
    /// The job it came from.
    pub retry_job_id: Uuid,
    /// Payload kind.
    pub job_kind: String,
    /// The character.
    pub character_id: Uuid,
    /// Its name, when the character row exists.
    pub character_name: Option<String>,
    /// Realm, if tagged.
    pub realm_id: Option<String>,
    /// Zone, if the payload names one.
    pub zone_id: Option<String>,
    /// Attempts made.
    pub failed_attempts: i32,
    /// The last error.
    pub error: String,
    /// When it was dead-lettered.
    pub failed_at: DateTime<Utc>,
    /// The session it belonged to.
    pub session_token: Option<String>,
    /// The enqueuing component.
    pub source: String,
    /// Its session impact.
    pub session_impact: String,
}

impl From<shardkeep::retry::DeadLetterSummary> for RetryDeadLetter {
    fn from(s: shardkeep::retry::DeadLetterSummary) -> Self {
        Self {
            dead_letter_id: s.dead_letter_id,
            retry_job_id: s.retry_job_id,
            job_kind: s.job_kind,
            character_id: s.character_id,
            character_name: s.character_name,
            realm_id: s.realm_id,
            zone_id: s.zone_id,
            failed_attempts: s.failed_attempts,
            error: s.error,
            failed_at: s.failed_at,
            session_token: s.session_token,
            source: s.source,
            session_impact: s.session_impact,
        }
    }
}

/// `GET /v1/internal/persistence-retry/dead-letters`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RetryDeadLetterList {
    /// Retry jobs waiting or leased.
    pub pending_retry_jobs: i64,
    /// Dead letters not yet requeued.
    pub active_dead_letters: i64,
    /// The page asked for, newest first.
    pub dead_letters: Vec<RetryDeadLetter>,
}

/// `GET /v1/internal/persistence-retry/dead-letters/{id}`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RetryDeadLetterDetail {
    /// Always `retry`.
    pub kind: String,
    /// The dead letter.
    pub dead_letter: RetryDeadLetter,
    /// The stored payload, as saved (it may not decode).
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    /// What to check before a requeue.
    pub checks: OperatorChecks,
}

/// A session-lifecycle journal dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JournalDeadLetter {
    /// Dead letter id.
    pub dead_letter_id: Uuid,
    /// The entry it came from.
    pub entry_id: Option<Uuid>,
    /// Attempts made.
    pub attempts: u32,
    /// Why it failed.
    pub error: String,
    /// When.
    pub failed_at: DateTime<Utc>,
    /// The session (absent when the entry cannot be decoded).
    pub session_token: Option<String>,
    /// The character.
    pub character_id: Option<Uuid>,
    /// Its name.
    pub character_name: Option<String>,
    /// The effect plan: what a requeue would do.
    pub plan: Option<String>,
    /// Whether the transfer was confirmed when the stream closed.
    pub transfer_confirmed: Option<bool>,
}

impl From<shardkeep::journal::JournalDeadLetterSummary> for JournalDeadLetter {
    fn from(s: shardkeep::journal::JournalDeadLetterSummary) -> Self {
        Self {
            dead_letter_id: s.dead_letter_id,
            entry_id: s.entry_id,
            attempts: s.attempts,
            error: s.error,
            failed_at: s.failed_at,
            session_token: s.session_token,
            character_id: s.character_id,
            character_name: s.character_name,
            plan: s.plan.map(|p| p.as_str().to_owned()),
            transfer_confirmed: s.transfer_confirmed,
        }
    }
}

/// `GET /v1/internal/session-lifecycle-journal/dead-letters`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JournalDeadLetterList {
    /// Entries waiting.
    pub pending: u64,
    /// Entries held by consumers.
    pub processing: u64,
    /// Dead letters retained.
    pub dead: u64,
    /// The page asked for, newest first.
    pub dead_letters: Vec<JournalDeadLetter>,
}

/// `GET /v1/internal/session-lifecycle-journal/dead-letters/{id}`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JournalDeadLetterDetail {
    /// Always `journal`.
    pub kind: String,
    /// The dead letter.
    pub dead_letter: JournalDeadLetter,
    /// The stored entry item, as saved (it may not decode).
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    /// What to check before a requeue.
    pub checks: OperatorChecks,
}

/// Body of both requeue routes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RequeueRequest {
    /// Must be 1.
    pub rpc_version: i64,
    /// The dead letter to requeue.
    pub dead_letter_id: Uuid,
}

/// `POST /v1/internal/persistence-retry/dead-letters/requeue`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RetryRequeueResponse {
    /// False when the dead letter is unknown, was requeued already, or was left dead for the
    /// `reason` given.
    pub requeued: bool,
    /// The new job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_job_id: Option<Uuid>,
    /// Why a known dead letter was left dead: `superseded` (the copy that issued the job no
    /// longer owns the character, so the worker would drop it unapplied; an offline grant gives
    /// it again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What the reason means, in a sentence for the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// `POST /v1/internal/session-lifecycle-journal/dead-letters/requeue`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JournalRequeueResponse {
    /// False when the dead letter is unknown or was requeued already.
    pub requeued: bool,
    /// The new entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry_id: Option<Uuid>,
}

/// One admin cleanup target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CleanupTarget {
    /// Target name.
    pub name: String,
    /// The service that owns its keys (`login`, `control_plane`, `game_server`).
    pub owner: String,
    /// What deleting it repairs.
    pub description: String,
    /// Keys named exactly.
    pub exact_keys: Vec<String>,
    /// SCAN `MATCH` patterns.
    pub scan_patterns: Vec<String>,
}

/// `GET /v1/internal/admin/cleanup-targets`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CleanupTargetList {
    /// Every target.
    pub targets: Vec<CleanupTarget>,
}

/// Dry run or delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CleanupMode {
    /// Count matching keys; change nothing.
    DryRun,
    /// Delete matching keys, up to the limit.
    Delete,
}

/// `POST /v1/internal/admin/cleanup`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CleanupRequest {
    /// Target name.
    pub target: String,
    /// What to do.
    pub mode: CleanupMode,
    /// Most keys to delete in this call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
}

/// What a cleanup call found or removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CleanupReport {
    /// The target.
    pub target: String,
    /// The mode it ran in.
    pub mode: CleanupMode,
    /// Keys matched (dry run) or examined.
    pub matched: u64,
    /// Keys deleted.
    pub deleted: u64,
    /// The deleted keys.
    pub deleted_keys: Vec<String>,
    /// False when the call stopped at its bound; call again to continue.
    pub complete: bool,
}

/// One audit row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AuditRow {
    /// Row id.
    pub id: Uuid,
    /// Insertion order.
    pub seq: i64,
    /// `character` or `account`.
    pub subject_type: String,
    /// The subject.
    pub subject_id: Uuid,
    /// What happened.
    pub event_kind: String,
    /// The idempotency key.
    pub dedup_key: String,
    /// Who did it.
    pub actor_id: Option<Uuid>,
    /// Details.
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    /// When it was recorded.
    pub at: DateTime<Utc>,
}

/// Where the next audit page starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditCursor {
    /// Pass as `before_at`.
    pub at: DateTime<Utc>,
    /// Pass as `before_seq`.
    pub seq: i64,
}

/// A page of audit rows, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AuditPage {
    /// The rows.
    pub rows: Vec<AuditRow>,
    /// The next page's cursor, when there may be one.
    pub next: Option<AuditCursor>,
}

impl From<shardkeep::audit::AuditPage> for AuditPage {
    fn from(page: shardkeep::audit::AuditPage) -> Self {
        Self {
            rows: page
                .rows
                .into_iter()
                .map(|r| AuditRow {
                    id: r.id,
                    seq: r.seq,
                    subject_type: r.subject_type,
                    subject_id: r.subject_id,
                    event_kind: r.event_kind,
                    dedup_key: r.dedup_key,
                    actor_id: r.actor_id,
                    payload: r.payload,
                    at: r.at,
                })
                .collect(),
            next: page.next.map(|c| AuditCursor {
                at: c.at,
                seq: c.seq,
            }),
        }
    }
}
