//! Session lifecycle on a shard: admission after a login load, handoff arrival and re-dial,
//! link-dead resume, detach, logout, walking between rooms and zones, and graceful shutdown.

use std::time::Duration;

use uuid::Uuid;

use super::Shard;
use super::landing::{LandingCase, login_zone};
use super::zone::{Link, PlayerEntry};
use crate::game::CharacterModel;
use crate::game::LiveCharacter;
use crate::game::world::resolve_room;
use shardkeep::character::{CharacterSnapshot, LoadSource, LoadedCharacter};
use shardkeep::drain::BarrierOutcome;
use shardkeep::saver::SaveReason;

/// Final saves per saver queue entry at shutdown.
pub const SHUTDOWN_FINAL_SLICE: usize = 256;

/// Most final saves a shard keeps waiting for room in the saver's queue; beyond that the oldest
/// are dropped (counted and logged by the saver).
pub const MAX_DEFERRED_FINALS: usize = 10_000;

/// Most departures after a transfer kept for [`Shard::take_departed_after_transfer`] (a host
/// that never reads them keeps the newest).
const DEPARTED_KEPT: usize = 4096;

/// How a character arrives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arrival {
    /// A login (fresh or rehydrating) with a live session.
    Login {
        /// The session token.
        session_token: String,
    },
    /// A cross-shard handoff; the client re-dials with this token.
    Handoff {
        /// The handoff token.
        handoff_token: String,
    },
}

/// Where an admitted or resumed character landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// The zone.
    pub zone: String,
    /// The room.
    pub room: String,
    /// Which landing rule applied.
    pub case: LandingCase,
    /// Non-fatal problems met while applying the snapshot or resolving the room.
    pub warnings: Vec<String>,
    /// Where the content came from (`None` for a resume or re-dial, which load nothing).
    pub source: Option<LoadSource>,
}

/// Why a character could not be admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// This shard already holds the character; resume it instead of creating a second copy.
    #[error("character {0} is already held on this shard")]
    AlreadyHeld(Uuid),
    /// No hosted zone fits (the home zone is missing).
    #[error("zone {0:?} is not hosted on this shard")]
    NoZone(String),
    /// The character is not held here.
    #[error("character {0} is not on this shard")]
    NotHere(Uuid),
    /// No pending player carries this handoff token.
    #[error("no pending handoff for this token")]
    UnknownHandoff,
}

/// Result of a walk.
#[derive(Debug, Clone, PartialEq)]
pub enum WalkOutcome {
    /// Moved inside this shard.
    Moved {
        /// The zone now.
        zone: String,
        /// The room now.
        room: String,
    },
    /// The exit leads to a zone another shard owns: the character left without a save, and its
    /// snapshot travels with the handoff.
    Handoff(Box<OutboundHandoff>),
    /// No such exit from this room.
    NoExit,
}

/// A character on its way to another shard.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboundHandoff {
    /// The full snapshot, already located at the destination zone and room.
    pub snapshot: CharacterSnapshot,
    /// The shard that owns the destination zone, when the directory knows it.
    pub target_shard: Option<String>,
}

/// What a graceful shutdown achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Players whose final flush was queued.
    pub finalized: usize,
    /// The saver's barrier: `Drained` only when every logout save is in its row or a durable
    /// retry job (or was fenced).
    pub saver: BarrierOutcome,
    /// Logout saves that were not durable when the bound ran out (still queued, or retrying
    /// through a Postgres outage), and how many of the retrying ones the Redis checkpoint holds.
    pub unsaved_finals: shardkeep::saver::UnsavedFinals,
    /// The placement writer's barrier.
    pub placement: BarrierOutcome,
    /// The auditor's barrier.
    pub auditor: BarrierOutcome,
}

impl Shard {
    fn hosts(&self, zone: &str) -> bool {
        self.zones.get(zone).is_some_and(|z| !z.def.instance)
    }

    /// Admits a loaded character: applies its snapshot and lands it by the landing table.
    pub fn admit(
        &mut self,
        loaded: LoadedCharacter,
        arrival: Arrival,
    ) -> Result<Admitted, AdmitError> {
        let snapshot = &loaded.snapshot;
        let id = snapshot.character_id;
        if self.residency.contains(id) {
            return Err(AdmitError::AlreadyHeld(id));
        }
        let (zone_id, case) = login_zone(
            snapshot.zone_ref.as_deref(),
            loaded.brand_new,
            |z| self.hosts(z),
            &self.config.home_zone,
        );
        let zone = self
            .zones
            .get(&zone_id)
            .ok_or_else(|| AdmitError::NoZone(zone_id.clone()))?;
        let room_ref = match case {
            LandingCase::Rehydrate => snapshot.room_ref.as_deref(),
            _ => None,
        };
        let (room, room_warning) = resolve_room(&zone.def, room_ref);
        let room = room.to_owned();
        let fresh_login = matches!(arrival, Arrival::Login { .. });
        let (character, mut warnings) = LiveCharacter::apply(snapshot, &self.catalog, fresh_login);
        warnings.extend(room_warning);
        let link = match arrival {
            Arrival::Login { session_token } => Link::Attached { session_token },
            Arrival::Handoff { handoff_token } => Link::Pending { handoff_token },
        };
        let attached = matches!(link, Link::Attached { .. });
        let entry = PlayerEntry {
            character,
            room: room.clone(),
            link,
            frozen: false,
            anchor: None,
            timers_at: 0,
        };
        self.zones
            .get_mut(&zone_id)
            .ok_or_else(|| AdmitError::NoZone(zone_id.clone()))?
            .insert(entry, &self.residency);
        // Durable as loaded: the crash window of this stay starts now.
        self.saver.landed().loaded(id, std::time::Instant::now());
        if attached {
            self.register_placement(id);
        }
        Ok(Admitted {
            zone: zone_id,
            room,
            case,
            warnings,
            source: Some(loaded.source),
        })
    }

    /// A handoff re-dial: attaches the session to whichever zone holds the pending player with
    /// `handoff_token`.
    pub fn redial(
        &mut self,
        handoff_token: &str,
        session_token: &str,
    ) -> Result<Admitted, AdmitError> {
        let found = self.zones.iter().find_map(|(zone_id, zone)| {
            zone.players()
                .find(
                    |p| matches!(&p.link, Link::Pending { handoff_token: t } if t == handoff_token),
                )
                .map(|p| (zone_id.clone(), p.character.character_id))
        });
        let (zone_id, id) = found.ok_or(AdmitError::UnknownHandoff)?;
        let entry = self.player_mut(id).ok_or(AdmitError::NotHere(id))?;
        entry.link = Link::Attached {
            session_token: session_token.to_owned(),
        };
        let room = entry.room.clone();
        self.register_placement(id);
        Ok(Admitted {
            zone: zone_id,
            room,
            case: LandingCase::HandoffRedial,
            warnings: Vec::new(),
            source: None,
        })
    }

    /// A token-less reconnect: when a zone still holds the character (link-dead, or attached
    /// from a connection that silently died), the new session attaches to that copy. `None` means
    /// the character is not held here and must log in.
    pub fn resume(&mut self, character_id: Uuid, session_token: &str) -> Option<Admitted> {
        let zone_id = self.residency.zone_of(character_id)?;
        if self.leaving_after_transfer(character_id) {
            return None;
        }
        let entry = self.player_mut(character_id)?;
        if matches!(entry.link, Link::Pending { .. }) {
            return None;
        }
        entry.link = Link::Attached {
            session_token: session_token.to_owned(),
        };
        let room = entry.room.clone();
        self.register_placement(character_id);
        Some(Admitted {
            zone: zone_id,
            room,
            case: LandingCase::Resumed,
            warnings: Vec::new(),
            source: None,
        })
    }

    /// The connection dropped: the character stays in its zone, link-dead, and is flushed.
    pub fn detach(&mut self, character_id: Uuid) -> Result<(), AdmitError> {
        let entry = self
            .player_mut(character_id)
            .ok_or(AdmitError::NotHere(character_id))?;
        if let Link::Attached { session_token } = &entry.link {
            entry.link = Link::LinkDead {
                session_token: session_token.clone(),
            };
        }
        self.save_one(character_id, SaveReason::Flush);
        Ok(())
    }

    /// A clean logout: the character leaves its zone, its final flush is queued and its
    /// placement becomes a fenced tombstone.
    ///
    /// A character in an item transfer leaves once the transfer's commit has answered: the
    /// item is held by neither side until then, so a dump now would miss an item the commit
    /// writes into the row, and a final save that finds its row moved by that commit writes
    /// its dump over it (the item in no row). Until it leaves the copy is not resumed, its
    /// saves keep its current issue mark (as any save of a copy in a transfer), and
    /// [`Self::final_save_in_flight`] holds a login of the character back.
    pub fn logout(&mut self, character_id: Uuid) -> Result<(), AdmitError> {
        if self.has_pending_transfer(character_id) {
            let epoch = self
                .player(character_id)
                .ok_or(AdmitError::NotHere(character_id))?
                .character
                .owner_epoch;
            self.logouts_after_transfer.insert(character_id, epoch);
            return Ok(());
        }
        self.logouts_after_transfer.remove(&character_id);
        if let Some(snapshot) = self.depart(character_id)? {
            self.deferred_finals.push_back(snapshot);
            self.offer_deferred_finals();
        }
        Ok(())
    }

    /// Carries out the logouts that waited for their characters' item transfers, once those
    /// have answered. A copy evicted meanwhile has nothing left to save, and a later copy of
    /// the character (arrived since by handoff or login) is not the one that logged out.
    pub(super) fn logouts_after_transfers(&mut self) {
        let ready: Vec<(Uuid, i64)> = self
            .logouts_after_transfer
            .iter()
            .filter(|(id, _)| !self.has_pending_transfer(**id))
            .map(|(id, epoch)| (*id, *epoch))
            .collect();
        for (id, epoch) in ready {
            self.logouts_after_transfer.remove(&id);
            let items: Option<Vec<Uuid>> = self
                .player(id)
                .filter(|e| e.character.owner_epoch == epoch)
                .map(|e| e.character.items().iter().filter_map(|i| i.id).collect());
            let left = items.is_some() && self.logout(id).is_ok();
            if left {
                self.departed_after_transfer
                    .push((id, epoch, items.unwrap_or_default()));
                // Kept for a host that reads them; a host that never does keeps the newest.
                if self.departed_after_transfer.len() > DEPARTED_KEPT {
                    self.departed_after_transfer.remove(0);
                }
            } else {
                tracing::debug!(event = "logout_after_transfer_gone", character = %id,
                    "the copy left before its transfer answered");
            }
        }
    }

    /// The copies whose logouts waited for their item transfers and have left since the last
    /// call: character, epoch, and the items their final saves carry (an item handed over or
    /// given back while the logout waited is among them, and lives only in that final until it
    /// lands).
    pub fn take_departed_after_transfer(&mut self) -> Vec<(Uuid, i64, Vec<Uuid>)> {
        std::mem::take(&mut self.departed_after_transfer)
    }

    /// True while the copy held here of `character_id` has logged out and waits for its item
    /// transfer to answer.
    fn leaving_after_transfer(&self, character_id: Uuid) -> bool {
        self.logouts_after_transfer
            .get(&character_id)
            .is_some_and(|epoch| {
                self.player(character_id)
                    .is_some_and(|e| e.character.owner_epoch == *epoch)
            })
    }

    /// Offers the final saves waiting here to the saver, oldest first, in slices of
    /// [`SHUTDOWN_FINAL_SLICE`]; a full queue keeps the rest for the next pulse, so a moment's
    /// backlog never costs a logout its delta.
    pub(super) fn offer_deferred_finals(&mut self) {
        while !self.deferred_finals.is_empty() {
            let take = self.deferred_finals.len().min(SHUTDOWN_FINAL_SLICE);
            let slice: Vec<CharacterSnapshot> = self.deferred_finals.drain(..take).collect();
            if let Err(back) = self.saver.offer_many(SaveReason::Final, slice) {
                for snapshot in back.into_iter().rev() {
                    self.deferred_finals.push_front(snapshot);
                }
                break;
            }
        }
        if self.deferred_finals.len() > MAX_DEFERRED_FINALS {
            let excess = self.deferred_finals.len() - MAX_DEFERRED_FINALS;
            let oldest: Vec<CharacterSnapshot> = self.deferred_finals.drain(..excess).collect();
            self.saver.enqueue_many(SaveReason::Final, oldest);
        }
    }

    /// Final saves waiting for room in the saver's queue.
    pub fn deferred_final_count(&self) -> usize {
        self.deferred_finals.len()
    }

    /// True while this shard still holds a logout's final save of `character_id` (waiting for
    /// room in the saver's queue, queued, or retrying through an outage): its changes are in
    /// neither the row nor a retry job yet. A login of the character must wait until this is
    /// false before it claims, or the claim loads the older row and fences the save out.
    pub fn final_save_in_flight(&self, character_id: Uuid) -> bool {
        self.leaving_after_transfer(character_id)
            || self
                .deferred_finals
                .iter()
                .any(|s| s.character_id == character_id)
            || self.saver.final_in_flight(character_id)
    }

    /// Removes a leaving character from its zone and tombstones its placement; returns its final
    /// snapshot (none for a frozen or pending copy) for the caller to queue.
    fn depart(&mut self, character_id: Uuid) -> Result<Option<CharacterSnapshot>, AdmitError> {
        let zone_id = self
            .residency
            .zone_of(character_id)
            .ok_or(AdmitError::NotHere(character_id))?;
        let entry = self
            .player(character_id)
            .ok_or(AdmitError::NotHere(character_id))?;
        let snapshot = if entry.skip_saves() {
            None
        } else {
            self.dump_numbered(character_id)
        };
        let zone = self
            .zones
            .get_mut(&zone_id)
            .ok_or_else(|| AdmitError::NoZone(zone_id.clone()))?;
        let entry = zone
            .remove(character_id, &self.residency)
            .ok_or(AdmitError::NotHere(character_id))?;
        self.tombstone_placement(&entry.character);
        Ok(snapshot)
    }

    /// Walks `character_id` through the exit `direction` of its room.
    pub fn walk(&mut self, character_id: Uuid, direction: &str) -> Result<WalkOutcome, AdmitError> {
        let (zone_id, room) = self
            .location(character_id)
            .ok_or(AdmitError::NotHere(character_id))?;
        let exit = self
            .zones
            .get(&zone_id)
            .and_then(|z| z.def.rooms.get(&room))
            .and_then(|r| r.exits.get(direction))
            .cloned();
        let Some(exit) = exit else {
            return Ok(WalkOutcome::NoExit);
        };
        if exit.zone == zone_id {
            if let Some(entry) = self.player_mut(character_id) {
                entry.room = exit.room.clone();
            }
            return Ok(WalkOutcome::Moved {
                zone: exit.zone,
                room: exit.room,
            });
        }
        if self.zones.contains_key(&exit.zone) {
            let from = self
                .zones
                .get_mut(&zone_id)
                .ok_or_else(|| AdmitError::NoZone(zone_id.clone()))?;
            let mut entry = from
                .remove(character_id, &self.residency)
                .ok_or(AdmitError::NotHere(character_id))?;
            let leaving_instance = from.def.instance;
            let to = self
                .zones
                .get_mut(&exit.zone)
                .ok_or_else(|| AdmitError::NoZone(exit.zone.clone()))?;
            entry.anchor = match (to.def.instance, leaving_instance) {
                (true, false) => Some((zone_id.clone(), room.clone())),
                (true, true) => entry.anchor.take(),
                (false, _) => None,
            };
            entry.room = exit.room.clone();
            to.insert(entry, &self.residency);
            self.register_placement(character_id);
            return Ok(WalkOutcome::Moved {
                zone: exit.zone,
                room: exit.room,
            });
        }
        // Another shard owns the destination: hand the snapshot over and remove without saving,
        // so no stale flush from here can race the destination's claim. The dump is taken as of
        // the zone's pulse (its timers caught up), as every other dump is.
        let zone = self
            .zones
            .get_mut(&zone_id)
            .ok_or_else(|| AdmitError::NoZone(zone_id.clone()))?;
        let entry = zone
            .player_mut(character_id)
            .ok_or(AdmitError::NotHere(character_id))?;
        let snapshot = entry
            .character
            .dump(Some(&exit.zone), Some(&exit.room))
            .map_err(|_| AdmitError::NotHere(character_id))?;
        zone.remove(character_id, &self.residency);
        Ok(WalkOutcome::Handoff(Box::new(OutboundHandoff {
            target_shard: self.directory.shard_for_zone(&exit.zone),
            snapshot,
        })))
    }

    /// Graceful shutdown: every held player's final flush and tombstone are queued, then the
    /// saver's and the placement writer's barriers are awaited, each bounded by `bound`. The
    /// finals go to the saver in slices of [`SHUTDOWN_FINAL_SLICE`], a queue entry each, so a
    /// full shard never overflows the saver's queue.
    pub async fn shutdown(mut self, bound: Duration) -> ShutdownReport {
        // Item transfers answer first (within the bound): a dump taken while one waits misses
        // its item.
        if !self.settle_transfers(bound).await {
            tracing::warn!(
                event = "shutdown_transfers_unsettled",
                pending = self.pending_transfers.len(),
                "item transfers still wait for their commits; their items may be voided"
            );
        }
        self.handle_saver_events();
        let ids: Vec<Uuid> = self.zones.values().flat_map(|z| z.player_ids()).collect();
        let mut finalized = 0;
        let mut finals = Vec::new();
        for id in ids {
            if let Ok(snapshot) = self.depart(id) {
                finalized += 1;
                finals.extend(snapshot);
            }
        }
        self.deferred_finals.extend(finals);
        // Offered until the queue takes them all (it drains meanwhile) or the bound runs out;
        // what is left then is dropped, counted and logged.
        let deadline = tokio::time::Instant::now() + bound;
        self.offer_deferred_finals();
        while !self.deferred_finals.is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
            self.offer_deferred_finals();
        }
        let left: Vec<CharacterSnapshot> = self.deferred_finals.drain(..).collect();
        let left_count = left.len();
        let last_chance = self.saver.enqueue_many(SaveReason::Final, left);
        let saver = self.saver.barrier(bound).await;
        let mut unsaved_finals = self.saver.unsaved_finals();
        if last_chance != shardkeep::saver::EnqueueOutcome::Queued {
            unsaved_finals.dropped = left_count;
        }
        if unsaved_finals.total() > 0 {
            tracing::warn!(
                event = "shutdown_finals_unsaved",
                queued = unsaved_finals.queued,
                pending = unsaved_finals.pending,
                checkpointed = unsaved_finals.checkpointed,
                "logout saves not yet in Postgres; their checkpoints hold them"
            );
        }
        let placement = self.placement.barrier(bound).await;
        let auditor = self.auditor.barrier(bound).await;
        ShutdownReport {
            finalized,
            saver,
            unsaved_finals,
            placement,
            auditor,
        }
    }
}
