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
    /// Idempotency keys of the most recent reward grants (newest last, at most
    /// [`MAX_REWARD_KEYS`]): a grant whose key is here has already been applied to this state.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reward_keys: Vec<String>,
    /// Retry-job effects applied to the stored row since the last live write (newest last, at
    /// most [`MAX_JOB_EFFECTS`]). A live dump never carries them, so every live write clears
    /// them; a loader that prefers a newer checkpoint replays them on it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub job_effects: Vec<serde_json::Value>,
    /// Items a copy of this character held when it was loaded, each with the highest owner
    /// epoch that loaded it (at most [`MAX_HELD_AT_LOAD`], lowest epochs dropped first). A copy
    /// of one of them released by an earlier epoch is a phantom: a later copy started out
    /// holding the item (a crash rolled the release back), so that floor copy must not enter
    /// another character's row.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub held_at_load: BTreeMap<Uuid, i64>,
}

/// Most job effects a stored state keeps for replay.
pub const MAX_JOB_EFFECTS: usize = 512;

/// Most items a stored state remembers as held at a load.
pub const MAX_HELD_AT_LOAD: usize = 1024;

/// Whether a copy of `item_id` released by the copy at `released_epoch` is a phantom: a copy
/// loaded at a later epoch started out holding the item.
pub fn released_before_load(
    held_at_load: &BTreeMap<Uuid, i64>,
    item_id: Uuid,
    released_epoch: i64,
) -> bool {
    held_at_load
        .get(&item_id)
        .is_some_and(|loaded| *loaded > released_epoch)
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

/// Most reward keys a state keeps.
pub const MAX_REWARD_KEYS: usize = 4096;

/// Records a reward key, keeping at most [`MAX_REWARD_KEYS`]; false when it was already there.
pub fn remember_reward(keys: &mut Vec<String>, key: &str) -> bool {
    if keys.iter().any(|k| k == key) {
        return false;
    }
    keys.push(key.to_owned());
    if keys.len() > MAX_REWARD_KEYS {
        let excess = keys.len() - MAX_REWARD_KEYS;
        keys.drain(..excess);
    }
    true
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
    /// Keys of the most recent reward grants applied to this character.
    pub reward_keys: Vec<String>,
    /// Items held when a copy was loaded, with the highest epoch that loaded each (see
    /// [`StateDocument::held_at_load`]).
    pub held_at_load: BTreeMap<Uuid, i64>,
    /// Pending chargen input (`None` once applied).
    pub chargen: Option<serde_json::Value>,
    /// CAS token: the row version this copy was loaded or last saved at.
    pub state_version: i64,
    /// Ownership fence of this copy.
    pub owner_epoch: i64,
    /// Transient death latch: set when a death is recorded, cleared on respawn, so one death is
    /// emitted once. Never persisted.
    pub dying: bool,
}

impl LiveCharacter {
    /// Records every item this copy holds (nested ones too) as held at its owner epoch, keeping
    /// at most [`MAX_HELD_AT_LOAD`] entries (lowest epochs dropped first).
    pub fn mark_held_at_load(&mut self) {
        let epoch = self.owner_epoch;
        let mut held = Vec::new();
        for item in self.equipment.values().chain(&self.inventory) {
            item.walk(&mut |i| held.extend(i.id));
        }
        for id in held {
            self.held_at_load.insert(id, epoch);
        }
        if self.held_at_load.len() > MAX_HELD_AT_LOAD {
            let mut by_epoch: Vec<(i64, Uuid)> =
                self.held_at_load.iter().map(|(id, e)| (*e, *id)).collect();
            by_epoch.sort_unstable();
            let excess = by_epoch.len() - MAX_HELD_AT_LOAD;
            for (_, id) in by_epoch.into_iter().take(excess) {
                self.held_at_load.remove(&id);
            }
        }
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
        if self.affects.is_empty() && self.cooldowns.is_empty() {
            return;
        }
        if !self.cooldowns.is_empty() {
            self.cooldowns.retain(|_, left| {
                *left = left.saturating_sub(1);
                *left > 0
            });
        }
        let mut expired = false;
        for affect in &mut self.affects {
            affect.remaining_pulses = affect.remaining_pulses.saturating_sub(1);
            expired |= affect.remaining_pulses == 0;
        }
        if expired {
            self.affects.retain(|a| a.remaining_pulses > 0);
            self.recompute();
        }
    }
}
