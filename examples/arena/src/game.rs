//! The shard's game: who is online, what each command does, and how each write reaches the
//! durable tiers through shardkeep — the saver ladder for cadences and logouts, a direct CAS
//! save (or a retry job when it conflicts) for loot, the journal when a stream closes, the
//! audit trail for grants, and handoffs between shards.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::Utc;
use shardkeep::audit::{AuditEvent, Auditor, SubjectType};
use shardkeep::character::{
    CharacterSnapshot, HandoffPayload, LoadError, NewCharacter, SaveOutcome,
};
use shardkeep::coord::HandoffTake;
use shardkeep::journal::{
    PlayerSnapshot, RealtimeRuntimeProfile, RealtimeStreamCleanup, SessionLifecycleEffectPlan,
};
use shardkeep::retry::{IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload};
use shardkeep::saver::{SaveFeedback, SaveReason, Saver, SaverEvent};
use shardkeep::{HandoffScope, Services, Ttl};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::model::{ArenaEffect, Fighter, Release};

/// The one room every fighter stands in.
const ROOM: &str = "pit";
/// How long a logout or `save` waits for its write.
const SAVE_WAIT: Duration = Duration::from_secs(15);

/// A fighter online on this shard.
#[derive(Debug, Clone)]
struct Online {
    /// The row as loaded, kept at the latest known version.
    base: CharacterSnapshot,
    fighter: Fighter,
    /// This copy's issue sequence: loot issued up to it is in `fighter`.
    issued: u64,
    session: String,
}

impl Online {
    fn dump(&self, release: Release) -> CharacterSnapshot {
        CharacterSnapshot {
            state: release.write(&self.fighter),
            issue_mark: self.issued,
            schema_version: release.version(),
            ..self.base.clone()
        }
    }
}

/// Who waits for a logout's final save, by character and the epoch of the copy that logged out:
/// only that copy's own final `Saved` (a cadence flush landing meanwhile is not it), or any
/// terminal answer about that copy.
type Waiters = HashMap<(Uuid, i64), Vec<oneshot::Sender<SaverEvent>>>;

/// The shard's state, shared by every connection and the cadence task.
pub(crate) struct Game {
    /// This shard's name (its zone).
    pub shard: String,
    release: Release,
    services: Services,
    saver: Saver,
    auditor: Auditor,
    online: Arc<Mutex<HashMap<Uuid, Online>>>,
    waiters: Arc<Mutex<Waiters>>,
    peers: HashMap<String, String>,
}

/// The saver's answers, applied to the online fighters.
pub(crate) struct Feedback {
    online: Arc<Mutex<HashMap<Uuid, Online>>>,
    waiters: Arc<Mutex<Waiters>>,
    resave: tokio::sync::mpsc::UnboundedSender<Uuid>,
}

impl SaveFeedback for Feedback {
    fn deliver(&self, event: SaverEvent) {
        let id = event.character_id();
        let epoch = event.owner_epoch();
        // Only the session whose copy dumped the snapshot hears about it: a late event of an
        // earlier session of the same character (a disconnect's final save landing after a
        // fresh login) neither moves nor evicts the new copy, nor answers its logout.
        let mut online = self.online.lock().unwrap_or_else(PoisonError::into_inner);
        let this_copy = online.get_mut(&id).filter(|o| o.base.owner_epoch == epoch);
        let answers_logout = match &event {
            SaverEvent::Saved {
                new_version,
                reason,
                ..
            } => {
                if let Some(o) = this_copy {
                    o.base.state_version = o.base.state_version.max(*new_version);
                }
                *reason == SaveReason::Final
            }
            SaverEvent::FlushConflict {
                current_version, ..
            } => {
                // The row moved (a loot job landed): this copy holds everything it issued, so it
                // re-dumps over the row at the row's version.
                if let Some(o) = this_copy {
                    o.base.state_version = *current_version;
                    let _ = self.resave.send(id);
                }
                false
            }
            SaverEvent::OwnershipLost { .. }
            | SaverEvent::DoubleOwn { .. }
            | SaverEvent::SchemaOutdated { .. } => {
                if this_copy.is_some() {
                    tracing::warn!(event = "arena_evicted", character = %id, ?event);
                    online.remove(&id);
                }
                true
            }
            SaverEvent::FinalQueuedAsJob { .. }
            | SaverEvent::FinalDropped { .. }
            | SaverEvent::NotFound { .. } => true,
        };
        drop(online);
        if !answers_logout {
            return;
        }
        let waiting = self
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(id, epoch));
        for waiter in waiting.into_iter().flatten() {
            let _ = waiter.send(event.clone());
        }
    }

    fn is_present(&self, character_id: Uuid) -> bool {
        self.online
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(&character_id)
    }
}

/// What the saver's feedback needs, made before the saver.
pub(crate) struct FeedbackParts {
    online: Arc<Mutex<HashMap<Uuid, Online>>>,
    waiters: Arc<Mutex<Waiters>>,
}

impl FeedbackParts {
    /// New, empty.
    pub(crate) fn new() -> Self {
        Self {
            online: Arc::default(),
            waiters: Arc::default(),
        }
    }

    /// The feedback for the saver; `resave` receives characters to flush again.
    pub(crate) fn feedback(
        &self,
        resave: tokio::sync::mpsc::UnboundedSender<Uuid>,
    ) -> Arc<Feedback> {
        Arc::new(Feedback {
            online: Arc::clone(&self.online),
            waiters: Arc::clone(&self.waiters),
            resave,
        })
    }
}

impl Default for FeedbackParts {
    fn default() -> Self {
        Self::new()
    }
}

/// A command's answer: the reply line, and whether the connection ends.
pub(crate) struct Reply {
    /// The line sent back.
    pub line: String,
    /// True when the session is over.
    pub close: bool,
}

fn reply(line: impl Into<String>) -> Reply {
    Reply {
        line: line.into(),
        close: false,
    }
}

impl Game {
    /// The game over built services and a running saver and auditor.
    pub(crate) fn new(
        shard: String,
        release: Release,
        services: Services,
        saver: Saver,
        auditor: Auditor,
        parts: FeedbackParts,
        peers: HashMap<String, String>,
    ) -> Self {
        Self {
            shard,
            release,
            services,
            saver,
            auditor,
            online: parts.online,
            waiters: parts.waiters,
            peers,
        }
    }

    fn with_online<T>(&self, f: impl FnOnce(&mut HashMap<Uuid, Online>) -> T) -> T {
        f(&mut self.online.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Queues every online fighter's dump for `reason` (the cadence task calls it).
    pub(crate) fn save_all(&self, reason: SaveReason) {
        let dumps: Vec<CharacterSnapshot> =
            self.with_online(|online| online.values().map(|o| o.dump(self.release)).collect());
        if !dumps.is_empty() {
            self.saver.enqueue_many(reason, dumps);
        }
    }

    /// Flushes one fighter again (after a conflict).
    pub(crate) fn save_one(&self, id: Uuid, reason: SaveReason) {
        if let Some(dump) = self.with_online(|online| online.get(&id).map(|o| o.dump(self.release)))
        {
            self.saver.enqueue(reason, dump);
        }
    }

    /// Runs one command line for the session holding `current` (the logged-in character).
    pub(crate) async fn command(&self, current: &mut Option<Uuid>, line: &str) -> Reply {
        let mut words = line.split_whitespace();
        let verb = words.next().unwrap_or_default();
        let arg = words.next();
        if words.next().is_some() {
            return reply("error too many words");
        }
        match (verb, arg, *current) {
            ("login", Some(name), None) => self.login(current, name).await,
            ("arrive", Some(token), None) => self.arrive(current, token).await,
            ("login" | "arrive", _, Some(_)) => reply("error already playing"),
            ("fight", None, Some(id)) => self.fight(id),
            ("loot", Some(item), Some(id)) => self.loot(id, item).await,
            ("look", None, Some(id)) => self.look(id),
            ("save", None, Some(id)) => self.save(id).await,
            ("travel", Some(shard), Some(id)) => self.travel(current, id, shard).await,
            ("quit", None, Some(id)) => self.quit(current, id).await,
            ("quit", None, None) => Reply {
                line: "bye".into(),
                close: true,
            },
            (_, _, None) if !verb.is_empty() => reply("error log in first: login <name>"),
            _ => reply("error unknown command"),
        }
    }

    async fn login(&self, current: &mut Option<Uuid>, name: &str) -> Reply {
        let store = &self.services.characters;
        let existing = match store.load_by_name(name).await {
            Ok(found) => found,
            Err(err) => return reply(format!("error {err}")),
        };
        let id = match existing {
            Some(row) => row.character_id,
            None => {
                let new = NewCharacter {
                    character_id: Uuid::now_v7(),
                    account_id: Uuid::now_v7(),
                    name: name.to_owned(),
                    zone_ref: Some(self.shard.clone()),
                    room_ref: Some(ROOM.into()),
                    state: self.release.write(&Fighter::fresh()),
                    chargen: None,
                    schema_version: self.release.version(),
                };
                if let Err(err) = store.create(&new).await {
                    return reply(format!("error {err}"));
                }
                self.auditor.emit(AuditEvent::created(
                    SubjectType::Character,
                    new.character_id,
                    None,
                    serde_json::json!({ "name": name, "shard": self.shard }),
                ));
                new.character_id
            }
        };
        match self.services.loader.claim_and_load(id, 0).await {
            Ok(loaded) => self.admit(current, loaded.snapshot, "ok"),
            Err(LoadError::Store { source, .. }) => reply(format!("error {source}")),
            Err(err) => reply(format!("error {err}")),
        }
    }

    fn admit(&self, current: &mut Option<Uuid>, snapshot: CharacterSnapshot, word: &str) -> Reply {
        let fighter = match self.release.read(&snapshot.state) {
            Ok(fighter) => fighter,
            Err(err) => return reply(format!("error unreadable character: {err}")),
        };
        let id = snapshot.character_id;
        let name = snapshot.name.clone();
        let online = Online {
            base: CharacterSnapshot {
                zone_ref: Some(self.shard.clone()),
                room_ref: Some(ROOM.into()),
                ..snapshot
            },
            fighter,
            issued: 0,
            session: Uuid::now_v7().to_string(),
        };
        let line = format!("{word} {name} {}", online.fighter.describe());
        self.with_online(|all| all.insert(id, online));
        *current = Some(id);
        reply(line)
    }

    fn fight(&self, id: Uuid) -> Reply {
        self.with_online(|online| match online.get_mut(&id) {
            Some(o) => {
                o.fighter.xp += 10;
                o.fighter.hp = (o.fighter.hp - 1).max(1);
                reply(format!("ok fight xp={}", o.fighter.xp))
            }
            None => evicted(),
        })
    }

    fn look(&self, id: Uuid) -> Reply {
        self.with_online(|online| match online.get(&id) {
            Some(o) => reply(format!("ok {}", o.fighter.describe())),
            None => evicted(),
        })
    }

    /// Loot is granted in memory first, then written at once: a direct CAS save of the copy's
    /// dump (which holds it). When the row has moved on, the grant goes down as a retry job
    /// keyed by this copy's epoch and issue sequence, which never grants it twice. Either way
    /// it is durable before the player hears of it.
    async fn loot(&self, id: Uuid, item: &str) -> Reply {
        let effect = ArenaEffect::Loot {
            money: 5,
            item: item.to_owned(),
        };
        let payload = match PersistenceRetryPayload::effect(id, &effect) {
            Ok(payload) => payload,
            Err(err) => return reply(format!("error {err}")),
        };
        let issued = self.with_online(|online| {
            let o = online.get_mut(&id)?;
            o.fighter.money += 5;
            *o.fighter.bag.entry(item.to_owned()).or_default() += 1;
            o.issued += 1;
            Some((o.dump(self.release), o.issued, o.session.clone()))
        });
        let Some((dump, seq, session)) = issued else {
            return evicted();
        };
        let key = format!("loot:{id}:{}:{seq}", dump.owner_epoch);
        self.auditor.emit(AuditEvent::attribute(
            id,
            &key,
            serde_json::json!({ "item": item, "money": 5 }),
        ));
        match self.services.characters.save(&dump).await {
            Ok(SaveOutcome::Saved(version)) => {
                self.adopt_version(id, version);
                reply(format!(
                    "saved loot {item} money={}",
                    money_of(&dump, self.release)
                ))
            }
            Ok(SaveOutcome::OwnershipLost(_) | SaveOutcome::SchemaOutdated(_)) => {
                self.with_online(|online| online.remove(&id));
                evicted()
            }
            Ok(SaveOutcome::VersionConflict(_) | SaveOutcome::NotFound) | Err(_) => {
                let envelope = IdempotencyEnvelope {
                    idempotency_key: key,
                    owner_epoch: dump.owner_epoch,
                    origin: Origin::CombatRewards,
                    issued_at: Utc::now(),
                    issue_seq: seq,
                };
                let job = PersistenceRetryJob::new(payload, envelope, "arena", Some(session));
                match job {
                    Ok(job) => match self.services.retry.enqueue(&job).await {
                        Ok(_) => reply(format!(
                            "queued loot {item} money={}",
                            money_of(&dump, self.release)
                        )),
                        Err(err) => reply(format!("error loot not stored: {err}")),
                    },
                    Err(err) => reply(format!("error {err}")),
                }
            }
        }
    }

    /// Saves the copy now with a direct CAS save, rebasing over rows that moved (this copy
    /// holds everything it issued), and answers with what landed.
    async fn save(&self, id: Uuid) -> Reply {
        for _ in 0..3 {
            let Some((dump, xp)) = self.with_online(|online| {
                online
                    .get(&id)
                    .map(|o| (o.dump(self.release), o.fighter.xp))
            }) else {
                return evicted();
            };
            match self.services.characters.save(&dump).await {
                Ok(SaveOutcome::Saved(version)) => {
                    self.adopt_version(id, version);
                    return reply(format!("saved xp={xp}"));
                }
                Ok(SaveOutcome::VersionConflict(current)) => self.adopt_version(id, current),
                Ok(other) => return reply(format!("error save refused: {other:?}")),
                Err(err) => return reply(format!("error {err}")),
            }
        }
        reply("error save lost the version race three times")
    }

    fn adopt_version(&self, id: Uuid, version: i64) {
        self.with_online(|online| {
            if let Some(o) = online.get_mut(&id) {
                o.base.state_version = o.base.state_version.max(version);
            }
        });
    }

    fn wait_for(&self, id: Uuid, owner_epoch: i64) -> oneshot::Receiver<SaverEvent> {
        let (tx, rx) = oneshot::channel();
        self.waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((id, owner_epoch))
            .or_default()
            .push(tx);
        rx
    }

    /// Hands the fighter to `shard`: the dump goes to Redis under a fresh token, the copy
    /// leaves this shard, and the client presents the token to the other shard.
    async fn travel(&self, current: &mut Option<Uuid>, id: Uuid, shard: &str) -> Reply {
        let Some(address) = self.peers.get(shard).cloned() else {
            return reply(format!("error no route to shard {shard}"));
        };
        let Some(online) = self.with_online(|online| online.remove(&id)) else {
            return evicted();
        };
        let mut snapshot = online.dump(self.release);
        snapshot.zone_ref = Some(shard.to_owned());
        let payload = HandoffPayload::new(snapshot);
        let token = Uuid::now_v7().to_string();
        let stored = match payload.encode() {
            Ok(bytes) => {
                self.services
                    .coord
                    .handoff_put(
                        &token,
                        &HandoffScope::Placement(shard.to_owned()),
                        &bytes,
                        Ttl::from_static_secs(120),
                    )
                    .await
            }
            Err(err) => return reply(format!("error {err}")),
        };
        if let Err(err) = stored {
            self.with_online(|all| all.insert(id, online));
            return reply(format!("error handoff not stored: {err}"));
        }
        self.close_stream(&online, SessionLifecycleEffectPlan::ConfirmedTransfer);
        *current = None;
        Reply {
            line: format!("travel {token} {address}"),
            close: true,
        }
    }

    async fn arrive(&self, current: &mut Option<Uuid>, token: &str) -> Reply {
        let scope = [HandoffScope::Placement(self.shard.clone())];
        let taken = match self.services.coord.handoff_take(token, &scope).await {
            Ok(HandoffTake::Taken { payload, .. }) => payload,
            Ok(other) => return reply(format!("error no handoff: {other:?}")),
            Err(err) => return reply(format!("error {err}")),
        };
        let carried = match HandoffPayload::decode(&taken) {
            Ok(carried) => carried,
            Err(err) => return reply(format!("error {err}")),
        };
        match self
            .services
            .loader
            .claim_for_handoff(carried, token, 0)
            .await
        {
            Ok(load) => self.admit(current, load.into_loaded().snapshot, "ok arrived"),
            Err(err) => reply(format!("error {err}")),
        }
    }

    /// Logout: the final save (the saver rebases it over a conflict, and makes it a retry job
    /// through an outage), then the journal entry for the closed stream.
    async fn quit(&self, current: &mut Option<Uuid>, id: Uuid) -> Reply {
        let Some(online) = self.with_online(|online| online.remove(&id)) else {
            return evicted();
        };
        *current = None;
        let waiter = self.wait_for(id, online.base.owner_epoch);
        self.saver
            .enqueue(SaveReason::Final, online.dump(self.release));
        let saved = tokio::time::timeout(SAVE_WAIT, waiter).await;
        self.close_stream(&online, SessionLifecycleEffectPlan::PermanentRemoval);
        let line = match saved {
            Ok(Ok(SaverEvent::Saved { .. })) => "bye saved".to_owned(),
            Ok(Ok(SaverEvent::FinalQueuedAsJob { .. })) => "bye queued".to_owned(),
            other => format!("error final save: {other:?}"),
        };
        Reply { line, close: true }
    }

    /// The connection dropped without `quit`: save what the copy holds, keep the resume
    /// ledger for a reconnect.
    pub(crate) fn disconnected(&self, id: Uuid) {
        if let Some(online) = self.with_online(|online| online.remove(&id)) {
            self.saver
                .enqueue(SaveReason::Final, online.dump(self.release));
            self.close_stream(&online, SessionLifecycleEffectPlan::Reconnectable);
        }
    }

    /// Journals the closed stream (durably, in Redis) for the journal worker's cleanup, in the
    /// background.
    fn close_stream(&self, online: &Online, plan: SessionLifecycleEffectPlan) {
        let cleanup = self.stream_cleanup(online, plan);
        let journal = self.services.journal.clone();
        tokio::spawn(async move {
            if let Err(err) = journal.append(cleanup).await {
                tracing::warn!(event = "arena_journal_failed", error = %err);
            }
        });
    }

    /// The journal entry for `online`'s closed stream.
    fn stream_cleanup(
        &self,
        online: &Online,
        plan: SessionLifecycleEffectPlan,
    ) -> RealtimeStreamCleanup {
        RealtimeStreamCleanup {
            session_token: online.session.clone(),
            player: PlayerSnapshot {
                character_id: online.base.character_id,
                account_id: online.base.account_id,
                character_name: online.base.name.clone(),
                shard_id: self.shard.clone(),
                zone: self.shard.clone(),
                room: ROOM.into(),
                owner_epoch: online.base.owner_epoch,
                state_version: Some(online.base.state_version),
            },
            runtime_profile: RealtimeRuntimeProfile {
                transport: "tcp".into(),
                protocol_version: 1,
                tick_rate_hz: 1,
            },
            pending_resume: None,
            transfer_confirmed: plan == SessionLifecycleEffectPlan::ConfirmedTransfer,
            plan,
            closed_at: Utc::now(),
        }
    }

    /// Shutdown: every fighter's final save and the journal entry for its closed stream (a
    /// reconnect may resume it), then the saver's and the auditor's barriers. Returns how many
    /// journal entries were written, and how many could not be within `bound` (their cleanup
    /// then waits for the keyspace's TTLs).
    pub(crate) async fn shutdown(&self, bound: Duration) -> (usize, usize) {
        let leaving: Vec<Online> =
            self.with_online(|online| online.drain().map(|(_, o)| o).collect());
        for online in &leaving {
            self.saver
                .enqueue(SaveReason::Final, online.dump(self.release));
        }
        let deadline = tokio::time::Instant::now() + bound;
        let mut unjournaled = 0;
        for online in &leaving {
            let entry = self.stream_cleanup(online, SessionLifecycleEffectPlan::Reconnectable);
            let written =
                tokio::time::timeout_at(deadline, self.services.journal.append(entry)).await;
            if !matches!(written, Ok(Ok(_))) {
                unjournaled += 1;
            }
        }
        if unjournaled > 0 {
            tracing::warn!(
                event = "arena_journal_failed",
                count = unjournaled,
                "at shutdown"
            );
        }
        let _ = self.saver.barrier(bound).await;
        let _ = self.auditor.barrier(bound).await;
        (leaving.len() - unjournaled, unjournaled)
    }
}

fn money_of(dump: &CharacterSnapshot, release: Release) -> i64 {
    release.read(&dump.state).map_or(0, |f| f.money)
}

fn evicted() -> Reply {
    Reply {
        line: "error this copy was replaced; log in again".into(),
        close: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn online(id: Uuid, epoch: i64) -> Online {
        Online {
            base: CharacterSnapshot {
                character_id: id,
                account_id: Uuid::nil(),
                name: "Aria".into(),
                zone_ref: None,
                room_ref: None,
                state: serde_json::json!({}).into(),
                chargen: None,
                state_version: 4,
                owner_epoch: epoch,
                issue_mark: 0,
                schema_version: 2,
            },
            fighter: Fighter::fresh(),
            issued: 0,
            session: "s".into(),
        }
    }

    #[test]
    fn a_late_event_of_an_earlier_session_neither_moves_evicts_nor_answers_the_new_one() {
        let parts = FeedbackParts::new();
        let (resave, mut resaves) = tokio::sync::mpsc::unbounded_channel();
        let feedback = parts.feedback(resave);
        let id = Uuid::now_v7();
        // The player disconnected from the copy at epoch 3 and logged in again: epoch 4.
        parts.online.lock().unwrap().insert(id, online(id, 4));
        let (tx, mut logout) = oneshot::channel();
        parts.waiters.lock().unwrap().insert((id, 4), vec![tx]);
        for late in [
            SaverEvent::Saved {
                character_id: id,
                owner_epoch: 3,
                reason: SaveReason::Final,
                dumped_version: 4,
                new_version: 9,
            },
            SaverEvent::FlushConflict {
                character_id: id,
                owner_epoch: 3,
                current_version: 9,
            },
            SaverEvent::SchemaOutdated {
                character_id: id,
                owner_epoch: 3,
                stored_schema: 3,
            },
            SaverEvent::FinalDropped {
                character_id: id,
                owner_epoch: 3,
            },
        ] {
            feedback.deliver(late);
        }
        let held = parts.online.lock().unwrap().get(&id).cloned();
        assert_eq!(
            held.map(|o| o.base.state_version),
            Some(4),
            "still online, unmoved"
        );
        assert!(resaves.try_recv().is_err(), "no re-save of the new copy");
        assert!(
            logout.try_recv().is_err(),
            "the new session's logout is not answered"
        );
        // Its own final save answers it.
        feedback.deliver(SaverEvent::Saved {
            character_id: id,
            owner_epoch: 4,
            reason: SaveReason::Final,
            dumped_version: 4,
            new_version: 5,
        });
        assert!(matches!(
            logout.try_recv(),
            Ok(SaverEvent::Saved { new_version: 5, .. })
        ));
    }
}
