//! What a shard host receives: logins, loaded characters, handoffs, faults and the settle
//! steps. Shared by the host and everything that talks to it (the world's routing, travel,
//! faults), so none of them depends on the host itself.

use tokio::sync::oneshot;

use super::agent::Agent;
use shardkeep::character::{CharacterSnapshot, HandoffLoad, LoadedCharacter};
use shardkeep::journal::PlayerSnapshot;

/// A message to a host.
pub(super) enum Inbound {
    /// A login routed here by the gate.
    Login {
        agent: Agent,
        floor: i64,
        held: bool,
    },
    /// A login's claim landed.
    Loaded {
        agent: Agent,
        loaded: LoadedCharacter,
    },
    /// A player arrives through an exit from another shard. The source keeps its copy of the
    /// snapshot until the destination has it (a take whose reply was lost consumed the stored
    /// one).
    Handoff {
        agent: Agent,
        token: String,
        retained: Box<CharacterSnapshot>,
        old_session: String,
        old_player: PlayerSnapshot,
    },
    /// A handoff's claim landed.
    HandoffLoaded {
        agent: Agent,
        token: String,
        loaded: Box<HandoffLoad>,
        old_session: String,
        old_player: PlayerSnapshot,
    },
    /// Fault: one player here logs in on `target` while this shard keeps playing it.
    Zombify { target: String },
    /// Fault: the shard dies without flushing and a fresh one boots in its place (`quiet`: its
    /// cadences held for a while, so a second crash finds it has written nothing).
    Kill {
        /// Hold the replacement's cadences.
        quiet: bool,
    },
    /// Settling the run.
    Settle(SettleStep),
}

impl Inbound {
    /// The transfer a handoff message belongs to, if it is one.
    pub(super) fn transfer_token(&self) -> Option<&str> {
        match self {
            Inbound::Handoff { token, .. } | Inbound::HandoffLoaded { token, .. } => Some(token),
            _ => None,
        }
    }

    /// The agent a message carries, if any.
    pub(super) fn into_agent(self) -> Option<Agent> {
        match self {
            Inbound::Login { agent, .. }
            | Inbound::Loaded { agent, .. }
            | Inbound::Handoff { agent, .. }
            | Inbound::HandoffLoaded { agent, .. } => Some(agent),
            _ => None,
        }
    }
}

/// A step of the end of the run.
pub(super) enum SettleStep {
    /// Flush every live player, so zombie copies meet their fence.
    Reconcile(oneshot::Sender<()>),
    /// Re-assert every placement and wait for the writes.
    RefreshPlacements(oneshot::Sender<()>),
    /// List live sessions whose placement record does not name them.
    CheckPlacements(oneshot::Sender<(u64, Vec<String>)>),
    /// Settle transfers, record the floors, log everyone out, stop.
    Shutdown(oneshot::Sender<()>),
}
