//! A rolling deploy, with copies, workers and transfers of two releases side by side: a worker
//! or a transfer never rewrites a row of a newer release, the jobs it leaves are not counted
//! against them, and a live older copy whose row a newer release upgraded loses none of its
//! saves.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use shardkeep::audit::AuditEvent;
use shardkeep::character::{Releaser, TransferCommit};
use shardkeep::clock::{Clock, SystemClock};
use shardkeep::model::ModelHandle;
use shardkeep::retry::{
    IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload, RetryQueue,
    RetryStats, RetryWorker, RetryWorkerConfig,
};
use shardkeep::saver::{SaveFeedback, SaveReason, Saver, SaverConfig, SaverEvent, SaverSinks};
use shardkeep_testkit::fixtures::new_character;
use shardkeep_testkit::model::LedgerEffect;
use shardkeep_testkit::{JobDriver, TestRedis};
use sqlx::PgPool;
use uuid::Uuid;

use super::schema_versions::{loader, stored, stored_version, v1, v1_character, v2};

fn job(
    id: Uuid,
    payload: PersistenceRetryPayload,
    key: &str,
    epoch: i64,
    seq: u64,
) -> PersistenceRetryJob {
    PersistenceRetryJob::new(
        payload,
        IdempotencyEnvelope {
            idempotency_key: key.into(),
            owner_epoch: epoch,
            origin: Origin::CombatRewards,
            issued_at: chrono::Utc::now(),
            issue_seq: seq,
        },
        "test",
        None,
    )
    .unwrap_or_else(|e| panic!("{id}: {e}"))
}

fn reward(id: Uuid, key: &str, epoch: i64, seq: u64, xp: i64) -> PersistenceRetryJob {
    let effect = LedgerEffect::CombatRewards {
        experience: xp,
        currency: 0,
        items: vec![],
    };
    job(
        id,
        PersistenceRetryPayload::effect(id, &effect).unwrap(),
        key,
        epoch,
        seq,
    )
}

/// A job of a kind the first release does not know, numbered 1 by the copy at `epoch`.
fn unknown_kind(id: Uuid, key: &str, epoch: i64) -> PersistenceRetryJob {
    let payload = PersistenceRetryPayload::decode(
        json!({ "kind": "honor_points", "character_id": id, "points": 3 }),
        None,
    )
    .unwrap();
    job(id, payload, key, epoch, 1)
}

fn worker(d: &JobDriver, model: ModelHandle, name: &str) -> (RetryQueue, RetryWorker) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (queue, signals) = d.queue(8, Arc::clone(&clock));
    let worker = d.worker_for(model, signals, RetryWorkerConfig::new(name), clock);
    (queue, worker)
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_older_worker_leaves_a_newer_releases_characters_uncounted(pool: PgPool) {
    let drivers = shardkeep_testkit::JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        older_worker_on(&d, &redis).await;
    }
}

async fn older_worker_on(d: &JobDriver, redis: &TestRedis) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (queue, signals) = d.queue(8, Arc::clone(&clock));
    let mut old_worker = d.worker_for(v1(), signals, RetryWorkerConfig::new("v1"), clock);
    let attempts_of = async |key: &str| {
        let (n,): (i32,) = d
            .fetch_one(
                &format!(
                    "SELECT attempt_count FROM persistence_retry_jobs WHERE idempotency_key = '{key}'"
                ),
                None,
            )
            .await;
        n
    };
    // Owned by a v1 copy: a kind the v1 model does not know is a bad job, and counts.
    let old_owned = new_character("Aria");
    d.characters().create(&old_owned).await.unwrap();
    let old_owned = old_owned.character_id;
    let epoch = loader(d, redis, v1())
        .claim_and_load(old_owned, 0)
        .await
        .unwrap()
        .snapshot
        .owner_epoch;
    queue
        .enqueue(&unknown_kind(old_owned, "bad", epoch))
        .await
        .unwrap();
    // Owned by a v2 copy that has not saved yet (its row still holds the v1 document): the job
    // may be of a kind only v2 knows, so the v1 worker leaves it to a v2 one.
    let new_owned = new_character("Brin");
    d.characters().create(&new_owned).await.unwrap();
    let epoch = loader(d, redis, v2())
        .claim_and_load(new_owned.character_id, 0)
        .await
        .unwrap()
        .snapshot
        .owner_epoch;
    queue
        .enqueue(&unknown_kind(new_owned.character_id, "newer", epoch))
        .await
        .unwrap();
    old_worker.run_until_idle().await.unwrap();
    assert_eq!(
        attempts_of("bad").await,
        1,
        "a bad job counts ({})",
        d.name()
    );
    assert_eq!(
        attempts_of("newer").await,
        0,
        "left uncounted ({})",
        d.name()
    );
    assert_eq!(
        RetryStats::get(&old_worker.stats().deferred),
        1,
        "{}",
        d.name()
    );
}

/// Collects the saver's events.
#[derive(Default)]
struct Events(std::sync::Mutex<Vec<SaverEvent>>);

impl SaveFeedback for Events {
    fn deliver(&self, event: SaverEvent) {
        self.0.lock().unwrap().push(event);
    }

    fn is_present(&self, _: Uuid) -> bool {
        false
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_live_older_copy_keeps_saving_after_a_newer_worker_upgraded_its_row(pool: PgPool) {
    let drivers = shardkeep_testkit::JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        older_copy_on(&d, &redis).await;
    }
}

async fn older_copy_on(d: &JobDriver, redis: &TestRedis) {
    let id = v1_character(d).await;
    let mut live = loader(d, redis, v1())
        .claim_and_load(id, 0)
        .await
        .unwrap()
        .snapshot;
    // Mid-deploy, a v2 worker applies a reward the v1 copy issued: the row is v2 now, its
    // owner still the live v1 copy (3 experience, held by the copy too).
    let (queue, mut new_worker) = worker(d, v2(), "v2");
    queue
        .enqueue(&reward(id, "reward", live.owner_epoch, 1, 3))
        .await
        .unwrap();
    new_worker.run_until_idle().await.unwrap();
    assert_eq!(stored(d, id).await.0, 2);
    let events = Arc::new(Events::default());
    let saver = Saver::spawn(
        SaverSinks {
            rows: Some(d.characters()),
            checkpoints: Some(d.checkpoints(redis)),
            retry: Some(queue.clone()),
        },
        events.clone(),
        SaverConfig::default(),
        shardkeep_testkit::namespace_stop(redis.keys().namespace()),
    );
    // The copy's cadence flush (20 experience) cannot land over the v2 row: it goes on as a
    // state job, which the v2 worker upgrades and applies. The copy is not evicted.
    live.state.set_field("experience", json!(20));
    live.issue_mark = 1;
    saver.enqueue(SaveReason::Flush, live.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        new_worker.run_until_idle().await.unwrap();
        if stored(d, id).await.2["experience"] == 20 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the flush never landed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The player logs out with 43: the final save goes the same way.
    live.state.set_field("experience", json!(43));
    live.state_version = stored_version(d, id).await;
    saver.enqueue(SaveReason::Final, live.clone());
    let _ = saver.barrier(Duration::from_secs(10)).await;
    let seen = events.0.lock().unwrap().clone();
    assert!(
        seen.iter()
            .any(|e| matches!(e, SaverEvent::FinalQueuedAsJob { .. })),
        "the final save became a state job: {seen:?}"
    );
    assert!(
        !seen.iter().any(|e| matches!(
            e,
            SaverEvent::SchemaOutdated { .. } | SaverEvent::OwnershipLost { .. }
        )),
        "never an eviction: {seen:?}"
    );
    new_worker.run_until_idle().await.unwrap();
    let (schema, _, state) = stored(d, id).await;
    assert_eq!(
        (
            schema,
            &state["experience"],
            &state["coins"],
            state.get("gold")
        ),
        (2, &json!(43), &json!(1), None),
        "{state}"
    );
}

/// A character holding `item`, loaded by a copy of `model`, which then departs: its id and
/// that copy's loaded snapshot.
async fn releaser(
    d: &JobDriver,
    redis: &TestRedis,
    name: &str,
    item: Uuid,
    model: ModelHandle,
) -> (Uuid, shardkeep::character::CharacterSnapshot) {
    let mut new = new_character(name);
    new.state = json!({ "gold": 4, "inventory": [{ "id": item }] }).into();
    d.characters().create(&new).await.unwrap();
    let copy = loader(d, redis, model)
        .claim_and_load(new.character_id, 0)
        .await
        .unwrap()
        .snapshot;
    (new.character_id, copy)
}

/// A v2 acquirer's pickup of `item` released by `(releaser, epoch)`.
async fn pick_up(
    d: &JobDriver,
    redis: &TestRedis,
    acquirer: Uuid,
    model: ModelHandle,
    (from, epoch): (Uuid, i64),
    item: Uuid,
) -> TransferCommit {
    let mut picked = loader(d, redis, model.clone())
        .claim_and_load(acquirer, 0)
        .await
        .unwrap()
        .snapshot;
    picked.state.set_field("inventory", json!([{ "id": item }]));
    let audit =
        AuditEvent::item_transferred(acquirer, from, Uuid::now_v7(), json!({ "item": item }));
    let departed = Releaser::Departed {
        character_id: from,
        item_id: item,
        released_epoch: epoch,
    };
    d.characters()
        .commit_transfer(&model, departed, &picked, &audit)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_transfer_never_rewrites_a_newer_releaser_and_upgrades_an_older_one(pool: PgPool) {
    let drivers = shardkeep_testkit::JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        transfer_on(&d, &redis).await;
    }
}

async fn transfer_on(d: &JobDriver, redis: &TestRedis) {
    let acquirer = v1_character(d).await;
    // A v2 copy dropped the item and departed, after saving its v2 document: a v1 pickup must
    // not rewrite that row.
    let item = Uuid::now_v7();
    let (id, copy) = releaser(d, redis, "Cato", item, v2()).await;
    d.characters().save(&copy).await.unwrap();
    let newer = (id, copy.owner_epoch);
    let outcome = pick_up(d, redis, acquirer, v1(), newer, item).await;
    assert!(
        matches!(&outcome, TransferCommit::Rejected(r) if r.contains("schema version 2")),
        "{outcome:?}"
    );
    let (schema, _, state) = stored(d, newer.0).await;
    assert_eq!((schema, &state["inventory"][0]["id"]), (2, &json!(item)));
    // A v1 copy's item: a v2 pickup upgrades the v1 row as it takes the item (the copy, if it
    // still lives, then saves through state jobs).
    let other = Uuid::now_v7();
    let (id, copy) = releaser(d, redis, "Dara", other, v1()).await;
    let outcome = pick_up(d, redis, acquirer, v2(), (id, copy.owner_epoch), other).await;
    assert!(
        matches!(outcome, TransferCommit::Committed { .. }),
        "{outcome:?}"
    );
    let (schema, _, state) = stored(d, id).await;
    assert_eq!(
        (schema, &state["coins"], &state["inventory"]),
        (2, &json!(4), &json!([]))
    );
    // A v2 copy whose row still holds the v1 document: the v2 pickup upgrades it as it takes.
    let third = Uuid::now_v7();
    let (id, copy) = releaser(d, redis, "Edda", third, v2()).await;
    let fresh = (id, copy.owner_epoch);
    let outcome = pick_up(d, redis, acquirer, v2(), fresh, third).await;
    assert!(
        matches!(outcome, TransferCommit::Committed { .. }),
        "{outcome:?}"
    );
    let (schema, _, state) = stored(d, fresh.0).await;
    assert_eq!(
        (schema, &state["coins"], &state["inventory"]),
        (2, &json!(4), &json!([])),
        "{state}"
    );
}
