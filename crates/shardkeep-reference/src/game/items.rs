//! Flyweight items: a shared prototype plus a small per-instance delta. Persistence stores only
//! the prototype reference and the delta; loading re-spawns from the reference.
//!
//! Carry trees (items inside containers inside …) are bounded: depth 16, 512 nodes, 256 KiB
//! encoded. Over a bound, saving is a typed error and loading skips the excess with a warning.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Where an item can be worn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Slot {
    /// Helmets and hats.
    Head,
    /// Armour.
    Body,
    /// Gloves.
    Hands,
    /// Boots.
    Feet,
    /// A weapon.
    Wield,
    /// A shield.
    Shield,
    /// Amulets.
    Neck,
}

/// Shared, immutable item content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prototype {
    /// Stable reference stored in saves.
    pub proto_ref: String,
    /// Display name.
    pub name: String,
    /// Where it is worn, if anywhere.
    pub slot: Option<Slot>,
    /// True when it can hold other items.
    pub container: bool,
    /// Largest stack (1 for non-stackables).
    pub max_stack: u32,
    /// Attribute bonuses while worn.
    pub attribute_bonus: BTreeMap<String, i32>,
    /// Resource-maximum bonuses while worn.
    pub pool_bonus: BTreeMap<String, i32>,
    /// Binds to whoever picks it up; a bound item never changes owner.
    pub bind_on_pickup: bool,
}

/// The prototypes content defines, by reference.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    prototypes: HashMap<String, Arc<Prototype>>,
}

impl Catalog {
    /// A catalog of `prototypes`.
    pub fn new(prototypes: impl IntoIterator<Item = Prototype>) -> Self {
        Self {
            prototypes: prototypes
                .into_iter()
                .map(|p| (p.proto_ref.clone(), Arc::new(p)))
                .collect(),
        }
    }

    /// The prototype named `proto_ref`.
    pub fn get(&self, proto_ref: &str) -> Option<&Arc<Prototype>> {
        self.prototypes.get(proto_ref)
    }

    /// Every prototype reference, sorted.
    pub fn refs(&self) -> Vec<&str> {
        let mut refs: Vec<&str> = self.prototypes.keys().map(String::as_str).collect();
        refs.sort_unstable();
        refs
    }

    /// The reference content: weapons, armour, a bag, a chest, materials, a soulbound amulet.
    pub fn reference() -> Self {
        let proto = |r: &str, name: &str, slot: Option<Slot>| Prototype {
            proto_ref: r.into(),
            name: name.into(),
            slot,
            container: false,
            max_stack: 1,
            attribute_bonus: BTreeMap::new(),
            pool_bonus: BTreeMap::new(),
            bind_on_pickup: false,
        };
        let mut sword = proto("sword", "a short sword", Some(Slot::Wield));
        sword.attribute_bonus.insert("str".into(), 1);
        let mut mail = proto("mail", "a chain mail shirt", Some(Slot::Body));
        mail.pool_bonus.insert("hp".into(), 15);
        let mut helm = proto("helm", "an iron helm", Some(Slot::Head));
        helm.attribute_bonus.insert("con".into(), 1);
        let mut bag = proto("bag", "a leather bag", None);
        bag.container = true;
        let mut chest = proto("chest", "a heavy chest", None);
        chest.container = true;
        let mut ore = proto("ore", "a lump of iron ore", None);
        ore.max_stack = 50;
        let mut herb = proto("herb", "a healing herb", None);
        herb.max_stack = 20;
        let mut amulet = proto("amulet", "a soulbound amulet", Some(Slot::Neck));
        amulet.bind_on_pickup = true;
        amulet.pool_bonus.insert("mana".into(), 10);
        let gem = proto("gem", "a cut ruby", None);
        Self::new([sword, mail, helm, bag, chest, ore, herb, amulet, gem])
    }
}

/// Per-instance differences from the prototype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ItemDelta {
    /// Rolled quality level (0 = plain).
    #[serde(skip_serializing_if = "is_zero_u8")]
    pub quality: u8,
    /// Bound to its holder; cannot change owner.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub bound: bool,
    /// Partial stack size; 0 means a single item.
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub stack: u32,
    /// Marked by the player to survive automatic clean-ups.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub kept: bool,
}

fn is_zero_u8(v: &u8) -> bool {
    *v == 0
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

/// The stored form of an item: prototype reference, delta, contents, identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemJson {
    /// Prototype reference.
    pub proto: String,
    /// Differences from the prototype.
    #[serde(default, skip_serializing_if = "is_default_delta")]
    pub delta: ItemDelta,
    /// Items inside it, for containers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub contents: Vec<ItemJson>,
    /// Durable instance identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Uuid>,
}

fn is_default_delta(d: &ItemDelta) -> bool {
    *d == ItemDelta::default()
}

/// Who last put an item down, until someone picks it up. Never persisted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// The releasing character.
    pub by: Uuid,
    /// Their name at the time.
    pub by_name: String,
    /// The owner epoch of the copy that released it: a pickup after that copy lost ownership
    /// cannot tell a real item from a zombie's phantom, so the store fences on it.
    pub epoch: i64,
    /// The shard's pulse when it was put down: a floor item decays after the shard's floor
    /// lifetime ([`crate::live_shard::LiveShardConfig::floor_lifetime_pulses`]).
    pub at_pulse: u64,
}

/// A live item.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// Durable instance identity.
    pub id: Option<Uuid>,
    /// The shared prototype.
    pub proto: Arc<Prototype>,
    /// Per-instance delta.
    pub delta: ItemDelta,
    /// Contents, for containers.
    pub contents: Vec<Item>,
    /// Transient release marker (drop / put); cleared on pickup.
    pub released: Option<Released>,
}

impl Item {
    /// A fresh instance of `proto` with a new identity.
    pub fn spawn(proto: &Arc<Prototype>) -> Self {
        Self {
            id: Some(Uuid::now_v7()),
            proto: Arc::clone(proto),
            delta: ItemDelta::default(),
            contents: Vec::new(),
            released: None,
        }
    }

    /// Visits this item and everything inside it.
    pub fn walk<'a>(&'a self, visit: &mut impl FnMut(&'a Item)) {
        visit(self);
        for inner in &self.contents {
            inner.walk(visit);
        }
    }
}

/// Bounds on one character's carry tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CarryLimits {
    /// Deepest nesting (top-level items are at depth 1).
    pub max_depth: usize,
    /// Most items in the whole tree.
    pub max_nodes: usize,
    /// Largest encoded size of the tree, in bytes.
    pub max_bytes: usize,
}

impl Default for CarryLimits {
    fn default() -> Self {
        Self {
            max_depth: 16,
            max_nodes: 512,
            max_bytes: 256 * 1024,
        }
    }
}

/// A carry tree over its bounds; the save is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CarryTreeError {
    /// Nested deeper than allowed.
    #[error("carry tree nests {depth} deep; at most {max} allowed")]
    TooDeep {
        /// Depth reached.
        depth: usize,
        /// The bound.
        max: usize,
    },
    /// More items than allowed.
    #[error("carry tree holds {nodes} items; at most {max} allowed")]
    TooManyNodes {
        /// Items counted.
        nodes: usize,
        /// The bound.
        max: usize,
    },
    /// Encoded size over the bound.
    #[error("carry tree encodes to {bytes} bytes; at most {max} allowed")]
    TooLarge {
        /// Encoded size.
        bytes: usize,
        /// The bound.
        max: usize,
    },
}

/// Converts live items to their stored form, refusing a tree over `limits`.
pub fn dump_items<'a>(
    items: impl IntoIterator<Item = &'a Item>,
    limits: CarryLimits,
    nodes: &mut usize,
) -> Result<Vec<ItemJson>, CarryTreeError> {
    items
        .into_iter()
        .map(|item| dump_item(item, 1, limits, nodes))
        .collect()
}

/// Converts one top-level item (and its contents) to its stored form.
pub fn dump_one(
    item: &Item,
    limits: CarryLimits,
    nodes: &mut usize,
) -> Result<ItemJson, CarryTreeError> {
    dump_item(item, 1, limits, nodes)
}

fn dump_item(
    item: &Item,
    depth: usize,
    limits: CarryLimits,
    nodes: &mut usize,
) -> Result<ItemJson, CarryTreeError> {
    count_node(depth, limits, nodes)?;
    Ok(ItemJson {
        proto: item.proto.proto_ref.clone(),
        delta: item.delta,
        contents: item
            .contents
            .iter()
            .map(|inner| dump_item(inner, depth + 1, limits, nodes))
            .collect::<Result<_, _>>()?,
        id: item.id,
    })
}

/// Counts one node of a carry tree at `depth`, refusing one past `limits`.
pub(super) fn count_node(
    depth: usize,
    limits: CarryLimits,
    nodes: &mut usize,
) -> Result<(), CarryTreeError> {
    if depth > limits.max_depth {
        return Err(CarryTreeError::TooDeep {
            depth,
            max: limits.max_depth,
        });
    }
    *nodes += 1;
    if *nodes > limits.max_nodes {
        return Err(CarryTreeError::TooManyNodes {
            nodes: *nodes,
            max: limits.max_nodes,
        });
    }
    Ok(())
}

/// Running budget of a load, shared across equipment and inventory.
#[derive(Debug, Clone, Copy)]
pub struct LoadBudget {
    limits: CarryLimits,
    nodes: usize,
    bytes: usize,
}

impl LoadBudget {
    /// A fresh budget.
    pub fn new(limits: CarryLimits) -> Self {
        Self {
            limits,
            nodes: 0,
            bytes: 0,
        }
    }

    /// Charges one top-level subtree's encoded size; false when it does not fit.
    pub fn charge_bytes(&mut self, item: &ItemJson) -> bool {
        let size = serde_json::to_vec(item).map_or(usize::MAX, |v| v.len());
        if self.bytes.saturating_add(size) > self.limits.max_bytes {
            return false;
        }
        self.bytes += size;
        true
    }
}

/// Re-spawns a stored item. Unknown prototypes, subtrees past the depth bound and items past the
/// node bound are skipped with a warning; a skipped container loses its contents with it.
pub fn load_item(
    json: &ItemJson,
    depth: usize,
    catalog: &Catalog,
    budget: &mut LoadBudget,
    warnings: &mut Vec<String>,
) -> Option<Item> {
    if depth > budget.limits.max_depth {
        warnings.push(format!(
            "skipped a subtree at depth {depth} (at most {} allowed)",
            budget.limits.max_depth
        ));
        return None;
    }
    if budget.nodes >= budget.limits.max_nodes {
        warnings.push(format!(
            "skipped {:?}: over {} items",
            json.proto, budget.limits.max_nodes
        ));
        return None;
    }
    let Some(proto) = catalog.get(&json.proto) else {
        warnings.push(format!("skipped unknown prototype {:?}", json.proto));
        return None;
    };
    budget.nodes += 1;
    let contents = json
        .contents
        .iter()
        .filter_map(|inner| load_item(inner, depth + 1, catalog, budget, warnings))
        .collect();
    Some(Item {
        id: json.id,
        proto: Arc::clone(proto),
        delta: json.delta,
        contents,
        released: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize, catalog: &Catalog) -> Item {
        let bag = catalog.get("bag").cloned().unwrap_or_else(|| panic!("bag"));
        let mut item = Item::spawn(&bag);
        for _ in 1..depth {
            let mut outer = Item::spawn(&bag);
            outer.contents.push(item);
            item = outer;
        }
        item
    }

    #[test]
    fn dump_refuses_a_tree_too_deep() {
        let catalog = Catalog::reference();
        let limits = CarryLimits::default();
        assert!(dump_items([&nested(16, &catalog)], limits, &mut 0).is_ok());
        assert_eq!(
            dump_items([&nested(17, &catalog)], limits, &mut 0),
            Err(CarryTreeError::TooDeep { depth: 17, max: 16 })
        );
    }

    #[test]
    fn load_skips_the_part_past_the_depth_bound() {
        let catalog = Catalog::reference();
        let deep = dump_items(
            [&nested(20, &catalog)],
            CarryLimits {
                max_depth: 64,
                ..Default::default()
            },
            &mut 0,
        )
        .unwrap_or_default();
        let mut warnings = Vec::new();
        let mut budget = LoadBudget::new(CarryLimits::default());
        let loaded = load_item(&deep[0], 1, &catalog, &mut budget, &mut warnings);
        let mut count = 0;
        if let Some(item) = &loaded {
            item.walk(&mut |_| count += 1);
        }
        assert_eq!(count, 16);
        assert_eq!(warnings.len(), 1);
    }

    #[test]
    fn unknown_prototypes_are_skipped_with_a_warning() {
        let catalog = Catalog::reference();
        let json = ItemJson {
            proto: "vorpal-blade".into(),
            delta: ItemDelta::default(),
            contents: Vec::new(),
            id: None,
        };
        let mut warnings = Vec::new();
        let mut budget = LoadBudget::new(CarryLimits::default());
        assert!(load_item(&json, 1, &catalog, &mut budget, &mut warnings).is_none());
        assert!(warnings[0].contains("vorpal-blade"));
    }

    #[test]
    fn the_delta_round_trips_and_default_fields_are_omitted() {
        let json = ItemJson {
            proto: "ore".into(),
            delta: ItemDelta {
                quality: 2,
                bound: true,
                stack: 17,
                kept: true,
            },
            contents: Vec::new(),
            id: None,
        };
        let text = serde_json::to_string(&json).unwrap_or_default();
        assert_eq!(serde_json::from_str::<ItemJson>(&text).ok(), Some(json));
        let plain = serde_json::to_string(&ItemJson {
            proto: "gem".into(),
            delta: ItemDelta::default(),
            contents: Vec::new(),
            id: None,
        })
        .unwrap_or_default();
        assert_eq!(plain, r#"{"proto":"gem"}"#);
    }
}
