//! A retry worker hung inside a settle holds its characters' rows — and so their logins and
//! saves — no longer than its bound: Postgres ends a statement that runs past it, and a
//! transaction left idle past it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shardkeep::character::CharacterStore;
use shardkeep::clock::SystemClock;
use shardkeep::retry::RetryWorkerConfig;
use shardkeep_testkit::JobDriver;
use sqlx::PgPool;

use super::retry_jobs::reward;

/// The settle's bound in these tests.
const BOUND: Duration = Duration::from_secs(1);

/// Makes every write of a character's state (a settle, a save) hang for a minute, as a worker
/// stuck mid-statement would; a claim, which writes no state, passes.
async fn hang_state_writes(pool: &PgPool) {
    sqlx::query(
        "CREATE FUNCTION it_hang() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.state IS DISTINCT FROM OLD.state THEN PERFORM pg_sleep(60); END IF;
           RETURN NEW;
         END $$",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "CREATE TRIGGER it_hang BEFORE UPDATE ON characters FOR EACH ROW EXECUTE FUNCTION it_hang()",
    )
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_worker_hung_in_a_settle_holds_the_row_no_longer_than_its_bound(pool: PgPool) {
    let d = JobDriver::Postgres(pool.clone());
    let id = d.character("Hung").await;
    let clock: Arc<dyn shardkeep::clock::Clock> = Arc::new(SystemClock);
    let (queue, signals) = d.queue(8, Arc::clone(&clock));
    queue.enqueue(&reward(id, "r-1", 0, 7)).await.unwrap();
    hang_state_writes(&pool).await;
    let mut config = RetryWorkerConfig::new("hung");
    config.settle_bound = BOUND;
    let mut worker = d.worker(signals, config, clock);
    let settling = tokio::spawn(async move { worker.run_until_idle().await });
    // The worker is inside its settle now, its update stuck holding the character's row.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let store = CharacterStore::new(shardkeep_testkit::pg(&pool));
    let claimed = tokio::time::timeout(Duration::from_secs(30), store.claim(id, 0))
        .await
        .expect("the login's claim waits out the hung settle")
        .unwrap();
    let waited = started.elapsed();
    assert!(
        waited < BOUND * 4,
        "the login waited {waited:?} for a settle bounded by {BOUND:?}"
    );
    assert!(claimed.new_epoch >= 1);
    let _ = settling.await;
    let in_tx: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
          WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(in_tx, 0, "nothing is left holding a transaction open");
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_bounded_transaction_left_idle_releases_its_rows_after_the_bound(pool: PgPool) {
    let d = JobDriver::Postgres(pool.clone());
    let id = d.character("Idle").await;
    let pg = shardkeep_testkit::pg(&pool);
    // A worker's transaction locks the row, then its process stalls (it sends nothing more).
    let mut stalled = pg.begin_bounded(BOUND).await.unwrap();
    sqlx::query("SELECT 1 FROM characters WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *stalled)
        .await
        .unwrap();
    let started = Instant::now();
    let store = CharacterStore::new(pg.clone());
    tokio::time::timeout(Duration::from_secs(30), store.claim(id, 0))
        .await
        .expect("the claim waits out the stalled transaction")
        .unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= BOUND / 2 && waited < BOUND * 4,
        "waited {waited:?} for a transaction bounded by {BOUND:?}"
    );
    // The stalled worker finds its transaction ended when it wakes.
    assert!(stalled.commit().await.is_err());
}
