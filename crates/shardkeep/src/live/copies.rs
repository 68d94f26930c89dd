//! The live copies a runtime holds: one per character, each with the bookkeeping that makes its
//! writes safe — the epoch its claim minted, the row version it last learned, its issue
//! sequence — beside the game's character. Kept in stripes, so the cadence's dumps of one stripe
//! never hold up play in another.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use uuid::Uuid;

use super::cadence::Phase;
use super::schedule::{Schedule, UNPLACED};
use crate::character::{CharacterSnapshot, StateJson};
use crate::model::Anchor;

/// Stripes of the registry.
const STRIPES: usize = 64;

/// Names one live copy: the character, and the epoch its claim minted. Every call about a copy
/// takes it, so a call meant for a copy that was evicted or left never reaches a later copy of
/// the same character.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CopyId {
    /// The character.
    pub character_id: Uuid,
    /// The copy's owner epoch.
    pub owner_epoch: i64,
}

impl std::fmt::Display for CopyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (epoch {})", self.character_id, self.owner_epoch)
    }
}

/// Where a copy's session stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Link {
    /// A client is attached with this session token.
    Attached(String),
    /// The stream closed; the copy waits for a reconnect until `until`.
    LinkDead {
        token: String,
        until: tokio::time::Instant,
    },
}

impl Link {
    /// The session token, attached or not.
    pub(crate) fn token(&self) -> &str {
        match self {
            Self::Attached(token) | Self::LinkDead { token, .. } => token,
        }
    }
}

/// A fingerprint of `zone`, kept where a copy only needs to know whether a zone changed (a
/// copy holds it in place of a second copy of the name).
pub(crate) fn zone_mark(zone: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    zone.hash(&mut hasher);
    hasher.finish()
}

/// One live copy.
pub(crate) struct LiveCopy<C> {
    pub(crate) character: C,
    pub(crate) account_id: Uuid,
    pub(crate) name: String,
    pub(crate) epoch: i64,
    /// The row version the copy's content is based on: every write that landed up to it is in
    /// the copy (its own, or merged from the row).
    pub(crate) version: i64,
    /// The copy's issue sequence: live grants up to it are in `character`. Every dump takes a
    /// number of it too, so two dumps of one copy are ordered by their marks (a checkpoint
    /// dumped after a flush holds a higher mark than the flush, whichever lands first).
    pub(crate) issued: u64,
    pub(crate) anchor: Anchor,
    /// The zone its placement and presence name: where it landed, then the last zone its
    /// anchor named (an anchor without a zone, an instance, keeps it).
    pub(crate) zone: String,
    /// The [`zone_mark`] of the zone its session's presence was last written with (a refresh
    /// that finds it other than `zone`'s writes the presence in full).
    pub(crate) presence_zone: u64,
    /// A write of its session records (presence, placement) failed or was dropped: its next
    /// refresh writes them in full.
    pub(crate) records_owed: bool,
    pub(crate) chargen: Option<serde_json::Value>,
    pub(crate) schema_version: u32,
    pub(crate) phase: Phase,
    pub(crate) link: Link,
    /// Set while the copy is being handed off: it saves nothing (its content travels).
    pub(crate) leaving: bool,
    /// The attached session's place in the character's session order (its presence is
    /// refreshed under it).
    pub(crate) session_order: Option<crate::coord::SessionOrder>,
    /// The pulse the schedule looks at the copy next ([`UNPLACED`] until its first visit).
    pub(crate) next_visit: u64,
    /// A save the cadence owes it (due while the saver was behind), queued when there is room.
    pub(crate) owed: Option<crate::saver::SaveReason>,
}

impl<C> LiveCopy<C> {
    pub(crate) fn id(&self, character_id: Uuid) -> CopyId {
        CopyId {
            character_id,
            owner_epoch: self.epoch,
        }
    }

    /// Moves the copy to `anchor`; true when that names a zone other than the one its placement
    /// names (an anchor without a zone, an instance, keeps the zone).
    pub(crate) fn move_to(&mut self, anchor: Anchor) -> bool {
        let moved = anchor
            .zone_ref
            .as_ref()
            .is_some_and(|zone| *zone != self.zone);
        if moved && let Some(zone) = &anchor.zone_ref {
            self.zone.clone_from(zone);
        }
        self.anchor = anchor;
        moved
    }

    /// A dump of this copy with `state` as its document: it takes the next number of the copy's
    /// issue sequence as its mark.
    pub(crate) fn dump(&mut self, character_id: Uuid, state: StateJson) -> CharacterSnapshot {
        self.issued += 1;
        self.snapshot(character_id, state)
    }

    /// The snapshot of this copy with `state` as its document, at the copy's current mark (what
    /// it last knew; a dump to be written takes a number with [`LiveCopy::dump`]).
    pub(crate) fn snapshot(&self, character_id: Uuid, state: StateJson) -> CharacterSnapshot {
        CharacterSnapshot {
            character_id,
            account_id: self.account_id,
            name: self.name.clone(),
            zone_ref: self.anchor.zone_ref.clone(),
            room_ref: self.anchor.room_ref.clone(),
            state,
            chargen: self.chargen.clone(),
            state_version: self.version,
            owner_epoch: self.epoch,
            issue_mark: self.issued,
            schema_version: self.schema_version,
        }
    }
}

/// The registry, with the pulse's schedule of its copies. Cheap to share behind an `Arc`.
pub(crate) struct Copies<C> {
    /// Boxed: a stripe's table keeps spare slots (up to twice its entries), and a slot of a
    /// box is a pointer where a slot of the copy is the whole game character.
    stripes: Vec<Mutex<HashMap<Uuid, Box<LiveCopy<C>>>>>,
    schedule: Mutex<Schedule>,
}

impl<C> Default for Copies<C> {
    fn default() -> Self {
        Self {
            stripes: (0..STRIPES).map(|_| Mutex::default()).collect(),
            schedule: Mutex::default(),
        }
    }
}

/// The entries one pulse took from the schedule; on drop (the pass ended, or a panic unwound
/// it) the visited ones are placed at their next pulse and the rest put back where they were.
struct Taken<'a> {
    schedule: &'a Mutex<Schedule>,
    visits: Vec<(u64, CopyId)>,
    /// Entries of `visits` looked at so far.
    done: usize,
    placed: Vec<(u64, CopyId)>,
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        let mut schedule = self.schedule.lock().unwrap_or_else(PoisonError::into_inner);
        for (at, id) in self.placed.drain(..) {
            schedule.place(at, id);
        }
        for &(at, id) in self.visits.get(self.done..).unwrap_or_default() {
            schedule.put_back(at, id);
        }
    }
}

/// One stripe of the registry, locked.
type Stripe<'a, C> = MutexGuard<'a, HashMap<Uuid, Box<LiveCopy<C>>>>;

/// The stripe holding `character_id`.
fn stripe_of(character_id: Uuid) -> usize {
    let (_, lo) = character_id.as_u64_pair();
    usize::try_from(lo % STRIPES as u64).unwrap_or(0)
}

impl<C> Copies<C> {
    fn stripe(&self, character_id: Uuid) -> Stripe<'_, C> {
        self.stripe_at(stripe_of(character_id))
    }

    fn stripe_at(&self, index: usize) -> Stripe<'_, C> {
        self.stripes[index % STRIPES]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn schedule(&self) -> MutexGuard<'_, Schedule> {
        self.schedule.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the copy `id` (the character's copy at that very epoch), if held.
    pub(crate) fn with<T>(&self, id: CopyId, f: impl FnOnce(&mut LiveCopy<C>) -> T) -> Option<T> {
        let mut stripe = self.stripe(id.character_id);
        let copy = stripe
            .get_mut(&id.character_id)
            .filter(|c| c.epoch == id.owner_epoch)?;
        Some(f(copy))
    }

    /// Runs `f` on the copy `id` when it is held and not leaving for another shard (a change
    /// made to a leaving copy would not travel with it).
    pub(crate) fn with_active<T>(
        &self,
        id: CopyId,
        f: impl FnOnce(&mut LiveCopy<C>) -> T,
    ) -> Option<T> {
        self.with(id, |c| if c.leaving { None } else { Some(f(c)) })
            .flatten()
    }

    /// Removes the copy `id` when it is held and `remove` says so.
    pub(crate) fn remove_if(
        &self,
        id: CopyId,
        remove: impl FnOnce(&LiveCopy<C>) -> bool,
    ) -> Option<LiveCopy<C>> {
        let mut stripe = self.stripe(id.character_id);
        let held = stripe
            .get(&id.character_id)
            .is_some_and(|c| c.epoch == id.owner_epoch && remove(c));
        if held {
            stripe.remove(&id.character_id).map(|copy| *copy)
        } else {
            None
        }
    }

    /// The copy of `character_id` held now, whatever its epoch.
    pub(crate) fn current(&self, character_id: Uuid) -> Option<CopyId> {
        self.stripe(character_id)
            .get(&character_id)
            .map(|c| c.id(character_id))
    }

    /// True while any copy of `character_id` is held.
    pub(crate) fn holds(&self, character_id: Uuid) -> bool {
        self.stripe(character_id).contains_key(&character_id)
    }

    /// Adds a copy; when a copy of the same character is already held, the new one is handed
    /// back instead.
    /// The copy is visited at the next pulse, and then whenever it is due for something.
    pub(crate) fn admit(&self, character_id: Uuid, mut copy: LiveCopy<C>) -> Option<LiveCopy<C>> {
        let id = copy.id(character_id);
        {
            let mut stripe = self.stripe(character_id);
            if stripe.contains_key(&character_id) {
                return Some(copy);
            }
            copy.next_visit = UNPLACED;
            stripe.insert(character_id, Box::new(copy));
        }
        self.schedule().admitted(id);
        None
    }

    /// Runs `f` on each copy the schedule has due on `pulse` (a stripe at a time, each locked
    /// only while its copies run), with the pulses whose dues the visit does: from the one the
    /// copy was placed at (earlier than `pulse` when a late pulse stands in for it, or a pulse
    /// running beside this one left it behind) to `pulse`. Each copy is placed again first,
    /// at the pulse `next` names for its phase (after `pulse`); whatever happens to the pass (a
    /// game's dump that panics included), every entry taken goes back to the schedule.
    pub(crate) fn visit_due(
        &self,
        pulse: u64,
        next: impl Fn(&Phase) -> u64,
        mut f: impl FnMut(Uuid, &mut LiveCopy<C>, std::ops::RangeInclusive<u64>),
    ) {
        let mut visits = self.schedule().take(pulse);
        visits.sort_unstable_by_key(|(_, id)| stripe_of(id.character_id));
        let placed = Vec::with_capacity(visits.len());
        let mut taken = Taken {
            schedule: &self.schedule,
            visits,
            done: 0,
            placed,
        };
        let mut held: Option<(usize, Stripe<'_, C>)> = None;
        while let Some(&(at, id)) = taken.visits.get(taken.done) {
            taken.done += 1;
            let index = stripe_of(id.character_id);
            if held.as_ref().map(|(i, _)| *i) != Some(index) {
                // The stripe before is let go first: one stripe lock at a time.
                drop(held.take());
                held = Some((index, self.stripe_at(index)));
            }
            let Some((_, stripe)) = held.as_mut() else {
                continue;
            };
            // Stale: the copy left, another copy of the character replaced it, or it was
            // placed again since this entry was made.
            let Some(copy) = stripe
                .get_mut(&id.character_id)
                .filter(|c| c.epoch == id.owner_epoch && c.next_visit == at)
            else {
                continue;
            };
            copy.next_visit = next(&copy.phase).max(pulse.saturating_add(1));
            taken.placed.push((copy.next_visit, id));
            // The pulses this visit stands for: from the one it was placed at (the copy's
            // first due since its last visit) to this one.
            let from = if at == UNPLACED { pulse } else { at.min(pulse) };
            f(id.character_id, copy, from..=pulse);
        }
    }

    /// Queues the saves `ids` are owed (each copy's `owed` says which).
    pub(crate) fn owe(&self, ids: Vec<CopyId>) {
        if !ids.is_empty() {
            self.schedule().owe(ids);
        }
    }

    /// Runs `f` on at most `most` of the copies owed a save, the longest owed first, a stripe
    /// at a time; a copy that left, or whose save went out since, is passed over.
    pub(crate) fn visit_owed(&self, most: usize, mut f: impl FnMut(Uuid, &mut LiveCopy<C>)) {
        let mut ids = self.schedule().take_owed(most);
        ids.sort_unstable_by_key(|id| stripe_of(id.character_id));
        for run in ids.chunk_by(|a, b| stripe_of(a.character_id) == stripe_of(b.character_id)) {
            let Some(first) = run.first() else {
                continue;
            };
            let mut stripe = self.stripe_at(stripe_of(first.character_id));
            for id in run {
                if let Some(copy) = stripe
                    .get_mut(&id.character_id)
                    .filter(|c| c.epoch == id.owner_epoch && c.owed.is_some())
                {
                    f(id.character_id, copy);
                }
            }
        }
    }

    /// Watches the link-dead copy `id` until its grace runs out or it is attached again.
    pub(crate) fn watch_link_dead(&self, id: CopyId) {
        self.schedule().watch_link_dead(id);
    }

    /// The link-dead copies whose grace ran out by `now`; copies no longer link-dead (attached
    /// again, or gone) stop being watched — decided under the copy's stripe lock, so a detach
    /// (which sets the link under that lock, then watches) is never unwatched after it.
    pub(crate) fn link_dead_lapsed(&self, now: tokio::time::Instant) -> Vec<CopyId> {
        let watched = self.schedule().link_dead();
        let mut lapsed = Vec::new();
        for id in watched {
            let stripe = self.stripe(id.character_id);
            let link = stripe
                .get(&id.character_id)
                .filter(|c| c.epoch == id.owner_epoch)
                .map(|c| match c.link {
                    Link::LinkDead { until, .. } => Some(until <= now),
                    Link::Attached(_) => None,
                });
            match link {
                Some(Some(true)) => lapsed.push(id),
                Some(Some(false)) => {}
                Some(None) | None => self.schedule().unwatch(id),
            }
            drop(stripe);
        }
        lapsed
    }

    /// Removes the copy `id`, if it is the one held.
    pub(crate) fn remove(&self, id: CopyId) -> Option<LiveCopy<C>> {
        let mut stripe = self.stripe(id.character_id);
        if stripe
            .get(&id.character_id)
            .is_some_and(|c| c.epoch == id.owner_epoch)
        {
            stripe.remove(&id.character_id).map(|copy| *copy)
        } else {
            None
        }
    }

    /// Runs `f` over every copy, a stripe at a time (each stripe locked only while it runs).
    pub(crate) fn each(&self, mut f: impl FnMut(Uuid, &mut LiveCopy<C>)) {
        for stripe in &self.stripes {
            let mut stripe = stripe.lock().unwrap_or_else(PoisonError::into_inner);
            for (id, copy) in stripe.iter_mut() {
                f(*id, copy);
            }
        }
    }

    /// The characters of every copy held now: the stripes' keys only, so a pulse that asks
    /// touches no copy (each is a box of its own).
    pub(crate) fn character_ids(&self) -> Vec<Uuid> {
        let mut ids = Vec::new();
        for stripe in &self.stripes {
            ids.extend(stripe.lock().unwrap_or_else(PoisonError::into_inner).keys());
        }
        ids
    }

    /// Every copy held now.
    pub(crate) fn ids(&self) -> Vec<CopyId> {
        let mut ids = Vec::new();
        self.each(|id, copy| ids.push(copy.id(id)));
        ids
    }

    /// Copies held.
    pub(crate) fn len(&self) -> usize {
        self.stripes
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERIODS: (u64, u64) = (4, 8);

    fn copy(character_id: Uuid) -> LiveCopy<()> {
        LiveCopy {
            character: (),
            account_id: Uuid::nil(),
            name: "c".into(),
            epoch: 1,
            version: 1,
            issued: 0,
            anchor: Anchor::default(),
            zone: "zone-0".into(),
            presence_zone: zone_mark("zone-0"),
            records_owed: false,
            chargen: None,
            schema_version: 1,
            phase: Phase::of(character_id, PERIODS),
            link: Link::Attached("t".into()),
            leaving: false,
            session_order: None,
            next_visit: 0,
            owed: None,
        }
    }

    /// Every copy due on `pulse` visited, each with the first pulse of the span it does.
    fn visit(copies: &Copies<()>, pulse: u64) -> Vec<(Uuid, u64)> {
        let mut seen = Vec::new();
        copies.visit_due(
            pulse,
            |phase| phase.next_visit(pulse, PERIODS, u64::MAX),
            |id, _, dues| seen.push((id, *dues.start())),
        );
        seen.sort();
        seen
    }

    fn held(n: usize) -> (Copies<()>, Vec<Uuid>) {
        let copies = Copies::default();
        let mut ids: Vec<Uuid> = (0..n).map(|_| Uuid::now_v7()).collect();
        ids.sort();
        for id in &ids {
            assert!(copies.admit(*id, copy(*id)).is_none());
        }
        (copies, ids)
    }

    #[test]
    fn a_pulse_visits_each_copy_on_the_pulses_it_is_due_and_no_other() {
        let (copies, ids) = held(50);
        // First look at the next pulse, then only when a save is due.
        assert_eq!(visit(&copies, 1).len(), 50);
        for pulse in 2..40 {
            let due: Vec<(Uuid, u64)> = ids
                .iter()
                .filter(|id| Phase::of(**id, PERIODS).due(pulse, PERIODS).is_some())
                .map(|id| (*id, pulse))
                .collect();
            assert_eq!(visit(&copies, pulse), due, "pulse {pulse}");
        }
    }

    #[test]
    fn character_ids_name_every_copy_held_and_only_those() {
        let (copies, ids) = held(70);
        let gone = copies.ids()[0];
        assert!(copies.remove(gone).is_some());
        let mut found = copies.character_ids();
        found.sort();
        let kept: Vec<Uuid> = ids
            .into_iter()
            .filter(|id| *id != gone.character_id)
            .collect();
        assert_eq!(found, kept);
    }

    #[test]
    fn a_zone_mark_tells_zones_apart_and_is_stable() {
        assert_eq!(zone_mark("zone-1"), zone_mark("zone-1"));
        assert_ne!(zone_mark("zone-1"), zone_mark("zone-2"));
        assert_ne!(zone_mark(""), zone_mark("zone-0"));
    }

    #[test]
    fn a_late_visit_does_the_dues_of_every_pulse_it_stands_for() {
        let (copies, ids) = held(1);
        visit(&copies, 1);
        let at = Phase::of(ids[0], PERIODS).next_visit(1, PERIODS, u64::MAX);
        // A late pulse (or one running beside this one) took the pulses in between.
        let mut spans = Vec::new();
        copies.visit_due(
            at + 2,
            |phase| phase.next_visit(at + 2, PERIODS, u64::MAX),
            |id, _, dues| spans.push((id, dues)),
        );
        assert_eq!(spans, vec![(ids[0], at..=at + 2)]);
    }

    #[test]
    fn a_pass_that_panics_leaves_every_copy_in_the_schedule() {
        let (copies, ids) = held(20);
        let mut visited = 0;
        let pass = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            copies.visit_due(
                1,
                |phase| phase.next_visit(1, PERIODS, u64::MAX),
                |_, _, _| {
                    visited += 1;
                    assert!(visited < 7, "a game's dump panics");
                },
            );
        }));
        assert!(pass.is_err());
        // The ones not visited are put back and seen at the next pulse, the others when next
        // due: within a checkpoint period every copy is seen, none twice in one pulse.
        let mut seen: Vec<Uuid> = Vec::new();
        for pulse in 2..2 + PERIODS.0 + 1 {
            let visited: Vec<Uuid> = visit(&copies, pulse)
                .into_iter()
                .map(|(id, _)| id)
                .collect();
            let mut once = visited.clone();
            once.dedup();
            assert_eq!(once, visited, "pulse {pulse}");
            seen.extend(visited);
        }
        seen.sort();
        seen.dedup();
        assert_eq!(seen, ids);
    }

    #[test]
    fn a_copy_attached_again_is_unwatched_and_a_lapsed_one_reported() {
        let (copies, ids) = held(2);
        let now = tokio::time::Instant::now();
        for id in &ids {
            let copy = copies.current(*id).unwrap_or_else(|| panic!("held"));
            copies.with(copy, |c| {
                c.link = Link::LinkDead {
                    token: "t".into(),
                    until: now,
                }
            });
            copies.watch_link_dead(copy);
        }
        let first = copies.current(ids[0]).unwrap_or_else(|| panic!("held"));
        copies.with(first, |c| c.link = Link::Attached("t2".into()));
        let second = copies.current(ids[1]).unwrap_or_else(|| panic!("held"));
        assert_eq!(copies.link_dead_lapsed(now), vec![second]);
        assert_eq!(copies.schedule().link_dead(), vec![second]);
    }
}
