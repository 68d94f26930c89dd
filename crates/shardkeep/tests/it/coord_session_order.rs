//! The order of a character's session events on every coordination driver: the order claim,
//! presence written only while its event is the newest, resume ledgers stored and taken back in
//! order, and stored orders no writer wrote taken over rather than compared.

use chrono::{Duration as ChronoDuration, Utc};
use shardkeep::Ttl;
use shardkeep::coord::{OrderCheck, PresenceRecord, ResumeLedgerRecord, SessionOrder};
use shardkeep_testkit::{CoordDriver, coord_drivers};
use uuid::Uuid;

fn order(epoch: i64, secs_ago: i64) -> SessionOrder {
    SessionOrder {
        owner_epoch: epoch,
        at: Utc::now() - ChronoDuration::seconds(secs_ago),
        event_id: Uuid::now_v7(),
    }
}

#[tokio::test]
async fn presence_is_written_only_by_the_newest_session_event() {
    for d in coord_drivers().await {
        presence_ordered_on(&d).await;
    }
}

async fn presence_ordered_on(d: &CoordDriver) {
    let coord = d.coordination();
    let character = Uuid::now_v7().to_string();
    let (older, newer) = (order(3, 5), order(3, 0));
    let claim = |o: SessionOrder| {
        let (coord, character) = (coord.clone(), character.clone());
        async move { coord.session_order_claim(&character, &o).await.unwrap() }
    };
    assert_eq!(claim(older).await, OrderCheck::Current, "{}", d.name());
    assert_eq!(claim(newer).await, OrderCheck::Current);
    assert_eq!(claim(older).await, OrderCheck::Stale, "{}", d.name());
    let record = PresenceRecord {
        account_id: "acc".into(),
        character_id: character.clone(),
        session_token: "s-old".into(),
        shard_id: "shard-1".into(),
        zone_id: None,
        expires_at: Utc::now() + ChronoDuration::seconds(60),
    };
    assert_eq!(
        coord.presence_put_ordered(&record, &older).await.unwrap(),
        OrderCheck::Stale,
        "{}",
        d.name()
    );
    assert!(
        coord
            .presence_by_character(&character)
            .await
            .unwrap()
            .is_none(),
        "a stale event writes no presence ({})",
        d.name()
    );
    // A retry of the newest is still current; a later copy (higher epoch) always is, whatever
    // its time.
    assert_eq!(claim(newer).await, OrderCheck::Current);
    let later_copy = order(4, 60);
    assert_eq!(
        coord
            .presence_put_ordered(&record, &later_copy)
            .await
            .unwrap(),
        OrderCheck::Current
    );
    assert_eq!(
        coord.presence_by_character(&character).await.unwrap(),
        Some(record),
        "{}",
        d.name()
    );
    assert_eq!(claim(newer).await, OrderCheck::Stale, "{}", d.name());
    assert_eq!(
        coord.session_order_mark(&character).await.unwrap(),
        Some((
            4,
            later_copy.at.timestamp_micros(),
            later_copy.event_id.to_string()
        )),
        "the mark names the newest event ({})",
        d.name()
    );
    assert_eq!(
        coord.session_order_mark("no-such-character").await.unwrap(),
        None
    );
    assert!(
        coord.session_order_claim("", &older).await.is_err(),
        "an empty character id is a typed error"
    );
    let mark = d.keys().presence_session_order(&character).unwrap();
    let ttl = d.pttl(&mark).await.unwrap();
    assert!(
        ttl > 7 * 24 * 3600 * 1000 - 10_000,
        "the mark lives a week: {} {ttl}",
        d.name()
    );
}

fn ledger(token: &str, seq: u64) -> ResumeLedgerRecord {
    ResumeLedgerRecord {
        session_token: token.into(),
        character_id: "c".into(),
        last_applied_seq: seq,
        zone_id: "zone-0".into(),
        recorded_at: Utc::now(),
    }
}

#[tokio::test]
async fn resume_ledgers_are_stored_and_taken_back_in_order() {
    for d in coord_drivers().await {
        let coord = d.coordination();
        let ttl = Ttl::from_secs(60).unwrap();
        let (older, newer) = (order(2, 10), order(2, 1));
        assert_eq!(
            coord
                .resume_store_ordered(&ledger("s-1", 3), ttl, &newer)
                .await
                .unwrap(),
            OrderCheck::Current
        );
        assert_eq!(
            coord
                .resume_store_ordered(&ledger("s-1", 1), ttl, &older)
                .await
                .unwrap(),
            OrderCheck::Stale,
            "{}",
            d.name()
        );
        assert!(!coord.resume_take_back("s-1", &older).await.unwrap());
        let kept = coord.resume_load("s-1").await.unwrap().unwrap();
        assert_eq!(kept.last_applied_seq, 3, "the newer record stands");
        assert!(coord.resume_take_back("s-1", &newer).await.unwrap());
        assert!(coord.resume_load("s-1").await.unwrap().is_none());
        assert!(
            !coord.resume_take_back("s-1", &newer).await.unwrap(),
            "nothing left to take back ({})",
            d.name()
        );
    }
}

/// A resume ledger whose stored order no writer wrote is taken over by the next ordered store,
/// never compared as a huge number that would refuse every later event's ledger.
#[tokio::test]
async fn a_corrupt_resume_ledger_order_is_taken_over_and_orders_after() {
    let corrupt_orders = [
        r#"["inf", 1, "x"]"#,
        r#"[1, "inf", "x"]"#,
        r#"[1e400, 1, "x"]"#,
        r#"[1, 1e400, "x"]"#,
        r#"[1.5, 1, "x"]"#,
        r#"[{"a": 1}, 1, "x"]"#,
        r#"["0x10", 1, "x"]"#,
        r#"[1, 1]"#,
    ];
    for d in coord_drivers().await {
        let coord = d.coordination();
        for corrupt in corrupt_orders {
            let token = format!("s-{}", Uuid::now_v7().simple());
            let key = d.keys().resume_ledger(&token).unwrap();
            let stored = format!(r#"{{"session_token": "{token}", "order": {corrupt}}}"#);
            d.set_raw(&key, stored.as_bytes()).await;
            let ttl = Ttl::from_secs(60).unwrap();
            let now = order(2, 0);
            let check = coord
                .resume_store_ordered(&ledger(&token, 9), ttl, &now)
                .await
                .unwrap();
            assert_eq!(check, OrderCheck::Current, "{} over {corrupt}", d.name());
            let loaded = coord.resume_load(&token).await.unwrap();
            assert_eq!(loaded.map(|r| r.last_applied_seq), Some(9));
            let older = SessionOrder {
                owner_epoch: 1,
                ..now
            };
            let check = coord
                .resume_store_ordered(&ledger(&token, 9), ttl, &older)
                .await
                .unwrap();
            assert_eq!(check, OrderCheck::Stale, "{} after {corrupt}", d.name());
        }
    }
}

/// A session order mark in the file that no writer wrote is taken over (the Redis form, a hash,
/// is covered in `corrupt_fences`).
#[tokio::test]
async fn a_corrupt_order_mark_in_the_file_is_taken_over() {
    for d in coord_drivers().await {
        if d.redis().is_some() {
            continue;
        }
        let coord = d.coordination();
        for corrupt in [
            &b"not json"[..],
            br#"["inf", 1, "x"]"#,
            br#"[1e300, 1, "x"]"#,
            br#"[99999999999999999999, 1, "x"]"#,
            br#"{"epoch": 9}"#,
        ] {
            let character = Uuid::now_v7().to_string();
            let mark = d.keys().presence_session_order(&character).unwrap();
            d.set_raw(&mark, corrupt).await;
            let now = order(2, 0);
            let check = coord.session_order_claim(&character, &now).await.unwrap();
            assert_eq!(check, OrderCheck::Current, "over {corrupt:?}");
            let older = SessionOrder {
                owner_epoch: 1,
                ..now
            };
            let check = coord.session_order_claim(&character, &older).await.unwrap();
            assert_eq!(check, OrderCheck::Stale, "after {corrupt:?}");
        }
    }
}
