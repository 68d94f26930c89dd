//! The live-copy runtime, as a game uses it: every body runs on Postgres with Redis and on the
//! embedded store's file, with the services' workers running beside it.

use std::time::Duration;

use serde_json::{Map, Value};
use shardkeep::live::{
    Cadence, CopyId, FinalSave, Granted, LiveConfig, LiveError, LiveEvent, LiveGame, Runtime,
    SessionStart, Stored,
};
use shardkeep::model::Anchor;
use shardkeep::{Services, ServicesConfig, Workers};
use shardkeep_testkit::model::{LedgerEffect, LedgerModel};
use shardkeep_testkit::{JobDriver, JobDrivers, TestRedis};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::services::services_on;

pub(super) type Ledger = Stored<LedgerModel>;

/// A shard's runtime over services whose workers run.
pub(super) struct Live<G: LiveGame = Ledger> {
    pub(super) services: Services,
    workers: Workers,
    pub(super) runtime: Runtime<G>,
    cancel: CancellationToken,
}

impl Live {
    pub(super) async fn on(d: &JobDriver, redis: &TestRedis, shard: &str) -> Self {
        Self::with(d, redis, LiveConfig::new(shard)).await
    }

    /// Checkpoints every 100 ms, flushes a minute apart (only a logout, a grant or a conflict
    /// writes the row in a test's time).
    pub(super) async fn with(d: &JobDriver, redis: &TestRedis, live: LiveConfig) -> Self {
        Self::hosting(d, redis, live, Stored::new(LedgerModel, Map::new)).await
    }
}

impl<G: LiveGame> Live<G> {
    /// [`Live::with`], playing `game`.
    pub(super) async fn hosting(
        d: &JobDriver,
        redis: &TestRedis,
        mut live: LiveConfig,
        game: G,
    ) -> Self {
        let mut config = ServicesConfig::new(&format!("it-{}", live.shard_id), "game_server");
        config.retry.poll_interval = Duration::from_millis(50);
        let mut services = services_on(d, redis, config);
        let cancel = CancellationToken::new();
        let workers = services.spawn_workers(cancel.clone()).await.unwrap();
        live.cadence = Cadence {
            pulse: Duration::from_millis(20),
            checkpoint_every: Duration::from_millis(100),
            flush_every: Duration::from_secs(60),
        };
        live.logout_wait = Duration::from_secs(10);
        let runtime = Runtime::start(&services, game, live).unwrap();
        Self {
            services,
            workers,
            runtime,
            cancel,
        }
    }

    pub(super) async fn stop(self) {
        self.runtime.clone().shutdown(Duration::from_secs(10)).await;
        self.stop_workers().await;
    }

    /// Stops the services' workers of a shard whose runtime was killed: they would otherwise
    /// write into the test's namespace after it is swept (a journal consumer re-registers).
    pub(super) async fn stop_workers(self) {
        self.cancel.cancel();
        self.workers.shutdown(Duration::from_secs(10)).await;
    }

    /// A new character logged in here.
    pub(super) async fn player(&self, name: &str) -> (Uuid, CopyId) {
        let (id, admitted) = self.admitted(name).await;
        (id, admitted.copy)
    }

    /// A new character logged in here, with what its login answered (its session token).
    pub(super) async fn admitted(&self, name: &str) -> (Uuid, shardkeep::live::Admitted) {
        let id = self
            .runtime
            .create(name, Uuid::now_v7(), anchor("zone-0"))
            .await
            .unwrap();
        let admitted = self
            .runtime
            .login(id, SessionStart::default())
            .await
            .unwrap();
        (id, admitted)
    }

    pub(super) async fn row(&self, id: Uuid) -> Value {
        let row = self.services.characters.load(id).await.unwrap().unwrap();
        row.state.to_value()
    }

    /// Waits until the row's zone is `zone`.
    pub(super) async fn row_reaches_zone(&self, id: Uuid, zone: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let row = self.services.characters.load(id).await.unwrap().unwrap();
            if row.zone_ref.as_deref() == Some(zone) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the row never reached {zone}: {:?}",
                row.zone_ref
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the row's `field` reads `want`.
    pub(super) async fn row_reaches(&self, id: Uuid, field: &str, want: i64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let row = self.row(id).await;
            if row[field] == want {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{field} never reached {want}: {row}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

pub(super) fn anchor(zone: &str) -> Anchor {
    Anchor {
        zone_ref: Some(zone.into()),
        room_ref: Some("r1".into()),
    }
}

pub(super) fn coins(currency: i64) -> LedgerEffect {
    LedgerEffect::CombatRewards {
        experience: 0,
        currency,
        items: vec![],
    }
}

pub(super) fn set<G: LiveGame<Character = Map<String, Value>>>(
    copy: CopyId,
    runtime: &Runtime<G>,
    field: &str,
    value: i64,
) {
    runtime
        .update(copy, |state| {
            state.insert(field.into(), value.into());
        })
        .unwrap();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_logout_that_races_a_landed_grant_saves_both(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let live = Live::on(&d, &redis, "shard-a").await;
        let (id, copy) = live.player("Aria").await;
        set(copy, &live.runtime, "experience", 5);
        // A gift lands on the row while the copy plays: the logout's save loses the race.
        live.runtime
            .grant_offline(id, "gift-1", coins(40))
            .await
            .unwrap();
        live.row_reaches(id, "currency", 40).await;
        let saved = live.runtime.logout(copy).await.unwrap();
        assert!(
            matches!(saved, FinalSave::Saved { .. }),
            "{}: {saved:?}",
            d.name()
        );
        let row = live.row(id).await;
        assert_eq!(
            row["experience"],
            5,
            "{}: the logout landed: {row}",
            d.name()
        );
        assert_eq!(row["currency"], 40, "{}: the gift too: {row}", d.name());
        live.stop().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_live_grant_is_numbered_and_granted_once_after_a_crash(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let live = Live::on(&d, &redis, "shard-a").await;
        let (id, copy) = live.player("Bryn").await;
        set(copy, &live.runtime, "currency", 50);
        let saved = live.runtime.grant(copy, coins(0)).await.unwrap();
        assert!(matches!(saved, Granted::Saved { .. }), "{}", d.name());
        // The row moves under the copy (an offline grant of experience): the next grant
        // cannot be saved directly and goes down as a job under its number.
        live.runtime
            .grant_offline(
                id,
                "bump",
                LedgerEffect::CombatRewards {
                    experience: 1,
                    currency: 0,
                    items: vec![],
                },
            )
            .await
            .unwrap();
        live.row_reaches(id, "experience", 1).await;
        let queued = live.runtime.grant(copy, coins(40)).await.unwrap();
        assert!(
            matches!(queued, Granted::Queued { .. }),
            "{}: {queued:?}",
            d.name()
        );
        live.row_reaches(id, "currency", 90).await;
        // A checkpoint of the copy (holding the grant) lands, then the shard dies.
        tokio::time::sleep(Duration::from_millis(300)).await;
        live.runtime.kill();
        let again = Live::on(&d, &redis, "shard-b").await;
        let copy = again
            .runtime
            .login(id, SessionStart::default())
            .await
            .unwrap()
            .copy;
        let (currency, experience) = again
            .runtime
            .read(copy, |s| (s["currency"].clone(), s["experience"].clone()))
            .unwrap();
        assert_eq!(currency, 90, "{}: the grant once", d.name());
        assert_eq!(experience, 1, "{}: the offline grant once", d.name());
        again.stop().await;
        live.stop_workers().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_offline_grant_reaches_the_live_copy_once(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let live = Live::on(&d, &redis, "shard-a").await;
        let (id, copy) = live.player("Cato").await;
        set(copy, &live.runtime, "experience", 3);
        for _ in 0..2 {
            live.runtime
                .grant_offline(id, "mail-7", coins(25))
                .await
                .unwrap();
        }
        live.row_reaches(id, "currency", 25).await;
        // The copy's next save finds the row moved, takes the gift in and writes again.
        live.runtime.save_now(copy).await.unwrap();
        let held = live.runtime.read(copy, |s| s["currency"].clone()).unwrap();
        assert_eq!(held, 25, "{}: the gift reached the live copy", d.name());
        assert!(matches!(
            live.runtime.logout(copy).await.unwrap(),
            FinalSave::Saved { .. }
        ));
        let row = live.row(id).await;
        assert_eq!(
            (row["currency"].clone(), row["experience"].clone()),
            (25.into(), 3.into())
        );
        live.stop().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_dropped_stream_resumes_with_its_ledger(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let mut config = LiveConfig::new("shard-a");
        // Far longer than the test: the journal worker writes the resume ledger on its own
        // time (a loaded CI run once took past 2 s), and the grace must not lapse before it.
        // The lapse has its own test with a short grace.
        config.link_dead_for = Duration::from_secs(120);
        let live = Live::with(&d, &redis, config).await;
        let id = live
            .runtime
            .create("Dara", Uuid::now_v7(), anchor("zone-0"))
            .await
            .unwrap();
        let first = live
            .runtime
            .login(id, SessionStart::default())
            .await
            .unwrap();
        set(first.copy, &live.runtime, "experience", 9);
        live.runtime
            .detach(first.copy, &first.session_token, 17)
            .unwrap();
        // The journal worker writes the resume ledger from the closed stream's entry.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while live
            .services
            .coord
            .resume_load(&first.session_token)
            .await
            .unwrap()
            .is_none()
        {
            assert!(tokio::time::Instant::now() < deadline, "{}", d.name());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            live.runtime.copy_of(id),
            Some(first.copy),
            "{}: still link-dead, not logged out",
            d.name()
        );
        let again = live
            .runtime
            .login(id, SessionStart::default())
            .await
            .unwrap();
        assert_eq!(again.copy, first.copy, "{}: the same copy", d.name());
        let resumed = again.resumed.expect("resumed");
        assert_eq!(resumed.previous_session, first.session_token);
        assert_eq!(resumed.ledger.map(|l| l.last_applied_seq), Some(17));
        assert_eq!(
            live.runtime
                .read(again.copy, |s| s["experience"].clone())
                .unwrap(),
            9,
            "{}: the resumed copy kept its progress",
            d.name()
        );
        live.stop().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_late_close_of_a_replaced_connection_leaves_the_resumed_session_playing(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let mut config = LiveConfig::new("shard-a");
        config.link_dead_for = Duration::from_millis(300);
        let live = Live::with(&d, &redis, config).await;
        let mut events = live.runtime.subscribe();
        let (id, first) = live.admitted("Dara").await;
        // The player reconnects before its first connection's close reaches the game.
        let again = live
            .runtime
            .login(id, SessionStart::default())
            .await
            .unwrap();
        assert_eq!(again.copy, first.copy, "{}: resumed", d.name());
        assert_ne!(again.session_token, first.session_token);
        live.runtime
            .detach(first.copy, &first.session_token, 3)
            .unwrap();
        // Well past the grace: the resumed session still plays.
        let lapsed = |events: &mut tokio::sync::broadcast::Receiver<LiveEvent>| {
            let mut events = events.resubscribe();
            async move {
                loop {
                    match events.recv().await {
                        Ok(LiveEvent::LinkDeadExpired { copy }) => return copy,
                        Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(error) => panic!("{error}"),
                    }
                }
            }
        };
        let early = tokio::time::timeout(Duration::from_secs(2), lapsed(&mut events)).await;
        assert!(
            early.is_err(),
            "{}: the live session was detached",
            d.name()
        );
        assert_eq!(live.runtime.copy_of(id), Some(first.copy), "{}", d.name());
        // Its own close detaches it.
        let waiting = tokio::spawn(lapsed(&mut events));
        live.runtime
            .detach(again.copy, &again.session_token, 4)
            .unwrap();
        let expired = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(expired, again.copy, "{}", d.name());
        live.stop().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_link_dead_copy_whose_grace_lapses_logs_out_saved(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let mut config = LiveConfig::new("shard-a");
        config.link_dead_for = Duration::from_millis(300);
        let live = Live::with(&d, &redis, config).await;
        let mut events = live.runtime.subscribe();
        let (id, admitted) = live.admitted("Dara").await;
        let copy = admitted.copy;
        set(copy, &live.runtime, "experience", 9);
        live.runtime
            .detach(copy, &admitted.session_token, 18)
            .unwrap();
        // Dropped and never back: logged out when the grace runs out, saved.
        let expired = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(expired, LiveEvent::LinkDeadExpired { copy }, "{}", d.name());
        live.row_reaches(id, "experience", 9).await;
        assert!(live.runtime.copy_of(id).is_none(), "{}", d.name());
        live.stop().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn logout_saves_wait_for_room_in_a_full_saver_and_are_never_dropped(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let mut config = LiveConfig::new("shard-a");
        config.saver.queue_depth = 1;
        config.saver.max_batch = 1;
        let live = Live::with(&d, &redis, config).await;
        let mut players = Vec::new();
        for n in 0..24 {
            let (id, copy) = live.player(&format!("P{n}")).await;
            set(copy, &live.runtime, "experience", 100 + n);
            players.push((id, copy, 100 + n));
        }
        let logouts = players
            .iter()
            .map(|(_, copy, _)| live.runtime.logout(*copy));
        let outcomes = futures::future::join_all(logouts).await;
        for outcome in outcomes {
            assert!(
                matches!(outcome, Ok(FinalSave::Saved { .. })),
                "{}: {outcome:?}",
                d.name()
            );
        }
        for (id, _, xp) in players {
            assert_eq!(live.row(id).await["experience"], xp, "{}", d.name());
        }
        assert_eq!(live.runtime.saver().stats().final_dropped, 0);
        live.stop().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_handoff_carries_the_copy_and_a_zombies_is_refused(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let a = Live::on(&d, &redis, "shard-a").await;
        // b saves nothing on its own: a checkpoint refused once a's login takes the character
        // would evict its copy before the zombie's handoff this test makes.
        let mut quiet = LiveConfig::new("shard-b");
        quiet.own_pulse = false;
        let b = Live::with(&d, &redis, quiet).await;
        let (id, copy) = a.player("Eryn").await;
        set(copy, &a.runtime, "experience", 12);
        let ticket = a
            .runtime
            .hand_off(copy, "shard-b", anchor("zone-1"))
            .await
            .unwrap();
        assert!(a.runtime.copy_of(id).is_none(), "{}: it left a", d.name());
        let arrived = b
            .runtime
            .arrive(&ticket.token, SessionStart::default())
            .await
            .unwrap();
        assert_eq!(
            arrived.source,
            Some(shardkeep::character::LoadSource::Handoff)
        );
        let xp = b.runtime.read(arrived.copy, |s| s["experience"].clone());
        assert_eq!(xp.unwrap(), 12, "{}", d.name());
        assert!(matches!(
            b.runtime
                .arrive(&ticket.token, SessionStart::default())
                .await,
            Err(LiveError::UnknownHandoff)
        ));
        // A second login on a makes b's copy a zombie; its handoff back is refused.
        let fresh = a.runtime.login(id, SessionStart::default()).await.unwrap();
        set(fresh.copy, &a.runtime, "experience", 30);
        a.runtime.save_now(fresh.copy).await.unwrap();
        set(arrived.copy, &b.runtime, "experience", 999);
        let stale = b
            .runtime
            .hand_off(arrived.copy, "shard-c", anchor("zone-2"))
            .await
            .unwrap();
        let c = Live::on(&d, &redis, "shard-c").await;
        let landed = c
            .runtime
            .arrive(&stale.token, SessionStart::default())
            .await
            .unwrap();
        assert_ne!(
            landed.source,
            Some(shardkeep::character::LoadSource::Handoff),
            "{}: the zombie's content is refused",
            d.name()
        );
        let xp = c.runtime.read(landed.copy, |s| s["experience"].clone());
        assert_eq!(xp.unwrap(), 30, "{}: the live copy's save", d.name());
        for shard in [a, b, c] {
            shard.stop().await;
        }
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn shutdown_saves_everyone_and_reports_nothing_unsaved(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let live = Live::on(&d, &redis, "shard-a").await;
        let mut ids = Vec::new();
        for n in 0..3 {
            let (id, copy) = live.player(&format!("S{n}")).await;
            set(copy, &live.runtime, "experience", 40 + n);
            ids.push((id, 40 + n));
        }
        let report = live.runtime.clone().shutdown(Duration::from_secs(10)).await;
        assert_eq!(report.finalized, 3, "{}", d.name());
        assert_eq!(report.saver, shardkeep::drain::BarrierOutcome::Drained);
        assert_eq!(report.unsaved_finals.total(), 0);
        assert_eq!(report.unjournaled, 0);
        assert_eq!(report.unfinished_writes, 0, "{}", d.name());
        for (id, xp) in ids {
            assert_eq!(live.row(id).await["experience"], xp, "{}", d.name());
        }
        live.cancel.cancel();
        live.workers.shutdown(Duration::from_secs(10)).await;
    }
}

#[tokio::test]
async fn a_cadence_whose_checkpoints_would_lapse_is_refused() {
    let sqlite = shardkeep_testkit::TestSqlite::new().await;
    let redis = TestRedis::new().await;
    let d = JobDriver::Embedded(sqlite.backend());
    let services = services_on(&d, &redis, ServicesConfig::new("it-cadence", "game_server"));
    let mut config = LiveConfig::new("shard-a");
    config.cadence.checkpoint_every = Duration::from_secs(20 * 60);
    config.cadence.flush_every = Duration::from_secs(25 * 60);
    let refused = Runtime::start(&services, Stored::new(LedgerModel, Map::new), config);
    assert!(matches!(
        refused,
        Err(shardkeep::live::StartError::Cadence(
            shardkeep::live::CadenceError::OutlivesCheckpoints { .. }
        ))
    ));
    let mut config = LiveConfig::new("shard a");
    config.cadence = Cadence::default();
    assert!(matches!(
        Runtime::start(&services, Stored::new(LedgerModel, Map::new), config),
        Err(shardkeep::live::StartError::ShardId)
    ));
}

/// Gail's horn, saved in her row and then put down by her copy, and Hale beside her, both
/// logged in on `live`.
pub(super) struct HornPutDown {
    pub(super) horn: Uuid,
    pub(super) gail: (Uuid, CopyId),
    pub(super) hale: (Uuid, CopyId),
    pub(super) mark: shardkeep::live::ReleaseMark,
}

pub(super) async fn horn_put_down(live: &Live) -> HornPutDown {
    let rt = &live.runtime;
    let horn = Uuid::now_v7();
    let gail = live.player("Gail").await;
    let hale = live.player("Hale").await;
    rt.update(gail.1, holding(&[horn])).unwrap();
    rt.save_now(gail.1).await.unwrap();
    rt.update(gail.1, without(horn)).unwrap();
    let mark = rt.release(gail.1).unwrap();
    HornPutDown {
        horn,
        gail,
        hale,
        mark,
    }
}

/// Hale's copy picking the horn up, in a task of its own.
pub(super) fn picking_up(
    rt: &Runtime<Ledger>,
    put_down: &HornPutDown,
) -> tokio::task::JoinHandle<Result<shardkeep::live::PickedUp, LiveError>> {
    let (rt, hale, horn, mark) = (rt.clone(), put_down.hale.1, put_down.horn, put_down.mark);
    tokio::spawn(async move {
        rt.pick_up(hale, horn, Some(mark), Value::Null, holding(&[horn]))
            .await
    })
}

pub(super) fn holding(items: &[Uuid]) -> impl Fn(&mut Map<String, Value>) + '_ {
    move |state| {
        let list = state
            .entry("inventory")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Some(list) = list.as_array_mut() {
            list.extend(
                items
                    .iter()
                    .map(|id| serde_json::json!({ "id": id.to_string() })),
            );
        }
    }
}

pub(super) fn without(item: Uuid) -> impl Fn(&mut Map<String, Value>) {
    move |state| {
        if let Some(list) = state.get_mut("inventory").and_then(Value::as_array_mut) {
            list.retain(|i| i["id"] != item.to_string());
        }
    }
}

pub(super) fn holds(row: &Value, item: Uuid) -> bool {
    row["inventory"]
        .as_array()
        .is_some_and(|list| list.iter().any(|i| i["id"] == item.to_string()))
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn pickups_commit_as_transfers_unless_the_picking_copy_put_the_item_down(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let live = Live::on(&d, &redis, "shard-a").await;
        let rt = &live.runtime;
        let (gem, ore, own) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let (aria_id, aria) = live.player("Aria").await;
        let (bram_id, bram) = live.player("Bram").await;
        rt.update(aria, holding(&[gem, ore, own])).unwrap();
        rt.save_now(aria).await.unwrap();
        // Aria puts her own item down and takes it back: a plain move.
        rt.update(aria, without(own)).unwrap();
        let mark = rt.release(aria).unwrap();
        let back = rt
            .pick_up(aria, own, Some(mark), Value::Null, holding(&[own]))
            .await
            .unwrap();
        assert_eq!(back, shardkeep::live::PickedUp::Moved, "{}", d.name());
        // Bram picks up the gem Aria put down: both rows and the audit row, together.
        rt.update(aria, without(gem)).unwrap();
        let mark = rt.release(aria).unwrap();
        let taken = rt
            .pick_up(
                bram,
                gem,
                Some(mark),
                serde_json::json!({ "room": "r1" }),
                holding(&[gem]),
            )
            .await
            .unwrap();
        assert_eq!(taken, shardkeep::live::PickedUp::Committed, "{}", d.name());
        assert!(holds(&live.row(bram_id).await, gem), "{}", d.name());
        assert!(!holds(&live.row(aria_id).await, gem), "{}", d.name());
        assert!(
            rt.read(bram, |s| holds(&Value::Object(s.clone()), gem))
                .unwrap()
        );
        // Aria puts the ore down and leaves; a later copy of her picks it up: a transfer, so it
        // is held once.
        rt.update(aria, without(ore)).unwrap();
        let ore_mark = rt.release(aria).unwrap();
        assert!(matches!(
            rt.logout(aria).await.unwrap(),
            FinalSave::Saved { .. }
        ));
        let again = rt
            .login(aria_id, SessionStart::default())
            .await
            .unwrap()
            .copy;
        let picked = rt
            .pick_up(again, ore, Some(ore_mark), Value::Null, holding(&[ore]))
            .await
            .unwrap();
        assert_eq!(picked, shardkeep::live::PickedUp::Committed, "{}", d.name());
        let held = rt.read(again, |s| s["inventory"].clone()).unwrap();
        let copies = held.as_array().map_or(0, |l| {
            l.iter().filter(|i| i["id"] == ore.to_string()).count()
        });
        assert_eq!(copies, 1, "{}: {held}", d.name());
        live.stop().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_item_a_zombie_put_down_is_voided_not_handed_on(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        // Shard a runs no cadence of its own: its next checkpoint, refused once b's login took
        // the checkpoint over, would evict the zombie before it puts the ring down (a loaded
        // pass once let 100 ms pass between b's login and a's update).
        let mut config = LiveConfig::new("shard-a");
        config.own_pulse = false;
        let a = Live::with(&d, &redis, config).await;
        let b = Live::on(&d, &redis, "shard-b").await;
        let ring = Uuid::now_v7();
        let (cato_id, cato) = a.player("Cato").await;
        let (_, dara) = a.player("Dara").await;
        a.runtime.update(cato, holding(&[ring])).unwrap();
        a.runtime.save_now(cato).await.unwrap();
        // Cato logs in on b: a's copy is a zombie, and puts the ring down there.
        b.runtime
            .login(cato_id, SessionStart::default())
            .await
            .unwrap();
        a.runtime.update(cato, without(ring)).unwrap();
        let mark = a.runtime.release(cato).unwrap();
        let picked = a
            .runtime
            .pick_up(dara, ring, Some(mark), Value::Null, holding(&[ring]))
            .await
            .unwrap();
        assert!(
            matches!(picked, shardkeep::live::PickedUp::Void { .. }),
            "{}: {picked:?}",
            d.name()
        );
        assert!(
            !a.runtime
                .read(dara, |s| holds(&Value::Object(s.clone()), ring))
                .unwrap()
        );
        a.stop().await;
        b.stop().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn what_a_crashed_copy_put_down_is_not_picked_up_as_a_second_copy(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let a = Live::on(&d, &redis, "shard-a").await;
        let ore = Uuid::now_v7();
        let (eryn_id, eryn) = a.player("Eryn").await;
        a.runtime.update(eryn, holding(&[ore])).unwrap();
        a.runtime.save_now(eryn).await.unwrap();
        // She puts the ore down, and the shard dies before anything records it: the floor
        // copy lives on (on another shard's floor, say) while her row still holds the ore.
        a.runtime.update(eryn, without(ore)).unwrap();
        let mark = a.runtime.release(eryn).unwrap();
        a.runtime.kill();
        let b = Live::on(&d, &redis, "shard-b").await;
        let again = b
            .runtime
            .login(eryn_id, SessionStart::default())
            .await
            .unwrap()
            .copy;
        assert!(
            b.runtime
                .read(again, |s| holds(&Value::Object(s.clone()), ore))
                .unwrap()
        );
        let picked = b
            .runtime
            .pick_up(again, ore, Some(mark), Value::Null, holding(&[ore]))
            .await
            .unwrap();
        assert!(
            !matches!(
                picked,
                shardkeep::live::PickedUp::Committed | shardkeep::live::PickedUp::Moved
            ),
            "{}: the floor copy is a phantom: {picked:?}",
            d.name()
        );
        let held = b.runtime.read(again, |s| s["inventory"].clone()).unwrap();
        let count = held.as_array().map_or(0, |l| {
            l.iter().filter(|i| i["id"] == ore.to_string()).count()
        });
        assert_eq!(count, 1, "{}: {held}", d.name());
        b.stop().await;
        a.stop_workers().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_offline_grant_that_lands_before_a_handoff_is_arrived_with(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let a = Live::on(&d, &redis, "shard-a").await;
        let b = Live::on(&d, &redis, "shard-b").await;
        let (id, copy) = a.player("Fenn").await;
        set(copy, &a.runtime, "experience", 4);
        // The gift lands on the row; the copy has not written since, so it does not hold it.
        a.runtime
            .grant_offline(id, "gift-9", coins(30))
            .await
            .unwrap();
        a.row_reaches(id, "currency", 30).await;
        let ticket = a
            .runtime
            .hand_off(copy, "shard-b", anchor("zone-1"))
            .await
            .unwrap();
        let arrived = b
            .runtime
            .arrive(&ticket.token, SessionStart::default())
            .await
            .unwrap();
        let (currency, experience) = b
            .runtime
            .read(arrived.copy, |s| {
                (s.get("currency").cloned(), s.get("experience").cloned())
            })
            .unwrap();
        assert_eq!(
            currency,
            Some(30.into()),
            "{}: the gift came along",
            d.name()
        );
        assert_eq!(
            experience,
            Some(4.into()),
            "{}: the carried content too",
            d.name()
        );
        assert!(matches!(
            b.runtime.logout(arrived.copy).await.unwrap(),
            FinalSave::Saved { .. }
        ));
        assert_eq!(b.row(id).await["currency"], 30, "{}", d.name());
        a.stop().await;
        b.stop().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_logout_waits_for_a_pickup_in_flight_and_saves_its_item(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let live = Live::on(&d, &redis, "shard-a").await;
        let rt = live.runtime.clone();
        let put_down = horn_put_down(&live).await;
        let (horn, (hale_id, hale)) = (put_down.horn, put_down.hale);
        let picking = picking_up(&rt, &put_down);
        tokio::task::yield_now().await;
        let bye = rt.logout(hale).await;
        let picked = picking.await.unwrap();
        match (picked, bye) {
            (Ok(shardkeep::live::PickedUp::Committed), Ok(FinalSave::Saved { .. })) => {
                assert!(holds(&live.row(hale_id).await, horn), "{}", d.name());
            }
            // The logout came first: the pickup found the copy gone, nothing moved.
            (Err(LiveError::Gone(_)), Ok(FinalSave::Saved { .. })) => {
                assert!(!holds(&live.row(hale_id).await, horn), "{}", d.name());
            }
            other => panic!("{}: {other:?}", d.name()),
        }
        live.stop().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_reconnect_over_a_dead_connection_keeps_the_new_sessions_presence(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let live = Live::on(&d, &redis, "shard-a").await;
        let id = live
            .runtime
            .create("Iona", Uuid::now_v7(), anchor("zone-0"))
            .await
            .unwrap();
        let first = live
            .runtime
            .login(id, SessionStart::default())
            .await
            .unwrap();
        // The connection died without a word; the player logs in again on the same shard.
        let second = live
            .runtime
            .login(id, SessionStart::default())
            .await
            .unwrap();
        assert_eq!(second.copy, first.copy);
        // The old stream's cleanup is older than the new session: once the journal has run it,
        // presence still names the new session.
        let journal = live.services.journal.queue();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let depths = journal.depths().await.unwrap();
            let presence = live
                .services
                .coord
                .presence_by_character(&id.to_string())
                .await
                .unwrap();
            if depths.pending + depths.processing == 0
                && presence.as_ref().map(|p| p.session_token.as_str())
                    == Some(second.session_token.as_str())
            {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}: presence {presence:?}, depths {depths:?}",
                d.name()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // And it stays so: a refresh under the new session's place is not refused as stale.
        let check = live
            .services
            .coord
            .session_order_mark(&id.to_string())
            .await
            .unwrap();
        assert!(check.is_some(), "{}", d.name());
        live.stop().await;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_runtime_on_the_games_tick_saves_only_when_the_game_pulses(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let mut config = LiveConfig::new("shard-a");
        config.own_pulse = false;
        let live = Live::with(&d, &redis, config).await;
        let (id, copy) = live.player("Jory").await;
        set(copy, &live.runtime, "experience", 77);
        let checkpoints = d.checkpoints(&redis);
        let held = |c: Option<shardkeep::character::CharacterSnapshot>| {
            c.and_then(|s| s.state.value().get("experience").and_then(Value::as_i64))
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            held(checkpoints.read(id).await.unwrap()),
            None,
            "{}",
            d.name()
        );
        // Checkpoints come every 5 pulses: 6 pulses reach every copy's place.
        for _ in 0..6 {
            live.runtime.pulse();
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while held(checkpoints.read(id).await.unwrap()) != Some(77) {
            assert!(tokio::time::Instant::now() < deadline, "{}", d.name());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        live.stop().await;
    }
}

/// A pickup's commit writes the acquirer's row with a dump holding the item, numbered before the
/// copy holds it. A checkpoint of the acquirer dumped while that commit is on its way (numbered
/// after it, without the item) would outrank the row on its mark at the next load: the item would
/// be in no row. The runtime saves no copy in a transfer until the commit answers. Postgres only:
/// the commit is held up by a row lock (the embedded store's file has one write lock for all).
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_copy_in_a_transfer_is_not_checkpointed_until_its_commit_answers(pool: PgPool) {
    let redis = TestRedis::new().await;
    let d = JobDriver::Postgres(pool.clone());
    let mut config = LiveConfig::new("shard-a");
    config.own_pulse = false;
    let live = Live::with(&d, &redis, config).await;
    let rt = live.runtime.clone();
    let put_down = horn_put_down(&live).await;
    let (horn, (hale_id, hale)) = (put_down.horn, put_down.hale);
    // Hale's row is locked: the commit waits.
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM characters WHERE id = $1 FOR UPDATE")
        .bind(hale_id)
        .execute(&mut *lock)
        .await
        .unwrap();
    let picking = picking_up(&rt, &put_down);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Hale plays on and every cadence comes round while the commit waits.
    set(hale, &rt, "experience", 5);
    for _ in 0..6 {
        rt.pulse();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    lock.rollback().await.unwrap();
    let picked = picking.await.unwrap().unwrap();
    assert_eq!(picked, shardkeep::live::PickedUp::Committed);
    // The shard dies before its next pulse; Hale logs in elsewhere.
    rt.kill();
    let other = Live::on(&d, &redis, "shard-b").await;
    let again = other
        .runtime
        .login(hale_id, SessionStart::default())
        .await
        .unwrap();
    let state = other
        .runtime
        .read(again.copy, |c| Value::Object(c.clone()))
        .unwrap();
    assert!(holds(&state, horn), "the horn is in no row: {state}");
    other.stop().await;
    live.stop_workers().await;
}

/// Postgres only: a trigger holds the final's second write. A final that lost its version race
/// is merged and queued again within the shutdown's pause after its barrier: the shutdown waits
/// for that write rather than reporting the final unsaved (or returning before it lands).
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_shutdown_waits_for_a_final_merged_and_queued_again(pool: PgPool) {
    let redis = TestRedis::new().await;
    let d = JobDriver::Postgres(pool.clone());
    let live = Live::on(&d, &redis, "shard-a").await;
    let (id, copy) = live.player("Wren").await;
    set(copy, &live.runtime, "experience", 41);
    // A write landed under the copy (as a job's would): its final loses the race.
    sqlx::query("UPDATE characters SET state_version = state_version + 1 WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::raw_sql(
        r#"CREATE FUNCTION slow_final() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             IF NEW.state->>'experience' = '41'
                AND OLD.state->>'experience' IS DISTINCT FROM '41' THEN
               PERFORM pg_sleep(0.5);
             END IF;
             RETURN NEW;
           END $$;
           CREATE TRIGGER slow_final BEFORE UPDATE ON characters
             FOR EACH ROW EXECUTE FUNCTION slow_final();"#,
    )
    .execute(&pool)
    .await
    .unwrap();
    let report = live.runtime.clone().shutdown(Duration::from_secs(10)).await;
    assert_eq!(report.finalized, 1);
    assert_eq!(
        report.unsaved_finals.total(),
        0,
        "the merged final landed: {:?}",
        report.unsaved_finals
    );
    assert_eq!(live.row(id).await["experience"], 41);
    live.stop_workers().await;
}

/// A shutdown of a runtime already killed (its saver stopped with it) has nothing to wait for:
/// it returns at once and reports the logout saves it could not make (the stopped saver refused
/// them), instead of offering them to a stopped saver until its bound runs out or reporting
/// them saved.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_shutdown_after_a_kill_returns_at_once_and_reports_what_it_could_not_save(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let live = Live::on(&d, &redis, "shard-a").await;
        let (_, copy) = live.player("Rook").await;
        set(copy, &live.runtime, "experience", 5);
        live.runtime.kill();
        // The stopped saver's drainer has gone: the final is refused, not queued.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = tokio::time::Instant::now();
        let report = live.runtime.clone().shutdown(Duration::from_secs(10)).await;
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{}: took {:?}",
            d.name(),
            started.elapsed()
        );
        assert_eq!(report.finalized, 1, "{}", d.name());
        assert_eq!(report.unsaved_finals.total(), 1, "{}: {report:?}", d.name());
        live.stop_workers().await;
    }
}
