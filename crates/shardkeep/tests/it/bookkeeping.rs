//! shardkeep's own bookkeeping (issue marks, job effects beside the row, the item-load ledger):
//! what it protects, against real Postgres and Redis.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use shardkeep::PostgresBackend;
use shardkeep::character::{
    CharacterLoader, CharacterSnapshot, CharacterStore, CheckpointStore, LoadSource, SaveOutcome,
};
use shardkeep::clock::{Clock, SystemClock};
use shardkeep::retry::{
    IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload, RetryQueue,
    RetryWorker, RetryWorkerConfig,
};
use shardkeep_testkit::TestRedis;
use sqlx::PgPool;

use crate::ladder_store::created;

fn pg(pool: &PgPool) -> PostgresBackend {
    PostgresBackend::from_pool(pool.clone())
}

fn appearance_job(
    snapshot: &CharacterSnapshot,
    hair: &str,
    key: &str,
    issue_seq: u64,
) -> PersistenceRetryJob {
    PersistenceRetryJob::new(
        PersistenceRetryPayload::CharacterAppearance {
            character_id: snapshot.character_id,
            appearance: serde_json::from_value(json!({ "hair": hair })).unwrap(),
        },
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
    let redis = TestRedis::new().await;
    let store = CharacterStore::new(pg(&pool));
    let checkpoints = CheckpointStore::new(redis.backend());
    let row = created(&store, "Aria").await;
    let epoch = store.claim(row.character_id, 0).await.unwrap().new_epoch;
    let mut live = CharacterSnapshot {
        owner_epoch: epoch,
        state: json!({ "appearance": { "hair": "grey" } }),
        ..row.clone()
    };
    assert_eq!(store.save(&live).await.unwrap(), SaveOutcome::Saved(1));
    live.state_version = 1;

    // The copy changes its hair to red (its first issue); the direct write fails, so it becomes
    // a retry job.
    let red = appearance_job(&live, "red", "looks-1", 1);
    // Then the player changes it again, to blue (a second issue), and the copy checkpoints that.
    live.state = json!({ "appearance": { "hair": "blue" } });
    live.issue_mark = 2;
    checkpoints.write(&live).await.unwrap();

    // The job for red lands on the row after the checkpoint was dumped; then the shard dies.
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (queue, signals) = RetryQueue::new(pg(&pool), 8, Arc::clone(&clock));
    queue.enqueue(&red).await.unwrap();
    let mut worker = RetryWorker::new(pg(&pool), signals, RetryWorkerConfig::new("w"), clock);
    assert_eq!(worker.run_until_idle().await.unwrap(), 1);

    let loader = CharacterLoader::new(store, Some(checkpoints), Duration::from_secs(5));
    let loaded = loader.claim_and_load(row.character_id, 0).await.unwrap();
    assert_eq!(loaded.source, LoadSource::Checkpoint);
    assert_eq!(
        loaded.snapshot.state["appearance"]["hair"], "blue",
        "the older red replayed over the newer checkpoint"
    );
}
