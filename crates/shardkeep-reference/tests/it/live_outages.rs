//! The reference shard on the runtime through store outages, on each driver: a logout's final
//! save waits for the store and the shutdown reports the truth, an outage longer than the
//! saver's budget makes it a durable retry job (fenced like any save), a login waits for it, a
//! transfer whose commit stays unknown voids its item, the cadences recover, a zombie's logout
//! writes nothing, and the tick never waits on a store. On Postgres + Redis the outage takes
//! the rows and jobs while checkpoints still land; on the embedded file it takes every tier.

use std::time::Duration;

use shardkeep::drain::BarrierOutcome;
use shardkeep::live::{FinalSave, SessionStart};
use shardkeep::saver::UnsavedFinals;
use shardkeep_reference::live_shard::{LiveShard, LiveShardConfig, Pickup};
use shardkeep_reference::shard::ZoneDirectory;
use sqlx::PgPool;
use uuid::Uuid;

use super::faultable::{Driver, FaultableServices};
use super::live_support::{boot_in, config, give_gem, holds, new_character, tick_until};

/// A shard whose stores go through a faultable path, with Aria logged in.
struct Scene {
    stores: FaultableServices,
    shard: LiveShard,
    id: Uuid,
}

impl Scene {
    async fn logged_in(
        pool: &PgPool,
        driver: Driver,
        tune: impl FnOnce(&mut LiveShardConfig),
    ) -> Self {
        let stores = FaultableServices::new(pool, driver).await;
        let mut live = config("shard-a", "zone-0");
        live.live.saver.io_timeout = Duration::from_millis(500);
        live.live.io_timeout = Duration::from_millis(500);
        tune(&mut live);
        let mut shard = boot_in(&stores.shard, live, &[0], 1, &ZoneDirectory::new());
        let id = new_character(&stores.own, "Aria").await;
        shard.login(id, SessionStart::default()).await.unwrap();
        Self { stores, shard, id }
    }

    /// `n` more players logged in.
    async fn more_players(&mut self, n: usize) {
        for n in 0..n {
            let id = new_character(&self.stores.own, &format!("P{n}")).await;
            self.shard.login(id, SessionStart::default()).await.unwrap();
        }
    }

    async fn currency(&self) -> serde_json::Value {
        let row = self
            .stores
            .own
            .characters
            .load(self.id)
            .await
            .unwrap()
            .unwrap();
        row.state["currency"].clone()
    }

    async fn jobs(&self) -> i64 {
        self.stores.jobs.count("persistence_retry_jobs").await
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn shutdown_does_not_report_drained_while_a_final_save_is_unsaved(pool: PgPool) {
    for driver in Driver::ALL {
        let Scene {
            stores,
            mut shard,
            id,
        } = Scene::logged_in(&pool, driver, |_| {}).await;
        let name = stores.driver;
        shard.update(id, |c| c.currency = 42).unwrap();
        stores.outage.cut();
        shard.logout(id).unwrap();
        let report = shard.shutdown(Duration::from_secs(2)).await;
        assert_eq!(report.saver, BarrierOutcome::TimedOut, "{name}: {report:?}");
        // Beside Postgres the checkpoint tier still answers and holds the logout; in the file
        // the outage took it too, and the report says so.
        let checkpointed = usize::from(!stores.checkpoints_share_the_outage());
        assert_eq!(
            report.unsaved_finals,
            UnsavedFinals {
                queued: 0,
                pending: 1,
                checkpointed,
                dropped: 0,
            },
            "{name}: the report names the unsaved logout and whether a checkpoint holds it"
        );
        let row = stores.own.characters.load(id).await.unwrap().unwrap();
        assert_ne!(row.state["currency"], 42, "{name}");
        let checkpoint = stores.own.checkpoints.read(id).await.unwrap();
        let held = checkpoint.is_some_and(|c| c.state["currency"] == 42);
        assert_eq!(
            held,
            checkpointed == 1,
            "{name}: the checkpoint is as reported"
        );
        stores.outage.heal();
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn shutdown_waits_for_a_final_save_that_lands_within_its_bound(pool: PgPool) {
    for driver in Driver::ALL {
        let mut scene = Scene::logged_in(&pool, driver, |_| {}).await;
        let (name, id) = (scene.stores.driver, scene.id);
        scene.shard.update(id, |c| c.currency = 42).unwrap();
        scene.stores.outage.cut();
        scene.shard.logout(id).unwrap();
        let healing = async {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            scene.stores.outage.heal();
        };
        let (report, ()) = tokio::join!(scene.shard.shutdown(Duration::from_secs(15)), healing);
        assert_eq!(report.saver, BarrierOutcome::Drained, "{name}");
        assert_eq!(report.unsaved_finals, UnsavedFinals::default(), "{name}");
        assert_eq!(
            scene.currency().await,
            42,
            "{name}: Drained means the logout's changes are in the row"
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_final_save_outlasting_the_outage_budget_becomes_a_retry_job(pool: PgPool) {
    for driver in Driver::ALL {
        let mut scene = Scene::logged_in(&pool, driver, |c| {
            c.live.saver.final_outage_budget = Duration::from_millis(800);
        })
        .await;
        let (name, id) = (scene.stores.driver, scene.id);
        scene.shard.update(id, |c| c.currency = 42).unwrap();
        scene.stores.outage.cut();
        let mut out = scene.shard.logout(id).unwrap();
        // The outage outlasts the budget by far; then the store comes back (on the file, the
        // job itself waits for that).
        tokio::time::sleep(Duration::from_secs(3)).await;
        scene.stores.outage.heal();
        tick_until(&mut scene.shard, "the final save's answer", |_| {
            out.outcome().is_some()
        })
        .await;
        let Some(FinalSave::QueuedAsJob { retry_job_id }) = out.outcome() else {
            panic!("{name}: {:?}", out.outcome());
        };
        assert_eq!(scene.jobs().await, 1, "{name}");
        let (job, kind, payload, epoch): (Uuid, String, String, i64) = scene
            .stores
            .jobs
            .fetch_one(
                "SELECT retry_job_id, job_kind, payload::text, owner_epoch FROM persistence_retry_jobs
                  WHERE character_id = $1",
                Some(id),
            )
            .await;
        let payload: serde_json::Value = serde_json::from_str(&payload).unwrap();
        assert_eq!(
            (job, kind.as_str()),
            (retry_job_id, "gameplay_state"),
            "{name}"
        );
        assert_eq!(payload["state"]["currency"], 42, "{name}");
        assert!(epoch > 0, "{name}: the job carries the copy's epoch");
        assert_ne!(scene.currency().await, 42, "{name}: not applied yet");
        // The retry worker applies it, fenced by the departed copy's epoch like any save.
        let (applied, _) = scene.stores.run_retry_worker().await;
        assert_eq!(applied, 1, "{name}");
        assert_eq!(scene.currency().await, 42, "{name}");
        scene.shard.kill();
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_final_save_job_from_a_superseded_copy_is_fenced(pool: PgPool) {
    for driver in Driver::ALL {
        let mut scene = Scene::logged_in(&pool, driver, |c| {
            c.live.saver.final_outage_budget = Duration::from_millis(300);
        })
        .await;
        let (name, id) = (scene.stores.driver, scene.id);
        scene.shard.update(id, |c| c.currency = 42).unwrap();
        scene.stores.outage.cut();
        let mut out = scene.shard.logout(id).unwrap();
        // Meanwhile the character logs in elsewhere (a newer owner) and saves.
        let characters = &scene.stores.own.characters;
        let claimed = characters.claim(id, 0).await.unwrap();
        let mut live = claimed.row.clone();
        live.owner_epoch = claimed.new_epoch;
        live.state = serde_json::json!({ "currency": 7 }).into();
        characters.save(&live).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        scene.stores.outage.heal();
        tick_until(&mut scene.shard, "the final save's answer", |_| {
            out.outcome().is_some()
        })
        .await;
        assert!(
            matches!(out.outcome(), Some(FinalSave::QueuedAsJob { .. })),
            "{name}: {:?}",
            out.outcome()
        );
        let (applied, superseded) = scene.stores.run_retry_worker().await;
        assert_eq!(
            (applied, superseded),
            (1, 1),
            "{name}: the departed copy's save is fenced by the newer owner"
        );
        assert_eq!(scene.currency().await, 7, "{name}");
        scene.shard.kill();
    }
}

/// The store hangs (Postgres: no answer at all; the file: no write starts): the logout's save
/// is still in the saver's hands when the shutdown bound runs out, and the report counts it and
/// says whether its checkpoint holds it.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_shutdown_bound_running_out_counts_saves_still_unsaved(pool: PgPool) {
    for driver in Driver::ALL {
        let mut scene = Scene::logged_in(&pool, driver, |c| {
            c.live.saver.io_timeout = Duration::from_secs(5);
        })
        .await;
        let (name, id) = (scene.stores.driver, scene.id);
        scene.shard.update(id, |c| c.currency = 42).unwrap();
        scene.stores.outage.stall();
        scene.shard.logout(id).unwrap();
        let report = scene.shard.shutdown(Duration::from_millis(500)).await;
        assert_eq!(report.saver, BarrierOutcome::TimedOut, "{name}");
        assert_eq!(
            report.unsaved_finals.total(),
            1,
            "{name}: {:?}",
            report.unsaved_finals
        );
        assert_ne!(scene.currency().await, 42, "{name}: not in the row yet");
        // The runtime stopped with the bound: what the report counts as checkpointed is what
        // the next login loads; the rest is lost with the process, as reported.
        scene.stores.outage.heal();
        let checkpointed = report.unsaved_finals.checkpointed == 1;
        assert_eq!(
            checkpointed,
            !scene.stores.checkpoints_share_the_outage(),
            "{name}: {:?}",
            report.unsaved_finals
        );
        let loaded = scene.stores.own.loader.claim_and_load(id, 0).await.unwrap();
        assert_eq!(
            loaded.snapshot.state["currency"] == 42,
            checkpointed,
            "{name}: the next login loads what the report says a checkpoint holds"
        );
    }
}

/// A player logs out and in again at once on the same shard while the store stalls the
/// logout's final save: the login waits for the save instead of claiming over it (which would
/// fence the save out of the row), so the row holds the logout's changes as soon as the login
/// returns, and so does the new copy.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_login_waits_for_its_characters_final_save_still_in_flight(pool: PgPool) {
    for driver in Driver::ALL {
        let mut scene = Scene::logged_in(&pool, driver, |c| {
            c.live.io_timeout = Duration::from_secs(5);
            c.live.saver.io_timeout = Duration::from_secs(5);
        })
        .await;
        let (name, id) = (scene.stores.driver, scene.id);
        scene.shard.update(id, |c| c.currency = 42).unwrap();
        scene.stores.outage.stall();
        let first = scene.shard.copy_of(id).unwrap();
        scene.shard.logout(id).unwrap();
        let healing = async {
            tokio::time::sleep(Duration::from_millis(1000)).await;
            scene.stores.outage.heal();
        };
        let (entered, ()) = tokio::join!(
            scene.shard.runtime().login(id, SessionStart::default()),
            healing
        );
        let entered = scene.shard.enter(entered.unwrap()).unwrap();
        assert!(
            entered.admitted.copy.owner_epoch > first.owner_epoch,
            "{name}"
        );
        assert_eq!(
            scene.currency().await,
            42,
            "{name}: the row holds the logout's changes when the login returns"
        );
        assert_eq!(
            scene.shard.read(id, |c| c.currency).unwrap(),
            42,
            "{name}: the new copy loaded them"
        );
        scene.shard.kill();
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_transfer_whose_outcome_stays_unknown_voids_the_item(pool: PgPool) {
    for driver in Driver::ALL {
        let mut scene = Scene::logged_in(&pool, driver, |c| {
            c.live.transfer_budget = Duration::from_secs(1);
        })
        .await;
        let (name, a) = (scene.stores.driver, scene.id);
        let b = new_character(&scene.stores.own, "Bran").await;
        scene.shard.login(b, SessionStart::default()).await.unwrap();
        let gem = give_gem(&mut scene.shard, a);
        let copy = scene.shard.copy_of(a).unwrap();
        scene.shard.runtime().save_now(copy).await.unwrap();
        scene.shard.drop_item(a, gem).unwrap();
        scene.stores.outage.cut();
        assert_eq!(
            scene.shard.get_item(b, gem).unwrap(),
            Pickup::Transferring,
            "{name}"
        );
        let mut voided = Vec::new();
        tick_until(&mut scene.shard, "the transfer's budget", |s| {
            voided.extend(s.take_voided_items());
            s.transfer_counts() == (0, 1)
        })
        .await;
        assert_eq!(voided, vec![gem], "{name}: voided, on the record");
        assert!(
            !holds(&scene.shard, a, gem) && !holds(&scene.shard, b, gem),
            "{name}"
        );
        scene.stores.outage.heal();
        scene.shard.kill();
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn cadence_flushes_recover_after_an_outage(pool: PgPool) {
    for driver in Driver::ALL {
        let mut scene = Scene::logged_in(&pool, driver, |_| {}).await;
        let (name, id) = (scene.stores.driver, scene.id);
        scene.stores.outage.cut();
        scene.shard.update(id, |c| c.currency = 42).unwrap();
        let saver = scene.shard.runtime().saver().clone();
        tick_until(&mut scene.shard, "a failed flush", |_| {
            saver.stats().row_failed > 0
        })
        .await;
        assert_ne!(scene.currency().await, 42, "{name}");
        scene.stores.outage.heal();
        for _ in 0..100 {
            if scene.currency().await == 42 {
                break;
            }
            for _ in 0..5 {
                scene.shard.tick();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        assert_eq!(
            scene.currency().await,
            42,
            "{name}: a later cadence wrote it"
        );
        scene.shard.kill();
    }
}

/// The checkpoint tier goes away (Redis cut on the shard's path; on the embedded file, the
/// file): the checkpoints fail and the copy plays on; once it answers again a later cadence
/// writes the copy's checkpoint, with what changed meanwhile.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn cadence_checkpoints_recover_after_an_outage_of_their_tier(pool: PgPool) {
    for driver in Driver::ALL {
        let mut scene = Scene::logged_in(&pool, driver, |_| {}).await;
        let (name, id) = (scene.stores.driver, scene.id);
        scene.stores.fast.cut();
        scene.shard.update(id, |c| c.currency = 42).unwrap();
        let saver = scene.shard.runtime().saver().clone();
        let failed = saver.stats().checkpoint_failed;
        tick_until(&mut scene.shard, "a failed checkpoint", |_| {
            saver.stats().checkpoint_failed > failed
        })
        .await;
        let held = |c: Option<shardkeep::character::CharacterSnapshot>| {
            c.is_some_and(|c| c.state["currency"] == 42)
        };
        assert!(
            !held(scene.stores.own.checkpoints.read(id).await.unwrap()),
            "{name}: not written through the outage"
        );
        assert!(
            scene.shard.copy_of(id).is_some(),
            "{name}: the copy plays on"
        );
        scene.stores.fast.heal();
        let mut landed = false;
        for _ in 0..100 {
            if held(scene.stores.own.checkpoints.read(id).await.unwrap()) {
                landed = true;
                break;
            }
            for _ in 0..5 {
                scene.shard.tick();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        assert!(landed, "{name}: a later cadence wrote the checkpoint");
        scene.shard.kill();
    }
}

/// A zombie (a copy whose character logged in elsewhere since) logs out: its final save meets
/// the newer claim, writes nothing and becomes no job.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_zombies_logout_writes_nothing(pool: PgPool) {
    for driver in Driver::ALL {
        let mut scene = Scene::logged_in(&pool, driver, |_| {}).await;
        let (name, id) = (scene.stores.driver, scene.id);
        let directory = ZoneDirectory::new();
        let mut live = boot_in(
            &scene.stores.own,
            config("shard-b", "zone-0"),
            &[0],
            1,
            &directory,
        );
        live.login(id, SessionStart::default()).await.unwrap();
        live.update(id, |c| c.currency = 500).unwrap();
        let copy = live.copy_of(id).unwrap();
        live.runtime().save_now(copy).await.unwrap();
        scene.shard.update(id, |c| c.currency = 9_999).unwrap();
        let mut out = scene.shard.logout(id).unwrap();
        tick_until(&mut scene.shard, "the zombie's final save", |_| {
            out.outcome().is_some()
        })
        .await;
        assert_eq!(out.outcome(), Some(FinalSave::Superseded), "{name}");
        assert_eq!(scene.currency().await, 500, "{name}");
        assert_eq!(scene.jobs().await, 0, "{name}: no job either");
        // Whatever of it reached the checkpoint tier (a key no claim had taken over yet) is
        // never loaded: the next claim takes the live copy's content.
        live.kill();
        let loaded = scene.stores.own.loader.claim_and_load(id, 0).await.unwrap();
        assert_eq!(loaded.snapshot.state["currency"], 500, "{name}");
        scene.shard.kill();
    }
}

/// The store stalls and the saver's queue (8 entries here) fills with reconciling flushes: the
/// tick goes on at its pace, the saves that find no room are dropped and counted (the next
/// cadence saves the copy again), and the queue never grows past its depth.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_full_saver_drops_flushes_without_room_and_the_tick_never_waits(pool: PgPool) {
    for driver in Driver::ALL {
        let mut scene = Scene::logged_in(&pool, driver, |c| {
            c.live.saver.queue_depth = 8;
        })
        .await;
        let name = scene.stores.driver;
        scene.more_players(40).await;
        scene.stores.outage.stall();
        let saver = scene.shard.runtime().saver().clone();
        let before = scene.shard.pulse_count();
        let started = std::time::Instant::now();
        let mut deepest = 0;
        for _ in 0..100 {
            scene.shard.runtime().flush_all();
            scene.shard.tick();
            deepest = deepest.max(saver.depth());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{name}: 100 ticks took {:?}",
            started.elapsed()
        );
        assert_eq!(scene.shard.pulse_count(), before + 100, "{name}");
        assert!(deepest <= 8, "{name}: the queue grew to {deepest}");
        let stats = saver.stats();
        assert!(
            stats.dropped_checkpoint + stats.dropped_row > 0,
            "{name}: {stats:?}"
        );
        scene.stores.outage.heal();
        scene.shard.kill();
    }
}

/// The store stalls and the saver falls behind: the pulse owes the cadence's saves instead of
/// dumping saves the queue has no room for — none is dropped, the tick goes on at its pace —
/// and once the store answers the copies are saved again.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_saver_behind_owes_the_cadences_saves_and_drops_none(pool: PgPool) {
    for driver in Driver::ALL {
        let mut scene = Scene::logged_in(&pool, driver, |c| {
            c.live.saver.queue_depth = 8;
        })
        .await;
        let name = scene.stores.driver;
        scene.more_players(40).await;
        let saver = scene.shard.runtime().saver().clone();
        scene.stores.outage.stall();
        let started = std::time::Instant::now();
        let mut deepest = 0;
        for _ in 0..100 {
            scene.shard.tick();
            deepest = deepest.max(saver.depth());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{name}: 100 ticks took {:?}",
            started.elapsed()
        );
        let stalled = saver.stats();
        assert_eq!(
            (stalled.dropped_checkpoint, stalled.dropped_row),
            (0, 0),
            "{name}: the queue reached {deepest}"
        );
        scene.stores.outage.heal();
        // Every copy is checkpointed again once the saver drains (41 players).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while saver.stats().checkpoint_landed < stalled.checkpoint_landed + 41 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name}: {:?}",
                saver.stats()
            );
            scene.shard.tick();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(saver.stats().dropped_checkpoint, 0, "{name}");
        scene.shard.kill();
    }
}

/// Single saves waiting in the saver's queue (a wave of detaches, one entry each) do not put
/// the cadence off while the writer has room: backpressure counts the saves waiting, not the
/// queue's entries (four entries of one save each made every copy's cadence owe before).
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn single_saves_waiting_do_not_put_the_cadence_off(pool: PgPool) {
    for driver in Driver::ALL {
        let mut scene = Scene::logged_in(&pool, driver, |c| {
            c.live.saver.queue_depth = 64;
        })
        .await;
        let name = scene.stores.driver;
        let mut ids = Vec::new();
        for n in 0..40 {
            let id = new_character(&scene.stores.own, &format!("P{n}")).await;
            let entered = scene
                .shard
                .login(id, SessionStart::default())
                .await
                .unwrap();
            ids.push((id, entered.admitted.session_token));
        }
        let saver = scene.shard.runtime().saver().clone();
        scene.stores.outage.stall();
        // The writer takes what is queued and hangs on the stalled store (for its I/O bound).
        for _ in 0..3 {
            scene.shard.tick();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let before = saver.depth();
        for (id, token) in &ids[..6] {
            scene.shard.detach(*id, token, 0).unwrap();
        }
        assert_eq!(saver.depth(), before + 6, "{name}: one entry a detach");
        let mut deepest = 0;
        for _ in 0..15 {
            scene.shard.tick();
            deepest = deepest.max(saver.depth());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            deepest >= before + 6 + 3,
            "{name}: the cadence queued nothing behind six single saves ({before} before, \
             {deepest} at most)"
        );
        assert!(deepest < 64, "{name}: the queue filled ({deepest})");
        let stalled = saver.stats();
        assert_eq!(
            (stalled.dropped_checkpoint, stalled.dropped_row),
            (0, 0),
            "{name}"
        );
        scene.stores.outage.heal();
        scene.shard.kill();
    }
}

/// More players than the saver's queue holds (one entry here) shut down: the shutdown offers
/// their final saves as room frees up, and every one lands within its bound.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn shutdown_waits_for_room_for_every_final_save(pool: PgPool) {
    for driver in Driver::ALL {
        let mut scene = Scene::logged_in(&pool, driver, |c| {
            c.live.saver.queue_depth = 1;
            c.live.saver.max_batch = 1;
        })
        .await;
        let name = scene.stores.driver;
        let mut ids = vec![scene.id];
        for n in 0..11 {
            let id = new_character(&scene.stores.own, &format!("P{n}")).await;
            scene
                .shard
                .login(id, SessionStart::default())
                .await
                .unwrap();
            ids.push(id);
        }
        for (n, id) in ids.iter().enumerate() {
            let coins = 100 + i64::try_from(n).unwrap();
            scene.shard.update(*id, |c| c.currency = coins).unwrap();
        }
        let report = scene.shard.shutdown(Duration::from_secs(15)).await;
        assert_eq!(report.finalized, ids.len(), "{name}");
        assert_eq!(report.saver, BarrierOutcome::Drained, "{name}: {report:?}");
        assert_eq!(report.unsaved_finals, UnsavedFinals::default(), "{name}");
        for (n, id) in ids.iter().enumerate() {
            let row = scene
                .stores
                .own
                .characters
                .load(*id)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(row.state["currency"], 100 + n, "{name}: player {n}");
        }
    }
}

/// The crash window the runtime's saver measures: how old the newest durable copy of a player
/// is, per tier. A Postgres outage grows the row age while checkpoints keep the Redis age small;
/// an outage of the embedded file grows both, since both tiers are in it.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_store_outage_shows_as_a_growing_age_of_each_tier_it_takes(pool: PgPool) {
    use std::time::Instant;
    for driver in Driver::ALL {
        let mut scene = Scene::logged_in(&pool, driver, |_| {}).await;
        let (name, id) = (scene.stores.driver, scene.id);
        let saver = scene.shard.runtime().saver().clone();
        tick_until(&mut scene.shard, "both tiers landing", |_| {
            saver.stats().row_landed >= 1 && saver.stats().checkpoint_landed >= 1
        })
        .await;
        let fresh = saver.landed().measure(Instant::now(), &[id]);
        assert!(
            fresh.row_worst < Duration::from_secs(2),
            "{name}: {fresh:?}"
        );
        scene.stores.outage.cut();
        let cut_at = Instant::now();
        tick_until(&mut scene.shard, "the outage lasting", |_| {
            cut_at.elapsed() > Duration::from_millis(1_500)
        })
        .await;
        let during = saver.landed().measure(Instant::now(), &[id]);
        assert!(
            during.row_worst >= Duration::from_millis(1_500),
            "{name}: the row age grows through the outage: {during:?}"
        );
        if scene.stores.checkpoints_share_the_outage() {
            assert!(
                during.checkpoint_worst >= Duration::from_millis(1_500),
                "{name}: the checkpoints are in the file too: {during:?}"
            );
        } else {
            assert!(
                during.checkpoint_worst < Duration::from_secs(1),
                "{name}: checkpoints still land: {during:?}"
            );
        }
        scene.stores.outage.heal();
        tick_until(&mut scene.shard, "both tiers catching up", |_| {
            let now = saver.landed().measure(Instant::now(), &[id]);
            now.row_worst < Duration::from_secs(2) && now.checkpoint_worst < Duration::from_secs(1)
        })
        .await;
        scene.shard.kill();
    }
}
