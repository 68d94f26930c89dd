//! Items moving between characters. The game keeps a [`ReleaseMark`] with an item a copy put
//! down; the runtime decides how its pickup goes, and runs the transfer when it must be one:
//!
//! | who put it down | the pickup |
//! | --- | --- |
//! | nobody (a spawn, a mob's drop) | a plain move |
//! | the picking copy itself (same character, same epoch) | a plain move |
//! | another player | a transfer: both rows and the `item_transferred` audit row commit together |
//! | an earlier copy of the same character | a transfer too: that copy may have died before a save recorded the put-down, so the floor copy may be a phantom of what this copy holds or held |
//!
//! A transfer holds the item with neither side until its commit answers: committed (the
//! acquirer's copy gets it), refused (it goes back to whoever put it down: the game puts it back
//! in that copy if it is still here, else on the floor with its mark), or voided (its releaser
//! was superseded, so it may be a zombie's phantom; or the outcome stayed unknown through the
//! budget, and handing it back could duplicate it). A row that moved under either side (a job,
//! an offline grant) is merged into the copy held here and the transfer dumped again.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::copies::CopyId;
use super::{LiveError, LiveGame, Runtime};
use crate::audit::AuditEvent;
use crate::character::{CharacterSnapshot, Releaser, TransferCommit};
use crate::saver::SaveReason;

/// Attempts a transfer makes, each with fresh dumps, while a write of a side keeps winning the
/// version race.
const ATTEMPTS: u32 = 5;

/// Who put an item down: the game keeps it with the item while it lies on a floor or in a
/// container there, and hands it to [`Runtime::pick_up`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReleaseMark {
    /// The character whose copy put it down.
    pub by: Uuid,
    /// That copy's epoch.
    pub epoch: i64,
}

/// How a pickup ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PickedUp {
    /// A plain move: the item is in the acquirer's copy.
    Moved,
    /// A transfer committed with its audit row: the item is in the acquirer's copy.
    Committed,
    /// Refused, nothing written: the item goes back to whoever put it down.
    GiveBack {
        /// Why.
        reason: String,
    },
    /// The item leaves the world, on the record.
    Void {
        /// Why.
        reason: String,
    },
}

/// How a pickup must go (pure): a plain move only when nobody, or the picking copy itself, put
/// the item down.
pub fn pickup_commits(acquirer: CopyId, mark: Option<ReleaseMark>) -> bool {
    mark.is_some_and(|m| m.by != acquirer.character_id || m.epoch != acquirer.owner_epoch)
}

impl<G: LiveGame> Runtime<G> {
    /// The mark of an item `copy` puts down now.
    pub fn release(&self, copy: CopyId) -> Result<ReleaseMark, LiveError> {
        self.inner
            .copies
            .with(copy, |_| ReleaseMark {
                by: copy.character_id,
                epoch: copy.owner_epoch,
            })
            .ok_or(LiveError::Gone(copy))
    }

    /// `acquirer` picks up the item `item_id` that lies with `mark`; `give` puts it into a
    /// character (it runs under the registry's lock: it must not call the runtime). A plain move gives it at once. A transfer dumps the acquirer with the item
    /// (its live copy unchanged meanwhile) and the releaser as it is now (its copy here, or its
    /// stored row when it left), commits both with an `item_transferred` audit row carrying
    /// `details`, and gives the item to the live acquirer only once committed. One transfer at
    /// a time per character ([`LiveError::TransferPending`]).
    pub async fn pick_up(
        &self,
        acquirer: CopyId,
        item_id: Uuid,
        mark: Option<ReleaseMark>,
        details: serde_json::Value,
        give: impl Fn(&mut G::Character),
    ) -> Result<PickedUp, LiveError>
    where
        G::Character: Clone,
    {
        let inner = &self.inner;
        let Some(mark) = mark.filter(|_| pickup_commits(acquirer, mark)) else {
            self.update(acquirer, |c| give(c))?;
            return Ok(PickedUp::Moved);
        };
        let _slot = inner.transfers.take(&[acquirer.character_id, mark.by])?;
        let event = AuditEvent::item_transferred(
            acquirer.character_id,
            mark.by,
            Uuid::now_v7(),
            details_with(details, item_id),
        );
        for attempt in 1..=ATTEMPTS {
            let (with_item, releaser) = self.transfer_sides(acquirer, mark, &give)?;
            let side = match &releaser {
                Some(snapshot) => Releaser::Held {
                    snapshot,
                    item_id: Some(item_id),
                    released_epoch: mark.epoch,
                },
                None => Releaser::Departed {
                    character_id: mark.by,
                    item_id,
                    released_epoch: mark.epoch,
                },
            };
            let answer = self.commit(side, &with_item, &event).await;
            match answer {
                Ok(TransferCommit::VersionRace {
                    releaser_current,
                    acquirer_current,
                }) if attempt < ATTEMPTS => {
                    if let Some(current) = acquirer_current {
                        super::writes::merge(inner, acquirer, current).await;
                    }
                    if let (Some(current), Some(held)) =
                        (releaser_current, inner.copies.current(mark.by))
                        && held != acquirer
                    {
                        super::writes::merge(inner, held, current).await;
                    }
                }
                Ok(TransferCommit::VersionRace { .. }) => {
                    return Ok(PickedUp::GiveBack {
                        reason: format!("lost the version race {attempt} times"),
                    });
                }
                Ok(TransferCommit::Committed {
                    releaser_version,
                    acquirer_version,
                }) => {
                    inner
                        .game
                        .saved(acquirer, SaveReason::Flush, acquirer_version);
                    self.handed_over(acquirer, &with_item, acquirer_version, &give)?;
                    if let (Some(version), Some(before)) = (releaser_version, &releaser)
                        && let Some(held) = inner.copies.current(mark.by)
                        && held != acquirer
                    {
                        inner.copies.with(held, |c| {
                            if c.version == before.state_version {
                                c.version = version;
                            }
                        });
                        inner.game.saved(held, SaveReason::Flush, version);
                    }
                    return Ok(PickedUp::Committed);
                }
                Ok(TransferCommit::AlreadyCommitted) => {
                    inner.copies.with(acquirer, |c| give(&mut c.character));
                    return Ok(PickedUp::Committed);
                }
                Ok(TransferCommit::Rejected(reason)) => return Ok(PickedUp::GiveBack { reason }),
                Ok(TransferCommit::ReleaserSuperseded { current_epoch }) => {
                    return Ok(PickedUp::Void {
                        reason: format!(
                            "put down by a copy that lost ownership (row epoch {current_epoch})"
                        ),
                    });
                }
                Err(reason) => {
                    return Ok(PickedUp::Void {
                        reason: format!("outcome unknown: {reason}"),
                    });
                }
            }
        }
        Ok(PickedUp::GiveBack {
            reason: "no attempt left".into(),
        })
    }

    /// The acquirer dumped as if it held the item, and the releaser's current snapshot when a
    /// copy of it is here (the acquirer's own, without the item, when it put the item down in
    /// an earlier copy).
    fn transfer_sides(
        &self,
        acquirer: CopyId,
        mark: ReleaseMark,
        give: &impl Fn(&mut G::Character),
    ) -> Result<(CharacterSnapshot, Option<CharacterSnapshot>), LiveError>
    where
        G::Character: Clone,
    {
        let inner = &self.inner;
        let (with_item, without) = inner
            .copies
            .with_active(acquirer, |c| {
                let mut holding = c.character.clone();
                give(&mut holding);
                let with_item = inner.game.dump(&holding).map_err(LiveError::Game)?;
                let without = inner.game.dump(&c.character).map_err(LiveError::Game)?;
                // One dump, two outcomes: both at its mark.
                let with_item = c.dump(acquirer.character_id, with_item);
                Ok::<_, LiveError>((with_item, c.snapshot(acquirer.character_id, without)))
            })
            .ok_or(LiveError::Gone(acquirer))??;
        if mark.by == acquirer.character_id {
            return Ok((with_item, Some(without)));
        }
        let releaser = inner.copies.current(mark.by).and_then(|held| {
            inner
                .copies
                .with(held, |c| {
                    if c.leaving {
                        return None;
                    }
                    let state = inner.game.dump(&c.character).ok()?;
                    Some(c.dump(mark.by, state))
                })
                .flatten()
        });
        Ok((with_item, releaser))
    }

    /// One commit, retried while its outcome is unknown (a retry of a commit that landed
    /// answers `AlreadyCommitted`), for at most the runtime's transfer budget.
    async fn commit(
        &self,
        side: Releaser<'_>,
        acquirer: &CharacterSnapshot,
        event: &AuditEvent,
    ) -> Result<TransferCommit, String> {
        let inner = &self.inner;
        let model = self.inner.game.model();
        let deadline = tokio::time::Instant::now() + inner.config.transfer_budget;
        let mut pause = Duration::from_millis(200);
        loop {
            let attempt = tokio::time::timeout(
                inner.config.io_timeout,
                inner
                    .stores
                    .characters
                    .commit_transfer(&model, side, acquirer, event),
            )
            .await;
            let error = match attempt {
                Ok(Ok(outcome)) => return Ok(outcome),
                Ok(Err(err)) => err.to_string(),
                Err(_) => "timed out".to_owned(),
            };
            if tokio::time::Instant::now() + pause >= deadline {
                return Err(format!("after retries: {error}"));
            }
            tokio::select! {
                () = inner.cancel.cancelled() => return Err("the runtime stopped".into()),
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// A committed transfer: the live acquirer gets the item and, when it did not move on
    /// since its dump, adopts its row's new version. A copy evicted meanwhile is not there to
    /// take it; the item is in its row all the same.
    fn handed_over(
        &self,
        acquirer: CopyId,
        dumped: &CharacterSnapshot,
        version: i64,
        give: &impl Fn(&mut G::Character),
    ) -> Result<(), LiveError> {
        self.inner.copies.with(acquirer, |c| {
            give(&mut c.character);
            if c.version == dumped.state_version {
                c.version = version;
            }
        });
        Ok(())
    }
}

/// The audit row's payload: the game's details with the item's id.
fn details_with(details: serde_json::Value, item_id: Uuid) -> serde_json::Value {
    let mut details = match details {
        serde_json::Value::Object(map) => map,
        serde_json::Value::Null => serde_json::Map::new(),
        other => {
            let mut map = serde_json::Map::new();
            map.insert("details".into(), other);
            map
        }
    };
    details.insert("item_id".into(), serde_json::json!(item_id));
    serde_json::Value::Object(details)
}

/// The characters with a transfer in flight here: one at a time each.
#[derive(Debug, Default)]
pub(crate) struct Transfers {
    busy: std::sync::Mutex<std::collections::HashSet<Uuid>>,
}

/// A transfer's hold on its characters; dropping it lets them go.
pub(crate) struct Slot<'a> {
    transfers: &'a Transfers,
    characters: Vec<Uuid>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut busy = self
            .transfers
            .busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for id in &self.characters {
            busy.remove(id);
        }
    }
}

impl Transfers {
    /// True while `character_id` takes part in a transfer here.
    pub(crate) fn busy(&self, character_id: Uuid) -> bool {
        self.busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(&character_id)
    }

    /// Waits, at most `bound`, until `character_id` takes part in no transfer here (its copy may
    /// then leave: the transfer's item is in it, or went back).
    pub(crate) async fn idle(&self, character_id: Uuid, bound: Duration) {
        let deadline = tokio::time::Instant::now() + bound;
        while self.busy(character_id) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Holds `characters` for one transfer; refused when one of them has one in flight (a dump
    /// taken meanwhile would leave that item out).
    pub(crate) fn take(&self, characters: &[Uuid]) -> Result<Slot<'_>, LiveError> {
        let mut busy = self
            .busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(taken) = characters.iter().find(|id| busy.contains(id)) {
            return Err(LiveError::TransferPending(*taken));
        }
        let mut held = Vec::new();
        for id in characters {
            if busy.insert(*id) {
                held.push(*id);
            }
        }
        Ok(Slot {
            transfers: self,
            characters: held,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_copy_that_put_an_item_down_takes_it_back_as_a_plain_move() {
        let me = CopyId {
            character_id: Uuid::from_u128(1),
            owner_epoch: 4,
        };
        let mark = |by: u128, epoch: i64| {
            Some(ReleaseMark {
                by: Uuid::from_u128(by),
                epoch,
            })
        };
        assert!(!pickup_commits(me, None), "a spawn");
        assert!(!pickup_commits(me, mark(1, 4)), "its own put-down");
        assert!(pickup_commits(me, mark(1, 3)), "an earlier copy's put-down");
        assert!(pickup_commits(me, mark(2, 4)), "another player's");
    }

    #[test]
    fn a_character_takes_part_in_one_transfer_at_a_time() {
        let transfers = Transfers::default();
        let (a, b, c) = (Uuid::from_u128(1), Uuid::from_u128(2), Uuid::from_u128(3));
        let slot = transfers.take(&[a, b]);
        assert!(slot.is_ok());
        assert!(matches!(
            transfers.take(&[c, b]),
            Err(LiveError::TransferPending(id)) if id == b
        ));
        drop(slot);
        assert!(transfers.take(&[c, b]).is_ok());
        // A self-transfer names the character once.
        assert!(transfers.take(&[a, a]).is_ok());
    }
}
