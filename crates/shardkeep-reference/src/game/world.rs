//! Zones, rooms and exits, the reset (repop) interpreter, and the room resolver.
//!
//! Resets run on the zone's thread with no I/O: each op declares a maximum, the interpreter
//! counts the live instances that op owns in its room, and spawns only the difference, so a
//! reset on a full zone changes nothing. An op flagged persistent belongs to the durable
//! world-object store, which does not exist yet: it is a logged no-op.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::items::{Catalog, Item};

/// One exit out of a room.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exit {
    /// Zone the exit leads into (may be this zone).
    pub zone: String,
    /// Room it leads into.
    pub room: String,
}

/// A room and its exits by direction.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RoomDef {
    /// Exits by direction (`north`, `east`, …).
    pub exits: BTreeMap<String, Exit>,
}

/// What a reset op spawns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Spawn {
    /// A mobile of this kind.
    Mob(String),
    /// An item of this prototype, on the floor.
    Item(String),
}

/// One reset op.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetOp {
    /// Stable id; spawned entities remember it.
    pub id: String,
    /// Room it spawns into.
    pub room: String,
    /// What it spawns.
    pub spawn: Spawn,
    /// Most live instances it keeps.
    pub max: u32,
    /// Belongs to the durable world-object store (load once at boot).
    pub persistent: bool,
}

/// A zone's static definition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneDef {
    /// Zone id, also the `zone_ref` stored for characters in it.
    pub id: String,
    /// Room new characters and unresolved refs land in.
    pub start_room: String,
    /// Rooms by id.
    pub rooms: BTreeMap<String, RoomDef>,
    /// Reset ops, run at boot and on the repop timer.
    pub resets: Vec<ResetOp>,
    /// Pulses between repops.
    pub repop_pulses: u32,
    /// An instance: shard-local, never written as a durable location.
    pub instance: bool,
}

/// A live mobile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mob {
    /// Instance id.
    pub id: Uuid,
    /// Its kind.
    pub kind: String,
    /// Room it is in.
    pub room: String,
    /// The reset op that spawned it.
    pub reset_op: Option<String>,
}

/// An item lying in a room.
#[derive(Debug, Clone, PartialEq)]
pub struct FloorItem {
    /// The item (containers hold their contents).
    pub item: Item,
    /// Room it lies in.
    pub room: String,
    /// The reset op that spawned it, if any.
    pub reset_op: Option<String>,
}

/// The ephemeral entities of a zone.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ZoneEntities {
    /// Mobiles.
    pub mobs: Vec<Mob>,
    /// Items on the floor.
    pub floor: Vec<FloorItem>,
}

/// Removes from `floor` (and from containers lying on it) every item `gone` names; the ids of
/// everything removed, contents included. The shards sweep what decayed and what an evicted
/// copy put down with it.
pub fn sweep_floor(floor: &mut Vec<FloorItem>, gone: impl Fn(&Item) -> bool) -> Vec<Uuid> {
    let mut removed = Vec::new();
    floor.retain_mut(|lying| {
        if gone(&lying.item) {
            lying.item.walk(&mut |i| removed.extend(i.id));
            return false;
        }
        lying.item.contents.retain(|inner| {
            if gone(inner) {
                inner.walk(&mut |i| removed.extend(i.id));
                return false;
            }
            true
        });
        true
    });
    removed
}

/// What one reset pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResetReport {
    /// Mobiles spawned.
    pub mobs: u32,
    /// Items spawned.
    pub items: u32,
    /// Persistent ops routed to the (absent) world-object store.
    pub persistent_skipped: u32,
    /// Ops naming a prototype the catalog lacks.
    pub unknown: u32,
}

/// Tops every reset op of `zone` up to its maximum. No I/O.
pub fn run_resets(zone: &ZoneDef, entities: &mut ZoneEntities, catalog: &Catalog) -> ResetReport {
    let mut report = ResetReport::default();
    for op in &zone.resets {
        if op.persistent {
            tracing::debug!(event = "persistent_reset_skipped", zone = %zone.id, op = %op.id,
                "no durable world-object store; persistent reset is a no-op");
            report.persistent_skipped += 1;
            continue;
        }
        let owned = |reset: &Option<String>, room: &str| {
            reset.as_deref() == Some(op.id.as_str()) && room == op.room
        };
        let live = match &op.spawn {
            Spawn::Mob(_) => entities
                .mobs
                .iter()
                .filter(|m| owned(&m.reset_op, &m.room))
                .count(),
            Spawn::Item(_) => entities
                .floor
                .iter()
                .filter(|f| owned(&f.reset_op, &f.room))
                .count(),
        };
        let missing = (op.max as usize).saturating_sub(live);
        for _ in 0..missing {
            match &op.spawn {
                Spawn::Mob(kind) => {
                    entities.mobs.push(Mob {
                        id: Uuid::now_v7(),
                        kind: kind.clone(),
                        room: op.room.clone(),
                        reset_op: Some(op.id.clone()),
                    });
                    report.mobs += 1;
                }
                Spawn::Item(proto_ref) => {
                    let Some(proto) = catalog.get(proto_ref) else {
                        tracing::warn!(event = "reset_unknown_prototype", zone = %zone.id, op = %op.id, proto = %proto_ref);
                        report.unknown += 1;
                        break;
                    };
                    entities.floor.push(FloorItem {
                        item: Item::spawn(proto),
                        room: op.room.clone(),
                        reset_op: Some(op.id.clone()),
                    });
                    report.items += 1;
                }
            }
        }
    }
    report
}

/// Resolves a stored room inside `zone`: an empty ref is the quiet start-room path; a ref the
/// zone does not have lands in the start room with a warning.
pub fn resolve_room<'a>(zone: &'a ZoneDef, room_ref: Option<&'a str>) -> (&'a str, Option<String>) {
    match room_ref.filter(|r| !r.is_empty()) {
        None => (&zone.start_room, None),
        Some(room) if zone.rooms.contains_key(room) => (room, None),
        Some(room) => {
            let warning = format!(
                "room {room:?} is not in zone {:?}; using its start room",
                zone.id
            );
            tracing::warn!(event = "room_unresolved", zone = %zone.id, room = %room);
            (&zone.start_room, Some(warning))
        }
    }
}

/// The id of the reference world's instance, entered down from `zone-0`'s room `r3`.
pub const REFERENCE_INSTANCE: &str = "crypt-0";

/// The zone an instance is entered from: where its exits lead out (`None` for a zone that is not
/// an instance, or an instance with no way out). An instance is shard-local, so it is hosted by
/// the shard that hosts this zone.
pub fn instance_entrance(zone: &ZoneDef) -> Option<&str> {
    if !zone.instance {
        return None;
    }
    zone.rooms
        .values()
        .flat_map(|room| room.exits.values())
        .map(|exit| exit.zone.as_str())
        .find(|to| *to != zone.id)
}

/// The reference world: `zones` zones in a ring (`zone-0`, `zone-1`, …), each a loop of four
/// rooms; room `r0` exits east into the next zone's `r0` and west into the previous zone's.
/// Every zone repops a guard, a chest and two heaps of ore. Last comes one instance,
/// [`REFERENCE_INSTANCE`]: two rooms entered down from `zone-0`'s `r3`, guarded by a wight.
pub fn reference_world(zones: usize) -> Vec<ZoneDef> {
    let mut world = ring(zones);
    if let Some(room) = world.first_mut().and_then(|z| z.rooms.get_mut("r3")) {
        room.exits.insert(
            "down".into(),
            Exit {
                zone: REFERENCE_INSTANCE.into(),
                room: "c0".into(),
            },
        );
    }
    world.push(crypt());
    world
}

fn crypt() -> ZoneDef {
    let id = REFERENCE_INSTANCE.to_owned();
    let exit = |zone: &str, room: &str| Exit {
        zone: zone.into(),
        room: room.into(),
    };
    let mut rooms = BTreeMap::new();
    rooms.insert(
        "c0".to_owned(),
        RoomDef {
            exits: BTreeMap::from([
                ("up".to_owned(), exit("zone-0", "r3")),
                ("north".to_owned(), exit(&id, "c1")),
            ]),
        },
    );
    rooms.insert(
        "c1".to_owned(),
        RoomDef {
            exits: BTreeMap::from([("south".to_owned(), exit(&id, "c0"))]),
        },
    );
    ZoneDef {
        start_room: "c0".into(),
        rooms,
        resets: vec![ResetOp {
            id: format!("{id}:wight"),
            room: "c1".into(),
            spawn: Spawn::Mob("wight".into()),
            max: 1,
            persistent: false,
        }],
        repop_pulses: 240,
        instance: true,
        id,
    }
}

fn ring(zones: usize) -> Vec<ZoneDef> {
    let zones = zones.max(1);
    (0..zones)
        .map(|z| {
            let id = format!("zone-{z}");
            let mut rooms = BTreeMap::new();
            for r in 0..4 {
                let mut exits = BTreeMap::new();
                exits.insert(
                    "north".into(),
                    Exit {
                        zone: id.clone(),
                        room: format!("r{}", (r + 1) % 4),
                    },
                );
                exits.insert(
                    "south".into(),
                    Exit {
                        zone: id.clone(),
                        room: format!("r{}", (r + 3) % 4),
                    },
                );
                if r == 0 && zones > 1 {
                    exits.insert(
                        "east".into(),
                        Exit {
                            zone: format!("zone-{}", (z + 1) % zones),
                            room: "r0".into(),
                        },
                    );
                    exits.insert(
                        "west".into(),
                        Exit {
                            zone: format!("zone-{}", (z + zones - 1) % zones),
                            room: "r0".into(),
                        },
                    );
                }
                rooms.insert(format!("r{r}"), RoomDef { exits });
            }
            let op = |n: &str, room: &str, spawn: Spawn, max: u32| ResetOp {
                id: format!("{id}:{n}"),
                room: room.into(),
                spawn,
                max,
                persistent: false,
            };
            ZoneDef {
                start_room: "r0".into(),
                rooms,
                resets: vec![
                    op("guard", "r1", Spawn::Mob("guard".into()), 1),
                    op("chest", "r2", Spawn::Item("chest".into()), 1),
                    op("ore", "r3", Spawn::Item("ore".into()), 2),
                ],
                repop_pulses: 240,
                instance: false,
                id,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone() -> ZoneDef {
        let mut zone = reference_world(1).remove(0);
        zone.resets.push(ResetOp {
            id: "relic".into(),
            room: "r0".into(),
            spawn: Spawn::Item("gem".into()),
            max: 1,
            persistent: true,
        });
        zone
    }

    #[test]
    fn resets_top_up_and_are_idempotent_on_a_full_zone() {
        let zone = zone();
        let catalog = Catalog::reference();
        let mut entities = ZoneEntities::default();
        let first = run_resets(&zone, &mut entities, &catalog);
        assert_eq!(
            (first.mobs, first.items, first.persistent_skipped),
            (1, 3, 1)
        );
        let again = run_resets(&zone, &mut entities, &catalog);
        assert_eq!((again.mobs, again.items), (0, 0));
        assert_eq!(entities.floor.len(), 3);
        // One heap of ore is picked up: only that one respawns.
        let taken = entities
            .floor
            .iter()
            .position(|f| f.item.proto.proto_ref == "ore");
        if let Some(i) = taken {
            entities.floor.remove(i);
        }
        let refill = run_resets(&zone, &mut entities, &catalog);
        assert_eq!((refill.mobs, refill.items), (0, 1));
    }

    #[test]
    fn an_item_moved_out_of_its_room_no_longer_counts() {
        let zone = zone();
        let catalog = Catalog::reference();
        let mut entities = ZoneEntities::default();
        run_resets(&zone, &mut entities, &catalog);
        entities.mobs[0].room = "r3".into();
        assert_eq!(run_resets(&zone, &mut entities, &catalog).mobs, 1);
    }

    #[test]
    fn rooms_resolve_quietly_or_with_a_warning() {
        let zone = zone();
        assert_eq!(resolve_room(&zone, None), ("r0", None));
        assert_eq!(resolve_room(&zone, Some("")), ("r0", None));
        assert_eq!(resolve_room(&zone, Some("r2")), ("r2", None));
        let (room, warning) = resolve_room(&zone, Some("elsewhere"));
        assert_eq!(room, "r0");
        assert!(warning.is_some());
    }

    #[test]
    fn the_reference_world_links_zones_in_a_ring() {
        let world = reference_world(3);
        assert_eq!(world[0].rooms["r0"].exits["east"].zone, "zone-1");
        assert_eq!(world[0].rooms["r0"].exits["west"].zone, "zone-2");
        assert_eq!(world[2].rooms["r0"].exits["east"].zone, "zone-0");
    }

    #[test]
    fn the_reference_world_has_one_instance_entered_from_zone_0() {
        let world = reference_world(3);
        let instances: Vec<&ZoneDef> = world.iter().filter(|z| z.instance).collect();
        assert_eq!(instances.len(), 1);
        let crypt = instances[0];
        assert_eq!(crypt.id, REFERENCE_INSTANCE);
        assert_eq!(instance_entrance(crypt), Some("zone-0"));
        assert_eq!(world[0].rooms["r3"].exits["down"].zone, REFERENCE_INSTANCE);
        assert_eq!(instance_entrance(&world[0]), None);
        assert_eq!(world.len(), 4, "ring zones first, the instance last");
    }
}
