//! The live-copy runtime: everything that keeps a game's online characters durable, in one
//! place, so a game supplies its model and its gameplay and nothing else.
//!
//! A game builds a [`Runtime`] from its [`crate::Services`] and its [`LiveGame`], then logs
//! players in, plays them ([`Runtime::update`], [`Runtime::grant`]) and logs them out. The
//! runtime owns what a game could get wrong:
//!
//! - the live copy: the epoch its claim minted, the row versions it learns from every landed
//!   write (merging what a job or an offline grant landed under it before adopting a version),
//!   its issue sequence (a live grant is numbered by construction), its dump;
//! - the cadences: a checkpoint every ~10 s and a flush every ~60 s, staggered across copies,
//!   validated against the checkpoint's lifetime;
//! - the saver's answers: versions adopted, conflicts merged and written again, zombies
//!   evicted ([`LiveEvent::Evicted`]);
//! - logout: the final save is never dropped (re-offered while the saver's queue is full, made a
//!   durable job when the saver gives it up), and shutdown reports what is unsaved;
//! - sessions: the session marker and ordered presence at start, placement, the journal entry
//!   before a closed session is removed (retried until it lands), reconnect with the resume
//!   ledger, link-dead copies logged out after their grace;
//! - handoffs between shards, with the destination's claim refusing a superseded copy;
//! - item moves between characters: which pickups commit as a two-row transfer, and the
//!   transfer itself;
//! - offline grants, which reach whichever copy owns the character when they land.
//!
//! Layout: [`game`] (what the game supplies), [`cadence`] (when copies save, pure), `copies`
//! (the registry), `schedule` (which copies a pulse looks at, pure), `driver` (the pulse:
//! cadences, session refreshes, the saver's answers, deferred finals),
//! `sessions` (login, resume, detach, logout, shutdown), `finals` (logout saves and journal
//! entries owed), `writes` (grants, saves, merges), `handoff` (leaving for and arriving from
//! another shard), [`transit`] (the handoff protocol's steps, shared with hosts that drive their
//! own), `items` (pickups and transfers), `launch` (one call to a running shard).

pub mod cadence;
mod copies;
mod driver;
mod finals;
pub mod game;
mod handoff;
mod items;
mod launch;
mod schedule;
mod sessions;
pub mod transit;
mod writes;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex as AsyncMutex, broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::character::{CharacterLoader, CharacterStore, CheckpointStore};
use crate::coord::Coordination;
use crate::journal::{ActiveSessions, RealtimeRuntimeProfile, SessionJournal};
use crate::keyspace::CHECKPOINT_TTL;
use crate::model::Anchor;
use crate::placement::PlacementWriter;
use crate::retry::RetryQueue;
use crate::saver::{Saver, SaverConfig, SaverEvent, SaverSinks};
use crate::ttl::Ttl;

pub use cadence::{Cadence, CadenceError};
pub use copies::CopyId;
pub use game::{Arrival, Landed, LiveGame, Stored};
pub use handoff::HandoffTicket;
pub use items::{PickedUp, ReleaseMark, pickup_commits};
pub use launch::{Launch, LaunchError, Launched};
pub use sessions::{Admitted, FinalSave, LoggedOut, Resumed, ShutdownReport};
pub use transit::Transit;
pub use writes::{Granted, GrantedNow, OFFLINE_EPOCH, OfflineGrant};

/// Tunables of a runtime.
#[derive(Debug, Clone)]
pub struct LiveConfig {
    /// This shard's id (presence, placement, handoffs addressed to it).
    pub shard_id: String,
    /// The save cadences.
    pub cadence: Cadence,
    /// True (the default): the runtime pulses on a timer of its own. A game with a tick of its
    /// own (a zone's pulse) sets it false and calls [`Runtime::pulse`] from that tick, so its
    /// saves are taken between its simulation's steps (and its tests can step them); it sets
    /// [`Cadence::pulse`] to its tick, since each call is one pulse (a tick faster than the
    /// pulse saves that much more often). Either way a pulse that comes late, up to four pulses
    /// late, does the dues of the pulses it missed, so the periods keep their length in time; a
    /// longer gap stretches the cadences by the rest.
    pub own_pulse: bool,
    /// The saver's tunables.
    pub saver: SaverConfig,
    /// Lifetime of a session's marker and presence record; refreshed every third of it while
    /// the session lives.
    pub session_ttl: Ttl,
    /// How long a copy whose stream closed ([`Runtime::detach`]) waits for a reconnect before
    /// it is logged out.
    pub link_dead_for: Duration,
    /// Lifetime of a handoff payload and of its transfer's pending mark.
    pub handoff_ttl: Ttl,
    /// How long [`Runtime::logout`] waits for the final save's answer (the save goes on after).
    pub logout_wait: Duration,
    /// Bound on each store call the runtime makes itself.
    pub io_timeout: Duration,
    /// How long an item transfer retries a commit whose outcome is unknown (a store outage)
    /// before the item is voided, on the record.
    pub transfer_budget: Duration,
    /// How clients connect, recorded with each closed stream.
    pub transport: RealtimeRuntimeProfile,
}

impl LiveConfig {
    /// Defaults for shard `shard_id`: the seeds' cadences, two-minute sessions, a two-minute
    /// link-dead grace.
    pub fn new(shard_id: &str) -> Self {
        Self {
            shard_id: shard_id.to_owned(),
            cadence: Cadence::default(),
            own_pulse: true,
            saver: SaverConfig::default(),
            session_ttl: Ttl::from_static_secs(120),
            link_dead_for: Duration::from_secs(120),
            handoff_ttl: Ttl::from_static_secs(120),
            logout_wait: Duration::from_secs(15),
            io_timeout: Duration::from_secs(5),
            transfer_budget: Duration::from_secs(30),
            transport: RealtimeRuntimeProfile {
                transport: "tcp".into(),
                protocol_version: 1,
                tick_rate_hz: 4,
            },
        }
    }
}

/// A runtime could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The cadence is refused.
    #[error("cadence: {0}")]
    Cadence(#[from] CadenceError),
    /// The shard id is empty or too long.
    #[error("the shard id must be 1 to 64 bytes of letters, digits, '-' or '_'")]
    ShardId,
}

/// A call about a live copy could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// The copy is not held here (it left, or was evicted: a newer copy owns the character).
    #[error("character {0} is not held here: it left or was replaced")]
    Gone(CopyId),
    /// The character is still held here by another copy.
    #[error("character {0} is already held here")]
    AlreadyHeld(CopyId),
    /// A logout of the character on this shard is still saving; log in again in a moment.
    #[error("character {0} is still saving its logout; try again")]
    StillSaving(Uuid),
    /// The character could not be claimed or loaded; nothing was admitted.
    #[error(transparent)]
    Load(#[from] crate::character::LoadError),
    /// The character store failed.
    #[error(transparent)]
    Store(#[from] crate::character::StoreError),
    /// Coordination (Redis) failed; nothing was changed.
    #[error(transparent)]
    Coordination(#[from] crate::CoordError),
    /// The game could not play or write the character.
    #[error("the game refused the character: {0}")]
    Game(String),
    /// The effect is invalid; nothing was applied.
    #[error("invalid effect: {0}")]
    InvalidEffect(String),
    /// A character of the pickup already has an item transfer in flight here; one at a time.
    #[error("character {0} already has an item transfer in flight")]
    TransferPending(Uuid),
    /// No handoff with this token was waiting for this shard.
    #[error("no handoff waits here under this token")]
    UnknownHandoff,
    /// The write is applied to the live copy but could not be made durable yet (the stores are
    /// unreachable); the copy's next save carries it.
    #[error("applied, but not durable yet: {0}")]
    NotDurable(String),
    /// The runtime has stopped.
    #[error("the runtime has stopped")]
    Stopped,
    /// The database or file is behind this build (migrations pending): nothing is claimed or
    /// created until `shardkeep migrate` has run. (A store that cannot answer which migrations
    /// it holds is [`LiveError::NotDurable`]: an outage, tried again at the next call.)
    #[error("the schema is behind this build: {0}")]
    SchemaBehind(String),
    /// A session token the game named is refused (empty, or longer than the retry jobs that
    /// carry it can store); nothing was claimed.
    #[error("invalid session token: {0}")]
    InvalidSession(String),
}

/// Why a copy was evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionCause {
    /// A newer copy claimed the character (the row refused this copy's write).
    OwnershipLost {
        /// The row's epoch.
        current_epoch: i64,
    },
    /// A newer copy holds the checkpoint.
    DoubleOwn {
        /// The checkpoint's guard epoch.
        stored_epoch: i64,
    },
    /// A process with a newer model wrote the character.
    SchemaOutdated {
        /// The schema version stored.
        stored_schema: u32,
    },
}

/// What the runtime tells the game without being asked.
#[derive(Debug, Clone, PartialEq)]
pub enum LiveEvent {
    /// A copy was removed without a save: another copy owns the character. Its player must log
    /// in again; whatever it changed since its last landed write is gone.
    Evicted {
        /// The copy.
        copy: CopyId,
        /// Why.
        cause: EvictionCause,
    },
    /// A link-dead copy's grace ran out: it was logged out.
    LinkDeadExpired {
        /// The copy.
        copy: CopyId,
    },
}

/// The handles the runtime writes through.
#[derive(Clone)]
pub(crate) struct Stores {
    pub(crate) characters: CharacterStore,
    pub(crate) checkpoints: CheckpointStore,
    pub(crate) loader: CharacterLoader,
    pub(crate) coord: Coordination,
    pub(crate) retry: RetryQueue,
    pub(crate) journal: SessionJournal,
    pub(crate) transit: Transit,
}

/// The runtime's work in the background (writes and their retries off the caller's path): a
/// shutdown waits for it within its bound, and when the runtime is killed or has stopped, each
/// task stops where it stands at its next step — nothing of a stopped runtime writes on.
#[derive(Clone)]
pub(crate) struct Background {
    tasks: tokio_util::task::TaskTracker,
    cancel: CancellationToken,
}

impl Background {
    /// Runs `work` in the background until it ends or the runtime stops.
    pub(crate) fn spawn<F>(&self, work: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let cancel = self.cancel.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                biased;
                () = cancel.cancelled() => {}
                () = work => {}
            }
        });
    }

    /// Waits at most `bound` for the work running to end; the number still running then.
    pub(crate) async fn settled_by(&self, bound: Duration) -> usize {
        self.tasks.close();
        let _ = tokio::time::timeout(bound, self.tasks.wait()).await;
        self.tasks.reopen();
        self.tasks.len()
    }
}

/// The runtime's shared state.
pub(crate) struct Inner<G: LiveGame> {
    pub(crate) game: G,
    pub(crate) config: LiveConfig,
    pub(crate) periods: (u64, u64),
    pub(crate) stores: Stores,
    pub(crate) saver: Saver,
    pub(crate) placement: PlacementWriter,
    pub(crate) auditor: crate::audit::Auditor,
    pub(crate) copies: Arc<copies::Copies<G::Character>>,
    pub(crate) sessions: ActiveSessions,
    pub(crate) finals: Arc<finals::Finals>,
    pub(crate) closes: Arc<finals::Outstanding>,
    /// Handoffs that left here and whose source side is not settled yet.
    pub(crate) handoffs: Arc<finals::Outstanding>,
    pub(crate) transfers: items::Transfers,
    pub(crate) events: broadcast::Sender<LiveEvent>,
    pub(crate) cancel: CancellationToken,
    /// The runtime's work in the background: writes and their retries, off the caller's path.
    pub(crate) background: Background,
    /// The number of the last pulse run and the time it stands at (`driver::number_pulse`).
    pub(crate) pulse_clock: std::sync::Mutex<cadence::PulseClock>,
    /// A crash-window measure is running.
    pub(crate) exporting: std::sync::atomic::AtomicBool,
    /// A shutdown started: no copy is admitted any more.
    pub(crate) closing: std::sync::atomic::AtomicBool,
    /// The stores' schema, checked once it is found current (see [`Runtime::schema_current`]).
    pub(crate) schema: SchemaGate,
}

/// Whether the stores hold every migration of this build: checked before the first claim or
/// creation, remembered once it is so, checked again on every call while it is not.
pub(crate) struct SchemaGate {
    stores: crate::services::Stores,
    current: tokio::sync::OnceCell<()>,
    /// Bound on one check (a store that does not answer is an outage, not a verdict).
    io_timeout: Duration,
}

impl SchemaGate {
    async fn check(&self) -> Result<(), LiveError> {
        self.current
            .get_or_try_init(|| async {
                let (store, current) = match &self.stores {
                    crate::services::Stores::Servers { pg, .. } => (
                        "Postgres",
                        tokio::time::timeout(self.io_timeout, pg.migrations_current()).await,
                    ),
                    crate::services::Stores::Embedded(db) => (
                        "SQLite",
                        tokio::time::timeout(self.io_timeout, db.migrations_current()).await,
                    ),
                };
                match current {
                    Ok(Ok(true)) => Ok(()),
                    Ok(Ok(false)) => Err(LiveError::SchemaBehind(format!(
                        "the {store} schema has migrations pending: run `shardkeep migrate` first"
                    ))),
                    Ok(Err(err)) => Err(LiveError::NotDurable(format!(
                        "reading the {store} schema's migrations: {err}"
                    ))),
                    Err(_) => Err(LiveError::NotDurable(format!(
                        "reading the {store} schema's migrations timed out"
                    ))),
                }
            })
            .await
            .map(|_| ())
    }
}

/// A game's live characters on one shard. Cheap to clone; every clone is the same runtime.
pub struct Runtime<G: LiveGame> {
    inner: Arc<Inner<G>>,
    /// The pulse task, taken by the shutdown.
    driver: Arc<AsyncMutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl<G: LiveGame> Clone for Runtime<G> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            driver: Arc::clone(&self.driver),
        }
    }
}

impl<G: LiveGame> std::fmt::Debug for Runtime<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("shard_id", &self.inner.config.shard_id)
            .field("copies", &self.inner.copies.len())
            .finish_non_exhaustive()
    }
}

/// What a new login brings to the runtime.
#[derive(Debug, Clone, Default)]
pub struct SessionStart {
    /// The session's token (1 to 256 bytes); `None`: the runtime makes one. A token names one
    /// connection: a login under the token that already plays the character is refused
    /// ([`LiveError::InvalidSession`]), and [`Runtime::detach`] takes it to tell a closed
    /// connection from the one that replaced it.
    pub token: Option<String>,
}

impl SessionStart {
    /// The session's token: the game's, checked, or a new one.
    pub(crate) fn token(self) -> Result<String, LiveError> {
        let max = crate::retry::job::MAX_LABEL_BYTES;
        match self.token {
            Some(token) if token.is_empty() || token.len() > max => Err(LiveError::InvalidSession(
                format!("a session token must be 1 to {max} bytes"),
            )),
            Some(token) => Ok(token),
            None => Ok(Uuid::now_v7().simple().to_string()),
        }
    }
}

fn check_shard_id(id: &str) -> Result<(), StartError> {
    let fine = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if fine {
        Ok(())
    } else {
        Err(StartError::ShardId)
    }
}

impl<G: LiveGame> Runtime<G> {
    /// Starts a runtime for `game` over the handles of `services` (whose model must be the
    /// game's): its saver, placement writer and pulse run until [`Runtime::shutdown`] (or
    /// [`Runtime::kill`]). Must run inside a tokio runtime. Its first login, arrival or creation
    /// checks the stores' schema ([`Runtime::schema_current`]).
    pub fn start(
        services: &crate::Services,
        game: G,
        config: LiveConfig,
    ) -> Result<Self, StartError> {
        check_shard_id(&config.shard_id)?;
        config.cadence.validate(CHECKPOINT_TTL.duration())?;
        let cancel = CancellationToken::new();
        // Unbounded: one answer per save at most, and a lost one would strand a logout save.
        let (events_tx, events_rx) = mpsc::unbounded_channel::<SaverEvent>();
        let copies = Arc::new(copies::Copies::default());
        let finals = Arc::new(finals::Finals::default());
        let feedback = Arc::new(driver::Feedback::new(
            events_tx,
            Arc::clone(&copies),
            Arc::clone(&finals),
        ));
        let saver = Saver::spawn(
            SaverSinks {
                rows: Some(services.characters.clone()),
                checkpoints: Some(services.checkpoints.clone()),
                retry: Some(services.retry.clone()),
            },
            feedback,
            config.saver,
            cancel.child_token(),
        );
        let placement = PlacementWriter::spawn(
            Some(services.placement.clone()),
            4096,
            config.io_timeout,
            cancel.child_token(),
        );
        let auditor = crate::audit::Auditor::spawn(
            services.audit.clone(),
            crate::audit::AuditorConfig::default(),
            cancel.child_token(),
        );
        let (events, _) = broadcast::channel(1024);
        let transit = Transit::new(
            services.coord.clone(),
            services.loader.clone(),
            services.retry.clone(),
            config.handoff_ttl,
            config.session_ttl,
        );
        let schema_bound = config.io_timeout;
        let inner = Arc::new(Inner {
            game,
            periods: config.cadence.periods(),
            config,
            stores: Stores {
                characters: services.characters.clone(),
                checkpoints: services.checkpoints.clone(),
                loader: services.loader.clone(),
                coord: services.coord.clone(),
                retry: services.retry.clone(),
                journal: services.journal.clone(),
                transit,
            },
            saver,
            placement,
            auditor,
            copies,
            sessions: ActiveSessions::default(),
            finals,
            closes: Arc::default(),
            handoffs: Arc::default(),
            transfers: items::Transfers::default(),
            events,
            background: Background {
                tasks: tokio_util::task::TaskTracker::new(),
                cancel: cancel.clone(),
            },
            cancel,
            pulse_clock: std::sync::Mutex::new((0, tokio::time::Instant::now())),
            exporting: std::sync::atomic::AtomicBool::new(false),
            closing: std::sync::atomic::AtomicBool::new(false),
            schema: SchemaGate {
                stores: services.stores.clone(),
                current: tokio::sync::OnceCell::new(),
                io_timeout: schema_bound,
            },
        });
        let task = tokio::spawn(driver::run(Arc::clone(&inner), events_rx));
        Ok(Self {
            inner,
            driver: Arc::new(AsyncMutex::new(Some(task))),
        })
    }

    /// This shard's id.
    pub fn shard_id(&self) -> &str {
        &self.inner.config.shard_id
    }

    /// The game.
    pub fn game(&self) -> &G {
        &self.inner.game
    }

    /// The saver (its counters and crash-window measures).
    pub fn saver(&self) -> &Saver {
        &self.inner.saver
    }

    /// Runs one pulse now: deferred logout saves offered, the copies due on the cadences dumped
    /// and queued, link-dead graces checked, session records refreshed. Never waits on I/O. A
    /// runtime started with `own_pulse` does this on its own timer; one without waits for the
    /// game's tick to call it. Each call is the next pulse, or, when it comes two or more
    /// pulses after the last one stood, stands in for the pulses it missed (up to four; a
    /// longer gap stretches the cadences by the rest). A tick faster than the pulse banks no
    /// time.
    pub fn pulse(&self) {
        driver::pulse(&self.inner);
    }

    /// What the runtime tells the game: evictions, link-dead logouts.
    pub fn subscribe(&self) -> broadcast::Receiver<LiveEvent> {
        self.inner.events.subscribe()
    }

    /// The copy of `character_id` held here, if any.
    pub fn copy_of(&self, character_id: Uuid) -> Option<CopyId> {
        self.inner.copies.current(character_id)
    }

    /// Every copy held here.
    pub fn copies(&self) -> Vec<CopyId> {
        self.inner.copies.ids()
    }

    /// Reads the live character of `copy` (`f` runs under the registry's lock: it must not call
    /// the runtime).
    pub fn read<T>(
        &self,
        copy: CopyId,
        f: impl FnOnce(&G::Character) -> T,
    ) -> Result<T, LiveError> {
        self.inner
            .copies
            .with(copy, |c| f(&c.character))
            .ok_or(LiveError::Gone(copy))
    }

    /// Changes the live character of `copy` (play). The cadences carry the change to the
    /// stores; a change that must be durable before the player hears of it is a
    /// [`Runtime::grant`]. A copy leaving for another shard takes no change
    /// ([`LiveError::Gone`]). `f` runs under the registry's lock: it must not call the runtime.
    pub fn update<T>(
        &self,
        copy: CopyId,
        f: impl FnOnce(&mut G::Character) -> T,
    ) -> Result<T, LiveError> {
        self.inner
            .copies
            .with_active(copy, |c| f(&mut c.character))
            .ok_or(LiveError::Gone(copy))
    }

    /// Moves `copy`'s durable anchor (the zone and room it is saved at); `None` zone keeps the
    /// stored one (an instance). A change of zone rewrites the copy's placement, so a login
    /// routed by it finds the zone the copy is in.
    pub fn set_anchor(&self, copy: CopyId, anchor: Anchor) -> Result<(), LiveError> {
        let inner = &self.inner;
        inner
            .copies
            .with_active(copy, |c| {
                if c.move_to(anchor) {
                    sessions::placed(inner, copy, c.zone.clone());
                }
            })
            .ok_or(LiveError::Gone(copy))
    }

    /// True while an item transfer of `character_id` is in flight here (its copy's logout,
    /// handoff and saves wait for it to answer).
    pub fn in_transfer(&self, character_id: Uuid) -> bool {
        self.inner.transfers.busy(character_id)
    }

    /// Writes the placement of every copy held here again (a repair after a Redis outage: the
    /// records are fenced by epoch, so a stale one never wins). The pulse also rewrites each
    /// attached copy's placement with every thirty-second refresh of its session records, and at
    /// its next refresh when a write of them failed or was dropped or a refresh finds them lost.
    pub fn refresh_placements(&self) {
        for copy in self.inner.copies.ids() {
            sessions::place(&self.inner, copy);
        }
    }

    /// Waits, at most `bound`, until the placement records queued so far are written.
    pub async fn placement_barrier(&self, bound: Duration) -> crate::drain::BarrierOutcome {
        self.inner.placement.barrier(bound).await
    }

    /// The character's name, as its row holds it.
    pub fn name(&self, copy: CopyId) -> Result<String, LiveError> {
        self.inner
            .copies
            .with(copy, |c| c.name.clone())
            .ok_or(LiveError::Gone(copy))
    }

    /// Where `copy` is anchored, and the row version it holds.
    pub fn anchor(&self, copy: CopyId) -> Result<(Anchor, i64), LiveError> {
        self.inner
            .copies
            .with(copy, |c| (c.anchor.clone(), c.version))
            .ok_or(LiveError::Gone(copy))
    }

    /// Records `event` on the audit trail (batched in the background, drained at shutdown; a
    /// full queue drops it, counted). False when dropped.
    pub fn audit(&self, event: crate::audit::AuditEvent) -> bool {
        self.inner.auditor.emit(event)
    }

    /// Creates a character named `name` for `account_id`, anchored at `anchor`, with the game's
    /// fresh state ([`LiveGame::fresh`]), and records its creation on the audit trail; its id. A
    /// name is unique without regard to case ([`crate::character::StoreError::NameTaken`]).
    pub async fn create(
        &self,
        name: &str,
        account_id: Uuid,
        anchor: Anchor,
    ) -> Result<Uuid, LiveError> {
        self.create_with(name, account_id, anchor, None).await
    }

    /// [`Runtime::create`], with character-creation input (`chargen`) stored beside the new
    /// character's document: the game applies it when it lands the character on its first
    /// spawn ([`LiveGame::land`], which says why only then). A first spawn is the first login
    /// of a character never placed: create it with an anchor without a zone.
    pub async fn create_with(
        &self,
        name: &str,
        account_id: Uuid,
        anchor: Anchor,
        chargen: Option<serde_json::Value>,
    ) -> Result<Uuid, LiveError> {
        self.schema_current().await?;
        let game = &self.inner.game;
        let state = game.dump(&game.fresh()).map_err(LiveError::Game)?;
        let new = crate::character::NewCharacter {
            character_id: Uuid::now_v7(),
            account_id,
            name: name.to_owned(),
            zone_ref: anchor.zone_ref,
            room_ref: anchor.room_ref,
            state,
            chargen,
            schema_version: game.model().schema_version(),
        };
        self.inner.stores.characters.create(&new).await?;
        self.audit(crate::audit::AuditEvent::created(
            crate::audit::SubjectType::Character,
            new.character_id,
            None,
            serde_json::json!({ "name": new.name, "shard": self.inner.config.shard_id }),
        ));
        Ok(new.character_id)
    }

    /// The id of the character named `name` (any case), created first (for `account_id`, at
    /// `anchor`, as [`Runtime::create`] does) when there is none. Two calls racing for a new
    /// name both get the one character.
    pub async fn find_or_create(
        &self,
        name: &str,
        account_id: Uuid,
        anchor: Anchor,
    ) -> Result<Uuid, LiveError> {
        if let Some(id) = self.find(name).await? {
            return Ok(id);
        }
        match self.create(name, account_id, anchor).await {
            Err(LiveError::Store(crate::character::StoreError::NameTaken(_))) => self
                .find(name)
                .await?
                .ok_or_else(|| LiveError::Game(format!("{name:?} was taken and is gone"))),
            created => created,
        }
    }

    /// Checks (once it is so, then never again) that the stores hold every migration of this
    /// build: a runtime started over services a game built itself ([`Runtime::start`]) refuses
    /// to claim or create anything on an older schema, which it would misread
    /// ([`LiveError::SchemaBehind`]). Logins, arrivals and creations call it themselves.
    pub async fn schema_current(&self) -> Result<(), LiveError> {
        self.inner.schema.check().await
    }

    /// The id of the character named `name` (any case), if there is one.
    pub async fn find(&self, name: &str) -> Result<Option<Uuid>, LiveError> {
        let row = self.inner.stores.characters.load_by_name(name).await?;
        Ok(row.map(|r| r.character_id))
    }

    /// Stops everything at once without saving (a crash, for tests and the simulator): every
    /// copy held here is abandoned, as a killed process abandons them, and the writes it had
    /// in the background stop where they stand (what already reached a store stays there).
    pub fn kill(&self) {
        self.inner.cancel.cancel();
        self.inner.saver.abort();
        self.inner.placement.abort();
        self.inner.auditor.abort();
    }
}
