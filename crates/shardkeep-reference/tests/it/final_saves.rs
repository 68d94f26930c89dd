//! A logout's final save through a Postgres outage: shutdown waits for it within its bound and
//! reports the truth, and an outage longer than the saver's budget turns it into a durable
//! retry job instead of losing it.

use std::time::Duration;

use shardkeep::drain::BarrierOutcome;
use shardkeep_reference::shard::ShardConfig;
use shardkeep_testkit::TestRedis;
use shardkeep_testkit::faults::{FaultProxy, ProxyMode};
use sqlx::PgPool;

use shardkeep::saver::UnsavedFinals;

use crate::support::{Stores, boot_with, login, pg_addr, proxied_pg, rows_checkpoints_and_jobs};

fn config() -> ShardConfig {
    let mut config = ShardConfig::new("shard-a", "zone-0");
    config.saver.io_timeout = Duration::from_millis(500);
    config
}

/// Runs a retry worker until no job is due; returns the jobs it settled and how many of them
/// were superseded.
async fn run_retry_worker(pool: &PgPool) -> (usize, u64) {
    use shardkeep::retry::{RetryQueue, RetryStats, RetryWorker, RetryWorkerConfig};
    let pg = shardkeep_testkit::pg(pool);
    let clock = std::sync::Arc::new(shardkeep::clock::SystemClock);
    let (_, signals) = RetryQueue::new(pg.clone(), 4, clock.clone());
    let mut worker = RetryWorker::new(
        pg,
        shardkeep_reference::game::ReferenceModel::handle(),
        signals,
        RetryWorkerConfig::new("w"),
        clock,
    );
    let stats = worker.stats();
    let settled = worker.run_until_idle().await.unwrap();
    (settled, RetryStats::get(&stats.superseded))
}

/// A shard whose rows and jobs go through a fault proxy (checkpoints straight to Redis), with
/// Aria logged in.
struct Scene {
    _redis: TestRedis,
    stores: Stores,
    proxy: FaultProxy,
    shard: shardkeep_reference::shard::Shard,
    id: uuid::Uuid,
}

impl Scene {
    async fn logged_in(pool: &PgPool, config: ShardConfig) -> Self {
        Self::logged_in_with(pool, config, true).await
    }

    /// As [`Scene::logged_in`]; without `checkpoints` the shard writes rows and jobs only, so
    /// nothing but the row can carry a logout's changes.
    async fn logged_in_with(pool: &PgPool, config: ShardConfig, checkpoints: bool) -> Self {
        let redis = TestRedis::new().await;
        let stores = Stores::new(pool, redis.backend());
        let proxy = FaultProxy::start(pg_addr()).await.unwrap();
        let proxied = proxied_pg(pool, &proxy).await;
        let mut shard_stores = rows_checkpoints_and_jobs(proxied, redis.backend());
        if !checkpoints {
            shard_stores.checkpoints = None;
        }
        let mut shard = boot_with(shard_stores, &stores, config, &[0], 1);
        let id = stores.new_character("Aria").await;
        login(&stores, &mut shard, id, "s").await;
        Self {
            _redis: redis,
            stores,
            proxy,
            shard,
            id,
        }
    }
}

/// Lets traffic through `proxy` again after `millis`.
fn heal_after(
    proxy: FaultProxy,
    millis: u64,
) -> (std::sync::Arc<FaultProxy>, tokio::task::JoinHandle<()>) {
    let proxy = std::sync::Arc::new(proxy);
    let healing = std::sync::Arc::clone(&proxy);
    let heal = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(millis)).await;
        healing.set_mode(ProxyMode::Pass);
    });
    (proxy, heal)
}

async fn currency_of(stores: &Stores, id: uuid::Uuid) -> serde_json::Value {
    let row = stores.characters.load(id).await.unwrap().unwrap();
    row.state["currency"].clone()
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn shutdown_does_not_report_drained_while_a_final_save_is_unsaved(pool: PgPool) {
    let Scene {
        _redis,
        stores,
        proxy,
        mut shard,
        id,
    } = Scene::logged_in(&pool, config()).await;
    shard.player_mut(id).unwrap().character.currency = 42;
    proxy.set_mode(ProxyMode::Cut);
    shard.logout(id).unwrap();
    let report = shard.shutdown(Duration::from_secs(2)).await;
    assert_eq!(
        report.saver,
        BarrierOutcome::TimedOut,
        "the logout's changes are not durable yet"
    );
    assert_eq!(
        report.unsaved_finals,
        UnsavedFinals {
            queued: 0,
            pending: 1,
            checkpointed: 1,
            dropped: 0,
        },
        "the report names the unsaved logout and that its checkpoint holds it"
    );
    assert_ne!(currency_of(&stores, id).await, 42);
    let checkpoint = stores.checkpoints.read(id).await.unwrap().unwrap();
    assert_eq!(checkpoint.state["currency"], 42);
    proxy.set_mode(ProxyMode::Pass);
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn shutdown_waits_for_a_final_save_that_lands_within_its_bound(pool: PgPool) {
    let Scene {
        _redis,
        stores,
        proxy,
        mut shard,
        id,
    } = Scene::logged_in(&pool, config()).await;
    shard.player_mut(id).unwrap().character.currency = 42;
    proxy.set_mode(ProxyMode::Cut);
    shard.logout(id).unwrap();
    let (_proxy, heal) = heal_after(proxy, 1500);
    let report = shard.shutdown(Duration::from_secs(15)).await;
    heal.await.unwrap();
    assert_eq!(report.saver, BarrierOutcome::Drained);
    assert_eq!(report.unsaved_finals, UnsavedFinals::default());
    assert_eq!(
        currency_of(&stores, id).await,
        42,
        "Drained means the logout's changes are in the row"
    );
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_final_save_outlasting_the_outage_budget_becomes_a_retry_job(pool: PgPool) {
    let mut config = config();
    config.saver.final_outage_budget = Duration::from_millis(800);
    let Scene {
        _redis,
        stores,
        proxy,
        mut shard,
        id,
    } = Scene::logged_in(&pool, config).await;
    shard.player_mut(id).unwrap().character.currency = 42;
    proxy.set_mode(ProxyMode::Cut);
    shard.logout(id).unwrap();
    // The outage outlasts the budget by far; then Postgres comes back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    proxy.set_mode(ProxyMode::Pass);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let job = loop {
        let job: Option<(String, serde_json::Value, i64)> = sqlx::query_as(
            "SELECT job_kind, payload, owner_epoch FROM persistence_retry_jobs WHERE character_id = $1",
        )
        .bind(id)
        .fetch_optional(&pool)
        .await
        .unwrap();
        if let Some(job) = job {
            break job;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the final save was given up instead of becoming a durable job"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(job.0, "gameplay_state");
    assert_eq!(job.1["state"]["currency"], 42);
    assert_ne!(currency_of(&stores, id).await, 42, "not applied yet");
    let stats = shard.saver().stats();
    assert_eq!((stats.final_queued_as_job, stats.final_dropped), (1, 0));
    // The retry worker applies it, fenced by the departed copy's epoch like any save.
    let (applied, _) = run_retry_worker(&pool).await;
    assert_eq!(applied, 1);
    assert_eq!(currency_of(&stores, id).await, 42);
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_final_save_job_from_a_superseded_copy_is_fenced(pool: PgPool) {
    let mut config = config();
    config.saver.final_outage_budget = Duration::from_millis(300);
    let Scene {
        _redis,
        stores,
        proxy,
        mut shard,
        id,
    } = Scene::logged_in(&pool, config).await;
    shard.player_mut(id).unwrap().character.currency = 42;
    proxy.set_mode(ProxyMode::Cut);
    shard.logout(id).unwrap();
    // Meanwhile the character logs in elsewhere (a newer owner) and saves.
    let claimed = stores.characters.claim(id, 0).await.unwrap();
    let mut live = claimed.row.clone();
    live.owner_epoch = claimed.new_epoch;
    live.state = serde_json::json!({ "currency": 7 }).into();
    stores.characters.save(&live).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.set_mode(ProxyMode::Pass);
    assert_eq!(
        shard.saver().barrier(Duration::from_secs(20)).await,
        BarrierOutcome::Drained
    );
    let (applied, superseded) = run_retry_worker(&pool).await;
    assert_eq!(
        (applied, superseded),
        (1, 1),
        "the departed copy's save is fenced by the newer owner"
    );
    assert_eq!(currency_of(&stores, id).await, 7);
}

/// Postgres hangs (no answer at all): the logout's save is still in the saver's hands when the
/// shutdown bound runs out, and the report counts it.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_shutdown_bound_running_out_counts_saves_still_queued(pool: PgPool) {
    let mut config = config();
    config.saver.io_timeout = Duration::from_secs(5);
    let Scene {
        _redis,
        stores,
        proxy,
        mut shard,
        id,
    } = Scene::logged_in(&pool, config).await;
    shard.player_mut(id).unwrap().character.currency = 42;
    proxy.set_mode(ProxyMode::Stall);
    shard.logout(id).unwrap();
    let report = shard.shutdown(Duration::from_millis(500)).await;
    assert_eq!(report.saver, BarrierOutcome::TimedOut);
    assert_eq!(
        report.unsaved_finals.total(),
        1,
        "{:?}",
        report.unsaved_finals
    );
    assert_ne!(currency_of(&stores, id).await, 42, "not in the row yet");
    // Reported unsaved, not lost: once Postgres answers, the save goes on to land.
    proxy.set_mode(ProxyMode::Pass);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while currency_of(&stores, id).await != 42 {
        assert!(tokio::time::Instant::now() < deadline, "the save was lost");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A player whose session ended (a link-dead timeout) logs in again at once, on the same shard,
/// while Postgres stalls the logout's final save and no checkpoint holds it: the login waits for
/// the save instead of claiming over it, so the new copy and the row have the logout's changes.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_login_waits_for_its_characters_final_save_still_in_flight(pool: PgPool) {
    let Scene {
        _redis,
        stores,
        proxy,
        mut shard,
        id,
    } = Scene::logged_in_with(&pool, config(), false).await;
    shard.player_mut(id).unwrap().character.currency = 42;
    proxy.set_mode(ProxyMode::Stall);
    shard.logout(id).unwrap();
    assert!(
        shard.final_save_in_flight(id),
        "the logout's save is queued"
    );
    let (_proxy, heal) = heal_after(proxy, 1000);
    login(&stores, &mut shard, id, "s-2").await;
    heal.await.unwrap();
    assert_eq!(
        shard.player(id).unwrap().character.currency,
        42,
        "the new copy loaded the logout's changes"
    );
    assert!(!shard.final_save_in_flight(id));
    assert_eq!(currency_of(&stores, id).await, 42, "the row holds them");
}
