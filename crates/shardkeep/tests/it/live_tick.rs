//! The runtime as a game with a tick of its own plays it: the calls that never wait on a store
//! (`grant_now`, `logout_now`, `flush_all`), what the runtime tells the game of its writes and
//! closed streams, and placement kept where the copy is. Each body runs on Postgres with Redis
//! and on the embedded store's file, unless it needs a Postgres row lock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value};
use shardkeep::character::{CharacterSnapshot, StateJson};
use shardkeep::coord::SessionOrder;
use shardkeep::journal::SessionLifecycleEffectPlan;
use shardkeep::live::{
    Arrival, CopyId, EvictionCause, FinalSave, Landed, LiveConfig, LiveError, LiveEvent, LiveGame,
    SessionStart, Stored,
};
use shardkeep::model::{Anchor, ModelHandle};
use shardkeep::placement::PlacementRecord;
use shardkeep::saver::SaveReason;
use shardkeep_testkit::model::{LedgerEffect, LedgerModel};
use shardkeep_testkit::{JobDriver, JobDrivers, TestRedis};
use sqlx::PgPool;
use uuid::Uuid;

use super::live_runtime::{Ledger, Live, anchor, coins, holds, horn_put_down, picking_up, set};

/// What a test game wrapping the ledger game (its field `game`) passes on to it unchanged.
macro_rules! ledger_game_calls {
    () => {
        type Character = Map<String, Value>;
        type Effect = LedgerEffect;

        fn model(&self) -> ModelHandle {
            self.game.model()
        }

        fn load(&self, state: &StateJson) -> Result<Self::Character, String> {
            self.game.load(state)
        }

        fn dump(&self, character: &Self::Character) -> Result<StateJson, String> {
            self.game.dump(character)
        }

        fn apply(
            &self,
            character: &mut Self::Character,
            anchor: &mut Anchor,
            effect: &LedgerEffect,
        ) -> Result<bool, String> {
            self.game.apply(character, anchor, effect)
        }

        fn fresh(&self) -> Self::Character {
            self.game.fresh()
        }
    };
}

/// What the runtime told the game.
#[derive(Default)]
struct Seen {
    saved: Vec<(CopyId, SaveReason, i64)>,
    journaled: Vec<(Uuid, SessionOrder, SessionLifecycleEffectPlan)>,
    handed_off: Vec<(CopyId, String, bool)>,
}

/// The ledger game, recording what the runtime tells it.
struct Recording {
    game: Ledger,
    seen: Arc<Mutex<Seen>>,
}

impl Recording {
    fn new() -> (Self, Arc<Mutex<Seen>>) {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let game = Self {
            game: Stored::new(LedgerModel, Map::new),
            seen: Arc::clone(&seen),
        };
        (game, seen)
    }
}

impl LiveGame for Recording {
    ledger_game_calls!();

    fn saved(&self, copy: CopyId, reason: SaveReason, version: i64) {
        self.seen
            .lock()
            .unwrap()
            .saved
            .push((copy, reason, version));
    }

    fn handed_off(&self, copy: CopyId, token: &str, activated: bool) {
        self.seen
            .lock()
            .unwrap()
            .handed_off
            .push((copy, token.to_owned(), activated));
    }

    fn journaled(&self, character_id: Uuid, order: SessionOrder, plan: SessionLifecycleEffectPlan) {
        self.seen
            .lock()
            .unwrap()
            .journaled
            .push((character_id, order, plan));
    }
}

/// Waits (10 s at most) until `ready` holds.
async fn until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !ready() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_tick_grant_is_numbered_at_once_and_granted_once_after_a_crash(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let live = Live::on(&d, &redis, "shard-a").await;
        let (id, copy) = live.player("Cato").await;
        let first = live.runtime.grant_now(copy, coins(10)).unwrap();
        let second = live.runtime.grant_now(copy, coins(30)).unwrap();
        // Numbered in the copy's sequence, in order (a cadence's dump between the two may take
        // a number of its own).
        assert!(
            0 < first.issue_seq && first.issue_seq < second.issue_seq,
            "{}: {first:?} {second:?}",
            d.name()
        );
        assert_ne!(first.retry_job_id, second.retry_job_id);
        // Applied at once, without waiting on a store.
        let held = live.runtime.read(copy, |s| s["currency"].clone()).unwrap();
        assert_eq!(held, 40, "{}", d.name());
        // The jobs land on the row; a checkpoint of the copy holding both lands too.
        live.row_reaches(id, "currency", 40).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        live.runtime.kill();
        let again = Live::on(&d, &redis, "shard-b").await;
        let copy_b = again
            .runtime
            .login(id, SessionStart::default())
            .await
            .unwrap()
            .copy;
        let currency = again
            .runtime
            .read(copy_b, |s| s["currency"].clone())
            .unwrap();
        assert_eq!(currency, 40, "{}: each grant once", d.name());
        // The dead shard's copy takes no more grants.
        assert!(matches!(
            live.runtime.grant_now(copy, coins(1)),
            Err(LiveError::Gone(_) | LiveError::Stopped)
        ));
        again.stop().await;
        live.stop_workers().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_tick_logout_leaves_at_once_and_hands_back_its_final_save(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let live = Live::on(&d, &redis, "shard-a").await;
        let (id, copy) = live.player("Dell").await;
        set(copy, &live.runtime, "experience", 7);
        let mut out = live.runtime.logout_now(copy).unwrap();
        assert_eq!(out.copy(), copy);
        assert_eq!(live.runtime.copy_of(id), None, "{}: gone at once", d.name());
        assert!(matches!(
            live.runtime.logout_now(copy),
            Err(LiveError::Gone(_))
        ));
        until("the final save answered", || out.outcome().is_some()).await;
        let outcome = out.outcome().unwrap();
        assert!(
            matches!(outcome, FinalSave::Saved { .. }),
            "{}: {outcome:?}",
            d.name()
        );
        // Asked again, the same answer.
        assert_eq!(out.outcome(), Some(outcome.clone()));
        assert_eq!(out.within(Duration::from_millis(1)).await, outcome);
        assert_eq!(live.row(id).await["experience"], 7, "{}", d.name());
        live.stop().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn the_game_hears_of_every_landed_write_and_journaled_stream(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let (game, seen) = Recording::new();
        let live = Live::hosting(&d, &redis, LiveConfig::new("shard-a"), game).await;
        let (id, admitted) = live.admitted("Esme").await;
        let copy = admitted.copy;
        assert_eq!(
            admitted.session_order.owner_epoch,
            copy.owner_epoch,
            "{}",
            d.name()
        );
        set(copy, &live.runtime, "experience", 3);
        let version = live.runtime.save_now(copy).await.unwrap();
        assert!(
            seen.lock()
                .unwrap()
                .saved
                .contains(&(copy, SaveReason::Flush, version)),
            "{}",
            d.name()
        );
        // Checkpoints land meanwhile (every 100 ms here): only row writes are reported.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let FinalSave::Saved { version: last } = live.runtime.logout(copy).await.unwrap() else {
            panic!("{}: the final save", d.name());
        };
        // The copy's own cadence flush (once a minute, its place in the period from its id) may
        // land in between on a slow machine: a row write too, reported like the others.
        let saved = seen.lock().unwrap().saved.clone();
        assert_eq!(
            saved.first(),
            Some(&(copy, SaveReason::Flush, version)),
            "{}",
            d.name()
        );
        assert_eq!(
            saved.last(),
            Some(&(copy, SaveReason::Final, last)),
            "{}",
            d.name()
        );
        assert!(
            saved
                .iter()
                .all(|(c, reason, _)| *c == copy && reason.writes_row())
                && saved.windows(2).all(|w| w[0].2 < w[1].2),
            "{}: {saved:?}",
            d.name()
        );
        until("the closed stream was journaled", || {
            !seen.lock().unwrap().journaled.is_empty()
        })
        .await;
        let journaled = seen.lock().unwrap().journaled.clone();
        assert_eq!(journaled.len(), 1, "{}: once: {journaled:?}", d.name());
        let (character, order, plan) = journaled[0];
        assert_eq!(character, id);
        assert_eq!(plan, SessionLifecycleEffectPlan::PermanentRemoval);
        assert_eq!(order.owner_epoch, copy.owner_epoch);
        assert!(order.at >= admitted.session_order.at, "{}", d.name());
        assert_ne!(order.event_id, admitted.session_order.event_id);
        live.stop().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_zone_change_moves_the_placement_and_a_refresh_writes_it_again(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let live = Live::on(&d, &redis, "shard-a").await;
        let (id, copy) = live.player("Fenn").await;
        let placement = |live: &Live| live.services.placement.clone();
        let zone_now = || async {
            live.runtime.placement_barrier(Duration::from_secs(5)).await;
            let record = placement(&live).read(id).await.unwrap().unwrap();
            assert_eq!(record.owner_epoch, copy.owner_epoch, "{}", d.name());
            (record.shard_id, record.zone_id)
        };
        let here = |zone: &str| (Some("shard-a".to_owned()), Some(zone.to_owned()));
        assert_eq!(zone_now().await, here("zone-0"), "{}", d.name());
        live.runtime.set_anchor(copy, anchor("zone-1")).unwrap();
        assert_eq!(zone_now().await, here("zone-1"), "{}", d.name());
        // A room change within the zone, or an instance (no zone), writes nothing new.
        live.runtime
            .set_anchor(
                copy,
                Anchor {
                    zone_ref: None,
                    room_ref: Some("r2".into()),
                },
            )
            .unwrap();
        assert_eq!(zone_now().await, here("zone-1"), "{}", d.name());
        // The record is lost or wrong (a Redis outage, a restore): a refresh writes it again.
        placement(&live)
            .write(&PlacementRecord {
                character_id: id,
                shard_id: Some("shard-z".into()),
                zone_id: Some("zone-9".into()),
                owner_epoch: copy.owner_epoch,
                updated_at: chrono::Utc::now(),
            })
            .await
            .unwrap();
        live.runtime.refresh_placements();
        assert_eq!(zone_now().await, here("zone-1"), "{}", d.name());
        // An effect that moves the copy (a grant, or an offline one merged into it) moves its
        // placement too.
        let moved = |zone: &str| LedgerEffect::CharacterLocation {
            zone: zone.into(),
            room: "r1".into(),
            position: None,
        };
        live.runtime.grant_now(copy, moved("zone-2")).unwrap();
        assert_eq!(zone_now().await, here("zone-2"), "{}", d.name());
        // Its job is stored in the background: it lands before the next move is granted (an
        // offline grant stored before it would be overwritten on the row by it).
        live.row_reaches_zone(id, "zone-2").await;
        live.runtime
            .grant_offline(id, "teleport", moved("zone-3"))
            .await
            .unwrap();
        live.row_reaches_zone(id, "zone-3").await;
        live.runtime.save_now(copy).await.unwrap();
        assert_eq!(zone_now().await, here("zone-3"), "{}", d.name());
        live.stop().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_reconciling_flush_evicts_a_zombie(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let mut quiet = LiveConfig::new("shard-a");
        quiet.own_pulse = false;
        let first = Live::with(&d, &redis, quiet).await;
        let mut events = first.runtime.subscribe();
        let (id, zombie) = first.player("Gale").await;
        let second = Live::on(&d, &redis, "shard-b").await;
        let live = second
            .runtime
            .login(id, SessionStart::default())
            .await
            .unwrap()
            .copy;
        assert_eq!(first.runtime.flush_all(), 1, "{}", d.name());
        let evicted = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            evicted,
            LiveEvent::Evicted {
                copy: zombie,
                cause: EvictionCause::OwnershipLost {
                    current_epoch: live.owner_epoch
                }
            },
            "{}",
            d.name()
        );
        assert_eq!(first.runtime.copy_of(id), None);
        assert_eq!(first.runtime.flush_all(), 0);
        second.stop().await;
        first.stop().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_shutdown_waits_for_its_handoffs_to_settle_and_counts_the_rest(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let (game, seen) = Recording::new();
        let a = Live::hosting(&d, &redis, LiveConfig::new("shard-a"), game).await;
        let b = Live::on(&d, &redis, "shard-b").await;
        let (_, taken) = a.player("Jory").await;
        let (_, untaken) = a.player("Kell").await;
        let to_b = a
            .runtime
            .hand_off(taken, "shard-b", anchor("zone-1"))
            .await
            .unwrap();
        let nowhere = a
            .runtime
            .hand_off(untaken, "shard-b", anchor("zone-1"))
            .await
            .unwrap();
        let shutdown = tokio::spawn(a.runtime.clone().shutdown(Duration::from_secs(5)));
        tokio::time::sleep(Duration::from_millis(200)).await;
        b.runtime
            .arrive(&to_b.token, SessionStart::default())
            .await
            .unwrap();
        let report = shutdown.await.unwrap();
        assert_eq!(report.unsettled_handoffs, 1, "{}: {report:?}", d.name());
        assert_eq!(report.unjournaled, 0, "{}: {report:?}", d.name());
        let handed_off = seen.lock().unwrap().handed_off.clone();
        assert_eq!(
            handed_off,
            vec![(taken, to_b.token.clone(), true)],
            "{}: the taken handoff settled, the other was left",
            d.name()
        );
        let journaled = seen.lock().unwrap().journaled.clone();
        assert!(
            journaled
                .iter()
                .any(|(id, _, plan)| *id == taken.character_id
                    && *plan == SessionLifecycleEffectPlan::ConfirmedTransfer),
            "{}: {journaled:?}",
            d.name()
        );
        assert_ne!(nowhere.token, to_b.token);
        b.stop().await;
        a.stop_workers().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_session_token_no_job_could_carry_is_refused_before_anything_is_taken(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let a = Live::on(&d, &redis, "shard-a").await;
        let b = Live::on(&d, &redis, "shard-b").await;
        let id = a
            .runtime
            .create("Lark", Uuid::now_v7(), anchor("zone-0"))
            .await
            .unwrap();
        for bad in [String::new(), "t".repeat(257)] {
            let refused = a.runtime.login(id, SessionStart { token: Some(bad) }).await;
            assert!(
                matches!(refused, Err(LiveError::InvalidSession(_))),
                "{}: {refused:?}",
                d.name()
            );
        }
        assert_eq!(
            a.runtime.copy_of(id),
            None,
            "{}: nothing admitted",
            d.name()
        );
        let copy = a
            .runtime
            .login(
                id,
                SessionStart {
                    token: Some("t".repeat(256)),
                },
            )
            .await
            .unwrap()
            .copy;
        // A second login under the token that already plays the copy is refused (its old
        // stream's close would clear the new session's records), and the copy plays on.
        let again = a
            .runtime
            .login(
                id,
                SessionStart {
                    token: Some("t".repeat(256)),
                },
            )
            .await;
        assert!(
            matches!(again, Err(LiveError::InvalidSession(_))),
            "{}: {again:?}",
            d.name()
        );
        assert_eq!(a.runtime.copy_of(id), Some(copy), "{}", d.name());
        // A live grant's job carries the session: it is stored with it.
        a.runtime.grant_now(copy, coins(5)).unwrap();
        a.row_reaches(id, "currency", 5).await;
        let ticket = a
            .runtime
            .hand_off(copy, "shard-b", anchor("zone-1"))
            .await
            .unwrap();
        let refused = b
            .runtime
            .arrive(
                &ticket.token,
                SessionStart {
                    token: Some(String::new()),
                },
            )
            .await;
        assert!(
            matches!(refused, Err(LiveError::InvalidSession(_))),
            "{}: {refused:?}",
            d.name()
        );
        // The handoff is still there to take.
        b.runtime
            .arrive(&ticket.token, SessionStart::default())
            .await
            .unwrap();
        a.stop().await;
        b.stop().await;
    }
}

/// Postgres only: a row lock holds the pickup's commit.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn saves_and_logouts_wait_for_a_pickup_in_flight(pool: PgPool) {
    let redis = TestRedis::new().await;
    let d = JobDriver::Postgres(pool.clone());
    let mut config = LiveConfig::new("shard-a");
    config.own_pulse = false;
    config.transfer_budget = Duration::from_millis(300);
    let live = Live::with(&d, &redis, config).await;
    let rt = live.runtime.clone();
    let put_down = horn_put_down(&live).await;
    let (horn, (gail_id, _), (hale_id, hale)) = (put_down.horn, put_down.gail, put_down.hale);
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM characters WHERE id = $1 FOR UPDATE")
        .bind(hale_id)
        .execute(&mut *lock)
        .await
        .unwrap();
    let picking = picking_up(&rt, &put_down);
    until("the pickup is in flight", || rt.in_transfer(hale_id)).await;
    assert!(rt.in_transfer(gail_id), "the releaser takes part too");
    // A save on demand would write the row without the horn the commit gives it: it waits for
    // the transfer, and past the budget it is refused, not made.
    let saved = tokio::time::timeout(Duration::from_secs(3), rt.save_now(hale))
        .await
        .expect("the save waited on the row lock, not on the transfer");
    assert!(
        matches!(saved, Err(LiveError::TransferPending(c)) if c == hale_id),
        "{saved:?}"
    );
    assert!(matches!(
        rt.logout_now(hale),
        Err(LiveError::TransferPending(c)) if c == hale_id
    ));
    assert_eq!(rt.flush_all(), 0, "both copies are in the transfer");
    lock.rollback().await.unwrap();
    let picked = picking.await.unwrap().unwrap();
    assert_eq!(picked, shardkeep::live::PickedUp::Committed);
    assert!(!rt.in_transfer(hale_id));
    rt.save_now(hale).await.unwrap();
    assert!(holds(&live.row(hale_id).await, horn));
    let mut out = rt.logout_now(hale).unwrap();
    until("the logout answered", || out.outcome().is_some()).await;
    assert!(holds(&live.row(hale_id).await, horn));
    live.stop().await;
}

/// The ledger game landing its players itself: a first spawn takes its creation input (gold)
/// once, and a player saved in a zone it does not host lands in its home zone.
struct Spawning {
    game: Ledger,
}

impl LiveGame for Spawning {
    ledger_game_calls!();

    fn land(
        &self,
        snapshot: &CharacterSnapshot,
        arrival: Arrival,
    ) -> Result<Landed<Self::Character>, String> {
        let mut character = self.load(&snapshot.state)?;
        let mut chargen = snapshot.chargen.clone();
        if arrival == (Arrival::Login { brand_new: true })
            && let Some(gold) = chargen.take().and_then(|c| c["gold"].as_i64())
        {
            character.insert("currency".into(), gold.into());
        }
        let hosted = matches!(snapshot.zone_ref.as_deref(), Some("zone-0" | "zone-home"));
        let anchor = if hosted {
            Anchor {
                zone_ref: snapshot.zone_ref.clone(),
                room_ref: snapshot.room_ref.clone(),
            }
        } else {
            Anchor {
                zone_ref: Some("zone-home".into()),
                room_ref: Some("gate".into()),
            }
        };
        Ok(Landed {
            character,
            anchor,
            chargen,
        })
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_game_lands_its_players_and_applies_creation_input_once(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let game = Spawning {
            game: Stored::new(LedgerModel, Map::new),
        };
        let live = Live::hosting(&d, &redis, LiveConfig::new("shard-a"), game).await;
        let nowhere = Anchor {
            zone_ref: None,
            room_ref: None,
        };
        let id = live
            .runtime
            .create_with(
                "Hild",
                Uuid::now_v7(),
                nowhere,
                Some(serde_json::json!({ "gold": 25 })),
            )
            .await
            .unwrap();
        let stored = live.services.characters.load(id).await.unwrap().unwrap();
        assert_eq!(stored.chargen, Some(serde_json::json!({ "gold": 25 })));
        for login in 0..2 {
            let admitted = live
                .runtime
                .login(id, SessionStart::default())
                .await
                .unwrap();
            assert_eq!(admitted.brand_new, login == 0, "{}", d.name());
            let currency = live
                .runtime
                .read(admitted.copy, |s| s["currency"].clone())
                .unwrap();
            assert_eq!(currency, 25, "{}: login {login}: the gold once", d.name());
            live.runtime.placement_barrier(Duration::from_secs(5)).await;
            let placed = live.services.placement.read(id).await.unwrap().unwrap();
            assert_eq!(placed.zone_id.as_deref(), Some("zone-home"), "{}", d.name());
            live.runtime.logout(admitted.copy).await.unwrap();
            let row = live.services.characters.load(id).await.unwrap().unwrap();
            assert_eq!(row.chargen, None, "{}: the input is spent", d.name());
            assert_eq!(row.zone_ref.as_deref(), Some("zone-home"), "{}", d.name());
            assert_eq!(row.room_ref.as_deref(), Some("gate"), "{}", d.name());
        }
        // Saved in a zone this shard does not host: landed at home, and saved there.
        let far = live
            .runtime
            .create("Ivo", Uuid::now_v7(), anchor("zone-far"))
            .await
            .unwrap();
        let copy = live
            .runtime
            .login(far, SessionStart::default())
            .await
            .unwrap()
            .copy;
        live.runtime.logout(copy).await.unwrap();
        let row = live.services.characters.load(far).await.unwrap().unwrap();
        assert_eq!(row.zone_ref.as_deref(), Some("zone-home"), "{}", d.name());
        live.stop().await;
    }
}

/// A handoff that cannot be stored (here a target no key can name: its pending mark lands, its
/// payload is refused) leaves the copy playing here and nothing pending behind it.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_handoff_that_cannot_be_stored_leaves_nothing_pending(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let a = Live::on(&d, &redis, "shard-a").await;
        let (_, copy) = a.player("Lune").await;
        let refused = a.runtime.hand_off(copy, "", anchor("zone-1")).await;
        assert!(refused.is_err(), "{}: {refused:?}", d.name());
        assert_eq!(
            a.runtime.copy_of(copy.character_id),
            Some(copy),
            "{}",
            d.name()
        );
        let coord = &a.services.coord;
        let pattern = coord.keys().transfer_pending_pattern();
        let mut pending = coord.keys_matching(&pattern, 100).await.unwrap();
        for _ in 0..100 {
            if pending.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            pending = coord.keys_matching(&pattern, 100).await.unwrap();
        }
        assert_eq!(pending, Vec::<String>::new(), "{}: withdrawn", d.name());
        a.runtime.set_anchor(copy, anchor("zone-0")).unwrap();
        a.stop().await;
    }
}

/// A killed runtime takes no handoff (it would consume the payload for a copy nobody plays):
/// the payload stays for the runtime that replaces it.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_killed_runtime_takes_no_handoff(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let a = Live::on(&d, &redis, "shard-a").await;
        let b = Live::on(&d, &redis, "shard-b").await;
        let (_, copy) = a.player("Mave").await;
        let ticket = a
            .runtime
            .hand_off(copy, "shard-b", anchor("zone-1"))
            .await
            .unwrap();
        b.runtime.kill();
        let refused = b
            .runtime
            .arrive(&ticket.token, SessionStart::default())
            .await;
        assert!(
            matches!(refused, Err(LiveError::Stopped)),
            "{}: {refused:?}",
            d.name()
        );
        b.stop_workers().await;
        let again = Live::on(&d, &redis, "shard-b").await;
        let arrived = again
            .runtime
            .arrive(&ticket.token, SessionStart::default())
            .await
            .unwrap();
        assert_eq!(
            arrived.copy.character_id,
            copy.character_id,
            "{}: the replacement takes it",
            d.name()
        );
        again.stop().await;
        a.stop().await;
    }
}

/// A session's records live as long as the session does, past their own lifetime, by the
/// pulse's refreshes (extended where they stand); records lost meanwhile (a Redis restart, a
/// start write that failed) are written again by the next refresh, placement included.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn session_records_outlive_their_ttl_and_lost_ones_are_written_again(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let mut config = LiveConfig::new("shard-a");
        // Refreshed every 300 ms.
        config.session_ttl = shardkeep::Ttl::from_millis(900).unwrap();
        let live = Live::with(&d, &redis, config).await;
        let (id, admitted) = live.admitted("Ress").await;
        let (copy, token) = (admitted.copy, admitted.session_token);
        let coord = live.services.coord.clone();
        let placement = live.services.placement.clone();
        let whole = || async {
            let presence = coord.presence_by_character(&id.to_string()).await.unwrap();
            live.runtime.placement_barrier(Duration::from_secs(5)).await;
            let placed = placement.read(id).await.unwrap();
            coord.session_is_active(&token).await.unwrap()
                && presence.is_some_and(|p| p.session_token == token)
                && placed.is_some_and(|p| p.shard_id.as_deref() == Some("shard-a"))
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !whole().await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}: never written",
                d.name()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Three lifetimes later every record is still there.
        tokio::time::sleep(Duration::from_millis(2_700)).await;
        assert!(
            whole().await,
            "{}: a record lapsed under a live session",
            d.name()
        );
        // Lost: the placement left wrong, the presence and then the marker gone (a refresh
        // that finds the marker gone writes everything again).
        placement
            .write(&PlacementRecord {
                character_id: id,
                shard_id: Some("shard-z".into()),
                zone_id: Some("zone-9".into()),
                owner_epoch: copy.owner_epoch,
                updated_at: chrono::Utc::now(),
            })
            .await
            .unwrap();
        let mut gone = coord
            .presence_by_character(&id.to_string())
            .await
            .unwrap()
            .unwrap();
        gone.expires_at = chrono::Utc::now() + chrono::Duration::milliseconds(30);
        coord.presence_put(&gone).await.unwrap();
        coord.session_deactivate(&token).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        while !whole().await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}: lost records not written again",
                d.name()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        live.stop().await;
    }
}

/// A copy that changes zone has its presence name the new zone by its next session refresh
/// (written in full then, not only extended).
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn presence_follows_a_zone_change_by_the_next_refresh(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let mut config = LiveConfig::new("shard-a");
        // Refreshed every 3 s; written in full only every 96 s otherwise.
        config.session_ttl = shardkeep::Ttl::from_secs(9).unwrap();
        let live = Live::with(&d, &redis, config).await;
        let (id, copy) = live.player("Wend").await;
        let coord = live.services.coord.clone();
        let zone = || async {
            coord
                .presence_by_character(&id.to_string())
                .await
                .unwrap()
                .and_then(|p| p.zone_id)
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while zone().await.as_deref() != Some("zone-0") {
            assert!(tokio::time::Instant::now() < deadline, "{}", d.name());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        live.runtime.set_anchor(copy, anchor("zone-1")).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(4_500);
        while zone().await.as_deref() != Some("zone-1") {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}: presence still names {:?}",
                d.name(),
                zone().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        live.stop().await;
    }
}

/// Postgres only: a row lock holds a flush in flight while its copy logs out. The flush loses
/// its version race (a job's write landed under it) and is answered after the copy left: the
/// logout's final save, dumped after the flush, answers for everything the copy held, so the
/// flush's conflict must not start a merge of the final of its own — the final is merged once
/// and written once.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_flush_conflict_answered_after_its_copy_left_writes_the_final_once(pool: PgPool) {
    let redis = TestRedis::new().await;
    let d = JobDriver::Postgres(pool.clone());
    let (game, seen) = Recording::new();
    let mut config = LiveConfig::new("shard-a");
    config.own_pulse = false;
    let live = Live::hosting(&d, &redis, config, game).await;
    let rt = live.runtime.clone();
    let (id, copy) = live.player("Vale").await;
    set(copy, &rt, "experience", 7);
    let version = || async {
        sqlx::query_scalar::<_, i64>("SELECT state_version FROM characters WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let before = version().await;
    // A write that lands under the copy (as a job's would), holding the row until it commits.
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("UPDATE characters SET state_version = state_version + 1 WHERE id = $1")
        .bind(id)
        .execute(&mut *lock)
        .await
        .unwrap();
    let attempted = rt.saver().stats().row_attempted;
    assert_eq!(rt.flush_all(), 1);
    // The saver took the flush; its write waits on the lock. The logout's final queues behind.
    until("the flush's write is on its way", || {
        rt.saver().stats().row_attempted > attempted
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut out = rt.logout_now(copy).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    lock.commit().await.unwrap();
    until("the logout answered", || out.outcome().is_some()).await;
    assert!(
        matches!(out.outcome(), Some(FinalSave::Saved { .. })),
        "{:?}",
        out.outcome()
    );
    // Settled (the stream's cleanup writes the row's location once): nothing more of the copy
    // is written, and nothing goes down as a job.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(live.row(id).await["experience"], 7);
    let finals: Vec<(CopyId, SaveReason, i64)> = seen
        .lock()
        .unwrap()
        .saved
        .iter()
        .filter(|(c, reason, _)| *c == copy && *reason == SaveReason::Final)
        .cloned()
        .collect();
    assert_eq!(finals.len(), 1, "one final save: {finals:?}");
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM persistence_retry_jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(jobs, 0, "no final went down as a job");
    let writes = version().await - before;
    assert!(
        writes <= 3,
        "the landed write, the cleanup's location and the final; {writes} writes"
    );
    live.stop().await;
}
