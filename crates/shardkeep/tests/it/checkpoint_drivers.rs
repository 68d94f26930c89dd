//! The checkpoint tier's conformance: every test body runs against each driver (Redis of the
//! suite's topology, and the embedded store's file), which must answer alike.

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use serde_json::json;
use shardkeep::character::{
    CharacterLoader, CharacterSnapshot, CharacterStore, CheckpointError, CheckpointStore,
    CheckpointWrite, LoadSource,
};
use shardkeep::clock::ManualClock;
use shardkeep::ttl::Ttl;
use shardkeep_testkit::{CheckpointDrivers, TestSqlite};
use sqlx::PgPool;
use uuid::Uuid;

use super::ladder_store::created;

fn live_copy(epoch: i64) -> CharacterSnapshot {
    CharacterSnapshot {
        character_id: Uuid::now_v7(),
        account_id: Uuid::now_v7(),
        name: "Aria".into(),
        zone_ref: Some("midgaard".into()),
        room_ref: None,
        state: json!({ "who": "live" }).into(),
        chargen: None,
        state_version: 3,
        owner_epoch: epoch,
        issue_mark: 0,
        schema_version: 1,
    }
}

/// Seconds until the checkpoint of `character_id` expires, as the driver keeps it.
async fn seconds_left(drivers: &CheckpointDrivers, store: &CheckpointStore, id: Uuid) -> i64 {
    match store.driver() {
        "redis" => {
            let mut raw = drivers.redis.raw().await;
            raw.ttl(drivers.redis.keys().checkpoint(id)).await.unwrap()
        }
        _ => {
            let expires_at: i64 =
                sqlx::query_scalar("SELECT expires_at FROM checkpoints WHERE character_id = ?1")
                    .bind(id)
                    .fetch_one(drivers.sqlite.backend().pool())
                    .await
                    .unwrap();
            (expires_at - chrono::Utc::now().timestamp_micros()) / 1_000_000
        }
    }
}

#[tokio::test]
async fn a_stale_owner_cannot_overwrite_a_newer_checkpoint() {
    let drivers = CheckpointDrivers::new().await;
    for checkpoints in drivers.stores() {
        let driver = checkpoints.driver();
        let base = live_copy(5);
        assert_eq!(
            checkpoints.write(&base).await.unwrap(),
            CheckpointWrite::Written,
            "{driver}"
        );
        let zombie = CharacterSnapshot {
            owner_epoch: 4,
            state_version: 9,
            state: json!({ "who": "zombie" }).into(),
            ..base.clone()
        };
        assert_eq!(
            checkpoints.write(&zombie).await.unwrap(),
            CheckpointWrite::NotOwner { stored_epoch: 5 },
            "{driver}"
        );
        assert_eq!(
            checkpoints.read(base.character_id).await.unwrap(),
            Some(base.clone()),
            "{driver}"
        );
        let left = seconds_left(&drivers, &checkpoints, base.character_id).await;
        assert!(
            (3590..=3600).contains(&left),
            "{driver}: checkpoint kept for one hour: {left} s"
        );
        // The same owner writes again; a newer one takes over; an older model is refused.
        let again = CharacterSnapshot {
            state_version: 4,
            ..base.clone()
        };
        assert_eq!(
            checkpoints.write(&again).await.unwrap(),
            CheckpointWrite::Written
        );
        let newer_schema = CharacterSnapshot {
            owner_epoch: 6,
            schema_version: 2,
            ..base.clone()
        };
        assert_eq!(
            checkpoints.write(&newer_schema).await.unwrap(),
            CheckpointWrite::Written
        );
        let older_model = CharacterSnapshot {
            owner_epoch: 7,
            schema_version: 1,
            ..base.clone()
        };
        assert_eq!(
            checkpoints.write(&older_model).await.unwrap(),
            CheckpointWrite::SchemaNewer { stored_schema: 2 },
            "{driver}"
        );
        assert_eq!(
            checkpoints.read(base.character_id).await.unwrap(),
            Some(newer_schema),
            "{driver}"
        );
        checkpoints.delete(base.character_id).await.unwrap();
        assert_eq!(checkpoints.read(base.character_id).await.unwrap(), None);
        assert_eq!(
            checkpoints.read(Uuid::now_v7()).await.unwrap(),
            None,
            "{driver}"
        );
    }
}

#[tokio::test]
async fn a_batch_gives_one_outcome_per_snapshot_in_order() {
    let drivers = CheckpointDrivers::new().await;
    for checkpoints in drivers.stores() {
        let driver = checkpoints.driver();
        let held = live_copy(9);
        checkpoints.write(&held).await.unwrap();
        let stale = CharacterSnapshot {
            owner_epoch: 2,
            ..held.clone()
        };
        // More than one pipeline of the Redis driver.
        let fresh: Vec<CharacterSnapshot> = (0..300).map(|_| live_copy(1)).collect();
        // An older copy of the first character right behind it: in the same script call of
        // the Redis driver, which must apply its checkpoints in order too.
        let older_first = CharacterSnapshot {
            owner_epoch: 0,
            ..fresh[0].clone()
        };
        let mut batch: Vec<&CharacterSnapshot> = fresh.iter().collect();
        batch.insert(150, &stale);
        batch.insert(1, &older_first);
        let outcomes = checkpoints.write_many(&batch).await.unwrap();
        assert_eq!(outcomes.len(), 302, "{driver}");
        for (at, outcome) in outcomes.iter().enumerate() {
            let expected = match at {
                1 => CheckpointWrite::NotOwner { stored_epoch: 1 },
                151 => CheckpointWrite::NotOwner { stored_epoch: 9 },
                _ => CheckpointWrite::Written,
            };
            assert_eq!(*outcome, expected, "{driver}: snapshot {at}");
        }
        for snapshot in &fresh {
            assert_eq!(
                checkpoints.read(snapshot.character_id).await.unwrap(),
                Some(snapshot.clone()),
                "{driver}"
            );
            checkpoints.delete(snapshot.character_id).await.unwrap();
        }
        assert_eq!(
            checkpoints.read(held.character_id).await.unwrap(),
            Some(held.clone())
        );
        checkpoints.delete(held.character_id).await.unwrap();
    }
}

/// A login storm's take-overs arrive together and go to Redis a batch at a time, many keys to a
/// script call: each still gets its own checkpoint and guard, and raises only its own.
#[tokio::test]
async fn take_overs_arriving_together_each_get_their_own_answer() {
    let drivers = CheckpointDrivers::new().await;
    for checkpoints in drivers.stores() {
        let driver = checkpoints.driver();
        // More than one batch and one script call of the Redis driver.
        let held: Vec<CharacterSnapshot> = (0..300).map(|_| live_copy(1)).collect();
        let refs: Vec<&CharacterSnapshot> = held.iter().collect();
        checkpoints.write_many(&refs).await.unwrap();
        let newer = live_copy(9);
        checkpoints.write(&newer).await.unwrap();
        let missing = Uuid::now_v7();
        let corrupt = Uuid::now_v7();
        if driver == "redis" {
            let mut raw = drivers.redis.raw().await;
            let () = raw
                .set(drivers.redis.keys().checkpoint(corrupt), "not a hash")
                .await
                .unwrap();
        }
        let mut wave: Vec<(Uuid, i64)> = held.iter().map(|c| (c.character_id, 2)).collect();
        wave.insert(100, (missing, 2));
        wave.insert(200, (newer.character_id, 5));
        // Two claimants of one character in the same wave.
        wave.push((held[7].character_id, 3));
        wave.push((corrupt, 2));
        let answers = futures::future::join_all(
            wave.iter()
                .map(|&(id, claimant)| checkpoints.take_over(id, claimant)),
        )
        .await;
        for (&(id, claimant), answer) in wave.iter().zip(answers) {
            if id == missing {
                assert!(matches!(answer, Ok(None)), "{driver}: {answer:?}");
            } else if id == corrupt {
                let expected = driver == "redis";
                assert_eq!(
                    matches!(answer, Err(CheckpointError::Corrupt { .. })),
                    expected,
                    "{driver}: {answer:?}"
                );
            } else if id == newer.character_id {
                let found = answer.unwrap().expect("held");
                assert_eq!(
                    (found.held_by, found.snapshot),
                    (9, newer.clone()),
                    "{driver}"
                );
            } else {
                let found = answer.unwrap().expect("held");
                assert_eq!(found.snapshot.character_id, id, "{driver}");
                // Copy 7's two claimants go in two batches, either first (on a cluster, the
                // batches' pipelines reach the nodes in either order): the second finds the
                // first's guard.
                let other_claimant = 5 - claimant;
                assert!(
                    found.held_by == 1
                        || (id == held[7].character_id && found.held_by == other_claimant),
                    "{driver}: guard {} before a take-over for {claimant}",
                    found.held_by
                );
            }
        }
        // Every guard rose to its claimant and no further; the one above stayed.
        for (at, copy) in held.iter().enumerate() {
            let guard = checkpoints
                .read_held(copy.character_id)
                .await
                .unwrap()
                .expect("content kept")
                .held_by;
            assert_eq!(guard, if at == 7 { 3 } else { 2 }, "{driver}: copy {at}");
            assert_eq!(
                checkpoints.write(copy).await.unwrap(),
                CheckpointWrite::NotOwner {
                    stored_epoch: guard
                },
                "{driver}: the superseded copy is fenced"
            );
            checkpoints.delete(copy.character_id).await.unwrap();
        }
        assert_eq!(
            checkpoints
                .read_held(newer.character_id)
                .await
                .unwrap()
                .map(|h| h.held_by),
            Some(9),
            "{driver}"
        );
        checkpoints.delete(newer.character_id).await.unwrap();
        checkpoints.delete(corrupt).await.unwrap();
    }
}

/// A take-over that ran but whose answer was lost (an unconfirmed `WAIT`, a cut connection) is
/// tried again by the loader: the repeat answers the guard the first one found, not the one it
/// raised (which would rank the checkpoint as a newer claim's, past every freshness check).
/// (The embedded file's take-over can time out after its commit too: a stalled write.)
#[tokio::test]
async fn a_repeated_take_over_answers_the_guard_it_first_found() {
    let drivers = CheckpointDrivers::new().await;
    for checkpoints in drivers.stores() {
        let driver = checkpoints.driver();
        let copy = live_copy(4);
        checkpoints.write(&copy).await.unwrap();
        for _ in 0..3 {
            let found = checkpoints
                .take_over(copy.character_id, 6)
                .await
                .unwrap()
                .expect("held");
            assert_eq!(
                (found.held_by, found.snapshot.clone()),
                (4, copy.clone()),
                "{driver}"
            );
        }
        // A later claimant finds the guard the first one raised.
        let later = checkpoints
            .take_over(copy.character_id, 8)
            .await
            .unwrap()
            .expect("held");
        assert_eq!(later.held_by, 6, "{driver}");
        checkpoints.delete(copy.character_id).await.unwrap();
    }
}

#[tokio::test]
async fn an_expired_checkpoint_is_invisible_at_once_and_guards_nothing() {
    let drivers = CheckpointDrivers::new().await;
    let short = Ttl::from_millis(300).unwrap();
    let stores: Vec<CheckpointStore> = vec![
        CheckpointStore::with_ttl(drivers.redis.backend(), short),
        CheckpointStore::embedded(drivers.sqlite.backend()).kept_for(short),
    ];
    for checkpoints in stores {
        let driver = checkpoints.driver();
        let newer = live_copy(5);
        checkpoints.write(&newer).await.unwrap();
        assert!(
            checkpoints
                .read(newer.character_id)
                .await
                .unwrap()
                .is_some()
        );
        tokio::time::sleep(Duration::from_millis(450)).await;
        assert_eq!(
            checkpoints.read(newer.character_id).await.unwrap(),
            None,
            "{driver}: an expired checkpoint was read"
        );
        let older = CharacterSnapshot {
            owner_epoch: 4,
            ..newer.clone()
        };
        assert_eq!(
            checkpoints.write(&older).await.unwrap(),
            CheckpointWrite::Written,
            "{driver}: an expired checkpoint still guarded"
        );
        checkpoints.delete(newer.character_id).await.unwrap();
    }
}

/// The embedded store has no server expiring its rows: maintenance sweeps them, expired ones
/// only, oldest first, within its bound.
#[tokio::test]
async fn the_embedded_sweep_deletes_only_expired_checkpoints_within_its_bound() {
    let sqlite = TestSqlite::new().await;
    let clock = ManualClock::starting_at(chrono::Utc::now());
    let checkpoints = CheckpointStore::embedded(sqlite.backend())
        .kept_for(Ttl::from_secs(60).unwrap())
        .with_clock(Arc::new(clock.clone()));
    let early: Vec<CharacterSnapshot> = (0..5).map(|_| live_copy(1)).collect();
    checkpoints
        .write_many(&early.iter().collect::<Vec<_>>())
        .await
        .unwrap();
    clock.advance(chrono::Duration::seconds(30));
    let late = live_copy(1);
    checkpoints.write(&late).await.unwrap();
    assert_eq!(checkpoints.sweep_expired(100).await.unwrap(), 0);
    clock.advance(chrono::Duration::seconds(31));
    assert_eq!(checkpoints.read(early[0].character_id).await.unwrap(), None);
    assert_eq!(checkpoints.sweep_expired(3).await.unwrap(), 3);
    assert_eq!(checkpoints.sweep_expired(100).await.unwrap(), 2);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM checkpoints")
        .fetch_one(sqlite.backend().pool())
        .await
        .unwrap();
    assert_eq!(rows, 1, "the live checkpoint was swept");
    assert_eq!(
        checkpoints.read(late.character_id).await.unwrap(),
        Some(late)
    );
}

/// A checkpoint in the file outlives the process that wrote it, as one in Redis outlives its
/// shard.
#[tokio::test]
async fn an_embedded_checkpoint_survives_its_process() {
    let sqlite = TestSqlite::new().await;
    let written = live_copy(3);
    CheckpointStore::embedded(sqlite.backend())
        .write(&written)
        .await
        .unwrap();
    sqlite.backend().close().await;
    let reopened = shardkeep::SqliteBackend::connect("DATABASE_URL", sqlite.url())
        .await
        .unwrap();
    assert_eq!(
        CheckpointStore::embedded(reopened.clone())
            .read(written.character_id)
            .await
            .unwrap(),
        Some(written)
    );
    reopened.close().await;
}

/// Rows a writer of another version or a hand edit left unreadable: the reader refuses them as
/// corrupt, a writer entitled by a readable guard replaces them, a readable newer owner still
/// refuses.
#[tokio::test]
async fn corrupt_embedded_checkpoints_are_refused_on_read_and_replaced_on_write() {
    let sqlite = TestSqlite::new().await;
    let db = sqlite.backend();
    let checkpoints = CheckpointStore::embedded(db.clone());
    let far = chrono::Utc::now().timestamp_micros() + 3_600_000_000;
    let other = live_copy(1);
    let cases: Vec<(&str, serde_json::Value, serde_json::Value, String)> = vec![
        ("text epoch", json!("five"), json!(1), String::new()),
        ("real epoch", json!(5.5), json!(1), String::new()),
        ("text schema", json!(1), json!("x"), String::new()),
        ("broken body", json!(1), json!(1), "{broken".into()),
        (
            "another character's body",
            json!(1),
            json!(1),
            serde_json::to_string(&other).unwrap(),
        ),
    ];
    for (what, epoch, schema, body) in cases {
        let copy = live_copy(1);
        let body = if body.is_empty() {
            serde_json::to_string(&copy).unwrap()
        } else {
            body
        };
        sqlx::query(
            "INSERT INTO checkpoints (character_id, owner_epoch, schema, snapshot, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .bind(copy.character_id)
        .bind(sql_value(&epoch))
        .bind(sql_value(&schema))
        .bind(body)
        .bind(far)
        .execute(db.pool())
        .await
        .unwrap();
        let read = checkpoints.read(copy.character_id).await;
        let corrupt_read = matches!(read, Err(CheckpointError::Corrupt { .. }));
        if what == "text schema" {
            // The reader needs only the epoch and the body; the writer replaces the schema.
            assert_eq!(read.unwrap(), Some(copy.clone()), "{what}");
        } else {
            assert!(corrupt_read, "{what}: read as {read:?}");
        }
        let replacing = CharacterSnapshot {
            state_version: 7,
            ..copy.clone()
        };
        assert_eq!(
            checkpoints.write(&replacing).await.unwrap(),
            CheckpointWrite::Written,
            "{what}"
        );
        assert_eq!(
            checkpoints.read(copy.character_id).await.unwrap(),
            Some(replacing),
            "{what}"
        );
    }
    // A readable newer owner refuses even beside a corrupt schema.
    let copy = live_copy(1);
    sqlx::query(
        "INSERT INTO checkpoints (character_id, owner_epoch, schema, snapshot, expires_at)
         VALUES (?1, 8, 'x', '{}', ?2)",
    )
    .bind(copy.character_id)
    .bind(far)
    .execute(db.pool())
    .await
    .unwrap();
    assert_eq!(
        checkpoints.write(&copy).await.unwrap(),
        CheckpointWrite::NotOwner { stored_epoch: 8 }
    );
}

fn sql_value(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// A login reads the checkpoint tier it is given, whichever the driver, and picks the fresher
/// copy.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_login_picks_a_fresher_checkpoint_from_each_driver(pool: PgPool) {
    let drivers = CheckpointDrivers::new().await;
    let store = CharacterStore::new(shardkeep_testkit::pg(&pool));
    for checkpoints in drivers.stores() {
        let driver = checkpoints.driver();
        let row = created(&store, &format!("Aria {driver}")).await;
        let epoch = store.claim(row.character_id, 0).await.unwrap().new_epoch;
        let dumped = CharacterSnapshot {
            owner_epoch: epoch,
            state_version: row.state_version,
            state: json!({ "who": "checkpoint" }).into(),
            ..row.clone()
        };
        checkpoints.write(&dumped).await.unwrap();
        let loader = CharacterLoader::new(
            store.clone(),
            Some(checkpoints.clone()),
            shardkeep_testkit::model::LedgerModel::handle(),
            Duration::from_secs(5),
        );
        let loaded = loader.claim_and_load(row.character_id, 0).await.unwrap();
        assert_eq!(loaded.source, LoadSource::Checkpoint, "{driver}");
        assert_eq!(loaded.snapshot.state["who"], "checkpoint", "{driver}");
        checkpoints.delete(row.character_id).await.unwrap();
    }
}

/// The embedded store's outage hook: for the stretch, every call of both embedded tiers fails
/// with a typed error and writes nothing; afterwards they answer as before.
#[tokio::test]
async fn an_embedded_outage_fails_every_call_for_its_stretch_and_writes_nothing() {
    use shardkeep::audit::{AuditEvent, AuditStore};
    let sqlite = TestSqlite::new().await;
    let db = sqlite.backend();
    let checkpoints = CheckpointStore::embedded(db.clone());
    let audit = AuditStore::embedded(db.clone());
    let before = live_copy(2);
    checkpoints.write(&before).await.unwrap();
    db.fail_for(Duration::from_millis(400));
    let during = live_copy(2);
    let down = |what: &str, err: String| {
        assert!(
            err.contains(shardkeep::backend::sqlite::OUTAGE_MESSAGE),
            "{what} during the outage: {err}"
        );
    };
    down(
        "write",
        checkpoints.write(&during).await.unwrap_err().to_string(),
    );
    down(
        "read",
        checkpoints
            .read(before.character_id)
            .await
            .unwrap_err()
            .to_string(),
    );
    down(
        "delete",
        checkpoints
            .delete(before.character_id)
            .await
            .unwrap_err()
            .to_string(),
    );
    down(
        "sweep",
        checkpoints.sweep_expired(10).await.unwrap_err().to_string(),
    );
    let event = AuditEvent::track(during.character_id, "mining", 1);
    down(
        "audit record",
        audit
            .record(std::slice::from_ref(&event))
            .await
            .unwrap_err()
            .to_string(),
    );
    down(
        "audit page",
        audit
            .character_page(during.character_id, None, 10)
            .await
            .unwrap_err()
            .to_string(),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        checkpoints.read(before.character_id).await.unwrap(),
        Some(before)
    );
    assert_eq!(checkpoints.read(during.character_id).await.unwrap(), None);
    let trail = audit
        .character_page(during.character_id, None, 10)
        .await
        .unwrap();
    assert!(trail.rows.is_empty(), "a refused record landed");
    assert_eq!(audit.record(&[event]).await.unwrap(), 1);
    // Ended early, the outage is over at once.
    db.fail_for(Duration::from_secs(60));
    assert!(checkpoints.read(during.character_id).await.is_err());
    db.end_outage();
    checkpoints.write(&during).await.unwrap();
}

/// Writers of one process wait their turn for the file's write lock without holding a pooled
/// connection, so a read still gets one while a long write transaction is open and many writes
/// queue behind it.
#[tokio::test]
async fn embedded_writers_queued_behind_a_long_write_leave_connections_for_reads() {
    let sqlite = TestSqlite::new().await;
    let db = sqlite.backend();
    let checkpoints = CheckpointStore::embedded(db.clone());
    let present = live_copy(1);
    checkpoints.write(&present).await.unwrap();
    let long_write = db.begin().await.unwrap();
    let queued: Vec<_> = (0..8)
        .map(|_| {
            let checkpoints = checkpoints.clone();
            tokio::spawn(async move { checkpoints.write(&live_copy(1)).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let read = tokio::time::timeout(
        Duration::from_secs(2),
        checkpoints.read(present.character_id),
    )
    .await
    .expect("a read waited for a connection behind queued writers");
    assert_eq!(read.unwrap(), Some(present));
    long_write.commit().await.unwrap();
    for writer in queued {
        assert_eq!(writer.await.unwrap().unwrap(), CheckpointWrite::Written);
    }
}
