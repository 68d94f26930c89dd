//! shardkeep's own bookkeeping (issue marks, job effects beside the row, the item-load ledger):
//! what it protects, against real Postgres and Redis.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use shardkeep::PostgresBackend;
use shardkeep::audit::AuditEvent;
use shardkeep::character::{
    Bookkeeping, BookkeepingRetention, CharacterLoader, CharacterSnapshot, CharacterStore,
    CheckpointStore, LoadSource, Releaser, SaveOutcome, TransferCommit,
};
use shardkeep::clock::{Clock, SystemClock};
use shardkeep::retry::{
    IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload, RetryQueue,
    RetryStats, RetryWorker, RetryWorkerConfig,
};
use shardkeep_testkit::{JobDriver, JobDrivers, TestRedis};
use sqlx::PgPool;

use shardkeep_testkit::fixtures::created;

fn pg(pool: &PgPool) -> PostgresBackend {
    shardkeep_testkit::pg(pool)
}

fn appearance_job(
    snapshot: &CharacterSnapshot,
    hair: &str,
    key: &str,
    issue_seq: u64,
) -> PersistenceRetryJob {
    PersistenceRetryJob::new(
        PersistenceRetryPayload::effect(
            snapshot.character_id,
            &shardkeep_reference::game::ReferenceEffect::CharacterAppearance {
                appearance: serde_json::from_value(json!({ "hair": hair })).unwrap(),
            },
        )
        .unwrap(),
        IdempotencyEnvelope {
            idempotency_key: key.into(),
            owner_epoch: snapshot.owner_epoch,
            origin: Origin::ClientAppearance,
            issued_at: Utc::now(),
            issue_seq,
        },
        "test",
        None,
    )
    .unwrap()
}

/// An absolute effect issued before a newer checkpoint was dumped must not overwrite that
/// checkpoint's content when the loader prefers the checkpoint and replays the row's effects.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_effect_issued_before_a_newer_checkpoint_is_not_replayed_over_it(pool: PgPool) {
    let drivers = shardkeep_testkit::JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        older_effect_on(&d, &redis).await;
    }
}

async fn older_effect_on(d: &JobDriver, redis: &TestRedis) {
    let store = d.characters();
    let checkpoints = d.checkpoints(redis);
    let row = created(&store, "Aria").await;
    let epoch = store.claim(row.character_id, 0).await.unwrap().new_epoch;
    let mut live = CharacterSnapshot {
        owner_epoch: epoch,
        state: json!({ "appearance": { "hair": "grey" } }).into(),
        ..row.clone()
    };
    assert_eq!(store.save(&live).await.unwrap(), SaveOutcome::Saved(1));
    live.state_version = 1;

    // The copy changes its hair to red (its first issue); the direct write fails, so it becomes
    // a retry job.
    let red = appearance_job(&live, "red", "looks-1", 1);
    // Then the player changes it again, to blue (a second issue), and the copy checkpoints that.
    live.state = json!({ "appearance": { "hair": "blue" } }).into();
    live.issue_mark = 2;
    checkpoints.write(&live).await.unwrap();

    // The job for red lands on the row after the checkpoint was dumped; then the shard dies.
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (queue, signals) = d.queue(8, Arc::clone(&clock));
    queue.enqueue(&red).await.unwrap();
    let mut worker = d.worker_for(
        shardkeep_reference::game::ReferenceModel::handle(),
        signals,
        RetryWorkerConfig::new("w"),
        clock,
    );
    assert_eq!(worker.run_until_idle().await.unwrap(), 1);

    let loader = CharacterLoader::new(
        store,
        Some(checkpoints),
        shardkeep_reference::game::ReferenceModel::handle(),
        Duration::from_secs(5),
    );
    let loaded = loader.claim_and_load(row.character_id, 0).await.unwrap();
    assert_eq!(loaded.source, LoadSource::Checkpoint);
    assert_eq!(
        loaded.snapshot.state["appearance"]["hair"],
        "blue",
        "the older red replayed over the newer checkpoint ({})",
        d.name()
    );
}

/// The bookkeeping maintenance over `d`'s store.
fn bookkeeping_of(d: &JobDriver) -> Bookkeeping {
    match d {
        JobDriver::Postgres(pool) => Bookkeeping::new(pg(pool)),
        JobDriver::Embedded(db) => Bookkeeping::embedded(db.clone()),
    }
}

/// An instant `secs` seconds ago, in `d`'s SQL (the embedded file keeps microseconds).
fn ago(d: &JobDriver, secs: i64) -> String {
    match d {
        JobDriver::Postgres(_) => format!("now() - make_interval(secs => {secs})"),
        JobDriver::Embedded(_) => format!("now() - {}", secs * 1_000_000),
    }
}

struct Retry {
    queue: RetryQueue,
    worker: RetryWorker,
}

impl Retry {
    fn on(d: &JobDriver) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let (queue, signals) = d.queue(64, Arc::clone(&clock));
        let worker = d.worker_for(
            shardkeep_reference::game::ReferenceModel::handle(),
            signals,
            RetryWorkerConfig::new("w"),
            clock,
        );
        Self { queue, worker }
    }

    async fn run(&mut self, jobs: &[PersistenceRetryJob]) -> (u64, u64) {
        let stats = self.worker.stats();
        let before = (
            RetryStats::get(&stats.applied),
            RetryStats::get(&stats.already_applied),
        );
        for job in jobs {
            self.queue.enqueue(job).await.unwrap();
        }
        self.worker.run_until_idle().await.unwrap();
        (
            RetryStats::get(&stats.applied) - before.0,
            RetryStats::get(&stats.already_applied) - before.1,
        )
    }
}

fn job(
    snapshot: &CharacterSnapshot,
    payload: PersistenceRetryPayload,
    key: &str,
    issue_seq: u64,
) -> PersistenceRetryJob {
    let origin = if payload.is_state() {
        Origin::GameplayState
    } else {
        Origin::CombatRewards
    };
    PersistenceRetryJob::new(
        payload,
        IdempotencyEnvelope {
            idempotency_key: key.into(),
            owner_epoch: snapshot.owner_epoch,
            origin,
            issued_at: Utc::now(),
            issue_seq,
        },
        "test",
        None,
    )
    .unwrap()
}

fn reward(snapshot: &CharacterSnapshot, seq: u64, experience: i64) -> PersistenceRetryJob {
    let payload = PersistenceRetryPayload::effect(
        snapshot.character_id,
        &shardkeep_reference::game::ReferenceEffect::CombatRewards {
            experience,
            currency: 0,
            items: vec![],
        },
    )
    .unwrap();
    job(snapshot, payload, &format!("reward-{seq}"), seq)
}

async fn state_of(store: &CharacterStore, id: uuid::Uuid) -> serde_json::Value {
    store.load(id).await.unwrap().unwrap().state.to_value()
}

/// A live copy: claimed, with its first save landed.
async fn live_copy(store: &CharacterStore, name: &str) -> CharacterSnapshot {
    let row = created(store, name).await;
    let epoch = store.claim(row.character_id, 0).await.unwrap().new_epoch;
    let mut live = CharacterSnapshot {
        owner_epoch: epoch,
        state: json!({ "experience": 0 }).into(),
        ..row
    };
    let SaveOutcome::Saved(version) = store.save(&live).await.unwrap() else {
        panic!("the first save did not land");
    };
    live.state_version = version;
    live
}

/// A reward the live copy granted, issued and then flushed is in the row once: its job, run
/// after the flush, finds the row's issue mark past it.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_reward_a_live_write_already_holds_is_not_granted_again(pool: PgPool) {
    let drivers = shardkeep_testkit::JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        reward_held_on(&d).await;
    }
}

async fn reward_held_on(d: &JobDriver) {
    let store = d.characters();
    let mut live = live_copy(&store, "Aria").await;
    let mut retry = Retry::on(d);
    live.state = json!({ "experience": 30 }).into();
    live.issue_mark = 1;
    assert!(matches!(
        store.save(&live).await.unwrap(),
        SaveOutcome::Saved(_)
    ));
    assert_eq!(retry.run(&[reward(&live, 1, 30)]).await, (0, 1));
    assert_eq!(state_of(&store, live.character_id).await["experience"], 30);
    // The next reward, not yet flushed, is granted by its job.
    assert_eq!(retry.run(&[reward(&live, 2, 5)]).await, (1, 0));
    assert_eq!(state_of(&store, live.character_id).await["experience"], 35);
    let doc = state_of(&store, live.character_id).await;
    for old in ["reward_keys", "job_effects", "held_at_load"] {
        assert!(doc.get(old).is_none(), "{old} is back in the document");
    }
}

/// A logout save that became a state job carries its dump's mark: applied after a later reward's
/// job, it puts that reward back on top rather than wiping it; the copy's older value job that
/// arrives after a newer one of its kind does not overwrite it.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn state_and_value_jobs_keep_issue_order_whatever_order_they_apply_in(pool: PgPool) {
    let drivers = shardkeep_testkit::JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        issue_order_on(&d).await;
    }
}

async fn issue_order_on(d: &JobDriver) {
    let store = d.characters();
    let live = live_copy(&store, "Aria").await;
    let id = live.character_id;
    let mut retry = Retry::on(d);
    // Issued 3: a reward; applied first.
    assert_eq!(retry.run(&[reward(&live, 3, 7)]).await, (1, 0));
    // Issued 2 (before the reward): the final dump, holding 20 experience.
    let final_dump = PersistenceRetryPayload::gameplay_state(
        id,
        json!({ "experience": 20, "appearance": { "hair": "grey" } }),
        None,
        None,
    );
    assert_eq!(
        retry.run(&[job(&live, final_dump, "final-2", 2)]).await,
        (1, 0)
    );
    assert_eq!(
        state_of(&store, id).await["experience"],
        27,
        "the reward issued after the dump survives it"
    );
    let looks = |hair: &str, seq: u64| {
        let payload = PersistenceRetryPayload::effect(
            id,
            &shardkeep_reference::game::ReferenceEffect::CharacterAppearance {
                appearance: serde_json::from_value(json!({ "hair": hair })).unwrap(),
            },
        )
        .unwrap();
        job(&live, payload, &format!("looks-{seq}"), seq)
    };
    assert_eq!(retry.run(&[looks("blue", 5)]).await, (1, 0));
    assert_eq!(retry.run(&[looks("red", 4)]).await, (0, 1));
    let doc = state_of(&store, id).await;
    assert_eq!(doc["appearance"]["hair"], "blue");
    // The reward's job stored again after all of it is refused by its key.
    assert_eq!(retry.run(&[reward(&live, 3, 7)]).await, (0, 1));
    assert_eq!(state_of(&store, id).await["experience"], 27);
}

/// Every load writes what the new copy holds to the item-load ledger, and a departed releaser's
/// floor copy released before that load is refused as a phantom.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_load_records_its_items_and_an_earlier_release_is_a_phantom(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let store = d.characters();
        let row = created(&store, "Aria").await;
        let gem = uuid::Uuid::now_v7();
        let bag = uuid::Uuid::now_v7();
        d.set_state(
            row.character_id,
            json!({ "inventory": [{ "proto": "bag", "id": bag,
                                "contents": [{ "proto": "gem", "id": gem }] }] }),
        )
        .await;
        let loader = CharacterLoader::new(
            store.clone(),
            None,
            shardkeep_reference::game::ReferenceModel::handle(),
            Duration::from_secs(5),
        );
        let first = loader.claim_and_load(row.character_id, 0).await.unwrap();
        let second = loader.claim_and_load(row.character_id, 0).await.unwrap();
        let mut loads: Vec<(uuid::Uuid, i64)> = d
            .fetch_all("SELECT item_id, loaded_epoch FROM item_loads", None)
            .await;
        loads.sort();
        let mut expected = vec![
            (bag, second.snapshot.owner_epoch),
            (gem, second.snapshot.owner_epoch),
        ];
        expected.sort();
        assert_eq!(
            loads,
            expected,
            "{}: one row per item, at the newest load",
            d.name()
        );
        assert!(first.snapshot.owner_epoch < second.snapshot.owner_epoch);

        // The second copy moved the gem on (the row no longer holds it); a floor copy the first copy
        // released (a crash rolled that release back) is picked up by Bran: refused, nothing written.
        d.set_state(
            row.character_id,
            json!({ "inventory": [{ "proto": "bag", "id": bag }] }),
        )
        .await;
        let bran = created(&store, "Bran").await;
        let acquirer = CharacterSnapshot {
            state: json!({ "inventory": [{ "proto": "gem", "id": gem }] }).into(),
            ..bran.clone()
        };
        let event = AuditEvent::item_transferred(
            bran.character_id,
            row.character_id,
            uuid::Uuid::now_v7(),
            json!({ "item_id": gem }),
        );
        let phantom = Releaser::Departed {
            character_id: row.character_id,
            item_id: gem,
            released_epoch: first.snapshot.owner_epoch,
        };
        let outcome = store
            .commit_transfer(
                &shardkeep_reference::game::ReferenceModel::handle(),
                phantom,
                &acquirer,
                &event,
            )
            .await
            .unwrap();
        assert!(
            matches!(outcome, TransferCommit::ReleaserSuperseded { .. }),
            "{outcome:?}"
        );
        assert_eq!(bran.state, state_of(&store, bran.character_id).await);
        // Released by the second copy itself (no load after it): the move commits.
        let released = Releaser::Departed {
            character_id: row.character_id,
            item_id: gem,
            released_epoch: second.snapshot.owner_epoch,
        };
        let outcome = store
            .commit_transfer(
                &shardkeep_reference::game::ReferenceModel::handle(),
                released,
                &acquirer,
                &event,
            )
            .await
            .unwrap();
        assert!(
            matches!(outcome, TransferCommit::Committed { .. }),
            "{outcome:?}"
        );
    }
}

/// Under a steady workload — every session loads the character, issues rewards whose jobs land,
/// and flushes — the bookkeeping tables hold only what no live write has superseded, the state
/// document stays the game's own size, and every reward is in it once.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn bookkeeping_stays_bounded_under_a_steady_workload(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let store = d.characters();
        let bookkeeping = bookkeeping_of(&d);
        let retention = BookkeepingRetention::default();
        let row = created(&store, "Aria").await;
        let items: Vec<_> = (0..3).map(|_| uuid::Uuid::now_v7()).collect();
        let inventory: Vec<_> = items
            .iter()
            .map(|id| json!({ "proto": "gem", "id": id }))
            .collect();
        d.set_state(
            row.character_id,
            json!({ "experience": 0, "inventory": inventory }),
        )
        .await;
        let loader = CharacterLoader::new(
            store.clone(),
            None,
            shardkeep_reference::game::ReferenceModel::handle(),
            Duration::from_secs(5),
        );
        let mut retry = Retry::on(&d);
        let mut doc_bytes = Vec::new();
        for session in 0..20 {
            let mut live = loader
                .claim_and_load(row.character_id, 0)
                .await
                .unwrap()
                .snapshot;
            let mut jobs = Vec::new();
            for seq in 1..=10 {
                let xp = live.state["experience"].as_i64().unwrap() + 1;
                live.state.set_field("experience", xp.into());
                live.issue_mark = seq;
                jobs.push(reward(&live, seq, 1));
            }
            assert_eq!(retry.run(&jobs).await, (10, 0), "session {session}");
            // The flush conflicts with the jobs' versions, adopts the row's, and lands.
            live.state_version = store.version_of(row.character_id).await.unwrap().unwrap().0;
            assert!(matches!(
                store.save(&live).await.unwrap(),
                SaveOutcome::Saved(_)
            ));
            let before = bookkeeping.sizes().await.unwrap();
            assert_eq!(before.effects, 10, "session {session}");
            let pruned = bookkeeping.prune_once(retention).await.unwrap();
            assert_eq!(pruned.effects, 10, "the flush superseded them");
            let after = bookkeeping.sizes().await.unwrap();
            assert_eq!(
                (after.effects, after.item_loads),
                (0, 3),
                "session {session}"
            );
            doc_bytes.push(state_of(&store, row.character_id).await.to_string().len());
        }
        assert_eq!(
            state_of(&store, row.character_id).await["experience"],
            200,
            "every reward once"
        );
        let (first, last) = (doc_bytes[0], doc_bytes[doc_bytes.len() - 1]);
        assert!(
            last <= first + 2,
            "the document grew: {first} → {last} bytes"
        );

        // Unsequenced keys and item loads leave after their retention; newer ones stay.
        // Postgres numbers applications with an identity column; the file's rows carry theirs.
        let (column, old_order, new_order) = match d {
            JobDriver::Postgres(_) => ("", "", ""),
            JobDriver::Embedded(_) => (", applied_order", ", 1001", ", 1002"),
        };
        d.execute(
            &format!(
                "INSERT INTO character_job_effects
                    (character_id, idempotency_key, owner_epoch, issue_seq, job_kind, payload,
                     row_version, applied_at{column})
             VALUES ($1, 'old', 20, 0, 'combat_rewards', NULL, 1, {}{old_order}),
                    ($1, 'new', 20, 0, 'combat_rewards', NULL, 1, now(){new_order})",
                ago(&d, 8 * 86_400),
            ),
            Some(row.character_id),
        )
        .await
        .unwrap();
        d.execute(
            &format!(
                "UPDATE item_loads SET loaded_at = {} WHERE item_id = $1",
                ago(&d, 35 * 86_400)
            ),
            Some(items[0]),
        )
        .await
        .unwrap();
        let pruned = bookkeeping.prune_once(retention).await.unwrap();
        assert_eq!((pruned.effects, pruned.item_loads), (1, 1));
        let keys: Vec<(String,)> = d
            .fetch_all("SELECT idempotency_key FROM character_job_effects", None)
            .await;
        assert_eq!(keys, vec![("new".to_owned(),)], "{}", d.name());
    }
}

/// A load only raises an item-load entry's epoch while its load time is fresh (an update that
/// touches no index), moves the load time once it is older than the refresh interval, and the
/// prune keeps the entry until its last load is older than the retention.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn item_load_times_move_only_when_stale_and_the_prune_makes_up_for_it(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let retention = BookkeepingRetention {
            item_loads: Duration::from_secs(800),
            ..BookkeepingRetention::default()
        };
        assert_eq!(retention.item_load_refresh(), Duration::from_secs(100));
        let store = d
            .characters()
            .with_item_load_retention(retention.item_loads);
        let bookkeeping = bookkeeping_of(&d);
        let row = created(&store, "Tamsin").await;
        let item = uuid::Uuid::now_v7();
        let since = match d {
            JobDriver::Postgres(_) => "extract(epoch FROM now() - loaded_at)::float8",
            JobDriver::Embedded(_) => "(now() - loaded_at) / 1000000.0",
        };
        let entry = async || -> (i64, f64) {
            d.fetch_one(
                &format!("SELECT loaded_epoch, {since} FROM item_loads WHERE item_id = $1"),
                Some(item),
            )
            .await
        };
        let age = |secs: i64| {
            let sql = format!("UPDATE item_loads SET loaded_at = {}", ago(&d, secs));
            let d = d.clone();
            async move { d.execute(&sql, None).await }
        };
        store
            .record_item_loads(row.character_id, 1, &[item])
            .await
            .unwrap();
        age(60).await.unwrap();
        store
            .record_item_loads(row.character_id, 2, &[item])
            .await
            .unwrap();
        let (epoch, since) = entry().await;
        assert_eq!(epoch, 2, "the epoch always rises");
        assert!(since >= 59.0, "a fresh load time stays: {since}");
        age(150).await.unwrap();
        store
            .record_item_loads(row.character_id, 3, &[item])
            .await
            .unwrap();
        let (epoch, since) = entry().await;
        assert_eq!(epoch, 3);
        assert!(since < 30.0, "a stale load time moves: {since}");
        // Kept until retention + refresh (900 s) have passed since the load time.
        age(850).await.unwrap();
        assert_eq!(
            bookkeeping.prune_once(retention).await.unwrap().item_loads,
            0
        );
        age(950).await.unwrap();
        assert_eq!(
            bookkeeping.prune_once(retention).await.unwrap().item_loads,
            1
        );
    }
}

/// Transfer activations and item-release entries leave after their retention, newer ones stay:
/// one row per handoff and per item taken would otherwise grow the tables for as long as the
/// game runs (the soak's `transfer_activations` grew without end).
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn activations_and_releases_past_their_retention_are_pruned(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let store = d.characters();
        let bookkeeping = bookkeeping_of(&d);
        let row = created(&store, "Vela").await;
        let retention = BookkeepingRetention::default();
        let old = ago(&d, retention.transfer_activations.as_secs() as i64 + 60);
        d.execute(
            &format!(
                "INSERT INTO transfer_activations
                    (transfer_token, character_id, target_shard, target_zone, owner_epoch,
                     activated_at)
             VALUES ('old', $1, 's', 'z', 1, {old}), ('new', $1, 's', 'z', 2, now())"
            ),
            Some(row.character_id),
        )
        .await
        .unwrap();
        // Two releases of the same character: the old one of the item released first.
        let old = ago(&d, retention.item_loads.as_secs() as i64 + 60);
        let store_release = |epoch: i64, at: String| {
            let d = d.clone();
            let sql = format!(
                "INSERT INTO item_releases (character_id, item_id, released_epoch, released_at)
             VALUES ($1, {}, {epoch}, {at})",
                match d {
                    JobDriver::Postgres(_) => "gen_random_uuid()",
                    JobDriver::Embedded(_) => "randomblob(16)",
                }
            );
            async move { d.execute(&sql, Some(row.character_id)).await.unwrap() }
        };
        store_release(1, old).await;
        store_release(2, "now()".to_owned()).await;
        assert_eq!(bookkeeping.sizes().await.unwrap().transfer_activations, 2);

        let pruned = bookkeeping.prune_once(retention).await.unwrap();
        assert_eq!((pruned.transfer_activations, pruned.item_releases), (1, 1));
        let tokens: Vec<(String,)> = d
            .fetch_all("SELECT transfer_token FROM transfer_activations", None)
            .await;
        assert_eq!(tokens, vec![("new".to_owned(),)], "{}", d.name());
        let epochs: Vec<(i64,)> = d
            .fetch_all("SELECT released_epoch FROM item_releases", None)
            .await;
        assert_eq!(epochs, vec![(2,)], "{}: the newer release stays", d.name());
        let sizes = bookkeeping.sizes().await.unwrap();
        assert_eq!((sizes.transfer_activations, sizes.item_releases), (1, 1));
    }
}

/// A logout save that became a state job is a live write: a checkpoint dumped before it (an
/// earlier cadence, or the final dump's own checkpoint write that failed) must not win over it at
/// the next login, or the rewards issued in between are rolled back.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_state_job_outranks_a_checkpoint_dumped_before_it(pool: PgPool) {
    let redis = TestRedis::new().await;
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let store = d.characters();
        let checkpoints = d.checkpoints(&redis);
        let mut live = live_copy(&store, "Aria").await;
        live.state = json!({ "experience": 10 }).into();
        live.issue_mark = 4;
        checkpoints.write(&live).await.unwrap();
        // Rewards 5 and 6 granted (+30), then the final dump, whose save became a job.
        let id = live.character_id;
        let dump =
            PersistenceRetryPayload::gameplay_state(id, json!({ "experience": 40 }), None, None);
        let mut retry = Retry::on(&d);
        assert_eq!(retry.run(&[job(&live, dump, "final-6", 6)]).await, (1, 0));
        let (version, live_version): (i64, i64) = d
            .fetch_one(
                "SELECT state_version, live_version FROM characters WHERE id = $1",
                Some(id),
            )
            .await;
        assert_eq!(
            (version, live_version),
            (2, 2),
            "{}: the state job is a live write",
            d.name()
        );
        let loader = CharacterLoader::new(
            store,
            Some(checkpoints),
            shardkeep_reference::game::ReferenceModel::handle(),
            Duration::from_secs(5),
        );
        let loaded = loader.claim_and_load(id, 0).await.unwrap();
        assert_eq!(
            loaded.snapshot.state["experience"], 40,
            "the checkpoint dumped before the final save won ({:?})",
            loaded.source
        );
    }
}

/// The item-load ledger write comes after the claim minted the new epoch; refusing the load when
/// it fails would make the retry's claim bury the fresher checkpoint under the new epoch (a
/// rollback). The load goes on without it (logged and counted).
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_load_whose_item_ledger_write_fails_still_loads_the_freshest_copy(pool: PgPool) {
    let redis = TestRedis::new().await;
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let store = d.characters();
        let checkpoints = d.checkpoints(&redis);
        let mut live = live_copy(&store, "Aria").await;
        live.state = json!({ "experience": 99,
                         "inventory": [{ "proto": "gem", "id": uuid::Uuid::now_v7() }] })
        .into();
        checkpoints.write(&live).await.unwrap();
        d.execute("DROP TABLE item_loads", None).await.unwrap();
        let loader = CharacterLoader::new(
            store,
            Some(checkpoints),
            shardkeep_reference::game::ReferenceModel::handle(),
            Duration::from_secs(5),
        );
        let loaded = loader.claim_and_load(live.character_id, 0).await.unwrap();
        assert_eq!(loaded.source, LoadSource::Checkpoint);
        assert_eq!(loaded.snapshot.state["experience"], 99);
    }
}

/// An unsequenced state job (a producer with no live copy) never lowers the issue mark of the
/// live copy's content, and a document that still lists reward keys (written by the old code)
/// refuses an unsequenced grant it lists: neither lets a reward be granted twice.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn unsequenced_writes_never_reopen_a_granted_reward(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let store = d.characters();
        let mut live = live_copy(&store, "Aria").await;
        let id = live.character_id;
        live.state = json!({ "experience": 30 }).into();
        live.issue_mark = 50;
        assert!(matches!(
            store.save(&live).await.unwrap(),
            SaveOutcome::Saved(_)
        ));
        let mut retry = Retry::on(&d);
        let outside = PersistenceRetryPayload::gameplay_state(
            id,
            json!({ "experience": 30, "appearance": { "hair": "red" } }),
            None,
            None,
        );
        assert_eq!(
            retry.run(&[job(&live, outside, "outside", 0)]).await,
            (1, 0)
        );
        // The copy's reward 30 (granted live, in the flush above) comes back as a requeued job.
        assert_eq!(retry.run(&[reward(&live, 30, 30)]).await, (0, 1));
        assert_eq!(state_of(&store, id).await["experience"], 30);

        // A document from the old code lists the reward keys it holds.
        d.set_state(
            id,
            json!({ "experience": 40, "reward_keys": ["old-grant"] }),
        )
        .await;
        let old = PersistenceRetryPayload::effect(
            id,
            &shardkeep_reference::game::ReferenceEffect::CombatRewards {
                experience: 10,
                currency: 0,
                items: vec![],
            },
        )
        .unwrap();
        // Unnumbered, it is issued by no copy today (an offline grant): the old document's key
        // list still answers for it.
        let offline = CharacterSnapshot {
            owner_epoch: shardkeep::retry::OFFLINE_EPOCH,
            ..live.clone()
        };
        assert_eq!(
            retry.run(&[job(&offline, old, "old-grant", 0)]).await,
            (0, 1)
        );
        assert_eq!(state_of(&store, id).await["experience"], 40);
    }
}

/// A login's claim that waits for a settle's row lock must see that settle's effect records, not
/// only its row: otherwise the checkpoint it prefers gets nothing replayed and the job's reward,
/// already deleted as applied, is lost. Postgres only: the embedded store has no row locks
/// (a settle holds the file's one write lock, so a claim never reads between its writes).
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_claim_that_waited_for_a_settle_replays_its_effects(pool: PgPool) {
    let redis = TestRedis::new().await;
    let store = CharacterStore::new(pg(&pool));
    let checkpoints = CheckpointStore::new(redis.backend());
    let mut live = live_copy(&store, "Aria").await;
    let id = live.character_id;
    live.state = json!({ "experience": 14, "inventory": [{ "proto": "gem" }] }).into();
    checkpoints.write(&live).await.unwrap();
    // A settle holds the row: it granted reward 1 (issued after the checkpoint's dump).
    let mut settle = pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM characters WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *settle)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE characters SET state = '{\"experience\": 53}', state_version = state_version + 1
          WHERE id = $1",
    )
    .bind(id)
    .execute(&mut *settle)
    .await
    .unwrap();
    let reward = json!({ "kind": "combat_rewards", "character_id": id, "experience": 39,
                         "currency": 0, "items": [] });
    sqlx::query(
        "INSERT INTO character_job_effects
                (character_id, idempotency_key, owner_epoch, issue_seq, job_kind, payload, row_version)
         VALUES ($1, 'reward-1', $2, 1, 'combat_rewards', $3, 2)",
    )
    .bind(id)
    .bind(live.owner_epoch)
    .bind(reward)
    .execute(&mut *settle)
    .await
    .unwrap();
    let loader = CharacterLoader::new(
        store,
        Some(checkpoints),
        shardkeep_reference::game::ReferenceModel::handle(),
        Duration::from_secs(5),
    );
    let login = tokio::spawn(async move { loader.claim_and_load(id, 0).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    settle.commit().await.unwrap();
    let loaded = login.await.unwrap().unwrap();
    assert_eq!(loaded.source, LoadSource::Checkpoint);
    assert_eq!(
        loaded.snapshot.state["experience"], 53,
        "the settle's reward was not replayed on the checkpoint"
    );
}

/// The item-load ledger's index stays the size of its entries while items come and go for a
/// long time. Items are created in time order; a character keeps some for many rounds and
/// others briefly, so a few entries of every era outlive the rest. Keyed by item first, each
/// era's index pages kept one of those survivors and were never given back (the soak's
/// `item_loads` grew at a steady rate while its rows did not); keyed by character first, the
/// pages a character's entries share are reused by its next loads. Postgres only: it reads
/// the index's size off Postgres (`pg_relation_size`); SQLite reuses a table's freed pages.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn the_item_load_index_follows_its_entries_not_the_servers_age(pool: PgPool) {
    use rand::rngs::Xoshiro256PlusPlus;
    use rand::{RngExt, SeedableRng};
    const CHARACTERS: usize = 1000;
    const HELD: usize = 12;
    const ROUNDS: i64 = 60;
    let retention = BookkeepingRetention::default();
    let store = CharacterStore::new(pg(&pool)).with_item_load_retention(retention.item_loads);
    let bookkeeping = Bookkeeping::new(pg(&pool));
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(19);
    let pkey_bytes = async || -> i64 {
        sqlx::query_scalar("SELECT pg_relation_size('item_loads_pkey')")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let mut halfway = 0;
    let mut held: Vec<(uuid::Uuid, Vec<uuid::Uuid>)> = (0..CHARACTERS)
        .map(|_| {
            let items = (0..HELD).map(|_| uuid::Uuid::now_v7()).collect();
            (uuid::Uuid::from_u128(rng.random()), items)
        })
        .collect();
    for round in 0..ROUNDS {
        // Each character swaps one item it holds, picked at random, for a new one, and its
        // copy is a new one (a new owner epoch) every fifth round.
        let mut dropped = Vec::with_capacity(CHARACTERS);
        for (_, items) in &mut held {
            let slot = rng.random_range(0..HELD);
            dropped.push(std::mem::replace(&mut items[slot], uuid::Uuid::now_v7()));
        }
        let epoch = 1 + round / 5;
        futures::future::try_join_all(
            held.iter()
                .map(|(character, items)| store.record_item_loads(*character, epoch, items)),
        )
        .await
        .unwrap();
        // Entries of items no longer held age out and are pruned.
        sqlx::query(
            "UPDATE item_loads SET loaded_at = now() - interval '400 days' WHERE item_id = ANY($1)",
        )
        .bind(&dropped)
        .execute(&pool)
        .await
        .unwrap();
        while bookkeeping.prune_once(retention).await.unwrap().item_loads > 0 {}
        sqlx::query("VACUUM item_loads")
            .execute(&pool)
            .await
            .unwrap();
        if round == ROUNDS / 2 {
            halfway = pkey_bytes().await;
        }
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM item_loads")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, (CHARACTERS * HELD) as i64, "one entry per item held");
    let churned = pkey_bytes().await;
    sqlx::query("REINDEX INDEX item_loads_pkey")
        .execute(&pool)
        .await
        .unwrap();
    let rebuilt = pkey_bytes().await;
    eprintln!(
        "item_loads_pkey after {} rounds: {halfway} B; after {ROUNDS}: {churned} B; rebuilt: {rebuilt} B",
        ROUNDS / 2
    );
    assert!(
        churned * 10 <= halfway * 11,
        "the index grew from {halfway} B to {churned} B over the last {} rounds with as many entries",
        ROUNDS / 2
    );
    assert!(
        churned <= 2 * rebuilt,
        "the index holds {churned} B for entries a fresh build holds in {rebuilt} B"
    );
}
