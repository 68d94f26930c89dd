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
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        an_older_reconnectable_cleanup_after_a_newer_removal_changes_nothing_on(&env).await;
    }
}

async fn an_older_reconnectable_cleanup_after_a_newer_removal_changes_nothing_on(env: &Env) {
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
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        a_cleanup_older_than_the_rows_last_live_write_leaves_the_location_on(&env).await;
    }
}

async fn a_cleanup_older_than_the_rows_last_live_write_leaves_the_location_on(env: &Env) {
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
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        a_presence_refresh_checks_the_order_in_the_write_itself_on(&env).await;
    }
}

async fn a_presence_refresh_checks_the_order_in_the_write_itself_on(env: &Env) {
    use shardkeep::coord::{OrderCheck, PresenceRecord, SessionOrder};
    let character = Uuid::now_v7().to_string();
    let older = SessionOrder {
        owner_epoch: 3,
        at: Utc::now() - ChronoDuration::seconds(5),
        event_id: Uuid::now_v7(),
    };
    let newer = SessionOrder {
        at: Utc::now(),
        event_id: Uuid::now_v7(),
        ..older
    };
    assert_eq!(
        env.coord
            .session_order_claim(&character, &older)
            .await
            .unwrap(),
        OrderCheck::Current
    );
    assert_eq!(
        env.coord
            .session_order_claim(&character, &newer)
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
            .session_order_claim(&character, &newer)
            .await
            .unwrap(),
        OrderCheck::Current
    );
    let later_copy = SessionOrder {
        owner_epoch: 4,
        at: Utc::now() - ChronoDuration::seconds(60),
        event_id: Uuid::now_v7(),
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
        env.coord.session_order_claim("", &older).await.is_err(),
        "an empty character id is a typed error"
    );
}

/// The player reconnected as a new session of the same copy, whose start took the character's
/// session order: the cleanup of the earlier session, delivered late, leaves its presence alone.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_cleanup_of_a_session_closed_before_the_next_one_started_is_stale(pool: PgPool) {
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        a_cleanup_of_a_session_closed_before_the_next_one_started_is_stale_on(&env).await;
    }
}

async fn a_cleanup_of_a_session_closed_before_the_next_one_started_is_stale_on(env: &Env) {
    use shardkeep::coord::{OrderCheck, PresenceRecord, SessionOrder};
    let player = env.character().await;
    let mut older = cleanup(&player, "s-1", SessionLifecycleEffectPlan::Reconnectable);
    older.closed_at = Utc::now() - ChronoDuration::seconds(10);
    let started = PresenceRecord {
        account_id: player.account_id.to_string(),
        character_id: player.character_id.to_string(),
        session_token: "s-2".into(),
        shard_id: "shard-1".into(),
        zone_id: Some("zone-1".into()),
        expires_at: Utc::now() + ChronoDuration::seconds(60),
    };
    let start = SessionOrder {
        owner_epoch: player.owner_epoch,
        at: Utc::now(),
        event_id: Uuid::now_v7(),
    };
    assert_eq!(
        env.coord
            .presence_put_ordered(&started, &start)
            .await
            .unwrap(),
        OrderCheck::Current
    );
    assert_eq!(
        env.worker().process(&older, Uuid::now_v7()).await.unwrap(),
        shardkeep::journal::Processed::SkippedStale
    );
    let presence = env
        .coord
        .presence_by_character(&player.character_id.to_string())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(presence.session_token, "s-2");
    assert!(env.coord.resume_load("s-1").await.unwrap().is_none());
}

/// The character was claimed by a newer owner (a login elsewhere) after the stream closed: the
/// cleanup, recovered late, stores neither its presence nor its resume ledger.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_cleanup_whose_copy_was_superseded_leaves_presence_and_ledger_alone(pool: PgPool) {
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        a_cleanup_whose_copy_was_superseded_leaves_presence_and_ledger_alone_on(&env).await;
    }
}

async fn a_cleanup_whose_copy_was_superseded_leaves_presence_and_ledger_alone_on(env: &Env) {
    let player = env.character().await;
    let item = cleanup(&player, "s-1", SessionLifecycleEffectPlan::Reconnectable);
    env.store.claim(player.character_id, 0).await.unwrap();
    assert_eq!(
        env.worker().process(&item, Uuid::now_v7()).await.unwrap(),
        shardkeep::journal::Processed::SkippedStale
    );
    assert!(
        env.coord
            .presence_by_character(&player.character_id.to_string())
            .await
            .unwrap()
            .is_none()
    );
    assert!(env.coord.resume_load("s-1").await.unwrap().is_none());
    assert_eq!(
        location(&env.store, player.character_id).await,
        (Some("zone-0".into()), Some("r0".into()))
    );
}

/// An entry that keeps failing stays held through the pass while the entries behind it run,
/// then goes back to the front, in its place, for the next pass.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_failing_entry_does_not_stall_the_entries_behind_it(pool: PgPool) {
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        a_failing_entry_does_not_stall_the_entries_behind_it_on(&env).await;
    }
}

async fn a_failing_entry_does_not_stall_the_entries_behind_it_on(env: &Env) {
    let mut missing = env.character().await;
    missing.character_id = Uuid::now_v7();
    let player = env.character().await;
    let failing = env
        .journal
        .append(cleanup(
            &missing,
            "s-x",
            SessionLifecycleEffectPlan::PermanentRemoval,
        ))
        .await
        .unwrap();
    env.journal
        .append(cleanup(
            &player,
            "s-1",
            SessionLifecycleEffectPlan::PermanentRemoval,
        ))
        .await
        .unwrap();
    let worker = env.worker();
    let mut consumer = env.journal.queue().consumer().await.unwrap();
    let pass = worker.drain_pass(&mut consumer).await.unwrap();
    assert_eq!((pass.handled, pass.failed), (2, 1));
    assert_eq!(
        location(&env.store, player.character_id).await,
        (Some("zone-2".into()), Some("r3".into())),
        "the entry behind the failing one ran"
    );
    let depths = env.journal.queue().depths().await.unwrap();
    assert_eq!((depths.pending, depths.processing), (1, 0));
    let again = consumer.lease().await.unwrap().unwrap();
    assert_eq!(
        (again.entry.entry_id, again.entry.attempts),
        (failing, 1),
        "back at the front with its attempt counted"
    );
}

/// A store outage fails the entry at the head once and ends the pass: the entries behind it
/// are not charged an attempt each (a long outage would dead-letter the whole backlog). The
/// rows' path alone goes down: a proxy before Postgres, or a second connection to the file.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_store_outage_charges_only_the_entry_at_the_head(pool: PgPool) {
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        a_store_outage_charges_only_the_entry_at_the_head_on(&env, &pool).await;
    }
}

async fn a_store_outage_charges_only_the_entry_at_the_head_on(env: &Env, pool: &PgPool) {
    use shardkeep::character::CharacterStore;
    use shardkeep::journal::{JournalWorker, JournalWorkerConfig};
    use shardkeep_testkit::faults::{FaultProxy, ProxyMode};
    for n in 0..3 {
        let player = env.character().await;
        env.journal
            .append(cleanup(
                &player,
                &format!("s-{n}"),
                SessionLifecycleEffectPlan::PermanentRemoval,
            ))
            .await
            .unwrap();
    }
    let (rows, proxy, file) = match env.file_url() {
        None => {
            let proxy = FaultProxy::start(shardkeep_testkit::pg_addr())
                .await
                .unwrap();
            let cut = shardkeep_testkit::proxied_pg(pool, &proxy).await;
            proxy.set_mode(ProxyMode::Cut);
            (CharacterStore::new(cut), Some(proxy), None)
        }
        Some(url) => {
            let db = shardkeep::SqliteBackend::connect("DATABASE_URL", url)
                .await
                .unwrap();
            db.fail_for(std::time::Duration::from_secs(60));
            (CharacterStore::embedded(db.clone()), None, Some(db))
        }
    };
    let worker = JournalWorker::new(
        env.journal.clone(),
        env.coord.clone(),
        rows,
        JournalWorkerConfig::default(),
    );
    let mut consumer = env.journal.queue().consumer().await.unwrap();
    let pass = worker.drain_pass(&mut consumer).await.unwrap();
    assert_eq!((pass.handled, pass.failed), (1, 1), "{}", env.name());
    let mut attempts = Vec::new();
    while let Some(leased) = consumer.lease().await.unwrap() {
        attempts.push(leased.entry.attempts);
    }
    assert_eq!(attempts, vec![1, 0, 0], "{}", env.name());
    if let Some(proxy) = proxy {
        proxy.set_mode(ProxyMode::Pass);
    }
    if let Some(db) = file {
        db.end_outage();
    }
}

/// The row tells a cleanup older than one already written apart from one older than a live
/// write, and a retry of the cleanup that wrote is not taken for a newer one.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_stale_location_write_says_whether_a_newer_cleanup_wrote(pool: PgPool) {
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        a_stale_location_write_says_whether_a_newer_cleanup_wrote_on(&env).await;
    }
}

async fn a_stale_location_write_says_whether_a_newer_cleanup_wrote_on(env: &Env) {
    use shardkeep::character::{LocationOrder, LocationWrite};
    let player = env.character().await;
    let at = |secs_ago: i64| Utc::now() - ChronoDuration::seconds(secs_ago);
    let order = |closed_at, known_version| LocationOrder {
        owner_epoch: player.owner_epoch,
        closed_at,
        known_version,
    };
    let newer = order(at(1), Some(0));
    let write = |o: LocationOrder, room: &'static str| {
        let store = env.store.clone();
        let id = player.character_id;
        async move {
            store
                .write_location_ordered(id, o, "zone-1", room)
                .await
                .unwrap()
        }
    };
    assert_eq!(write(newer, "r1").await, LocationWrite::Written);
    assert_eq!(
        write(order(at(9), Some(0)), "r2").await,
        LocationWrite::Stale {
            newer_cleanup: true
        }
    );
    assert_eq!(
        write(newer, "r1").await,
        LocationWrite::Stale {
            newer_cleanup: false
        },
        "the same cleanup again"
    );
    // A live flush lands after a later close's copy last knew the row.
    let mut row = env.store.load(player.character_id).await.unwrap().unwrap();
    row.owner_epoch = player.owner_epoch;
    env.store.save(&row).await.unwrap();
    assert_eq!(
        write(order(Utc::now(), Some(0)), "r3").await,
        LocationWrite::Stale {
            newer_cleanup: false
        }
    );
}

/// A resume ledger stored by a cleanup is never replaced by an older cleanup's, and a
/// take-back removes only the record that very cleanup stored.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn resume_ledgers_are_stored_and_taken_back_in_order(pool: PgPool) {
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        resume_ledgers_are_stored_and_taken_back_in_order_on(&env).await;
    }
}

async fn resume_ledgers_are_stored_and_taken_back_in_order_on(env: &Env) {
    use shardkeep::Ttl;
    use shardkeep::coord::{OrderCheck, ResumeLedgerRecord, SessionOrder};
    let record = |seq| ResumeLedgerRecord {
        session_token: "s-1".into(),
        character_id: "c".into(),
        last_applied_seq: seq,
        zone_id: "zone-0".into(),
        recorded_at: Utc::now(),
    };
    let order = |secs_ago| SessionOrder {
        owner_epoch: 2,
        at: Utc::now() - ChronoDuration::seconds(secs_ago),
        event_id: Uuid::now_v7(),
    };
    let ttl = Ttl::from_secs(60).unwrap();
    let (older, newer) = (order(10), order(1));
    assert_eq!(
        env.coord
            .resume_store_ordered(&record(3), ttl, &newer)
            .await
            .unwrap(),
        OrderCheck::Current
    );
    assert_eq!(
        env.coord
            .resume_store_ordered(&record(1), ttl, &older)
            .await
            .unwrap(),
        OrderCheck::Stale
    );
    assert!(!env.coord.resume_take_back("s-1", &older).await.unwrap());
    let kept = env.coord.resume_load("s-1").await.unwrap().unwrap();
    assert_eq!(kept.last_applied_seq, 3, "the newer record stands");
    assert!(env.coord.resume_take_back("s-1", &newer).await.unwrap());
    assert!(env.coord.resume_load("s-1").await.unwrap().is_none());
}
