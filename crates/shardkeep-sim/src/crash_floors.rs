//! What a crashed copy had made durable, and whether the next copy of its character kept it.
//!
//! Content is named by its place: the epoch of the copy that dumped it and that copy's issue
//! mark (`ContentOrigin`); a later dump of the same chain has a later place. When a shard dies,
//! each of its players' copies leaves floors: the place of what the copy loaded at its login
//! (durable by then: a row, or a checkpoint it took over), and the place of its checkpoint when
//! that is still guarded by the copy's epoch (read over the run's stores, best effort, possibly
//! after the next login). The copy a claim makes next — the one minting the dead copy's epoch
//! plus one — must start from content at least that new: older means content a previous copy
//! loaded or checkpointed was lost beyond the crash window (a chain of crashes that fell back to
//! an older row).
//!
//! Not held to a floor, by design: a load made while a store was cut (it reads no checkpoint and
//! falls back to the row); a handoff arrival's carried content, which sets no floor (it is its
//! source's crash window until written); and a load after another player took an item the dead
//! copy had put down (that transfer commit writes the departed copy's row as a live write, so
//! the next login prefers the row over every checkpoint the copy left, one of which may still
//! hold the item). The transfer may come while the copy still plays on another shard (the
//! acquirer's shard sees it departed), so any such transfer between the dead copy's login and
//! the next load excuses it.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::report::Invariant;
use shardkeep::character::ContentOrigin;

/// A content's place in its chain of copies: (dumping copy's epoch, its issue mark).
pub(super) type Place = (i64, u64);

/// The place of `origin`.
pub(super) fn place_of(origin: &ContentOrigin) -> Place {
    (origin.epoch, origin.mark)
}

/// A floor a crashed copy left.
#[derive(Debug)]
struct Floor {
    character_id: Uuid,
    /// The dead copy's epoch.
    epoch: i64,
    place: Place,
    what: String,
    /// Since when a transfer of an item the copy put down excuses the next load: the copy's
    /// login, or its crash when its login was not seen.
    since: DateTime<Utc>,
}

/// A copy as a claim loaded it.
#[derive(Debug, Clone, Copy)]
struct Load {
    place: Place,
    /// No store outage overlapped the claim.
    steady: bool,
    at: DateTime<Utc>,
}

/// The floors recorded at crashes and the loads they are checked against.
#[derive(Debug, Default)]
pub(super) struct CrashFloors {
    floors: Vec<Floor>,
    /// Every load, by character and the epoch its claim minted.
    loads: HashMap<(Uuid, i64), Load>,
    /// Per character: the epoch of its last login load, the place it loaded, and when.
    logins: HashMap<Uuid, (i64, Place, DateTime<Utc>)>,
}

impl CrashFloors {
    /// The copy of `character_id` at `epoch` had content at `place` durable when it died.
    pub(super) fn record(&mut self, character_id: Uuid, epoch: i64, place: Place, what: String) {
        let since = match self.logins.get(&character_id) {
            Some(&(loaded_epoch, _, at)) if loaded_epoch == epoch => at,
            _ => Utc::now(),
        };
        self.floors.push(Floor {
            character_id,
            epoch,
            place,
            what,
            since,
        });
    }

    /// The copy of `character_id` at `epoch` died: what it loaded at its login is a floor.
    pub(super) fn crashed(&mut self, character_id: Uuid, epoch: i64, what: &str) {
        if let Some(&(loaded_epoch, place, _)) = self.logins.get(&character_id)
            && loaded_epoch == epoch
        {
            self.record(character_id, epoch, place, format!("{what} (as it loaded)"));
        }
    }

    /// A login's claim minted `epoch` for `character_id` and loaded content at `place` (`steady`:
    /// no store outage overlapped it).
    pub(super) fn logged_in(&mut self, character_id: Uuid, place: Place, epoch: i64, steady: bool) {
        self.loaded(character_id, place, epoch, steady);
        self.logins.insert(character_id, (epoch, place, Utc::now()));
    }

    /// A claim minted `epoch` for `character_id` and loaded content at `place`.
    pub(super) fn loaded(&mut self, character_id: Uuid, place: Place, epoch: i64, steady: bool) {
        self.loads.insert(
            (character_id, epoch),
            Load {
                place,
                steady,
                at: Utc::now(),
            },
        );
    }

    /// The verdict. `released` lists the item transfers' releasers and when each committed: a
    /// load after a transfer of an item the dead copy had put down (since its login) is excused.
    pub(super) fn invariant(&self, released: &[(Uuid, DateTime<Utc>)]) -> Invariant {
        let mut checked = 0;
        let mut details = Vec::new();
        for floor in &self.floors {
            let Some(next) = self.loads.get(&(floor.character_id, floor.epoch + 1)) else {
                continue;
            };
            let by_design = !next.steady
                || released.iter().any(|(by, at)| {
                    *by == floor.character_id && *at >= floor.since && *at <= next.at
                });
            if by_design {
                continue;
            }
            checked += 1;
            if next.place < floor.place {
                details.push(format!(
                    "{}: the copy at epoch {} started from content {:?} (epoch, mark), older than \
                     the {:?} its {} had made durable",
                    floor.character_id,
                    floor.epoch + 1,
                    next.place,
                    floor.place,
                    floor.what
                ));
            }
        }
        Invariant::new(
            "checkpointed progress kept through crashes",
            checked,
            details,
        )
    }

    /// About how many bytes it holds.
    pub(super) fn approx_bytes(&self) -> u64 {
        let floors: usize = self
            .floors
            .iter()
            .map(|f| std::mem::size_of::<Floor>() + f.what.len())
            .sum();
        let loads = self.loads.capacity() * std::mem::size_of::<((Uuid, i64), Load)>();
        let logins =
            self.logins.capacity() * std::mem::size_of::<(Uuid, (i64, Place, DateTime<Utc>))>();
        (floors + loads + logins) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_copy_after_a_crash_must_start_from_what_the_dead_copy_checkpointed() {
        let mut floors = CrashFloors::default();
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        floors.record(a, 1, (1, 7), "copy 1 on shard-0".into());
        floors.record(b, 3, (3, 2), "copy 3 on shard-1".into());
        std::thread::sleep(std::time::Duration::from_millis(2));
        let between = Utc::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        floors.loaded(a, (1, 7), 2, true);
        floors.loaded(b, (3, 1), 4, true);
        // Later copies are not held to an older copy's floor.
        floors.loaded(a, (0, 0), 3, true);
        let verdict = floors.invariant(&[]);
        assert_eq!(verdict.checked, 2);
        assert!(!verdict.holds);
        assert_eq!(verdict.details.len(), 1);
        assert!(verdict.details[0].contains("older than the (3, 2)"));
        // Another player took an item `b` had put down after it died: excused.
        let taken = [(b, between)];
        assert!(floors.invariant(&taken).holds);
        assert_eq!(floors.invariant(&taken).checked, 1);
    }

    #[test]
    fn what_a_crashed_copy_loaded_is_a_floor_for_the_next_copy_whenever_it_is_read() {
        let mut floors = CrashFloors::default();
        let c = Uuid::from_u128(3);
        // Copy 2 loaded copy 1's checkpoint (mark 9) and died before writing.
        floors.logged_in(c, (1, 9), 2, true);
        floors.crashed(c, 2, "copy at epoch 2");
        floors.logged_in(c, (1, 4), 3, true);
        assert!(
            !floors.invariant(&[]).holds,
            "the row's older content came back"
        );
        // A floor read back after the next login still pairs with it; a load during an outage
        // is not held to one.
        let mut floors = CrashFloors::default();
        floors.logged_in(c, (4, 2), 5, false);
        floors.record(c, 4, (4, 3), "copy at epoch 4".into());
        floors.logged_in(c, (4, 2), 6, true);
        let verdict = floors.invariant(&[]);
        assert!(verdict.holds);
        assert_eq!(verdict.checked, 0);
    }
}
