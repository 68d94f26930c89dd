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
    stripes: Vec<Mutex<HashMap<Uuid, LiveCopy<C>>>>,
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

/// The stripe holding `character_id`.
fn stripe_of(character_id: Uuid) -> usize {
    let (_, lo) = character_id.as_u64_pair();
    usize::try_from(lo % STRIPES as u64).unwrap_or(0)
}

impl<C> Copies<C> {
    fn stripe(&self, character_id: Uuid) -> MutexGuard<'_, HashMap<Uuid, LiveCopy<C>>> {
        self.stripe_at(stripe_of(character_id))
    }

    fn stripe_at(&self, index: usize) -> MutexGuard<'_, HashMap<Uuid, LiveCopy<C>>> {
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
            stripe.remove(&id.character_id)
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
            stripe.insert(character_id, copy);
        }
        self.schedule().admitted(id);
        None
    }

    /// Runs `f` on each copy the schedule has due on `pulse` (a stripe at a time, each locked
    /// only while its copies run), then places each again at the pulse `next` names for its
    /// phase (after `pulse`).
    pub(crate) fn visit_due(
        &self,
        pulse: u64,
        next: impl Fn(&Phase) -> u64,
        mut f: impl FnMut(Uuid, &mut LiveCopy<C>),
    ) {
        let mut visits = self.schedule().take(pulse);
        visits.sort_unstable_by_key(|(_, id)| stripe_of(id.character_id));
        let mut placed = Vec::with_capacity(visits.len());
        for run in
            visits.chunk_by(|a, b| stripe_of(a.1.character_id) == stripe_of(b.1.character_id))
        {
            let Some((_, first)) = run.first() else {
                continue;
            };
            let mut stripe = self.stripe_at(stripe_of(first.character_id));
            for (at, id) in run {
                // Stale: the copy left, another copy of the character replaced it, or it was
                // placed again since this entry was made.
                let Some(copy) = stripe
                    .get_mut(&id.character_id)
                    .filter(|c| c.epoch == id.owner_epoch && c.next_visit == *at)
                else {
                    continue;
                };
                f(id.character_id, copy);
                copy.next_visit = next(&copy.phase).max(pulse.saturating_add(1));
                placed.push((copy.next_visit, *id));
            }
        }
        let mut schedule = self.schedule();
        for (at, id) in placed {
            schedule.place(at, id);
        }
    }

    /// Watches the link-dead copy `id` until its grace runs out or it is attached again.
    pub(crate) fn watch_link_dead(&self, id: CopyId) {
        self.schedule().watch_link_dead(id);
    }

    /// The link-dead copies whose grace ran out by `now`; copies no longer link-dead (attached
    /// again, or gone) stop being watched.
    pub(crate) fn link_dead_lapsed(&self, now: tokio::time::Instant) -> Vec<CopyId> {
        let watched = self.schedule().link_dead();
        let mut lapsed = Vec::new();
        for id in watched {
            match self.with(id, |c| match c.link {
                Link::LinkDead { until, .. } => Some(until <= now),
                Link::Attached(_) => None,
            }) {
                Some(Some(true)) => lapsed.push(id),
                Some(Some(false)) => {}
                Some(None) | None => self.schedule().unwatch(id),
            }
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
            stripe.remove(&id.character_id)
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
