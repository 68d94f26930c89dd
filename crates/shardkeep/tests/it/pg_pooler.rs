//! Postgres through PgBouncer in transaction pooling mode: sqlx's own settings break there (a
//! statement prepared on one server is bound on another, or clashes with another client's
//! statement of the same name); shardkeep's `PgPooler::Transaction` settings do not.

use serde_json::json;
use shardkeep::PostgresBackend;
use shardkeep::backend::postgres::PgPooler;
use shardkeep::character::{CharacterSnapshot, CharacterStore, SaveOutcome};
use shardkeep_testkit::fixtures::new_character;
use shardkeep_testkit::pgbouncer::{bouncer_options, release_pooler_connections};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

const WRITERS: usize = 16;
const ROUNDS: i64 = 12;

/// Every writer creates a character, claims it and saves it `ROUNDS` times through `pg`,
/// reading the row back after each save. Returns what went wrong.
async fn workload(pg: PostgresBackend, prefix: &'static str) -> Vec<String> {
    let store = CharacterStore::new(pg);
    let writers: Vec<_> = (0..WRITERS)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let new = new_character(&format!("{prefix}{i}"));
                store.create(&new).await.map_err(|e| e.to_string())?;
                let epoch = store
                    .claim(new.character_id, 0)
                    .await
                    .map_err(|e| e.to_string())?
                    .new_epoch;
                let mut snap = store
                    .load(new.character_id)
                    .await
                    .map_err(|e| e.to_string())?
                    .ok_or("the created row is missing")?;
                for round in 0..ROUNDS {
                    snap = CharacterSnapshot {
                        owner_epoch: epoch,
                        state: json!({ "gold": round }).into(),
                        ..snap
                    };
                    match store.save(&snap).await.map_err(|e| e.to_string())? {
                        SaveOutcome::Saved(version) => snap.state_version = version,
                        other => return Err(format!("save {round}: {other:?}")),
                    }
                    let stored = store
                        .load(new.character_id)
                        .await
                        .map_err(|e| e.to_string())?;
                    if stored.map(|row| row.state_version) != Some(snap.state_version) {
                        return Err(format!("save {round} did not land"));
                    }
                }
                Ok::<_, String>(())
            })
        })
        .collect();
    let mut errors = Vec::new();
    for writer in writers {
        if let Err(err) = writer.await.expect("writer panicked") {
            errors.push(err);
        }
    }
    errors
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn sqlx_defaults_break_through_pgbouncer_and_the_transaction_setting_does_not(pool: PgPool) {
    // sqlx's defaults (a statement cache, named statements, autocommit statements), only without
    // the startup parameter PgBouncer would refuse outright.
    let naive = PgPoolOptions::new()
        .max_connections(WRITERS as u32)
        .connect_with(bouncer_options(&pool, PgPooler::None).extra_float_digits(None))
        .await
        .unwrap();
    let errors = workload(PostgresBackend::from_pool(naive), "Naive").await;
    assert!(
        !errors.is_empty(),
        "the workload no longer shows what a transaction-mode pooler breaks (is PgBouncer in \
         transaction mode?)"
    );
    assert!(
        errors.iter().any(|e| e.contains("prepared statement")),
        "{errors:?}"
    );

    let pooled = PgPoolOptions::new()
        .max_connections(WRITERS as u32)
        .connect_with(bouncer_options(&pool, PgPooler::Transaction))
        .await
        .unwrap();
    let pg = PostgresBackend::from_pool_through(pooled, PgPooler::Transaction);
    assert_eq!(workload(pg.clone(), "Pooled").await, Vec::<String>::new());
    let saved: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM characters WHERE name LIKE 'Pooled%' AND state_version = $1",
    )
    .bind(ROUNDS)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(saved, WRITERS as i64, "every writer's last save is the row");
    release_pooler_connections(&pool).await;
}

#[sqlx::test(migrations = false)]
async fn migrations_run_through_pgbouncer_once_even_when_raced(pool: PgPool) {
    let backends: Vec<_> = {
        let mut out = Vec::new();
        for _ in 0..3 {
            let pooled = PgPoolOptions::new()
                .max_connections(2)
                .connect_with(bouncer_options(&pool, PgPooler::Transaction))
                .await
                .unwrap();
            out.push(PostgresBackend::from_pool_through(
                pooled,
                PgPooler::Transaction,
            ));
        }
        out
    };
    let runs: Vec<_> = backends
        .iter()
        .cloned()
        .map(|pg| tokio::spawn(async move { pg.migrate().await.map(|applied| applied.len()) }))
        .collect();
    let mut applied = Vec::new();
    for run in runs {
        applied.push(
            run.await
                .unwrap()
                .expect("a raced migration through PgBouncer failed"),
        );
    }
    let total = shardkeep::backend::postgres::MIGRATOR.iter().count();
    assert_eq!(applied.iter().sum::<usize>(), total, "{applied:?}");
    assert!(backends[0].migrations_current().await.unwrap());
    // The lock was transaction-scoped: nothing is left holding it on any server.
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks
          WHERE locktype = 'advisory'
            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(held, 0);
    release_pooler_connections(&pool).await;
}
