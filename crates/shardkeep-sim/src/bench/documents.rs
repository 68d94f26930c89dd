//! The state documents benchmarks write, in the reference game's format: the fresh template
//! (a new adventurer, about 620 bytes), a realistic one (about 4 KB: 40 items in nested
//! containers, 20 affects, 10 tracks), and — through [`super::aging`] — a character that lived.

use serde_json::{Value, json};
use uuid::Uuid;

/// Which document a benchmark step writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DocumentKind {
    /// The fresh template.
    Fresh,
    /// A character aged through the library (rewards, item moves, logins).
    Aged,
    /// The realistic 4 KB document.
    Realistic,
}

impl DocumentKind {
    /// Its label in the report.
    pub fn label(self) -> &'static str {
        match self {
            Self::Fresh => "fresh",
            Self::Aged => "aged",
            Self::Realistic => "4 KB",
        }
    }
}

/// A representative fresh document: a kitted-out adventurer with a bag of loot.
pub fn template_state() -> Value {
    json!({
        "attributes": { "str": 14, "dex": 12, "con": 13 },
        "resources": { "hp": 80, "mana": 30, "stamina": 40 },
        "affects": [{ "name": "blessed", "remaining_pulses": 400, "attribute_mods": { "wis": 1 } }],
        "cooldowns": { "bash": 12, "kick": 3 },
        "equipment": {
            "wield": { "proto": "sword", "delta": { "quality": 2 } },
            "body": { "proto": "mail" },
            "head": { "proto": "helm" }
        },
        "inventory": [
            { "proto": "bag", "contents": [{ "proto": "gem" }, { "proto": "gem" }, { "proto": "herb", "delta": { "stack": 7 } }] },
            { "proto": "ore", "delta": { "stack": 23 } }
        ],
        "experience": 48211, "level": 12, "currency": 1907,
        "appearance": { "hair": "braided", "skin": "tan", "outfit": "ranger" },
        "position": [4, 9], "applied_seq": 0, "tracks": { "smithing": 3 }
    })
}

/// Gives every item of `state` (inventory, containers, equipment) an identity, as items carry
/// in play.
pub fn with_item_ids(mut state: Value) -> Value {
    fn walk(item: &mut Value) {
        item["id"] = json!(Uuid::now_v7());
        if let Some(contents) = item.get_mut("contents").and_then(|c| c.as_array_mut()) {
            contents.iter_mut().for_each(walk);
        }
    }
    if let Some(inventory) = state["inventory"].as_array_mut() {
        inventory.iter_mut().for_each(walk);
    }
    if let Some(equipment) = state["equipment"].as_object_mut() {
        equipment.values_mut().for_each(walk);
    }
    state
}

/// A veteran's document of about 4 KB: 40 items with identities (three worn; the rest in a
/// chest holding bags holding loot), 20 affects with modifiers, 10 advancement tracks.
pub fn realistic_state() -> Value {
    let loot = |n: usize| -> Value {
        match n % 4 {
            0 => json!({ "proto": "gem", "delta": { "quality": 1 + (n % 4) as u8 } }),
            1 => json!({ "proto": "herb", "delta": { "stack": 1 + n % 19 } }),
            2 => json!({ "proto": "ore", "delta": { "stack": 1 + n % 49 } }),
            _ => json!({ "proto": "gem" }),
        }
    };
    // 3 worn + chest + 4 bags + 32 loot = 40 items.
    let mut n = 0;
    let bags: Vec<Value> = (0..4)
        .map(|_| {
            let contents: Vec<Value> = (0..8)
                .map(|_| {
                    n += 1;
                    loot(n)
                })
                .collect();
            json!({ "proto": "bag", "contents": contents })
        })
        .collect();
    let affects: Vec<Value> = (0..20)
        .map(|i| {
            let name = format!("affect-{i:02}");
            if i % 2 == 0 {
                json!({
                    "name": name,
                    "remaining_pulses": 200 + 37 * i,
                    "attribute_mods": { ["str", "dex", "con", "int", "wis"][i % 5]: 1 + (i % 3) as i32 }
                })
            } else {
                json!({ "name": name, "remaining_pulses": 200 + 37 * i })
            }
        })
        .collect();
    let tracks: serde_json::Map<String, Value> = [
        "smithing",
        "tailoring",
        "alchemy",
        "mining",
        "herbalism",
        "fishing",
        "cooking",
        "riding",
        "archery",
        "lore",
    ]
    .iter()
    .enumerate()
    .map(|(i, t)| ((*t).to_owned(), json!(3 + i * 7)))
    .collect();
    let state = json!({
        "attributes": { "str": 17, "dex": 15, "con": 16, "int": 11, "wis": 13 },
        "resources": { "hp": 140, "mana": 62, "stamina": 75 },
        "affects": affects,
        "cooldowns": { "bash": 12, "kick": 3, "rescue": 40, "disarm": 22 },
        "equipment": {
            "wield": { "proto": "sword", "delta": { "quality": 4 } },
            "body": { "proto": "mail", "delta": { "quality": 2 } },
            "head": { "proto": "helm" }
        },
        "inventory": [{ "proto": "chest", "contents": bags }],
        "experience": 9_482_211, "level": 57, "currency": 1_290_771,
        "appearance": { "hair": "silver braids", "skin": "weathered", "outfit": "wanderer's cloak" },
        "position": [14, 3], "applied_seq": 0, "tracks": tracks
    });
    with_item_ids(state)
}

/// `state` with every affect's and cooldown's remaining pulses lengthened by an amount that
/// depends on `variant` and on the timer (as if cast at another moment).
pub fn with_timers_shifted(state: &Value, variant: u32) -> Value {
    let mut state = state.clone();
    let shift = |n: u32| u64::from((variant * 31 + n * 17) % 97);
    if let Some(affects) = state["affects"].as_array_mut() {
        for (n, affect) in affects.iter_mut().enumerate() {
            let left = affect["remaining_pulses"].as_u64().unwrap_or(0);
            affect["remaining_pulses"] = json!(left + shift(n as u32));
        }
    }
    if let Some(cooldowns) = state["cooldowns"].as_object_mut() {
        for (n, left) in cooldowns.values_mut().enumerate() {
            *left = json!(left.as_u64().unwrap_or(0) + shift(n as u32 + 50));
        }
    }
    state
}

/// Items in a reference document, containers and worn items included.
pub fn count_items(state: &Value) -> usize {
    fn walk(item: &Value) -> usize {
        1 + item["contents"]
            .as_array()
            .map_or(0, |c| c.iter().map(walk).sum())
    }
    let carried: usize = state["inventory"]
        .as_array()
        .map_or(0, |i| i.iter().map(walk).sum());
    let worn: usize = state["equipment"]
        .as_object()
        .map_or(0, |e| e.values().map(walk).sum());
    carried + worn
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardkeep_reference::game::{ApplyOptions, Catalog, apply_snapshot};

    #[test]
    fn the_realistic_document_is_about_4_kb_with_what_it_says() {
        let state = realistic_state();
        let bytes = serde_json::to_vec(&state).map(|v| v.len()).unwrap_or(0);
        assert!((3_600..=4_800).contains(&bytes), "{bytes} bytes");
        assert_eq!(count_items(&state), 40);
        assert_eq!(state["affects"].as_array().map(Vec::len), Some(20));
        assert_eq!(state["tracks"].as_object().map(|t| t.len()), Some(10));
    }

    #[test]
    fn every_benchmark_document_applies_cleanly_to_the_reference_game() {
        for state in [
            template_state(),
            realistic_state(),
            with_item_ids(template_state()),
        ] {
            let snapshot = shardkeep::character::CharacterSnapshot {
                character_id: Uuid::now_v7(),
                account_id: Uuid::nil(),
                name: "probe".into(),
                zone_ref: Some("zone-0".into()),
                room_ref: Some("r0".into()),
                state: state.into(),
                chargen: None,
                state_version: 0,
                issue_mark: 0,
                owner_epoch: 1,
                schema_version: 1,
            };
            let applied = apply_snapshot(&snapshot, &Catalog::reference(), ApplyOptions::default());
            assert!(applied.warnings.is_empty(), "{:?}", applied.warnings);
        }
    }
}
