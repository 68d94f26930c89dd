//! Versioned state across deploys: a newer model upgrades older documents on load and the next
//! save persists the new version; an older model neither claims a newer document nor writes
//! over one (row, batch, checkpoint or retry job).

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use shardkeep::character::{
    CharacterLoader, CheckpointWrite, HandoffPayload, LoadError, SaveOutcome, StoreError,
};
use shardkeep::clock::{Clock, SystemClock};
use shardkeep::model::{Anchor, GameModel, ModelHandle};
use shardkeep::retry::{
    IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload, RetryStats,
    RetryWorkerConfig,
};
use shardkeep_testkit::fixtures::new_character;
use shardkeep_testkit::model::{LedgerEffect, LedgerModel};
use shardkeep_testkit::{JobDriver, TestRedis};
use sqlx::PgPool;
use uuid::Uuid;

/// The ledger model's second release: `gold` became `coins`.
struct LedgerV2;

impl GameModel for LedgerV2 {
    type State = serde_json::Map<String, serde_json::Value>;
    type Effect = LedgerEffect;
    const SCHEMA_VERSION: u32 = 2;

    fn upcast(&self, from: u32, mut state: serde_json::Value) -> Result<serde_json::Value, String> {
        if from != 1 {
            return Err(format!("no step from {from}"));
        }
        let object = state.as_object_mut().ok_or("not an object")?;
        let gold = object.remove("gold").unwrap_or(json!(0));
        object.insert("coins".into(), gold);
        Ok(state)
    }

    fn apply_effect(
        &self,
        state: &mut Self::State,
        anchor: &mut Anchor,
        effect: &LedgerEffect,
    ) -> Result<bool, String> {
        LedgerModel.apply_effect(state, anchor, effect)
    }

    fn held_items(&self, state: &Self::State) -> Vec<Uuid> {
        LedgerModel.held_items(state)
    }

    fn take_item(&self, state: &mut Self::State, item: Uuid) -> bool {
        LedgerModel.take_item(state, item)
    }
}

pub(crate) fn v1() -> ModelHandle {
    LedgerModel::handle()
}

pub(crate) fn v2() -> ModelHandle {
    ModelHandle::new(LedgerV2)
}

/// A loader of `model` over the driver's rows and checkpoints (Redis under `redis` beside
/// Postgres, the same file beside the embedded store).
pub(crate) fn loader(d: &JobDriver, redis: &TestRedis, model: ModelHandle) -> CharacterLoader {
    CharacterLoader::new(
        d.characters(),
        Some(d.checkpoints(redis)),
        model,
        Duration::from_secs(5),
    )
}

/// The character's stored schema version, owner epoch and document.
pub(crate) async fn stored(d: &JobDriver, id: Uuid) -> (i32, i64, serde_json::Value) {
    let (schema, epoch): (i32, i64) = d
        .fetch_one(
            "SELECT schema_version, owner_epoch FROM characters WHERE id = $1",
            Some(id),
        )
        .await;
    (schema, epoch, d.state(id).await)
}

/// A character created by the first release (`gold`, schema 1).
pub(crate) async fn v1_character(d: &JobDriver) -> Uuid {
    let new = new_character("Aria");
    d.characters().create(&new).await.unwrap();
    new.character_id
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_newer_model_upgrades_on_load_and_the_next_save_persists_the_version(pool: PgPool) {
    let drivers = shardkeep_testkit::JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        upgrade_on(&d, &redis).await;
    }
}

async fn upgrade_on(d: &JobDriver, redis: &TestRedis) {
    let id = v1_character(d).await;
    let loaded = loader(d, redis, v2()).claim_and_load(id, 0).await.unwrap();
    assert_eq!(loaded.snapshot.schema_version, 2);
    assert_eq!(
        loaded.snapshot.state["coins"], 1,
        "upgraded: {}",
        loaded.snapshot.state
    );
    assert_eq!(stored(d, id).await.0, 1, "loading alone writes nothing");
    let outcome = d.characters().save(&loaded.snapshot).await.unwrap();
    assert!(matches!(outcome, SaveOutcome::Saved(_)), "{outcome:?}");
    let (schema, _, state) = stored(d, id).await;
    assert_eq!((schema, &state["coins"]), (2, &json!(1)));
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_older_model_refuses_a_newer_character_without_claiming_it(pool: PgPool) {
    let drivers = shardkeep_testkit::JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        refusal_on(&d, &redis).await;
    }
}

async fn refusal_on(d: &JobDriver, redis: &TestRedis) {
    let id = v1_character(d).await;
    let loaded = loader(d, redis, v2()).claim_and_load(id, 0).await.unwrap();
    d.characters().save(&loaded.snapshot).await.unwrap();
    let epoch_before = stored(d, id).await.1;
    let refused = loader(d, redis, v1()).claim_and_load(id, 0).await;
    match refused {
        Err(LoadError::Store {
            source:
                StoreError::SchemaNewer {
                    stored: 2,
                    supported: 1,
                    ..
                },
            ..
        }) => {}
        other => panic!("expected a schema refusal, got {other:?}"),
    }
    assert_eq!(stored(d, id).await.1, epoch_before, "no epoch was minted");
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_older_models_save_over_a_newer_row_is_fenced(pool: PgPool) {
    let drivers = shardkeep_testkit::JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        fenced_save_on(&d, &redis).await;
    }
}

async fn fenced_save_on(d: &JobDriver, redis: &TestRedis) {
    let store = d.characters();
    let id = v1_character(d).await;
    // A v1 copy loaded first (a zombie of the old release), then the new release took over
    // and saved at v2 under the same epoch lineage rules.
    let old = loader(d, redis, v1()).claim_and_load(id, 0).await.unwrap();
    let new = loader(d, redis, v2()).claim_and_load(id, 0).await.unwrap();
    store.save(&new.snapshot).await.unwrap();
    let mut stale = old.snapshot.clone();
    stale.owner_epoch = new.snapshot.owner_epoch;
    stale.state_version = stored_version(d, id).await;
    assert_eq!(
        store.save(&stale).await.unwrap(),
        SaveOutcome::SchemaOutdated(2)
    );
    let batch = store.save_many(&[&stale]).await.unwrap();
    assert_eq!(batch[0].1, SaveOutcome::SchemaOutdated(2));
    let (schema, _, state) = stored(d, id).await;
    assert_eq!(
        (schema, state.get("gold")),
        (2, None),
        "never applied: {state}"
    );
}

/// The character's stored row version.
pub(crate) async fn stored_version(d: &JobDriver, id: Uuid) -> i64 {
    let (version,): (i64,) = d
        .fetch_one(
            "SELECT state_version FROM characters WHERE id = $1",
            Some(id),
        )
        .await;
    version
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_older_checkpoint_never_replaces_a_newer_one_and_an_older_model_refuses_it(
    pool: PgPool,
) {
    let drivers = shardkeep_testkit::JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        older_checkpoint_on(&d, &redis).await;
    }
}

async fn older_checkpoint_on(d: &JobDriver, redis: &TestRedis) {
    let checkpoints = d.checkpoints(redis);
    let id = v1_character(d).await;
    let new = loader(d, redis, v2()).claim_and_load(id, 0).await.unwrap();
    assert_eq!(
        checkpoints.write(&new.snapshot).await.unwrap(),
        CheckpointWrite::Written
    );
    let mut older = new.snapshot.clone();
    older.schema_version = 1;
    older.state = json!({ "gold": 1 }).into();
    assert_eq!(
        checkpoints.write(&older).await.unwrap(),
        CheckpointWrite::SchemaNewer { stored_schema: 2 }
    );
    // The row is still v1, the checkpoint v2 (the v2 copy has not saved yet). A v1 process must
    // refuse before it claims: an epoch minted and then not used would leave the v2 checkpoint
    // older than the row's owner, and the next login would bury it.
    let mut live = new.snapshot.clone();
    live.state.set_field("coins", json!(50));
    checkpoints.write(&live).await.unwrap();
    let epoch_before = stored(d, id).await.1;
    match loader(d, redis, v1()).claim_and_load(id, 0).await {
        Err(LoadError::Store {
            source:
                StoreError::SchemaNewer {
                    stored: 2,
                    supported: 1,
                    ..
                },
            ..
        }) => {}
        other => panic!("expected a schema refusal, got {other:?}"),
    }
    assert_eq!(stored(d, id).await.1, epoch_before, "no epoch minted");
    // The same for a handoff of that copy to a v1 shard.
    let carried = HandoffPayload {
        dumped_under_epoch: live.owner_epoch,
        snapshot: live.clone(),
    };
    let refused = loader(d, redis, v1())
        .claim_for_handoff(carried, "handoff-1", 0)
        .await;
    assert!(
        matches!(
            refused,
            Err(LoadError::Store {
                source: StoreError::SchemaNewer { .. },
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(stored(d, id).await.1, epoch_before, "no epoch minted");
    let back = loader(d, redis, v2()).claim_and_load(id, 0).await.unwrap();
    assert_eq!(
        back.snapshot.state["coins"], 50,
        "the v2 copy's checkpoint still wins: {}",
        back.snapshot.state
    );
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn retry_jobs_apply_only_under_a_model_that_reads_the_row(pool: PgPool) {
    let drivers = shardkeep_testkit::JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        retry_jobs_by_model_on(&d).await;
    }
}

async fn retry_jobs_by_model_on(d: &JobDriver) {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let id = {
        let new = new_character("Aria");
        d.characters().create(&new).await.unwrap();
        new.character_id
    };
    let envelope = |key: &str| IdempotencyEnvelope {
        idempotency_key: key.into(),
        owner_epoch: shardkeep::retry::OFFLINE_EPOCH,
        origin: Origin::CombatRewards,
        issued_at: chrono::Utc::now(),
        issue_seq: 0,
    };
    let grant = PersistenceRetryJob::new(
        PersistenceRetryPayload::effect(
            id,
            &LedgerEffect::CombatRewards {
                experience: 3,
                currency: 0,
                items: vec![],
            },
        )
        .unwrap(),
        envelope("grant"),
        "test",
        None,
    )
    .unwrap();
    // A v2 worker upgrades the v1 row as it applies the grant.
    let (queue, signals) = d.queue(8, Arc::clone(&clock));
    let mut worker = d.worker_for(
        v2(),
        signals,
        RetryWorkerConfig::new("v2"),
        Arc::clone(&clock),
    );
    queue.enqueue(&grant).await.unwrap();
    worker.run_until_idle().await.unwrap();
    let (schema, _, state) = stored(d, id).await;
    assert_eq!(
        (schema, &state["coins"], &state["experience"]),
        (2, &json!(1), &json!(3)),
        "{}",
        d.name()
    );
    // A v1 worker must not rewrite the v2 row: the job fails and waits for a newer worker.
    let again = PersistenceRetryJob::new(
        PersistenceRetryPayload::effect(
            id,
            &LedgerEffect::CombatRewards {
                experience: 4,
                currency: 0,
                items: vec![],
            },
        )
        .unwrap(),
        envelope("grant-2"),
        "test",
        None,
    )
    .unwrap();
    let (old_queue, old_signals) = d.queue(8, Arc::clone(&clock));
    let mut old_worker = d.worker_for(v1(), old_signals, RetryWorkerConfig::new("v1"), clock);
    old_queue.enqueue(&again).await.unwrap();
    old_worker.run_until_idle().await.unwrap();
    let (schema, _, state) = stored(d, id).await;
    assert_eq!(
        (schema, &state["experience"]),
        (2, &json!(3)),
        "not applied by v1"
    );
    let (error, attempts): (String, i32) = d
        .fetch_one(
            "SELECT last_error, attempt_count FROM persistence_retry_jobs
              WHERE idempotency_key = 'grant-2'",
            None,
        )
        .await;
    assert!(error.contains("newer release"), "{error}");
    assert_eq!(
        attempts, 0,
        "a rolling deploy does not use up the job's attempts"
    );
    assert_eq!(
        RetryStats::get(&old_worker.stats().deferred),
        1,
        "counted as deferred"
    );
    // A v1 whole-state job over the v2 row is upgraded by a v2 worker, never stored as v1.
    let dump = PersistenceRetryJob::new(
        PersistenceRetryPayload::gameplay_state_at(id, json!({ "gold": 9 }), 1, None, None),
        IdempotencyEnvelope {
            origin: Origin::GameplayState,
            owner_epoch: 0,
            ..envelope("dump")
        },
        "test",
        None,
    )
    .unwrap();
    queue.enqueue(&dump).await.unwrap();
    worker.run_until_idle().await.unwrap();
    let (schema, _, state) = stored(d, id).await;
    assert_eq!((schema, &state["coins"]), (2, &json!(9)), "{state}");
}
