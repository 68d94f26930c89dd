//! Affects and cooldowns run down lazily: a pulse visits only the players whose next timer
//! runs out on it, not every player. Between visits a player's timers lag the shard's pulse;
//! [`LiveCharacter::timers_at`] says by how much, every dump writes them as of the current pulse
//! (the game reads the pulse the shard sets), and anything that looks at or changes a player
//! brings them up to date first. Catching up by `n` pulses leaves a character exactly as `n`
//! single pulses would ([`LiveCharacter::advance`]).

use std::cmp::Reverse;

use uuid::Uuid;

use super::LiveShard;
use crate::game::LiveCharacter;

/// Brings `c`'s timers up to `now`.
pub(super) fn catch_up(c: &mut LiveCharacter, now: u64) {
    c.advance(now.saturating_sub(c.timers_at));
    c.timers_at = now;
}

impl LiveShard {
    /// Runs the timers due on this pulse: each player whose next affect or cooldown runs out
    /// now is brought up to date (the expired ones dropped, its attributes recomputed) and
    /// scheduled at its next expiry.
    pub(super) fn run_timers(&mut self) {
        while let Some(Reverse((due, character_id))) = self.timers.peek().copied() {
            if due > self.pulse {
                break;
            }
            self.timers.pop();
            let current = self
                .residents
                .get(&character_id)
                .is_some_and(|r| r.timer_due == Some(due));
            if current {
                self.refresh_timers(character_id);
            }
        }
    }

    /// Brings a player's timers up to date and schedules its next expiry (a player just
    /// entered, put back, or changed by the game).
    pub(super) fn refresh_timers(&mut self, character_id: Uuid) {
        let Some(copy) = self.residents.get(&character_id).map(|r| r.copy) else {
            return;
        };
        let now = self.pulse;
        let next = self
            .runtime
            .update(copy, |c| {
                catch_up(c, now);
                c.next_expiry()
            })
            .ok()
            .flatten();
        self.schedule(character_id, next);
    }

    /// Schedules `character_id`'s next timer `left` pulses from now (`None`: none runs).
    pub(super) fn schedule(&mut self, character_id: Uuid, left: Option<u64>) {
        let due = left.map(|left| self.pulse + left.max(1));
        if let Some(resident) = self.residents.get_mut(&character_id) {
            // The entry already queued for this pulse stands (no entry per call).
            if resident.timer_due == due {
                return;
            }
            resident.timer_due = due;
            if let Some(due) = due {
                self.timers.push(Reverse((due, character_id)));
            }
        }
    }
}
