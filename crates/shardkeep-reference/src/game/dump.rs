//! A live character encoded straight to its state document's text: every field is written from
//! the character itself, with no copy of it and no intermediate collection — a dump on a busy
//! pulse allocates little more than the text. The document is exactly the one a
//! [`StateDocument`](super::state::StateDocument) copied out of the character encodes to (a test
//! holds the two equal), timers as of `elapsed` pulses after the character's were advanced.

use std::collections::BTreeMap;

use serde::Serialize;
use serde::ser::{SerializeStruct, Serializer};

use super::items::{CarryLimits, CarryTreeError, Item, ItemDelta, Slot, count_node};
use super::state::{Affect, LiveCharacter, Pool};

/// Checks a live carry tree against `limits` in the order a dump walks it (worn items by slot,
/// then the inventory, depth first), without building anything.
pub(super) fn check_carry(
    character: &LiveCharacter,
    limits: CarryLimits,
) -> Result<(), CarryTreeError> {
    fn walk(
        item: &Item,
        depth: usize,
        limits: CarryLimits,
        nodes: &mut usize,
    ) -> Result<(), CarryTreeError> {
        count_node(depth, limits, nodes)?;
        item.contents
            .iter()
            .try_for_each(|inner| walk(inner, depth + 1, limits, nodes))
    }
    let mut nodes = 0;
    character
        .equipment
        .values()
        .chain(&character.inventory)
        .try_for_each(|item| walk(item, 1, limits, &mut nodes))
}

/// The carry tree as stored, `(equipment, inventory)`: what the byte limit measures.
pub(super) struct CarryTree<'a>(pub(super) &'a LiveCharacter);

impl Serialize for CarryTree<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (Worn(&self.0.equipment), Carried(&self.0.inventory)).serialize(s)
    }
}

/// The state document of `character`, timers shortened by `by` pulses.
pub(super) struct Document<'a> {
    pub(super) character: &'a LiveCharacter,
    pub(super) by: u32,
}

impl Serialize for Document<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let c = self.character;
        let mut doc = s.serialize_struct("StateDocument", 13)?;
        doc.serialize_field("attributes", &c.base)?;
        doc.serialize_field("resources", &Resources(&c.pools))?;
        doc.serialize_field(
            "affects",
            &Affects {
                affects: &c.affects,
                by: self.by,
            },
        )?;
        doc.serialize_field(
            "cooldowns",
            &Cooldowns {
                cooldowns: &c.cooldowns,
                by: self.by,
            },
        )?;
        doc.serialize_field("equipment", &Worn(&c.equipment))?;
        doc.serialize_field("inventory", &Carried(&c.inventory))?;
        doc.serialize_field("experience", &c.experience)?;
        doc.serialize_field("level", &c.level)?;
        doc.serialize_field("currency", &c.currency)?;
        doc.serialize_field("appearance", &c.appearance)?;
        doc.serialize_field("position", &c.position)?;
        doc.serialize_field("applied_seq", &c.applied_seq)?;
        doc.serialize_field("tracks", &c.tracks)?;
        doc.end()
    }
}

/// Resource current values by pool (maxima are derived).
struct Resources<'a>(&'a BTreeMap<String, Pool>);

impl Serialize for Resources<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(name, pool)| (name, pool.cur)))
    }
}

/// The affects still running `by` pulses on, with that much less left.
struct Affects<'a> {
    affects: &'a [Affect],
    by: u32,
}

impl Serialize for Affects<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let by = self.by;
        s.collect_seq(
            self.affects
                .iter()
                .filter(|a| a.remaining_pulses > by)
                .map(|affect| AffectLeft { affect, by }),
        )
    }
}

/// One affect as stored, `by` pulses on.
struct AffectLeft<'a> {
    affect: &'a Affect,
    by: u32,
}

impl Serialize for AffectLeft<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let a = self.affect;
        let mut out = s.serialize_struct("Affect", 4)?;
        out.serialize_field("name", &a.name)?;
        out.serialize_field("remaining_pulses", &(a.remaining_pulses - self.by))?;
        if !a.attribute_mods.is_empty() {
            out.serialize_field("attribute_mods", &a.attribute_mods)?;
        }
        if !a.pool_mods.is_empty() {
            out.serialize_field("pool_mods", &a.pool_mods)?;
        }
        out.end()
    }
}

/// The cooldowns still running `by` pulses on, with that much less left.
struct Cooldowns<'a> {
    cooldowns: &'a BTreeMap<String, u32>,
    by: u32,
}

impl Serialize for Cooldowns<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let by = self.by;
        s.collect_map(
            self.cooldowns
                .iter()
                .filter(|(_, left)| **left > by)
                .map(|(name, left)| (name, left - by)),
        )
    }
}

/// Worn items by slot.
struct Worn<'a>(&'a BTreeMap<Slot, Item>);

impl Serialize for Worn<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(slot, item)| (slot, Stored(item))))
    }
}

/// Carried items, in order.
struct Carried<'a>(&'a [Item]);

impl Serialize for Carried<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(Stored))
    }
}

/// One item as stored ([`super::items::ItemJson`]'s form): prototype, delta unless plain,
/// contents unless empty, identity when it has one.
struct Stored<'a>(&'a Item);

impl Serialize for Stored<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let item = self.0;
        let mut out = s.serialize_struct("ItemJson", 4)?;
        out.serialize_field("proto", &item.proto.proto_ref)?;
        if item.delta != ItemDelta::default() {
            out.serialize_field("delta", &item.delta)?;
        }
        if !item.contents.is_empty() {
            out.serialize_field("contents", &Carried(&item.contents))?;
        }
        if let Some(id) = item.id {
            out.serialize_field("id", &id)?;
        }
        out.end()
    }
}
