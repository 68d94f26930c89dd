//! Characters for tests: a new one, or one created and read back through the store.

use serde_json::json;
use shardkeep::character::{CharacterSnapshot, CharacterStore, NewCharacter};
use uuid::Uuid;

/// A character that is not stored yet, anchored in a zone, with a small state document and a
/// pending chargen input.
pub fn new_character(name: &str) -> NewCharacter {
    NewCharacter {
        character_id: Uuid::now_v7(),
        account_id: Uuid::now_v7(),
        name: name.into(),
        zone_ref: Some("midgaard".into()),
        room_ref: Some("market".into()),
        state: json!({ "gold": 1 }).into(),
        chargen: Some(json!({ "class": "ranger" })),
        schema_version: 1,
    }
}

/// A new character named `name`, stored and read back.
pub async fn created(store: &CharacterStore, name: &str) -> CharacterSnapshot {
    let new = new_character(name);
    store.create(&new).await.unwrap();
    store.load(new.character_id).await.unwrap().unwrap()
}
