//! Pickups through the runtime where the two rows moved apart from the copies: a releaser who
//! logged out, logged in again or walked to another shard since putting the item down, and an
//! acquirer whose row an offline grant moved under it (the commit meets a version race, merges
//! what landed and commits again). Each body runs on Postgres with Redis and on the embedded
//! store's file.

use serde_json::Value;
use shardkeep::live::{FinalSave, LiveConfig, PickedUp, SessionStart};
use shardkeep_testkit::{JobDrivers, TestRedis};
use sqlx::PgPool;
use uuid::Uuid;

use super::live_runtime::{Live, anchor, coins, holding, holds, without};

/// How many times `row`'s inventory lists `item`.
fn count(row: &Value, item: Uuid) -> usize {
    row["inventory"].as_array().map_or(0, |list| {
        list.iter().filter(|i| i["id"] == item.to_string()).count()
    })
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_pickup_from_a_releaser_who_left_came_back_or_walked_on_commits_once(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let a = Live::on(&d, &redis, "shard-a").await;
        let b = Live::on(&d, &redis, "shard-b").await;
        let rt = &a.runtime;
        let (gem, ore, axe) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let (aria_id, aria) = a.player("Aria").await;
        let (bram_id, bram) = a.player("Bram").await;
        rt.update(aria, holding(&[gem, ore, axe])).unwrap();
        rt.save_now(aria).await.unwrap();

        // Aria puts the gem down and logs out; Bram picks it up from her stored row.
        rt.update(aria, without(gem)).unwrap();
        let gem_mark = rt.release(aria).unwrap();
        assert!(matches!(
            rt.logout(aria).await.unwrap(),
            FinalSave::Saved { .. }
        ));
        let picked = rt
            .pick_up(bram, gem, Some(gem_mark), Value::Null, holding(&[gem]))
            .await
            .unwrap();
        assert_eq!(picked, PickedUp::Committed, "{}: gem", d.name());
        assert_eq!(count(&a.row(bram_id).await, gem), 1, "{}", d.name());
        assert_eq!(count(&a.row(aria_id).await, gem), 0, "{}", d.name());

        // She logs in again (a later copy, without the ore she put down before leaving).
        let aria = rt
            .login(aria_id, SessionStart::default())
            .await
            .unwrap()
            .copy;
        rt.update(aria, without(ore)).unwrap();
        let ore_mark = rt.release(aria).unwrap();
        assert!(matches!(
            rt.logout(aria).await.unwrap(),
            FinalSave::Saved { .. }
        ));
        let aria = rt
            .login(aria_id, SessionStart::default())
            .await
            .unwrap()
            .copy;
        let picked = rt
            .pick_up(bram, ore, Some(ore_mark), Value::Null, holding(&[ore]))
            .await
            .unwrap();
        assert_eq!(picked, PickedUp::Committed, "{}: ore", d.name());
        assert!(
            !rt.read(aria, |s| holds(&Value::Object(s.clone()), ore))
                .unwrap(),
            "{}",
            d.name()
        );
        assert_eq!(count(&a.row(bram_id).await, ore), 1, "{}", d.name());
        assert_eq!(count(&a.row(aria_id).await, ore), 0, "{}", d.name());

        // She puts the axe down and walks to shard b; Bram picks it up here.
        rt.update(aria, without(axe)).unwrap();
        let axe_mark = rt.release(aria).unwrap();
        let ticket = rt
            .hand_off(aria, "shard-b", anchor("zone-1"))
            .await
            .unwrap();
        let there = b
            .runtime
            .arrive(&ticket.token, SessionStart::default())
            .await
            .unwrap();
        let picked = rt
            .pick_up(bram, axe, Some(axe_mark), Value::Null, holding(&[axe]))
            .await
            .unwrap();
        assert_eq!(picked, PickedUp::Committed, "{}: axe", d.name());
        assert_eq!(count(&a.row(bram_id).await, axe), 1, "{}", d.name());
        // Her copy on b never held it again, and its next save keeps it so.
        b.runtime.save_now(there.copy).await.unwrap();
        assert_eq!(count(&a.row(aria_id).await, axe), 0, "{}", d.name());
        let bram_holds = rt
            .read(bram, |s| {
                [gem, ore, axe]
                    .iter()
                    .all(|i| count(&Value::Object(s.clone()), *i) == 1)
            })
            .unwrap();
        assert!(bram_holds, "{}", d.name());
        a.stop().await;
        b.stop().await;
    }
}

/// An offline grant lands on the acquirer's row while its copy plays (the copy takes it in at
/// its next write): the pickup's commit meets the row moved, merges the grant into the copy and
/// commits again — the item and the grant both held, each once.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_pickup_whose_acquirer_row_moved_merges_and_commits_again(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        let a = Live::with(&d, &redis, LiveConfig::new("shard-a")).await;
        let rt = &a.runtime;
        let gem = Uuid::now_v7();
        let (_, aria) = a.player("Aria").await;
        let (bram_id, bram) = a.player("Bram").await;
        rt.update(aria, holding(&[gem])).unwrap();
        rt.save_now(aria).await.unwrap();
        rt.save_now(bram).await.unwrap();
        rt.grant_offline(bram_id, "gift-40", coins(40))
            .await
            .unwrap();
        a.row_reaches(bram_id, "currency", 40).await;
        // The copy has not taken the gift in yet.
        let before = rt.read(bram, |s| s.get("currency").cloned()).unwrap();
        assert_ne!(before, Some(Value::from(40)), "{}", d.name());
        rt.update(aria, without(gem)).unwrap();
        let mark = rt.release(aria).unwrap();
        let picked = rt
            .pick_up(bram, gem, Some(mark), Value::Null, holding(&[gem]))
            .await
            .unwrap();
        assert_eq!(picked, PickedUp::Committed, "{}", d.name());
        let row = a.row(bram_id).await;
        assert_eq!((count(&row, gem), row["currency"].clone()), (1, 40.into()));
        let live = rt
            .read(bram, |s| {
                let s = Value::Object(s.clone());
                (count(&s, gem), s["currency"].clone())
            })
            .unwrap();
        assert_eq!(live, (1, 40.into()), "{}", d.name());
        a.stop().await;
    }
}
