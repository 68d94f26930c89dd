//! The residency index: character → zone for every character a shard holds, maintained only by
//! the zone's two player-map mutators so it mirrors residency exactly. The saver reads it to
//! learn whether a logged-out player is truly gone; reconnects read it before the durable zone.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use uuid::Uuid;

/// Shared, concurrent character → zone map. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct ResidencyIndex {
    zones: Arc<RwLock<HashMap<Uuid, String>>>,
}

impl ResidencyIndex {
    /// The zone holding `character_id`, if any.
    pub fn zone_of(&self, character_id: Uuid) -> Option<String> {
        self.zones
            .read()
            .ok()
            .and_then(|z| z.get(&character_id).cloned())
    }

    /// True when a zone holds `character_id`.
    pub fn contains(&self, character_id: Uuid) -> bool {
        self.zones
            .read()
            .map(|z| z.contains_key(&character_id))
            .unwrap_or(false)
    }

    /// Every character held.
    pub fn ids(&self) -> Vec<Uuid> {
        self.zones
            .read()
            .map(|z| z.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Characters held.
    pub fn len(&self) -> usize {
        self.zones.read().map(|z| z.len()).unwrap_or(0)
    }

    /// True when no character is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn set(&self, character_id: Uuid, zone: &str) {
        if let Ok(mut zones) = self.zones.write() {
            zones.insert(character_id, zone.to_owned());
        }
    }

    pub(super) fn clear(&self, character_id: Uuid) {
        if let Ok(mut zones) = self.zones.write() {
            zones.remove(&character_id);
        }
    }
}
