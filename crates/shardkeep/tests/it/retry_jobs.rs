use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use shardkeep::PostgresBackend;
use shardkeep::character::{CharacterStore, NewCharacter};
use shardkeep::clock::{Clock, ManualClock, SystemClock};
use shardkeep::retry::{
    DurableOnlyReason, EnqueueOutcome, IdempotencyEnvelope, JobOutcome, Origin,
    PersistenceRetryJob, PersistenceRetryPayload, RequeueOutcome, RetryQueue, RetryStats,
    RetryWorker, RetryWorkerConfig,
};
use shardkeep_testkit::{JobDriver, JobDrivers};
use sqlx::PgPool;
use uuid::Uuid;

pub(crate) fn pg(pool: &PgPool) -> PostgresBackend {
    shardkeep_testkit::pg(pool)
}

pub(crate) async fn character(pool: &PgPool, name: &str) -> Uuid {
    let id = Uuid::now_v7();
    CharacterStore::new(pg(pool))
        .create(&NewCharacter {
            character_id: id,
            account_id: Uuid::now_v7(),
            name: name.into(),
            zone_ref: Some("zone-0".into()),
            room_ref: Some("r0".into()),
            state: json!({ "experience": 0, "currency": 0 }).into(),
            chargen: None,
            schema_version: 1,
        })
        .await
        .unwrap();
    id
}

pub(crate) fn reward(
    character_id: Uuid,
    key: &str,
    epoch: i64,
    experience: i64,
) -> PersistenceRetryJob {
    PersistenceRetryJob::new(
        PersistenceRetryPayload::effect(
            character_id,
            &shardkeep_testkit::model::LedgerEffect::CombatRewards {
                experience,
                currency: 1,
                items: vec![],
            },
        )
        .unwrap(),
        // Epoch 0 stands for no copy: an offline grant. A copy's grant is numbered.
        IdempotencyEnvelope {
            idempotency_key: key.into(),
            owner_epoch: if epoch == 0 {
                shardkeep::retry::OFFLINE_EPOCH
            } else {
                epoch
            },
            origin: Origin::CombatRewards,
            issued_at: Utc::now(),
            issue_seq: u64::from(epoch != 0),
        },
        "combat",
        Some("session-1".into()),
    )
    .unwrap()
}

pub(crate) fn config(owner: &str) -> RetryWorkerConfig {
    let mut config = RetryWorkerConfig::new(owner);
    config.backoff = shardkeep::retry::Backoff::from_base_millis(1000);
    config
}

pub(crate) async fn experience(pool: &PgPool, id: Uuid) -> i64 {
    let state: serde_json::Value = sqlx::query_scalar("SELECT state FROM characters WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap();
    state["experience"].as_i64().unwrap()
}

/// Each test body, once per driver.
macro_rules! on_each_driver {
    ($pool:expr, |$d:ident| $body:block) => {{
        let drivers = JobDrivers::new(&$pool).await;
        for $d in drivers.drivers() {
            $body
        }
    }};
}

fn system_clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn two_workers_apply_thousands_of_jobs_exactly_once(pool: PgPool) {
    on_each_driver!(pool, |d| {
        let clock = system_clock();
        let (queue, signals) = d.queue(16, Arc::clone(&clock));
        let (_, other_signals) = d.queue(16, Arc::clone(&clock));
        let characters = [
            d.character("A").await,
            d.character("B").await,
            d.character("C").await,
        ];
        let total = 3000;
        for i in 0..total {
            let job = reward(characters[i % 3], &format!("grant-{i}"), 0, 1);
            queue.enqueue(&job).await.unwrap();
        }
        let mut a = d.worker(signals, config("worker-a"), Arc::clone(&clock));
        let mut b = d.worker(other_signals, config("worker-b"), clock);
        let (stats_a, stats_b) = (a.stats(), b.stats());
        let (ra, rb) = tokio::join!(a.run_until_idle(), b.run_until_idle());
        ra.unwrap();
        rb.unwrap();
        let applied = RetryStats::get(&stats_a.applied) + RetryStats::get(&stats_b.applied);
        assert_eq!(
            applied,
            total as u64,
            "{}: every job applied once",
            d.name()
        );
        assert_eq!(
            RetryStats::get(&stats_a.already_applied) + RetryStats::get(&stats_b.already_applied),
            0
        );
        assert!(
            RetryStats::get(&stats_a.applied) > 0 && RetryStats::get(&stats_b.applied) > 0,
            "{}: both worked",
            d.name()
        );
        let mut sum = 0;
        for id in characters {
            sum += d.experience(id).await;
        }
        assert_eq!(sum, total as i64, "{}", d.name());
        assert_eq!(d.count("persistence_retry_jobs").await, 0);
        assert_eq!(d.count("character_job_effects").await, total as i64);
    });
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_dead_workers_job_is_reclaimed_after_its_lease_and_the_late_worker_is_stale(
    pool: PgPool,
) {
    on_each_driver!(pool, |d| {
        let clock = system_clock();
        let (queue, signals) = d.queue(16, Arc::clone(&clock));
        let (_, spare) = d.queue(16, Arc::clone(&clock));
        let id = d.character("A").await;
        queue.enqueue(&reward(id, "grant-1", 0, 10)).await.unwrap();
        let mut dying = d.worker(signals, config("dying"), Arc::clone(&clock));
        let mut rescuer = d.worker(spare, config("rescuer"), clock);
        let batch = dying.claim(None).await.unwrap();
        assert_eq!(batch.len(), 1);
        // While the lease holds, nobody else can claim the job.
        assert_eq!(rescuer.poll_once().await.unwrap(), 0, "{}", d.name());
        d.expire_leases().await;
        assert_eq!(rescuer.poll_once().await.unwrap(), 1, "{}", d.name());
        assert_eq!(dying.settle_batch(&batch).await, vec![JobOutcome::Stale]);
        assert_eq!(
            d.experience(id).await,
            10,
            "{}: applied once, by the rescuer",
            d.name()
        );
        assert_eq!(d.count("persistence_retry_jobs").await, 0);
        assert_eq!(d.count("persistence_job_dead_letters").await, 0);
    });
}

/// A worker whose lease ran out and was taken over writes nothing, even while the job is still
/// there (held under the new lease): the fence is the lease token, not the job's existence.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_lease_taken_over_fences_the_first_holder_by_its_token(pool: PgPool) {
    on_each_driver!(pool, |d| {
        let clock = system_clock();
        let (queue, signals) = d.queue(16, Arc::clone(&clock));
        let (_, spare) = d.queue(16, Arc::clone(&clock));
        let id = d.character("A").await;
        queue.enqueue(&reward(id, "grant-1", 0, 10)).await.unwrap();
        let mut first = d.worker(signals, config("first"), Arc::clone(&clock));
        let mut second = d.worker(spare, config("second"), clock);
        let held = first.claim(None).await.unwrap();
        assert_eq!(second.claim(None).await.unwrap().len(), 0, "{}", d.name());
        d.expire_leases().await;
        let taken = second.claim(None).await.unwrap();
        assert_eq!(
            taken.len(),
            1,
            "{}: the lapsed lease is taken over",
            d.name()
        );
        assert_eq!(
            first.settle_batch(&held).await,
            vec![JobOutcome::Stale],
            "{}",
            d.name()
        );
        assert_eq!(d.experience(id).await, 0, "{}: nothing written", d.name());
        assert_eq!(second.settle_batch(&taken).await, vec![JobOutcome::Applied]);
        assert_eq!(d.experience(id).await, 10, "{}", d.name());
        assert_eq!(d.count("persistence_retry_jobs").await, 0);
    });
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_full_or_closed_signal_channel_leaves_the_job_to_polling(pool: PgPool) {
    on_each_driver!(pool, |d| {
        let clock = system_clock();
        let (queue, signals) = d.queue(1, Arc::clone(&clock));
        let id = d.character("A").await;
        assert_eq!(
            queue.enqueue(&reward(id, "k1", 0, 1)).await.unwrap(),
            EnqueueOutcome::Signaled
        );
        assert_eq!(
            queue.enqueue(&reward(id, "k2", 0, 1)).await.unwrap(),
            EnqueueOutcome::DurableOnly(DurableOnlyReason::QueueFull)
        );
        let mut worker = d.worker(signals, config("w"), Arc::clone(&clock));
        assert_eq!(
            worker.poll_once().await.unwrap(),
            2,
            "{}: polling finds the unsignaled job too",
            d.name()
        );
        drop(worker);
        assert_eq!(
            queue.enqueue(&reward(id, "k3", 0, 1)).await.unwrap(),
            EnqueueOutcome::DurableOnly(DurableOnlyReason::QueueClosed)
        );
        let (_, fresh) = d.queue(1, Arc::clone(&clock));
        let mut restarted = d.worker(fresh, config("w2"), clock);
        assert_eq!(restarted.poll_once().await.unwrap(), 1);
        assert_eq!(d.experience(id).await, 3, "{}", d.name());
    });
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_insert_failure_goes_back_to_the_caller(pool: PgPool) {
    on_each_driver!(pool, |d| {
        let (queue, _signals) = d.queue(4, system_clock());
        d.execute("DROP TABLE persistence_retry_jobs", None)
            .await
            .unwrap();
        let err = queue
            .enqueue(&reward(Uuid::now_v7(), "k", 0, 1))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("database error"), "{err}");
    });
}

/// The next attempt, attempt count and last error of the one queued job.
async fn the_jobs_schedule(d: &JobDriver) -> (chrono::DateTime<Utc>, i32, String) {
    const SQL: &str =
        "SELECT next_attempt_at, attempt_count, last_error FROM persistence_retry_jobs";
    match d {
        JobDriver::Postgres(_) => d.fetch_one(SQL, None).await,
        JobDriver::Embedded(_) => {
            let (micros, attempts, error): (i64, i32, String) = d.fetch_one(SQL, None).await;
            let next = chrono::DateTime::from_timestamp_micros(micros).unwrap();
            (next, attempts, error)
        }
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn failures_back_off_then_dead_letter_with_every_field(pool: PgPool) {
    on_each_driver!(pool, |d| {
        let start = Utc::now();
        let manual = ManualClock::starting_at(start);
        let clock: Arc<dyn Clock> = Arc::new(manual.clone());
        let (queue, signals) = d.queue(16, Arc::clone(&clock));
        let missing = Uuid::now_v7();
        let job = reward(missing, "grant-x", 4, 5).with_realm("realm-eu");
        queue.enqueue(&job).await.unwrap();
        let mut worker = d.worker(signals, config("w"), clock);
        let mut schedule = Vec::new();
        for attempt in 1..=8u32 {
            let claimed = worker.run_until_idle().await.unwrap();
            assert_eq!(
                claimed,
                1,
                "{}: attempt {attempt} claims the job once",
                d.name()
            );
            if attempt < 8 {
                let (next, attempts, error) = the_jobs_schedule(&d).await;
                assert_eq!(attempts, attempt as i32);
                assert!(error.contains("character not found"));
                let delay = (next - manual.now()).num_milliseconds();
                schedule.push(delay);
                // Not due until the backoff passes.
                assert_eq!(worker.poll_once().await.unwrap(), 0);
                manual.advance(chrono::Duration::milliseconds(delay + 1));
            }
        }
        // Equal jitter: each delay lies in [ceiling / 2, ceiling] with the ceiling doubling
        // from 1 s.
        for (i, delay) in schedule.iter().enumerate() {
            let ceiling = 1000i64 << i;
            assert!(
                (ceiling / 2..=ceiling).contains(delay),
                "{}: attempt {}: {delay} ms",
                d.name(),
                i + 1
            );
        }
        assert_eq!(d.count("persistence_retry_jobs").await, 0);
        let inspection = queue.dead_letters_inspect(50).await.unwrap();
        assert_eq!(
            (
                inspection.pending_retry_jobs,
                inspection.active_dead_letters
            ),
            (0, 1)
        );
        let letter = &inspection.dead_letters[0];
        assert_eq!(letter.retry_job_id, job.retry_job_id());
        assert_eq!(letter.job_kind, "combat_rewards");
        assert_eq!(letter.character_id, missing);
        assert_eq!(letter.character_name, None);
        assert_eq!(letter.realm_id.as_deref(), Some("realm-eu"));
        assert_eq!(letter.zone_id, None);
        assert_eq!(letter.failed_attempts, 8);
        assert!(letter.error.contains("character not found"));
        assert_eq!(letter.failed_at, manual.now().trunc_subsecs_micros());
        assert_eq!(letter.session_token.as_deref(), Some("session-1"));
        assert_eq!(letter.source, "combat");
        assert_eq!(letter.session_impact, "session_degraded");
        let detail = queue
            .dead_letter_detail(letter.dead_letter_id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&detail.summary, letter, "{}", d.name());
        assert_eq!(detail.payload["experience"], 5, "{}", d.name());
        assert!(!detail.transfer_already_recorded);
    });
}

trait TruncMicros {
    fn trunc_subsecs_micros(self) -> Self;
}

impl TruncMicros for chrono::DateTime<Utc> {
    fn trunc_subsecs_micros(self) -> Self {
        use chrono::SubsecRound;
        self.trunc_subsecs(6)
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn requeue_restores_one_fresh_job_even_when_raced(pool: PgPool) {
    on_each_driver!(pool, |d| {
        let clock = system_clock();
        let (queue, signals) = d.queue(16, Arc::clone(&clock));
        let mut config = config("w");
        config.retry_limit = 1;
        let mut worker = d.worker(signals, config, clock);
        let missing = Uuid::now_v7();
        queue.enqueue(&reward(missing, "g", 0, 1)).await.unwrap();
        worker.run_until_idle().await.unwrap();
        let letter = queue
            .dead_letters_inspect(10)
            .await
            .unwrap()
            .dead_letters
            .remove(0);
        let (a, b) = tokio::join!(
            queue.dead_letters_requeue(letter.dead_letter_id),
            queue.dead_letters_requeue(letter.dead_letter_id)
        );
        let outcomes = [a.unwrap(), b.unwrap()];
        let requeued: Vec<Uuid> = outcomes
            .iter()
            .filter_map(|o| match o {
                RequeueOutcome::Requeued { retry_job_id } => Some(*retry_job_id),
                _ => None,
            })
            .collect();
        assert_eq!(requeued.len(), 1, "{}: {outcomes:?}", d.name());
        let (fresh_id, attempts): (Uuid, i32) = d
            .fetch_one(
                "SELECT retry_job_id, attempt_count FROM persistence_retry_jobs",
                None,
            )
            .await;
        assert_eq!((fresh_id, attempts), (requeued[0], 0));
        assert_ne!(fresh_id, letter.retry_job_id);
        let (requeued_at, requeued_job): (bool, Option<Uuid>) = d
            .fetch_one(
                "SELECT requeued_at IS NOT NULL, requeued_retry_job_id
                   FROM persistence_job_dead_letters WHERE dead_letter_id = $1",
                Some(letter.dead_letter_id),
            )
            .await;
        assert!(requeued_at);
        assert_eq!(requeued_job, Some(fresh_id));
        let inspection = queue.dead_letters_inspect(10).await.unwrap();
        assert_eq!(
            (
                inspection.pending_retry_jobs,
                inspection.active_dead_letters
            ),
            (1, 0),
            "{}",
            d.name()
        );
        assert_eq!(
            queue.dead_letters_requeue(Uuid::now_v7()).await.unwrap(),
            RequeueOutcome::NotRequeued,
            "an unknown id"
        );
    });
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_requeue_that_a_newer_owner_would_supersede_is_refused_with_its_reason(pool: PgPool) {
    on_each_driver!(pool, |d| {
        let clock = system_clock();
        let (queue, signals) = d.queue(16, Arc::clone(&clock));
        let mut config = config("w");
        config.retry_limit = 1;
        let mut worker = d.worker(signals, config, clock);
        let id = d.character("Aria").await;
        // A reward of the copy at epoch 1 that fails (the row is not a ledger document).
        d.characters().claim(id, 0).await.unwrap();
        d.set_state(id, serde_json::json!({ "experience": "lots" }))
            .await;
        queue.enqueue(&reward(id, "r", 1, 5)).await.unwrap();
        worker.run_until_idle().await.unwrap();
        let letter = queue
            .dead_letters_inspect(10)
            .await
            .unwrap()
            .dead_letters
            .remove(0);
        // The player logged in again since: the job's copy is superseded.
        d.characters().claim(id, 0).await.unwrap();
        assert_eq!(
            queue
                .dead_letters_requeue(letter.dead_letter_id)
                .await
                .unwrap(),
            RequeueOutcome::Superseded {
                job_epoch: 1,
                owner_epoch: 2
            },
            "{}",
            d.name()
        );
        let inspection = queue.dead_letters_inspect(10).await.unwrap();
        assert_eq!(
            (
                inspection.pending_retry_jobs,
                inspection.active_dead_letters
            ),
            (0, 1),
            "{}: nothing queued, the dead letter stays",
            d.name()
        );
    });
}

/// Stores a reward job for `character` with `payload` as its raw payload, behind the queue's
/// back (a job written by a broken producer or a damaged file).
async fn insert_raw_job(d: &JobDriver, character: Uuid, key: &str, payload: &str) {
    match d {
        JobDriver::Postgres(pool) => sqlx::query(
            "INSERT INTO persistence_retry_jobs (retry_job_id, job_kind, character_id, payload,
                 next_attempt_at, session_impact, source, idempotency_key, owner_epoch, origin,
                 issued_at)
             VALUES ($1, 'combat_rewards', $2, $3::jsonb, now(), 'none', 'test', $4, 0,
                 'combat_rewards', now())",
        )
        .bind(Uuid::now_v7())
        .bind(character)
        .bind(payload)
        .bind(key)
        .execute(pool)
        .await
        .map(drop),
        JobDriver::Embedded(db) => sqlx::query(
            "INSERT INTO persistence_retry_jobs (retry_job_id, job_kind, character_id, payload,
                 next_attempt_at, session_impact, source, idempotency_key, owner_epoch, origin,
                 issued_at, created_at, updated_at)
             VALUES (?1, 'combat_rewards', ?2, ?3, ?5, 'none', 'test', ?4, 0, 'combat_rewards',
                 ?5, ?5, ?5)",
        )
        .bind(Uuid::now_v7())
        .bind(character)
        .bind(payload)
        .bind(key)
        .bind(Utc::now().timestamp_micros())
        .execute(db.pool())
        .await
        .map(drop),
    }
    .unwrap();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_poison_payload_is_dead_lettered_at_once_and_cannot_be_requeued(pool: PgPool) {
    on_each_driver!(pool, |d| {
        let clock = system_clock();
        let (queue, signals) = d.queue(16, Arc::clone(&clock));
        let good = d.character("A").await;
        queue.enqueue(&reward(good, "ok", 0, 7)).await.unwrap();
        // A payload of the wrong shape, and (on the embedded store, whose payloads are text) one
        // that is not JSON at all.
        let mut poisons = vec![r#"{"kind": "combat_rewards", "experience": "lots"}"#];
        if matches!(d, JobDriver::Embedded(_)) {
            poisons.push(r#"{"kind": "combat_rew"#);
        }
        for (n, poison) in poisons.iter().enumerate() {
            insert_raw_job(&d, good, &format!("poison-{n}"), poison).await;
        }
        if let JobDriver::Embedded(db) = &d {
            // The file's columns are loosely typed: a sound job whose epoch a foreign writer
            // made text is dead-lettered too, and does not stall the claim.
            let payload = serde_json::to_string(reward(good, "typed", 0, 5).payload()).unwrap();
            insert_raw_job(&d, good, "poison-typed", &payload).await;
            sqlx::query(
                "UPDATE persistence_retry_jobs SET owner_epoch = 'not a number'
                  WHERE idempotency_key = 'poison-typed'",
            )
            .execute(db.pool())
            .await
            .unwrap();
            poisons.push("typed");
        }
        let mut worker = d.worker(signals, config("w"), clock);
        worker.poll_once().await.unwrap();
        assert_eq!(
            d.experience(good).await,
            7,
            "{}: the good job in the same batch applied",
            d.name()
        );
        let inspection = queue.dead_letters_inspect(10).await.unwrap();
        assert_eq!(
            (
                inspection.pending_retry_jobs,
                inspection.active_dead_letters
            ),
            (0, poisons.len() as i64),
            "{}",
            d.name()
        );
        // Every poison refuses a requeue, except the row whose payload was sound: an operator
        // may requeue that one once they have looked.
        let sound = i64::from(matches!(d, JobDriver::Embedded(_)));
        let mut requeued = 0;
        for letter in &inspection.dead_letters {
            assert_eq!(letter.failed_attempts, 1);
            assert!(letter.error.contains("does not decode"), "{}", letter.error);
            match queue.dead_letters_requeue(letter.dead_letter_id).await {
                Ok(_) => requeued += 1,
                Err(err) => assert!(err.to_string().contains("does not decode"), "{err}"),
            }
        }
        assert_eq!(requeued, sound, "{}", d.name());
        assert_eq!(
            queue
                .dead_letters_inspect(10)
                .await
                .unwrap()
                .active_dead_letters,
            poisons.len() as i64 - sound,
            "{}: still dead",
            d.name()
        );
    });
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_job_from_a_superseded_owner_is_never_applied(pool: PgPool) {
    on_each_driver!(pool, |d| {
        let clock = system_clock();
        let (queue, signals) = d.queue(16, Arc::clone(&clock));
        let id = d.character("A").await;
        let store = d.characters();
        let old_epoch = store.claim(id, 0).await.unwrap().new_epoch;
        store.claim(id, 0).await.unwrap();
        queue
            .enqueue(&reward(id, "from-zombie", old_epoch, 1000))
            .await
            .unwrap();
        let mut worker = d.worker(signals, config("w"), clock);
        let stats = worker.stats();
        worker.run_until_idle().await.unwrap();
        assert_eq!(RetryStats::get(&stats.superseded), 1, "{}", d.name());
        assert_eq!(d.experience(id).await, 0);
        assert_eq!(d.count("persistence_retry_jobs").await, 0);
        assert_eq!(
            d.count("character_job_effects").await,
            0,
            "{}: no grant recorded",
            d.name()
        );
    });
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_reward_executed_twice_grants_once(pool: PgPool) {
    on_each_driver!(pool, |d| {
        let clock = system_clock();
        let (queue, signals) = d.queue(16, Arc::clone(&clock));
        let id = d.character("A").await;
        let mut worker = d.worker(signals, config("w"), clock);
        let stats = worker.stats();
        // The same grant enqueued twice (a retried enqueue), in one batch and in a later one.
        queue.enqueue(&reward(id, "kill-42", 0, 50)).await.unwrap();
        queue.enqueue(&reward(id, "kill-42", 0, 50)).await.unwrap();
        worker.run_until_idle().await.unwrap();
        queue.enqueue(&reward(id, "kill-42", 0, 50)).await.unwrap();
        worker.run_until_idle().await.unwrap();
        assert_eq!(d.experience(id).await, 50, "{}", d.name());
        assert_eq!(RetryStats::get(&stats.applied), 1);
        assert_eq!(RetryStats::get(&stats.already_applied), 2);
    });
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_running_worker_picks_up_signals_and_polls(pool: PgPool) {
    on_each_driver!(pool, |d| {
        let clock = system_clock();
        let (queue, signals) = d.queue(16, Arc::clone(&clock));
        let id = d.character("A").await;
        let mut cfg = config("w");
        cfg.poll_interval = Duration::from_millis(200);
        let worker = d.worker(signals, cfg, clock);
        let cancel = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(worker.run(cancel.clone()));
        queue.enqueue(&reward(id, "live", 0, 3)).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while d.experience(id).await != 3 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}: the worker never applied the job",
                d.name()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        cancel.cancel();
        task.await.unwrap();
    });
}

/// An enqueue retried after its reply was lost (the insert had landed) stores the job once.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn enqueueing_the_same_job_again_stores_it_once(pool: PgPool) {
    on_each_driver!(pool, |d| {
        let id = d.character("Aria").await;
        let (queue, _signals) = d.queue(8, system_clock());
        let job = reward(id, "k-once", 0, 5);
        queue.enqueue(&job).await.unwrap();
        queue.enqueue(&job).await.unwrap();
        assert_eq!(d.count("persistence_retry_jobs").await, 1, "{}", d.name());
    });
}

/// A whole-state job whose first copy already ran (its enqueue was retried after a lost reply
/// and landed again) is not applied twice: it would undo what landed since.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_state_job_stored_again_after_it_ran_is_not_applied_twice(pool: PgPool) {
    on_each_driver!(pool, |d| {
        let id = d.character("Aria").await;
        let clock = system_clock();
        let (queue, signals) = d.queue(8, Arc::clone(&clock));
        let state_job = PersistenceRetryJob::new(
            PersistenceRetryPayload::gameplay_state(
                id,
                json!({ "experience": 10, "currency": 0 }),
                None,
                None,
            ),
            IdempotencyEnvelope {
                idempotency_key: "final:once".into(),
                owner_epoch: 0,
                origin: Origin::GameplayState,
                issued_at: Utc::now(),
                issue_seq: 0,
            },
            "saver-final",
            None,
        )
        .unwrap();
        let mut worker = d.worker(signals, config("w"), Arc::clone(&clock));
        queue.enqueue(&state_job).await.unwrap();
        assert_eq!(worker.run_until_idle().await.unwrap(), 1);
        // A reward lands after it; then the state job's second copy arrives.
        queue.enqueue(&reward(id, "r-1", 0, 5)).await.unwrap();
        assert_eq!(worker.run_until_idle().await.unwrap(), 1);
        assert_eq!(d.experience(id).await, 15, "{}", d.name());
        queue.enqueue(&state_job).await.unwrap();
        let stats = worker.stats();
        let before = RetryStats::get(&stats.already_applied);
        assert_eq!(worker.run_until_idle().await.unwrap(), 1);
        assert_eq!(RetryStats::get(&stats.already_applied), before + 1);
        assert_eq!(
            d.experience(id).await,
            15,
            "{}: the reward survived",
            d.name()
        );
    });
}

/// A reward whose apply fails (the stored state cannot take it) must not leave its key behind:
/// the next attempt, once the row is readable, grants it.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_reward_whose_apply_failed_is_granted_on_the_next_attempt(pool: PgPool) {
    on_each_driver!(pool, |d| {
        let id = d.character("Aria").await;
        d.set_state(id, json!({ "experience": "lots" })).await;
        let clock = Arc::new(ManualClock::starting_at(Utc::now()));
        let (queue, signals) = d.queue(8, clock.clone());
        let mut worker = d.worker(signals, config("w"), clock.clone());
        let stats = worker.stats();
        queue
            .enqueue(&reward(id, "r-fails-once", 0, 5))
            .await
            .unwrap();
        worker.run_until_idle().await.unwrap();
        assert_eq!(
            RetryStats::get(&stats.retried),
            1,
            "{}: the apply failed",
            d.name()
        );
        // The row is repaired; the job's next attempt comes due.
        d.set_state(id, json!({ "experience": 0, "currency": 0 }))
            .await;
        clock.advance(chrono::Duration::seconds(3600));
        worker.run_until_idle().await.unwrap();
        assert_eq!(
            RetryStats::get(&stats.already_applied),
            0,
            "{}: the failed attempt's reward key made the retry look applied",
            d.name()
        );
        assert_eq!(
            d.experience(id).await,
            5,
            "{}: the reward was lost",
            d.name()
        );
    });
}

/// A reward dead-lettered because its apply kept failing is granted when an operator requeues
/// it after the fix (its key was not left behind).
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_requeued_reward_dead_letter_is_granted(pool: PgPool) {
    on_each_driver!(pool, |d| {
        let id = d.character("Aria").await;
        d.set_state(id, json!({ "experience": "lots" })).await;
        let clock = system_clock();
        let (queue, signals) = d.queue(8, Arc::clone(&clock));
        let mut once = config("w");
        once.retry_limit = 1;
        let mut worker = d.worker(signals, once, clock);
        let stats = worker.stats();
        queue.enqueue(&reward(id, "r-dead", 0, 7)).await.unwrap();
        worker.run_until_idle().await.unwrap();
        assert_eq!(RetryStats::get(&stats.dead_lettered), 1, "{}", d.name());
        d.set_state(id, json!({ "experience": 0, "currency": 0 }))
            .await;
        let dead = queue.dead_letters_inspect(10).await.unwrap();
        assert_eq!(dead.dead_letters[0].character_name.as_deref(), Some("Aria"));
        let by_name = queue
            .dead_letters_page(
                0,
                10,
                Some(&shardkeep::operator::CharacterFilter::Name("ARIA".into())),
            )
            .await
            .unwrap();
        assert_eq!(by_name.dead_letters.len(), 1, "{}: found by name", d.name());
        let letter = dead.dead_letters[0].dead_letter_id;
        assert!(matches!(
            queue.dead_letters_requeue(letter).await.unwrap(),
            RequeueOutcome::Requeued { .. }
        ));
        worker.run_until_idle().await.unwrap();
        assert_eq!(RetryStats::get(&stats.already_applied), 0);
        assert_eq!(d.experience(id).await, 7, "{}", d.name());
    });
}

/// Retention by age and by count removes dead letters on each driver.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn dead_letter_retention_keeps_the_newest_by_count(pool: PgPool) {
    on_each_driver!(pool, |d| {
        let clock = system_clock();
        let (queue, signals) = d.queue(8, Arc::clone(&clock));
        let mut once = config("w");
        once.retry_limit = 1;
        let mut worker = d.worker(signals, once, clock);
        for n in 0..3 {
            queue
                .enqueue(&reward(Uuid::now_v7(), &format!("gone-{n}"), 0, 1))
                .await
                .unwrap();
        }
        worker.run_until_idle().await.unwrap();
        assert_eq!(queue.depths().await.unwrap(), (0, 3), "{}", d.name());
        let retention = shardkeep::queue::DeadLetterRetention {
            max_age: Duration::from_secs(3600),
            max_count: 1,
        };
        assert_eq!(queue.dead_letters_prune(retention).await.unwrap(), 2);
        let none_older_than = shardkeep::queue::DeadLetterRetention {
            max_age: Duration::ZERO,
            max_count: 10,
        };
        assert_eq!(queue.dead_letters_prune(none_older_than).await.unwrap(), 1);
        assert_eq!(queue.depths().await.unwrap(), (0, 0), "{}", d.name());
    });
}

/// A logout save that became a state job carries the row version its dump was made at: an
/// offline grant that lands on the row while the job waits — in an earlier settle or earlier in
/// the same batch — is played on the dump, not written over.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_state_job_keeps_an_offline_grant_that_landed_after_its_dump(pool: PgPool) {
    on_each_driver!(pool, |d| {
        let clock = system_clock();
        let (queue, signals) = d.queue(16, Arc::clone(&clock));
        let mut worker = d.worker(signals, config("w"), clock);
        for (together, name) in [(false, "Aria"), (true, "Bran")] {
            let id = d.character(name).await;
            let epoch = d.characters().claim(id, 0).await.unwrap().new_epoch;
            let mut live = d.characters().load(id).await.unwrap().unwrap();
            live.owner_epoch = epoch;
            live.state = json!({ "experience": 10, "currency": 0 }).into();
            live.issue_mark = 2;
            let shardkeep::character::SaveOutcome::Saved(version) =
                d.characters().save(&live).await.unwrap()
            else {
                panic!("the live save did not land");
            };
            // The copy plays on; its logout dump cannot land and is stored as a job.
            let dump = PersistenceRetryJob::new(
                PersistenceRetryPayload::gameplay_state(
                    id,
                    json!({ "experience": 25, "currency": 0 }),
                    None,
                    None,
                ),
                IdempotencyEnvelope {
                    idempotency_key: format!("final:{id}"),
                    owner_epoch: epoch,
                    origin: Origin::GameplayState,
                    issued_at: Utc::now(),
                    issue_seq: 3,
                },
                "saver-final",
                None,
            )
            .unwrap()
            .dumped_at(version);
            assert_eq!(dump.dumped_at_version(), Some(version));
            // A gift for the character (7 experience) lands before the dump is applied.
            queue.enqueue(&reward(id, "gift", 0, 7)).await.unwrap();
            if !together {
                worker.run_until_idle().await.unwrap();
                assert_eq!(d.experience(id).await, 17, "{}", d.name());
            }
            queue.enqueue(&dump).await.unwrap();
            worker.run_until_idle().await.unwrap();
            assert_eq!(
                d.experience(id).await,
                32,
                "{} (same batch: {together}): the dump's 25 and the gift's 7",
                d.name()
            );
        }
    });
}

/// The saver's answers for a player who has left: nothing is present.
struct Departed;

impl shardkeep::saver::SaveFeedback for Departed {
    fn deliver(&self, _: shardkeep::saver::SaverEvent) {}

    fn is_present(&self, _: Uuid) -> bool {
        false
    }
}

/// A saver writing rows to `rows`, whose finals that cannot land become jobs in `queue`.
fn saver_over(rows: CharacterStore, queue: &RetryQueue) -> shardkeep::saver::Saver {
    let config = shardkeep::saver::SaverConfig {
        io_timeout: Duration::from_millis(500),
        ..Default::default()
    };
    shardkeep::saver::Saver::spawn(
        shardkeep::saver::SaverSinks {
            rows: Some(rows),
            checkpoints: None,
            retry: Some(queue.clone()),
        },
        Arc::new(Departed),
        config,
        tokio_util::sync::CancellationToken::new(),
    )
}

/// A live copy of a new character `name` whose row holds 10 experience (its own save), at the
/// row version its next dumps are made at.
async fn copy_at_ten(d: &JobDriver, name: &str) -> shardkeep::character::CharacterSnapshot {
    let id = d.character(name).await;
    let epoch = d.characters().claim(id, 0).await.unwrap().new_epoch;
    let mut live = d.characters().load(id).await.unwrap().unwrap();
    live.owner_epoch = epoch;
    live.state = json!({ "experience": 10, "currency": 0 }).into();
    live.issue_mark = 2;
    let shardkeep::character::SaveOutcome::Saved(version) =
        d.characters().save(&live).await.unwrap()
    else {
        panic!("the live save did not land");
    };
    live.state_version = version;
    live
}

/// [`copy_at_ten`], then a gift (7 experience) lands on the row under it.
async fn copy_with_a_gift_under_it(
    d: &JobDriver,
    name: &str,
    queue: &RetryQueue,
    worker: &mut RetryWorker,
) -> shardkeep::character::CharacterSnapshot {
    let mut live = copy_at_ten(d, name).await;
    let id = live.character_id;
    queue
        .enqueue(&reward(id, &format!("gift:{name}"), 0, 7))
        .await
        .unwrap();
    worker.run_until_idle().await.unwrap();
    assert_eq!(d.experience(id).await, 17, "{}", d.name());
    // The player logs out with 25, dumped before the gift landed.
    live.state = json!({ "experience": 25, "currency": 0 }).into();
    live.issue_mark = 3;
    live
}

/// A departed player's logout save whose row moved under it (an offline grant landed after its
/// dump) is not rebased over the row: it goes down as a state job, which plays the grant on the
/// dump. The rebase wrote 25 over the gift's 17.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_departed_players_logout_save_keeps_the_grant_that_moved_its_row(pool: PgPool) {
    on_each_driver!(pool, |d| {
        let clock = system_clock();
        let (queue, signals) = d.queue(16, Arc::clone(&clock));
        let mut worker = d.worker(signals, config("w"), clock);
        let live = copy_with_a_gift_under_it(&d, "Cass", &queue, &mut worker).await;
        let saver = saver_over(d.characters(), &queue);
        saver.enqueue(shardkeep::saver::SaveReason::Final, live.clone());
        let _ = saver.barrier(Duration::from_secs(10)).await;
        worker.run_until_idle().await.unwrap();
        assert_eq!(
            d.experience(live.character_id).await,
            32,
            "{}: the logout's 25 and the gift's 7",
            d.name()
        );
    });
}

/// A logout save retried through a Postgres outage finds the row moved when Postgres is back
/// (a gift landed meanwhile through another connection): it goes down as a state job that keeps
/// the gift, not as a rebase over it.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_logout_save_retried_through_an_outage_keeps_the_grant_that_landed_meanwhile(
    pool: PgPool,
) {
    let d = JobDriver::Postgres(pool.clone());
    let clock = system_clock();
    let (queue, signals) = d.queue(16, Arc::clone(&clock));
    let mut worker = d.worker(signals, config("w"), clock);
    let proxy = shardkeep_testkit::faults::FaultProxy::start(shardkeep_testkit::pg_addr())
        .await
        .unwrap();
    let (options, pooler) = shardkeep_testkit::proxied_options(&pool, &proxy);
    let proxied = PostgresBackend::pool_options(2)
        .acquire_timeout(Duration::from_millis(500))
        .connect_with(options)
        .await
        .unwrap();
    let saver = saver_over(
        CharacterStore::new(PostgresBackend::from_pool_through(proxied, pooler)),
        &queue,
    );
    let mut live = copy_at_ten(&d, "Dora").await;
    let id = live.character_id;
    live.state = json!({ "experience": 25, "currency": 0 }).into();
    live.issue_mark = 3;
    // Postgres is out for the saver: the logout save retries in the background.
    proxy.set_mode(shardkeep_testkit::faults::ProxyMode::Cut);
    saver.enqueue(shardkeep::saver::SaveReason::Final, live.clone());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // A gift lands meanwhile, then Postgres comes back.
    queue.enqueue(&reward(id, "gift", 0, 7)).await.unwrap();
    worker.run_until_idle().await.unwrap();
    assert_eq!(d.experience(id).await, 17);
    proxy.set_mode(shardkeep_testkit::faults::ProxyMode::Pass);
    let _ = saver.barrier(Duration::from_secs(20)).await;
    worker.run_until_idle().await.unwrap();
    assert_eq!(
        d.experience(id).await,
        32,
        "the logout's 25 and the gift's 7"
    );
}
