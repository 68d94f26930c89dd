//! What a shard host receives: logins, admitted characters, handoffs, faults and the settle
//! steps. Shared by the host and everything that talks to it (the world's routing, travel,
//! faults), so none of them depends on the host itself.

use tokio::sync::oneshot;

use super::agent::Agent;
use shardkeep::live::Admitted;

/// A message to a host.
pub(super) enum Inbound {
    /// A login routed here by the gate.
    Login { agent: Agent },
    /// A login's claim (or a resume of the copy held here) landed in this host's runtime.
    Admitted { agent: Agent, admitted: Admitted },
    /// A player arrives through an exit from another shard with the handoff's token; the copy
    /// that left was at `dumped_under`.
    Handoff {
        agent: Agent,
        token: String,
        dumped_under: i64,
    },
    /// A handoff (under `token`) taken in by this host's runtime.
    Arrived {
        agent: Agent,
        token: String,
        admitted: Admitted,
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
            Inbound::Handoff { token, .. } | Inbound::Arrived { token, .. } => Some(token),
            _ => None,
        }
    }

    /// The agent a message carries, if any.
    pub(super) fn into_agent(self) -> Option<Agent> {
        match self {
            Inbound::Login { agent }
            | Inbound::Admitted { agent, .. }
            | Inbound::Handoff { agent, .. }
            | Inbound::Arrived { agent, .. } => Some(agent),
            _ => None,
        }
    }
}

/// A step of the end of the run.
pub(super) enum SettleStep {
    /// Flush every live player, so zombie copies meet their fence; answers how many copies a
    /// newer claim superseded are still held (before this flush lands).
    Reconcile(oneshot::Sender<usize>),
    /// Re-assert every placement and wait for the writes.
    RefreshPlacements(oneshot::Sender<()>),
    /// List live sessions whose placement record does not name them.
    CheckPlacements(oneshot::Sender<(u64, Vec<String>)>),
    /// Settle transfers, record the floors, log everyone out, stop.
    Shutdown(oneshot::Sender<()>),
}
