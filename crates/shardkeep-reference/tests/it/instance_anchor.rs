//! Inside an instance, saves write the entrance (the zone and room the player entered from) as
//! the durable location, so a logout from an instance lands the next login at the entrance.

use std::time::Duration;

use shardkeep::drain::BarrierOutcome;
use shardkeep::saver::SaveReason;
use shardkeep_reference::game::world::REFERENCE_INSTANCE;
use shardkeep_reference::shard::WalkOutcome;
use shardkeep_testkit::TestRedis;
use sqlx::PgPool;

use crate::support::{Stores, boot, login};

const BARRIER: Duration = Duration::from_secs(5);

fn moved(outcome: WalkOutcome) -> (String, String) {
    match outcome {
        WalkOutcome::Moved { zone, room } => (zone, room),
        other => panic!("expected a walk inside the shard, got {other:?}"),
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn walk_into_an_instance_then_logout_then_login_lands_at_the_entrance(pool: PgPool) {
    let redis = TestRedis::new().await;
    let sqlite = shardkeep_testkit::TestSqlite::new().await;
    for stores in [
        Stores::new(&pool, redis.backend()),
        Stores::embedded(&sqlite),
    ] {
        let id = stores.new_character("Aria").await;
        let mut shard = boot(&stores, "shard-a", &[0, 1], 2);
        login(&stores, &mut shard, id, "s1").await;
        // The row learns zone-1 …
        moved(shard.walk(id, "east").unwrap());
        assert!(shard.save_one(id, SaveReason::Flush));
        assert_eq!(
            shard.saver().barrier(BARRIER).await,
            BarrierOutcome::Drained
        );
        // … then the player walks back to zone-0 and down into the crypt without another flush.
        moved(shard.walk(id, "west").unwrap());
        assert_eq!(
            moved(shard.walk(id, "south").unwrap()),
            ("zone-0".into(), "r3".into())
        );
        assert_eq!(
            moved(shard.walk(id, "down").unwrap()),
            (REFERENCE_INSTANCE.into(), "c0".into())
        );
        moved(shard.walk(id, "north").unwrap());
        assert_eq!(
            shard.location(id),
            Some((REFERENCE_INSTANCE.into(), "c1".into()))
        );
        assert_eq!(
            shard.durable_location(id),
            Some(("zone-0".into(), "r3".into())),
            "inside an instance the durable location is its entrance"
        );
        // A checkpoint taken in the crypt names the entrance too.
        assert!(shard.save_one(id, SaveReason::Checkpoint));
        assert_eq!(
            shard.saver().barrier(BARRIER).await,
            BarrierOutcome::Drained
        );
        let checkpoint = stores.checkpoints.read(id).await.unwrap().unwrap();
        assert_eq!(
            (
                checkpoint.zone_ref.as_deref(),
                checkpoint.room_ref.as_deref()
            ),
            (Some("zone-0"), Some("r3"))
        );

        shard.logout(id).unwrap();
        assert_eq!(
            shard.saver().barrier(BARRIER).await,
            BarrierOutcome::Drained
        );
        let row = stores.characters.load(id).await.unwrap().unwrap();
        assert_eq!(
            (row.zone_ref.as_deref(), row.room_ref.as_deref()),
            (Some("zone-0"), Some("r3")),
            "the logout from the crypt wrote its entrance"
        );
        stores.checkpoints.delete(id).await.unwrap();
        let landed = login(&stores, &mut shard, id, "s2").await;
        assert_eq!(
            (landed.zone.as_str(), landed.room.as_str()),
            ("zone-0", "r3")
        );
    }
}
