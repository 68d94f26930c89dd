//! The producer side of the journal: when a realtime stream closes, its Redis marker is
//! cleared, then the cleanup entry is appended durably *before* the active session is removed.
//! If the append fails the session stays active, and the outcome says why.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use uuid::Uuid;

use super::{RealtimeStreamCleanup, SessionJournal};
use crate::coord::Coordination;

/// A session this server has attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveSession {
    /// The character it drives.
    pub character_id: Uuid,
}

/// This server's active sessions, by token. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct ActiveSessions {
    sessions: Arc<Mutex<HashMap<String, ActiveSession>>>,
}

impl ActiveSessions {
    /// Records an attached session.
    pub fn insert(&self, token: &str, session: ActiveSession) {
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.insert(token.to_owned(), session);
        }
    }

    /// True while `token` is active here.
    pub fn contains(&self, token: &str) -> bool {
        self.sessions
            .lock()
            .map(|s| s.contains_key(token))
            .unwrap_or(false)
    }

    fn remove(&self, token: &str) -> bool {
        self.sessions
            .lock()
            .map(|mut s| s.remove(token).is_some())
            .unwrap_or(false)
    }

    /// Sessions active here.
    pub fn len(&self) -> usize {
        self.sessions.lock().map(|s| s.len()).unwrap_or(0)
    }

    /// True when none are.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What stream cleanup did.
#[derive(Debug)]
pub struct CleanupOutcome {
    /// The journal entry, when the append succeeded.
    pub entry_id: Option<Uuid>,
    /// True when the active session was removed (only after a durable append).
    pub session_removed: bool,
    /// Why the append failed; the session is still active.
    pub enqueue_error: Option<crate::queue::QueueError>,
}

/// Cleans up after a closed stream: clear the session's Redis marker, append the journal entry,
/// and only then remove the active session here.
///
/// The marker goes before the append: once the entry is in the journal a worker may take it at
/// once, and a marker still set then reads as a reconnect, so a reconnectable cleanup would be
/// skipped (its order, resume ledger and location never applied) while its closer was a moment
/// from clearing the marker. The marker only says the stream is open, which it no longer is; a
/// reconnect that sets it again under the same token is still seen. A failed append leaves the
/// session active here, for the caller to append again.
pub async fn cleanup_stream(
    journal: &SessionJournal,
    sessions: &ActiveSessions,
    coord: &Coordination,
    cleanup: RealtimeStreamCleanup,
) -> CleanupOutcome {
    let token = cleanup.session_token.clone();
    if let Err(err) = coord.session_deactivate(&token).await {
        // The marker expires on its own; the journal entry is what must land.
        tracing::warn!(event = "session_marker_clear_failed", session = %token, error = %err);
    }
    match journal.append(cleanup).await {
        Err(err) => {
            tracing::warn!(event = "stream_cleanup_enqueue_failed", session = %token, error = %err,
                "session left active");
            metrics::counter!(crate::telemetry::CLEANUP_ENQUEUE_FAILURES_TOTAL).increment(1);
            CleanupOutcome {
                entry_id: None,
                session_removed: false,
                enqueue_error: Some(err),
            }
        }
        Ok(entry_id) => CleanupOutcome {
            entry_id: Some(entry_id),
            session_removed: sessions.remove(&token),
            enqueue_error: None,
        },
    }
}
