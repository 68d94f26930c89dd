//! The reference game as the live-copy runtime plays it: a [`LiveGame`] whose characters are
//! [`LiveCharacter`]s, landed by the shard's landing table, with creation input applied on a
//! first spawn, and effects applied live exactly as the model applies them to a stored document.
//! [`crate::live_shard::LiveShard`] holds its players in a [`shardkeep::live::Runtime`] of it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use shardkeep::character::{CharacterSnapshot, StateJson};
use shardkeep::coord::SessionOrder;
use shardkeep::journal::SessionLifecycleEffectPlan;
use shardkeep::live::{Arrival, CopyId, Landed, LiveGame};
use shardkeep::model::{Anchor, GameModel, ModelHandle};
use shardkeep::saver::SaveReason;

use super::landing::login_zone;
use crate::game::world::resolve_room;
use crate::game::{
    ApplyOptions, CarryLimits, Catalog, LiveCharacter, ReferenceEffect, ReferenceModel,
    StateDocument, ZoneDef, apply_snapshot, dump_character_after, dump_state_after,
};

/// The reference game on one shard: its catalog, carry limits, and the zones it hosts.
pub struct ReferenceGame {
    catalog: Arc<Catalog>,
    limits: CarryLimits,
    zones: BTreeMap<String, ZoneDef>,
    home_zone: String,
    /// Copies the runtime evicted, with the items they held, until the shard takes them.
    evicted: Mutex<Vec<EvictedCopy>>,
    /// The host's pulse, for timers advanced lazily ([`ReferenceGame::set_pulse`]).
    pulse: AtomicU64,
    observer: Option<Arc<dyn Observer>>,
}

/// What a host of the reference game hears of its copies besides play: the row writes that
/// landed, the closed streams made durable, the handoffs settled (the simulator's checks read
/// them). Each call comes from the runtime's own tasks: it must not block or call the runtime.
pub trait Observer: Send + Sync + std::fmt::Debug + 'static {
    /// A write of `copy`'s row landed at `version` ([`LiveGame::saved`]).
    fn saved(&self, copy: CopyId, reason: SaveReason, version: i64) {
        let _ = (copy, reason, version);
    }

    /// A closed stream was journaled ([`LiveGame::journaled`]).
    fn journaled(
        &self,
        character_id: uuid::Uuid,
        order: SessionOrder,
        plan: SessionLifecycleEffectPlan,
    ) {
        let _ = (character_id, order, plan);
    }

    /// A handoff that left here is settled ([`LiveGame::handed_off`]).
    fn handed_off(&self, copy: CopyId, token: &str, activated: bool) {
        let _ = (copy, token, activated);
    }
}

/// A copy the runtime evicted (another copy owns the character), with the ids of every item it
/// held: they leave the world with it (the live owner's copies of them live on there).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictedCopy {
    /// The copy.
    pub copy: CopyId,
    /// Every item it held, worn or carried, containers' contents included.
    pub items: Vec<uuid::Uuid>,
}

impl ReferenceGame {
    /// The game over `catalog`, hosting `zones`, landing new and homeless players in
    /// `home_zone` (which must be one of them).
    pub fn new(
        catalog: Arc<Catalog>,
        zones: impl IntoIterator<Item = ZoneDef>,
        home_zone: &str,
    ) -> Result<Self, String> {
        let zones: BTreeMap<String, ZoneDef> =
            zones.into_iter().map(|z| (z.id.clone(), z)).collect();
        if zones.get(home_zone).is_none_or(|z| z.instance) {
            return Err(format!(
                "the home zone {home_zone:?} is not a zone hosted here"
            ));
        }
        Ok(Self {
            catalog,
            limits: CarryLimits::default(),
            zones,
            home_zone: home_zone.to_owned(),
            evicted: Mutex::default(),
            pulse: AtomicU64::new(0),
            observer: None,
        })
    }

    /// The same game, telling `observer` what the runtime reports.
    #[must_use]
    pub fn observed_by(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The copies evicted since the last call, oldest first.
    pub fn take_evicted(&self) -> Vec<EvictedCopy> {
        self.evicted
            .lock()
            .map(|mut evicted| std::mem::take(&mut *evicted))
            .unwrap_or_default()
    }

    /// Sets the host's pulse. A host that advances its players' timers only when they run out
    /// or the player is touched (bringing [`LiveCharacter::timers_at`] up to it) sets it every
    /// pulse: every dump then writes affects and cooldowns as of this pulse, and a character
    /// loaded or replayed starts its timers from it. A host that never sets it advances timers
    /// itself (or has none): the dumps write them as they are.
    pub fn set_pulse(&self, pulse: u64) {
        self.pulse.store(pulse, Ordering::Release);
    }

    /// The host's pulse ([`ReferenceGame::set_pulse`]).
    pub fn pulse(&self) -> u64 {
        self.pulse.load(Ordering::Acquire)
    }

    fn hosts(&self, zone: &str) -> bool {
        self.zones.get(zone).is_some_and(|z| !z.instance)
    }

    /// Where a landing copy goes: its zone by the landing table, its room resolved there.
    fn landing(&self, snapshot: &CharacterSnapshot, arrival: Arrival) -> Anchor {
        let brand_new = matches!(arrival, Arrival::Login { brand_new: true });
        let (zone, _) = login_zone(
            snapshot.zone_ref.as_deref(),
            brand_new,
            |z| self.hosts(z),
            &self.home_zone,
        );
        let room = self.zones.get(&zone).map(|def| {
            let kept = (!brand_new && snapshot.zone_ref.as_deref() == Some(zone.as_str()))
                .then_some(snapshot.room_ref.as_deref())
                .flatten();
            resolve_room(def, kept).0.to_owned()
        });
        Anchor {
            zone_ref: Some(zone),
            room_ref: room,
        }
    }

    /// `character` as a snapshot of its own (identity and fences as the character holds them).
    /// The character's snapshot, its timers as of the host's pulse.
    fn snapshot_of(&self, character: &LiveCharacter) -> Result<CharacterSnapshot, String> {
        let lag = self.pulse().saturating_sub(character.timers_at);
        dump_character_after(character, lag, None, None, self.limits).map_err(|e| e.to_string())
    }
}

impl LiveGame for ReferenceGame {
    type Character = LiveCharacter;
    type Effect = ReferenceEffect;

    fn model(&self) -> ModelHandle {
        ReferenceModel::handle()
    }

    /// A document played without a snapshot's identity (the runtime's merges): only its state
    /// matters there.
    fn load(&self, state: &StateJson) -> Result<LiveCharacter, String> {
        let snapshot = CharacterSnapshot {
            state: state.clone(),
            ..blank_snapshot()
        };
        Ok(self.played(&snapshot, false))
    }

    fn land(
        &self,
        snapshot: &CharacterSnapshot,
        arrival: Arrival,
    ) -> Result<Landed<LiveCharacter>, String> {
        let anchor = self.landing(snapshot, arrival);
        // Creation input is spent on a first spawn only (a logout save made a retry job does
        // not clear the stored input).
        let first_spawn = matches!(arrival, Arrival::Login { brand_new: true });
        let landing = CharacterSnapshot {
            chargen: snapshot.chargen.clone().filter(|_| first_spawn),
            ..snapshot.clone()
        };
        let character = self.played(&landing, matches!(arrival, Arrival::Login { .. }));
        let chargen = if first_spawn {
            character.chargen.clone()
        } else {
            snapshot.chargen.clone()
        };
        Ok(Landed {
            character,
            anchor,
            chargen,
        })
    }

    fn dump(&self, character: &LiveCharacter) -> Result<StateJson, String> {
        let lag = self.pulse().saturating_sub(character.timers_at);
        dump_state_after(character, lag, self.limits).map_err(|e| e.to_string())
    }

    /// The effect applied to the character's document by the model, and the document played
    /// again: a live grant and its job can never differ.
    fn apply(
        &self,
        character: &mut LiveCharacter,
        anchor: &mut Anchor,
        effect: &ReferenceEffect,
    ) -> Result<bool, String> {
        let snapshot = self.snapshot_of(character)?;
        let mut doc: StateDocument = snapshot
            .state
            .decode()
            .map_err(|e| format!("the live character's own document: {e}"))?;
        let changed = ReferenceModel.apply_effect(&mut doc, anchor, effect)?;
        if !changed {
            return Ok(false);
        }
        let state = StateJson::encode(&doc).map_err(|e| e.to_string())?;
        let played = self.played(
            &CharacterSnapshot {
                state,
                chargen: None,
                ..snapshot
            },
            false,
        );
        *character = LiveCharacter {
            // What lives only in memory stays as it was.
            chargen: character.chargen.take(),
            dying: character.dying,
            ..played
        };
        Ok(true)
    }

    fn fresh(&self) -> LiveCharacter {
        self.played(&blank_snapshot(), true)
    }

    fn evicted(&self, copy: CopyId, character: LiveCharacter) {
        let items = character.items().iter().filter_map(|i| i.id).collect();
        if let Ok(mut evicted) = self.evicted.lock() {
            evicted.push(EvictedCopy { copy, items });
        }
    }

    fn saved(&self, copy: CopyId, reason: SaveReason, version: i64) {
        if let Some(observer) = &self.observer {
            observer.saved(copy, reason, version);
        }
    }

    fn journaled(
        &self,
        character_id: uuid::Uuid,
        order: SessionOrder,
        plan: SessionLifecycleEffectPlan,
    ) {
        if let Some(observer) = &self.observer {
            observer.journaled(character_id, order, plan);
        }
    }

    fn handed_off(&self, copy: CopyId, token: &str, activated: bool) {
        if let Some(observer) = &self.observer {
            observer.handed_off(copy, token, activated);
        }
    }
}

impl ReferenceGame {
    /// The character a snapshot plays as, its timers running from the host's pulse.
    fn played(&self, snapshot: &CharacterSnapshot, fresh_login: bool) -> LiveCharacter {
        let mut character = apply_snapshot(
            snapshot,
            &self.catalog,
            ApplyOptions {
                fresh_login,
                limits: self.limits,
            },
        )
        .character;
        character.timers_at = self.pulse();
        character
    }
}

/// A snapshot of nobody with an empty document.
fn blank_snapshot() -> CharacterSnapshot {
    CharacterSnapshot {
        character_id: uuid::Uuid::nil(),
        account_id: uuid::Uuid::nil(),
        name: String::new(),
        zone_ref: None,
        room_ref: None,
        state: StateJson::from(serde_json::json!({})),
        chargen: None,
        state_version: 0,
        owner_epoch: 0,
        issue_mark: 0,
        schema_version: 1,
    }
}
