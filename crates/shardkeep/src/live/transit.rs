//! The steps of a handoff between shards, one store round each: [`Runtime::hand_off`] and
//! [`Runtime::arrive`] are built from them, and a host that drives its own retries (the
//! simulator, which meters every store call) runs the same steps instead of its own copy of the
//! protocol.
//!
//! The order they must run in: the source [`Transit::send`]s (the transfer is pending before
//! its payload exists, so the destination's activation marker outlives the source's wait); the
//! destination [`Transit::take`]s the payload once, [`Transit::claim`]s the character with it,
//! [`Transit::mark_activation`]s and enqueues [`Transit::activation_record`]; the source polls
//! [`Transit::activation`] until it is no longer waiting and then [`Transit::complete`]s the
//! transfer. A handoff that cannot arrive is ended with [`Transit::complete`] too.
//!
//! [`Runtime::hand_off`]: super::Runtime::hand_off
//! [`Runtime::arrive`]: super::Runtime::arrive

use chrono::Utc;
use uuid::Uuid;

use crate::CoordError;
use crate::character::{CharacterLoader, HandoffLoad, HandoffPayload, LoadError};
use crate::coord::{Coordination, HandoffTake, TransferActivation};
use crate::keyspace::HandoffScope;
use crate::retry::{
    IdempotencyEnvelope, InvalidJob, Origin, PersistenceRetryJob, PersistenceRetryPayload,
    RetryQueue,
};
use crate::ttl::Ttl;

/// The handoff protocol's steps over one deployment's stores. Cheap to clone.
#[derive(Clone)]
pub struct Transit {
    coord: Coordination,
    loader: CharacterLoader,
    retry: RetryQueue,
    handoff_ttl: Ttl,
    marker_ttl: Ttl,
}

impl std::fmt::Debug for Transit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transit")
            .field("handoff_ttl", &self.handoff_ttl)
            .field("marker_ttl", &self.marker_ttl)
            .finish_non_exhaustive()
    }
}

/// What a destination's take found under a token.
#[derive(Debug, Clone, PartialEq)]
pub enum Taken {
    /// The payload, taken: no other take of the token gets it.
    Carried(Box<HandoffPayload>),
    /// Nothing to take: already taken (an earlier take's reply may have been lost), expired, or
    /// never stored for this shard.
    Gone,
    /// A payload was taken but cannot be read: the handoff is lost (the source's checkpoint of
    /// the travelling content keeps it).
    Unreadable,
}

/// Where a transfer's activation stands, as its source sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// The destination activated the copy: its marker, or the activation's durable record (a
    /// Redis failover can lose the marker).
    Activated,
    /// Not activated yet, still pending.
    Waiting,
    /// Not activated and no longer pending: the transfer was ended without an activation (a
    /// handoff that could not arrive) or its pending mark expired. A Redis restart loses the
    /// marker and the pending mark together, and the activation's record exists only once a
    /// worker settled it: a source that acts on the outcome (journals its stream as a transfer
    /// or a removal) waits out the handoff's lifetime before taking `Ended` as final.
    Ended,
}

/// A failed [`Transit::send`].
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The snapshot could not be encoded as a payload; nothing was stored.
    #[error("the handoff payload cannot be encoded: {0}")]
    Payload(#[from] serde_json::Error),
    /// Redis failed; the step can be tried again under the same token.
    #[error(transparent)]
    Coordination(#[from] CoordError),
}

impl Transit {
    /// Steps over `coord`, `loader` and `retry`: payloads and pending marks live `handoff_ttl`,
    /// activation markers `marker_ttl`.
    pub fn new(
        coord: Coordination,
        loader: CharacterLoader,
        retry: RetryQueue,
        handoff_ttl: Ttl,
        marker_ttl: Ttl,
    ) -> Self {
        Self {
            coord,
            loader,
            retry,
            handoff_ttl,
            marker_ttl,
        }
    }

    /// The source's step: marks transfer `token` pending, then stores `payload` for
    /// `target_shard` under it. Idempotent under one token.
    pub async fn send(
        &self,
        token: &str,
        payload: &HandoffPayload,
        target_shard: &str,
    ) -> Result<(), SendError> {
        let bytes = payload.encode()?;
        let scope = HandoffScope::Placement(target_shard.to_owned());
        self.coord.transfer_begin(token, self.handoff_ttl).await?;
        self.coord
            .handoff_put(token, &scope, &bytes, self.handoff_ttl)
            .await?;
        Ok(())
    }

    /// The source's step when its handoff failed (an error or a timeout: the payload and the
    /// pending mark may have landed all the same): the payload stored for `target_shard` under
    /// `token` is taken back and the transfer ended, so neither is left for their lifetime.
    /// Nobody else holds the token, so nothing else can take it meanwhile. Idempotent.
    pub async fn withdraw(&self, token: &str, target_shard: &str) -> Result<(), CoordError> {
        self.coord.transfer_complete(token).await?;
        match self.take(token, target_shard).await {
            // Nothing can be stored under a key that cannot be made (a refused shard id).
            Ok(_) | Err(CoordError::InvalidKey(_)) => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// The destination's first step: takes the payload stored for `shard_id` under `token`.
    pub async fn take(&self, token: &str, shard_id: &str) -> Result<Taken, CoordError> {
        let scope = [HandoffScope::Placement(shard_id.to_owned())];
        Ok(match self.coord.handoff_take(token, &scope).await? {
            HandoffTake::Taken { payload, .. } => match HandoffPayload::decode(&payload) {
                Ok(carried) => Taken::Carried(Box::new(carried)),
                Err(_) => Taken::Unreadable,
            },
            HandoffTake::AlreadyConsumed | HandoffTake::NotFound => Taken::Gone,
        })
    }

    /// The destination's claim with the carried payload: adopted while the copy that dumped it
    /// still owns the character, else the freshest durable copy is loaded (the answer says
    /// which). The payload is gone from Redis by now: retry a failed claim (the source's
    /// checkpoint keeps the content should this process die meanwhile).
    pub async fn claim(
        &self,
        carried: &HandoffPayload,
        token: &str,
    ) -> Result<HandoffLoad, LoadError> {
        self.loader
            .claim_for_handoff(carried.clone(), token, carried.dumped_under_epoch)
            .await
    }

    /// The destination's marker that it activated transfer `activation.transfer_token` (what the
    /// source waits for); retry until it lands.
    pub async fn mark_activation(&self, activation: &TransferActivation) -> Result<(), CoordError> {
        self.coord
            .transfer_marker_set(activation, self.marker_ttl)
            .await
    }

    /// The activation's durable record: a retry job (it changes no row) the worker records, which
    /// ends the source's wait when a failover lost the marker. `epoch` is the destination's
    /// claim; `source` names the issuer.
    pub fn activation_record(
        activation: &TransferActivation,
        character_id: Uuid,
        epoch: i64,
        source: &str,
    ) -> Result<PersistenceRetryJob, InvalidJob> {
        let token = &activation.transfer_token;
        PersistenceRetryJob::new(
            PersistenceRetryPayload::transfer_activation(
                character_id,
                token,
                &activation.target_shard,
                &activation.target_zone,
            ),
            IdempotencyEnvelope {
                idempotency_key: format!("transfer:{token}"),
                owner_epoch: epoch,
                origin: Origin::TransferActivation,
                issued_at: Utc::now(),
                // An activation changes no row: it needs no place in the copy's issue sequence.
                issue_seq: 0,
            },
            source,
            Some(token.clone()),
        )
    }

    /// An activation as of now, at `shard_id`'s `zone`.
    pub fn activation_now(token: &str, shard_id: &str, zone: &str) -> TransferActivation {
        TransferActivation {
            transfer_token: token.to_owned(),
            target_shard: shard_id.to_owned(),
            target_zone: zone.to_owned(),
            activated_at: Utc::now(),
        }
    }

    /// The source's poll: whether the destination activated transfer `token` of `character_id`.
    pub async fn activation(
        &self,
        character_id: Uuid,
        token: &str,
    ) -> Result<Activation, CoordError> {
        if self.coord.transfer_marker_get(token).await?.is_some() {
            return Ok(Activation::Activated);
        }
        // The durable record answers when a failover lost the marker (and the pending mark).
        let recorded = self
            .retry
            .transfer_activation_recorded(character_id, token)
            .await
            .unwrap_or(false);
        if recorded {
            return Ok(Activation::Activated);
        }
        Ok(if self.coord.transfer_is_pending(token).await? {
            Activation::Waiting
        } else {
            Activation::Ended
        })
    }

    /// Ends transfer `token` (its source saw the outcome, or the handoff cannot arrive): the
    /// pending mark goes, and with it the activation marker's reason to stay.
    pub async fn complete(&self, token: &str) -> Result<(), CoordError> {
        self.coord.transfer_complete(token).await
    }
}
