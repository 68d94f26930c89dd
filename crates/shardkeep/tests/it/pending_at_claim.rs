//! A copy that dies with acknowledged writes still queued as retry jobs (their first attempt
//! failed and waits out its backoff, or no worker got to them yet) loses none of them when the
//! next copy claims the character: the claim settles its predecessor's pending jobs first, under
//! the same lock, and the loader replays them on a newer checkpoint that does not hold them.

use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use shardkeep::character::{CharacterLoader, CharacterSnapshot};
use shardkeep::retry::{IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload};
use shardkeep_testkit::model::{LedgerEffect, LedgerModel};
use shardkeep_testkit::{JobDriver, JobDrivers, TestRedis};
use sqlx::PgPool;
use uuid::Uuid;

fn loader(d: &JobDriver, redis: &TestRedis) -> CharacterLoader {
    CharacterLoader::new(
        d.characters(),
        Some(d.checkpoints(redis)),
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
async fn queue_backing_off(d: &JobDriver, job: &PersistenceRetryJob) {
    let clock: std::sync::Arc<dyn shardkeep::clock::Clock> =
        std::sync::Arc::new(shardkeep::clock::SystemClock);
    let (queue, _signals) = d.queue(8, clock);
    queue.enqueue(job).await.unwrap();
    let an_hour_on = match d {
        JobDriver::Postgres(_) => "now() + interval '1 hour'",
        JobDriver::Embedded(_) => "now() + 3600000000",
    };
    let sql = format!(
        "UPDATE persistence_retry_jobs SET next_attempt_at = {an_hour_on}, attempt_count = 1
          WHERE retry_job_id = $1"
    );
    assert_eq!(d.execute(&sql, Some(job.retry_job_id())).await.unwrap(), 1);
}

async fn pending(d: &JobDriver, id: Uuid) -> i64 {
    let (n,): (i64,) = d
        .fetch_one(
            "SELECT count(*) FROM persistence_retry_jobs WHERE character_id = $1",
            Some(id),
        )
        .await;
    n
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
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let redis = TestRedis::new().await;
        let checkpoints = d.checkpoints(&redis);
        let loader = loader(&d, &redis);
        // Three characters whose first copy died with a 7-experience reward queued: one with no
        // checkpoint, one whose checkpoint (3 experience) was dumped before the reward, one
        // whose checkpoint (10) was dumped after it and holds it.
        let (plain, before, after) = (
            d.character("A").await,
            d.character("B").await,
            d.character("C").await,
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
            queue_backing_off(&d, &reward(id, first.owner_epoch, 1, 7)).await;
        }
        // The players log in again elsewhere.
        for (id, want) in [(plain, 7), (before, 10), (after, 10)] {
            let second = loader.claim_and_load(id, 0).await.unwrap().snapshot;
            assert_eq!(
                second.state["experience"],
                want,
                "{}: the dead copy's acknowledged reward, exactly once: {}",
                d.name(),
                second.state
            );
            assert_eq!(
                pending(&d, id).await,
                0,
                "{}: settled by the claim",
                d.name()
            );
            // The new copy's first save keeps it.
            d.characters().save(&second).await.unwrap();
            assert_eq!(d.experience(id).await, want, "{}", d.name());
        }
    }
}

/// How a database refuses some writes of job effects, installed by [`on_effect_recorded`].
enum Refusal {
    /// The job's own fault (a constraint): for rewards whose key ends in `:1`.
    KeysEndingInOne,
    /// A passing failure that is not the job's (Postgres: a serialization failure; SQLite: a
    /// statement that cannot run).
    Passing,
}

/// Makes the database refuse recording job effects as `refusal` says, with a trigger named
/// `test_hook` (removed by [`drop_hook`]).
async fn on_effect_recorded(d: &JobDriver, refusal: Refusal) {
    match d {
        JobDriver::Postgres(pool) => {
            let statements = match refusal {
                Refusal::KeysEndingInOne => {
                    "IF NEW.idempotency_key LIKE '%:1' THEN RAISE EXCEPTION 'refused for the test'; END IF;"
                }
                Refusal::Passing => "RAISE EXCEPTION 'try again' USING ERRCODE = '40001';",
            };
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
        JobDriver::Embedded(db) => {
            let trigger = match refusal {
                Refusal::KeysEndingInOne => {
                    "CREATE TRIGGER test_hook BEFORE INSERT ON character_job_effects
                     WHEN NEW.idempotency_key LIKE '%:1'
                     BEGIN SELECT RAISE(ABORT, 'refused for the test'); END"
                }
                // A trigger's statements are compiled with the statement that fires it: one
                // naming a table that does not exist makes the insert fail to run at all.
                Refusal::Passing => {
                    "CREATE TRIGGER test_hook BEFORE INSERT ON character_job_effects
                     BEGIN DELETE FROM no_such_table_for_the_test; END"
                }
            };
            sqlx::query(trigger).execute(db.pool()).await.unwrap();
        }
    }
}

async fn drop_hook(d: &JobDriver) {
    let sql = match d {
        JobDriver::Postgres(_) => "DROP TRIGGER test_hook ON character_job_effects",
        JobDriver::Embedded(_) => "DROP TRIGGER test_hook",
    };
    d.execute(sql, None).await.unwrap();
}

async fn dead_letters(d: &JobDriver, id: Uuid) -> Vec<String> {
    let sql = "SELECT idempotency_key FROM persistence_job_dead_letters WHERE character_id = $1
                ORDER BY idempotency_key";
    match d {
        JobDriver::Postgres(pool) => sqlx::query_scalar(sql).bind(id).fetch_all(pool).await,
        JobDriver::Embedded(db) => {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql.replace('$', "?")))
                .bind(id)
                .fetch_all(db.pool())
                .await
        }
    }
    .unwrap()
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_job_the_claim_cannot_settle_never_blocks_the_login(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let redis = TestRedis::new().await;
        let loader = loader(&d, &redis);
        let id = d.character("A").await;
        let epoch = loader
            .claim_and_load(id, 0)
            .await
            .unwrap()
            .snapshot
            .owner_epoch;
        // Three queued rewards: one the database refuses to record, one that crashed the
        // workers that took it (its lease ran out too often), and a good one.
        let refused = reward(id, epoch, 1, 100);
        let crashing = reward(id, epoch, 2, 1000);
        let good = reward(id, epoch, 3, 7);
        for job in [&refused, &crashing, &good] {
            queue_backing_off(&d, job).await;
        }
        d.execute(
            "UPDATE persistence_retry_jobs SET lease_expiries = 9 WHERE retry_job_id = $1",
            Some(crashing.retry_job_id()),
        )
        .await
        .unwrap();
        on_effect_recorded(&d, Refusal::KeysEndingInOne).await;
        let second = loader.claim_and_load(id, 0).await.unwrap().snapshot;
        assert_eq!(
            second.state["experience"],
            7,
            "{}: only the good one: {}",
            d.name(),
            second.state
        );
        assert_eq!(pending(&d, id).await, 0);
        let dead = dead_letters(&d, id).await;
        let mut want = vec![
            refused.envelope().idempotency_key.clone(),
            crashing.envelope().idempotency_key.clone(),
        ];
        want.sort();
        assert_eq!(
            dead,
            want,
            "{}: both are in the dead letters for an operator",
            d.name()
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_passing_database_failure_fails_the_claim_and_keeps_the_jobs(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    for d in drivers.drivers() {
        let redis = TestRedis::new().await;
        let loader = loader(&d, &redis);
        let id = d.character("A").await;
        let epoch = loader
            .claim_and_load(id, 0)
            .await
            .unwrap()
            .snapshot
            .owner_epoch;
        queue_backing_off(&d, &reward(id, epoch, 1, 7)).await;
        // A failure that is not the job's: no dead letter, no epoch.
        on_effect_recorded(&d, Refusal::Passing).await;
        assert!(
            loader.claim_and_load(id, 0).await.is_err(),
            "{}: the login fails",
            d.name()
        );
        assert_eq!(pending(&d, id).await, 1, "{}: the job is kept", d.name());
        assert!(dead_letters(&d, id).await.is_empty());
        let row = d.characters().load(id).await.unwrap().unwrap();
        assert_eq!(row.owner_epoch, epoch, "{}: no epoch minted", d.name());
        // Once the database recovers, the next login lands it.
        drop_hook(&d).await;
        let second = loader.claim_and_load(id, 0).await.unwrap().snapshot;
        assert_eq!(second.state["experience"], 7, "{}", d.name());
    }
}
