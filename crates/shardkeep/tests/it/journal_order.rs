//! Journal effects are order-insensitive: a cleanup older than one already applied for the same
//! character changes nothing, whatever order retries and recoveries deliver them in.

use chrono::{Duration as ChronoDuration, Utc};
use shardkeep::journal::SessionLifecycleEffectPlan;
use sqlx::PgPool;
use uuid::Uuid;

use super::journal::{Env, cleanup, location};

/// Session 1 closed reconnectably (at the room it stood in then) and its cleanup failed; the
/// player came back as session 2, moved, and logged out for good. The retried cleanup of
/// session 1 runs after session 2's: it must neither rewrite the older location nor refresh
/// the presence of a session that is gone.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_older_reconnectable_cleanup_after_a_newer_removal_changes_nothing(pool: PgPool) {
    let env = Env::new(&pool).await;
    let player = env.character().await;
    let mut older = cleanup(&player, "s-1", SessionLifecycleEffectPlan::Reconnectable);
    older.closed_at = Utc::now() - ChronoDuration::seconds(30);
    older.player.room = "r1".into();
    let mut newer = cleanup(&player, "s-2", SessionLifecycleEffectPlan::PermanentRemoval);
    newer.player.room = "r2".into();
    let worker = env.worker();
    worker.process(&newer, Uuid::now_v7()).await.unwrap();
    assert_eq!(
        location(&env.store, player.character_id).await,
        (Some("zone-2".into()), Some("r2".into()))
    );
    worker.process(&older, Uuid::now_v7()).await.unwrap();
    assert_eq!(
        location(&env.store, player.character_id).await,
        (Some("zone-2".into()), Some("r2".into())),
        "a retried older cleanup rewrote the location"
    );
    assert!(
        env.coord
            .presence_by_character(&player.character_id.to_string())
            .await
            .unwrap()
            .is_none(),
        "a retried older cleanup refreshed the presence of a session that is gone"
    );
    assert!(
        env.coord.resume_load("s-1").await.unwrap().is_none(),
        "a retried older cleanup stored a resume ledger for a session that is gone"
    );
}
