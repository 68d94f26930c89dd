//! The runtime's pulse: one task that runs the cadences, hands deferred logout saves to the
//! saver, logs link-dead copies out when their grace runs out, refreshes session records, and
//! acts on the saver's answers — the saver reports to [`Feedback`], which only queues them here,
//! so no answer ever waits on a game's lock.

use std::sync::Arc;

use tokio::sync::mpsc;
use uuid::Uuid;

use super::cadence::passes_multiple;
use super::copies::{Copies, CopyId, Link, LiveCopy, zone_mark};
use super::finals::{FinalSave, Finals};
use super::sessions::refresh_of;
use super::{EvictionCause, Inner, LiveEvent, LiveGame};
use crate::character::CharacterSnapshot;
use crate::journal::SessionLifecycleEffectPlan;
use crate::saver::{SaveFeedback, SaveReason, SaverEvent};

/// The saver's side of the runtime: answers go to the pulse task; presence is the registry's.
pub(crate) struct Feedback<C> {
    events: mpsc::UnboundedSender<SaverEvent>,
    copies: Arc<Copies<C>>,
    finals: Arc<Finals>,
}

impl<C> Feedback<C> {
    pub(crate) fn new(
        events: mpsc::UnboundedSender<SaverEvent>,
        copies: Arc<Copies<C>>,
        finals: Arc<Finals>,
    ) -> Self {
        Self {
            events,
            copies,
            finals,
        }
    }
}

impl<C: Send + 'static> SaveFeedback for Feedback<C> {
    fn deliver(&self, event: SaverEvent) {
        // A logout save that lost a version race, or that the saver gave up, is in nobody's
        // hands between the saver letting go of it and the pulse merging it or making it a
        // job: marked here, at once, so no login claims the character meanwhile (its claim
        // would fence the save out) and a shutdown counts it in hand.
        let given_back = match &event {
            SaverEvent::FlushConflict {
                character_id,
                reason: SaveReason::Final,
                ..
            }
            | SaverEvent::FinalDropped { character_id, .. } => Some(*character_id),
            _ => None,
        };
        if let Some(character_id) = given_back
            && self.finals.held(character_id)
            && !self.copies.holds(character_id)
        {
            self.finals.working(character_id, true);
        }
        if self.events.send(event).is_err() {
            tracing::debug!(event = "live_event_after_stop");
        }
    }

    /// Present while a copy is held, and while the runtime still holds a logout's final save:
    /// the saver then reports a conflicting final save instead of rebasing it blindly, and the
    /// runtime merges what landed under it (an offline grant) before writing it again.
    fn is_present(&self, character_id: Uuid) -> bool {
        self.copies.holds(character_id) || self.finals.held(character_id)
    }
}

/// Runs the pulse until the runtime stops.
pub(crate) async fn run<G: LiveGame>(
    inner: Arc<Inner<G>>,
    mut events: mpsc::UnboundedReceiver<SaverEvent>,
) {
    let mut ticker = tokio::time::interval(inner.config.cadence.pulse);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let own_pulse = inner.config.own_pulse;
    loop {
        tokio::select! {
            () = inner.cancel.cancelled() => return,
            Some(event) = events.recv() => answer(&inner, event),
            _ = ticker.tick(), if own_pulse => pulse(&inner),
        }
    }
}

/// One pulse: deferred finals first (they wait longest), then the cadences, link-dead
/// deadlines and session refreshes. It looks only at the copies its schedule has due.
pub(crate) fn pulse<G: LiveGame>(inner: &Arc<Inner<G>>) {
    let (previous, n) = number_pulse(inner);
    inner.finals.offer(&inner.saver);
    owe_failed_placements(inner, previous, n);
    let periods = inner.periods;
    let refresh = refresh_period(inner);
    let mut saves = Saves::default();
    let now = tokio::time::Instant::now();
    let expired = inner.copies.link_dead_lapsed(now);
    let mut refreshes = Vec::new();
    // While the saver is behind, the saves due are owed instead of dumped (a save its full
    // queue drops is dumped for nothing, and its copy waits a whole period): an owed save goes
    // out as soon as there is room, before the cadence comes round again.
    let room = saver_has_room(inner);
    // A late pulse stands in for the pulses it missed (four at most): their shares of saves
    // and of owed saves.
    let stands_for = usize::try_from(n - previous).unwrap_or(1);
    let share = pulse_share(inner).saturating_mul(stands_for);
    // What one pulse dumps on the cadence is bounded: past twice its share, the saves due are
    // owed and go out over the next pulses.
    let most_dumped = share.saturating_mul(2);
    if room {
        // The saves due, reserved at once: at a large shard a buffer of megabytes grown by
        // doubling takes fresh pages at each step. A copy is dumped once a pulse at most; a
        // flush takes the place of one checkpoint in `flush / checkpoint`; the share's floor is
        // not reserved (a small shard dumps little).
        let copies = inner.copies.len();
        let per_pulse = copies / usize::try_from(periods.0.max(1)).unwrap_or(1);
        let due = per_pulse.saturating_mul(stands_for).min(copies);
        let flushes = due / usize::try_from((periods.1 / periods.0.max(1)).max(1)).unwrap_or(1);
        saves.checkpoints.reserve(due - flushes);
        saves.flushes.reserve(flushes);
    }
    let mut owed = Vec::new();
    let next = |phase: &super::cadence::Phase| phase.next_visit(n, periods, refresh);
    inner.copies.visit_due(n, next, |id, copy, dues| {
        if let Link::LinkDead { until, .. } = &copy.link
            && *until <= now
        {
            // Its final save is queued below.
            return;
        }
        if matches!(copy.link, Link::Attached(_))
            && copy.phase.refresh_due_within(dues.clone(), refresh)
        {
            let full = copy.records_owed
                || copy.presence_zone != zone_mark(&copy.zone)
                || copy
                    .phase
                    .refresh_due_within(dues.clone(), refresh.saturating_mul(FULL_REFRESH_EVERY));
            refreshes.extend(refresh_of(inner, copy.id(id), copy, full));
        }
        if copy.leaving {
            return;
        }
        let Some(reason) = widest(copy.owed, copy.phase.due_within(dues, periods)) else {
            return;
        };
        if room && saves.len() < most_dumped {
            // Not saveable now (an item transfer in flight, a dump refused): owed to its next
            // visit.
            copy.owed = (!saves.add(inner, id, copy, reason)).then_some(reason);
        } else {
            if copy.owed.is_none() {
                owed.push(copy.id(id));
            }
            copy.owed = Some(reason);
        }
    });
    if room {
        inner.copies.visit_owed(share, |id, copy| {
            let Some(reason) = copy.owed else {
                return;
            };
            // A lapsed link-dead copy's final save is queued below; a leaving copy's content
            // travels (its owed save stays, for a handoff that is withdrawn).
            let lapsed = matches!(copy.link, Link::LinkDead { until, .. } if until <= now);
            if lapsed || copy.leaving {
                return;
            }
            if saves.add(inner, id, copy, reason) {
                copy.owed = None;
            } else if inner.transfers.busy(id) {
                // An item transfer in flight: owed again, at the back.
                owed.push(copy.id(id));
            } else {
                // The game refused the dump (logged): the cadence tries again.
                copy.owed = None;
            }
        });
    }
    inner.copies.owe(owed);
    let Saves {
        flushes,
        checkpoints,
    } = saves;
    inner.saver.enqueue_many(SaveReason::Flush, flushes);
    inner
        .saver
        .enqueue_many(SaveReason::Checkpoint, checkpoints);
    for copy in expired {
        super::sessions::expire_link_dead(inner, copy);
    }
    if passes_multiple(previous, n, periods.0) {
        export_crash_window(inner);
    }
    if !refreshes.is_empty() {
        super::sessions::refresh_sessions(inner, refreshes);
    }
}

/// Numbers this pulse (the one before, this one): the next number, or, when this pulse runs
/// late, as many more as the pulses it stands for, four at most ([`Cadence::advance`]), so a
/// shard whose pulses run late still saves each copy once per period of time.
///
/// [`Cadence::advance`]: super::cadence::Cadence::advance
fn number_pulse<G: LiveGame>(inner: &Inner<G>) -> (u64, u64) {
    let mut clock = inner
        .pulse_clock
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let previous = clock.0;
    let (n, after) = inner
        .config
        .cadence
        .advance(*clock, tokio::time::Instant::now());
    *clock = after;
    (previous, n)
}

/// Copies whose placement writes failed or were dropped owe their session records: their next
/// refresh writes them in full (the extension a refresh does otherwise only finds whether a
/// record is there, not whether it is right). A logout's tombstone that failed, its copy gone
/// from here, is written again while the runtime runs — a writer's batch of them once an I/O
/// bound at most, until each lands: the placement it replaces would otherwise name this shard
/// for the record's month.
fn owe_failed_placements<G: LiveGame>(inner: &Inner<G>, previous: u64, pulse: u64) {
    let mut tombstones = Vec::new();
    for record in inner.placement.take_failed() {
        match inner.copies.current(record.character_id) {
            Some(copy) => {
                inner.copies.with(copy, |c| c.records_owed = true);
            }
            None if record.is_tombstone() => tombstones.push(record),
            // A copy that has left: its tombstone is the last word (kept over this update when
            // both failed; queued after it otherwise).
            None => {}
        }
    }
    if tombstones.is_empty() {
        return;
    }
    let every = inner.config.cadence.pulses_in(inner.config.io_timeout);
    let retry_now = passes_multiple(previous, pulse, every);
    let now = if retry_now {
        tombstones.len().min(TOMBSTONES_RETRIED)
    } else {
        0
    };
    let later = tombstones.split_off(now);
    inner.placement.retry(tombstones);
    inner.placement.owe(later);
}

/// Most failed tombstones written again at once: one writer's batch, so an outage's backlog
/// never fills the writer's queue ahead of the live placements.
const TOMBSTONES_RETRIED: usize = 256;

/// The saves one pulse queues.
#[derive(Default)]
struct Saves {
    flushes: Vec<CharacterSnapshot>,
    checkpoints: Vec<CharacterSnapshot>,
}

impl Saves {
    fn len(&self) -> usize {
        self.flushes.len() + self.checkpoints.len()
    }

    /// A dump of `copy` for `reason`, when it can be saved now; false when it cannot.
    fn add<G: LiveGame>(
        &mut self,
        inner: &Inner<G>,
        id: Uuid,
        copy: &mut LiveCopy<G::Character>,
        reason: SaveReason,
    ) -> bool {
        let Some(snapshot) = saveable_dump(inner, id, copy) else {
            return false;
        };
        match reason {
            SaveReason::Checkpoint => self.checkpoints.push(snapshot),
            _ => self.flushes.push(snapshot),
        }
        true
    }
}

/// The save that covers both `a` and `b`: a flush writes both tiers.
fn widest(a: Option<SaveReason>, b: Option<SaveReason>) -> Option<SaveReason> {
    match (a, b) {
        (Some(SaveReason::Checkpoint), Some(SaveReason::Checkpoint)) => {
            Some(SaveReason::Checkpoint)
        }
        (Some(_), Some(_)) => Some(SaveReason::Flush),
        (one, None) | (None, one) => one,
    }
}

/// A dump of `copy` to save now, unless it is leaving (its content travels) or an item transfer
/// of it is in flight: that commit is writing its row with a dump of what it will hold once
/// the commit answers, and a dump now, numbered after that one, would outrank it at a load
/// without the item (the next cadence saves it). A dump the game refuses is logged.
pub(crate) fn saveable_dump<G: LiveGame>(
    inner: &Inner<G>,
    id: Uuid,
    copy: &mut LiveCopy<G::Character>,
) -> Option<CharacterSnapshot> {
    if copy.leaving || inner.transfers.busy(id) {
        return None;
    }
    match inner.game.dump(&copy.character) {
        Ok(state) => Some(copy.dump(id, state)),
        Err(error) => {
            tracing::warn!(event = "dump_refused", character = %id, error, "not saved now");
            None
        }
    }
}

/// Measures and exports the crash window (how long since each copy's last landed checkpoint and
/// row write) once per checkpoint period, off the pulse; it also forgets the landing times of
/// characters no longer held.
fn export_crash_window<G: LiveGame>(inner: &Arc<Inner<G>>) {
    if inner
        .exporting
        .swap(true, std::sync::atomic::Ordering::AcqRel)
    {
        return;
    }
    let residents = inner.copies.character_ids();
    let inner = Arc::clone(inner);
    drop(tokio::task::spawn_blocking(move || {
        inner
            .saver
            .landed()
            .export(&inner.config.shard_id, &residents);
        inner
            .exporting
            .store(false, std::sync::atomic::Ordering::Release);
    }));
}

/// Whether the saver can take a pulse's saves: fewer saves wait in its queue than two pulses'
/// worth (at least 2,048), and at most half its entries are taken — the other half is kept for
/// the saves that are never put off (a detach's flush, a grant's save, one entry each; logout
/// finals, a slice each). Counting saves, not entries, a wave of single saves does not put the
/// cadence off while the writer has room.
fn saver_has_room<G: LiveGame>(inner: &Inner<G>) -> bool {
    let saver = &inner.saver;
    saver.waiting_saves() < 2 * pulse_share(inner) && saver.depth() < (saver.capacity() / 2).max(1)
}

/// A pulse's share of the saves: the copies held over the pulses of a checkpoint period, at
/// least 1,024. A pulse dumps at most twice its share on the cadence (the shares of the pulses
/// a late one stands for), queues up to its share of owed saves on top, and finds the saver
/// with room while fewer than two shares wait in it.
fn pulse_share<G: LiveGame>(inner: &Inner<G>) -> usize {
    let share = inner.copies.len() / usize::try_from(inner.periods.0.max(1)).unwrap_or(1);
    share.max(1024)
}

/// Every this many refreshes a session's records are written in full — its presence (with the
/// order mark it is written under) and its placement (kept a month) — instead of extended
/// where they stand (about 21 minutes at the default TTL), so a record wrong in a way no write
/// reported is repaired within that. They are written in full at the next refresh when the
/// copy's zone changed since, when a write of them failed or was dropped (the session's start,
/// a full write, a placement: `LiveCopy::records_owed`), and when a refresh finds them lost. A
/// full write is two scripted calls of its own, where the extensions of all the sessions due go
/// in one pipeline.
const FULL_REFRESH_EVERY: u64 = 32;

/// Pulses between two refreshes of a session's records: a third of their lifetime.
fn refresh_period<G: LiveGame>(inner: &Inner<G>) -> u64 {
    inner
        .config
        .cadence
        .pulses_in(inner.config.session_ttl.duration() / 3)
}

/// Acts on one of the saver's answers.
fn answer<G: LiveGame>(inner: &Arc<Inner<G>>, event: SaverEvent) {
    let copy = CopyId {
        character_id: event.character_id(),
        owner_epoch: event.owner_epoch(),
    };
    match event {
        SaverEvent::Saved {
            reason,
            dumped_version,
            new_version,
            ..
        } => {
            inner.copies.with(copy, |c| {
                if c.version == dumped_version {
                    c.version = new_version;
                }
            });
            inner.game.saved(copy, reason, new_version);
            if reason == SaveReason::Final {
                inner.finals.resolve(
                    copy,
                    FinalSave::Saved {
                        version: new_version,
                    },
                );
            }
        }
        SaverEvent::FlushConflict {
            current_version,
            reason,
            ..
        } => {
            if inner.copies.with(copy, |_| ()).is_some() {
                // A copy with an item transfer in flight adopts the commit's version when the
                // commit answers; merging now would flush it without the item at that version.
                if !inner.transfers.busy(copy.character_id) {
                    super::writes::merge_and_flush(inner, copy, current_version);
                }
            } else if reason == SaveReason::Final {
                super::writes::merge_final(inner, copy, current_version);
            } else {
                // A flush of a copy that has left since: its final save (or the content it
                // carried away) holds everything the flush did, and answers for its own race.
                tracing::debug!(event = "live_conflict_after_leaving",
                    character = %copy.character_id, epoch = copy.owner_epoch,
                    "a flush of a copy that left lost its race");
            }
        }
        SaverEvent::OwnershipLost { current_epoch, .. } => {
            evict(inner, copy, EvictionCause::OwnershipLost { current_epoch });
            inner.finals.resolve(copy, FinalSave::Superseded);
        }
        SaverEvent::DoubleOwn { stored_epoch, .. } => {
            evict(inner, copy, EvictionCause::DoubleOwn { stored_epoch });
        }
        SaverEvent::SchemaOutdated { stored_schema, .. } => {
            evict(inner, copy, EvictionCause::SchemaOutdated { stored_schema });
            inner.finals.resolve(copy, FinalSave::Superseded);
        }
        SaverEvent::FinalQueuedAsJob { retry_job_id, .. } => {
            inner
                .finals
                .resolve(copy, FinalSave::QueuedAsJob { retry_job_id });
        }
        SaverEvent::FinalDropped { .. } => super::finals::final_as_job(inner, copy),
        SaverEvent::NotFound { .. } => {
            tracing::error!(event = "live_row_missing", character = %copy.character_id,
                "the character's row is gone");
            inner.finals.resolve(copy, FinalSave::NotFound);
        }
    }
}

/// Removes a zombie copy without saving it and tells the game; its session's stream is closed
/// (the cleanup's own writes are fenced by the copy's epoch).
pub(crate) fn evict<G: LiveGame>(inner: &Arc<Inner<G>>, copy: CopyId, cause: EvictionCause) {
    let Some(removed) = inner.copies.remove(copy) else {
        return;
    };
    tracing::warn!(event = "zombie_evicted", character = %copy.character_id,
        epoch = copy.owner_epoch, ?cause, "another copy owns the character");
    let last_known: CharacterSnapshot = removed.snapshot(copy.character_id, Default::default());
    super::sessions::close_stream(
        inner,
        &last_known,
        removed.link.token().to_owned(),
        SessionLifecycleEffectPlan::PermanentRemoval,
    );
    inner.game.evicted(copy, removed.character);
    let _ = inner.events.send(LiveEvent::Evicted { copy, cause });
}
