//! A zone at runtime: its definition, the players it holds and its ephemeral entities. The two
//! player-map mutators here are the only writers of the residency index.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use uuid::Uuid;

use super::residency::ResidencyIndex;
use crate::game::LiveCharacter;
use crate::game::world::{ZoneDef, ZoneEntities};

/// The state of a player's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// A live session drives the character.
    Attached {
        /// The session token.
        session_token: String,
    },
    /// The connection dropped; the character waits in the zone for a reconnect.
    LinkDead {
        /// The session token that may resume.
        session_token: String,
    },
    /// Arrived by cross-shard handoff; waits for the client to re-dial with the token.
    Pending {
        /// The handoff token the client will present.
        handoff_token: String,
    },
}

/// A player held by a zone.
#[derive(Debug, Clone, PartialEq)]
pub struct PlayerEntry {
    /// The character.
    pub character: LiveCharacter,
    /// The room it stands in.
    pub room: String,
    /// Its connection.
    pub link: Link,
    /// Frozen by staff: skipped by every save.
    pub frozen: bool,
    /// Inside an instance: the zone and room it entered from (the durable location).
    pub anchor: Option<(String, String)>,
}

impl PlayerEntry {
    /// True for a player whose durable record belongs elsewhere for now (mid-handoff) or who is
    /// frozen: saves skip it.
    pub fn skip_saves(&self) -> bool {
        self.frozen || matches!(self.link, Link::Pending { .. })
    }
}

/// A player's fixed offset inside a cadence period, from the random bits of its id.
pub fn phase(character_id: Uuid, period: u64) -> u64 {
    (character_id.as_u128() as u64) % period.max(1)
}

/// A zone's runtime state.
///
/// Besides the players it keeps two indexes so a pulse touches only the players it must: a save
/// wheel (players bucketed by their phase in the flush period, so the players due for a
/// checkpoint or flush are read off a few buckets) and the set of players with timed effects.
#[derive(Debug)]
pub struct ZoneRuntime {
    /// The definition.
    pub def: Arc<ZoneDef>,
    players: BTreeMap<Uuid, PlayerEntry>,
    wheel: Vec<BTreeSet<Uuid>>,
    timed: BTreeSet<Uuid>,
    /// Mobiles and floor items.
    pub entities: ZoneEntities,
}

/// Players due for a save on one pulse.
#[derive(Debug, Default)]
pub struct DueSaves {
    /// Due for a flush (which also writes the checkpoint).
    pub flush: Vec<Uuid>,
    /// Due for a checkpoint only.
    pub checkpoint: Vec<Uuid>,
}

impl ZoneRuntime {
    /// An empty zone whose save wheel spans `wheel_len` pulses (the flush period; 1 disables the
    /// wheel and every pulse examines every player).
    pub fn new(def: Arc<ZoneDef>, wheel_len: u64) -> Self {
        let len = usize::try_from(wheel_len.max(1)).unwrap_or(1);
        Self {
            def,
            players: BTreeMap::new(),
            wheel: vec![BTreeSet::new(); len],
            timed: BTreeSet::new(),
            entities: ZoneEntities::default(),
        }
    }

    fn bucket(&self, character_id: Uuid) -> usize {
        usize::try_from(phase(character_id, self.wheel.len() as u64)).unwrap_or(0)
    }

    /// Adds a player (mutator one of two).
    pub fn insert(&mut self, entry: PlayerEntry, residency: &ResidencyIndex) {
        let id = entry.character.character_id;
        residency.set(id, &self.def.id);
        let bucket = self.bucket(id);
        self.wheel[bucket].insert(id);
        if entry.character.has_timed_effects() {
            self.timed.insert(id);
        }
        self.players.insert(id, entry);
    }

    /// Removes a player (mutator two of two).
    pub fn remove(
        &mut self,
        character_id: Uuid,
        residency: &ResidencyIndex,
    ) -> Option<PlayerEntry> {
        let entry = self.players.remove(&character_id)?;
        residency.clear(character_id);
        let bucket = self.bucket(character_id);
        self.wheel[bucket].remove(&character_id);
        self.timed.remove(&character_id);
        Some(entry)
    }

    /// The player, if held here.
    pub fn player(&self, character_id: Uuid) -> Option<&PlayerEntry> {
        self.players.get(&character_id)
    }

    /// The player, mutably. The player joins the timed-effects set, since the caller may have
    /// given it an affect or a cooldown; the next pulse drops it again if not.
    pub fn player_mut(&mut self, character_id: Uuid) -> Option<&mut PlayerEntry> {
        let entry = self.players.get_mut(&character_id)?;
        self.timed.insert(character_id);
        Some(entry)
    }

    /// Every player held.
    pub fn players(&self) -> impl Iterator<Item = &PlayerEntry> {
        self.players.values()
    }

    /// Ids of every player held.
    pub fn player_ids(&self) -> Vec<Uuid> {
        self.players.keys().copied().collect()
    }

    /// Advances timed effects by one pulse for the players that have any.
    pub fn pulse_timed(&mut self) {
        if self.timed.len() * 4 >= self.players.len() {
            // Most players are timed: one pass over the map beats a lookup per set member.
            for entry in self.players.values_mut() {
                if !matches!(entry.link, Link::Pending { .. }) {
                    entry.character.pulse();
                }
            }
            return;
        }
        let players = &mut self.players;
        self.timed.retain(|id| match players.get_mut(id) {
            Some(entry) if matches!(entry.link, Link::Pending { .. }) => true,
            Some(entry) => {
                entry.character.pulse();
                entry.character.has_timed_effects()
            }
            None => false,
        });
    }

    /// The players due on `pulse`, for the given periods. A player due for both gets the flush.
    pub fn due_saves(&self, pulse: u64, checkpoint_period: u64, flush_period: u64) -> DueSaves {
        let (c, f) = (checkpoint_period.max(1), flush_period.max(1));
        let len = self.wheel.len() as u64;
        let wheel_fits = len == f && f.is_multiple_of(c);
        let mut due = DueSaves::default();
        let mut classify = |id: Uuid| {
            let Some(entry) = self.players.get(&id) else {
                return;
            };
            if entry.skip_saves() {
                return;
            }
            if (pulse + phase(id, f)).is_multiple_of(f) {
                due.flush.push(id);
            } else if (pulse + phase(id, c)).is_multiple_of(c) {
                due.checkpoint.push(id);
            }
        };
        if wheel_fits {
            // Checkpoint-due buckets are every c-th bucket from (-pulse mod c); the flush-due
            // bucket is among them.
            let first = (c - pulse % c) % c;
            let mut bucket = first;
            while bucket < len {
                for id in &self.wheel[usize::try_from(bucket).unwrap_or(0)] {
                    classify(*id);
                }
                bucket += c;
            }
        } else {
            for id in self.players.keys() {
                classify(*id);
            }
        }
        due
    }
}
