use shardkeep::PostgresBackend;
use sqlx::PgPool;

#[sqlx::test(migrations = false)]
async fn migrate_applies_everything_once(pool: PgPool) {
    let pg = PostgresBackend::from_pool(pool.clone());
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
