//! A synthetic player. Every choice it makes comes from its own generator, seeded from the run's
//! seed and its index, so a run's choices are reproducible (which of them meet a fault depends
//! on timing).

use rand::rngs::Xoshiro256PlusPlus as SimRng;
use rand::{RngExt, SeedableRng};
use uuid::Uuid;

/// What an attached player does on a pulse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    Walk,
    Fight,
    Drop,
    Get,
    Put,
    TakeFromContainer,
    Appearance,
    Equip,
    Die,
}

/// How a session ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SessionEnd {
    /// A clean logout.
    Logout,
    /// The connection drops; the player comes back before the link-dead timeout.
    Reconnect,
    /// The connection drops and the player does not come back in time.
    Vanish,
}

/// One synthetic player.
#[derive(Debug, Clone)]
pub(super) struct Agent {
    pub(super) index: usize,
    pub(super) character_id: Uuid,
    pub(super) account_id: Uuid,
    pub(super) name: String,
    /// Its shard index at first login.
    pub(super) home_shard: usize,
    /// A zombie copy's driver: it never logs in, and is dropped (never parked) when its copy
    /// goes.
    pub(super) ghost: bool,
    /// A zombie's driver that heads for the nearest exit to another shard, walking every pulse,
    /// to hand its stale copy off before the fence finds it.
    pub(super) escapes: bool,
    rng: SimRng,
}

/// One action per this many pulses, on average.
const PULSES_PER_ACTION: u32 = 8;

impl Agent {
    /// Player `index` of a run seeded with `seed`.
    pub(super) fn new(index: usize, seed: u64, shards: usize) -> Self {
        let mut rng =
            SimRng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let character_id = uuid::Builder::from_random_bytes(rng.random()).into_uuid();
        let account_id = uuid::Builder::from_random_bytes(rng.random()).into_uuid();
        Self {
            index,
            character_id,
            account_id,
            name: format!("player{index:05}"),
            home_shard: index % shards.max(1),
            ghost: false,
            escapes: false,
            rng,
        }
    }

    /// A copy that plays on as a zombie, with a generator of its own.
    pub(super) fn zombie_copy(&self) -> Self {
        let mut copy = self.clone();
        copy.ghost = true;
        copy.escapes = copy.rng.random_bool(0.5);
        copy.rng = SimRng::seed_from_u64(self.rng.clone().random::<u64>() ^ 0x5A5A);
        copy
    }

    /// A uniform pick in `0..n` (`n` > 0).
    pub(super) fn pick(&mut self, n: usize) -> usize {
        self.rng.random_range(0..n.max(1))
    }

    /// A value in `lo..=hi`.
    pub(super) fn between(&mut self, lo: u64, hi: u64) -> u64 {
        self.rng.random_range(lo..=hi.max(lo))
    }

    /// A fresh token (sessions, handoffs).
    pub(super) fn token(&mut self, kind: &str) -> String {
        format!("{kind}-{}-{:016x}", self.index, self.rng.random::<u64>())
    }

    /// Session length, in pulses.
    pub(super) fn session_pulses(&mut self) -> u64 {
        self.between(100, 300)
    }

    /// Offline time before the next login, in milliseconds.
    pub(super) fn offline_millis(&mut self) -> u64 {
        self.between(500, 4000)
    }

    /// What to do this pulse, if anything.
    pub(super) fn next_action(&mut self) -> Option<Action> {
        if !self.rng.random_ratio(1, PULSES_PER_ACTION) {
            return None;
        }
        let roll = self.rng.random_range(0..100u32);
        Some(match roll {
            0..30 => Action::Walk,
            30..50 => Action::Fight,
            50..58 => Action::Drop,
            58..73 => Action::Get,
            73..78 => Action::Put,
            78..83 => Action::TakeFromContainer,
            83..88 => Action::Appearance,
            88..98 => Action::Equip,
            _ => Action::Die,
        })
    }

    /// How this session ends.
    pub(super) fn session_end(&mut self) -> SessionEnd {
        match self.rng.random_range(0..100u32) {
            0..65 => SessionEnd::Logout,
            65..90 => SessionEnd::Reconnect,
            _ => SessionEnd::Vanish,
        }
    }

    /// A combat reward: experience, currency, and whether it drops loot.
    pub(super) fn reward(&mut self) -> (i64, i64, bool) {
        let xp = self.rng.random_range(5..=50i64);
        let gold = self.rng.random_range(0..=10i64);
        (xp, gold, self.rng.random_bool(0.15))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_makes_the_same_choices() {
        let mut a = Agent::new(7, 42, 3);
        let mut b = Agent::new(7, 42, 3);
        assert_eq!(a.character_id, b.character_id);
        let choices = |agent: &mut Agent| -> Vec<Option<Action>> {
            (0..200).map(|_| agent.next_action()).collect()
        };
        assert_eq!(choices(&mut a), choices(&mut b));
        let mut other = Agent::new(7, 43, 3);
        assert_ne!(other.character_id, a.character_id);
        assert_ne!(choices(&mut other), choices(&mut a));
    }
}
