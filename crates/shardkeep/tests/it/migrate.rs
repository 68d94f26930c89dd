use sqlx::PgPool;

#[sqlx::test(migrations = false)]
async fn migrate_applies_everything_once(pool: PgPool) {
    let pg = shardkeep_testkit::pg(&pool);
    assert!(!pg.migrations_current().await.unwrap());
    let applied = pg.migrate().await.unwrap();
    assert!(!applied.is_empty());
    assert_eq!(applied[0].version, 1);
    assert!(pg.migrations_current().await.unwrap());
    assert!(
        pg.migrate().await.unwrap().is_empty(),
        "a second run applies nothing"
    );
    let tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE tablename = 'characters'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(tables, 1);
}

/// Rows written before shardkeep's bookkeeping left the state document are carried forward by
/// migration 8: reward keys and reward grants become recorded keys (an old pending job with one
/// is refused), job effects become replayable records, items held at load go to the item-load
/// ledger, and the documents lose the three fields. Malformed old entries are skipped.
#[sqlx::test(migrations = false)]
async fn old_documents_carry_their_bookkeeping_forward(pool: PgPool) {
    use std::sync::Arc;

    use serde_json::json;
    use shardkeep::clock::{Clock, SystemClock};
    use shardkeep::retry::{
        IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload, RetryQueue,
        RetryStats, RetryWorker, RetryWorkerConfig,
    };
    use uuid::Uuid;

    shardkeep::backend::postgres::MIGRATOR
        .run_to(7, &pool)
        .await
        .unwrap();
    let id = Uuid::now_v7();
    let gem = Uuid::now_v7();
    let old_state = json!({
        "experience": 10,
        "reward_keys": ["k1", "k2", null],
        "job_effects": [
            { "key": "looks-1", "payload": { "kind": "character_appearance", "character_id": id,
                                             "appearance": { "hair": "red" } } },
            { "payload": { "kind": "character_appearance" } }
        ],
        "held_at_load": { gem.to_string(): 3, "not-a-uuid": 4, Uuid::now_v7().to_string(): "x" }
    });
    sqlx::query(
        "INSERT INTO characters (id, account_id, name, state, state_version, owner_epoch, live_version)
         VALUES ($1, $2, 'Aria', $3, 5, 3, 4), ($4, $2, 'Bran', '\"garbage\"', 0, 0, 0)",
    )
    .bind(id)
    .bind(Uuid::now_v7())
    .bind(&old_state)
    .bind(Uuid::now_v7())
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("INSERT INTO reward_grants (idempotency_key, character_id) VALUES ('k3', $1)")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    // A grant committed for a job whose apply failed (the old defect): that job is still pending,
    // so its key must not be carried over.
    let failed_job = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO reward_grants (idempotency_key, character_id, retry_job_id) VALUES ('k5', $1, $2)",
    )
    .bind(id)
    .bind(failed_job)
    .execute(&pool)
    .await
    .unwrap();
    let pending = |job: Uuid, key: &'static str| {
        sqlx::query(
            "INSERT INTO persistence_retry_jobs (retry_job_id, job_kind, character_id, payload,
                 next_attempt_at, session_impact, source, idempotency_key, owner_epoch, origin,
                 issued_at)
             VALUES ($2, 'combat_rewards', $1, '{}', now(), 'none', 'test', $3, 3,
                     'combat_rewards', now())",
        )
        .bind(id)
        .bind(job)
        .bind(key)
    };
    pending(failed_job, "k5").execute(&pool).await.unwrap();
    // Another failed one was dead-lettered, then requeued as a new job still pending: its grant
    // (recorded under the first job's id) is not carried over either.
    let (first, requeued) = (Uuid::now_v7(), Uuid::now_v7());
    sqlx::query(
        "INSERT INTO reward_grants (idempotency_key, character_id, retry_job_id) VALUES ('k6', $1, $2)",
    )
    .bind(id)
    .bind(first)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO persistence_job_dead_letters (dead_letter_id, retry_job_id, job_kind,
             character_id, payload, failed_attempts, last_error, failed_at, source, session_impact,
             idempotency_key, owner_epoch, origin, issued_at, requeued_at, requeued_retry_job_id)
         VALUES (gen_random_uuid(), $2, 'combat_rewards', $1, '{}', 8, 'boom', now(), 'test',
                 'none', 'k6', 3, 'combat_rewards', now(), now(), $3)",
    )
    .bind(id)
    .bind(first)
    .bind(requeued)
    .execute(&pool)
    .await
    .unwrap();
    pending(requeued, "k6").execute(&pool).await.unwrap();

    let pg = shardkeep_testkit::pg(&pool);
    pg.migrate().await.unwrap();

    let state: serde_json::Value = sqlx::query_scalar("SELECT state FROM characters WHERE id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(state, json!({ "experience": 10 }));
    let effects: Vec<(String, i64, i64, bool, i64)> = sqlx::query_as(
        "SELECT idempotency_key, owner_epoch, issue_seq, payload IS NOT NULL, row_version
           FROM character_job_effects WHERE character_id = $1 ORDER BY idempotency_key",
    )
    .bind(id)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        effects,
        vec![
            ("k1".into(), 3, 0, false, 5),
            ("k2".into(), 3, 0, false, 5),
            ("k3".into(), 3, 0, false, 5),
            ("looks-1".into(), 3, 0, true, 5),
        ]
    );
    let loads: Vec<(Uuid, Uuid, i64)> =
        sqlx::query_as("SELECT item_id, character_id, loaded_epoch FROM item_loads")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(loads, vec![(gem, id, 3)]);
    let garbage: serde_json::Value =
        sqlx::query_scalar("SELECT state FROM characters WHERE name = 'Bran'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(garbage, json!("garbage"), "left alone");

    // An old pending reward whose key the old document held is refused; a new one applies.
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (queue, signals) = RetryQueue::new(pg.clone(), 8, Arc::clone(&clock));
    let mut worker = RetryWorker::new(
        pg.clone(),
        shardkeep_testkit::model::LedgerModel::handle(),
        signals,
        RetryWorkerConfig::new("w"),
        clock,
    );
    let reward = |key: &str| {
        PersistenceRetryJob::new(
            PersistenceRetryPayload::effect(
                id,
                &shardkeep_testkit::model::LedgerEffect::CombatRewards {
                    experience: 5,
                    currency: 0,
                    items: vec![],
                },
            )
            .unwrap(),
            IdempotencyEnvelope {
                idempotency_key: key.into(),
                owner_epoch: shardkeep::retry::OFFLINE_EPOCH,
                origin: Origin::CombatRewards,
                issued_at: chrono::Utc::now(),
                issue_seq: 0,
            },
            "test",
            None,
        )
        .unwrap()
    };
    for key in ["k1", "k3", "k4"] {
        queue.enqueue(&reward(key)).await.unwrap();
    }
    worker.run_until_idle().await.unwrap();
    let stats = worker.stats();
    assert_eq!(
        (
            RetryStats::get(&stats.applied),
            RetryStats::get(&stats.already_applied)
        ),
        (1, 2)
    );
}
