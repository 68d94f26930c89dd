//! A zone at runtime: its definition, the players it holds and its ephemeral entities. The two
//! player-map mutators here are the only writers of the residency index.

use std::collections::BTreeMap;
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

/// A zone's runtime state.
#[derive(Debug)]
pub struct ZoneRuntime {
    /// The definition.
    pub def: Arc<ZoneDef>,
    players: BTreeMap<Uuid, PlayerEntry>,
    /// Mobiles and floor items.
    pub entities: ZoneEntities,
}

impl ZoneRuntime {
    /// An empty zone.
    pub fn new(def: Arc<ZoneDef>) -> Self {
        Self {
            def,
            players: BTreeMap::new(),
            entities: ZoneEntities::default(),
        }
    }

    /// Adds a player (mutator one of two).
    pub fn insert(&mut self, entry: PlayerEntry, residency: &ResidencyIndex) {
        residency.set(entry.character.character_id, &self.def.id);
        self.players.insert(entry.character.character_id, entry);
    }

    /// Removes a player (mutator two of two).
    pub fn remove(
        &mut self,
        character_id: Uuid,
        residency: &ResidencyIndex,
    ) -> Option<PlayerEntry> {
        let entry = self.players.remove(&character_id)?;
        residency.clear(character_id);
        Some(entry)
    }

    /// The player, if held here.
    pub fn player(&self, character_id: Uuid) -> Option<&PlayerEntry> {
        self.players.get(&character_id)
    }

    /// The player, mutably.
    pub fn player_mut(&mut self, character_id: Uuid) -> Option<&mut PlayerEntry> {
        self.players.get_mut(&character_id)
    }

    /// Every player held.
    pub fn players(&self) -> impl Iterator<Item = &PlayerEntry> {
        self.players.values()
    }

    /// Every player held, mutably.
    pub fn players_mut(&mut self) -> impl Iterator<Item = &mut PlayerEntry> {
        self.players.values_mut()
    }

    /// Ids of every player held.
    pub fn player_ids(&self) -> Vec<Uuid> {
        self.players.keys().copied().collect()
    }
}
