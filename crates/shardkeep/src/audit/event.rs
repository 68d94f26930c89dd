//! Audit events (pure): what permanently happened, to whom, and the key that makes recording it
//! twice harmless.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Whose trail an event belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubjectType {
    /// A character.
    Character,
    /// An account.
    Account,
}

impl SubjectType {
    /// Stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Character => "character",
            Self::Account => "account",
        }
    }
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The subject was created (once per subject).
    Created,
    /// A character died.
    Died,
    /// A permanent base-attribute grant.
    Attribute,
    /// A step on an advancement track.
    Track,
    /// An item crossed from one player to another.
    ItemTransferred,
    /// An account's tier changed.
    TierChanged,
}

impl EventKind {
    /// Stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Died => "died",
            Self::Attribute => "attribute",
            Self::Track => "track",
            Self::ItemTransferred => "item_transferred",
            Self::TierChanged => "tier_changed",
        }
    }
}

/// One audit event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// Row id.
    pub id: Uuid,
    /// Whose trail.
    pub subject_type: SubjectType,
    /// The subject.
    pub subject_id: Uuid,
    /// What happened.
    pub kind: EventKind,
    /// Durably unique per logical event: recording it twice records it once.
    pub dedup_key: String,
    /// Who did it, when someone did.
    pub actor_id: Option<Uuid>,
    /// Details.
    pub payload: serde_json::Value,
}

impl AuditEvent {
    fn new(
        subject_type: SubjectType,
        subject_id: Uuid,
        kind: EventKind,
        dedup_key: String,
        actor_id: Option<Uuid>,
        payload: serde_json::Value,
    ) -> Self {
        Self {
            id: Uuid::now_v7(),
            subject_type,
            subject_id,
            kind,
            dedup_key,
            actor_id,
            payload,
        }
    }

    /// A subject was created (one per subject).
    pub fn created(
        subject_type: SubjectType,
        subject_id: Uuid,
        actor_id: Option<Uuid>,
        payload: serde_json::Value,
    ) -> Self {
        Self::new(
            subject_type,
            subject_id,
            EventKind::Created,
            "created".into(),
            actor_id,
            payload,
        )
    }

    /// A character died. `death_id` is minted fresh per death (never a per-session counter, which
    /// restarts at every login and would collide).
    pub fn died(
        character_id: Uuid,
        death_id: Uuid,
        killer: Option<Uuid>,
        payload: serde_json::Value,
    ) -> Self {
        Self::new(
            SubjectType::Character,
            character_id,
            EventKind::Died,
            death_id.to_string(),
            killer,
            payload,
        )
    }

    /// A permanent attribute-base grant, keyed by the grant's durable id.
    pub fn attribute(character_id: Uuid, grant_key: &str, payload: serde_json::Value) -> Self {
        Self::new(
            SubjectType::Character,
            character_id,
            EventKind::Attribute,
            grant_key.to_owned(),
            None,
            payload,
        )
    }

    /// A step on an advancement track, keyed `<track>\x1f<step>`.
    pub fn track(character_id: Uuid, track: &str, step: u32) -> Self {
        Self::new(
            SubjectType::Character,
            character_id,
            EventKind::Track,
            format!("{track}\u{1f}{step}"),
            None,
            serde_json::json!({ "track": track, "step": step }),
        )
    }

    /// An item released by `releaser` was picked up by `acquirer`; `pickup_id` is minted per
    /// pickup.
    pub fn item_transferred(
        acquirer: Uuid,
        releaser: Uuid,
        pickup_id: Uuid,
        payload: serde_json::Value,
    ) -> Self {
        Self::new(
            SubjectType::Character,
            acquirer,
            EventKind::ItemTransferred,
            pickup_id.to_string(),
            Some(releaser),
            payload,
        )
    }

    /// An account's tier changed, keyed by the role-change row's id.
    pub fn tier_changed(
        account_id: Uuid,
        role_change_id: Uuid,
        actor_id: Option<Uuid>,
        payload: serde_json::Value,
    ) -> Self {
        Self::new(
            SubjectType::Account,
            account_id,
            EventKind::TierChanged,
            role_change_id.to_string(),
            actor_id,
            payload,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedup_keys_follow_the_rules() {
        let c = Uuid::now_v7();
        assert_eq!(
            AuditEvent::track(c, "smithing", 3).dedup_key,
            "smithing\u{1f}3"
        );
        assert_eq!(
            AuditEvent::created(SubjectType::Character, c, None, serde_json::json!({})).dedup_key,
            "created"
        );
        let a = AuditEvent::died(c, Uuid::now_v7(), None, serde_json::json!({}));
        let b = AuditEvent::died(c, Uuid::now_v7(), None, serde_json::json!({}));
        assert_ne!(a.dedup_key, b.dedup_key, "every death is its own event");
    }
}
