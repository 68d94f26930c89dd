//! Claims that arrive together are made together (one statement of many characters) and each
//! still decides exactly what a claim made alone decides: one new epoch per claim, a second
//! claim of the same character in the same burst after the first, a character with a queued
//! job settled first, a refused or missing character answered as such.

use std::time::Duration;

use chrono::Utc;
use shardkeep::character::{CharacterLoader, CharacterStore, CheckpointStore, StoreError};
use shardkeep::retry::{IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload};
use shardkeep_testkit::model::{LedgerEffect, LedgerModel};
use shardkeep_testkit::{JobDriver, JobDrivers, TestRedis};
use sqlx::PgPool;
use uuid::Uuid;

use super::retry_jobs::{character, pg};

fn reward(id: Uuid, epoch: i64, xp: i64) -> PersistenceRetryJob {
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
            idempotency_key: format!("burst:{id}:{epoch}"),
            owner_epoch: epoch,
            origin: Origin::CombatRewards,
            issued_at: Utc::now(),
            issue_seq: 1,
        },
        "test",
        None,
    )
    .unwrap()
}

/// A loader over the test's database and Redis namespace.
fn loader(pool: &PgPool, redis: &TestRedis) -> CharacterLoader {
    CharacterLoader::new(
        CharacterStore::new(pg(pool)),
        Some(CheckpointStore::new(redis.backend())),
        LedgerModel::handle(),
        Duration::from_secs(10),
    )
}

/// `count` characters named `prefix` and a number.
async fn characters(pool: &PgPool, prefix: &str, count: usize) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for n in 0..count {
        ids.push(character(pool, &format!("{prefix}{n}")).await);
    }
    ids
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_burst_of_claims_mints_one_epoch_per_claim(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        burst_on(&d, &redis).await;
    }
}

async fn burst_on(d: &JobDriver, redis: &TestRedis) {
    let loader = CharacterLoader::new(
        d.characters(),
        Some(d.checkpoints(redis)),
        LedgerModel::handle(),
        Duration::from_secs(10),
    );
    let mut ids = Vec::new();
    for n in 0..150 {
        ids.push(d.character(&format!("burst{n}")).await);
    }
    // One of them left a reward queued under its first epoch, which no worker has run.
    let queued = ids[7];
    let first = loader.claim_and_load(queued, 0).await.unwrap().snapshot;
    let clock: std::sync::Arc<dyn shardkeep::clock::Clock> =
        std::sync::Arc::new(shardkeep::clock::SystemClock);
    let (queue, _signals) = d.queue(8, clock);
    queue
        .enqueue(&reward(queued, first.owner_epoch, 5))
        .await
        .unwrap();
    let missing = Uuid::now_v7();
    // Every character is claimed twice in the same burst, and one that does not exist once.
    let claims = ids
        .iter()
        .chain(ids.iter())
        .chain(std::iter::once(&missing))
        .map(|id| {
            let loader = loader.clone();
            let id = *id;
            async move { (id, loader.claim_and_load(id, 0).await) }
        });
    let results = futures::future::join_all(claims).await;
    let mut epochs: std::collections::HashMap<Uuid, Vec<i64>> = Default::default();
    for (id, result) in results {
        match result {
            Ok(loaded) => epochs
                .entry(id)
                .or_default()
                .push(loaded.snapshot.owner_epoch),
            Err(err) => {
                assert_eq!(id, missing, "{err}");
                assert!(
                    matches!(
                        err,
                        shardkeep::character::LoadError::Store {
                            source: StoreError::NotFound(_),
                            ..
                        }
                    ),
                    "{err}"
                );
            }
        }
    }
    for id in &ids {
        let mut minted = epochs.remove(id).unwrap_or_default();
        minted.sort_unstable();
        let base = if *id == queued { 1 } else { 0 };
        assert_eq!(
            minted,
            vec![base + 1, base + 2],
            "two claims, two epochs ({})",
            d.name()
        );
        let (stored,): (i64,) = d
            .fetch_one(
                "SELECT owner_epoch FROM characters WHERE id = $1",
                Some(*id),
            )
            .await;
        assert_eq!(stored, base + 2);
    }
    assert_eq!(
        d.experience(queued).await,
        5,
        "settled before the claim ({})",
        d.name()
    );
    assert_eq!(d.count("persistence_retry_jobs").await, 0, "{}", d.name());
}

/// A character whose row another transaction holds does not hold up the claims made with it:
/// they are made at once, and its own claim waits for the lock, alone, as a claim always did.
/// Postgres only: the embedded store has no row locks (one write transaction of the file at a
/// time holds every row), so no claim can be held up by another character's row there.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_locked_row_holds_up_only_its_own_claim(pool: PgPool) {
    let redis = TestRedis::new().await;
    let loader = loader(&pool, &redis);
    let ids = characters(&pool, "locked", 20).await;
    let locked = ids[3];
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM characters WHERE id = $1 FOR UPDATE")
        .bind(locked)
        .execute(&mut *holder)
        .await
        .unwrap();
    let waiting = {
        let loader = loader.clone();
        tokio::spawn(async move { loader.claim_and_load(locked, 0).await })
    };
    let others = ids.iter().filter(|id| **id != locked).map(|id| {
        let loader = loader.clone();
        let id = *id;
        async move { loader.claim_and_load(id, 0).await }
    });
    let done = tokio::time::timeout(Duration::from_secs(5), futures::future::join_all(others))
        .await
        .expect("the other claims wait for no lock");
    assert!(done.iter().all(Result::is_ok));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "its own claim waits for the lock");
    holder.rollback().await.unwrap();
    let loaded = waiting.await.unwrap().unwrap();
    assert_eq!(loaded.snapshot.owner_epoch, 1);
    // Every row holds the one epoch its claim minted.
    let epochs: Vec<i64> =
        sqlx::query_scalar("SELECT owner_epoch FROM characters WHERE id = ANY($1)")
            .bind(&ids)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(epochs, vec![1; ids.len()]);
}
