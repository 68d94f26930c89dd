//! `Runtime::launch`, the one call from a game's configuration to a running shard.

use std::time::Duration;

use serde_json::Map;
use shardkeep::live::{
    Launch, LaunchError, LiveConfig, LiveError, LiveGame, Runtime, SessionStart, Stored,
};
use shardkeep::model::Anchor;
use shardkeep_testkit::model::LedgerModel;
use sqlx::PgPool;
use uuid::Uuid;

fn game() -> Stored<LedgerModel> {
    Stored::new(LedgerModel, Map::new)
}

/// A shard never starts on a schema with migrations pending (a runtime on an older schema would
/// misread what it loads): a new file, and a file one release behind, are refused with what to
/// run; `migrate` set launches the shard.
#[tokio::test]
async fn an_embedded_file_with_migrations_pending_is_refused_until_migrated() {
    let dir = std::env::temp_dir().join(format!("shardkeep-test-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite:{}", dir.join("shardkeep.db").display());
    let mut launch = Launch::new(&url, None, "shard-a");
    let refused = Runtime::launch(launch.clone(), game()).await;
    assert!(
        matches!(
            refused,
            Err(LaunchError::MigrationsPending { store: "SQLite" })
        ),
        "{:?}",
        refused.err()
    );
    launch.migrate = true;
    let shard = Runtime::launch(launch.clone(), game()).await.unwrap();
    let id = shard
        .runtime
        .create("Tam", Uuid::now_v7(), Anchor::at("zone-0", "r1"))
        .await
        .unwrap();
    let copy = shard
        .runtime
        .login(id, SessionStart::default())
        .await
        .unwrap()
        .copy;
    shard.runtime.logout(copy).await.unwrap();
    let report = shard.shutdown(Duration::from_secs(10)).await;
    assert_eq!(report.unsaved_finals.total(), 0, "{report:?}");
    // The file as an older build left it: its newest migration not yet applied.
    let db = shardkeep::SqliteBackend::connect("DATABASE_URL", &url)
        .await
        .unwrap();
    sqlx::query(
        "DELETE FROM _sqlx_migrations WHERE version = (SELECT max(version) FROM _sqlx_migrations)",
    )
    .execute(db.pool())
    .await
    .unwrap();
    launch.migrate = false;
    let refused = Runtime::launch(launch, game()).await;
    let Err(err) = refused else {
        panic!("launched on a file one release behind");
    };
    assert!(
        err.to_string().contains("shardkeep migrate"),
        "the refusal says what to run: {err}"
    );
    drop(db);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same on Postgres: a database without shardkeep's migrations is refused before Redis is
/// even reached (the Redis URL here names no server).
#[sqlx::test(migrations = false)]
async fn a_postgres_database_with_migrations_pending_is_refused(pool: PgPool) {
    let name = pool
        .connect_options()
        .get_database()
        .expect("a test database")
        .to_owned();
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let url = match base.rsplit_once('/') {
        Some((server, _)) => format!("{server}/{name}"),
        None => panic!("DATABASE_URL names no database: {base}"),
    };
    let launch = Launch::new(&url, Some("redis://127.0.0.1:1"), "shard-a");
    let refused = Runtime::launch(launch, game()).await;
    assert!(
        matches!(
            refused,
            Err(LaunchError::MigrationsPending { store: "Postgres" })
        ),
        "{:?}",
        refused.err()
    );
}

/// A game that builds its services itself and starts the runtime over them gets the same
/// refusal at its first creation or login (the runtime would misread an older schema), and
/// plays once the file is migrated.
#[tokio::test]
async fn a_runtime_started_over_its_own_services_refuses_an_older_schema_until_migrated() {
    let dir = std::env::temp_dir().join(format!("shardkeep-test-{}", Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite:{}", dir.join("shardkeep.db").display());
    let db = shardkeep::SqliteBackend::connect("DATABASE_URL", &url)
        .await
        .unwrap();
    db.migrate().await.unwrap();
    // The file as an older build left it: its newest migration's record not there (kept aside,
    // to put back as `migrate` would).
    for statement in [
        "CREATE TABLE kept_aside AS SELECT * FROM _sqlx_migrations
          WHERE version = (SELECT max(version) FROM _sqlx_migrations)",
        "DELETE FROM _sqlx_migrations WHERE version = (SELECT version FROM kept_aside)",
    ] {
        sqlx::query(statement).execute(db.pool()).await.unwrap();
    }
    let keys = shardkeep::Keyspace::new("shardkeep").unwrap();
    let services = shardkeep::Services::embedded(
        db.clone(),
        &keys,
        game().model(),
        shardkeep::ServicesConfig::new("own-services", "game_server"),
        std::sync::Arc::new(shardkeep::clock::SystemClock),
    )
    .unwrap();
    let runtime = Runtime::start(&services, game(), LiveConfig::new("shard-a")).unwrap();
    let refused = runtime
        .create("Una", Uuid::now_v7(), Anchor::at("zone-0", "r1"))
        .await;
    let Err(LiveError::SchemaBehind(why)) = refused else {
        panic!("created on an older schema: {refused:?}");
    };
    assert!(why.contains("shardkeep migrate"), "{why}");
    let login = runtime.login(Uuid::now_v7(), SessionStart::default()).await;
    assert!(
        matches!(login, Err(LiveError::SchemaBehind(_))),
        "{:?}",
        login.err()
    );
    sqlx::query("INSERT INTO _sqlx_migrations SELECT * FROM kept_aside")
        .execute(db.pool())
        .await
        .unwrap();
    let id = runtime
        .create("Una", Uuid::now_v7(), Anchor::at("zone-0", "r1"))
        .await
        .unwrap();
    let copy = runtime
        .login(id, SessionStart::default())
        .await
        .unwrap()
        .copy;
    runtime.logout(copy).await.unwrap();
    let report = runtime.shutdown(Duration::from_secs(10)).await;
    assert_eq!(report.unsaved_finals.total(), 0, "{report:?}");
    db.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}
