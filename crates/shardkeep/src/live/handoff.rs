//! Handing a live copy to another shard, and taking one in, as one call each.
//!
//! The source: the copy's dump (at its destination) is also written as its checkpoint, so a
//! handoff nobody takes loses nothing; the transfer is marked pending, the payload stored under
//! a fresh token for the destination, and the copy leaves without a save (its content travels).
//! It then waits for the destination's activation marker, completes the transfer and journals
//! its closed stream as a confirmed transfer; a handoff never taken is abandoned the same way
//! as a permanent removal.
//!
//! The destination: the payload is taken once, the claim adopts the carried content only while
//! the copy that dumped it still owned the character (a zombie's handoff is refused and the
//! freshest durable copy loaded instead), the copy is admitted and its session started, and the
//! activation is marked and recorded durably.

use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use super::copies::CopyId;
use super::game::Arrival;
use super::transit::{Activation, SendError, Taken, Transit};
use super::{Admitted, Inner, LiveError, LiveGame, Runtime, SessionStart};
use crate::character::{CharacterSnapshot, HandoffPayload};
use crate::journal::SessionLifecycleEffectPlan;
use crate::model::Anchor;

/// A copy on its way to another shard: the client presents the token there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoffTicket {
    /// The handoff's token.
    pub token: String,
    /// The shard that takes it.
    pub target_shard: String,
}

/// Pause between attempts of a step that must land.
const RETRY_PAUSE: Duration = Duration::from_millis(250);

impl<G: LiveGame> Runtime<G> {
    /// Hands `copy` to `target_shard`, anchored at `destination` there. The copy leaves this
    /// shard without a save; the returned token is what the client presents to the other shard's
    /// [`Runtime::arrive`]. Nothing leaves when the handoff cannot be stored.
    pub async fn hand_off(
        &self,
        copy: CopyId,
        target_shard: &str,
        destination: Anchor,
    ) -> Result<HandoffTicket, LiveError> {
        let inner = &self.inner;
        // An item transfer of the character in flight ends first, so the content that
        // travels holds its outcome; one starting meanwhile finds the copy leaving.
        inner
            .transfers
            .idle(copy.character_id, inner.config.transfer_budget)
            .await;
        let taken = inner
            .copies
            .with_active(copy, |c| {
                let state = inner.game.dump(&c.character).map_err(LiveError::Game)?;
                let mut snapshot = c.dump(copy.character_id, state);
                snapshot.zone_ref = destination.zone_ref.clone();
                snapshot.room_ref = destination.room_ref.clone();
                c.leaving = true;
                let session = Some(c.link.token().to_owned());
                Ok::<_, LiveError>((snapshot, session))
            })
            .ok_or(LiveError::Gone(copy))??;
        let (snapshot, session) = taken;
        let token = Uuid::now_v7().simple().to_string();
        let stored = tokio::time::timeout(inner.config.io_timeout, async {
            // The travelling content is kept too: an untaken handoff then costs nothing.
            let _ = inner.stores.checkpoints.write(&snapshot).await;
            let payload = HandoffPayload::new(snapshot.clone());
            inner
                .stores
                .transit
                .send(&token, &payload, target_shard)
                .await
                .map_err(|err| match err {
                    SendError::Payload(err) => LiveError::Game(err.to_string()),
                    SendError::Coordination(err) => LiveError::Coordination(err),
                })
        })
        .await;
        match stored {
            Ok(Ok(())) => {}
            failed => {
                withdraw(inner, token, target_shard.to_owned());
                inner.copies.with(copy, |c| c.leaving = false);
                return Err(match failed {
                    Ok(Err(err)) => err,
                    _ => LiveError::NotDurable("storing the handoff timed out".into()),
                });
            }
        }
        inner.copies.remove(copy);
        await_activation(inner, copy, token.clone(), snapshot, session);
        Ok(HandoffTicket {
            token,
            target_shard: target_shard.to_owned(),
        })
    }

    /// Takes the copy handed to this shard under `token`: the payload is taken once, the claim
    /// adopts the carried content only while the copy that dumped it still owned the character
    /// (otherwise the freshest durable copy is loaded: [`Admitted::source`] says which), and the
    /// session starts here.
    pub async fn arrive(&self, token: &str, start: SessionStart) -> Result<Admitted, LiveError> {
        let inner = &self.inner;
        // A stopped (or killed) runtime takes nothing: the handoff waits for a live one.
        if inner.cancel.is_cancelled() || inner.closing.load(std::sync::atomic::Ordering::Acquire) {
            return Err(LiveError::Stopped);
        }
        // Checked before the handoff is taken: a refused token takes nothing.
        let session_token = start.token()?;
        self.schema_current().await?;
        let taken = tokio::time::timeout(
            inner.config.io_timeout,
            inner.stores.transit.take(token, &inner.config.shard_id),
        )
        .await
        .map_err(|_| LiveError::NotDurable("taking the handoff timed out".into()))??;
        let Taken::Carried(carried) = taken else {
            return Err(LiveError::UnknownHandoff);
        };
        let character_id = carried.snapshot.character_id;
        // The payload is gone from Redis: the claim is retried (the source's checkpoint holds
        // the content should this process die meanwhile).
        let deadline = tokio::time::Instant::now() + inner.config.io_timeout * 3;
        let load = loop {
            match inner.stores.transit.claim(&carried, token).await {
                Ok(load) => break load,
                Err(err) if tokio::time::Instant::now() >= deadline => return Err(err.into()),
                Err(_) => tokio::time::sleep(RETRY_PAUSE).await,
            }
        };
        let loaded = load.into_loaded();
        let (admitted, zone) = self.admit_arrival(&loaded, session_token)?;
        mark_activation(inner, admitted.copy, token, &zone, character_id);
        Ok(admitted)
    }

    fn admit_arrival(
        &self,
        loaded: &crate::character::LoadedCharacter,
        session_token: String,
    ) -> Result<(Admitted, String), LiveError> {
        let inner = &self.inner;
        let admission = super::sessions::admit(inner, loaded, Arrival::Handoff, &session_token)?;
        super::sessions::start_arrival(
            inner,
            &admission,
            loaded.snapshot.account_id,
            &session_token,
        );
        Ok((
            Admitted {
                copy: admission.copy,
                session_token,
                source: Some(loaded.source),
                brand_new: loaded.brand_new,
                resumed: None,
                origin: Some(loaded.origin.clone()),
                session_order: admission.order,
            },
            admission.zone,
        ))
    }
}

/// The destination's side of an activation: the marker the source waits for (retried until it
/// lands) and the activation's durable record (a retry job the worker records).
fn mark_activation<G: LiveGame>(
    inner: &Arc<Inner<G>>,
    copy: CopyId,
    token: &str,
    zone: &str,
    character_id: Uuid,
) {
    let activation = Transit::activation_now(token, &inner.config.shard_id, zone);
    let job = Transit::activation_record(
        &activation,
        character_id,
        copy.owner_epoch,
        &format!("live-{}", inner.config.shard_id),
    );
    let background = inner.background.clone();
    let inner = Arc::clone(inner);
    background.spawn(async move {
        loop {
            let set = tokio::time::timeout(
                inner.config.io_timeout,
                inner.stores.transit.mark_activation(&activation),
            )
            .await;
            if matches!(set, Ok(Ok(()))) {
                break;
            }
            tokio::select! {
                () = inner.cancel.cancelled() => return,
                () = tokio::time::sleep(RETRY_PAUSE) => {}
            }
        }
        if let Ok(job) = job {
            let _ = tokio::time::timeout(inner.config.io_timeout, inner.stores.retry.enqueue(&job))
                .await;
        }
    });
}

/// A handoff that failed to store (or timed out) may have landed all the same: its payload is
/// taken back and its transfer ended, retried until both land (within the handoff's lifetime,
/// which bounds them anyway), so the copy that stays leaves nothing pending behind it.
fn withdraw<G: LiveGame>(inner: &Arc<Inner<G>>, token: String, target_shard: String) {
    let background = inner.background.clone();
    let inner = Arc::clone(inner);
    background.spawn(async move {
        let deadline = tokio::time::Instant::now() + inner.config.handoff_ttl.duration();
        let transit = &inner.stores.transit;
        while tokio::time::Instant::now() < deadline {
            let done = tokio::time::timeout(
                inner.config.io_timeout,
                transit.withdraw(&token, &target_shard),
            )
            .await;
            if matches!(done, Ok(Ok(()))) {
                return;
            }
            tokio::select! {
                () = inner.cancel.cancelled() => return,
                () = tokio::time::sleep(RETRY_PAUSE) => {}
            }
        }
    });
}

/// The source after its handoff left: waits for the destination's activation (the marker, or
/// its durable record when a failover lost the marker), then completes the transfer and
/// journals the closed stream as a confirmed transfer. A handoff not taken within its lifetime
/// is abandoned: the transfer completes and the stream closes as a permanent removal (the
/// copy's checkpoint holds what it carried). A shutdown waits for these (within its bound) and
/// counts the ones it leaves unsettled (one no longer pending is not taken as abandoned then
/// either: a Redis restart loses its marks while its activation's record may be on its way);
/// the game hears of each settled one ([`LiveGame::handed_off`]).
fn await_activation<G: LiveGame>(
    inner: &Arc<Inner<G>>,
    copy: CopyId,
    token: String,
    snapshot: CharacterSnapshot,
    session: Option<String>,
) {
    let background = inner.background.clone();
    let inner = Arc::clone(inner);
    let tracked = inner.handoffs.track();
    background.spawn(async move {
        let _tracked = tracked;
        let deadline = tokio::time::Instant::now() + inner.config.handoff_ttl.duration();
        let transit = &inner.stores.transit;
        let mut activated = false;
        while tokio::time::Instant::now() < deadline {
            let seen = tokio::time::timeout(
                inner.config.io_timeout,
                transit.activation(copy.character_id, &token),
            )
            .await;
            match seen {
                Ok(Ok(Activation::Activated)) => {
                    activated = true;
                    break;
                }
                // Not pending any more is not proof of an untaken handoff before the lifetime
                // is out: a Redis restart loses the marker and the pending mark together while
                // the activation's record may not be settled yet. The stream is closed on the
                // outcome, so the wait goes on.
                Ok(Ok(Activation::Waiting | Activation::Ended) | Err(_)) | Err(_) => {}
            }
            tokio::select! {
                () = inner.cancel.cancelled() => return,
                () = tokio::time::sleep(RETRY_PAUSE) => {}
            }
        }
        loop {
            let done =
                tokio::time::timeout(inner.config.io_timeout, transit.complete(&token)).await;
            if matches!(done, Ok(Ok(()))) {
                break;
            }
            tokio::select! {
                () = inner.cancel.cancelled() => return,
                () = tokio::time::sleep(RETRY_PAUSE) => {}
            }
        }
        if !activated {
            tracing::warn!(event = "handoff_untaken", character = %copy.character_id, %token,
                "no shard took the handoff; its checkpoint holds the content");
        }
        if let Some(session) = session {
            let plan = if activated {
                SessionLifecycleEffectPlan::ConfirmedTransfer
            } else {
                SessionLifecycleEffectPlan::PermanentRemoval
            };
            super::sessions::close_stream(&inner, &snapshot, session, plan);
        }
        inner.game.handed_off(copy, &token, activated);
    });
}
