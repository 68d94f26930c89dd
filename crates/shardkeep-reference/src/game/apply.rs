//! The applier: turns a snapshot into a live character, and a live character into a snapshot.
//!
//! Order matters and is fixed: base attributes, then affects, then gear, then the derived values
//! recompute, and resource current values install last so a wounded value clamps to the final
//! (possibly buffed) maximum.

use std::collections::BTreeMap;

use super::items::{CarryLimits, CarryTreeError, Catalog, Item, LoadBudget, load_item};
use super::state::{ChargenInput, LiveCharacter, Pool, StateDocument};
use shardkeep::character::{CharacterSnapshot, StateJson};

/// A live character could not be dumped; nothing is saved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DumpError {
    /// The carry tree is over its bounds.
    #[error(transparent)]
    CarryTree(#[from] CarryTreeError),
    /// The document could not be encoded.
    #[error("state document could not be encoded: {0}")]
    Encode(String),
}

/// A snapshot applied to a live character, with what had to be skipped.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    /// The live character.
    pub character: LiveCharacter,
    /// Non-fatal problems (unknown prototypes, skipped subtrees, unreadable parts).
    pub warnings: Vec<String>,
}

/// How to apply a snapshot.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApplyOptions {
    /// A fresh login: the applied input sequence restarts at 0.
    pub fresh_login: bool,
    /// Carry-tree bounds.
    pub limits: CarryLimits,
}

/// Applies `snapshot` in the documented order. Never fails: anything unreadable is skipped with a
/// warning, and the character loads lighter.
pub fn apply_snapshot(
    snapshot: &CharacterSnapshot,
    catalog: &Catalog,
    options: ApplyOptions,
) -> Applied {
    let mut warnings = Vec::new();
    let doc: StateDocument = match snapshot.state.decode() {
        Ok(doc) => doc,
        Err(err) => {
            warnings.push(format!(
                "state document unreadable, starting from defaults: {err}"
            ));
            StateDocument::default()
        }
    };
    let mut character = LiveCharacter {
        character_id: snapshot.character_id,
        account_id: snapshot.account_id,
        name: snapshot.name.clone(),
        // 1. base attributes
        base: doc.attributes.clone(),
        attributes: BTreeMap::new(),
        pools: BTreeMap::new(),
        // 2. affects, with their remaining pulses
        affects: doc.affects.clone(),
        cooldowns: doc.cooldowns.clone(),
        equipment: BTreeMap::new(),
        inventory: Vec::new(),
        experience: doc.experience,
        level: doc.level,
        currency: doc.currency,
        appearance: doc.appearance.clone(),
        position: doc.position,
        applied_seq: if options.fresh_login {
            0
        } else {
            doc.applied_seq
        },
        tracks: doc.tracks.clone(),
        chargen: snapshot.chargen.clone(),
        state_version: snapshot.state_version,
        owner_epoch: snapshot.owner_epoch,
        issued: snapshot.issue_mark,
        dying: false,
        timers_at: 0,
    };
    // 3. gear
    let mut budget = LoadBudget::new(options.limits);
    for (slot, json) in &doc.equipment {
        if !budget.charge_bytes(json) {
            warnings.push(format!(
                "skipped {:?} in {slot:?}: carry tree over its size bound",
                json.proto
            ));
            continue;
        }
        if let Some(item) = load_item(json, 1, catalog, &mut budget, &mut warnings) {
            character.equipment.insert(*slot, item);
        }
    }
    for json in &doc.inventory {
        if !budget.charge_bytes(json) {
            warnings.push(format!(
                "skipped {:?}: carry tree over its size bound",
                json.proto
            ));
            continue;
        }
        if let Some(item) = load_item(json, 1, catalog, &mut budget, &mut warnings) {
            character.inventory.push(item);
        }
    }
    if let Some(input) = snapshot.chargen.as_ref() {
        apply_chargen(&mut character, input, catalog, &mut warnings);
    }
    // 4. derived values
    character.recompute();
    // 5. resource current values last, clamped to the final maxima
    for (name, cur) in &doc.resources {
        if let Some(pool) = character.pools.get_mut(name) {
            *pool = Pool {
                cur: (*cur).clamp(0, pool.max),
                max: pool.max,
            };
        } else {
            warnings.push(format!("skipped unknown resource {name:?}"));
        }
    }
    for warning in &warnings {
        tracing::warn!(event = "apply_warning", character = %snapshot.name, "{warning}");
    }
    Applied {
        character,
        warnings,
    }
}

/// Applies content-driven chargen on first spawn; the input is then cleared, and the next CAS
/// write persists the built state and the cleared column together.
fn apply_chargen(
    character: &mut LiveCharacter,
    input: &serde_json::Value,
    catalog: &Catalog,
    warnings: &mut Vec<String>,
) {
    let input: ChargenInput = match serde_json::from_value(input.clone()) {
        Ok(input) => input,
        Err(err) => {
            warnings.push(format!("chargen input unreadable, left pending: {err}"));
            return;
        }
    };
    character.base.extend(input.attributes);
    for proto_ref in &input.items {
        match catalog.get(proto_ref) {
            Some(proto) => character.inventory.push(Item::spawn(proto)),
            None => warnings.push(format!("chargen names unknown prototype {proto_ref:?}")),
        }
    }
    if let Some(appearance) = input.appearance {
        character.appearance = appearance;
    }
    character.chargen = None;
}

/// Dumps a live character to a snapshot; `zone_ref` is `None` inside an instance so the durable
/// anchor stands.
pub fn dump_character(
    character: &LiveCharacter,
    zone_ref: Option<&str>,
    room_ref: Option<&str>,
    limits: CarryLimits,
) -> Result<CharacterSnapshot, DumpError> {
    dump_character_after(character, 0, zone_ref, room_ref, limits)
}

/// Dumps a live character as it is `elapsed` pulses after its timers were last advanced: its
/// affects and cooldowns are written that much shorter (those run out left out), as that many
/// pulses would leave them. A zone that advances timers lazily dumps this way.
pub fn dump_character_after(
    character: &LiveCharacter,
    elapsed: u64,
    zone_ref: Option<&str>,
    room_ref: Option<&str>,
    limits: CarryLimits,
) -> Result<CharacterSnapshot, DumpError> {
    let state = dump_state_after(character, elapsed, limits)?;
    Ok(CharacterSnapshot {
        character_id: character.character_id,
        account_id: character.account_id,
        name: character.name.clone(),
        zone_ref: zone_ref.map(str::to_owned),
        room_ref: zone_ref.and(room_ref).map(str::to_owned),
        state,
        chargen: character.chargen.clone(),
        state_version: character.state_version,
        owner_epoch: character.owner_epoch,
        issue_mark: character.issued,
        schema_version:
            <super::effects::ReferenceModel as shardkeep::model::GameModel>::SCHEMA_VERSION,
    })
}

/// The state document alone of [`dump_character_after`] (a host that keeps the rest of the
/// snapshot itself, as the live-copy runtime does, saves building and dropping it).
pub fn dump_state_after(
    character: &LiveCharacter,
    elapsed: u64,
    limits: CarryLimits,
) -> Result<StateJson, DumpError> {
    let by = u32::try_from(elapsed).unwrap_or(u32::MAX);
    super::dump::check_carry(character, limits)?;
    let state = StateJson::encode(&super::dump::Document { character, by })
        .map_err(|e| DumpError::Encode(e.to_string()))?;
    // The carry tree is part of the document: only a document past the limit can hold a tree
    // past it, and only then is the tree measured on its own.
    if state.len() > limits.max_bytes {
        let carry_bytes = encoded_len(&super::dump::CarryTree(character));
        if carry_bytes > limits.max_bytes {
            return Err(CarryTreeError::TooLarge {
                bytes: carry_bytes,
                max: limits.max_bytes,
            }
            .into());
        }
    }
    Ok(state)
}

pub(crate) use shardkeep::model::encoded_len;

#[cfg(test)]
mod tests;
