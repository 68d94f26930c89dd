//! Chains of crashes: a copy claims a character and dies before writing anything, and the next
//! copy must still load what the dead copy loaded (its crash window is its own, not a rollback of
//! the copy before it). Each body runs on both drivers: Postgres rows with Redis checkpoints, and
//! the embedded store's file.

use std::time::Duration;

use serde_json::json;
use shardkeep::character::{
    CharacterLoader, CharacterSnapshot, CharacterStore, CheckpointStore, CheckpointWrite,
    HandoffPayload, LoadSource,
};
use shardkeep_testkit::model::LedgerModel;
use shardkeep_testkit::{CharacterDrivers, TestRedis};
use sqlx::PgPool;

use super::ladder_store::created;

fn loader(store: &CharacterStore, checkpoints: &CheckpointStore) -> CharacterLoader {
    CharacterLoader::new(
        store.clone(),
        Some(checkpoints.clone()),
        LedgerModel::handle(),
        Duration::from_secs(5),
    )
}

/// The copy's content with `coins` in its document.
fn holding(copy: &CharacterSnapshot, coins: i64) -> CharacterSnapshot {
    CharacterSnapshot {
        state: json!({ "currency": coins }).into(),
        ..copy.clone()
    }
}

fn coins(snapshot: &CharacterSnapshot) -> i64 {
    snapshot.state["currency"].as_i64().unwrap_or(-1)
}

/// A character `name` whose copy flushed 15 coins to the row and then checkpointed 65, and that
/// copy's snapshot at the row's version (its crash leaves the 65 only in the checkpoint).
async fn checkpointed_past_its_row(
    store: &CharacterStore,
    loader: &CharacterLoader,
    checkpoints: &CheckpointStore,
    name: &str,
) -> CharacterSnapshot {
    let row = created(store, name).await;
    let copy = loader
        .claim_and_load(row.character_id, 0)
        .await
        .unwrap()
        .snapshot;
    let shardkeep::character::SaveOutcome::Saved(version) =
        store.save(&holding(&copy, 15)).await.unwrap()
    else {
        panic!("{}: the flush did not land", store.driver());
    };
    let copy = CharacterSnapshot {
        state_version: version,
        ..copy
    };
    checkpoints.write(&holding(&copy, 65)).await.unwrap();
    copy
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_replacement_that_dies_before_writing_does_not_roll_the_character_back(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for store in drivers.stores() {
        let driver = store.driver();
        let checkpoints = drivers.checkpoints_for(&store, &redis);
        let loader = loader(&store, &checkpoints);
        let row = created(&store, "Aria").await;
        let id = row.character_id;

        // Copy A flushes 15 coins, then checkpoints 65, and dies.
        let a = loader.claim_and_load(id, 0).await.unwrap().snapshot;
        let flushed = store.save(&holding(&a, 15)).await.unwrap();
        let version = match flushed {
            shardkeep::character::SaveOutcome::Saved(v) => v,
            other => panic!("{driver}: {other:?}"),
        };
        let a = CharacterSnapshot {
            state_version: version,
            ..a
        };
        let written = checkpoints.write(&holding(&a, 65)).await.unwrap();
        assert_eq!(written, CheckpointWrite::Written, "{driver}");

        // Copy B loads the checkpoint and dies before writing anything.
        let b = loader.claim_and_load(id, 0).await.unwrap();
        assert_eq!(b.source, LoadSource::Checkpoint, "{driver}");
        assert_eq!(coins(&b.snapshot), 65, "{driver}: B loads A's checkpoint");

        // Copy C must not load less than B did.
        let c = loader.claim_and_load(id, 0).await.unwrap();
        assert_eq!(
            coins(&c.snapshot),
            65,
            "{driver}: C loads what B loaded, not the older row ({:?})",
            c.source
        );
        assert!(c.snapshot.owner_epoch > b.snapshot.owner_epoch, "{driver}");
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_zombie_checkpoint_after_the_replacements_load_is_never_adopted(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for store in drivers.stores() {
        let driver = store.driver();
        let checkpoints = drivers.checkpoints_for(&store, &redis);
        let loader = loader(&store, &checkpoints);
        let row = created(&store, "Bryn").await;
        let id = row.character_id;

        // Copy A checkpoints 65 over a row of its first load.
        let a = loader.claim_and_load(id, 0).await.unwrap().snapshot;
        let written = checkpoints.write(&holding(&a, 65)).await.unwrap();
        assert_eq!(written, CheckpointWrite::Written, "{driver}");

        // Copy B takes over and loads 65; A plays on as a zombie and checkpoints 999: refused.
        let b = loader.claim_and_load(id, 0).await.unwrap();
        assert_eq!(coins(&b.snapshot), 65, "{driver}");
        let zombie = checkpoints.write(&holding(&a, 999)).await.unwrap();
        assert_eq!(
            zombie,
            CheckpointWrite::NotOwner {
                stored_epoch: b.snapshot.owner_epoch
            },
            "{driver}: the zombie's checkpoint after B's load is refused"
        );

        // B dies before writing; C loads B's content, never the zombie's nor the older row.
        let c = loader.claim_and_load(id, 0).await.unwrap();
        assert_eq!(coins(&c.snapshot), 65, "{driver}: {:?}", c.source);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_handoff_destination_that_dies_before_writing_keeps_what_it_adopted(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for store in drivers.stores() {
        let driver = store.driver();
        let checkpoints = drivers.checkpoints_for(&store, &redis);
        let loader = loader(&store, &checkpoints);
        let row = created(&store, "Cato").await;
        let id = row.character_id;

        // The source checkpoints 40, then hands the character off holding 80.
        let source = loader.claim_and_load(id, 0).await.unwrap().snapshot;
        let written = checkpoints.write(&holding(&source, 40)).await.unwrap();
        assert_eq!(written, CheckpointWrite::Written, "{driver}");
        let carried = HandoffPayload::new(holding(&source, 80));
        let arrived = loader
            .claim_for_handoff(carried, "h-cato", 0)
            .await
            .unwrap();
        assert!(!arrived.is_superseded(), "{driver}");
        assert_eq!(coins(&arrived.into_loaded().snapshot), 80, "{driver}");

        // The destination dies before its first write: the next login loads 80.
        let next = loader.claim_and_load(id, 0).await.unwrap();
        assert_eq!(coins(&next.snapshot), 80, "{driver}: {:?}", next.source);
    }
}

/// A copy dumps a flush (mark 1), then a checkpoint (mark 2) at the same known version; the
/// checkpoint is written first and the flush lands after it, at a higher version, just before
/// the copy dies. The next copy loads the checkpoint's newer content, not the later-landing
/// older flush (the simulator's crash floors caught this one: seed 6 lost a checkpointed grant).
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_checkpoint_dumped_after_a_flush_that_lands_later_is_still_loaded(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for store in drivers.stores() {
        let driver = store.driver();
        let checkpoints = drivers.checkpoints_for(&store, &redis);
        let loader = loader(&store, &checkpoints);
        let row = created(&store, "Cato").await;
        let id = row.character_id;

        let a = loader.claim_and_load(id, 0).await.unwrap().snapshot;
        let flush = CharacterSnapshot {
            issue_mark: 1,
            ..holding(&a, 15)
        };
        let checkpoint = CharacterSnapshot {
            issue_mark: 2,
            ..holding(&a, 65)
        };
        let written = checkpoints.write(&checkpoint).await.unwrap();
        assert_eq!(written, CheckpointWrite::Written, "{driver}");
        let landed = store.save(&flush).await.unwrap();
        assert!(
            matches!(landed, shardkeep::character::SaveOutcome::Saved(_)),
            "{driver}: {landed:?}"
        );

        let b = loader.claim_and_load(id, 0).await.unwrap();
        assert_eq!(
            (coins(&b.snapshot), b.source),
            (65, LoadSource::Checkpoint),
            "{driver}: the checkpoint was dumped after the flush"
        );
    }
}

/// A login whose caller stops waiting at any point — before, during or after its claim — still
/// leaves the checkpoint taken over once its claim landed: the next login loads the
/// checkpointed 65, never the row's 15.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_login_whose_caller_gives_up_still_takes_the_checkpoint_over(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for store in drivers.stores() {
        let driver = store.driver();
        let checkpoints = drivers.checkpoints_for(&store, &redis);
        let loader = CharacterLoader::new(
            store.clone(),
            Some(checkpoints.clone()),
            LedgerModel::handle(),
            Duration::from_secs(2),
        );
        let id = checkpointed_past_its_row(&store, &loader, &checkpoints, "Cass")
            .await
            .character_id;
        // Callers that give up sooner and later, each after a different share of the login.
        let mut gave_up = 0;
        for micros in [0_u64, 200, 500, 1_000, 2_000, 4_000, 8_000, 16_000] {
            let login = loader.claim_and_load(id, 0);
            if tokio::time::timeout(Duration::from_micros(micros), login)
                .await
                .is_err()
            {
                gave_up += 1;
            }
            // A dropped login finishes its claim and take-over in its own task meanwhile.
            tokio::time::sleep(Duration::from_millis(800)).await;
            let next = loader.claim_and_load(id, 0).await.unwrap();
            assert_eq!(
                coins(&next.snapshot),
                65,
                "{driver}: a caller gave up after {micros} µs ({:?})",
                next.source
            );
        }
        assert!(gave_up > 0, "{driver}: no caller gave up");
    }
}

/// A handoff's claim that commits after its destination stopped waiting for it (a lock held the
/// table) never leaves the checkpoint fenced unread. Within the arrival's last-resort bound the
/// arrival runs to its end and keeps the carried content (80); past it, the claim's debt takes
/// the checkpoint over and the next login loads the source's checkpointed 65. Never the row's
/// 15.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_handoff_claim_that_lands_after_its_caller_gave_up_keeps_the_carried_content(
    pool: PgPool,
) {
    assert_eq!(
        late_handoff_claim(&pool, Duration::from_millis(3000)).await,
        80
    );
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_handoff_claim_that_lands_after_its_bound_still_takes_the_checkpoint_over(pool: PgPool) {
    // Past the arrival's last resort (8 bounds of 600 ms).
    assert_eq!(
        late_handoff_claim(&pool, Duration::from_millis(6000)).await,
        65
    );
}

/// A handoff arrives while a table lock holds its claim for `hold`; the coins the next login
/// loads.
async fn late_handoff_claim(pool: &PgPool, hold: Duration) -> i64 {
    let drivers = CharacterDrivers::new(pool).await;
    let redis = TestRedis::new().await;
    // Postgres only: the embedded store's claims are made alone, in the caller's task.
    let store = drivers.stores().remove(0);
    assert_eq!(store.driver(), "postgres");
    let checkpoints = drivers.checkpoints_for(&store, &redis);
    let loader = CharacterLoader::new(
        store.clone(),
        Some(checkpoints.clone()),
        LedgerModel::handle(),
        Duration::from_millis(600),
    );
    let source = checkpointed_past_its_row(&store, &loader, &checkpoints, "Cade").await;
    let id = source.character_id;
    // The destination's claim waits behind a table lock past its bound, then commits.
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE characters IN EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let held = tokio::time::Instant::now();
    let carried = HandoffPayload::new(holding(&source, 80));
    let arrival = loader.claim_for_handoff(carried, "h-cade", 0).await;
    assert!(
        matches!(arrival, Err(shardkeep::character::LoadError::Timeout(_))),
        "{arrival:?}"
    );
    tokio::time::sleep_until(held + hold).await;
    lock.commit().await.unwrap();
    // The late claim did commit (else the checkpoint would still be its source's own, and the
    // next login would load it with no debt paid), and the guard reaches its epoch.
    let claimed_epoch = source.owner_epoch + 1;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let row = store.load(id).await.unwrap().expect("the row");
        let guard = checkpoints.read_held(id).await.unwrap().map(|c| c.held_by);
        if row.owner_epoch == claimed_epoch && guard == Some(claimed_epoch) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "row epoch {}, checkpoint guard {guard:?}: the late claim's take-over never came",
            row.owner_epoch
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let next = loader.claim_and_load(id, 0).await.unwrap();
    coins(&next.snapshot)
}

/// A login whose claim goes the careful way (its row was locked when the batch came) and whose
/// commit takes longer than the claim's bound (a deferred trigger sleeps 1 s at commit; the
/// bound is 300 ms) never leaves the claim committed without its take-over: the claim runs to
/// its end in its task and the checkpoint is taken over, so the next login loads the
/// checkpointed 65, never the row's 15. (Postgres does not bound a commit: one slower than the
/// claim's last resort, eight bounds, is the window left.)
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_careful_claim_whose_commit_outlasts_its_bound_never_fences_the_checkpoint_unread(
    pool: PgPool,
) {
    let drivers = CharacterDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    // Postgres only: a row lock and a commit-time trigger hold the claim.
    let store = drivers.stores().remove(0);
    assert_eq!(store.driver(), "postgres");
    let checkpoints = drivers.checkpoints_for(&store, &redis);
    let loader = CharacterLoader::new(
        store.clone(),
        Some(checkpoints.clone()),
        LedgerModel::handle(),
        Duration::from_millis(300),
    );
    let id = checkpointed_past_its_row(&store, &loader, &checkpoints, "Dane")
        .await
        .character_id;
    sqlx::query(
        "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
         $$ BEGIN PERFORM pg_sleep(1); RETURN NULL; END $$",
    )
    .execute(&pool)
    .await
    .unwrap();
    // The id is a Uuid this test made: the statement is the test's own.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE CONSTRAINT TRIGGER slow_commit AFTER UPDATE ON characters
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.id = '{id}')
         EXECUTE FUNCTION slow_commit()"
    )))
    .execute(&pool)
    .await
    .unwrap();
    // The row is locked when the login's batch comes: the claim goes the careful way and waits.
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM characters WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *lock)
        .await
        .unwrap();
    let login = {
        let loader = loader.clone();
        tokio::spawn(async move { loader.claim_and_load(id, 0).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    lock.rollback().await.unwrap();
    let first = login.await.unwrap();
    // Whatever the caller heard, the claim has ended one way or the other within a few bounds.
    tokio::time::sleep(Duration::from_secs(3)).await;
    sqlx::query("DROP TRIGGER slow_commit ON characters")
        .execute(&pool)
        .await
        .unwrap();
    let claimed = store.load(id).await.unwrap().expect("the row").owner_epoch;
    let guard = checkpoints.read_held(id).await.unwrap().map(|c| c.held_by);
    let next = loader.claim_and_load(id, 0).await.unwrap();
    assert_eq!(
        coins(&next.snapshot),
        65,
        "the first login answered {:?}; row epoch {claimed}, checkpoint guard {guard:?}",
        first.map(|l| l.source)
    );
}
