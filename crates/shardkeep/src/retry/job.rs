//! The retry job and its payloads: concrete writes that apply to the character store.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use super::payload::PersistenceRetryPayload;
use super::policy::{Origin, SessionImpact, session_impact};

/// Longest idempotency key, source label or token accepted.
pub const MAX_LABEL_BYTES: usize = 256;

/// The epoch an offline grant is issued under: no copy issued it, so no claim supersedes it —
/// it applies to whichever copy owns the character when it lands, and a live copy merges it.
/// A game effect issued by a copy carries that copy's epoch and its issue number instead.
pub const OFFLINE_EPOCH: i64 = i64::MAX;

/// Who issued a write, and the key that makes applying it twice harmless.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyEnvelope {
    /// Unique per logical write (a reward grant, a location update…).
    pub idempotency_key: String,
    /// Epoch of the copy that issued it; a newer owner supersedes the job.
    pub owner_epoch: i64,
    /// Where the write came from.
    pub origin: Origin,
    /// When it was issued.
    pub issued_at: DateTime<Utc>,
    /// The issuing copy's sequence for this write (see [`crate::character::IssueMark`]): a
    /// snapshot whose issue mark is at or above it already holds the write. For a state job,
    /// the issue mark of the dump it carries. 0: not sequenced (ordered by key alone).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub issue_seq: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A durable retry job.
#[derive(Debug, Clone, PartialEq)]
pub struct PersistenceRetryJob {
    retry_job_id: Uuid,
    payload: PersistenceRetryPayload,
    session_token: Option<String>,
    session_impact: SessionImpact,
    source: String,
    realm_id: Option<String>,
    envelope: IdempotencyEnvelope,
    dumped_at_version: Option<i64>,
}

/// A job could not be built; nothing was queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid retry job: {0}")]
pub struct InvalidJob(pub String);

impl PersistenceRetryJob {
    /// A new job with a fresh id. Its session impact comes from the policy for the envelope's
    /// origin; no caller chooses it.
    pub fn new(
        payload: PersistenceRetryPayload,
        envelope: IdempotencyEnvelope,
        source: &str,
        session_token: Option<String>,
    ) -> Result<Self, InvalidJob> {
        payload.check_core().map_err(InvalidJob)?;
        for (what, value) in [
            ("idempotency key", envelope.idempotency_key.as_str()),
            ("source", source),
        ] {
            if value.trim().is_empty() || value.len() > MAX_LABEL_BYTES {
                return Err(InvalidJob(format!(
                    "{what} must be 1 to {MAX_LABEL_BYTES} bytes"
                )));
            }
        }
        if envelope.owner_epoch < 0 {
            return Err(InvalidJob("owner epoch must not be negative".into()));
        }
        if payload.core().is_none()
            && envelope.issue_seq == 0
            && envelope.owner_epoch != OFFLINE_EPOCH
        {
            // A copy applies its effects live: unnumbered, the job would be replayed over a
            // checkpoint that already holds it (granted twice after a crash).
            return Err(InvalidJob(format!(
                "a game effect issued by the copy at epoch {} needs its issue number \
                 (issue_seq, from the copy's issue sequence: Runtime::grant numbers it); \
                 an effect no copy applied is an offline grant (owner epoch OFFLINE_EPOCH: \
                 Runtime::grant_offline)",
                envelope.owner_epoch
            )));
        }
        if envelope.owner_epoch == OFFLINE_EPOCH
            && (payload.core().is_some() || envelope.issue_seq != 0)
        {
            // No copy issued it: it has no place in any issue sequence, and it is no dump.
            return Err(InvalidJob(
                "an offline grant (owner epoch OFFLINE_EPOCH) is an unnumbered game effect".into(),
            ));
        }
        if session_token
            .as_deref()
            .is_some_and(|t| t.is_empty() || t.len() > MAX_LABEL_BYTES)
        {
            return Err(InvalidJob(format!(
                "session token must be 1 to {MAX_LABEL_BYTES} bytes"
            )));
        }
        Ok(Self {
            retry_job_id: Uuid::now_v7(),
            session_impact: session_impact(envelope.origin),
            payload,
            session_token,
            source: source.to_owned(),
            realm_id: None,
            envelope,
            dumped_at_version: None,
        })
    }

    /// The same state job, marked with the row version its dump was made at (the copy's last
    /// known version). Its settle then plays on the dump every effect the row took after that
    /// version and the dump does not hold — an offline grant that landed while the job waited —
    /// instead of writing over it. Ignored for any other job.
    pub fn dumped_at(mut self, row_version: i64) -> Self {
        if self.payload.is_state() {
            self.dumped_at_version = Some(row_version);
        }
        self
    }

    /// The same job tagged with a realm.
    pub fn with_realm(mut self, realm_id: &str) -> Self {
        self.realm_id = Some(realm_id.to_owned());
        self
    }

    /// A copy with a new id (a requeue restores a dead letter as a fresh job).
    pub(crate) fn renewed(&self) -> Self {
        Self {
            retry_job_id: Uuid::now_v7(),
            ..self.clone()
        }
    }

    /// Rebuilds a stored job.
    pub(crate) fn restore(stored: StoredJob) -> Result<Self, String> {
        let payload = PersistenceRetryPayload::decode(stored.payload, stored.zone_id)
            .map_err(|e| format!("payload does not decode: {e}"))?;
        if payload.kind() != stored.job_kind {
            return Err(format!(
                "job_kind {:?} does not match payload kind {:?}",
                stored.job_kind,
                payload.kind()
            ));
        }
        if payload.character_id() != stored.character_id {
            return Err("character_id does not match the payload".into());
        }
        let origin = Origin::parse(&stored.origin)
            .ok_or_else(|| format!("unknown origin {:?}", stored.origin))?;
        let session_impact = SessionImpact::parse(&stored.session_impact)
            .ok_or_else(|| format!("unknown session impact {:?}", stored.session_impact))?;
        Ok(Self {
            retry_job_id: stored.retry_job_id,
            payload,
            session_token: stored.session_token,
            session_impact,
            source: stored.source,
            realm_id: stored.realm_id,
            envelope: IdempotencyEnvelope {
                idempotency_key: stored.idempotency_key,
                owner_epoch: stored.owner_epoch,
                origin,
                issued_at: stored.issued_at,
                issue_seq: u64::try_from(stored.issue_seq)
                    .map_err(|_| format!("issue_seq {} is negative", stored.issue_seq))?,
            },
            dumped_at_version: stored.dumped_at_version,
        })
    }

    /// Job id (UUID v7).
    pub fn retry_job_id(&self) -> Uuid {
        self.retry_job_id
    }

    /// The write.
    pub fn payload(&self) -> &PersistenceRetryPayload {
        &self.payload
    }

    /// The session it belongs to, if any.
    pub fn session_token(&self) -> Option<&str> {
        self.session_token.as_deref()
    }

    /// How much it affects the session (from the policy).
    pub fn session_impact(&self) -> SessionImpact {
        self.session_impact
    }

    /// Free-form label of the enqueuing component.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Realm, if tagged.
    pub fn realm_id(&self) -> Option<&str> {
        self.realm_id.as_deref()
    }

    /// The idempotency envelope.
    pub fn envelope(&self) -> &IdempotencyEnvelope {
        &self.envelope
    }

    /// For a state job marked with [`PersistenceRetryJob::dumped_at`], the row version its dump
    /// was made at.
    pub fn dumped_at_version(&self) -> Option<i64> {
        self.dumped_at_version
    }
}

/// A job row as stored (columns of `persistence_retry_jobs` or a dead letter).
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct StoredJob {
    pub(crate) retry_job_id: Uuid,
    pub(crate) job_kind: String,
    pub(crate) character_id: Uuid,
    pub(crate) realm_id: Option<String>,
    pub(crate) zone_id: Option<String>,
    pub(crate) payload: serde_json::Value,
    pub(crate) session_token: Option<String>,
    pub(crate) session_impact: String,
    pub(crate) source: String,
    pub(crate) idempotency_key: String,
    pub(crate) owner_epoch: i64,
    pub(crate) origin: String,
    pub(crate) issued_at: DateTime<Utc>,
    pub(crate) issue_seq: i64,
    pub(crate) dumped_at_version: Option<i64>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn envelope(origin: Origin) -> IdempotencyEnvelope {
        IdempotencyEnvelope {
            idempotency_key: "k-1".into(),
            owner_epoch: 3,
            origin,
            issued_at: Utc::now(),
            issue_seq: 0,
        }
    }

    fn state() -> PersistenceRetryPayload {
        PersistenceRetryPayload::gameplay_state(Uuid::nil(), json!({}), None, None)
    }

    #[test]
    fn impact_comes_from_the_origin() {
        let job =
            PersistenceRetryJob::new(state(), envelope(Origin::SessionCleanup), "j", None).unwrap();
        assert_eq!(job.session_impact(), SessionImpact::None);
        let job =
            PersistenceRetryJob::new(state(), envelope(Origin::CombatRewards), "combat", None)
                .unwrap();
        assert_eq!(job.session_impact(), SessionImpact::SessionDegraded);
        assert_eq!(job.retry_job_id().get_version_num(), 7);
    }

    #[test]
    fn invalid_jobs_are_refused() {
        let bad_activation =
            PersistenceRetryPayload::transfer_activation(Uuid::nil(), " ", "s", "z");
        assert!(
            PersistenceRetryJob::new(
                bad_activation,
                envelope(Origin::TransferActivation),
                "x",
                None
            )
            .is_err()
        );
        let mut empty_key = envelope(Origin::ClientAppearance);
        empty_key.idempotency_key = String::new();
        assert!(PersistenceRetryJob::new(state(), empty_key, "x", None).is_err());
        assert!(
            PersistenceRetryJob::new(state(), envelope(Origin::ClientAppearance), "", None)
                .is_err()
        );
        let mut negative = envelope(Origin::GameplayState);
        negative.owner_epoch = -1;
        assert!(PersistenceRetryJob::new(state(), negative, "x", None).is_err());
        assert!(
            PersistenceRetryJob::new(
                state(),
                envelope(Origin::ClientAppearance),
                "x",
                Some(String::new())
            )
            .is_err()
        );
    }

    #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
    #[serde(tag = "kind", rename_all = "snake_case")]
    enum Coins {
        Coins { amount: i64 },
    }

    impl crate::model::GameEffect for Coins {
        fn kind(&self) -> &'static str {
            "coins"
        }

        fn sets_value(&self) -> bool {
            false
        }
    }

    #[test]
    fn an_unnumbered_effect_from_a_copy_is_refused_and_an_offline_grant_is_not() {
        let effect =
            || PersistenceRetryPayload::effect(Uuid::nil(), &Coins::Coins { amount: 40 }).unwrap();
        let refused =
            PersistenceRetryJob::new(effect(), envelope(Origin::CombatRewards), "x", None)
                .unwrap_err();
        assert!(refused.0.contains("issue number"), "{refused}");
        let mut numbered = envelope(Origin::CombatRewards);
        numbered.issue_seq = 7;
        assert!(PersistenceRetryJob::new(effect(), numbered, "x", None).is_ok());
        let mut offline = envelope(Origin::CombatRewards);
        offline.owner_epoch = OFFLINE_EPOCH;
        assert!(PersistenceRetryJob::new(effect(), offline.clone(), "x", None).is_ok());
        // An offline grant is never numbered, and never a dump.
        let mut numbered_offline = offline.clone();
        numbered_offline.issue_seq = 3;
        assert!(PersistenceRetryJob::new(effect(), numbered_offline, "x", None).is_err());
        assert!(PersistenceRetryJob::new(state(), offline, "x", None).is_err());
        // A core write (a state dump, an activation) is no effect applied live.
        assert!(
            PersistenceRetryJob::new(state(), envelope(Origin::GameplayState), "x", None).is_ok()
        );
    }
}
