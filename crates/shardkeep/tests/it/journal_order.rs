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

/// The copy flushed a newer state after its stream closed (it reconnected and moved on): the
/// cleanup's location is older than what the row holds and is left alone.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_cleanup_older_than_the_rows_last_live_write_leaves_the_location(pool: PgPool) {
    let env = Env::new(&pool).await;
    let player = env.character().await;
    let mut item = cleanup(&player, "s-1", SessionLifecycleEffectPlan::Reconnectable);
    item.player.state_version = Some(0);
    // A live flush of the same copy lands after the close, at a newer place.
    let mut row = env.store.load(player.character_id).await.unwrap().unwrap();
    row.owner_epoch = player.owner_epoch;
    row.zone_ref = Some("zone-5".into());
    row.room_ref = Some("r0".into());
    env.store.save(&row).await.unwrap();
    assert_eq!(
        env.worker().process(&item, Uuid::now_v7()).await.unwrap(),
        shardkeep::journal::Processed::Applied
    );
    assert_eq!(
        location(&env.store, player.character_id).await,
        (Some("zone-5".into()), Some("r0".into()))
    );
}

/// A newer cleanup takes the character's order mark between an older one's check and its
/// presence write: the write is refused in the same script that would have made it.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_presence_refresh_checks_the_order_in_the_write_itself(pool: PgPool) {
    use shardkeep::coord::{CleanupOrder, OrderCheck, PresenceRecord};
    let env = Env::new(&pool).await;
    let character = Uuid::now_v7().to_string();
    let older = CleanupOrder {
        owner_epoch: 3,
        closed_at: Utc::now() - ChronoDuration::seconds(5),
        entry_id: Uuid::now_v7(),
    };
    let newer = CleanupOrder {
        closed_at: Utc::now(),
        entry_id: Uuid::now_v7(),
        ..older
    };
    assert_eq!(
        env.coord
            .cleanup_order_claim(&character, &older)
            .await
            .unwrap(),
        OrderCheck::Current
    );
    assert_eq!(
        env.coord
            .cleanup_order_claim(&character, &newer)
            .await
            .unwrap(),
        OrderCheck::Current
    );
    let record = PresenceRecord {
        account_id: "acc".into(),
        character_id: character.clone(),
        session_token: "s-old".into(),
        shard_id: "shard-1".into(),
        zone_id: None,
        expires_at: Utc::now() + ChronoDuration::seconds(60),
    };
    assert_eq!(
        env.coord
            .presence_put_ordered(&record, &older)
            .await
            .unwrap(),
        OrderCheck::Stale
    );
    assert!(
        env.coord
            .presence_by_character(&character)
            .await
            .unwrap()
            .is_none()
    );
    // A retry of the newest is still current; a newer copy (higher epoch) always is.
    assert_eq!(
        env.coord
            .cleanup_order_claim(&character, &newer)
            .await
            .unwrap(),
        OrderCheck::Current
    );
    let later_copy = CleanupOrder {
        owner_epoch: 4,
        closed_at: Utc::now() - ChronoDuration::seconds(60),
        entry_id: Uuid::now_v7(),
    };
    assert_eq!(
        env.coord
            .presence_put_ordered(&record, &later_copy)
            .await
            .unwrap(),
        OrderCheck::Current
    );
    assert!(
        env.coord
            .presence_by_character(&character)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        env.coord.cleanup_order_claim("", &older).await.is_err(),
        "an empty character id is a typed error"
    );
}
