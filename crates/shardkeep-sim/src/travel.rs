//! The I/O of the players' comings and goings, run as tasks beside the shard hosts: logins
//! through the gate, claims, cross-shard handoffs, session markers, retry jobs, and stream
//! cleanup through the journal. Results go back to the hosts as messages.
//!
//! Every step that must not be lost retries until it succeeds (a store outage only delays it):
//! the handoff payload, the claim of a taken handoff, and the journal append of a closed stream.
//! A handoff's steps are the library's ([`shardkeep::live::Transit`], as the live runtime runs
//! them); this file keeps their retries, I/O permits and counters.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use uuid::Uuid;

use super::agent::Agent;
use super::claims::{ClaimRecord, HandoffClaimRecord};
use super::inbound::Inbound;
use super::order_checks::SessionEvent;
use super::world::{World, bump};
use shardkeep::character::{CharacterSnapshot, HandoffLoad, HandoffPayload};
use shardkeep::coord::{OrderCheck, PresenceRecord, SessionOrder};
use shardkeep::journal::{
    ActiveSession, PlayerSnapshot, RealtimeRuntimeProfile, RealtimeStreamCleanup,
    SessionLifecycleEffectPlan, cleanup_stream,
};
use shardkeep::live::Transit;
use shardkeep::live::transit::{Activation, SendError, Taken};
use shardkeep::retry::{
    EnqueueOutcome, IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload,
};
use shardkeep::ttl::Ttl;
use shardkeep_reference::shard::gate::route_login;

/// Pause between attempts of a step that must not be lost.
const RETRY_PAUSE: Duration = Duration::from_millis(250);
/// Bound on one store call.
const IO_BOUND: Duration = Duration::from_secs(3);
/// Lifetime of a handoff payload.
pub(super) const HANDOFF_TTL: Ttl = Ttl::from_static_secs(120);
/// Lifetime of session markers and presence records.
pub(super) const SESSION_TTL: Ttl = Ttl::from_static_secs(120);

async fn pause(world: &World) -> bool {
    tokio::select! {
        () = world.halt.cancelled() => false,
        () = tokio::time::sleep(RETRY_PAUSE) => true,
    }
}

/// Sends `message` to `shard`'s host; when it has none the agent goes back to logging in.
pub(super) fn deliver(world: &Arc<World>, shard: &str, message: Inbound) {
    if let Err(message) = world.send(shard, message) {
        undeliverable(world, *message);
    }
}

/// A message whose host is gone: a handoff's transfer will never be activated, and the agent
/// goes back to logging in.
pub(super) fn undeliverable(world: &Arc<World>, message: Inbound) {
    if let Some(token) = message.transfer_token() {
        abandon_transfer(world, token.to_owned());
    }
    if let Some(agent) = message.into_agent() {
        go_offline(world, agent, 500);
    }
}

/// The agent leaves for `after_ms`, then logs in through the gate. A zombie's driver never
/// logs in: it is dropped.
pub(super) fn go_offline(world: &Arc<World>, agent: Agent, after_ms: u64) {
    if agent.ghost {
        return;
    }
    let world = Arc::clone(world);
    tokio::spawn(async move {
        tokio::select! {
            () = world.halt.cancelled() => return world.park(agent),
            () = tokio::time::sleep(Duration::from_millis(after_ms)) => {}
        }
        login(world, agent).await;
    });
}

/// Routes a login through the gate and hands it to the shard that owns the zone.
async fn login(world: Arc<World>, agent: Agent) {
    loop {
        if world.is_settling() || world.halt.is_cancelled() {
            return world.leave_transit(agent);
        }
        let route = tokio::time::timeout(
            IO_BOUND,
            route_login(
                Some(&world.placement),
                &world.store,
                &world.directory,
                agent.character_id,
            ),
        )
        .await;
        match route {
            Ok(Ok(route)) => {
                let shard = route
                    .shard
                    .unwrap_or_else(|| World::shard_id(agent.home_shard));
                let message = Inbound::Login {
                    agent,
                    floor: route.floor,
                    held: route.held,
                };
                return deliver(&world, &shard, message);
            }
            _ => {
                bump(&world.counters.login_retries);
                if !pause(&world).await {
                    return world.leave_transit(agent);
                }
            }
        }
    }
}

/// Claims the character for a login on `shard`; the host admits it, or the player retries.
pub(super) fn claim(world: &Arc<World>, shard: String, agent: Agent, floor: i64) {
    let world = Arc::clone(world);
    tokio::spawn(async move {
        let _permit = world.io.acquire().await;
        let before = world.outage_reading();
        let loaded = world.loader.claim_and_load(agent.character_id, floor).await;
        let steady = world.no_outage_since(before);
        match loaded {
            Ok(loaded) => {
                world.with_ledger(|ledger| {
                    ledger.claims.push(ClaimRecord {
                        character_id: agent.character_id,
                        minted: loaded.snapshot.owner_epoch,
                        handoff: None,
                    });
                    ledger.rewards.loaded(agent.character_id, &loaded);
                    ledger.crash_floors.logged_in(
                        agent.character_id,
                        super::crash_floors::place_of(&loaded.origin),
                        loaded.snapshot.owner_epoch,
                        steady,
                    );
                });
                deliver(&world, &shard, Inbound::Loaded { agent, loaded })
            }
            Err(err) => {
                tracing::debug!(event = "sim_claim_failed", error = %err);
                bump(&world.counters.login_retries);
                go_offline(&world, agent, 500);
            }
        }
    });
}

/// Marks a new session of the copy at `epoch` active and present (best effort; a miss is
/// counted). Its presence write takes the character's session order, so a cleanup of an earlier
/// session arriving later leaves it alone.
pub(super) fn start_session(
    world: &Arc<World>,
    shard: &str,
    agent: &Agent,
    (token, epoch): (&str, i64),
    zone: &str,
) {
    world.sessions.insert(
        token,
        ActiveSession {
            character_id: agent.character_id,
        },
    );
    let world = Arc::clone(world);
    let record = PresenceRecord {
        account_id: agent.account_id.to_string(),
        character_id: agent.character_id.to_string(),
        session_token: token.to_owned(),
        shard_id: shard.to_owned(),
        zone_id: Some(zone.to_owned()),
        expires_at: Utc::now() + chrono::Duration::seconds(120),
    };
    let token = token.to_owned();
    let order = SessionOrder {
        owner_epoch: epoch,
        at: Utc::now(),
        event_id: Uuid::now_v7(),
    };
    world.with_ledger(|ledger| {
        ledger.session_events.push(SessionEvent {
            character_id: agent.character_id,
            order,
            cleanup: false,
        })
    });
    tokio::spawn(async move {
        let _permit = world.io.acquire().await;
        let coord = &world.env.coord;
        let marked = tokio::time::timeout(IO_BOUND, async {
            coord.session_activate(&token, SESSION_TTL).await?;
            coord.presence_put_ordered(&record, &order).await
        })
        .await;
        match marked {
            Ok(Ok(OrderCheck::Current)) => {}
            // A newer session event of the character was already seen (its presence stands).
            Ok(Ok(OrderCheck::Stale)) => bump(&world.counters.session_starts_stale),
            _ => bump(&world.counters.session_marker_failures),
        }
    });
}

/// Appends the cleanup of a closed stream to the journal, retrying until it is durable.
pub(super) fn close_stream(
    world: &Arc<World>,
    token: String,
    player: PlayerSnapshot,
    plan: SessionLifecycleEffectPlan,
) {
    let world = Arc::clone(world);
    // The stream closes now, whenever the append gets to run.
    let closed_at = Utc::now();
    tokio::spawn(async move {
        let pending_resume = (plan == SessionLifecycleEffectPlan::Reconnectable).then(|| {
            shardkeep::coord::ResumeLedgerRecord {
                session_token: token.clone(),
                character_id: player.character_id.to_string(),
                last_applied_seq: 0,
                zone_id: player.zone.clone(),
                recorded_at: Utc::now(),
            }
        });
        let cleanup = RealtimeStreamCleanup {
            session_token: token,
            player,
            runtime_profile: RealtimeRuntimeProfile {
                transport: "sim".into(),
                protocol_version: 1,
                tick_rate_hz: 10,
            },
            pending_resume,
            transfer_confirmed: plan == SessionLifecycleEffectPlan::ConfirmedTransfer,
            plan,
            closed_at,
        };
        loop {
            let outcome = {
                let _permit = world.io.acquire().await;
                cleanup_stream(
                    &world.env.journal,
                    &world.sessions,
                    &world.env.coord,
                    cleanup.clone(),
                )
                .await
            };
            if let Some(entry_id) = outcome.entry_id {
                bump(&world.counters.journal_appended);
                world.with_ledger(|ledger| {
                    ledger.session_events.push(SessionEvent {
                        character_id: cleanup.player.character_id,
                        order: SessionOrder {
                            owner_epoch: cleanup.player.owner_epoch,
                            at: cleanup.closed_at,
                            event_id: entry_id,
                        },
                        cleanup: true,
                    })
                });
                return;
            }
            bump(&world.counters.journal_append_retries);
            if !pause(&world).await {
                bump(&world.counters.journal_appends_abandoned);
                return;
            }
        }
    });
}

/// Enqueues a retry job once (the live copy holds the change either way; the job makes it
/// durable sooner).
pub(super) fn enqueue_job(world: &Arc<World>, job: PersistenceRetryJob) {
    let world = Arc::clone(world);
    tokio::spawn(async move {
        let _permit = world.io.acquire().await;
        match tokio::time::timeout(IO_BOUND, world.env.retry.enqueue(&job)).await {
            Ok(Ok(outcome)) => {
                bump(&world.counters.retry_enqueued);
                if matches!(outcome, EnqueueOutcome::DurableOnly(_)) {
                    bump(&world.counters.retry_durable_only);
                }
            }
            _ => bump(&world.counters.retry_enqueue_failed),
        }
    });
}

/// A retry job from the simulator, issued by the copy at `epoch` as `issue_seq`.
pub(super) fn job(
    payload: Result<PersistenceRetryPayload, String>,
    key: String,
    (epoch, issue_seq): (i64, u64),
    origin: Origin,
    shard: &str,
    session: &str,
) -> Option<PersistenceRetryJob> {
    let envelope = IdempotencyEnvelope {
        idempotency_key: key,
        owner_epoch: epoch,
        origin,
        issued_at: Utc::now(),
        issue_seq,
    };
    PersistenceRetryJob::new(payload.ok()?, envelope, shard, Some(session.to_owned())).ok()
}

/// A character left `source` through an exit into `target`: store the handoff payload (retrying
/// until it is stored), then send the player to the target's host.
pub(super) fn hand_off(
    world: &Arc<World>,
    mut agent: Agent,
    snapshot: CharacterSnapshot,
    target: String,
    old_session: String,
    old_player: PlayerSnapshot,
) {
    let world = Arc::clone(world);
    let token = agent.token("handoff");
    tokio::spawn(async move {
        let payload = HandoffPayload::new(snapshot.clone());
        loop {
            let put = {
                let _permit = world.io.acquire().await;
                tokio::time::timeout(IO_BOUND, world.transit.send(&token, &payload, &target)).await
            };
            match put {
                Ok(Ok(())) => break,
                Ok(Err(SendError::Payload(_))) => return world.leave_transit(agent),
                Ok(Err(SendError::Coordination(_))) | Err(_) => {}
            }
            bump(&world.counters.handoff_retries);
            if !pause(&world).await {
                return world.leave_transit(agent);
            }
        }
        tracing::debug!(event = "sim_transfer_begun", %token, character = %agent.character_id, %target);
        await_activation(&world, agent.character_id, token.clone());
        let message = Inbound::Handoff {
            agent,
            token,
            retained: Box::new(snapshot),
            old_session,
            old_player,
        };
        deliver(&world, &target, message);
    });
}

/// The source side of a transfer after its handoff left: it waits for the destination's
/// activation marker (or for the transfer to stop being pending: a lost handoff ends it) and
/// then completes the transfer, which lets the marker go.
fn await_activation(world: &Arc<World>, character_id: uuid::Uuid, token: String) {
    let world = Arc::clone(world);
    world
        .counters
        .transfers_awaiting
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + HANDOFF_TTL.duration();
        while tokio::time::Instant::now() < deadline && !world.halt.is_cancelled() {
            let seen = {
                let _permit = world.io.acquire().await;
                tokio::time::timeout(IO_BOUND, async {
                    // Activated (the marker, or its durable record when a failover lost the
                    // marker), or ended without one (a handoff that could not arrive).
                    if world.transit.activation(character_id, &token).await? == Activation::Waiting
                    {
                        return Ok::<_, shardkeep::CoordError>(false);
                    }
                    world.transit.complete(&token).await?;
                    Ok(true)
                })
                .await
            };
            if matches!(seen, Ok(Ok(true))) {
                bump(&world.counters.transfers_completed);
                break;
            }
            if !pause(&world).await {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(event = "sim_transfer_unconfirmed", %token);
            }
        }
        world
            .counters
            .transfers_awaiting
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    });
}

/// A handoff that cannot arrive ends its transfer (retrying until Redis answers), so its source
/// stops waiting.
pub(super) fn abandon_transfer(world: &Arc<World>, token: String) {
    let world = Arc::clone(world);
    tokio::spawn(async move {
        loop {
            let ended = {
                let _permit = world.io.acquire().await;
                tokio::time::timeout(IO_BOUND, world.transit.complete(&token)).await
            };
            if matches!(ended, Ok(Ok(()))) || !pause(&world).await {
                return;
            }
        }
    });
}

/// The target side of a handoff: take the payload (once), claim with the carried snapshot
/// (retrying until the claim lands), and give the loaded character to this shard's host. When
/// the take finds the token consumed — an earlier take's reply was lost in an outage — the
/// source's retained copy stands in.
pub(super) fn arrive(
    world: &Arc<World>,
    shard: String,
    agent: Agent,
    (token, retained): (String, CharacterSnapshot),
    old_session: String,
    old_player: PlayerSnapshot,
) {
    let world = Arc::clone(world);
    tokio::spawn(async move {
        let carried = loop {
            let taken = {
                let _permit = world.io.acquire().await;
                tokio::time::timeout(IO_BOUND, world.transit.take(&token, &shard)).await
            };
            match taken {
                Ok(Ok(Taken::Carried(carried))) => break *carried,
                Ok(Ok(Taken::Unreadable)) => {
                    bump(&world.counters.handoffs_lost);
                    abandon_transfer(&world, token);
                    return go_offline(&world, agent, 500);
                }
                Ok(Ok(Taken::Gone)) => {
                    bump(&world.counters.handoff_takes_recovered);
                    break HandoffPayload::new(retained);
                }
                _ => {
                    bump(&world.counters.handoff_retries);
                    if !pause(&world).await {
                        return world.leave_transit(agent);
                    }
                }
            }
        };
        loop {
            let before = world.outage_reading();
            let claimed = {
                let _permit = world.io.acquire().await;
                world.transit.claim(&carried, &token).await
            };
            let steady = world.no_outage_since(before);
            match claimed {
                Ok(loaded) => {
                    record_claim(
                        &world,
                        agent.character_id,
                        &loaded,
                        (&token, carried.dumped_under_epoch),
                        steady,
                    );
                    let message = Inbound::HandoffLoaded {
                        agent,
                        token,
                        loaded: Box::new(loaded),
                        old_session,
                        old_player,
                    };
                    return deliver(&world, &shard, message);
                }
                Err(_) => {
                    bump(&world.counters.handoff_retries);
                    if !pause(&world).await {
                        return world.leave_transit(agent);
                    }
                }
            }
        }
    });
}

/// After a handoff landed: the activation marker, its durable record (a retry job), and the
/// cleanup of the session that left the source.
pub(super) fn confirm_transfer(
    world: &Arc<World>,
    shard: &str,
    token: &str,
    zone: &str,
    epoch: i64,
    old_session: String,
    old_player: PlayerSnapshot,
) {
    let character_id = old_player.character_id;
    let activation = Transit::activation_now(token, shard, zone);
    let job = Transit::activation_record(&activation, character_id, epoch, shard).ok();
    let marker_world = Arc::clone(world);
    tokio::spawn(async move {
        // The source waits for this marker: retried until it lands.
        loop {
            let set = {
                let _permit = marker_world.io.acquire().await;
                tokio::time::timeout(IO_BOUND, marker_world.transit.mark_activation(&activation))
                    .await
            };
            if matches!(set, Ok(Ok(()))) {
                return;
            }
            bump(&marker_world.counters.session_marker_failures);
            if !pause(&marker_world).await {
                return;
            }
        }
    });
    if let Some(job) = job {
        enqueue_job(world, job);
    }
    close_stream(
        world,
        old_session,
        old_player,
        SessionLifecycleEffectPlan::ConfirmedTransfer,
    );
}

/// Records a handoff claim whose reply arrived.
fn record_claim(
    world: &World,
    character_id: uuid::Uuid,
    loaded: &HandoffLoad,
    (token, dumped_under): (&str, i64),
    steady: bool,
) {
    let (HandoffLoad::Adopted(l) | HandoffLoad::Superseded { loaded: l, .. }) = loaded;
    let minted = l.snapshot.owner_epoch;
    world.with_ledger(|ledger| {
        ledger.rewards.loaded(character_id, l);
        ledger.crash_floors.loaded(
            character_id,
            super::crash_floors::place_of(&l.origin),
            minted,
            steady,
        );
        ledger.claims.push(ClaimRecord {
            character_id,
            minted,
            handoff: Some(HandoffClaimRecord {
                token: token.to_owned(),
                dumped_under,
                adopted: !loaded.is_superseded(),
            }),
        })
    });
}
