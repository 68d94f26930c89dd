//! A copy that dies with acknowledged writes still queued as retry jobs (their first attempt
//! failed and waits out its backoff, or no worker got to them yet) loses none of them when the
//! next copy claims the character: the claim settles its predecessor's pending jobs first, under
//! the same lock, and the loader replays them on a newer checkpoint that does not hold them.

use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use shardkeep::character::{CharacterLoader, CharacterSnapshot, CharacterStore, CheckpointStore};
use shardkeep::retry::{
    IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload, RetryQueue,
};
use shardkeep_testkit::TestRedis;
use shardkeep_testkit::model::{LedgerEffect, LedgerModel};
use sqlx::PgPool;
use uuid::Uuid;

use super::retry_jobs::{character, experience, pg};

fn loader(pool: &PgPool, redis: &TestRedis) -> CharacterLoader {
    CharacterLoader::new(
        CharacterStore::new(pg(pool)),
        Some(CheckpointStore::new(redis.backend())),
        LedgerModel::handle(),
        Duration::from_secs(5),
    )
}

/// A reward of `xp` issued by the copy at `epoch` as its `seq`-th write.
fn reward(id: Uuid, epoch: i64, seq: u64, xp: i64) -> PersistenceRetryJob {
    PersistenceRetryJob::new(
        PersistenceRetryPayload::effect(
            id,
            &LedgerEffect::CombatRewards {
                experience: xp,
                currency: 0,
                items: vec![],
            },
        )
        .unwrap(),
        IdempotencyEnvelope {
            idempotency_key: format!("reward:{id}:{epoch}:{seq}"),
            owner_epoch: epoch,
            origin: Origin::CombatRewards,
            issued_at: Utc::now(),
            issue_seq: seq,
        },
        "test",
        None,
    )
    .unwrap()
}

/// Queues `job` with its first attempt an hour away (a failed attempt backing off).
async fn queue_backing_off(pool: &PgPool, job: &PersistenceRetryJob) {
    let clock: std::sync::Arc<dyn shardkeep::clock::Clock> =
        std::sync::Arc::new(shardkeep::clock::SystemClock);
    let (queue, _signals) = RetryQueue::new(pg(pool), 8, clock);
    queue.enqueue(job).await.unwrap();
    sqlx::query(
        "UPDATE persistence_retry_jobs SET next_attempt_at = now() + interval '1 hour',
                attempt_count = 1 WHERE retry_job_id = $1",
    )
    .bind(job.retry_job_id())
    .execute(pool)
    .await
    .unwrap();
}

async fn pending(pool: &PgPool, id: Uuid) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM persistence_retry_jobs WHERE character_id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The first copy's checkpoint: its content with `xp` experience, dumped at `mark`.
fn checkpoint_of(first: &CharacterSnapshot, xp: i64, mark: u64) -> CharacterSnapshot {
    let mut snapshot = first.clone();
    snapshot.state.set_field("experience", json!(xp));
    snapshot.issue_mark = mark;
    snapshot
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn the_next_claim_settles_a_dead_copys_pending_jobs(pool: PgPool) {
    let redis = TestRedis::new().await;
    let checkpoints = CheckpointStore::new(redis.backend());
    let loader = loader(&pool, &redis);
    // Three characters whose first copy died with a 7-experience reward queued: one with no
    // checkpoint, one whose checkpoint (3 experience) was dumped before the reward, one whose
    // checkpoint (10) was dumped after it and holds it.
    let (plain, before, after) = (
        character(&pool, "A").await,
        character(&pool, "B").await,
        character(&pool, "C").await,
    );
    for (id, checkpoint) in [
        (plain, None),
        (before, Some((3, 0))),
        (after, Some((10, 1))),
    ] {
        let first = loader.claim_and_load(id, 0).await.unwrap().snapshot;
        if let Some((xp, mark)) = checkpoint {
            checkpoints
                .write(&checkpoint_of(&first, xp, mark))
                .await
                .unwrap();
        }
        queue_backing_off(&pool, &reward(id, first.owner_epoch, 1, 7)).await;
    }
    // The players log in again elsewhere.
    for (id, want) in [(plain, 7), (before, 10), (after, 10)] {
        let second = loader.claim_and_load(id, 0).await.unwrap().snapshot;
        assert_eq!(
            second.state["experience"], want,
            "the dead copy's acknowledged reward, exactly once: {}",
            second.state
        );
        assert_eq!(pending(&pool, id).await, 0, "settled by the claim");
        // The new copy's first save keeps it.
        CharacterStore::new(pg(&pool)).save(&second).await.unwrap();
        assert_eq!(experience(&pool, id).await, want);
    }
}

/// Runs the PL/pgSQL `statements` before every job effect is recorded (a database that refuses
/// some writes); dropped with `DROP TRIGGER test_hook ON character_job_effects`.
async fn on_effect_recorded(pool: &PgPool, statements: &str) {
    let function = format!(
        "CREATE FUNCTION test_hook() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN {statements} RETURN NEW; END $$"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(function))
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "CREATE TRIGGER test_hook BEFORE INSERT ON character_job_effects
         FOR EACH ROW EXECUTE FUNCTION test_hook()",
    )
    .execute(pool)
    .await
    .unwrap();
}

async fn dead_letters(pool: &PgPool, id: Uuid) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT idempotency_key FROM persistence_job_dead_letters WHERE character_id = $1
          ORDER BY idempotency_key",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_job_the_claim_cannot_settle_never_blocks_the_login(pool: PgPool) {
    let redis = TestRedis::new().await;
    let loader = loader(&pool, &redis);
    let id = character(&pool, "A").await;
    let epoch = loader
        .claim_and_load(id, 0)
        .await
        .unwrap()
        .snapshot
        .owner_epoch;
    // Three queued rewards: one the database refuses to record, one that crashed the workers
    // that took it (its lease ran out too often), and a good one.
    let refused = reward(id, epoch, 1, 100);
    let crashing = reward(id, epoch, 2, 1000);
    let good = reward(id, epoch, 3, 7);
    for job in [&refused, &crashing, &good] {
        queue_backing_off(&pool, job).await;
    }
    sqlx::query("UPDATE persistence_retry_jobs SET lease_expiries = 9 WHERE retry_job_id = $1")
        .bind(crashing.retry_job_id())
        .execute(&pool)
        .await
        .unwrap();
    on_effect_recorded(
        &pool,
        "IF NEW.idempotency_key LIKE '%:1' THEN RAISE EXCEPTION 'refused for the test'; END IF;",
    )
    .await;
    let second = loader.claim_and_load(id, 0).await.unwrap().snapshot;
    assert_eq!(
        second.state["experience"], 7,
        "only the good one: {}",
        second.state
    );
    assert_eq!(pending(&pool, id).await, 0);
    let dead = dead_letters(&pool, id).await;
    let mut want = vec![
        refused.envelope().idempotency_key.clone(),
        crashing.envelope().idempotency_key.clone(),
    ];
    want.sort();
    assert_eq!(dead, want, "both are in the dead letters for an operator");
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_passing_database_failure_fails_the_claim_and_keeps_the_jobs(pool: PgPool) {
    let redis = TestRedis::new().await;
    let loader = loader(&pool, &redis);
    let id = character(&pool, "A").await;
    let epoch = loader
        .claim_and_load(id, 0)
        .await
        .unwrap()
        .snapshot
        .owner_epoch;
    queue_backing_off(&pool, &reward(id, epoch, 1, 7)).await;
    // A failure that is not the job's (here a serialization failure): no dead letter, no epoch.
    on_effect_recorded(
        &pool,
        "RAISE EXCEPTION 'try again' USING ERRCODE = '40001';",
    )
    .await;
    assert!(
        loader.claim_and_load(id, 0).await.is_err(),
        "the login fails"
    );
    assert_eq!(pending(&pool, id).await, 1, "the job is kept");
    assert!(dead_letters(&pool, id).await.is_empty());
    let row = CharacterStore::new(pg(&pool))
        .load(id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.owner_epoch, epoch, "no epoch minted");
    // Once the database recovers, the next login lands it.
    sqlx::query("DROP TRIGGER test_hook ON character_job_effects")
        .execute(&pool)
        .await
        .unwrap();
    let second = loader.claim_and_load(id, 0).await.unwrap().snapshot;
    assert_eq!(second.state["experience"], 7);
}
