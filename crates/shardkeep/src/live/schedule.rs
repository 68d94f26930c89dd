//! The pulse's schedule (pure): on which pulse to look at which copy, so a pulse visits only the
//! copies due for something on it — a save, a session refresh, a first look after admission —
//! instead of every copy held (at 500,000 copies a scan of them all took a core's share of
//! every pulse), and which link-dead copies to watch for their grace running out.
//!
//! An entry names a copy and the pulse it was placed at; the copy keeps that pulse too, so an
//! entry left behind by a copy that was removed, replaced or already visited is recognised as
//! stale and skipped.

use std::collections::{BTreeMap, HashSet};

use super::copies::CopyId;

/// The pulse a copy is placed at between its admission and its first visit.
pub(crate) const UNPLACED: u64 = u64::MAX;

/// Which copies a pulse looks at.
#[derive(Debug, Default)]
pub(crate) struct Schedule {
    /// Admitted since the last pulse: visited at the next one.
    admitted: Vec<CopyId>,
    by_pulse: BTreeMap<u64, Vec<CopyId>>,
    link_dead: HashSet<CopyId>,
}

impl Schedule {
    /// `id` was admitted: it is visited at the next pulse.
    pub(crate) fn admitted(&mut self, id: CopyId) {
        self.admitted.push(id);
    }

    /// Places `id` at `pulse`.
    pub(crate) fn place(&mut self, pulse: u64, id: CopyId) {
        self.by_pulse.entry(pulse).or_default().push(id);
    }

    /// Puts back an entry [`Schedule::take`] handed out and nobody visited.
    pub(crate) fn put_back(&mut self, at: u64, id: CopyId) {
        if at == UNPLACED {
            self.admitted.push(id);
        } else {
            self.place(at, id);
        }
    }

    /// Takes at most `most` of the visits due on `pulse`, each with the pulse it was placed at
    /// ([`UNPLACED`] for a copy admitted since): the copies admitted first, then what was
    /// placed at or before `pulse`, oldest first. What is left stays due for the next pulse.
    pub(crate) fn take(&mut self, pulse: u64, most: usize) -> Vec<(u64, CopyId)> {
        let admitted = self.admitted.len().min(most);
        let mut visits: Vec<(u64, CopyId)> = self
            .admitted
            .drain(..admitted)
            .map(|id| (UNPLACED, id))
            .collect();
        while visits.len() < most {
            let Some(mut bucket) = self.by_pulse.first_entry() else {
                break;
            };
            let at = *bucket.key();
            if at > pulse {
                break;
            }
            let room = most - visits.len();
            let ids = if bucket.get().len() <= room {
                bucket.remove()
            } else {
                let rest = bucket.get_mut().split_off(room);
                std::mem::replace(bucket.get_mut(), rest)
            };
            visits.extend(ids.into_iter().map(|id| (at, id)));
        }
        visits
    }

    /// Watches `id`, whose stream closed, until its grace runs out or it is attached again.
    pub(crate) fn watch_link_dead(&mut self, id: CopyId) {
        self.link_dead.insert(id);
    }

    /// The link-dead copies watched.
    pub(crate) fn link_dead(&self) -> Vec<CopyId> {
        self.link_dead.iter().copied().collect()
    }

    /// Stops watching `id` (it is attached again, or gone).
    pub(crate) fn unwatch(&mut self, id: CopyId) {
        self.link_dead.remove(&id);
    }

    /// Entries held (stale ones included), for tests.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.admitted.len() + self.by_pulse.values().map(Vec::len).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: usize = usize::MAX;

    fn copy(n: u128, epoch: i64) -> CopyId {
        CopyId {
            character_id: uuid::Uuid::from_u128(n),
            owner_epoch: epoch,
        }
    }

    #[test]
    fn a_pulse_takes_the_admitted_and_everything_placed_up_to_it_once() {
        let mut schedule = Schedule::default();
        schedule.admitted(copy(1, 1));
        schedule.place(3, copy(2, 1));
        schedule.place(5, copy(3, 1));
        schedule.place(4, copy(4, 1));
        assert_eq!(schedule.take(2, ALL), vec![(UNPLACED, copy(1, 1))]);
        assert_eq!(schedule.take(2, ALL), vec![]);
        // A pulse that runs after a gap takes what it skipped too.
        assert_eq!(
            schedule.take(4, ALL),
            vec![(3, copy(2, 1)), (4, copy(4, 1))],
            "in pulse order"
        );
        assert_eq!(schedule.len(), 1);
        assert_eq!(schedule.take(u64::MAX - 1, ALL), vec![(5, copy(3, 1))]);
        assert_eq!(schedule.take(u64::MAX, ALL), vec![]);
    }

    #[test]
    fn a_pulse_takes_at_most_what_it_is_given_room_for_oldest_first() {
        let mut schedule = Schedule::default();
        schedule.admitted(copy(1, 1));
        for n in 2..6 {
            schedule.place(3, copy(n, 1));
        }
        schedule.place(4, copy(9, 1));
        // Nothing while the saver is behind: everything stays due.
        assert_eq!(schedule.take(4, 0), vec![]);
        assert_eq!(
            schedule.take(4, 3),
            vec![(UNPLACED, copy(1, 1)), (3, copy(2, 1)), (3, copy(3, 1))]
        );
        assert_eq!(
            schedule.take(5, ALL),
            vec![(3, copy(4, 1)), (3, copy(5, 1)), (4, copy(9, 1))]
        );
    }

    #[test]
    fn entries_put_back_are_taken_again_as_they_were() {
        let mut schedule = Schedule::default();
        schedule.admitted(copy(1, 1));
        schedule.place(3, copy(2, 1));
        let taken = schedule.take(3, ALL);
        for (at, id) in taken.iter().rev() {
            schedule.put_back(*at, *id);
        }
        assert_eq!(schedule.take(3, ALL), taken);
    }

    #[test]
    fn link_dead_copies_are_watched_once_until_unwatched() {
        let mut schedule = Schedule::default();
        schedule.watch_link_dead(copy(1, 1));
        schedule.watch_link_dead(copy(1, 1));
        schedule.watch_link_dead(copy(2, 1));
        let mut watched = schedule.link_dead();
        watched.sort_by_key(|c| c.character_id);
        assert_eq!(watched, vec![copy(1, 1), copy(2, 1)]);
        schedule.unwatch(copy(1, 1));
        assert_eq!(schedule.link_dead(), vec![copy(2, 1)]);
    }
}
