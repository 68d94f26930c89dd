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
