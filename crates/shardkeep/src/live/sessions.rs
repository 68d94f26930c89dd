//! Sessions of live copies, in the order the seeds give them: a login claims and loads, admits
//! the copy, marks the session active and takes its place in the character's session order
//! with its presence, and writes the placement; a closed stream is journaled before its session
//! is removed (retried until the entry lands); a reconnect attaches to the copy still held and
//! hands back the resume ledger; a logout queues the final save, which is never dropped; a
//! shutdown saves everyone and reports what is not durable yet.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use uuid::Uuid;

use super::cadence::Phase;
use super::copies::{CopyId, Link, LiveCopy, zone_mark};
use super::game::Arrival;
use super::{EvictionCause, Inner, LiveError, LiveEvent, LiveGame, Runtime, SessionStart};
use crate::character::{CharacterSnapshot, LoadSource, LoadedCharacter};
use crate::coord::{LiveSession, PresenceRecord, ResumeLedgerRecord, SessionOrder};
use crate::drain::BarrierOutcome;
use crate::journal::{
    ActiveSession, PlayerSnapshot, RealtimeStreamCleanup, SessionLifecycleEffectPlan,
    cleanup_stream,
};
use crate::model::Anchor;
use crate::placement::PlacementRecord;
use crate::saver::{SaveReason, UnsavedFinals};

pub use super::finals::FinalSave;

/// A copy admitted here.
#[derive(Debug, Clone, PartialEq)]
pub struct Admitted {
    /// The copy: name it in every later call.
    pub copy: CopyId,
    /// The session's token.
    pub session_token: String,
    /// Where its content came from (`None`: an existing copy was resumed).
    pub source: Option<LoadSource>,
    /// True for a character never placed before.
    pub brand_new: bool,
    /// Set when an existing copy was resumed: the closed session it takes over.
    pub resumed: Option<Resumed>,
    /// Which copy's dump the loaded content is, and which of its issued writes it holds
    /// (`None` for a resume, which loads nothing): checks and diagnostics read it.
    pub origin: Option<crate::character::ContentOrigin>,
    /// The session's place in the character's session order (its presence record is written
    /// under it; a closed stream's journal entry is ordered against it, see
    /// [`super::LiveGame::journaled`]).
    pub session_order: SessionOrder,
}

/// A reconnect to a copy still held here.
#[derive(Debug, Clone, PartialEq)]
pub struct Resumed {
    /// The session the reconnect replaces.
    pub previous_session: String,
    /// Its resume ledger, when the journal had written it (last input applied, zone).
    pub ledger: Option<ResumeLedgerRecord>,
}

/// What a graceful shutdown achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Copies whose final save was queued.
    pub finalized: usize,
    /// The saver's barrier: `Drained` only when every final save is in its row or a durable job
    /// (or was fenced).
    pub saver: BarrierOutcome,
    /// Final saves not durable when the bound ran out (their checkpoints hold what the last
    /// cadence wrote).
    pub unsaved_finals: UnsavedFinals,
    /// Closed streams whose journal entry had not landed when the bound ran out (their cleanup
    /// then comes from the keyspace's TTLs).
    pub unjournaled: usize,
    /// Handoffs that left here and were neither taken nor given up when the bound ran out:
    /// their transfers stay pending until the handoff's lifetime ends, and their streams'
    /// cleanups come from the keyspace's TTLs.
    pub unsettled_handoffs: usize,
    /// The placement writer's barrier.
    pub placement: BarrierOutcome,
    /// The runtime's work in the background still running when the bound ran out, stopped
    /// where it stood: session records, a handoff's withdrawal or activation mark, a grant's
    /// job, a flush's merge after a lost version race, and also the journal appends, handoff
    /// waits and finals made jobs counted above.
    pub unfinished_writes: usize,
}

/// The player as a closed stream leaves it, for its journal entry.
fn player_of(inner: &Inner<impl LiveGame>, snapshot: &CharacterSnapshot) -> PlayerSnapshot {
    PlayerSnapshot {
        character_id: snapshot.character_id,
        account_id: snapshot.account_id,
        character_name: snapshot.name.clone(),
        shard_id: inner.config.shard_id.clone(),
        zone: snapshot
            .zone_ref
            .clone()
            .unwrap_or_else(|| inner.config.shard_id.clone()),
        room: snapshot.room_ref.clone().unwrap_or_default(),
        owner_epoch: snapshot.owner_epoch,
        state_version: Some(snapshot.state_version),
    }
}

/// Journals the close of `token`'s stream (its marker cleared first, the in-memory session
/// removed once the entry is durable: an append that fails leaves the session active, as the
/// seeds give), retrying until the entry lands or the runtime stops.
pub(crate) fn close_stream<G: LiveGame>(
    inner: &Arc<Inner<G>>,
    last: &CharacterSnapshot,
    token: String,
    plan: SessionLifecycleEffectPlan,
) {
    close_stream_with(inner, last, token, plan, 0);
}

fn close_stream_with<G: LiveGame>(
    inner: &Arc<Inner<G>>,
    last: &CharacterSnapshot,
    token: String,
    plan: SessionLifecycleEffectPlan,
    last_applied_seq: u64,
) {
    let player = player_of(inner, last);
    let closed_at = Utc::now();
    let pending_resume =
        (plan == SessionLifecycleEffectPlan::Reconnectable).then(|| ResumeLedgerRecord {
            session_token: token.clone(),
            character_id: player.character_id.to_string(),
            last_applied_seq,
            zone_id: player.zone.clone(),
            recorded_at: closed_at,
        });
    let cleanup = RealtimeStreamCleanup {
        session_token: token,
        player,
        runtime_profile: inner.config.transport.clone(),
        pending_resume,
        transfer_confirmed: plan == SessionLifecycleEffectPlan::ConfirmedTransfer,
        plan,
        closed_at,
    };
    let tracked = inner.closes.track();
    let background = inner.background.clone();
    let inner = Arc::clone(inner);
    background.spawn(async move {
        let _tracked = tracked;
        let mut pause = Duration::from_millis(100);
        loop {
            let outcome = cleanup_stream(
                &inner.stores.journal,
                &inner.sessions,
                &inner.stores.coord,
                cleanup.clone(),
            )
            .await;
            if let Some(entry_id) = outcome.entry_id {
                inner.game.journaled(
                    cleanup.player.character_id,
                    SessionOrder {
                        owner_epoch: cleanup.player.owner_epoch,
                        at: cleanup.closed_at,
                        event_id: entry_id,
                    },
                    cleanup.plan,
                );
                break;
            }
            tokio::select! {
                () = inner.cancel.cancelled() => break,
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(Duration::from_secs(4));
        }
    });
}

/// Marks `token` active, takes its place in the character's session order with its presence,
/// and writes the copy's placement. Best effort beyond the first attempt: the session runs
/// either way, and the refresh writes the records again.
fn start_session<G: LiveGame>(
    inner: &Arc<Inner<G>>,
    id: CopyId,
    account_id: Uuid,
    token: &str,
    zone: String,
    order: SessionOrder,
) {
    inner.sessions.insert(
        token,
        ActiveSession {
            character_id: id.character_id,
        },
    );
    placed(inner, id, zone.clone());
    write_session_records(
        inner,
        vec![(id, token.to_owned(), account_id, order, zone)],
        Marker::Set,
    );
}

/// Queues the placement of `id` in `zone` on this shard. A placement queued after its copy's
/// logout (a session start racing it outside the copy's registry lock) cannot outlive the
/// tombstone: the writer keeps a copy's tombstone over its placements, and the store refuses a
/// placement over its own copy's tombstone ([`crate::placement::PlacementWrite::Left`]).
pub(crate) fn placed<G: LiveGame>(inner: &Inner<G>, id: CopyId, zone: String) {
    inner.placement.enqueue(PlacementRecord {
        character_id: id.character_id,
        shard_id: Some(inner.config.shard_id.clone()),
        zone_id: Some(zone),
        owner_epoch: id.owner_epoch,
        updated_at: Utc::now(),
    });
}

/// Queues the placement of `copy` in its zone, if it is held here and not leaving.
pub(crate) fn place<G: LiveGame>(inner: &Inner<G>, copy: CopyId) {
    inner.copies.with(copy, |c| {
        if !c.leaving {
            placed(inner, copy, c.zone.clone());
        }
    });
}

/// Starts the session of a copy that arrived by handoff.
pub(crate) fn start_arrival<G: LiveGame>(
    inner: &Arc<Inner<G>>,
    admission: &Admission,
    account_id: Uuid,
    token: &str,
) {
    start_session(
        inner,
        admission.copy,
        account_id,
        token,
        admission.zone.clone(),
        admission.order,
    );
}

/// One session's records: (copy, token, account, its place in the order, zone).
pub(crate) type SessionRecords = (CopyId, String, Uuid, SessionOrder, String);

/// How a write of session records treats the session's active marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marker {
    /// A session starting: the marker is set.
    Set,
    /// A session living on whose marker a refresh found missing: it is set again only while
    /// the copy still plays under the session's token (a marker cleared because the stream
    /// closed stays unset: a journal worker would read it as a reconnect).
    Restore,
    /// A session living on whose marker is there: only its presence is written.
    Keep,
}

/// Writes the marker and the ordered presence of each session, in the background.
fn write_session_records<G: LiveGame>(
    inner: &Arc<Inner<G>>,
    sessions: Vec<SessionRecords>,
    marker: Marker,
) {
    let background = inner.background.clone();
    let inner = Arc::clone(inner);
    background.spawn(async move {
        for record in sessions {
            let copy = record.0;
            if !write_one_session(&inner, record, marker).await {
                inner.copies.with(copy, |c| c.records_owed = true);
            }
        }
    });
}

/// Writes one session's marker (as `marker` says) and its ordered presence, within the I/O
/// bound; true when written. A failure is logged (a later refresh writes them again).
async fn write_one_session<G: LiveGame>(
    inner: &Arc<Inner<G>>,
    (id, token, account, order, zone): SessionRecords,
    marker: Marker,
) -> bool {
    let coord = &inner.stores.coord;
    let ttl = inner.config.session_ttl;
    let record = PresenceRecord {
        account_id: account.to_string(),
        character_id: id.character_id.to_string(),
        session_token: token.clone(),
        shard_id: inner.config.shard_id.clone(),
        zone_id: Some(zone),
        expires_at: Utc::now()
            + chrono::Duration::milliseconds(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)),
    };
    let written = tokio::time::timeout(inner.config.io_timeout, async {
        match marker {
            Marker::Set => coord.session_activate(&token, ttl).await?,
            Marker::Restore if still_attached(inner, id, &token) => {
                coord.session_activate(&token, ttl).await?;
            }
            Marker::Restore | Marker::Keep => {}
        }
        coord.presence_put_ordered(&record, &order).await
    })
    .await;
    let written = matches!(written, Ok(Ok(_)));
    if !written {
        tracing::warn!(event = "session_records_unwritten", character = %id.character_id,
            "written again at a later refresh");
    }
    written
}

/// True while `copy` is here, not leaving, and attached under `token`.
fn still_attached<G: LiveGame>(inner: &Inner<G>, copy: CopyId, token: &str) -> bool {
    inner
        .copies
        .with(copy, |c| {
            !c.leaving && matches!(&c.link, Link::Attached(t) if t == token)
        })
        .unwrap_or(false)
}

/// A session due for a refresh, as the pulse's visit of its copy finds it: its records, and
/// whether they are written in full (presence and placement) rather than extended where they
/// stand. `None` for a copy leaving or not attached, or whose session has no place in the order.
/// Made under the copy's lock, in the same visit that found it due (no second lookup); a full
/// write's placement is queued here, so a logout's tombstone comes after it.
pub(crate) fn refresh_of<G: LiveGame>(
    inner: &Inner<G>,
    copy: CopyId,
    c: &mut LiveCopy<G::Character>,
    full: bool,
) -> Option<(SessionRecords, bool)> {
    let token = match &c.link {
        Link::Attached(token) if !c.leaving => token.clone(),
        _ => return None,
    };
    let order = c.session_order?;
    if full {
        // Owed no more once written in full: a failure of this write owes them again (a
        // placement's, reported by its writer, at a pulse).
        c.records_owed = false;
        placed(inner, copy, c.zone.clone());
    }
    let record = (copy, token, c.account_id, order, c.zone.clone());
    Some((record, full))
}

/// Refreshes the records of attached sessions (the pulse calls it for those due, made by
/// [`refresh_of`]): their markers and presence are extended where they stand, all in one round
/// trip; a session due for a full write, or whose records are found missing (lost in a Redis
/// restart, or a start write that failed) while its copy still plays, has them written again
/// the full way.
pub(crate) fn refresh_sessions<G: LiveGame>(
    inner: &Arc<Inner<G>>,
    sessions: Vec<(SessionRecords, bool)>,
) {
    if sessions.is_empty() {
        return;
    }
    let background = inner.background.clone();
    let inner = Arc::clone(inner);
    background.spawn(async move {
        let live: Vec<LiveSession> = sessions
            .iter()
            .map(|((id, token, account, _, _), _)| LiveSession {
                session_token: token.clone(),
                account_id: account.to_string(),
                character_id: id.character_id.to_string(),
            })
            .collect();
        let ttl = inner.config.session_ttl;
        let found = tokio::time::timeout(
            inner.config.io_timeout,
            inner.stores.coord.sessions_refresh(&live, ttl),
        )
        .await;
        let found = match found {
            Ok(Ok(found)) => found,
            Ok(Err(err)) => {
                tracing::warn!(event = "session_records_unwritten", count = sessions.len(),
                    error = %err, "written again at the next refresh");
                owe_full_writes(&inner, &sessions);
                return;
            }
            Err(_) => {
                tracing::warn!(
                    event = "session_records_unwritten",
                    count = sessions.len(),
                    error = "timed out",
                    "written again at the next refresh"
                );
                owe_full_writes(&inner, &sessions);
                return;
            }
        };
        for ((record, full), found) in sessions.into_iter().zip(found) {
            if found.marker && found.presence && !full {
                continue;
            }
            if !still_attached(&inner, record.0, &record.1) {
                continue;
            }
            if !found.marker {
                // The marker gone while the copy plays: Redis lost records, placement too.
                place(&inner, record.0);
            }
            let marker = if found.marker {
                Marker::Keep
            } else {
                Marker::Restore
            };
            let (copy, zone) = (record.0, zone_mark(&record.4));
            let written = write_one_session(&inner, record, marker).await;
            inner.copies.with(copy, |c| {
                if written {
                    // What presence names now; a zone change since is still ahead of it.
                    c.presence_zone = zone;
                } else {
                    c.records_owed = true;
                }
            });
        }
    });
}

/// The full writes among `sessions` never went out (the refresh's round trip failed): their
/// copies owe them again, at their next refresh.
fn owe_full_writes<G: LiveGame>(inner: &Inner<G>, sessions: &[(SessionRecords, bool)]) {
    for (record, full) in sessions {
        if *full {
            inner.copies.with(record.0, |c| c.records_owed = true);
        }
    }
}

fn zone_of<G: LiveGame>(inner: &Inner<G>, anchor: &Anchor) -> String {
    anchor
        .zone_ref
        .clone()
        .unwrap_or_else(|| inner.config.shard_id.clone())
}

fn new_order(epoch: i64) -> SessionOrder {
    SessionOrder {
        owner_epoch: epoch,
        at: Utc::now(),
        event_id: Uuid::now_v7(),
    }
}

/// Removes `copy` and queues its final save (see [`Runtime::logout`]).
fn log_out<G: LiveGame>(inner: &Arc<Inner<G>>, copy: CopyId) -> Result<LoggedOut, LiveError> {
    let removed = inner.copies.remove(copy).ok_or(LiveError::Gone(copy))?;
    let answer = leave(inner, copy, removed)?;
    Ok(LoggedOut {
        copy,
        answer,
        outcome: None,
    })
}

/// What every logout does once `copy` left the registry: its placement becomes a tombstone,
/// its stream is journaled as ended, and its final save is queued; the save's answer.
fn leave<G: LiveGame>(
    inner: &Arc<Inner<G>>,
    copy: CopyId,
    mut removed: LiveCopy<G::Character>,
) -> Result<tokio::sync::oneshot::Receiver<FinalSave>, LiveError> {
    tombstone(inner, copy);
    let snapshot = final_snapshot(inner, copy.character_id, &mut removed)?;
    close_stream(
        inner,
        &snapshot,
        removed.link.token().to_owned(),
        SessionLifecycleEffectPlan::PermanentRemoval,
    );
    let answer = inner.finals.push(snapshot);
    inner.finals.offer(&inner.saver);
    Ok(answer)
}

/// A logged-out copy's final save, on its way ([`Runtime::logout_now`]).
#[derive(Debug)]
pub struct LoggedOut {
    copy: CopyId,
    answer: tokio::sync::oneshot::Receiver<FinalSave>,
    outcome: Option<FinalSave>,
}

impl LoggedOut {
    /// The copy that logged out.
    pub fn copy(&self) -> CopyId {
        self.copy
    }

    /// How the final save ended, once it has: `None` while it is on its way (queued, retrying
    /// through an outage, becoming a job — never given up), and while the runtime that holds it
    /// has stopped without an answer (its [`ShutdownReport`] counts it).
    pub fn outcome(&mut self) -> Option<FinalSave> {
        if self.outcome.is_none() {
            self.outcome = self.answer.try_recv().ok();
        }
        self.outcome.clone()
    }

    /// Waits at most `bound` for the outcome; [`FinalSave::Pending`] when none came.
    pub async fn within(mut self, bound: Duration) -> FinalSave {
        if let Some(outcome) = self.outcome.take() {
            return outcome;
        }
        match tokio::time::timeout(bound, self.answer).await {
            Ok(Ok(outcome)) => outcome,
            _ => FinalSave::Pending,
        }
    }
}

/// Dumps `copy`, already removed from the registry.
fn final_snapshot<G: LiveGame>(
    inner: &Inner<G>,
    character_id: Uuid,
    copy: &mut LiveCopy<G::Character>,
) -> Result<CharacterSnapshot, LiveError> {
    let state = inner.game.dump(&copy.character).map_err(LiveError::Game)?;
    Ok(copy.dump(character_id, state))
}

/// A link-dead copy's grace ran out: its final save is queued and its session's ledger goes.
pub(crate) fn expire_link_dead<G: LiveGame>(inner: &Arc<Inner<G>>, id: CopyId) {
    // Still link-dead and past its grace: a reconnect since the pulse looked keeps the copy.
    let now = tokio::time::Instant::now();
    let lapsed = |c: &LiveCopy<G::Character>| {
        matches!(c.link, Link::LinkDead { until, .. } if until <= now)
            && !c.leaving
            && !inner.transfers.busy(id.character_id)
    };
    let Some(copy) = inner.copies.remove_if(id, lapsed) else {
        return;
    };
    if let Err(err) = leave(inner, id, copy) {
        tracing::error!(event = "final_dump_refused", character = %id.character_id,
            error = %err, "its last cadence save stands");
    }
    let _ = inner.events.send(LiveEvent::LinkDeadExpired { copy: id });
}

fn tombstone<G: LiveGame>(inner: &Inner<G>, id: CopyId) {
    inner.placement.enqueue(PlacementRecord {
        character_id: id.character_id,
        shard_id: None,
        zone_id: None,
        owner_epoch: id.owner_epoch,
        updated_at: Utc::now(),
    });
}

/// Admits a loaded character as a live copy attached to session `token`, with its place in the
/// character's session order; a stale copy of it still held here is evicted first (the new
/// claim superseded it).
pub(crate) fn admit<G: LiveGame>(
    inner: &Arc<Inner<G>>,
    loaded: &LoadedCharacter,
    arrival: Arrival,
    token: &str,
) -> Result<Admission, LiveError> {
    let snapshot = &loaded.snapshot;
    let id = snapshot.character_id;
    let landed = inner
        .game
        .land(snapshot, arrival)
        .map_err(LiveError::Game)?;
    let zone = zone_of(inner, &landed.anchor);
    let order = new_order(snapshot.owner_epoch);
    let copy = LiveCopy {
        character: landed.character,
        account_id: snapshot.account_id,
        name: snapshot.name.clone(),
        epoch: snapshot.owner_epoch,
        version: snapshot.state_version,
        issued: 0,
        anchor: landed.anchor,
        zone: zone.clone(),
        presence_zone: zone_mark(&zone),
        records_owed: false,
        chargen: landed.chargen,
        schema_version: snapshot.schema_version,
        phase: Phase::of(id, inner.periods),
        link: Link::Attached(token.to_owned()),
        leaving: false,
        session_order: Some(order),
        next_visit: super::schedule::UNPLACED,
        owed: None,
    };
    let copy_id = CopyId {
        character_id: id,
        owner_epoch: snapshot.owner_epoch,
    };
    if let Some(copy) = inner.copies.admit(id, copy) {
        let held = inner.copies.current(id);
        match held {
            Some(old) if old.owner_epoch < copy_id.owner_epoch => {
                super::driver::evict(
                    inner,
                    old,
                    EvictionCause::OwnershipLost {
                        current_epoch: copy_id.owner_epoch,
                    },
                );
                if inner.copies.admit(id, copy).is_some() {
                    return Err(LiveError::AlreadyHeld(copy_id));
                }
            }
            Some(old) => return Err(LiveError::AlreadyHeld(old)),
            None => return Err(LiveError::AlreadyHeld(copy_id)),
        }
    }
    // Durable as loaded: this stay's crash window starts now.
    inner.saver.landed().loaded(id, std::time::Instant::now());
    Ok(Admission {
        copy: copy_id,
        order,
        zone,
    })
}

/// A copy admitted: its id, its session's place in the order, and the zone it landed in.
pub(crate) struct Admission {
    pub(crate) copy: CopyId,
    pub(crate) order: SessionOrder,
    pub(crate) zone: String,
}

impl<G: LiveGame> Runtime<G> {
    /// Logs `character_id` in: a copy still held here (link-dead, or attached to a connection
    /// that died silently) is resumed — its old stream journaled first — and its resume ledger
    /// handed back, unless its row names a newer owner (one read); otherwise the character is
    /// claimed (minting this copy's epoch), the freshest of its row and checkpoint loaded, the
    /// copy admitted and its session started. A logout of the character still saving here is
    /// waited for (within the I/O bound) so the claim loads it.
    pub async fn login(
        &self,
        character_id: Uuid,
        start: SessionStart,
    ) -> Result<Admitted, LiveError> {
        let inner = &self.inner;
        if inner.cancel.is_cancelled() || inner.closing.load(std::sync::atomic::Ordering::Acquire) {
            return Err(LiveError::Stopped);
        }
        let token = start.token()?;
        if self.attached_under(character_id, &token) {
            return Err(LiveError::InvalidSession(
                "this session token already plays the character: a new connection needs a token of its own".into(),
            ));
        }
        self.schema_current().await?;
        if !self.held_copy_superseded(character_id).await
            && let Some(resumed) = self.resume(character_id, &token).await
        {
            return Ok(resumed);
        }
        self.wait_for_final(character_id).await?;
        let loaded = inner.stores.loader.claim_and_load(character_id, 0).await?;
        let arrival = Arrival::Login {
            brand_new: loaded.brand_new,
        };
        let Admission { copy, order, zone } = admit(inner, &loaded, arrival, &token)?;
        start_session(inner, copy, loaded.snapshot.account_id, &token, zone, order);
        Ok(Admitted {
            copy,
            session_token: token,
            source: Some(loaded.source),
            brand_new: loaded.brand_new,
            resumed: None,
            origin: Some(loaded.origin.clone()),
            session_order: order,
        })
    }

    /// True when the copy of `character_id` held here plays under session `token` now.
    fn attached_under(&self, character_id: Uuid, token: &str) -> bool {
        let copies = &self.inner.copies;
        copies
            .current(character_id)
            .and_then(|held| {
                copies.with(held, |c| matches!(&c.link, Link::Attached(t) if t == token))
            })
            .unwrap_or(false)
    }

    /// True when a copy of `character_id` is held here and its row names a newer owner: a
    /// claim elsewhere superseded the copy (this login came by a stale route), so it is not
    /// resumed to play until its next save meets the fence — the login claims afresh, and
    /// admitting the new copy evicts it. A row that cannot be read within the I/O bound lets
    /// the copy resume (its writes still meet their fence).
    async fn held_copy_superseded(&self, character_id: Uuid) -> bool {
        let inner = &self.inner;
        let Some(held) = inner.copies.current(character_id) else {
            return false;
        };
        let row = tokio::time::timeout(
            inner.config.io_timeout,
            inner.stores.characters.version_of(character_id),
        )
        .await;
        matches!(row, Ok(Ok(Some((_, owner)))) if owner > held.owner_epoch)
    }

    /// Waits (within the I/O bound) until no logout of `character_id` is saving here.
    async fn wait_for_final(&self, character_id: Uuid) -> Result<(), LiveError> {
        let deadline = tokio::time::Instant::now() + self.inner.config.io_timeout;
        while self.inner.finals.busy(character_id) || self.inner.saver.final_in_flight(character_id)
        {
            if tokio::time::Instant::now() >= deadline {
                return Err(LiveError::StillSaving(character_id));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// Attaches session `token` to the copy of `character_id` held here, if any. An old stream
    /// still attached (a connection that died without a word) is journaled first, and the new
    /// session takes its place in the character's order after that close.
    async fn resume(&self, character_id: Uuid, token: &str) -> Option<Admitted> {
        let inner = &self.inner;
        let held = inner.copies.current(character_id)?;
        // All under the copy's lock: a logout from another task comes wholly before the resume
        // (which then finds no copy, and the login claims afresh) or wholly after it (and
        // closes the resumed session), never between the attach and the session's start in
        // this process. (Their writes to Redis run in the background, each in its own task.)
        let (old, order) = inner.copies.with_active(held, |c| {
            let (old, still_attached) = match &c.link {
                Link::Attached(old) => (old.clone(), true),
                Link::LinkDead { token, .. } => (token.clone(), false),
            };
            c.link = Link::Attached(token.to_owned());
            c.presence_zone = zone_mark(&c.zone);
            if still_attached {
                let last = c.snapshot(character_id, Default::default());
                close_stream(
                    inner,
                    &last,
                    old.clone(),
                    SessionLifecycleEffectPlan::Reconnectable,
                );
            }
            // After that close in the character's order.
            let order = new_order(held.owner_epoch);
            c.session_order = Some(order);
            start_session(inner, held, c.account_id, token, c.zone.clone(), order);
            (old, order)
        })?;
        let ledger = tokio::time::timeout(
            inner.config.io_timeout,
            inner.stores.coord.resume_load(&old),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .flatten();
        Some(Admitted {
            copy: held,
            session_token: token.to_owned(),
            source: None,
            brand_new: false,
            resumed: Some(Resumed {
                previous_session: old,
                ledger,
            }),
            origin: None,
            session_order: order,
        })
    }

    /// The stream of session `session_token` of `copy` closed without a logout: the copy
    /// stays, link-dead, for [`super::LiveConfig::link_dead_for`] (a reconnect resumes it), its
    /// close is journaled with a resume ledger (`last_applied_seq`: the last client input
    /// applied), and it is flushed now. A detach naming a session no longer attached (a
    /// reconnect resumed the copy under a new token since, or the copy is link-dead already)
    /// changes nothing: a late close of an old connection never detaches the new one.
    pub fn detach(
        &self,
        copy: CopyId,
        session_token: &str,
        last_applied_seq: u64,
    ) -> Result<(), LiveError> {
        let inner = &self.inner;
        let until = tokio::time::Instant::now() + inner.config.link_dead_for;
        let (link_dead, flush) = inner
            .copies
            .with(copy, |c| {
                match &c.link {
                    Link::Attached(token) if token == session_token => {}
                    Link::Attached(_) => return (false, None),
                    Link::LinkDead { .. } => return (true, None),
                }
                c.link = Link::LinkDead {
                    token: session_token.to_owned(),
                    until,
                };
                // Journaled under the copy's lock: a resume after this close takes its place in
                // the character's order after it, not before.
                let last = c.snapshot(copy.character_id, Default::default());
                close_stream_with(
                    inner,
                    &last,
                    session_token.to_owned(),
                    SessionLifecycleEffectPlan::Reconnectable,
                    last_applied_seq,
                );
                let flush = match inner.game.dump(&c.character) {
                    Ok(state) => Some(c.dump(copy.character_id, state)),
                    Err(error) => {
                        tracing::warn!(event = "dump_refused", character = %copy.character_id,
                            error, "a detached copy is not flushed now");
                        None
                    }
                };
                (true, flush)
            })
            .ok_or(LiveError::Gone(copy))?;
        if link_dead {
            inner.copies.watch_link_dead(copy);
        }
        if let Some(snapshot) = flush {
            inner.saver.enqueue(SaveReason::Flush, snapshot);
        }
        Ok(())
    }

    /// Logs `copy` out: it leaves the registry, its placement becomes a tombstone, its stream
    /// is journaled, and its final save is queued — re-offered while the saver's queue is full,
    /// made a durable job if the saver gives it up, never dropped. An item transfer of the
    /// character in flight ends first (within [`super::LiveConfig::transfer_budget`]). Waits up
    /// to [`super::LiveConfig::logout_wait`] for the save's answer ([`FinalSave::Pending`]
    /// after that: the save goes on).
    pub async fn logout(&self, copy: CopyId) -> Result<FinalSave, LiveError> {
        let inner = &self.inner;
        if inner.copies.with(copy, |c| c.leaving) != Some(false) {
            return Err(LiveError::Gone(copy));
        }
        // An item transfer of the character in flight ends first: its item is then in the
        // copy (or went back), and in the final save.
        inner
            .transfers
            .idle(copy.character_id, inner.config.transfer_budget)
            .await;
        let logged_out = log_out(inner, copy)?;
        Ok(logged_out.within(inner.config.logout_wait).await)
    }

    /// [`Runtime::logout`] for a game that logs players out inside its own tick: the copy
    /// leaves the registry at once, with everything `logout` does, and the answer is a handle
    /// to the final save's outcome, which the tick can look at later
    /// ([`LoggedOut::outcome`]). Refused with [`LiveError::TransferPending`] while an item
    /// transfer of the character is in flight (its item would miss the final save): try again
    /// at a later tick.
    pub fn logout_now(&self, copy: CopyId) -> Result<LoggedOut, LiveError> {
        let inner = &self.inner;
        if inner.copies.with(copy, |c| c.leaving) != Some(false) {
            return Err(LiveError::Gone(copy));
        }
        if inner.transfers.busy(copy.character_id) {
            return Err(LiveError::TransferPending(copy.character_id));
        }
        log_out(inner, copy)
    }

    /// Graceful shutdown: every copy's final save is queued and its stream journaled (a
    /// reconnect elsewhere may resume it), then the runtime waits, at most `bound` in all, for
    /// the saves to be durable, the journal entries to land and the placement records to be
    /// written, and stops. The report says what is not durable.
    pub async fn shutdown(self, bound: Duration) -> ShutdownReport {
        let inner = &self.inner;
        inner
            .closing
            .store(true, std::sync::atomic::Ordering::Release);
        let deadline = tokio::time::Instant::now() + bound;
        let mut finalized = 0;
        for copy in inner.copies.ids() {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            inner.transfers.idle(copy.character_id, left).await;
            let Some(mut removed) = inner.copies.remove(copy) else {
                continue;
            };
            tombstone(inner, copy);
            let Ok(snapshot) = final_snapshot(inner, copy.character_id, &mut removed) else {
                continue;
            };
            {
                let token = removed.link.token();
                close_stream(
                    inner,
                    &snapshot,
                    token.to_owned(),
                    SessionLifecycleEffectPlan::Reconnectable,
                );
            }
            drop(inner.finals.push(snapshot));
            finalized += 1;
        }
        // Finals are offered until the saver took them all and none is being merged or made a
        // job (a merged one is offered again), then the saver's barrier waits for their I/O;
        // the round repeats while the barrier's answers put finals back in hand.
        let mut saver = BarrierOutcome::TimedOut;
        while tokio::time::Instant::now() < deadline {
            if inner.cancel.is_cancelled() {
                // Killed: nothing of this runtime writes any more.
                break;
            }
            inner.finals.offer(&inner.saver);
            if inner.finals.in_hand() > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            saver = inner
                .saver
                .barrier(deadline.saturating_duration_since(tokio::time::Instant::now()))
                .await;
            if matches!(saver, BarrierOutcome::Stopped | BarrierOutcome::Cancelled) {
                // The saver writes nothing more: what it holds is reported, not waited for.
                break;
            }
            // The barrier's own answers (a conflict to merge) reach the pulse a moment later.
            tokio::time::sleep(Duration::from_millis(20)).await;
            // A merge that ended within the pause has put its final back in the saver's queue:
            // done only when nothing is in hand and the saver holds no final either.
            if inner.finals.in_hand() == 0 && inner.saver.unsaved_finals().total() == 0 {
                break;
            }
        }
        let left = inner.finals.in_hand();
        let mut unsaved_finals = inner.saver.unsaved_finals();
        unsaved_finals.dropped = if inner.cancel.is_cancelled() {
            // Killed: every final not answered is unsaved, whether it waits in the stopped
            // saver's queue or the stopped saver refused it.
            inner
                .finals
                .unanswered()
                .saturating_sub(unsaved_finals.queued + unsaved_finals.pending)
                .max(left)
        } else {
            left
        };
        // A settled handoff closes its source's stream: handoffs first, then the closes.
        let unsettled_handoffs = inner.handoffs.settled_by(deadline).await;
        let unjournaled = inner.closes.settled_by(deadline).await;
        let placement = inner
            .placement
            .barrier(deadline.saturating_duration_since(tokio::time::Instant::now()))
            .await;
        let _ = inner
            .auditor
            .barrier(deadline.saturating_duration_since(tokio::time::Instant::now()))
            .await;
        let unfinished_writes = inner
            .background
            .settled_by(deadline.saturating_duration_since(tokio::time::Instant::now()))
            .await;
        if unsaved_finals.total() > 0
            || unjournaled > 0
            || unsettled_handoffs > 0
            || unfinished_writes > 0
        {
            tracing::warn!(
                event = "shutdown_unsaved",
                queued = unsaved_finals.queued,
                pending = unsaved_finals.pending,
                deferred = left,
                unjournaled,
                unsettled_handoffs,
                unfinished_writes,
                "not everything was durable when the bound ran out"
            );
        }
        inner.cancel.cancel();
        if let Some(task) = self.driver.lock().await.take() {
            let _ = task.await;
        }
        // What still ran stops at its next step (a command already sent may still land).
        let still = inner.background.settled_by(inner.config.io_timeout).await;
        if still > 0 {
            tracing::warn!(
                event = "shutdown_tasks_running",
                still,
                "background work had not stopped within the I/O bound"
            );
        }
        ShutdownReport {
            finalized,
            saver,
            unsaved_finals,
            unjournaled,
            unsettled_handoffs,
            placement,
            unfinished_writes,
        }
    }
}
