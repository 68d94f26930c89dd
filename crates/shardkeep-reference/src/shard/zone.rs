//! A zone at runtime: its definition, the players it holds and its ephemeral entities. The two
//! player-map mutators here are the only writers of the residency index.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::sync::Arc;

use uuid::Uuid;

use super::residency::ResidencyIndex;
use crate::game::LiveCharacter;
use crate::game::world::{ZoneDef, ZoneEntities};

/// The state of a player's connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// A live session drives the character.
    Attached {
        /// The session token.
        session_token: String,
    },
    /// The connection dropped; the character waits in the zone for a reconnect.
    LinkDead {
        /// The session token that may resume.
        session_token: String,
    },
    /// Arrived by cross-shard handoff; waits for the client to re-dial with the token.
    Pending {
        /// The handoff token the client will present.
        handoff_token: String,
    },
}

/// A player held by a zone.
#[derive(Debug, Clone, PartialEq)]
pub struct PlayerEntry {
    /// The character.
    pub character: LiveCharacter,
    /// The room it stands in.
    pub room: String,
    /// Its connection.
    pub link: Link,
    /// Frozen by staff: skipped by every save.
    pub frozen: bool,
    /// Inside an instance: the zone and room it entered from (the durable location).
    pub anchor: Option<(String, String)>,
    /// The zone pulse its affects and cooldowns were last advanced to (see [`ZoneRuntime`]).
    pub(crate) timers_at: u64,
}

impl PlayerEntry {
    /// True for a player whose durable record belongs elsewhere for now (mid-handoff) or who is
    /// frozen: saves skip it.
    pub fn skip_saves(&self) -> bool {
        self.frozen || matches!(self.link, Link::Pending { .. })
    }
}

/// A player's fixed offset inside a cadence period, from the random bits of its id.
pub fn phase(character_id: Uuid, period: u64) -> u64 {
    (character_id.as_u128() as u64) % period.max(1)
}

/// A zone's runtime state.
///
/// Besides the players it keeps two indexes so a pulse touches only the players it must: a save
/// wheel (players bucketed by their phase in the flush period, so the players due for a
/// checkpoint or flush are read off a few buckets) and a schedule of timer expiries.
///
/// Timers advance lazily: a player's affects and cooldowns are brought up to the zone's pulse
/// only when something runs out (the schedule wakes it on that very pulse, so an expiry's
/// recompute happens when it would have), when it is handed out mutably, or when it leaves; a
/// dump in between writes them as of the current pulse ([`ZoneRuntime::elapsed`]). A pulse costs
/// the players whose timers run out on it, not every player with a timer. A player waiting on a
/// handoff (`Pending`) has its timers frozen, as before.
#[derive(Debug)]
pub struct ZoneRuntime {
    /// The definition.
    pub def: Arc<ZoneDef>,
    /// By id (hashed: a full zone's lookups would walk a deep tree; nothing needs an order).
    players: HashMap<Uuid, PlayerEntry>,
    wheel: Vec<BTreeSet<Uuid>>,
    /// Timer pulses run so far.
    now: u64,
    /// When each player's next timer runs out, earliest first (entries a reschedule replaced
    /// are skipped: `scheduled` holds the live one).
    expiries: BinaryHeap<Reverse<(u64, Uuid)>>,
    scheduled: HashMap<Uuid, u64>,
    /// Players handed out mutably since the last pulse: they may have new timers.
    touched: Vec<Uuid>,
    /// Mobiles and floor items.
    pub entities: ZoneEntities,
}

/// Players due for a save on one pulse.
#[derive(Debug)]
pub struct DueSaves<'a> {
    /// Due for a flush (which also writes the checkpoint).
    pub flush: Vec<&'a PlayerEntry>,
    /// Due for a checkpoint only.
    pub checkpoint: Vec<&'a PlayerEntry>,
}

impl ZoneRuntime {
    /// An empty zone whose save wheel spans `wheel_len` pulses (the flush period; 1 disables the
    /// wheel and every pulse examines every player).
    pub fn new(def: Arc<ZoneDef>, wheel_len: u64) -> Self {
        let len = usize::try_from(wheel_len.max(1)).unwrap_or(1);
        Self {
            def,
            players: HashMap::new(),
            wheel: vec![BTreeSet::new(); len],
            now: 0,
            expiries: BinaryHeap::new(),
            scheduled: HashMap::new(),
            touched: Vec::new(),
            entities: ZoneEntities::default(),
        }
    }

    fn bucket(&self, character_id: Uuid) -> usize {
        usize::try_from(phase(character_id, self.wheel.len() as u64)).unwrap_or(0)
    }

    /// Adds a player (mutator one of two); its timers run from this zone's current pulse.
    pub fn insert(&mut self, mut entry: PlayerEntry, residency: &ResidencyIndex) {
        let id = entry.character.character_id;
        residency.set(id, &self.def.id);
        let bucket = self.bucket(id);
        self.wheel[bucket].insert(id);
        entry.timers_at = self.now;
        self.players.insert(id, entry);
        self.schedule(id);
    }

    /// Removes a player (mutator two of two).
    pub fn remove(
        &mut self,
        character_id: Uuid,
        residency: &ResidencyIndex,
    ) -> Option<PlayerEntry> {
        self.catch_up(character_id);
        let entry = self.players.remove(&character_id)?;
        residency.clear(character_id);
        let bucket = self.bucket(character_id);
        self.wheel[bucket].remove(&character_id);
        self.scheduled.remove(&character_id);
        Some(entry)
    }

    /// The player, if held here. Its timers may lag the zone's pulse by [`Self::elapsed`].
    pub fn player(&self, character_id: Uuid) -> Option<&PlayerEntry> {
        self.players.get(&character_id)
    }

    /// The player, mutably, its timers advanced to the zone's pulse. It is scheduled again at
    /// the next pulse, since the caller may have given it an affect or a cooldown.
    pub fn player_mut(&mut self, character_id: Uuid) -> Option<&mut PlayerEntry> {
        self.catch_up(character_id);
        let entry = self.players.get_mut(&character_id)?;
        self.touched.push(character_id);
        Some(entry)
    }

    /// Pulses `entry`'s timers lag the zone's (none while it waits on a handoff: frozen).
    pub fn elapsed(&self, entry: &PlayerEntry) -> u64 {
        if matches!(entry.link, Link::Pending { .. }) {
            0
        } else {
            self.now.saturating_sub(entry.timers_at)
        }
    }

    /// Advances a player's timers to the zone's pulse.
    fn catch_up(&mut self, character_id: Uuid) {
        let now = self.now;
        if let Some(entry) = self.players.get_mut(&character_id) {
            if !matches!(entry.link, Link::Pending { .. }) {
                entry.character.advance(now.saturating_sub(entry.timers_at));
            }
            entry.timers_at = now;
        }
    }

    /// Schedules a player's next expiry, when it has a timer running.
    fn schedule(&mut self, character_id: Uuid) {
        let Some(entry) = self.players.get(&character_id) else {
            return;
        };
        let Some(left) = entry.character.next_expiry() else {
            self.scheduled.remove(&character_id);
            return;
        };
        let due = entry.timers_at + left.max(1);
        if self.scheduled.get(&character_id) != Some(&due) {
            self.scheduled.insert(character_id, due);
            self.expiries.push(Reverse((due, character_id)));
        }
    }

    /// Every player held.
    pub fn players(&self) -> impl Iterator<Item = &PlayerEntry> {
        self.players.values()
    }

    /// Ids of every player held.
    pub fn player_ids(&self) -> Vec<Uuid> {
        self.players.keys().copied().collect()
    }

    /// Runs one timer pulse: the players whose affects or cooldowns run out on it are brought
    /// up to it (an expired affect recomputes them) and scheduled again.
    pub fn pulse_timed(&mut self) {
        for id in std::mem::take(&mut self.touched) {
            self.schedule(id);
        }
        self.now += 1;
        while let Some(&Reverse((due, id))) = self.expiries.peek() {
            if due > self.now {
                break;
            }
            self.expiries.pop();
            if self.scheduled.get(&id) != Some(&due) {
                continue;
            }
            self.scheduled.remove(&id);
            self.catch_up(id);
            self.schedule(id);
        }
    }

    /// The players due on `pulse`, for the given periods. A player due for both gets the flush.
    pub fn due_saves(&self, pulse: u64, checkpoint_period: u64, flush_period: u64) -> DueSaves<'_> {
        let (c, f) = (checkpoint_period.max(1), flush_period.max(1));
        let len = self.wheel.len() as u64;
        let wheel_fits = len == f && f.is_multiple_of(c);
        let mut due = DueSaves {
            flush: Vec::new(),
            checkpoint: Vec::new(),
        };
        let mut classify = |id: Uuid| {
            let Some(entry) = self.players.get(&id) else {
                return;
            };
            if entry.skip_saves() {
                return;
            }
            if (pulse + phase(id, f)).is_multiple_of(f) {
                due.flush.push(entry);
            } else if (pulse + phase(id, c)).is_multiple_of(c) {
                due.checkpoint.push(entry);
            }
        };
        if wheel_fits {
            // Checkpoint-due buckets are every c-th bucket from (-pulse mod c); the flush-due
            // bucket is among them.
            let first = (c - pulse % c) % c;
            let mut bucket = first;
            while bucket < len {
                for id in &self.wheel[usize::try_from(bucket).unwrap_or(0)] {
                    classify(*id);
                }
                bucket += c;
            }
        } else {
            for id in self.players.keys() {
                classify(*id);
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::game::apply::dump_character_after;
    use crate::game::items::CarryLimits;
    use crate::game::{ApplyOptions, Catalog, apply_snapshot};

    fn character(state: serde_json::Value) -> LiveCharacter {
        let snapshot = shardkeep::character::CharacterSnapshot {
            character_id: Uuid::now_v7(),
            account_id: Uuid::nil(),
            name: "Aria".into(),
            zone_ref: Some("zone-0".into()),
            room_ref: Some("r0".into()),
            state: state.into(),
            chargen: None,
            state_version: 0,
            owner_epoch: 1,
            issue_mark: 0,
            schema_version: 1,
        };
        apply_snapshot(&snapshot, &Catalog::reference(), ApplyOptions::default()).character
    }

    fn entry(character: LiveCharacter) -> PlayerEntry {
        PlayerEntry {
            character,
            room: "r0".into(),
            link: Link::Attached {
                session_token: "t".into(),
            },
            frozen: false,
            anchor: None,
            timers_at: 0,
        }
    }

    fn zone() -> ZoneRuntime {
        let def = crate::game::reference_world(1).remove(0);
        ZoneRuntime::new(Arc::new(def), 240)
    }

    /// The document a zone dumps for `id` now.
    fn dumped(zone: &ZoneRuntime, id: Uuid) -> serde_json::Value {
        let entry = zone.player(id).unwrap_or_else(|| panic!("held"));
        dump_character_after(
            &entry.character,
            zone.elapsed(entry),
            None,
            None,
            CarryLimits::default(),
        )
        .unwrap_or_else(|e| panic!("{e}"))
        .state
        .to_value()
    }

    /// Lazy timers dump, and recompute on expiry, exactly as a pulse-by-pulse countdown does.
    #[test]
    fn lazy_timers_match_a_countdown_pulse_by_pulse() {
        let state = json!({
            "attributes": { "wis": 10 },
            "affects": [
                { "name": "blessed", "remaining_pulses": 5, "attribute_mods": { "wis": 3 } },
                { "name": "hasted", "remaining_pulses": 9 }
            ],
            "cooldowns": { "bash": 3, "kick": 7 }
        });
        let mut eager = character(state.clone());
        let id = eager.character_id;
        let mut lazy = character(state);
        lazy.character_id = id;
        let residency = ResidencyIndex::default();
        let mut zone = zone();
        zone.insert(entry(lazy), &residency);
        for pulse in 1..=12 {
            eager.pulse();
            zone.pulse_timed();
            let expected = dump_character_after(&eager, 0, None, None, CarryLimits::default())
                .unwrap_or_else(|e| panic!("{e}"))
                .state
                .to_value();
            assert_eq!(dumped(&zone, id), expected, "pulse {pulse}");
            let live = &zone.player(id).unwrap_or_else(|| panic!("held")).character;
            assert_eq!(
                live.attributes.get("wis"),
                eager.attributes.get("wis"),
                "the expiry recomputes on its pulse ({pulse})"
            );
        }
        assert!(zone.scheduled.is_empty(), "nothing left to wake for");
    }

    /// A player handed out mutably is brought up to date first, and a timer it is given then
    /// runs from that pulse; a player waiting on a handoff has its timers frozen.
    #[test]
    fn touched_players_catch_up_and_pending_ones_are_frozen() {
        let residency = ResidencyIndex::default();
        let mut zone = zone();
        let start = character(json!({ "cooldowns": { "bash": 10 } }));
        let id = start.character_id;
        zone.insert(entry(start), &residency);
        for _ in 0..4 {
            zone.pulse_timed();
        }
        let held = zone.player_mut(id).unwrap_or_else(|| panic!("held"));
        assert_eq!(held.character.cooldowns.get("bash"), Some(&6));
        held.character.cooldowns.insert("kick".into(), 2);
        held.link = Link::Pending {
            handoff_token: "h".into(),
        };
        for _ in 0..5 {
            zone.pulse_timed();
        }
        assert_eq!(
            dumped(&zone, id)["cooldowns"],
            json!({ "bash": 6, "kick": 2 })
        );
        let held = zone.player_mut(id).unwrap_or_else(|| panic!("held"));
        held.link = Link::Attached {
            session_token: "t".into(),
        };
        zone.pulse_timed();
        zone.pulse_timed();
        assert_eq!(dumped(&zone, id)["cooldowns"], json!({ "bash": 4 }));
        let gone = zone
            .remove(id, &residency)
            .unwrap_or_else(|| panic!("held"));
        assert_eq!(
            gone.character.cooldowns.get("bash"),
            Some(&4),
            "caught up on leaving"
        );
    }
}
