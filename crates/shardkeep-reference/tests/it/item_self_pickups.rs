//! A character picking up an item that an earlier copy of itself put down: the put-down may
//! never have been saved (the copy died first), so the floor copy may be a phantom of what the
//! character holds, or held since. Such a pickup commits like another player's, through the
//! same phantom checks; only a pickup of the very copy's own put-down stays a plain move.

use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use crate::item_transfers::{
    Room, drop_then_crash, rehydrate, restored_elsewhere_hands_it_on, rows_holding,
    saved_drop_then_relogin, transfers, two_players,
};
use crate::scene::Driver;

/// How many of the items `shard`'s copy of `who` holds are `item`.
fn copies_held(shard: &shardkeep_reference::shard::Shard, who: Uuid, item: Uuid) -> usize {
    shard
        .player(who)
        .unwrap()
        .character
        .inventory
        .iter()
        .filter(|i| i.id == Some(item))
        .count()
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_restored_copy_picking_up_its_own_rolled_back_drop_does_not_hold_it_twice(pool: PgPool) {
    for driver in Driver::ALL {
        let mut room = two_players(&pool, driver).await;
        let item = drop_then_crash(&mut room).await;
        let Room {
            mut shard,
            a,
            b,
            stores,
            ..
        } = room;
        // A comes back on the same shard from its row, gem and all, and finds its old drop there.
        rehydrate(&stores, &mut shard, a, "sa2").await;
        assert_eq!(copies_held(&shard, a, item), 1);
        shard.get_item(a, item).unwrap();
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        assert_eq!(
            copies_held(&shard, a, item),
            1,
            "the floor copy was a phantom"
        );
        assert_eq!(shard.take_voided_items(), vec![item]);
        // (The shard's saver died with A's first copy; the row is as A's restored copy found it.)
        let row = stores.characters.load(a).await.unwrap().unwrap();
        let held = row
            .state
            .value()
            .to_string()
            .matches(&item.to_string())
            .count();
        assert_eq!(held, 1, "the row holds the gem once");
        assert_eq!(rows_holding(&stores, &[a, b], item).await, vec![a]);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_old_drop_of_an_item_a_later_copy_moved_on_is_voided_when_its_owner_picks_it_up(
    pool: PgPool,
) {
    for driver in Driver::ALL {
        let mut room = two_players(&pool, driver).await;
        let item = drop_then_crash(&mut room).await;
        let Room {
            mut shard,
            a,
            b,
            stores,
            ..
        } = room;
        let (mut other, c) = restored_elsewhere_hands_it_on(&stores, a, item).await;
        other.logout(a).unwrap();
        assert_eq!(
            other.saver().barrier(Duration::from_secs(5)).await,
            shardkeep::drain::BarrierOutcome::Drained
        );
        other.tick();
        // A returns to the first shard, where the drop its first copy never saved still lies.
        rehydrate(&stores, &mut shard, a, "sa3").await;
        assert_eq!(copies_held(&shard, a, item), 0);
        shard.get_item(a, item).unwrap();
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        assert_eq!(copies_held(&shard, a, item), 0, "C holds the gem now");
        assert_eq!(shard.take_voided_items(), vec![item]);
        assert_eq!(rows_holding(&stores, &[a, b, c], item).await, vec![c]);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_saved_drop_of_an_earlier_copy_is_its_owners_to_pick_up_again(pool: PgPool) {
    for driver in Driver::ALL {
        let mut room = two_players(&pool, driver).await;
        let item = saved_drop_then_relogin(&mut room).await;
        let Room {
            mut shard,
            a,
            b,
            stores,
            _keep,
            rows,
        } = room;
        shard.get_item(a, item).unwrap();
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        assert_eq!(shard.take_voided_items(), Vec::<Uuid>::new());
        assert_eq!(copies_held(&shard, a, item), 1);
        assert_eq!(rows_holding(&stores, &[a, b], item).await, vec![a]);
        // The same copy putting it down and taking it back stays a plain move, recorded nowhere.
        let recorded = transfers(&rows).await.len();
        shard.drop_item(a, item).unwrap();
        shard.get_item(a, item).unwrap();
        assert_eq!(shard.pending_transfer_count(), 0);
        assert_eq!(copies_held(&shard, a, item), 1);
        assert_eq!(transfers(&rows).await.len(), recorded);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_self_pickup_that_races_a_write_of_its_owner_dumps_again_and_lands_once(pool: PgPool) {
    for driver in Driver::ALL {
        let mut room = two_players(&pool, driver).await;
        let item = saved_drop_then_relogin(&mut room).await;
        let Room {
            mut shard,
            a,
            b,
            stores,
            _keep,
            ..
        } = room;
        // A journal location write lands: the restored copy's version is now behind its row.
        let epoch = shard.player(a).unwrap().character.owner_epoch;
        stores
            .characters
            .write_location(a, epoch, "zone-0", "r1")
            .await
            .unwrap();
        shard.get_item(a, item).unwrap();
        assert!(shard.settle_transfers(Duration::from_secs(5)).await);
        assert_eq!(shard.take_voided_items(), Vec::<Uuid>::new());
        assert_eq!(copies_held(&shard, a, item), 1);
        let row = stores.characters.load(a).await.unwrap().unwrap();
        assert_eq!(
            row.state
                .value()
                .to_string()
                .matches(&item.to_string())
                .count(),
            1
        );
        // The copy carries the commit's version: its next flush lands cleanly.
        shard.save_one(a, shardkeep::saver::SaveReason::Flush);
        shard.saver().barrier(Duration::from_secs(5)).await;
        assert_eq!(shard.saver().stats().row_conflicts, 0);
        assert_eq!(rows_holding(&stores, &[a, b], item).await, vec![a]);
    }
}
