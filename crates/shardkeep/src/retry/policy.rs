//! The session-impact policy: the one place that decides how much a pending persistence write
//! affects the player's session. Call sites name the origin of a write, never an impact.

use serde::{Deserialize, Serialize};

/// Where a retried write came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Periodic location persistence.
    BackgroundLocation,
    /// Side effects after a realtime stream closed.
    SessionCleanup,
    /// Persisting the old session when a new one takes the character over.
    SessionTakeover,
    /// The player changed appearance.
    ClientAppearance,
    /// The player changed equipment.
    ClientEquipment,
    /// A gameplay state write (for example a final flush that could not land).
    GameplayState,
    /// Combat rewards (experience, currency, loot).
    CombatRewards,
    /// A cross-shard transfer activation.
    TransferActivation,
}

impl Origin {
    /// Every origin, for tables and tests.
    pub const ALL: [Origin; 8] = [
        Origin::BackgroundLocation,
        Origin::SessionCleanup,
        Origin::SessionTakeover,
        Origin::ClientAppearance,
        Origin::ClientEquipment,
        Origin::GameplayState,
        Origin::CombatRewards,
        Origin::TransferActivation,
    ];

    /// Stable name stored with the job.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BackgroundLocation => "background_location",
            Self::SessionCleanup => "session_cleanup",
            Self::SessionTakeover => "session_takeover",
            Self::ClientAppearance => "client_appearance",
            Self::ClientEquipment => "client_equipment",
            Self::GameplayState => "gameplay_state",
            Self::CombatRewards => "combat_rewards",
            Self::TransferActivation => "transfer_activation",
        }
    }

    /// Parses a stored name.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == name)
    }
}

/// How much a pending write affects the active session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionImpact {
    /// Background or cleanup work; retrying does not degrade the session.
    None,
    /// The session may continue, but replay or repair needs attention while the write is pending.
    SessionDegraded,
    /// The session must be disconnected (reserved: no known origin maps here today).
    DisconnectRequired,
}

impl SessionImpact {
    /// Stable name stored with the job.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::SessionDegraded => "session_degraded",
            Self::DisconnectRequired => "disconnect_required",
        }
    }

    /// Parses a stored name.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::None, Self::SessionDegraded, Self::DisconnectRequired]
            .into_iter()
            .find(|i| i.as_str() == name)
    }
}

/// The impact of a write from `origin`. New origins are added here, never decided at a call site.
pub fn session_impact(origin: Origin) -> SessionImpact {
    match origin {
        Origin::BackgroundLocation | Origin::SessionCleanup | Origin::SessionTakeover => {
            SessionImpact::None
        }
        Origin::ClientAppearance
        | Origin::ClientEquipment
        | Origin::GameplayState
        | Origin::CombatRewards
        | Origin::TransferActivation => SessionImpact::SessionDegraded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_table_is_pinned() {
        let table: Vec<(&str, &str)> = Origin::ALL
            .iter()
            .map(|o| (o.as_str(), session_impact(*o).as_str()))
            .collect();
        assert_eq!(
            table,
            vec![
                ("background_location", "none"),
                ("session_cleanup", "none"),
                ("session_takeover", "none"),
                ("client_appearance", "session_degraded"),
                ("client_equipment", "session_degraded"),
                ("gameplay_state", "session_degraded"),
                ("combat_rewards", "session_degraded"),
                ("transfer_activation", "session_degraded"),
            ]
        );
    }

    #[test]
    fn names_round_trip_and_unknown_names_are_rejected() {
        for origin in Origin::ALL {
            assert_eq!(Origin::parse(origin.as_str()), Some(origin));
        }
        assert_eq!(Origin::parse("teleport"), None);
        assert_eq!(
            SessionImpact::parse("disconnect_required"),
            Some(SessionImpact::DisconnectRequired)
        );
        assert_eq!(SessionImpact::parse(""), None);
    }
}
