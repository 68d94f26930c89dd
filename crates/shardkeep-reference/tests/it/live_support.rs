//! Shared set-up for the tests of the reference shard on the live-copy runtime (`LiveShard`):
//! boot over a test's services, characters made as a game makes them, a granted gem, and ticks
//! run until a condition holds.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use shardkeep::Services;
use shardkeep::character::NewCharacter;
use shardkeep::live::{Cadence, LiveConfig};
use shardkeep_reference::game::{Catalog, ItemJson, ReferenceEffect};
use shardkeep_reference::live_shard::{LiveShard, LiveShardConfig};
use shardkeep_reference::shard::ZoneDirectory;
use uuid::Uuid;

use super::support::zones;

/// The tests' shard config: a pulse of 10 ms, a checkpoint every 4 pulses, a flush every 40.
pub(crate) fn config(shard: &str, home: &str) -> LiveShardConfig {
    let mut config = LiveShardConfig::new(shard, home);
    config.live = LiveConfig {
        cadence: Cadence::new(Duration::from_millis(40), Duration::from_millis(400)),
        io_timeout: Duration::from_secs(3),
        ..LiveConfig::new(shard)
    };
    config
}

/// Boots `shard` hosting zones `ids` of a world of `total` zones (with the instances entered
/// from them), homed in the first.
pub(crate) fn boot_in(
    services: &Services,
    config: LiveShardConfig,
    ids: &[usize],
    total: usize,
    directory: &ZoneDirectory,
) -> LiveShard {
    LiveShard::boot(
        services,
        config,
        zones(ids, total),
        Arc::new(Catalog::reference()),
        directory.clone(),
    )
    .unwrap()
}

/// Boots `shard` hosting zones `ids` of a four-zone ring (zone-0 with its crypt).
pub(crate) fn boot(
    services: &Services,
    shard: &str,
    ids: &[usize],
    directory: &ZoneDirectory,
) -> LiveShard {
    let home = format!("zone-{}", ids[0]);
    boot_in(services, config(shard, &home), ids, 4, directory)
}

/// A character placed in zone-0's first room, with no creation input.
pub(crate) async fn new_character(services: &Services, name: &str) -> Uuid {
    create(services, name, Some(("zone-0", "r0")), json!({}), None).await
}

/// A character never placed, whose creation input is a starting bag.
pub(crate) async fn brand_new(services: &Services, name: &str) -> Uuid {
    create(
        services,
        name,
        None,
        json!({}),
        Some(json!({ "items": ["bag"] })),
    )
    .await
}

/// A character saved at `place` (zone, room; `None`: never placed) holding `state`, with
/// creation input `chargen`.
pub(crate) async fn create(
    services: &Services,
    name: &str,
    place: Option<(&str, &str)>,
    state: serde_json::Value,
    chargen: Option<serde_json::Value>,
) -> Uuid {
    let id = Uuid::now_v7();
    services
        .characters
        .create(&NewCharacter {
            character_id: id,
            account_id: Uuid::now_v7(),
            name: name.into(),
            zone_ref: place.map(|(zone, _)| zone.to_owned()),
            room_ref: place.map(|(_, room)| room.to_owned()),
            state: state.into(),
            chargen,
            schema_version: 1,
        })
        .await
        .unwrap();
    id
}

/// A reward carrying one item of `proto` with id `id` (a numbered grant: the way items enter
/// the world).
pub(crate) fn reward_of(proto: &str, id: Uuid) -> ReferenceEffect {
    let item: ItemJson = serde_json::from_value(json!({ "proto": proto, "id": id })).unwrap();
    ReferenceEffect::CombatRewards {
        experience: 10,
        currency: 5,
        items: vec![item],
    }
}

/// A reward carrying the gem `id`.
pub(crate) fn gem(id: Uuid) -> ReferenceEffect {
    reward_of("gem", id)
}

/// Grants a new gem to `character` and returns its id.
pub(crate) fn give_gem(shard: &mut LiveShard, character: Uuid) -> Uuid {
    let id = Uuid::now_v7();
    shard.grant(character, gem(id)).unwrap();
    id
}

/// True when `character`'s live copy holds `item`.
pub(crate) fn holds(shard: &LiveShard, character: Uuid, item: Uuid) -> bool {
    shard
        .read(character, |c| c.items().iter().any(|i| i.id == Some(item)))
        .unwrap_or(false)
}

/// Every item id on the shard's floors, containers' contents included.
pub(crate) fn floor_ids(shard: &LiveShard) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for (_, floor) in shard.floors() {
        for lying in floor {
            lying.item.walk(&mut |i| ids.extend(i.id));
        }
    }
    ids
}

/// The id of the first item of `proto` lying in `room`.
pub(crate) fn lying(shard: &LiveShard, proto: &str, room: &str) -> Uuid {
    shard
        .floors()
        .flat_map(|(_, floor)| floor.iter())
        .find(|f| f.room == room && f.item.proto.proto_ref == proto)
        .and_then(|f| f.item.id)
        .unwrap_or_else(|| panic!("no {proto} lies in {room}"))
}

/// Ticks `shard` every 10 ms until `done` or 10 s.
pub(crate) async fn tick_until(
    shard: &mut LiveShard,
    what: &str,
    mut done: impl FnMut(&mut LiveShard) -> bool,
) {
    for _ in 0..1000 {
        shard.tick();
        if done(shard) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not within 10 s");
}

/// The items of `character`'s row.
pub(crate) async fn row_items(services: &Services, character: Uuid) -> Vec<Uuid> {
    let row = services.characters.load(character).await.unwrap().unwrap();
    shardkeep_reference::game::state::stored_item_ids(row.state.value())
}

/// The `item_transferred` rows whose subject is `character`, oldest first: (actor, payload).
pub(crate) async fn transfers_to(
    services: &Services,
    character: Uuid,
) -> Vec<(Option<Uuid>, serde_json::Value)> {
    let page = services
        .audit
        .character_page(character, None, 200)
        .await
        .unwrap();
    page.rows
        .into_iter()
        .rev()
        .filter(|r| r.event_kind == "item_transferred")
        .map(|r| (r.actor_id, r.payload))
        .collect()
}
