use serde_json::json;
use uuid::Uuid;

use super::*;
use crate::game::items::{CarryLimits, Slot};
use crate::game::state::Affect;

fn snapshot(state: serde_json::Value) -> CharacterSnapshot {
    CharacterSnapshot {
        character_id: Uuid::nil(),
        account_id: Uuid::nil(),
        name: "Aria".into(),
        zone_ref: Some("midgaard".into()),
        room_ref: Some("market".into()),
        state: state.into(),
        chargen: None,
        state_version: 4,
        owner_epoch: 2,
        issue_mark: 9,
        schema_version: 1,
    }
}

fn options() -> ApplyOptions {
    ApplyOptions {
        fresh_login: false,
        limits: CarryLimits::default(),
    }
}

#[test]
fn a_wounded_pool_clamps_to_the_final_buffed_maximum() {
    // con 10 → hp max 70; mail +15 → 85; a +20 hp affect → 105.
    let state = json!({
        "resources": { "hp": 100 },
        "equipment": { "body": { "proto": "mail" } },
        "affects": [{ "name": "fortitude", "remaining_pulses": 30, "pool_mods": { "hp": 20 } }],
    });
    let applied = apply_snapshot(&snapshot(state), &Catalog::reference(), options());
    let hp = applied.character.pools["hp"];
    assert_eq!(
        (hp.cur, hp.max),
        (100, 105),
        "cur installs after gear and affects"
    );
    let over = json!({ "resources": { "hp": 500 } });
    let applied = apply_snapshot(&snapshot(over), &Catalog::reference(), options());
    assert_eq!(applied.character.pools["hp"].cur, 70);
}

#[test]
fn derived_values_recompute_from_base_affects_and_gear() {
    let state = json!({
        "attributes": { "str": 14 },
        "equipment": { "wield": { "proto": "sword" } },
        "affects": [{ "name": "might", "remaining_pulses": 5, "attribute_mods": { "str": 2 } }],
    });
    let applied = apply_snapshot(&snapshot(state), &Catalog::reference(), options());
    assert_eq!(applied.character.attributes["str"], 17);
    assert_eq!(applied.character.attributes["dex"], 10);
    assert_eq!(
        applied.character.affects[0].remaining_pulses, 5,
        "durations are conserved"
    );
}

#[test]
fn a_fresh_login_restarts_the_input_sequence() {
    let state = json!({ "applied_seq": 991 });
    let kept = apply_snapshot(&snapshot(state.clone()), &Catalog::reference(), options());
    assert_eq!(kept.character.applied_seq, 991);
    let fresh = apply_snapshot(
        &snapshot(state),
        &Catalog::reference(),
        ApplyOptions {
            fresh_login: true,
            ..options()
        },
    );
    assert_eq!(fresh.character.applied_seq, 0);
}

#[test]
fn an_unknown_prototype_is_skipped_and_the_rest_loads() {
    let state = json!({ "inventory": [{ "proto": "gem" }, { "proto": "removed-item" }, { "proto": "ore", "delta": { "stack": 9 } }] });
    let applied = apply_snapshot(&snapshot(state), &Catalog::reference(), options());
    let protos: Vec<&str> = applied
        .character
        .inventory
        .iter()
        .map(|i| i.proto.proto_ref.as_str())
        .collect();
    assert_eq!(protos, vec!["gem", "ore"]);
    assert_eq!(applied.character.inventory[1].delta.stack, 9);
    assert_eq!(applied.warnings.len(), 1);
}

#[test]
fn chargen_builds_the_character_and_clears_itself() {
    let mut snap = snapshot(json!({}));
    snap.chargen = Some(
        json!({ "attributes": { "int": 16 }, "items": ["bag", "herb"], "appearance": { "hair": "red" } }),
    );
    let applied = apply_snapshot(&snap, &Catalog::reference(), options());
    assert_eq!(applied.character.chargen, None);
    assert_eq!(applied.character.attributes["int"], 16);
    assert_eq!(applied.character.inventory.len(), 2);
    assert_eq!(applied.character.appearance.hair, "red");
    let dumped = dump_character(
        &applied.character,
        Some("midgaard"),
        Some("market"),
        CarryLimits::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(dumped.chargen, None, "the next CAS write clears the column");
}

#[test]
fn unreadable_chargen_stays_pending() {
    let mut snap = snapshot(json!({}));
    snap.chargen = Some(json!({ "attributes": "lots" }));
    let applied = apply_snapshot(&snap, &Catalog::reference(), options());
    assert!(applied.character.chargen.is_some());
    assert_eq!(applied.warnings.len(), 1);
}

#[test]
fn an_unreadable_state_document_loads_defaults_with_a_warning() {
    let applied = apply_snapshot(
        &snapshot(json!("not an object")),
        &Catalog::reference(),
        options(),
    );
    assert_eq!(applied.character.pools["hp"].cur, 70);
    assert_eq!(applied.warnings.len(), 1);
}

#[test]
fn dump_then_apply_is_the_identity() {
    let state = json!({
        "attributes": { "str": 12 },
        "resources": { "hp": 33, "mana": 5, "stamina": 20 },
        "affects": [{ "name": "haste", "remaining_pulses": 12, "attribute_mods": { "dex": 1 } }],
        "cooldowns": { "bash": 7 },
        "equipment": { "head": { "proto": "helm", "delta": { "quality": 2 } } },
        "inventory": [{ "proto": "bag", "contents": [{ "proto": "gem", "id": "0190a0b0-0000-7000-8000-000000000001" }] }],
        "experience": 1234, "level": 3, "currency": 99,
        "appearance": { "hair": "black", "skin": "pale", "outfit": "robe" },
        "position": [3, 4], "applied_seq": 17, "tracks": { "smithing": 2 }
    });
    let snap = snapshot(state);
    let applied = apply_snapshot(&snap, &Catalog::reference(), options());
    assert!(applied.warnings.is_empty(), "{:?}", applied.warnings);
    let dumped = dump_character(
        &applied.character,
        Some("midgaard"),
        Some("market"),
        CarryLimits::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(dumped, snap);
}

#[test]
fn an_oversized_carry_tree_refuses_to_dump() {
    let catalog = Catalog::reference();
    let mut applied = apply_snapshot(&snapshot(json!({})), &catalog, options());
    let gem = catalog.get("gem").cloned().unwrap_or_else(|| panic!("gem"));
    for _ in 0..513 {
        applied.character.inventory.push(Item::spawn(&gem));
    }
    let err = dump_character(&applied.character, None, None, CarryLimits::default()).unwrap_err();
    assert_eq!(
        err,
        DumpError::CarryTree(CarryTreeError::TooManyNodes {
            nodes: 513,
            max: 512
        })
    );
    // Few items, but each with an enormous prototype reference: over the size bound.
    let mut long = (**catalog.get("gem").unwrap()).clone();
    long.proto_ref = "g".repeat(4096);
    let long = std::sync::Arc::new(long);
    applied.character.inventory = (0..70).map(|_| Item::spawn(&long)).collect();
    assert!(matches!(
        dump_character(&applied.character, None, None, CarryLimits::default()),
        Err(DumpError::CarryTree(CarryTreeError::TooLarge { .. }))
    ));
}

#[test]
fn loading_an_oversized_tree_skips_the_excess() {
    let items: Vec<serde_json::Value> = (0..600).map(|_| json!({ "proto": "gem" })).collect();
    let applied = apply_snapshot(
        &snapshot(json!({ "inventory": items })),
        &Catalog::reference(),
        options(),
    );
    assert_eq!(applied.character.inventory.len(), 512);
    assert!(!applied.warnings.is_empty());
}

#[test]
fn an_instance_dump_carries_no_zone() {
    let applied = apply_snapshot(&snapshot(json!({})), &Catalog::reference(), options());
    let dumped = dump_character(
        &applied.character,
        None,
        Some("instance-room"),
        CarryLimits::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((dumped.zone_ref, dumped.room_ref), (None, None));
}

#[test]
fn pulses_expire_affects_and_cooldowns() {
    let mut c = apply_snapshot(&snapshot(json!({})), &Catalog::reference(), options()).character;
    c.affects.push(Affect {
        name: "might".into(),
        remaining_pulses: 1,
        attribute_mods: [("str".to_owned(), 3)].into(),
        pool_mods: Default::default(),
    });
    c.cooldowns.insert("bash".into(), 2);
    c.recompute();
    assert_eq!(c.attributes["str"], 13);
    c.pulse();
    assert_eq!(c.attributes["str"], 10);
    assert_eq!(c.cooldowns["bash"], 1);
    c.pulse();
    assert!(c.cooldowns.is_empty());
    assert!(!c.equipment.contains_key(&Slot::Head));
}

#[test]
fn a_document_from_before_the_bookkeeping_moved_out_loads_and_dumps_without_it() {
    let gem = "0190a0b0-0000-7000-8000-000000000001";
    let state = json!({
        "experience": 40,
        "inventory": [{ "proto": "gem", "id": gem }],
        "reward_keys": ["reward:a:1:1:40:0"],
        "job_effects": [{ "key": "looks-1", "payload": { "kind": "character_appearance" } }],
        "held_at_load": { gem: 1 }
    });
    let applied = apply_snapshot(&snapshot(state), &Catalog::reference(), options());
    assert!(applied.warnings.is_empty(), "{:?}", applied.warnings);
    let dumped = dump_character(&applied.character, None, None, CarryLimits::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let fields = dumped.state.as_object().unwrap_or_else(|| panic!("object"));
    for old in ["reward_keys", "job_effects", "held_at_load"] {
        assert!(!fields.contains_key(old), "{old} is still in the document");
    }
    assert_eq!(dumped.state["experience"], 40);
    assert_eq!(
        crate::game::state::stored_item_ids(&dumped.state),
        vec![Uuid::parse_str(gem).unwrap_or_else(|e| panic!("{e}"))]
    );
}

#[test]
fn issues_are_numbered_and_every_dump_carries_the_mark() {
    let mut character =
        apply_snapshot(&snapshot(json!({})), &Catalog::reference(), options()).character;
    assert_eq!(
        character.issued, 9,
        "a copy continues from the snapshot's mark"
    );
    assert_eq!((character.issue(), character.issue()), (10, 11));
    let dumped = dump_character(&character, None, None, CarryLimits::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(dumped.issue_mark, 11);
}

#[test]
fn stored_item_ids_walk_worn_carried_and_nested_items() {
    let id = |n: u128| Uuid::from_u128(n);
    let state = json!({
        "equipment": { "head": { "proto": "helm", "id": id(1) } },
        "inventory": [{ "proto": "bag", "id": id(2), "contents": [{ "proto": "gem", "id": id(3) }] },
                      { "proto": "gem" }]
    });
    assert_eq!(
        crate::game::state::stored_item_ids(&state),
        vec![id(1), id(2), id(3)]
    );
    assert!(crate::game::state::stored_item_ids(&json!("not a document")).is_empty());
}

/// The dump encodes a live character straight from borrowed views: the document is exactly
/// the one a `StateDocument` copied out of the character encodes to, field for field.
#[test]
fn a_dump_encodes_what_a_state_document_of_the_character_would() {
    let state = json!({
        "attributes": { "str": 14, "con": 13 },
        "resources": { "hp": 80, "mana": 30, "stamina": 40 },
        "affects": [{ "name": "blessed", "remaining_pulses": 400, "attribute_mods": { "wis": 1 } }],
        "cooldowns": { "bash": 12 },
        "equipment": { "wield": { "proto": "sword", "delta": { "quality": 2 } }, "head": { "proto": "helm" } },
        "inventory": [
            { "proto": "bag", "contents": [{ "proto": "gem", "id": "0191c5d6-0000-7000-8000-000000000001" },
                                            { "proto": "herb", "delta": { "stack": 7 } }] },
            { "proto": "ore", "delta": { "stack": 23 } }
        ],
        "experience": 48211, "level": 12, "currency": 1907,
        "appearance": { "hair": "braided", "skin": "tan", "outfit": "ranger" },
        "position": [4, 9], "applied_seq": 3, "tracks": { "smithing": 3 }
    });
    let character = apply_snapshot(&snapshot(state), &Catalog::reference(), options()).character;
    let dumped = dump_character(&character, None, None, CarryLimits::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut nodes = 0;
    let limits = CarryLimits::default();
    let copied = crate::game::state::StateDocument {
        attributes: character.base.clone(),
        resources: character
            .pools
            .iter()
            .map(|(k, p)| (k.clone(), p.cur))
            .collect(),
        affects: character.affects.clone(),
        cooldowns: character.cooldowns.clone(),
        equipment: character
            .equipment
            .iter()
            .map(|(slot, item)| {
                (
                    *slot,
                    crate::game::items::dump_one(item, limits, &mut nodes)
                        .unwrap_or_else(|e| panic!("{e}")),
                )
            })
            .collect(),
        inventory: crate::game::items::dump_items(&character.inventory, limits, &mut nodes)
            .unwrap_or_else(|e| panic!("{e}")),
        experience: character.experience,
        level: character.level,
        currency: character.currency,
        appearance: character.appearance.clone(),
        position: character.position,
        applied_seq: character.applied_seq,
        tracks: character.tracks.clone(),
    };
    let expected = serde_json::to_string(&copied).unwrap_or_default();
    assert_eq!(
        dumped.state.as_str(),
        expected,
        "the same text, field order included"
    );
}

/// Timers advanced `n` pulses at once leave a character exactly as `n` single pulses do, even
/// when several affects run out in between and each expiry clamps the pools in turn.
#[test]
fn advancing_at_once_matches_a_pulse_by_pulse_countdown() {
    // hp max 70: +20 until pulse 3 (90), then −30 until pulse 5 (40), then 70 again.
    let state = json!({
        "resources": { "hp": 90 },
        "affects": [
            { "name": "fortitude", "remaining_pulses": 3, "pool_mods": { "hp": 20 } },
            { "name": "wasting", "remaining_pulses": 5, "pool_mods": { "hp": -30 } },
            { "name": "haste", "remaining_pulses": 9, "attribute_mods": { "dex": 2 } },
        ],
        "cooldowns": { "kick": 4, "bash": 12 },
    });
    let start = apply_snapshot(&snapshot(state), &Catalog::reference(), options()).character;
    for n in [1, 3, 4, 5, 8, 9, 12, 40] {
        let mut stepped = start.clone();
        for _ in 0..n {
            stepped.pulse();
        }
        let mut at_once = start.clone();
        at_once.advance(n);
        assert_eq!(at_once, stepped, "after {n} pulses");
    }
    let mut after = start.clone();
    after.advance(6);
    assert_eq!(
        after.pools["hp"].cur, 40,
        "clamped by the wasting affect after the fortitude ran out"
    );
}
