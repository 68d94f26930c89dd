//! The pulse's schedule (pure): on which pulse to look at which copy, so a pulse visits only the
//! copies due for something on it — a save, a session refresh, a first look after admission —
//! instead of every copy held (at 500,000 copies a scan of them all took a core's share of
//! every pulse), and which link-dead copies to watch for their grace running out.
//!
//! An entry names a copy and the pulse it was placed at; the copy keeps that pulse too, so an
//! entry left behind by a copy that was removed, replaced or already visited is recognised as
//! stale and skipped.

use std::collections::{BTreeMap, HashSet, VecDeque};

use super::copies::CopyId;

/// The pulse a copy is placed at between its admission and its first visit.
pub(crate) const UNPLACED: u64 = u64::MAX;

/// Which copies a pulse looks at.
#[derive(Debug, Default)]
pub(crate) struct Schedule {
    /// Admitted since the last pulse: visited at the next one.
    admitted: Vec<CopyId>,
    by_pulse: BTreeMap<u64, Vec<CopyId>>,
    owed: VecDeque<CopyId>,
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

    /// Takes the visits due on `pulse`, each with the pulse it was placed at ([`UNPLACED`] for
    /// a copy admitted since): everything placed at or before `pulse`.
    pub(crate) fn take(&mut self, pulse: u64) -> Vec<(u64, CopyId)> {
        let later = match pulse.checked_add(1) {
            Some(next) => self.by_pulse.split_off(&next),
            None => BTreeMap::new(),
        };
        let due = std::mem::replace(&mut self.by_pulse, later);
        let mut visits =
            Vec::with_capacity(self.admitted.len() + due.values().map(Vec::len).sum::<usize>());
        visits.extend(self.admitted.drain(..).map(|id| (UNPLACED, id)));
        for (at, ids) in due {
            visits.extend(ids.into_iter().map(|id| (at, id)));
        }
        visits
    }

    /// Copies owed a save (the saver was behind when it was due), in the order owed.
    pub(crate) fn owe(&mut self, ids: Vec<CopyId>) {
        self.owed.extend(ids);
    }

    /// Takes at most `most` of the copies owed a save, the longest owed first.
    pub(crate) fn take_owed(&mut self, most: usize) -> Vec<CopyId> {
        let n = self.owed.len().min(most);
        self.owed.drain(..n).collect()
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
        assert_eq!(schedule.take(2), vec![(UNPLACED, copy(1, 1))]);
        assert_eq!(schedule.take(2), vec![]);
        // A pulse that runs after a gap takes what it skipped too.
        assert_eq!(
            schedule.take(4),
            vec![(3, copy(2, 1)), (4, copy(4, 1))],
            "in pulse order"
        );
        assert_eq!(schedule.len(), 1);
        assert_eq!(schedule.take(u64::MAX - 1), vec![(5, copy(3, 1))]);
        assert_eq!(schedule.take(u64::MAX), vec![]);
    }

    #[test]
    fn owed_saves_are_taken_longest_owed_first_and_at_most_as_many_as_asked() {
        let mut schedule = Schedule::default();
        schedule.owe(vec![copy(1, 1), copy(2, 1)]);
        schedule.owe(vec![copy(3, 1)]);
        assert_eq!(schedule.take_owed(0), vec![]);
        assert_eq!(schedule.take_owed(2), vec![copy(1, 1), copy(2, 1)]);
        assert_eq!(schedule.take_owed(usize::MAX), vec![copy(3, 1)]);
        assert_eq!(schedule.take_owed(usize::MAX), vec![]);
    }

    #[test]
    fn entries_put_back_are_taken_again_as_they_were() {
        let mut schedule = Schedule::default();
        schedule.admitted(copy(1, 1));
        schedule.place(3, copy(2, 1));
        let taken = schedule.take(3);
        for (at, id) in taken.iter().rev() {
            schedule.put_back(*at, *id);
        }
        assert_eq!(schedule.take(3), taken);
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
