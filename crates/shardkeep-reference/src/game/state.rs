//! The reference character state: the stored document and the live character it applies to.
//!
//! Only base values are stored: attribute base overrides, resource *current* values (maxima are
//! derived), affects and cooldowns with their remaining pulses, and the carry tree as flyweights.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::items::{Item, ItemJson, Slot};

/// Attributes every character has, at base 10 unless overridden.
pub const ATTRIBUTES: [&str; 5] = ["str", "dex", "con", "int", "wis"];
/// Base value of an attribute with no override.
pub const DEFAULT_ATTRIBUTE: i32 = 10;
/// Resource pools every character has.
pub const POOLS: [&str; 3] = ["hp", "mana", "stamina"];

/// How a character looks.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Appearance {
    /// Hair style.
    pub hair: String,
    /// Skin tone.
    pub skin: String,
    /// Outfit over the armour.
    pub outfit: String,
}

/// A timed effect, stored with its remaining duration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Affect {
    /// Effect name.
    pub name: String,
    /// Pulses left; conserved across saves, never reset to full.
    pub remaining_pulses: u32,
    /// Attribute modifiers while active.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attribute_mods: BTreeMap<String, i32>,
    /// Resource-maximum modifiers while active.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pool_mods: BTreeMap<String, i32>,
}

/// The stored state document (`characters.state`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct StateDocument {
    /// Attribute base overrides.
    pub attributes: BTreeMap<String, i32>,
    /// Resource current values (maxima are derived).
    pub resources: BTreeMap<String, i32>,
    /// Active affects.
    pub affects: Vec<Affect>,
    /// Cooldowns by ability, remaining pulses.
    pub cooldowns: BTreeMap<String, u32>,
    /// Worn items.
    pub equipment: BTreeMap<Slot, ItemJson>,
    /// Carried items.
    pub inventory: Vec<ItemJson>,
    /// Experience points.
    pub experience: i64,
    /// Level.
    pub level: u32,
    /// Coins.
    pub currency: i64,
    /// Looks.
    pub appearance: Appearance,
    /// Position inside the room.
    pub position: Option<[i32; 2]>,
    /// Last client input sequence applied (reset to 0 on a fresh login).
    pub applied_seq: u64,
    /// Advancement tracks and the step reached on each.
    pub tracks: BTreeMap<String, u32>,
}

/// Content-driven character creation input, applied on first spawn.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChargenInput {
    /// Attribute base overrides chosen at creation.
    pub attributes: BTreeMap<String, i32>,
    /// Prototype references of the starting kit.
    pub items: Vec<String>,
    /// Starting looks.
    pub appearance: Option<Appearance>,
}

/// A resource pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    /// Current value.
    pub cur: i32,
    /// Derived maximum.
    pub max: i32,
}

/// A character in shard memory.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveCharacter {
    /// Stable id.
    pub character_id: Uuid,
    /// Owning account.
    pub account_id: Uuid,
    /// Display name.
    pub name: String,
    /// Attribute base overrides.
    pub base: BTreeMap<String, i32>,
    /// Derived attributes (base + affects + gear).
    pub attributes: BTreeMap<String, i32>,
    /// Resource pools.
    pub pools: BTreeMap<String, Pool>,
    /// Active affects.
    pub affects: Vec<Affect>,
    /// Cooldowns.
    pub cooldowns: BTreeMap<String, u32>,
    /// Worn items.
    pub equipment: BTreeMap<Slot, Item>,
    /// Carried items.
    pub inventory: Vec<Item>,
    /// Experience points.
    pub experience: i64,
    /// Level.
    pub level: u32,
    /// Coins.
    pub currency: i64,
    /// Looks.
    pub appearance: Appearance,
    /// Position inside the room.
    pub position: Option<[i32; 2]>,
    /// Last client input sequence applied.
    pub applied_seq: u64,
    /// Advancement tracks.
    pub tracks: BTreeMap<String, u32>,
    /// Pending chargen input (`None` once applied).
    pub chargen: Option<serde_json::Value>,
    /// CAS token: the row version this copy was loaded or last saved at.
    pub state_version: i64,
    /// Ownership fence of this copy.
    pub owner_epoch: i64,
    /// This copy's issue sequence: the last reward or retry job it issued (see
    /// [`LiveCharacter::issue`]). Every dump records it as the snapshot's issue mark.
    pub issued: u64,
    /// Transient death latch: set when a death is recorded, cleared on respawn, so one death is
    /// emitted once. Never persisted.
    pub dying: bool,
    /// The host's pulse its affects and cooldowns were last advanced to: a host that advances
    /// timers only when they run out or the character is touched ([`LiveCharacter::advance`]
    /// by the pulses since) dumps them as of its current pulse. Never persisted.
    pub timers_at: u64,
}

impl LiveCharacter {
    /// Issues the next sequence number for a reward or retry job of this copy. Apply the write
    /// to this live character first, then issue: every later dump holds it, so a durable job
    /// carrying this number is known to be in any snapshot whose issue mark reaches it.
    pub fn issue(&mut self) -> u64 {
        self.issued += 1;
        self.issued
    }

    /// Recomputes derived attributes and resource maxima; current values are clamped.
    pub fn recompute(&mut self) {
        let mut attributes: BTreeMap<String, i32> = ATTRIBUTES
            .iter()
            .map(|a| {
                (
                    (*a).to_owned(),
                    self.base.get(*a).copied().unwrap_or(DEFAULT_ATTRIBUTE),
                )
            })
            .collect();
        let mut pool_bonus: BTreeMap<String, i32> = BTreeMap::new();
        for affect in &self.affects {
            for (attr, delta) in &affect.attribute_mods {
                *attributes.entry(attr.clone()).or_default() += delta;
            }
            for (pool, delta) in &affect.pool_mods {
                *pool_bonus.entry(pool.clone()).or_default() += delta;
            }
        }
        for item in self.equipment.values() {
            for (attr, delta) in &item.proto.attribute_bonus {
                *attributes.entry(attr.clone()).or_default() += delta;
            }
            for (pool, delta) in &item.proto.pool_bonus {
                *pool_bonus.entry(pool.clone()).or_default() += delta;
            }
        }
        let attr = |name: &str| attributes.get(name).copied().unwrap_or(DEFAULT_ATTRIBUTE);
        for pool in POOLS {
            let base = match pool {
                "hp" => 20 + 5 * attr("con"),
                "mana" => 10 + 3 * attr("int"),
                _ => 10 + 3 * attr("dex"),
            };
            let max = (base + pool_bonus.get(pool).copied().unwrap_or(0)).max(1);
            let entry = self
                .pools
                .entry(pool.to_owned())
                .or_insert(Pool { cur: max, max });
            entry.max = max;
            entry.cur = entry.cur.clamp(0, max);
        }
        self.attributes = attributes;
    }

    /// The character dies: the latch is set and its hit points emptied. False when it was
    /// already dying (a death is recorded once, until the respawn).
    pub fn die(&mut self) -> bool {
        if self.dying {
            return false;
        }
        self.dying = true;
        if let Some(hp) = self.pools.get_mut("hp") {
            hp.cur = 0;
        }
        true
    }

    /// The character respawns: the latch clears and its pools refill.
    pub fn respawn(&mut self) {
        self.dying = false;
        for pool in self.pools.values_mut() {
            pool.cur = pool.max;
        }
    }

    /// A permanent change of the base `attribute` by `delta` (derived values recomputed).
    pub fn grant_base(&mut self, attribute: &str, delta: i32) {
        *self
            .base
            .entry(attribute.to_owned())
            .or_insert(DEFAULT_ATTRIBUTE) += delta;
        self.recompute();
    }

    /// One step on advancement `track`; the step reached.
    pub fn step_track(&mut self, track: &str) -> u32 {
        let step = self.tracks.entry(track.to_owned()).or_insert(0);
        *step += 1;
        *step
    }

    /// Every item the character holds, worn or carried, containers' contents included.
    pub fn items(&self) -> Vec<&Item> {
        let mut all = Vec::new();
        for item in self.equipment.values().chain(self.inventory.iter()) {
            item.walk(&mut |i| all.push(i));
        }
        all
    }

    /// True while an affect or a cooldown is running.
    pub fn has_timed_effects(&self) -> bool {
        !self.affects.is_empty() || !self.cooldowns.is_empty()
    }

    /// Advances affects and cooldowns by one pulse, dropping the expired ones.
    pub fn pulse(&mut self) {
        self.advance(1);
    }

    /// Advances affects and cooldowns by `pulses` at once, dropping the expired ones: the same
    /// as that many [`LiveCharacter::pulse`]s when nothing looked in between. It steps from one
    /// affect's expiry to the next, recomputing at each, so the pools are clamped at each
    /// expiry in the order the pulses would have clamped them.
    pub fn advance(&mut self, pulses: u64) {
        let mut left = pulses;
        while left > 0 && self.has_timed_effects() {
            let next_affect = self
                .affects
                .iter()
                .map(|a| u64::from(a.remaining_pulses))
                .min();
            let step = next_affect.map_or(left, |next| next.clamp(1, left));
            self.advance_by(step);
            left -= step;
        }
    }

    /// Advances every timer by `pulses`, at most up to the first affect's expiry.
    fn advance_by(&mut self, pulses: u64) {
        let by = u32::try_from(pulses).unwrap_or(u32::MAX);
        if !self.cooldowns.is_empty() {
            self.cooldowns.retain(|_, left| {
                *left = left.saturating_sub(by);
                *left > 0
            });
        }
        let mut expired = false;
        for affect in &mut self.affects {
            affect.remaining_pulses = affect.remaining_pulses.saturating_sub(by);
            expired |= affect.remaining_pulses == 0;
        }
        if expired {
            self.affects.retain(|a| a.remaining_pulses > 0);
            self.recompute();
        }
    }

    /// Pulses until the next affect or cooldown runs out (`None`: none is running).
    pub fn next_expiry(&self) -> Option<u64> {
        let affects = self.affects.iter().map(|a| a.remaining_pulses);
        let cooldowns = self.cooldowns.values().copied();
        affects.chain(cooldowns).min().map(u64::from)
    }
}
/// Removes the item with `id` from a stored carry tree (worn, carried or inside a container);
/// true when it was there.
pub fn remove_stored_item(doc: &mut StateDocument, id: Uuid) -> bool {
    fn from_list(items: &mut Vec<ItemJson>, id: Uuid) -> bool {
        if let Some(i) = items.iter().position(|item| item.id == Some(id)) {
            items.remove(i);
            return true;
        }
        items
            .iter_mut()
            .any(|item| from_list(&mut item.contents, id))
    }
    let worn = doc
        .equipment
        .iter()
        .find(|(_, item)| item.id == Some(id))
        .map(|(slot, _)| *slot);
    if let Some(slot) = worn {
        doc.equipment.remove(&slot);
        return true;
    }
    doc.equipment
        .values_mut()
        .any(|item| from_list(&mut item.contents, id))
        || from_list(&mut doc.inventory, id)
}

/// Every item id in a stored state document's carry tree (worn, carried, and inside
/// containers), depth first. A document that does not decode holds none.
pub fn stored_item_ids(state: &serde_json::Value) -> Vec<Uuid> {
    StateDocument::deserialize(state)
        .map(|doc| stored_items(&doc))
        .unwrap_or_default()
}

/// Every item id in a state document's carry tree (worn, carried, and inside containers).
pub fn stored_items(doc: &StateDocument) -> Vec<Uuid> {
    fn walk(item: &ItemJson, out: &mut Vec<Uuid>) {
        out.extend(item.id);
        for inner in &item.contents {
            walk(inner, out);
        }
    }
    let mut out = Vec::new();
    for item in doc.equipment.values().chain(&doc.inventory) {
        walk(item, &mut out);
    }
    out
}
