//! A character's state document as JSON text: encoded once, when the game dumps it, and carried
//! as is by every write of that dump — the checkpoint (inside the snapshot's JSON), the row
//! (bound as `jsonb`), a retry job or a handoff — without being decoded or encoded again.
//! Cloning shares the text. Code that needs to look inside decodes it: into the game's own type
//! ([`StateJson::decode`]), or into a JSON tree ([`StateJson::value`], also reached by deref:
//! parsed once and kept).

use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgHasArrayType, PgTypeInfo, PgValueRef, Postgres};

/// A state document's JSON text. Cheap to clone.
pub struct StateJson {
    raw: Arc<RawValue>,
    tree: OnceLock<Value>,
}

impl StateJson {
    /// Encodes `state` (the game's document type, or any serializable value).
    pub fn encode<T: Serialize + ?Sized>(state: &T) -> Result<Self, serde_json::Error> {
        Ok(Self::from_raw(serde_json::value::to_raw_value(state)?))
    }

    /// Takes `text` as a document after checking it is JSON.
    pub fn parse(text: String) -> Result<Self, serde_json::Error> {
        Ok(Self::from_raw(RawValue::from_string(text)?))
    }

    fn from_raw(raw: Box<RawValue>) -> Self {
        Self {
            raw: Arc::from(raw),
            tree: OnceLock::new(),
        }
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        self.raw.get()
    }

    /// Bytes of the JSON text.
    pub fn len(&self) -> usize {
        self.raw.get().len()
    }

    /// True for an empty text (never, for a document built here; kept for the convention).
    pub fn is_empty(&self) -> bool {
        self.raw.get().is_empty()
    }

    /// Decodes the document into the game's type, straight from the text.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.raw.get())
    }

    /// The document as a JSON tree, parsed the first time it is asked for and kept. Fails for
    /// a text the tree cannot hold (nested deeper than `serde_json`'s limit of 128 levels),
    /// which the text itself may carry.
    pub fn tree(&self) -> Result<&Value, serde_json::Error> {
        if let Some(tree) = self.tree.get() {
            return Ok(tree);
        }
        let parsed: Value = serde_json::from_str(self.raw.get())?;
        Ok(self.tree.get_or_init(|| parsed))
    }

    /// The document as a JSON tree, for looking inside: reads as `null` where [`Self::tree`]
    /// fails. Anything that writes a tree back uses [`Self::try_to_value`].
    pub fn value(&self) -> &Value {
        self.tree().unwrap_or(&Value::Null)
    }

    /// The document as an owned JSON tree, or why it cannot be one.
    pub fn try_to_value(&self) -> Result<Value, serde_json::Error> {
        self.tree().cloned()
    }

    /// The document as an owned JSON tree (`null` where [`Self::tree`] fails): for tools and
    /// tests; anything that writes it back uses [`Self::try_to_value`].
    pub fn to_value(&self) -> Value {
        self.value().clone()
    }

    /// Sets one top-level field (the document becomes an object if it was not one), encoding
    /// the document again: for tools and tests, not for a hot path.
    pub fn set_field(&mut self, key: &str, value: Value) {
        let mut tree = self.try_to_value().unwrap_or(Value::Null);
        if !tree.is_object() {
            tree = Value::Object(serde_json::Map::new());
        }
        tree[key] = value;
        *self = Self::from(tree);
    }
}

impl Clone for StateJson {
    fn clone(&self) -> Self {
        // The text is shared; a parsed tree stays with its owner.
        Self {
            raw: Arc::clone(&self.raw),
            tree: OnceLock::new(),
        }
    }
}

impl Default for StateJson {
    /// `null`, as the default JSON value.
    fn default() -> Self {
        #[allow(clippy::expect_used)]
        let null = RawValue::from_string("null".to_owned()).expect("`null` is JSON");
        Self::from_raw(null)
    }
}

impl From<&Value> for StateJson {
    fn from(value: &Value) -> Self {
        // A tree always encodes (its keys are strings); `null` would stand in otherwise.
        Self::encode(value).unwrap_or_default()
    }
}

impl From<Value> for StateJson {
    fn from(value: Value) -> Self {
        let state = Self::from(&value);
        let _ = state.tree.set(value);
        state
    }
}

impl std::fmt::Debug for StateJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.raw.get())
    }
}

impl std::fmt::Display for StateJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.raw.get())
    }
}

impl PartialEq for StateJson {
    /// Documents are equal when they hold the same JSON, however it is spaced or ordered.
    fn eq(&self, other: &Self) -> bool {
        self.raw.get() == other.raw.get() || self.value() == other.value()
    }
}

impl PartialEq<Value> for StateJson {
    fn eq(&self, other: &Value) -> bool {
        self.value() == other
    }
}

impl std::ops::Deref for StateJson {
    type Target = Value;

    /// The parsed tree ([`StateJson::value`]): reading a field (`state["gold"]`) or handing the
    /// document to code that takes a JSON tree parses it once.
    fn deref(&self) -> &Value {
        self.value()
    }
}

impl Serialize for StateJson {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for StateJson {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(Self::from_raw)
    }
}

impl sqlx::Type<Postgres> for StateJson {
    fn type_info() -> PgTypeInfo {
        <RawValue as sqlx::Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <RawValue as sqlx::Type<Postgres>>::compatible(ty)
    }
}

impl PgHasArrayType for StateJson {
    fn array_type_info() -> PgTypeInfo {
        <RawValue as PgHasArrayType>::array_type_info()
    }
}

impl sqlx::Encode<'_, Postgres> for StateJson {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        // The text goes as it is: `jsonb`'s version byte, then the JSON.
        <sqlx::types::Json<&RawValue> as sqlx::Encode<'_, Postgres>>::encode_by_ref(
            &sqlx::types::Json(&*self.raw),
            buf,
        )
    }
}

impl<'r> sqlx::Decode<'r, Postgres> for StateJson {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        let raw = <&RawValue as sqlx::Decode<'r, Postgres>>::decode(value)?;
        Ok(Self::from_raw(raw.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_document_round_trips_through_a_snapshot_as_the_same_json() {
        let state = StateJson::encode(&json!({ "gold": 3, "bag": ["gem"] })).unwrap_or_default();
        let wrapped =
            serde_json::to_string(&json!({ "state": state.to_value() })).unwrap_or_default();
        #[derive(Deserialize)]
        struct Holder {
            state: StateJson,
        }
        let back: Holder = serde_json::from_str(&wrapped).unwrap_or(Holder {
            state: StateJson::default(),
        });
        assert_eq!(back.state, state);
        assert_eq!(back.state["gold"], 3);
        assert_eq!(back.state["missing"], Value::Null);
    }

    #[test]
    fn the_text_is_embedded_as_is_when_the_snapshot_is_encoded() {
        let state = StateJson::parse(r#"{"b":1,"a":[2]}"#.to_owned()).unwrap_or_default();
        let encoded = serde_json::to_string(&json!({})).unwrap_or_default();
        assert_eq!(encoded, "{}");
        #[derive(Serialize)]
        struct Holder<'a> {
            state: &'a StateJson,
        }
        let text = serde_json::to_string(&Holder { state: &state }).unwrap_or_default();
        assert_eq!(
            text, r#"{"state":{"b":1,"a":[2]}}"#,
            "not re-encoded or reordered"
        );
    }

    #[test]
    fn equality_is_of_the_json_not_of_its_spacing() {
        let a = StateJson::parse(r#"{"a": 1, "b": 2}"#.to_owned()).unwrap_or_default();
        let b = StateJson::parse(r#"{"b":2,"a":1}"#.to_owned()).unwrap_or_default();
        assert_eq!(a, b);
        assert_ne!(a, StateJson::from(json!({ "a": 2 })));
    }

    #[test]
    fn text_that_is_not_json_is_refused() {
        assert!(StateJson::parse("{\"a\":".to_owned()).is_err());
        assert!(StateJson::parse(String::new()).is_err());
    }

    #[test]
    fn a_text_too_deep_for_a_tree_says_so_rather_than_reading_as_null_when_asked() {
        let depth = 200;
        let text = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        let state = StateJson::parse(text.clone()).unwrap_or_else(|e| panic!("{e}"));
        assert!(state.tree().is_err());
        assert!(state.try_to_value().is_err());
        assert_eq!(state.value(), &Value::Null, "looking inside only");
        assert_eq!(state.as_str(), text, "the text is carried as it is");
        let shallow = StateJson::parse("{\"a\":[1]}".to_owned()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(shallow.try_to_value().ok(), Some(json!({ "a": [1] })));
    }
}
