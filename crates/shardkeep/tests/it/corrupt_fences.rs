//! Stored fences that no writer wrote (`inf`, `1e300`, `0x10`, a 20-digit number) in placement
//! records and session order marks: the hash is taken over as corrupt, not compared as a huge
//! number that would refuse every writer until its TTL ran out; and a sound fence still
//! refuses an older writer afterwards.

use chrono::Utc;
use shardkeep::coord::{OrderCheck, SessionOrder};
use shardkeep::placement::{PlacementRecord, PlacementStore, PlacementWrite};
use shardkeep_testkit::TestRedis;
use uuid::Uuid;

/// Fences a corrupted or foreign writer could leave.
const CORRUPT: [&str; 6] = ["inf", "1e300", "0x10", " 7 ", "99999999999999999999", "nan"];

fn record(character: Uuid, epoch: i64) -> PlacementRecord {
    PlacementRecord {
        character_id: character,
        shard_id: Some("shard-a".into()),
        zone_id: Some("zone-1".into()),
        owner_epoch: epoch,
        updated_at: Utc::now(),
    }
}

#[tokio::test]
async fn a_corrupt_placement_epoch_is_replaced_and_the_fence_holds_after() {
    let redis = TestRedis::new().await;
    let store = PlacementStore::new(redis.backend());
    let mut conn = redis.raw().await;
    for corrupt in CORRUPT {
        let character = Uuid::now_v7();
        let key = redis.keys().placement(&character.to_string()).unwrap();
        let _: i64 = redis::cmd("HSET")
            .arg(&key)
            .arg("epoch")
            .arg(corrupt)
            .arg("record")
            .arg("{}")
            .query_async(&mut conn)
            .await
            .unwrap();
        let written = store.write(&record(character, 3)).await.unwrap();
        assert_eq!(written, PlacementWrite::Written, "over epoch {corrupt:?}");
        let older = store.write(&record(character, 2)).await.unwrap();
        assert_eq!(
            older,
            PlacementWrite::Stale { stored_epoch: 3 },
            "after {corrupt:?}"
        );
    }
}

#[tokio::test]
async fn a_corrupt_session_order_mark_is_taken_over_and_orders_after() {
    let redis = TestRedis::new().await;
    let coord = redis.coordination();
    let mut conn = redis.raw().await;
    for corrupt in CORRUPT {
        let character = Uuid::now_v7().to_string();
        let key = redis.keys().presence_session_order(&character).unwrap();
        for (epoch, at) in [(corrupt, "1"), ("1", corrupt)] {
            let _: i64 = redis::cmd("HSET")
                .arg(&key)
                .arg("epoch")
                .arg(epoch)
                .arg("at")
                .arg(at)
                .arg("entry")
                .arg("x")
                .query_async(&mut conn)
                .await
                .unwrap();
            let order = SessionOrder {
                owner_epoch: 2,
                at: Utc::now(),
                event_id: Uuid::now_v7(),
            };
            let check = coord.session_order_claim(&character, &order).await.unwrap();
            assert_eq!(
                check,
                OrderCheck::Current,
                "over epoch {epoch:?}, at {at:?}"
            );
            let older = SessionOrder {
                owner_epoch: 1,
                ..order
            };
            let check = coord.session_order_claim(&character, &older).await.unwrap();
            assert_eq!(check, OrderCheck::Stale, "after epoch {epoch:?}, at {at:?}");
        }
    }
}

/// A resume ledger whose stored order no writer wrote (a text `inf`, `1e400` read as infinity,
/// a fraction, something not a number): the record is taken over by the next ordered store,
/// not compared as a huge number that would refuse every later event's ledger until the TTL.
#[tokio::test]
async fn a_corrupt_resume_ledger_order_is_taken_over_and_orders_after() {
    use shardkeep::Ttl;
    use shardkeep::coord::ResumeLedgerRecord;
    let redis = TestRedis::new().await;
    let coord = redis.coordination();
    let mut conn = redis.raw().await;
    let corrupt_orders = [
        r#"["inf", 1, "x"]"#,
        r#"[1, "inf", "x"]"#,
        r#"[1e400, 1, "x"]"#,
        r#"[1, 1e400, "x"]"#,
        r#"[1.5, 1, "x"]"#,
        r#"[{"a": 1}, 1, "x"]"#,
        r#"["0x10", 1, "x"]"#,
    ];
    for corrupt in corrupt_orders {
        let token = format!("s-{}", Uuid::now_v7().simple());
        let key = redis.keys().resume_ledger(&token).unwrap();
        let stored = format!(r#"{{"session_token": "{token}", "order": {corrupt}}}"#);
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(&stored)
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        let record = ResumeLedgerRecord {
            session_token: token.clone(),
            character_id: Uuid::now_v7().to_string(),
            last_applied_seq: 9,
            zone_id: "zone-1".into(),
            recorded_at: Utc::now(),
        };
        let order = SessionOrder {
            owner_epoch: 2,
            at: Utc::now(),
            event_id: Uuid::now_v7(),
        };
        let ttl = Ttl::from_secs(60).unwrap();
        let check = coord
            .resume_store_ordered(&record, ttl, &order)
            .await
            .unwrap();
        assert_eq!(check, OrderCheck::Current, "over order {corrupt}");
        let loaded = coord.resume_load(&token).await.unwrap();
        assert_eq!(
            loaded.map(|r| r.last_applied_seq),
            Some(9),
            "over order {corrupt}"
        );
        let older = SessionOrder {
            owner_epoch: 1,
            ..order
        };
        let check = coord
            .resume_store_ordered(&record, ttl, &older)
            .await
            .unwrap();
        assert_eq!(check, OrderCheck::Stale, "after order {corrupt}");
    }
}
