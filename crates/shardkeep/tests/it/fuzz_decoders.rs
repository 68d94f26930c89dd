//! Fuzzed decoders of what crosses a process boundary: handoff payloads and the snapshots they
//! carry, state documents, retry payloads and envelopes, placement records and journal entries.
//! Each gets arbitrary bytes and structure-aware mutations of a valid encoding (bytes flipped,
//! cut or inserted; a field replaced by any JSON value, removed, or an unknown one added). No
//! decoder may panic; each answers a typed error or a value that encodes and decodes again to
//! itself.

use proptest::prelude::*;
use serde_json::{Value, json};
use shardkeep::character::{CharacterSnapshot, HandoffPayload, StateJson};
use shardkeep::journal::RealtimeStreamCleanup;
use shardkeep::placement::PlacementRecord;
use shardkeep::queue::DurableWorkQueueEntry;
use shardkeep::retry::{IdempotencyEnvelope, PersistenceRetryPayload};

/// Cases per property (the closing note of the fuzzing issue counts them).
const CASES: u32 = 2048;

fn snapshot_json() -> Value {
    json!({
        "character_id": "0190e0d2-8a2b-7c3d-9e4f-0a1b2c3d4e5f",
        "account_id": "0190e0d2-8a2b-7c3d-9e4f-0a1b2c3d4e60",
        "name": "Aria",
        "zone_ref": "zone-1",
        "room_ref": "r-3",
        "state": { "inventory": [{ "proto": "gem", "id": "0190e0d2-8a2b-7c3d-9e4f-0a1b2c3d4e61" }], "hp": 10 },
        "chargen": null,
        "state_version": 7,
        "owner_epoch": 3,
        "issue_mark": 12,
        "schema_version": 2
    })
}

fn handoff_json() -> Value {
    json!({ "dumped_under_epoch": 3, "snapshot": snapshot_json() })
}

fn placement_json() -> Value {
    json!({
        "character_id": "0190e0d2-8a2b-7c3d-9e4f-0a1b2c3d4e5f",
        "shard_id": "shard-a",
        "zone_id": "zone-1",
        "owner_epoch": 3,
        "updated_at": "2026-12-01T10:00:00Z"
    })
}

fn envelope_json() -> Value {
    json!({
        "idempotency_key": "reward:kill:42",
        "owner_epoch": 3,
        "origin": "gameplay_state",
        "issued_at": "2026-12-01T10:00:00Z",
        "issue_seq": 9
    })
}

fn retry_payload_json() -> Value {
    json!({
        "kind": "combat_reward",
        "character_id": "0190e0d2-8a2b-7c3d-9e4f-0a1b2c3d4e5f",
        "experience": 40
    })
}

/// A valid encoding of each decoder's type, checked to decode (so the mutations start from
/// something real).
fn journal_entry_json() -> Value {
    json!({
        "entry_id": "0190e0d2-8a2b-7c3d-9e4f-0a1b2c3d4e62",
        "attempts": 0,
        "crash_count": 0,
        "enqueued_at": "2026-12-01T10:00:00Z",
        "item": {
            "session_token": "session-1",
            "player": {
                "character_id": "0190e0d2-8a2b-7c3d-9e4f-0a1b2c3d4e5f",
                "account_id": "0190e0d2-8a2b-7c3d-9e4f-0a1b2c3d4e60",
                "character_name": "Aria",
                "shard_id": "shard-a",
                "zone": "zone-1",
                "room": "r-3",
                "owner_epoch": 3,
                "state_version": 7
            },
            "runtime_profile": { "transport": "quic", "protocol_version": 3, "tick_rate_hz": 20 },
            "pending_resume": null,
            "transfer_confirmed": false,
            "plan": "permanent_removal",
            "closed_at": "2026-12-01T10:00:00Z"
        }
    })
}

/// Any JSON value, nested a few levels.
pub(super) fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        Just(json!(u64::MAX)),
        ".{0,40}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,12}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// One structure-aware change of a JSON document.
#[derive(Debug, Clone)]
pub(super) enum Mutation {
    /// Replace the value at the path chosen by these indices.
    Replace(Vec<usize>, Value),
    /// Remove the field at the path.
    Remove(Vec<usize>),
    /// Add an unknown field next to the path.
    Add(Vec<usize>, String, Value),
}

pub(super) fn mutation() -> impl Strategy<Value = Mutation> {
    let path = prop::collection::vec(any::<usize>(), 0..4);
    prop_oneof![
        (path.clone(), any_json()).prop_map(|(p, v)| Mutation::Replace(p, v)),
        path.clone().prop_map(Mutation::Remove),
        (path, "[a-z_]{1,12}", any_json()).prop_map(|(p, k, v)| Mutation::Add(p, k, v)),
    ]
}

/// Applies `m` to `doc`, walking its path by index into objects and arrays (an index past the
/// end wraps; a path that reaches a scalar early acts there).
pub(super) fn apply(doc: &mut Value, m: &Mutation) {
    let path = match m {
        Mutation::Replace(p, _) | Mutation::Remove(p) | Mutation::Add(p, _, _) => p,
    };
    apply_at(doc, path, m);
}

fn apply_at(doc: &mut Value, path: &[usize], m: &Mutation) {
    let Some((step, rest)) = path.split_first() else {
        if let Mutation::Replace(_, v) = m {
            *doc = v.clone();
        }
        return;
    };
    match doc {
        Value::Object(map) if !map.is_empty() => {
            let key = map
                .keys()
                .nth(step % map.len())
                .cloned()
                .unwrap_or_default();
            if !rest.is_empty() {
                if let Some(next) = map.get_mut(&key) {
                    apply_at(next, rest, m);
                }
                return;
            }
            match m {
                Mutation::Replace(_, v) => {
                    map.insert(key, v.clone());
                }
                Mutation::Remove(_) => {
                    map.remove(&key);
                }
                Mutation::Add(_, k, v) => {
                    map.insert(k.clone(), v.clone());
                }
            }
        }
        Value::Array(items) if !items.is_empty() => {
            let i = step % items.len();
            if !rest.is_empty() {
                apply_at(&mut items[i], rest, m);
                return;
            }
            match m {
                Mutation::Replace(_, v) | Mutation::Add(_, _, v) => items[i] = v.clone(),
                Mutation::Remove(_) => {
                    items.remove(i);
                }
            }
        }
        other => {
            if let Mutation::Replace(_, v) = m {
                *other = v.clone();
            }
        }
    }
}

/// Byte-level changes: flips, cuts and insertions at positions taken modulo the length.
pub(super) fn mangle(mut bytes: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    for (at, kind, byte) in edits {
        if bytes.is_empty() {
            bytes.push(*byte);
            continue;
        }
        let i = at % bytes.len();
        match kind % 3 {
            0 => bytes[i] ^= byte | 1,
            1 => bytes.truncate(i),
            _ => bytes.insert(i, *byte),
        }
    }
    bytes
}

pub(super) fn edits() -> impl Strategy<Value = Vec<(usize, u8, u8)>> {
    prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..6)
}

/// The whitespace JSON allows between tokens (RFC 8259: space, tab, line feed, carriage return).
const JSON_WHITESPACE: &[char] = &[' ', '\t', '\n', '\r'];

/// Every decoder, fed one input: none panics, and what decodes encodes back to itself.
fn decode_all(bytes: &[u8]) {
    if let Ok(payload) = HandoffPayload::decode(bytes) {
        let again = HandoffPayload::decode(&payload.encode().unwrap()).unwrap();
        assert_eq!(again, payload);
        assert_eq!(payload.dumped_under_epoch, payload.snapshot.owner_epoch);
    }
    if let Ok(snapshot) = serde_json::from_slice::<CharacterSnapshot>(bytes) {
        let text = serde_json::to_vec(&snapshot).unwrap();
        assert_eq!(
            serde_json::from_slice::<CharacterSnapshot>(&text).unwrap(),
            snapshot
        );
    }
    if let Ok(text) = std::str::from_utf8(bytes)
        && let Ok(doc) = StateJson::parse(text.to_owned())
    {
        // A document is kept as its text without the whitespace JSON allows around it (the
        // fuzzer's " 0" is the document "0"), and that text parses back to itself.
        assert_eq!(doc.as_str(), text.trim_matches(JSON_WHITESPACE));
        let again = StateJson::parse(doc.as_str().to_owned()).unwrap();
        assert_eq!(again.as_str(), doc.as_str());
        let _ = doc.tree();
    }
    if let Ok(record) = serde_json::from_slice::<PlacementRecord>(bytes) {
        let text = serde_json::to_vec(&record).unwrap();
        assert_eq!(
            serde_json::from_slice::<PlacementRecord>(&text).unwrap(),
            record
        );
    }
    if let Ok(envelope) = serde_json::from_slice::<IdempotencyEnvelope>(bytes) {
        let text = serde_json::to_vec(&envelope).unwrap();
        let again: IdempotencyEnvelope = serde_json::from_slice(&text).unwrap();
        assert_eq!(again, envelope);
    }
    if let Ok(entry) = serde_json::from_slice::<DurableWorkQueueEntry<RealtimeStreamCleanup>>(bytes)
    {
        let text = serde_json::to_vec(&entry).unwrap();
        assert_eq!(
            serde_json::from_slice::<DurableWorkQueueEntry<RealtimeStreamCleanup>>(&text).unwrap(),
            entry
        );
    }
    if let Ok(value) = serde_json::from_slice::<Value>(bytes)
        && let Ok(payload) = PersistenceRetryPayload::decode(value, None)
    {
        let _ = format!("{payload:?}");
    }
}

fn seeds() -> Vec<Value> {
    vec![
        snapshot_json(),
        handoff_json(),
        placement_json(),
        envelope_json(),
        retry_payload_json(),
        journal_entry_json(),
    ]
}

#[test]
fn the_seeds_are_valid_encodings() {
    let bytes = |v: Value| serde_json::to_vec(&v).unwrap();
    HandoffPayload::decode(&bytes(handoff_json())).unwrap();
    HandoffPayload::decode(&bytes(snapshot_json())).unwrap();
    serde_json::from_slice::<PlacementRecord>(&bytes(placement_json())).unwrap();
    serde_json::from_slice::<IdempotencyEnvelope>(&bytes(envelope_json())).unwrap();
    PersistenceRetryPayload::decode(retry_payload_json(), None).unwrap();
    serde_json::from_slice::<DurableWorkQueueEntry<RealtimeStreamCleanup>>(&bytes(
        journal_entry_json(),
    ))
    .unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_decode_to_a_typed_error_or_a_stable_value(
        bytes in prop::collection::vec(any::<u8>(), 0..512)
    ) {
        decode_all(&bytes);
    }

    #[test]
    fn mutated_fields_decode_to_a_typed_error_or_a_stable_value(
        seed in 0usize..6, changes in prop::collection::vec(mutation(), 1..4)
    ) {
        let mut doc = seeds()[seed].clone();
        for change in &changes {
            apply(&mut doc, change);
        }
        decode_all(&serde_json::to_vec(&doc).unwrap());
    }

    #[test]
    fn mangled_bytes_decode_to_a_typed_error_or_a_stable_value(
        seed in 0usize..6, edits in edits()
    ) {
        let bytes = serde_json::to_vec(&seeds()[seed]).unwrap();
        decode_all(&mangle(bytes, &edits));
    }
}

/// Documents nested past serde_json's depth limit, and oversized payloads: refused, never a
/// stack overflow or an unbounded allocation.
#[test]
fn deep_and_oversized_inputs_are_refused() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    decode_all(deep.as_bytes());
    if let Ok(doc) = StateJson::parse(deep) {
        assert!(
            doc.tree().is_err(),
            "a tree that deep is an error, not a crash"
        );
    }
    // One byte over the 1 MiB a handoff payload may have.
    let huge = vec![b' '; 1024 * 1024 + 1];
    assert!(HandoffPayload::decode(&huge).is_err());
}

/// Found by the arbitrary bytes: a state document's text is kept without the whitespace around
/// it (" 0" is the document "0"), so the check that a document keeps its text compares it
/// trimmed.
#[test]
fn a_document_padded_with_whitespace_is_kept_without_it() {
    for (text, kept) in [
        (" 0", "0"),
        ("\t{\"a\": 1}\r\n", "{\"a\": 1}"),
        ("[ 1 ]", "[ 1 ]"),
    ] {
        let doc = StateJson::parse(text.to_owned()).unwrap();
        assert_eq!(doc.as_str(), kept, "{text:?}");
        decode_all(text.as_bytes());
    }
}

/// Found by the field mutations: without serde_json's exact float parsing, a number in a
/// snapshot's `chargen` came back one unit off in its last place (3.688320463984402e121 read as
/// 3.6883204639844024e121), so a handoff payload was not the payload that was stored.
#[test]
fn a_float_in_a_payload_survives_encoding_and_decoding() {
    let mut doc = handoff_json();
    doc["snapshot"]["chargen"] = json!([3.688320463984402e121_f64, -3.466316279330646e31_f64]);
    let payload = HandoffPayload::decode(&serde_json::to_vec(&doc).unwrap()).unwrap();
    let again = HandoffPayload::decode(&payload.encode().unwrap()).unwrap();
    assert_eq!(again, payload);
    assert_eq!(
        again.snapshot.chargen,
        Some(json!([
            3.688320463984402e121_f64,
            -3.466316279330646e31_f64
        ]))
    );
}
