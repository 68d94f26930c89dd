//! Cleanup effect plans (pure): which side effects a closed realtime stream needs.

use serde::{Deserialize, Serialize};

/// What to do after a realtime stream closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionLifecycleEffectPlan {
    /// The player may reconnect: persist the resume ledger, persist location, refresh presence.
    Reconnectable,
    /// The session is over: delete the resume ledger, persist location.
    PermanentRemoval,
    /// The character moved to another shard: delete the resume ledger; location and presence
    /// belong to the destination now.
    ConfirmedTransfer,
}

/// The side effects a plan asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Effects {
    /// Store the pending resume-ledger record.
    pub persist_resume_ledger: bool,
    /// Delete the session's resume-ledger record.
    pub delete_resume_ledger: bool,
    /// Write the character's location to the character store.
    pub persist_location: bool,
    /// Refresh the presence record.
    pub refresh_presence: bool,
}

impl SessionLifecycleEffectPlan {
    /// The plan's side effects. A confirmed transfer always deletes the ledger and touches
    /// nothing else, whatever plan the entry carries.
    pub fn effects(self, transfer_confirmed: bool) -> Effects {
        let plan = if transfer_confirmed {
            Self::ConfirmedTransfer
        } else {
            self
        };
        match plan {
            Self::Reconnectable => Effects {
                persist_resume_ledger: true,
                delete_resume_ledger: false,
                persist_location: true,
                refresh_presence: true,
            },
            Self::PermanentRemoval => Effects {
                persist_resume_ledger: false,
                delete_resume_ledger: true,
                persist_location: true,
                refresh_presence: false,
            },
            Self::ConfirmedTransfer => Effects {
                persist_resume_ledger: false,
                delete_resume_ledger: true,
                persist_location: false,
                refresh_presence: false,
            },
        }
    }

    /// Stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reconnectable => "reconnectable",
            Self::PermanentRemoval => "permanent_removal",
            Self::ConfirmedTransfer => "confirmed_transfer",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_plan_asks_for_its_effects() {
        let r = SessionLifecycleEffectPlan::Reconnectable.effects(false);
        assert!(
            r.persist_resume_ledger
                && r.persist_location
                && r.refresh_presence
                && !r.delete_resume_ledger
        );
        let p = SessionLifecycleEffectPlan::PermanentRemoval.effects(false);
        assert!(
            p.delete_resume_ledger
                && p.persist_location
                && !p.persist_resume_ledger
                && !p.refresh_presence
        );
        let t = SessionLifecycleEffectPlan::ConfirmedTransfer.effects(false);
        assert!(
            t.delete_resume_ledger
                && !t.persist_location
                && !t.refresh_presence
                && !t.persist_resume_ledger
        );
    }

    #[test]
    fn a_confirmed_transfer_overrides_the_plan() {
        assert_eq!(
            SessionLifecycleEffectPlan::Reconnectable.effects(true),
            SessionLifecycleEffectPlan::ConfirmedTransfer.effects(false)
        );
    }
}
