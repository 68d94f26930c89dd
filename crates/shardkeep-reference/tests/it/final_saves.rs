//! A logout's final save through a store outage, on each driver: shutdown waits for it within
//! its bound and reports the truth, an outage longer than the saver's budget turns it into a
//! durable retry job instead of losing it, and a login waits for it. On Postgres + Redis the
//! outage takes the rows and jobs while checkpoints still land; on the embedded file it takes
//! every tier at once.

use std::time::Duration;

use shardkeep::drain::BarrierOutcome;
use shardkeep_reference::shard::ShardConfig;
use sqlx::PgPool;

use shardkeep::saver::UnsavedFinals;

use crate::faultable::{Driver, Faultable};
use crate::support::{Stores, boot_with, login};

fn config() -> ShardConfig {
    let mut config = ShardConfig::new("shard-a", "zone-0");
    config.saver.io_timeout = Duration::from_millis(500);
    config
}

/// A shard whose rows, checkpoints and jobs go through a faultable path, with Aria logged in.
struct Scene {
    stores: Faultable,
    shard: shardkeep_reference::shard::Shard,
    id: uuid::Uuid,
}

impl Scene {
    async fn logged_in(pool: &PgPool, driver: Driver, config: ShardConfig) -> Self {
        Self::logged_in_with(pool, driver, config, true).await
    }

    /// As [`Scene::logged_in`]; without `checkpoints` the shard writes rows and jobs only, so
    /// nothing but the row can carry a logout's changes.
    async fn logged_in_with(
        pool: &PgPool,
        driver: Driver,
        config: ShardConfig,
        checkpoints: bool,
    ) -> Self {
        let stores = Faultable::new(pool, driver).await;
        let mut shard_stores = stores.shard_stores.clone();
        if !checkpoints {
            shard_stores.checkpoints = None;
        }
        let mut shard = boot_with(shard_stores, &stores.stores, config, &[0], 1);
        let id = stores.stores.new_character("Aria").await;
        login(&stores.stores, &mut shard, id, "s").await;
        Self { stores, shard, id }
    }

    fn name(&self) -> &'static str {
        self.stores.stores.driver()
    }
}

async fn currency_of(stores: &Stores, id: uuid::Uuid) -> serde_json::Value {
    let row = stores.characters.load(id).await.unwrap().unwrap();
    row.state["currency"].clone()
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn shutdown_does_not_report_drained_while_a_final_save_is_unsaved(pool: PgPool) {
    for driver in Driver::ALL {
        let Scene {
            stores,
            mut shard,
            id,
        } = Scene::logged_in(&pool, driver, config()).await;
        let name = stores.stores.driver();
        shard.player_mut(id).unwrap().character.currency = 42;
        stores.outage.cut();
        shard.logout(id).unwrap();
        let report = shard.shutdown(Duration::from_secs(2)).await;
        assert_eq!(
            report.saver,
            BarrierOutcome::TimedOut,
            "{name}: the logout's changes are not durable yet"
        );
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
        assert_ne!(currency_of(&stores.stores, id).await, 42, "{name}");
        let checkpoint = stores.stores.checkpoints.read(id).await.unwrap();
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
        let Scene {
            stores,
            mut shard,
            id,
        } = Scene::logged_in(&pool, driver, config()).await;
        let name = stores.stores.driver();
        shard.player_mut(id).unwrap().character.currency = 42;
        stores.outage.cut();
        shard.logout(id).unwrap();
        let Faultable { stores, outage, .. } = stores;
        let (_outage, heal) = outage.heal_after(1500);
        let report = shard.shutdown(Duration::from_secs(15)).await;
        heal.await.unwrap();
        assert_eq!(report.saver, BarrierOutcome::Drained, "{name}");
        assert_eq!(report.unsaved_finals, UnsavedFinals::default(), "{name}");
        assert_eq!(
            currency_of(&stores, id).await,
            42,
            "{name}: Drained means the logout's changes are in the row"
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_final_save_outlasting_the_outage_budget_becomes_a_retry_job(pool: PgPool) {
    for driver in Driver::ALL {
        let mut config = config();
        config.saver.final_outage_budget = Duration::from_millis(800);
        let scene = Scene::logged_in(&pool, driver, config).await;
        let (name, id) = (scene.name(), scene.id);
        let mut shard = scene.shard;
        shard.player_mut(id).unwrap().character.currency = 42;
        scene.stores.outage.cut();
        shard.logout(id).unwrap();
        // The outage outlasts the budget by far; then the store comes back (on the file, the
        // job itself waits for that).
        tokio::time::sleep(Duration::from_secs(3)).await;
        scene.stores.outage.heal();
        let jobs = &scene.stores.jobs;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while jobs.count("persistence_retry_jobs").await == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name}: the final save was given up instead of becoming a durable job"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (kind, payload, epoch): (String, String, i64) = jobs
            .fetch_one(
                "SELECT job_kind, payload::text, owner_epoch FROM persistence_retry_jobs
                  WHERE character_id = $1",
                Some(id),
            )
            .await;
        let payload: serde_json::Value = serde_json::from_str(&payload).unwrap();
        assert_eq!(kind, "gameplay_state", "{name}");
        assert_eq!(payload["state"]["currency"], 42, "{name}");
        assert!(epoch > 0, "{name}: the job carries the copy's epoch");
        assert_ne!(
            currency_of(&scene.stores.stores, id).await,
            42,
            "{name}: not applied yet"
        );
        let stats = shard.saver().stats();
        assert_eq!(
            (stats.final_queued_as_job, stats.final_dropped),
            (1, 0),
            "{name}"
        );
        // The retry worker applies it, fenced by the departed copy's epoch like any save.
        let (applied, _) = scene.stores.run_retry_worker().await;
        assert_eq!(applied, 1, "{name}");
        assert_eq!(currency_of(&scene.stores.stores, id).await, 42, "{name}");
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_final_save_job_from_a_superseded_copy_is_fenced(pool: PgPool) {
    for driver in Driver::ALL {
        let mut config = config();
        config.saver.final_outage_budget = Duration::from_millis(300);
        let Scene {
            stores,
            mut shard,
            id,
        } = Scene::logged_in(&pool, driver, config).await;
        let name = stores.stores.driver();
        shard.player_mut(id).unwrap().character.currency = 42;
        stores.outage.cut();
        shard.logout(id).unwrap();
        // Meanwhile the character logs in elsewhere (a newer owner) and saves.
        let characters = &stores.stores.characters;
        let claimed = characters.claim(id, 0).await.unwrap();
        let mut live = claimed.row.clone();
        live.owner_epoch = claimed.new_epoch;
        live.state = serde_json::json!({ "currency": 7 }).into();
        characters.save(&live).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        stores.outage.heal();
        assert_eq!(
            shard.saver().barrier(Duration::from_secs(20)).await,
            BarrierOutcome::Drained,
            "{name}"
        );
        let (applied, superseded) = stores.run_retry_worker().await;
        assert_eq!(
            (applied, superseded),
            (1, 1),
            "{name}: the departed copy's save is fenced by the newer owner"
        );
        assert_eq!(currency_of(&stores.stores, id).await, 7, "{name}");
    }
}

/// The store hangs (Postgres: no answer at all; the file: no write starts): the logout's save is
/// still in the saver's hands when the shutdown bound runs out, and the report counts it.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_shutdown_bound_running_out_counts_saves_still_queued(pool: PgPool) {
    for driver in Driver::ALL {
        let mut config = config();
        config.saver.io_timeout = Duration::from_secs(5);
        let Scene {
            stores,
            mut shard,
            id,
        } = Scene::logged_in(&pool, driver, config).await;
        let name = stores.stores.driver();
        shard.player_mut(id).unwrap().character.currency = 42;
        stores.outage.stall();
        shard.logout(id).unwrap();
        let report = shard.shutdown(Duration::from_millis(500)).await;
        assert_eq!(report.saver, BarrierOutcome::TimedOut, "{name}");
        assert_eq!(
            report.unsaved_finals.total(),
            1,
            "{name}: {:?}",
            report.unsaved_finals
        );
        assert_ne!(
            currency_of(&stores.stores, id).await,
            42,
            "{name}: not in the row yet"
        );
        // Reported unsaved, not lost: once the store answers, the save goes on to land.
        stores.outage.heal();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while currency_of(&stores.stores, id).await != 42 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name}: the save was lost"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A player whose session ended (a link-dead timeout) logs in again at once, on the same shard,
/// while the store stalls the logout's final save and no checkpoint holds it: the login waits
/// for the save instead of claiming over it, so the new copy and the row have the logout's
/// changes.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_login_waits_for_its_characters_final_save_still_in_flight(pool: PgPool) {
    for driver in Driver::ALL {
        let Scene {
            stores,
            mut shard,
            id,
        } = Scene::logged_in_with(&pool, driver, config(), false).await;
        let name = stores.stores.driver();
        shard.player_mut(id).unwrap().character.currency = 42;
        stores.outage.stall();
        shard.logout(id).unwrap();
        assert!(
            shard.final_save_in_flight(id),
            "{name}: the logout's save is queued"
        );
        let Faultable { stores, outage, .. } = stores;
        let (_outage, heal) = outage.heal_after(1000);
        login(&stores, &mut shard, id, "s-2").await;
        heal.await.unwrap();
        assert_eq!(
            shard.player(id).unwrap().character.currency,
            42,
            "{name}: the new copy loaded the logout's changes"
        );
        assert!(!shard.final_save_in_flight(id), "{name}");
        assert_eq!(
            currency_of(&stores, id).await,
            42,
            "{name}: the row holds them"
        );
    }
}
