//! A rolling deploy, with copies, workers and transfers of two releases side by side: a worker
//! or a transfer never rewrites a row that another release owns, jobs it leaves are not counted
//! against them, and a live older copy's logout save is never lost, even when its row was
//! upgraded under it.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use shardkeep::audit::AuditEvent;
use shardkeep::character::{CharacterStore, CheckpointStore, Releaser, TransferCommit};
use shardkeep::clock::{Clock, SystemClock};
use shardkeep::model::ModelHandle;
use shardkeep::retry::{
    IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload, RetryQueue,
    RetryStats, RetryWorker, RetryWorkerConfig,
};
use shardkeep::saver::{SaveFeedback, SaveReason, Saver, SaverConfig, SaverEvent, SaverSinks};
use shardkeep_testkit::TestRedis;
use shardkeep_testkit::fixtures::new_character;
use shardkeep_testkit::model::LedgerEffect;
use sqlx::PgPool;
use uuid::Uuid;

use super::schema_versions::{loader, pg, stored, stored_version, v1, v1_character, v2};

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

/// A job of a kind the first release does not know.
fn unknown_kind(id: Uuid, key: &str, epoch: i64) -> PersistenceRetryJob {
    let payload = PersistenceRetryPayload::decode(
        json!({ "kind": "honor_points", "character_id": id, "points": 3 }),
        None,
    )
    .unwrap();
    job(id, payload, key, epoch, 0)
}

async fn attempts_of(pool: &PgPool, key: &str) -> i32 {
    sqlx::query_scalar(
        "SELECT attempt_count FROM persistence_retry_jobs WHERE idempotency_key = $1",
    )
    .bind(key)
    .fetch_one(pool)
    .await
    .unwrap()
}

fn worker(pool: &PgPool, model: ModelHandle, name: &str) -> (RetryQueue, RetryWorker) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (queue, signals) = RetryQueue::new(pg(pool), 8, Arc::clone(&clock));
    let worker = RetryWorker::new(
        pg(pool),
        model,
        signals,
        RetryWorkerConfig::new(name),
        clock,
    );
    (queue, worker)
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_worker_leaves_another_releases_characters_uncounted(pool: PgPool) {
    let redis = TestRedis::new().await;
    let (queue, mut old_worker) = worker(&pool, v1(), "v1");
    // Owned by a v1 copy: a kind the v1 model does not know is a bad job, and counts.
    let old_owned = v1_character(&pool).await;
    let epoch = loader(&pool, &redis, v1())
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
    CharacterStore::new(pg(&pool))
        .create(&new_owned)
        .await
        .unwrap();
    let epoch = loader(&pool, &redis, v2())
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
    assert_eq!(attempts_of(&pool, "bad").await, 1, "a bad job counts");
    assert_eq!(attempts_of(&pool, "newer").await, 0, "left uncounted");
    assert_eq!(RetryStats::get(&old_worker.stats().deferred), 1);
    // And the other way round: a v2 worker leaves a live v1 copy's reward alone (upgrading the
    // row would make the row refuse that copy's own saves).
    let (queue, mut new_worker) = worker(&pool, v2(), "v2");
    queue
        .enqueue(&reward(
            old_owned,
            "older",
            epoch_of(&pool, old_owned).await,
            1,
            3,
        ))
        .await
        .unwrap();
    new_worker.run_until_idle().await.unwrap();
    assert_eq!(attempts_of(&pool, "older").await, 0, "left uncounted");
    let (schema, _, state) = stored(&pool, old_owned).await;
    assert_eq!(
        (schema, state.get("experience")),
        (1, None),
        "not rewritten: {state}"
    );
    // The v1 release's worker applies it, once it is due again.
    sqlx::query("UPDATE persistence_retry_jobs SET next_attempt_at = now()")
        .execute(&pool)
        .await
        .unwrap();
    old_worker.run_until_idle().await.unwrap();
    assert_eq!(stored(&pool, old_owned).await.2["experience"], 3);
}

async fn epoch_of(pool: &PgPool, id: Uuid) -> i64 {
    stored(pool, id).await.1
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
async fn a_live_older_copys_logout_save_lands_even_over_a_row_upgraded_under_it(pool: PgPool) {
    let redis = TestRedis::new().await;
    let id = v1_character(&pool).await;
    let mut live = loader(&pool, &redis, v1())
        .claim_and_load(id, 0)
        .await
        .unwrap()
        .snapshot;
    // The row is upgraded under the live v1 copy (an operator's migration script; shardkeep's
    // own writers leave a live older owner's row alone).
    sqlx::query(
        "UPDATE characters SET schema_version = 2, state = '{\"coins\": 1}',
                state_version = state_version + 1 WHERE id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap();
    // The player logs out: the v1 copy's final save has 43 experience.
    live.state["experience"] = json!(43);
    live.state_version = stored_version(&pool, id).await;
    let (queue, mut new_worker) = worker(&pool, v2(), "v2");
    let events = Arc::new(Events::default());
    let saver = Saver::spawn(
        SaverSinks {
            rows: Some(CharacterStore::new(pg(&pool))),
            checkpoints: Some(CheckpointStore::new(redis.backend())),
            retry: Some(queue.clone()),
        },
        events.clone(),
        SaverConfig::default(),
        tokio_util::sync::CancellationToken::new(),
    );
    saver.enqueue(SaveReason::Final, live.clone());
    let _ = saver.barrier(Duration::from_secs(10)).await;
    let seen = events.0.lock().unwrap().clone();
    assert!(
        seen.iter()
            .any(|e| matches!(e, SaverEvent::FinalQueuedAsJob { .. })),
        "the final save became a state job, never an eviction: {seen:?}"
    );
    // A v2 worker upgrades the v1 content as it applies it: nothing the copy held is lost, and
    // nothing older than v2 is stored.
    new_worker.run_until_idle().await.unwrap();
    let (schema, _, state) = stored(&pool, id).await;
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
    pool: &PgPool,
    redis: &TestRedis,
    name: &str,
    item: Uuid,
    model: ModelHandle,
) -> (Uuid, shardkeep::character::CharacterSnapshot) {
    let mut new = new_character(name);
    new.state = json!({ "gold": 4, "inventory": [{ "id": item }] });
    CharacterStore::new(pg(pool)).create(&new).await.unwrap();
    let copy = loader(pool, redis, model)
        .claim_and_load(new.character_id, 0)
        .await
        .unwrap()
        .snapshot;
    (new.character_id, copy)
}

/// A v2 acquirer's pickup of `item` released by `(releaser, epoch)`.
async fn pick_up(
    pool: &PgPool,
    redis: &TestRedis,
    acquirer: Uuid,
    model: ModelHandle,
    (from, epoch): (Uuid, i64),
    item: Uuid,
) -> TransferCommit {
    let mut picked = loader(pool, redis, model.clone())
        .claim_and_load(acquirer, 0)
        .await
        .unwrap()
        .snapshot;
    picked.state["inventory"] = json!([{ "id": item }]);
    let audit =
        AuditEvent::item_transferred(acquirer, from, Uuid::now_v7(), json!({ "item": item }));
    let departed = Releaser::Departed {
        character_id: from,
        item_id: item,
        released_epoch: epoch,
    };
    CharacterStore::new(pg(pool))
        .commit_transfer(&model, departed, &picked, &audit)
        .await
        .unwrap()
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_transfer_rewrites_a_releaser_only_within_its_own_release(pool: PgPool) {
    let redis = TestRedis::new().await;
    let acquirer = v1_character(&pool).await;
    // A v2 copy dropped the item and departed, after saving its v2 document: a v1 pickup must
    // not rewrite that row.
    let item = Uuid::now_v7();
    let (id, copy) = releaser(&pool, &redis, "Cato", item, v2()).await;
    CharacterStore::new(pg(&pool)).save(&copy).await.unwrap();
    let newer = (id, copy.owner_epoch);
    let outcome = pick_up(&pool, &redis, acquirer, v1(), newer, item).await;
    assert!(
        matches!(&outcome, TransferCommit::Rejected(r) if r.contains("schema version 2")),
        "{outcome:?}"
    );
    let (schema, _, state) = stored(&pool, newer.0).await;
    assert_eq!((schema, &state["inventory"][0]["id"]), (2, &json!(item)));
    // A live v1 copy's item: a v2 pickup must not upgrade the row under it.
    let other = Uuid::now_v7();
    let (id, copy) = releaser(&pool, &redis, "Dara", other, v1()).await;
    let older = (id, copy.owner_epoch);
    let outcome = pick_up(&pool, &redis, acquirer, v2(), older, other).await;
    assert!(
        matches!(&outcome, TransferCommit::Rejected(r) if r.contains("older release")),
        "{outcome:?}"
    );
    assert_eq!(stored(&pool, older.0).await.0, 1);
    // A v2 copy whose row still holds the v1 document: the v2 pickup upgrades it as it takes.
    let third = Uuid::now_v7();
    let (id, copy) = releaser(&pool, &redis, "Edda", third, v2()).await;
    let fresh = (id, copy.owner_epoch);
    let outcome = pick_up(&pool, &redis, acquirer, v2(), fresh, third).await;
    assert!(
        matches!(outcome, TransferCommit::Committed { .. }),
        "{outcome:?}"
    );
    let (schema, _, state) = stored(&pool, fresh.0).await;
    assert_eq!(
        (schema, &state["coins"], &state["inventory"]),
        (2, &json!(4), &json!([])),
        "{state}"
    );
}
