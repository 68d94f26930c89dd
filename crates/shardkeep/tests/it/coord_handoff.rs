use std::time::Duration;

use shardkeep::coord::{CoordError, HandoffMove, HandoffTake};
use shardkeep::{HandoffScope, KeyError, Ttl};
use shardkeep_testkit::{CoordDriver, coord_drivers};

fn instance(id: &str) -> HandoffScope {
    HandoffScope::Instance(id.into())
}

fn placement(id: &str) -> HandoffScope {
    HandoffScope::Placement(id.into())
}

#[tokio::test]
async fn second_take_of_a_handoff_is_already_consumed() {
    for d in coord_drivers().await {
        second_take_of_a_handoff_is_already_consumed_on(&d).await;
    }
}

async fn second_take_of_a_handoff_is_already_consumed_on(d: &CoordDriver) {
    let coord = d.coordination();
    let ttl = Ttl::from_secs(60).unwrap();
    coord
        .handoff_put("tok", &instance("i-1"), b"snapshot", ttl)
        .await
        .unwrap();

    let first = coord.handoff_take("tok", &[instance("i-1")]).await.unwrap();
    assert_eq!(
        first,
        HandoffTake::Taken {
            scope: instance("i-1"),
            payload: b"snapshot".to_vec()
        }
    );
    let second = coord.handoff_take("tok", &[instance("i-1")]).await.unwrap();
    assert_eq!(second, HandoffTake::AlreadyConsumed);
    assert!(coord.handoff_is_consumed("tok").await.unwrap());
    // The payload is gone and the marker carries the default TTL.
    let payload_key = d.keys().handoff("tok", &instance("i-1")).unwrap();
    assert!(!d.exists(&payload_key).await, "{}", d.name());
    let marker_ttl = d
        .pttl(&d.keys().handoff_consumed("tok").unwrap())
        .await
        .unwrap();
    assert!(
        ((24 * 3600 - 5) * 1000..=24 * 3600 * 1000).contains(&marker_ttl),
        "{} {marker_ttl}",
        d.name()
    );
}

#[tokio::test]
async fn take_after_payload_ttl_ran_out_still_answers_already_consumed() {
    for d in coord_drivers().await {
        take_after_payload_ttl_ran_out_still_answers_already_consumed_on(&d).await;
    }
}

async fn take_after_payload_ttl_ran_out_still_answers_already_consumed_on(d: &CoordDriver) {
    let coord = d.coordination();
    let short = Ttl::from_millis(150).unwrap();
    coord
        .handoff_put("tok", &instance("i-1"), b"a", short)
        .await
        .unwrap();
    coord
        .handoff_put("tok", &placement("p-1"), b"b", short)
        .await
        .unwrap();
    let scopes = [placement("p-1"), instance("i-1")];
    assert!(matches!(
        coord.handoff_take("tok", &scopes).await.unwrap(),
        HandoffTake::Taken { .. }
    ));
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(
        coord.handoff_take("tok", &scopes).await.unwrap(),
        HandoffTake::AlreadyConsumed
    );
    // A re-put after consumption cannot be taken either: replay stays blocked.
    coord
        .handoff_put("tok", &instance("i-1"), b"again", short)
        .await
        .unwrap();
    assert_eq!(
        coord.handoff_take("tok", &scopes).await.unwrap(),
        HandoffTake::AlreadyConsumed
    );
}

#[tokio::test]
async fn an_untaken_expired_handoff_is_not_found() {
    for d in coord_drivers().await {
        an_untaken_expired_handoff_is_not_found_on(&d).await;
    }
}

async fn an_untaken_expired_handoff_is_not_found_on(d: &CoordDriver) {
    let coord = d.coordination();
    coord
        .handoff_put("tok", &instance("i-1"), b"a", Ttl::from_millis(50).unwrap())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert_eq!(
        coord.handoff_take("tok", &[instance("i-1")]).await.unwrap(),
        HandoffTake::NotFound
    );
    assert!(!coord.handoff_is_consumed("tok").await.unwrap());
}

#[tokio::test]
async fn take_tries_scopes_in_documented_order() {
    for d in coord_drivers().await {
        take_tries_scopes_in_documented_order_on(&d).await;
    }
}

async fn take_tries_scopes_in_documented_order_on(d: &CoordDriver) {
    let coord = d.coordination();
    let ttl = Ttl::from_secs(60).unwrap();
    coord
        .handoff_put("tok", &HandoffScope::Port(7777), b"port", ttl)
        .await
        .unwrap();
    coord
        .handoff_put("tok", &placement("p-1"), b"placement", ttl)
        .await
        .unwrap();
    let taken = coord
        .handoff_take(
            "tok",
            &[HandoffScope::Port(7777), placement("p-1"), instance("i-9")],
        )
        .await
        .unwrap();
    assert_eq!(
        taken,
        HandoffTake::Taken {
            scope: placement("p-1"),
            payload: b"placement".to_vec()
        }
    );
    // Every scope of the token was cleared with the take.
    assert!(d.all_keys().await.iter().all(|k| k.ends_with(":consumed")));
}

#[tokio::test]
async fn concurrent_takes_of_one_token_yield_one_winner() {
    for d in coord_drivers().await {
        concurrent_takes_of_one_token_yield_one_winner_on(&d).await;
    }
}

async fn concurrent_takes_of_one_token_yield_one_winner_on(d: &CoordDriver) {
    let coord = d.coordination();
    coord
        .handoff_put("race", &instance("i-1"), b"x", Ttl::from_secs(60).unwrap())
        .await
        .unwrap();
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let coord = coord.clone();
            tokio::spawn(async move { coord.handoff_take("race", &[instance("i-1")]).await })
        })
        .collect();
    let mut taken = 0;
    for task in tasks {
        match task.await.unwrap().unwrap() {
            HandoffTake::Taken { .. } => taken += 1,
            HandoffTake::AlreadyConsumed => {}
            HandoffTake::NotFound => panic!("a racer saw neither payload nor marker"),
        }
    }
    assert_eq!(taken, 1);
}

#[tokio::test]
async fn move_keeps_the_remaining_ttl() {
    for d in coord_drivers().await {
        move_keeps_the_remaining_ttl_on(&d).await;
    }
}

async fn move_keeps_the_remaining_ttl_on(d: &CoordDriver) {
    let coord = d.coordination();
    coord
        .handoff_put(
            "tok",
            &instance("old"),
            b"snap",
            Ttl::from_secs(40).unwrap(),
        )
        .await
        .unwrap();
    let moved = coord
        .handoff_move("tok", &instance("old"), &instance("new"))
        .await
        .unwrap();
    let HandoffMove::Moved { remaining } = moved else {
        panic!("expected a move, got {moved:?}");
    };
    assert!(remaining <= Duration::from_secs(40) && remaining > Duration::from_secs(39));
    let new_key = d.keys().handoff("tok", &instance("new")).unwrap();
    let pttl = d.pttl(&new_key).await.unwrap();
    assert!(
        (39_000..=40_000).contains(&pttl),
        "destination TTL {pttl} ms ({})",
        d.name()
    );
    let old_key = d.keys().handoff("tok", &instance("old")).unwrap();
    assert!(!d.exists(&old_key).await, "{}", d.name());
    // The moved payload is what a take returns.
    let taken = coord.handoff_take("tok", &[instance("new")]).await.unwrap();
    assert_eq!(
        taken,
        HandoffTake::Taken {
            scope: instance("new"),
            payload: b"snap".to_vec()
        }
    );
    // Moving a consumed or absent handoff does nothing.
    assert_eq!(
        coord
            .handoff_move("tok", &instance("new"), &instance("x"))
            .await
            .unwrap(),
        HandoffMove::AlreadyConsumed
    );
    assert_eq!(
        coord
            .handoff_move("other", &instance("new"), &instance("x"))
            .await
            .unwrap(),
        HandoffMove::NotFound
    );
}

#[tokio::test]
async fn glob_characters_in_a_token_cannot_reach_another_token() {
    for d in coord_drivers().await {
        glob_characters_in_a_token_cannot_reach_another_token_on(&d).await;
    }
}

async fn glob_characters_in_a_token_cannot_reach_another_token_on(d: &CoordDriver) {
    let coord = d.coordination();
    let ttl = Ttl::from_secs(60).unwrap();
    coord
        .handoff_put("ab", &instance("i"), b"victim", ttl)
        .await
        .unwrap();
    coord
        .handoff_put("a*", &instance("i"), b"own", ttl)
        .await
        .unwrap();
    let taken = coord.handoff_take("a*", &[instance("i")]).await.unwrap();
    assert_eq!(
        taken,
        HandoffTake::Taken {
            scope: instance("i"),
            payload: b"own".to_vec()
        }
    );
    assert_eq!(
        coord.handoff_take("a?", &[instance("i")]).await.unwrap(),
        HandoffTake::NotFound
    );
    assert!(matches!(
        coord.handoff_take("ab", &[instance("i")]).await.unwrap(),
        HandoffTake::Taken { .. }
    ));
}

#[tokio::test]
async fn bad_handoff_input_is_a_typed_error_and_writes_nothing() {
    for d in coord_drivers().await {
        bad_handoff_input_is_a_typed_error_and_writes_nothing_on(&d).await;
    }
}

async fn bad_handoff_input_is_a_typed_error_and_writes_nothing_on(d: &CoordDriver) {
    let coord = d.coordination();
    let ttl = Ttl::from_secs(60).unwrap();
    let err = coord
        .handoff_put("", &instance("i"), b"x", ttl)
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        CoordError::InvalidKey(KeyError::Empty {
            what: "handoff token"
        })
    ));
    let long = "t".repeat(300);
    let err = coord
        .handoff_put(&long, &instance("i"), b"x", ttl)
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        CoordError::InvalidKey(KeyError::TooLong { .. })
    ));
    let err = coord
        .handoff_put("tok", &instance(""), b"x", ttl)
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        CoordError::InvalidKey(KeyError::Empty {
            what: "instance id"
        })
    ));
    let err = coord
        .handoff_put("tok", &instance("i"), b"", ttl)
        .await
        .unwrap_err();
    assert!(matches!(err, CoordError::InvalidInput(_)));
    let err = coord.handoff_take("tok", &[]).await.unwrap_err();
    assert!(matches!(err, CoordError::InvalidInput(_)));
    assert!(Ttl::from_secs(0).is_err() && Ttl::from_secs(-3).is_err());
    assert!(d.all_keys().await.is_empty());
}

#[tokio::test]
async fn scripts_reload_after_the_server_forgets_them() {
    // On a server of its own: flushing the shared server's scripts could make another test's
    // call miss its script twice in a row.
    let private = shardkeep_testkit::PrivateRedis::start("noeviction").await;
    let backend = shardkeep::RedisBackend::connect(
        "REDIS_URL",
        &private.url,
        shardkeep::Keyspace::new("flush").unwrap(),
        shardkeep::backend::redis::RedisTimeouts::default(),
    )
    .await
    .unwrap();
    let coord =
        shardkeep::Coordination::new(backend.clone(), shardkeep::CoordinationConfig::default());
    let ttl = Ttl::from_secs(60).unwrap();
    coord
        .handoff_put("a", &instance("i"), b"x", ttl)
        .await
        .unwrap();
    coord.handoff_take("a", &[instance("i")]).await.unwrap();
    // Forget every cached script: the next EVALSHA answers NOSCRIPT and must reload.
    let mut raw = backend.conn();
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .unwrap();
    coord
        .handoff_put("b", &instance("i"), b"y", ttl)
        .await
        .unwrap();
    assert!(matches!(
        coord.handoff_take("b", &[instance("i")]).await.unwrap(),
        HandoffTake::Taken { .. }
    ));
    // A login's take-over of a checkpoint sends its script only when the server lacks it.
    let checkpoints = shardkeep::character::CheckpointStore::new(backend.clone());
    let snapshot = shardkeep::character::CharacterSnapshot {
        character_id: uuid::Uuid::now_v7(),
        account_id: uuid::Uuid::now_v7(),
        name: "Kira".into(),
        zone_ref: None,
        room_ref: None,
        state: serde_json::json!({ "currency": 65 }).into(),
        chargen: None,
        state_version: 3,
        owner_epoch: 1,
        issue_mark: 0,
        schema_version: 1,
    };
    checkpoints.write(&snapshot).await.unwrap();
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .unwrap();
    let held = checkpoints
        .take_over(snapshot.character_id, 2)
        .await
        .unwrap()
        .expect("the checkpoint is held");
    assert_eq!(held.snapshot.state["currency"], 65);
    assert_eq!(held.held_by, 1, "the guard before the take-over");
}
