//! Writes a live copy makes outside the cadences: a grant the player must not lose (applied live,
//! numbered in the copy's issue sequence, then made durable before the call returns), a save on
//! demand, an offline grant for a character that may be online anywhere, and the merge that
//! brings what landed under a copy (an offline grant, a requeued job) into it before it adopts
//! the row's version.

use std::sync::Arc;

use chrono::Utc;
use uuid::Uuid;

use super::copies::{CopyId, Link, LiveCopy};
use super::{EvictionCause, Inner, LiveError, LiveGame, Runtime};
use crate::character::SaveOutcome;
use crate::model::GameEffect;
use crate::retry::apply::RecordedEffect;
use crate::retry::{IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload};
use crate::saver::SaveReason;

pub use crate::retry::OFFLINE_EPOCH;

/// How a grant was made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Granted {
    /// The copy's dump holding it is the row now.
    Saved {
        /// The row's version.
        version: i64,
    },
    /// The row had moved on: the grant is a durable retry job, applied once (a dump of this
    /// copy that already holds it makes the job a no-op).
    Queued {
        /// The job.
        retry_job_id: Uuid,
    },
}

/// An offline grant, stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OfflineGrant {
    /// The job that carries it.
    pub retry_job_id: Uuid,
}

fn origin_of(effect: &impl GameEffect) -> Origin {
    if effect.sets_value() {
        Origin::GameplayState
    } else {
        Origin::CombatRewards
    }
}

/// A grant applied to a live copy and numbered: its number, the session it was granted in, and
/// what was taken of the copy with it.
struct Numbered<T> {
    seq: u64,
    session: Option<String>,
    taken: T,
}

/// Applies `effect` to the live copy and numbers it in the copy's issue sequence, then runs
/// `then` on the copy, all in one step under the registry's lock (no dump can see the grant
/// applied and not numbered).
fn apply_numbered<G: LiveGame, T>(
    inner: &Inner<G>,
    copy: CopyId,
    effect: &G::Effect,
    then: impl FnOnce(&mut LiveCopy<G::Character>) -> Result<T, LiveError>,
) -> Result<Numbered<T>, LiveError> {
    if inner.cancel.is_cancelled() {
        return Err(LiveError::Stopped);
    }
    inner
        .copies
        .with_active(copy, |c| {
            let mut anchor = c.anchor.clone();
            inner
                .game
                .apply(&mut c.character, &mut anchor, effect)
                .map_err(LiveError::InvalidEffect)?;
            if c.move_to(anchor) {
                super::sessions::placed(inner, copy, c.zone.clone());
            }
            c.issued += 1;
            let seq = c.issued;
            let session = match &c.link {
                Link::Attached(token) => Some(token.clone()),
                Link::LinkDead { .. } => None,
            };
            let taken = then(c)?;
            Ok(Numbered {
                seq,
                session,
                taken,
            })
        })
        .ok_or(LiveError::Gone(copy))?
}

/// The retry job that carries grant `seq` of `copy`: keyed by the copy and the number, so it is
/// stored once, and applied only where no dump holding the number landed first.
fn numbered_job<G: LiveGame>(
    inner: &Inner<G>,
    copy: CopyId,
    (effect, payload): (&G::Effect, PersistenceRetryPayload),
    seq: u64,
    session: Option<String>,
) -> Result<PersistenceRetryJob, LiveError> {
    let envelope = IdempotencyEnvelope {
        idempotency_key: format!("live:{}:{}:{seq}", copy.character_id, copy.owner_epoch),
        owner_epoch: copy.owner_epoch,
        origin: origin_of(effect),
        issued_at: Utc::now(),
        issue_seq: seq,
    };
    PersistenceRetryJob::new(payload, envelope, &source_of(inner), session)
        .map_err(|e| LiveError::InvalidEffect(e.to_string()))
}

/// The source label of jobs a runtime stores.
fn source_of<G: LiveGame>(inner: &Inner<G>) -> String {
    format!("live-{}", inner.config.shard_id)
}

/// A grant made at once ([`Runtime::grant_now`]): applied to the live copy and numbered; its
/// job is being stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantedNow {
    /// Its number in the copy's issue sequence (the copy's dumps from now on carry it).
    pub issue_seq: u64,
    /// The job that carries it to the row, once stored (a store that refuses it is logged; the
    /// copy's next save carries the grant then).
    pub retry_job_id: Uuid,
}

impl<G: LiveGame> Runtime<G> {
    /// Grants `effect` to the live copy and makes it durable before returning: the effect is
    /// applied to the copy (with the game's [`LiveGame::apply`]), numbered in the copy's issue
    /// sequence, and the copy's dump holding it is saved at once; when the row has moved on,
    /// the grant goes down as a retry job under its number instead, which no dump holding it can
    /// apply twice. An unnumbered live grant cannot be made: this is the only way to apply an
    /// effect to a live copy and store it. [`LiveError::NotDurable`] when neither store
    /// answered (the copy holds the grant; its next save carries it).
    pub async fn grant(&self, copy: CopyId, effect: G::Effect) -> Result<Granted, LiveError> {
        let inner = &self.inner;
        // Made before anything is applied: an effect no job can carry is refused whole.
        let payload = PersistenceRetryPayload::effect(copy.character_id, &effect)
            .map_err(LiveError::InvalidEffect)?;
        let numbered = apply_numbered(inner, copy, &effect, |c| {
            // Applied and numbered already: a dump that fails now leaves the grant in the
            // copy (the next save that can dump carries it), never to be granted again.
            let state = inner.game.dump(&c.character).map_err(|e| {
                LiveError::NotDurable(format!("applied, but the copy cannot be dumped: {e}"))
            })?;
            Ok(c.dump(copy.character_id, state))
        })?;
        let Numbered {
            seq,
            session,
            taken: dump,
        } = numbered;
        let saved =
            tokio::time::timeout(inner.config.io_timeout, inner.stores.characters.save(&dump))
                .await;
        let why = match saved {
            Ok(Ok(SaveOutcome::Saved(version))) => {
                inner.copies.with(copy, |c| {
                    if c.version == dump.state_version {
                        c.version = version;
                    }
                });
                inner.game.saved(copy, SaveReason::Flush, version);
                return Ok(Granted::Saved { version });
            }
            Ok(Ok(SaveOutcome::OwnershipLost(current_epoch))) => {
                super::driver::evict(inner, copy, EvictionCause::OwnershipLost { current_epoch });
                return Err(LiveError::Gone(copy));
            }
            Ok(Ok(other)) => format!("{other:?}"),
            Ok(Err(err)) => err.to_string(),
            Err(_) => "timed out".to_owned(),
        };
        let job = numbered_job(inner, copy, (&effect, payload), seq, session)?;
        match tokio::time::timeout(inner.config.io_timeout, inner.stores.retry.enqueue(&job)).await
        {
            Ok(Ok(_)) => Ok(Granted::Queued {
                retry_job_id: job.retry_job_id(),
            }),
            Ok(Err(err)) => Err(LiveError::NotDurable(format!("{why}; job: {err}"))),
            Err(_) => Err(LiveError::NotDurable(format!("{why}; job: timed out"))),
        }
    }

    /// Grants `effect` to the live copy now, without waiting on a store: for a game that grants
    /// inside its own tick. The effect is applied and numbered at once (as by
    /// [`Runtime::grant`]), and its numbered job is stored in the background: the row gets the
    /// grant from whichever lands first, the job or a dump of the copy holding it, and never
    /// twice. Until one lands the grant is as durable as any play (a crash loses it with the
    /// copy's other progress since its last save, and grants it to no one). A job the store
    /// refuses is logged; the copy's next save carries the grant. Being stored later, its job
    /// can reach the row after a job stored since (an offline grant): for an effect that sets a
    /// value (a move), the row holds the later-stored one until the copy's next write, which
    /// holds both in the order the copy played them.
    pub fn grant_now(&self, copy: CopyId, effect: G::Effect) -> Result<GrantedNow, LiveError> {
        let inner = &self.inner;
        let payload = PersistenceRetryPayload::effect(copy.character_id, &effect)
            .map_err(LiveError::InvalidEffect)?;
        let Numbered { seq, session, .. } = apply_numbered(inner, copy, &effect, |_| Ok(()))?;
        let job = numbered_job(inner, copy, (&effect, payload), seq, session)?;
        let granted = GrantedNow {
            issue_seq: seq,
            retry_job_id: job.retry_job_id(),
        };
        let retry = inner.stores.retry.clone();
        let io_timeout = inner.config.io_timeout;
        inner.background.spawn(async move {
            match tokio::time::timeout(io_timeout, retry.enqueue(&job)).await {
                Ok(Ok(_)) => {}
                Ok(Err(err)) => tracing::warn!(event = "grant_job_unstored",
                    character = %copy.character_id, seq, error = %err,
                    "the copy's next save carries the grant"),
                Err(_) => tracing::warn!(event = "grant_job_unstored",
                    character = %copy.character_id, seq, error = "timed out",
                    "the copy's next save carries the grant"),
            }
        });
        Ok(granted)
    }

    /// Grants `effect` to `character_id` wherever it is — offline, online here or on another
    /// shard — as a durable job stored now and applied once per `key` by the retry worker.
    /// Issued by no copy, it is superseded by no claim: it applies to the row under whichever
    /// copy owns the character, and a live copy merges it before it next writes (its flush
    /// finds the row moved, takes in what landed, and writes again).
    pub async fn grant_offline(
        &self,
        character_id: Uuid,
        key: &str,
        effect: G::Effect,
    ) -> Result<OfflineGrant, LiveError> {
        self.schema_current().await?;
        let inner = &self.inner;
        let payload = PersistenceRetryPayload::effect(character_id, &effect)
            .map_err(LiveError::InvalidEffect)?;
        let envelope = IdempotencyEnvelope {
            idempotency_key: key.to_owned(),
            owner_epoch: OFFLINE_EPOCH,
            origin: origin_of(&effect),
            issued_at: Utc::now(),
            issue_seq: 0,
        };
        let job = PersistenceRetryJob::new(payload, envelope, &source_of(inner), None)
            .map_err(|e| LiveError::InvalidEffect(e.to_string()))?;
        match tokio::time::timeout(inner.config.io_timeout, inner.stores.retry.enqueue(&job)).await
        {
            Ok(Ok(_)) => Ok(OfflineGrant {
                retry_job_id: job.retry_job_id(),
            }),
            Ok(Err(err)) => Err(LiveError::NotDurable(err.to_string())),
            Err(_) => Err(LiveError::NotDurable("timed out".into())),
        }
    }

    /// Saves `copy` to its row now and returns the row's version: a row that moved on is merged
    /// (what landed under the copy is taken in) and written again, up to three times. An item
    /// transfer of the character in flight answers first (within
    /// [`super::LiveConfig::transfer_budget`]; [`LiveError::TransferPending`] past it): a dump
    /// taken meanwhile would write the row without the item the commit just gave it.
    pub async fn save_now(&self, copy: CopyId) -> Result<i64, LiveError> {
        let inner = &self.inner;
        let id = copy.character_id;
        let mut last = String::new();
        for _ in 0..3 {
            inner.transfers.idle(id, inner.config.transfer_budget).await;
            // Looked at again under the registry's lock: a transfer that started since is seen.
            let dump = inner
                .copies
                .with_active(copy, |c| {
                    if inner.transfers.busy(id) {
                        return Ok(None);
                    }
                    let state = inner.game.dump(&c.character).map_err(LiveError::Game)?;
                    Ok::<_, LiveError>(Some(c.dump(id, state)))
                })
                .ok_or(LiveError::Gone(copy))??;
            let Some(dump) = dump else {
                return Err(LiveError::TransferPending(id));
            };
            let saved =
                tokio::time::timeout(inner.config.io_timeout, inner.stores.characters.save(&dump))
                    .await;
            match saved {
                Ok(Ok(SaveOutcome::Saved(version))) => {
                    inner.copies.with(copy, |c| {
                        if c.version == dump.state_version {
                            c.version = version;
                        }
                    });
                    inner.game.saved(copy, SaveReason::Flush, version);
                    return Ok(version);
                }
                Ok(Ok(SaveOutcome::VersionConflict(current))) => {
                    // A transfer's commit may be what moved the row: the copy adopts its version
                    // when it answers (merging now would adopt it without the item).
                    if !inner.transfers.busy(id) {
                        merge(inner, copy, current).await;
                    }
                    last = format!("the row moved to version {current}");
                }
                Ok(Ok(SaveOutcome::OwnershipLost(current_epoch))) => {
                    super::driver::evict(
                        inner,
                        copy,
                        EvictionCause::OwnershipLost { current_epoch },
                    );
                    return Err(LiveError::Gone(copy));
                }
                Ok(Ok(other)) => return Err(LiveError::NotDurable(format!("{other:?}"))),
                Ok(Err(err)) => return Err(LiveError::NotDurable(err.to_string())),
                Err(_) => return Err(LiveError::NotDurable("timed out".into())),
            }
        }
        Err(LiveError::NotDurable(format!(
            "lost the version race three times ({last})"
        )))
    }

    /// Queues a flush of every copy held here now, as the cadence would (a reconciling pass: a
    /// zombie's flush meets its fence and the copy is evicted). A copy leaving, or with an item
    /// transfer in flight, is left to its cadence. Returns how many were queued (none when the
    /// saver's queue had no room: the cadences save them); the saver's answers are handled as
    /// the cadences' are.
    pub fn flush_all(&self) -> usize {
        let inner = &self.inner;
        let mut flushes = Vec::new();
        inner.copies.each(|id, copy| {
            flushes.extend(super::driver::saveable_dump(inner, id, copy));
        });
        let queued = flushes.len();
        match inner.saver.enqueue_many(SaveReason::Flush, flushes) {
            crate::saver::EnqueueOutcome::Queued => queued,
            _ => 0,
        }
    }
}

/// True when `effect`, recorded on the row at a version past what `copy` knew, is not in the
/// copy yet: its own numbered grants are (applied live before they were numbered), and so is
/// anything issued by another copy (a claim fences those: none lands under a live copy but a
/// zombie's, which is the copy being evicted); an offline grant is not.
fn missing_from(effect: &RecordedEffect, epoch: i64, issued: u64) -> bool {
    if effect.payload.core().is_some() {
        return false;
    }
    !(effect.owner_epoch == epoch && effect.issue_seq > 0 && effect.issue_seq <= issued)
        && (effect.issue_seq == 0 || effect.owner_epoch == OFFLINE_EPOCH)
}

/// Takes what landed on the row under `copy` (up to `current`) into the live copy, then adopts
/// `current`: the copy's next dump at that version holds everything applied up to it.
pub(crate) async fn merge<G: LiveGame>(inner: &Arc<Inner<G>>, copy: CopyId, current: i64) {
    let Some(known) = inner.copies.with(copy, |c| c.version) else {
        return;
    };
    if known >= current {
        return;
    }
    let read = tokio::time::timeout(
        inner.config.io_timeout,
        inner
            .stores
            .characters
            .effects_applied_since(copy.character_id, known),
    )
    .await;
    let effects = match read {
        Ok(Ok(effects)) => effects,
        Ok(Err(err)) => {
            tracing::warn!(event = "live_merge_failed", character = %copy.character_id,
                error = %err, "the next conflict merges again");
            return;
        }
        Err(_) => {
            tracing::warn!(event = "live_merge_failed", character = %copy.character_id,
                error = "timed out", "the next conflict merges again");
            return;
        }
    };
    inner.copies.with(copy, |c| {
        if c.version != known {
            // Another merge or a landed write moved the copy meanwhile: it takes over.
            return;
        }
        let (epoch, issued) = (c.epoch, c.issued);
        for effect in effects
            .iter()
            .filter(|e| e.row_version <= current && missing_from(e, epoch, issued))
        {
            let applied = effect
                .payload
                .game_effect::<G::Effect>()
                .and_then(|decoded| {
                    let mut anchor = c.anchor.clone();
                    inner.game.apply(&mut c.character, &mut anchor, &decoded)?;
                    if c.move_to(anchor) && !c.leaving {
                        super::sessions::placed(inner, copy, c.zone.clone());
                    }
                    Ok(())
                });
            if let Err(error) = applied {
                tracing::warn!(event = "live_merge_skipped", character = %copy.character_id,
                    key = %effect.key, error, "an effect the row holds could not be played live");
            }
        }
        c.version = current;
    });
}

/// A logout's final save of `copy` lost the version race (a job, an offline grant or a
/// cleanup's location landed under it): what landed is merged into the final snapshot, which
/// goes again at the row's version — a blind rebase would overwrite an offline grant.
pub(crate) fn merge_final<G: LiveGame>(inner: &Arc<Inner<G>>, copy: CopyId, current: i64) {
    let Some(mut snapshot) = inner.finals.retained(copy) else {
        inner.finals.working(copy.character_id, false);
        return;
    };
    let working = inner.finals.hold_working(copy.character_id);
    let background = inner.background.clone();
    let inner = Arc::clone(inner);
    background.spawn(async move {
        let known = snapshot.state_version;
        let read = tokio::time::timeout(
            inner.config.io_timeout,
            inner
                .stores
                .characters
                .effects_applied_since(copy.character_id, known),
        )
        .await;
        let effects = match read {
            Ok(Ok(effects)) => effects,
            _ => {
                // Not rebased unmerged (that would write over what landed), nor sent again at
                // its own version (a read that keeps failing would loop): a durable job, whose
                // settle plays what landed after the dump's version on it.
                tracing::warn!(event = "live_merge_failed", character = %copy.character_id,
                    "the final save goes down as a durable job");
                super::finals::store_final_job(&inner, copy, &snapshot).await;
                return;
            }
        };
        let missing: Vec<&RecordedEffect> = effects
            .iter()
            .filter(|e| {
                e.row_version <= current
                    && missing_from(e, snapshot.owner_epoch, snapshot.issue_mark)
            })
            .collect();
        if !missing.is_empty() {
            match merged_document(&inner, &snapshot, &missing) {
                Ok((state, anchor)) => {
                    snapshot.state = state;
                    snapshot.zone_ref = anchor.zone_ref;
                    snapshot.room_ref = anchor.room_ref;
                }
                Err(error) => {
                    tracing::warn!(event = "live_merge_skipped", character = %copy.character_id,
                        error, "the final save goes without what landed under it")
                }
            }
        }
        snapshot.state_version = current;
        inner.finals.again(snapshot);
        drop(working);
        inner.finals.offer(&inner.saver);
    });
}

/// `snapshot`'s document with `effects` played on it as the game plays them live.
fn merged_document<G: LiveGame>(
    inner: &Inner<G>,
    snapshot: &crate::character::CharacterSnapshot,
    effects: &[&RecordedEffect],
) -> Result<(crate::character::StateJson, crate::model::Anchor), String> {
    let mut character = inner.game.load(&snapshot.state)?;
    let mut anchor = crate::model::Anchor {
        zone_ref: snapshot.zone_ref.clone(),
        room_ref: snapshot.room_ref.clone(),
    };
    for effect in effects {
        let decoded = effect.payload.game_effect::<G::Effect>()?;
        inner.game.apply(&mut character, &mut anchor, &decoded)?;
    }
    Ok((inner.game.dump(&character)?, anchor))
}

/// A flush of `copy` lost the version race: merge what landed, then flush again.
pub(crate) fn merge_and_flush<G: LiveGame>(inner: &Arc<Inner<G>>, copy: CopyId, current: i64) {
    let background = inner.background.clone();
    let inner = Arc::clone(inner);
    background.spawn(async move {
        merge(&inner, copy, current).await;
        let dump = inner.copies.with(copy, |c| {
            if c.leaving {
                return None;
            }
            let state = inner.game.dump(&c.character).ok()?;
            Some(c.dump(copy.character_id, state))
        });
        if let Some(Some(dump)) = dump {
            inner.saver.enqueue(SaveReason::Flush, dump);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::PersistenceRetryPayload;

    fn effect(epoch: i64, seq: u64) -> RecordedEffect {
        let payload = PersistenceRetryPayload::decode(
            serde_json::json!({ "kind": "combat_rewards", "character_id": Uuid::nil(),
                "experience": 1, "currency": 0, "items": [] }),
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        RecordedEffect {
            key: format!("k{epoch}-{seq}"),
            owner_epoch: epoch,
            issue_seq: seq,
            row_version: 9,
            payload,
        }
    }

    #[test]
    fn a_copy_merges_offline_and_unsequenced_grants_never_its_own() {
        // Copy at epoch 4 that issued 6 grants.
        assert!(!missing_from(&effect(4, 3), 4, 6), "its own grant");
        assert!(
            !missing_from(&effect(3, 9), 4, 6),
            "an older copy's is fenced"
        );
        assert!(
            missing_from(&effect(OFFLINE_EPOCH, 0), 4, 6),
            "an offline grant"
        );
        assert!(missing_from(&effect(4, 0), 4, 6), "an unsequenced job");
    }
}
