//! What a crashed copy had made durable, and whether the next load of its character kept it.
//!
//! Content is named by its origin: the epoch of the copy that dumped it and that copy's issue
//! mark (`ContentOrigin`); a later dump of the same chain carries a later origin. When a shard
//! dies, each of its players' copies leaves a floor: the origin of what the copy loaded at its
//! login (durable by then: a row, or a checkpoint it took over), and the origin of its checkpoint
//! when that is still guarded by the copy's epoch (the checker reads it over the run's stores,
//! best effort). The next load of the character must start from content at least that new:
//! older means content a previous copy loaded or checkpointed was lost beyond the crash window
//! (a chain of crashes that fell back to an older row). A load made while Redis was cut reads no
//! checkpoint, falls back to the row by design, and is not held to a floor; a handoff arrival
//! sets none (what a handoff carried is its source's crash window until written).

use std::collections::HashMap;

use uuid::Uuid;

use super::report::Invariant;
use shardkeep::character::ContentOrigin;

/// A content's place in its chain of copies: (dumping copy's epoch, its issue mark).
pub(super) type Place = (i64, u64);

/// The place of `origin`.
pub(super) fn place_of(origin: &ContentOrigin) -> Place {
    (origin.epoch, origin.mark)
}

/// The floors recorded at crashes and the loads checked against them.
#[derive(Debug, Default)]
pub(super) struct CrashFloors {
    /// Per character: the place a dead copy had made durable, and which crash.
    floors: HashMap<Uuid, (Place, String)>,
    /// Loads checked against a floor.
    checked: u64,
    /// Loads that started below their floor.
    violations: Vec<String>,
    /// Per character: the epoch of its last login load and the place it loaded.
    logins: HashMap<Uuid, (i64, Place)>,
}

impl CrashFloors {
    /// A crash left `character_id` with content at `place` durable.
    pub(super) fn record(&mut self, character_id: Uuid, place: Place, what: String) {
        let floor = self
            .floors
            .entry(character_id)
            .or_insert((place, what.clone()));
        if place >= floor.0 {
            *floor = (place, what);
        }
    }

    /// The copy of `character_id` at `epoch` died: what it loaded at its login is a floor.
    pub(super) fn crashed(&mut self, character_id: Uuid, epoch: i64, what: &str) {
        if let Some(&(loaded_epoch, place)) = self.logins.get(&character_id)
            && loaded_epoch == epoch
        {
            self.record(character_id, place, format!("{what} (as it loaded)"));
        }
    }

    /// A login loaded `character_id` at `epoch` from content at `place`: checked against its
    /// floor (`checked`: false for a load made while Redis was cut), and remembered as what
    /// this copy loaded.
    pub(super) fn logged_in(
        &mut self,
        character_id: Uuid,
        place: Place,
        epoch: i64,
        checked: bool,
    ) {
        self.loaded(character_id, place, epoch, checked);
        self.logins.insert(character_id, (epoch, place));
    }

    /// A copy of `character_id` was loaded from content at `place`; a floor recorded before is
    /// checked unless `checked` is false, and spent either way.
    pub(super) fn loaded(&mut self, character_id: Uuid, place: Place, epoch: i64, checked: bool) {
        let Some((floor, what)) = self.floors.remove(&character_id) else {
            return;
        };
        if !checked {
            return;
        }
        self.checked += 1;
        if place < floor {
            self.violations.push(format!(
                "{character_id}: loaded at epoch {epoch} from content {place:?} (epoch, mark), \
                 older than the {floor:?} its {what} had made durable"
            ));
        }
    }

    /// The verdict.
    pub(super) fn invariant(&self) -> Invariant {
        Invariant::new(
            "checkpointed progress kept through crashes",
            self.checked,
            self.violations.clone(),
        )
    }

    /// About how many bytes it holds.
    pub(super) fn approx_bytes(&self) -> u64 {
        let floors: usize = self
            .floors
            .values()
            .map(|(_, what)| std::mem::size_of::<(Uuid, Place, String)>() + what.len())
            .sum();
        let text: usize = self.violations.iter().map(String::len).sum();
        let logins = self.logins.capacity() * std::mem::size_of::<(Uuid, (i64, Place))>();
        (floors + text + logins) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_load_older_than_what_its_dead_copy_checkpointed_is_a_violation() {
        let mut floors = CrashFloors::default();
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        floors.record(a, (1, 7), "copy 1 on shard-0".into());
        floors.record(b, (3, 2), "copy 3 on shard-1".into());
        floors.loaded(a, (1, 7), 2, true);
        floors.loaded(b, (3, 1), 4, true);
        // Spent: a later load of `a` is not held to the old floor.
        floors.loaded(a, (0, 0), 3, true);
        let verdict = floors.invariant();
        assert_eq!(verdict.checked, 2);
        assert!(!verdict.holds);
        assert_eq!(verdict.details.len(), 1);
        assert!(verdict.details[0].contains("older than the (3, 2)"));
    }

    #[test]
    fn what_a_crashed_copy_loaded_is_a_floor_for_the_next_load() {
        let mut floors = CrashFloors::default();
        let c = Uuid::from_u128(3);
        // Copy 2 loaded copy 1's checkpoint (mark 9) and died before writing.
        floors.logged_in(c, (1, 9), 2, true);
        floors.crashed(c, 2, "copy at epoch 2");
        floors.logged_in(c, (1, 4), 3, true);
        assert!(
            !floors.invariant().holds,
            "the row's older content came back"
        );
        // A copy that is not the one that loaded sets no floor; a load while Redis was cut is
        // not held to one.
        let mut floors = CrashFloors::default();
        floors.logged_in(c, (1, 9), 2, true);
        floors.crashed(c, 4, "copy at epoch 4");
        floors.logged_in(c, (1, 4), 5, true);
        floors.record(c, (5, 3), "copy at epoch 5".into());
        floors.logged_in(c, (1, 4), 6, false);
        assert!(floors.invariant().holds);
        assert_eq!(floors.invariant().checked, 0);
    }
}
