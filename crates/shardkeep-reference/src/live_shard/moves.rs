//! Players coming, going and walking: entering after the runtime admitted a copy (a login or an
//! arrival), logging out, dropping link, and walking between rooms and zones — into a zone
//! another shard hosts by the runtime's handoff.

use tokio::sync::oneshot;
use uuid::Uuid;

use super::{ActionError, LiveShard, Resident};
use shardkeep::live::{Admitted, CopyId, HandoffTicket, LiveError, LoggedOut, SessionStart};
use shardkeep::model::Anchor;

/// Where an admitted copy stands now.
#[derive(Debug, Clone, PartialEq)]
pub struct Entered {
    /// What the runtime admitted (the copy, its session, where its content came from).
    pub admitted: Admitted,
    /// The zone it stands in.
    pub zone: String,
    /// The room.
    pub room: String,
}

/// How a walk ended.
#[derive(Debug)]
pub enum Walk {
    /// Moved inside this shard.
    Moved {
        /// The zone now.
        zone: String,
        /// The room now.
        room: String,
    },
    /// The exit leads into a zone another shard hosts: the player is off this shard's map and
    /// its handoff is being stored; the departure answers with the token the client presents
    /// there (or, when the handoff could not be stored, the player stands where it was).
    Leaving(Departure),
    /// No such exit from this room.
    NoExit,
}

/// A handoff on its way: the ticket once it is stored.
#[derive(Debug)]
pub struct Departure {
    /// The shard that hosts the destination.
    pub target_shard: String,
    answer: oneshot::Receiver<Result<HandoffTicket, String>>,
}

impl Departure {
    /// Waits for the handoff to be stored: its ticket, or why it was not (the player then
    /// stands where it was, from the shard's next tick on).
    pub async fn ticket(self) -> Result<HandoffTicket, String> {
        self.answer
            .await
            .unwrap_or_else(|_| Err("the shard stopped before the handoff answered".into()))
    }
}

/// A handoff's answer, for the tick.
pub(super) struct Departed {
    copy: CopyId,
    result: Result<HandoffTicket, String>,
}

impl LiveShard {
    /// Logs `character_id` in (the runtime resumes a copy held here, or claims and loads the
    /// character) and puts it where it landed.
    pub async fn login(
        &mut self,
        character_id: Uuid,
        start: SessionStart,
    ) -> Result<Entered, LiveError> {
        let admitted = self.runtime.login(character_id, start).await?;
        self.enter(admitted)
    }

    /// Takes in the copy handed to this shard under `token` and puts it where it landed.
    pub async fn arrive(&mut self, token: &str, start: SessionStart) -> Result<Entered, LiveError> {
        let admitted = self.runtime.arrive(token, start).await?;
        self.enter(admitted)
    }

    /// Puts a copy the runtime admitted (by [`Runtime::login`](shardkeep::live::Runtime::login)
    /// or [`Runtime::arrive`](shardkeep::live::Runtime::arrive), run off the tick) where the
    /// game landed it. A resumed copy stays where it stood.
    pub fn enter(&mut self, admitted: Admitted) -> Result<Entered, LiveError> {
        let copy = admitted.copy;
        if let Some(held) = self.residents.get(&copy.character_id)
            && held.copy == copy
        {
            return Ok(Entered {
                zone: held.zone.clone(),
                room: held.room.clone(),
                admitted,
            });
        }
        let (anchor, _) = self.runtime.anchor(copy)?;
        let zone = anchor
            .zone_ref
            .filter(|z| self.zones.contains_key(z))
            .ok_or_else(|| LiveError::Game("landed in a zone not hosted here".into()))?;
        let room = anchor
            .room_ref
            .ok_or_else(|| LiveError::Game("landed without a room".into()))?;
        self.residents.insert(
            copy.character_id,
            Resident {
                copy,
                zone: zone.clone(),
                room: room.clone(),
                timer_due: None,
            },
        );
        self.refresh_timers(copy.character_id);
        Ok(Entered {
            admitted,
            zone,
            room,
        })
    }

    /// A clean logout: the player leaves the map and the runtime saves it (its final save is
    /// never given up; [`LoggedOut`] says how it ended once it has). Refused while an item
    /// transfer of the character is in flight (try again on a later tick).
    pub fn logout(&mut self, character_id: Uuid) -> Result<LoggedOut, ActionError> {
        let copy = self.resident(character_id)?.copy;
        if self.in_transfer(character_id) {
            return Err(ActionError::TransferPending(character_id));
        }
        let out = self.runtime.logout_now(copy)?;
        self.residents.remove(&character_id);
        Ok(out)
    }

    /// The player's connection playing session `session_token` dropped: it stays where it
    /// stands, link-dead, until a login resumes it or its grace runs out (`last_applied_seq`:
    /// the last client input applied, kept in its resume ledger). A connection a reconnect
    /// replaced since detaches nothing.
    pub fn detach(
        &mut self,
        character_id: Uuid,
        session_token: &str,
        last_applied_seq: u64,
    ) -> Result<(), ActionError> {
        let copy = self.resident(character_id)?.copy;
        self.runtime.detach(copy, session_token, last_applied_seq)?;
        Ok(())
    }

    /// Walks `character_id` through the exit `direction` of its room.
    pub fn walk(&mut self, character_id: Uuid, direction: &str) -> Result<Walk, ActionError> {
        let resident = self.resident(character_id)?.clone();
        let exit = self
            .zones
            .get(&resident.zone)
            .and_then(|z| z.def.rooms.get(&resident.room))
            .and_then(|r| r.exits.get(direction))
            .cloned();
        let Some(exit) = exit else {
            return Ok(Walk::NoExit);
        };
        let anchor = Anchor {
            zone_ref: Some(exit.zone.clone()),
            room_ref: Some(exit.room.clone()),
        };
        if let Some(to) = self.zones.get(&exit.zone) {
            // Inside an instance (shard-local) the copy stays anchored at its entrance: only a
            // step into a zone that is not an instance moves where it is saved.
            if !to.def.instance {
                self.runtime.set_anchor(resident.copy, anchor)?;
            }
            if let Some(held) = self.residents.get_mut(&character_id) {
                held.zone.clone_from(&exit.zone);
                held.room.clone_from(&exit.room);
            }
            return Ok(Walk::Moved {
                zone: exit.zone,
                room: exit.room,
            });
        }
        // The content that travels must hold the pickup's outcome: the player waits for it.
        if self.in_transfer(character_id) {
            return Err(ActionError::TransferPending(character_id));
        }
        let target_shard = self
            .directory
            .shard_for_zone(&exit.zone)
            .ok_or_else(|| ActionError::Runtime(format!("no shard hosts {:?}", exit.zone)))?;
        Ok(Walk::Leaving(self.hand_off(resident, target_shard, anchor)))
    }

    /// Takes the player off the map and hands its copy to `target_shard` in a task.
    fn hand_off(&mut self, resident: Resident, target_shard: String, anchor: Anchor) -> Departure {
        let (tell, answer) = oneshot::channel();
        let copy = resident.copy;
        self.residents.remove(&copy.character_id);
        self.departing.insert(copy.character_id, resident);
        let runtime = self.runtime.clone();
        let back = self.departures.0.clone();
        let target = target_shard.clone();
        tokio::spawn(async move {
            let result = runtime
                .hand_off(copy, &target, anchor)
                .await
                .map_err(|e| e.to_string());
            let _ = tell.send(result.clone());
            let _ = back.send(Departed { copy, result });
        });
        Departure {
            target_shard,
            answer,
        }
    }

    /// Takes in the handoffs' answers: a handoff that was not stored leaves the player where it
    /// stood (the runtime kept its copy).
    pub(super) fn take_departures(&mut self) {
        while let Ok(departed) = self.departures.1.try_recv() {
            let Some(resident) = self.departing.remove(&departed.copy.character_id) else {
                continue;
            };
            let kept = self.runtime.copy_of(departed.copy.character_id) == Some(departed.copy);
            if departed.result.is_err() && kept {
                self.residents
                    .entry(departed.copy.character_id)
                    .or_insert(resident);
                self.refresh_timers(departed.copy.character_id);
            }
        }
    }
}
