//! The embedded claim's statements stay on their indexes over a large backlog: SQLite's own
//! query plans for them, on a file holding many jobs (most not due, some due), never scan the
//! table, the poll reads the claimable index in its order (no sort of every due job before its
//! limit), and a signaled claim finds its jobs by id. The planner has no statistics, as in
//! production (nothing runs `ANALYZE`).

use super::{due_sql, pending_sql};
use crate::backend::SqliteBackend;

/// A migrated file in a fresh temporary directory (removed by the caller).
async fn file() -> (std::path::PathBuf, SqliteBackend) {
    let dir = std::env::temp_dir().join(format!("shardkeep-plans-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let url = format!("sqlite:{}", dir.join("plans.db").display());
    let db = SqliteBackend::connect("DATABASE_URL", &url)
        .await
        .expect("open the file");
    db.migrate().await.expect("migrate the file");
    (dir, db)
}

/// 20,000 jobs queued an hour from now and 2,000 due a minute ago.
async fn backlog(db: &SqliteBackend) {
    let now = chrono::Utc::now().timestamp_micros();
    for (jobs, at) in [(20_000, now + 3_600_000_000), (2_000, now - 60_000_000)] {
        sqlx::query(
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?2)
             INSERT INTO persistence_retry_jobs
                    (retry_job_id, job_kind, character_id, payload, session_impact, source,
                     idempotency_key, owner_epoch, origin, issued_at, next_attempt_at, created_at,
                     updated_at)
             SELECT randomblob(16), 'combat_rewards', randomblob(16), '{}', 'none', 'plans',
                    'k' || n, 0, 'combat_rewards', ?1, ?1, ?1, ?1
               FROM g",
        )
        .bind(at)
        .bind(jobs)
        .execute(db.pool())
        .await
        .expect("queue the backlog");
    }
}

/// The plan SQLite makes for `sql` with `binds` (integers) bound: one line per step.
async fn plan(db: &SqliteBackend, sql: &str, binds: &[i64]) -> Vec<String> {
    let explain = format!("EXPLAIN QUERY PLAN {sql}");
    let mut query = sqlx::query_as::<_, (i64, i64, i64, String)>(sqlx::AssertSqlSafe(explain));
    for bind in binds {
        query = query.bind(*bind);
    }
    query
        .fetch_all(db.pool())
        .await
        .expect("explain the statement")
        .into_iter()
        .map(|(_, _, _, detail)| detail)
        .collect()
}

/// Whether a plan reads `persistence_retry_jobs` through `index` only, with no sort of its
/// own (a `SCAN` of the table reads every row; a temporary B-tree sorts every row found before
/// the limit applies).
fn on_index(plan: &[String], index: &str) -> bool {
    let steps: Vec<&String> = plan
        .iter()
        .filter(|s| s.contains("persistence_retry_jobs"))
        .collect();
    !steps.is_empty()
        && steps
            .iter()
            .all(|s| s.starts_with("SEARCH") && s.contains(&format!("USING INDEX {index} ")))
        && !plan.iter().any(|s| s.contains("TEMP B-TREE"))
}

#[tokio::test]
async fn the_claims_read_the_queue_through_their_indexes() {
    let (dir, db) = file().await;
    backlog(&db).await;
    let now = chrono::Utc::now().timestamp_micros();
    let poll = plan(&db, &due_sql(None), &[now, 64]).await;
    assert!(
        on_index(&poll, "persistence_retry_jobs_claimable"),
        "the poll walks the claimable index in its order: {poll:?}"
    );
    let signaled = plan(&db, &due_sql(Some(3)), &[now, 64, 1, 2, 3]).await;
    assert!(
        signaled
            .iter()
            .any(|s| s.contains("USING INDEX persistence_retry_jobs_id ")),
        "a signaled claim finds its jobs by id: {signaled:?}"
    );
    assert!(
        !signaled.iter().any(|s| s.starts_with("SCAN")),
        "a signaled claim: {signaled:?}"
    );
    let at_login = plan(&db, &pending_sql(), &[1]).await;
    assert!(
        at_login
            .iter()
            .any(|s| s.starts_with("SEARCH") && s.contains("(character_id=?)")),
        "the login's claim reads one character's jobs: {at_login:?}"
    );
    assert!(
        !at_login.iter().any(|s| s.starts_with("SCAN")),
        "the login's claim: {at_login:?}"
    );
    db.close().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_plan_that_scans_or_sorts_is_not_on_the_index() {
    let index = "persistence_retry_jobs_claimable";
    let walk = format!("SEARCH persistence_retry_jobs USING INDEX {index} (<expr><?)");
    assert!(on_index(std::slice::from_ref(&walk), index));
    assert!(!on_index(
        &["SCAN persistence_retry_jobs".to_owned()],
        index
    ));
    assert!(!on_index(
        &[walk.clone(), "USE TEMP B-TREE FOR ORDER BY".to_owned()],
        index
    ));
    assert!(!on_index(
        &[walk.replace(index, "persistence_retry_jobs_id")],
        index
    ));
    assert!(!on_index(&[], index));
}
