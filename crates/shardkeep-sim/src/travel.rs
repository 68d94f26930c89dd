//! The players' comings and goings, run as tasks beside the shard hosts: a login routed
//! through the gate, then handed to the shard's live-copy runtime (which claims, loads, starts
//! the session, or resumes the copy it still holds); a handoff's ticket carried to the shard
//! that hosts the destination, which takes the copy in. Results go back to the hosts as
//! messages, with what the checks must know of each claim. How a login, a handoff, a session
//! or a closed stream is made durable is the runtime's, not the simulator's.

use std::sync::Arc;
use std::time::Duration;

use super::agent::Agent;
use super::claims::{ClaimRecord, HandoffClaimRecord};
use super::inbound::Inbound;
use super::order_checks::SessionEvent;
use super::world::{World, bump};
use shardkeep::character::LoadSource;
use shardkeep::live::{Admitted, LiveError, Runtime, SessionStart};
use shardkeep::ttl::Ttl;
use shardkeep_reference::shard::ReferenceGame;
use shardkeep_reference::shard::gate::route_login;

/// Pause between attempts of a step that must not be lost.
const RETRY_PAUSE: Duration = Duration::from_millis(250);
/// Bound on one store call.
pub(super) const IO_BOUND: Duration = Duration::from_secs(3);
/// Lifetime of a handoff payload and its pending mark (compressed with time: 120 s in
/// production). A source waits this long for the activation, so a handoff whose destination
/// was killed before marking it ends within the run's settle.
pub(super) const HANDOFF_TTL: Ttl = Ttl::from_static_secs(15);
/// Lifetime of session markers and presence records.
pub(super) const SESSION_TTL: Ttl = Ttl::from_static_secs(120);
/// How long a login put off by its character's logout save still in flight waits to try again.
const STILL_SAVING_RETRY_MS: u64 = 250;

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
                return deliver(&world, &shard, Inbound::Login { agent });
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

/// Logs the agent's character in through `runtime` (the shard `shard`'s): a copy still held
/// there is resumed, otherwise the character is claimed and loaded. The host puts the copy on
/// its map, or the player retries.
pub(super) fn admit(
    world: &Arc<World>,
    runtime: Runtime<ReferenceGame>,
    shard: String,
    mut agent: Agent,
) {
    let world = Arc::clone(world);
    tokio::spawn(async move {
        let _permit = world.io.acquire().await;
        let token = agent.token("session");
        let before = world.outage_reading();
        let start = SessionStart { token: Some(token) };
        let admitted = runtime.login(agent.character_id, start).await;
        let steady = world.no_outage_since(before);
        match admitted {
            Ok(admitted) => {
                if admitted.resumed.is_some() {
                    bump(&world.counters.resumes);
                } else {
                    record_claim(&world, &runtime, &admitted, None, steady);
                }
                record_session(&world, &admitted);
                deliver(&world, &shard, Inbound::Admitted { agent, admitted });
            }
            Err(LiveError::StillSaving(_)) => {
                // Its logout is still saving here: claiming now would load the older row and
                // fence that save out. The runtime refuses; the player tries again shortly.
                bump(&world.counters.logins_waiting_for_last_copy);
                go_offline(&world, agent, STILL_SAVING_RETRY_MS);
            }
            Err(err) => {
                tracing::debug!(event = "sim_login_failed", error = %err);
                bump(&world.counters.login_retries);
                go_offline(&world, agent, 500);
            }
        }
    });
}

/// The session a login or an arrival started, in the character's session order.
fn record_session(world: &World, admitted: &Admitted) {
    world.with_ledger(|ledger| {
        ledger.session_events.push(SessionEvent {
            character_id: admitted.copy.character_id,
            order: admitted.session_order,
            cleanup: false,
        })
    });
}

/// A handoff ticket carried to the host of its destination.
pub(super) fn carry(world: &Arc<World>, target: &str, agent: Agent, token: String, epoch: i64) {
    tracing::debug!(event = "sim_transfer_begun", %token, character = %agent.character_id, %target);
    let message = Inbound::Handoff {
        agent,
        token,
        dumped_under: epoch,
    };
    deliver(world, target, message);
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

/// The destination of a handoff: `runtime` takes the copy handed to it under `token` (the
/// carried content only while the copy that dumped it still owned the character), and the host
/// puts it on its map.
pub(super) fn arrive(
    world: &Arc<World>,
    runtime: Runtime<ReferenceGame>,
    shard: String,
    mut agent: Agent,
    (token, dumped_under): (String, i64),
) {
    let world = Arc::clone(world);
    tokio::spawn(async move {
        let session = agent.token("session");
        loop {
            let before = world.outage_reading();
            let arrived = {
                let _permit = world.io.acquire().await;
                let start = SessionStart {
                    token: Some(session.clone()),
                };
                runtime.arrive(&token, start).await
            };
            let steady = world.no_outage_since(before);
            match arrived {
                Ok(admitted) => {
                    record_claim(
                        &world,
                        &runtime,
                        &admitted,
                        Some((&token, dumped_under)),
                        steady,
                    );
                    record_session(&world, &admitted);
                    let message = Inbound::Arrived {
                        agent,
                        token,
                        admitted,
                    };
                    return deliver(&world, &shard, message);
                }
                Err(LiveError::Stopped) => {
                    // The shard was killed before its runtime took anything: the handoff goes
                    // to the runtime that replaced it.
                    if !pause(&world).await {
                        return world.leave_transit(agent);
                    }
                    let message = Inbound::Handoff {
                        agent,
                        token,
                        dumped_under,
                    };
                    return deliver(&world, &shard, message);
                }
                Err(LiveError::UnknownHandoff) => {
                    bump(&world.counters.handoffs_lost);
                    abandon_transfer(&world, token);
                    return go_offline(&world, agent, 500);
                }
                Err(_) => {
                    // Not taken yet (a store outage): the payload waits for the retry.
                    bump(&world.counters.handoff_retries);
                    if !pause(&world).await {
                        return world.leave_transit(agent);
                    }
                }
            }
        }
    });
}

/// Records a claim whose copy was admitted: the epoch it minted, what it started out holding
/// (read from the copy before anything played it), and for a handoff whether the carried
/// content was adopted.
fn record_claim(
    world: &World,
    runtime: &Runtime<ReferenceGame>,
    admitted: &Admitted,
    handoff: Option<(&str, i64)>,
    steady: bool,
) {
    let Some(origin) = admitted.origin.as_ref() else {
        return;
    };
    let copy = admitted.copy;
    let (character_id, minted) = (copy.character_id, copy.owner_epoch);
    // What it started out holding, read before anything played it (gone already: evicted at
    // once, so nothing of it can reach a row).
    let holds = runtime.read(copy, |c| (c.experience, c.currency)).ok();
    let adopted = admitted.source == Some(LoadSource::Handoff);
    if handoff.is_some() && !adopted {
        bump(&world.counters.handoffs_superseded);
    }
    world.with_ledger(|ledger| {
        let what = format!(
            "the copy loaded at epoch {minted} (from the {:?})",
            admitted.source
        );
        if let Some(holds) = holds {
            ledger
                .rewards
                .loaded_from(character_id, minted, origin, holds, &what);
        }
        let place = super::crash_floors::place_of(origin);
        match handoff {
            None => ledger
                .crash_floors
                .logged_in(character_id, place, minted, steady),
            Some(_) => ledger
                .crash_floors
                .loaded(character_id, place, minted, steady),
        }
        ledger.claims.push(ClaimRecord {
            character_id,
            minted,
            handoff: handoff.map(|(token, dumped_under)| HandoffClaimRecord {
                token: token.to_owned(),
                dumped_under,
                adopted,
            }),
        })
    });
}
