//! Logins that find a copy of their character held here: resumed while it still owns the
//! character, claimed afresh once a newer claim elsewhere superseded it.

use shardkeep::live::{LiveConfig, SessionStart};
use shardkeep_testkit::{JobDrivers, TestRedis};
use sqlx::PgPool;

use super::live_runtime::{Live, set};

/// A login that reaches a shard still holding a copy a newer claim superseded (the player
/// logged in elsewhere, and this login came by a stale route) claims afresh, loading what the
/// newer owner saved, and the zombie is evicted — instead of being resumed to play until its
/// next save meets the fence, losing what the player did on it.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_login_does_not_resume_a_copy_a_newer_claim_superseded(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    for d in drivers.drivers() {
        // Shard a runs no cadence of its own: its next checkpoint, refused once b's login took
        // the checkpoint over, would evict the zombie before the login this test makes.
        let mut config = LiveConfig::new("shard-a");
        config.own_pulse = false;
        let a = Live::with(&d, &redis, config).await;
        let b = Live::on(&d, &redis, "shard-b").await;
        let (id, first) = a.player("Ione").await;
        set(first, &a.runtime, "experience", 5);
        a.runtime.save_now(first).await.unwrap();
        let on_b = b.runtime.login(id, SessionStart::default()).await.unwrap();
        assert!(on_b.copy.owner_epoch > first.owner_epoch, "{}", d.name());
        set(on_b.copy, &b.runtime, "experience", 9);
        b.runtime.save_now(on_b.copy).await.unwrap();
        let again = a.runtime.login(id, SessionStart::default()).await.unwrap();
        assert!(
            again.resumed.is_none(),
            "{}: the superseded copy was resumed",
            d.name()
        );
        assert!(
            again.copy.owner_epoch > on_b.copy.owner_epoch,
            "{}",
            d.name()
        );
        assert_eq!(a.runtime.copy_of(id), Some(again.copy), "{}", d.name());
        assert_eq!(
            a.runtime
                .read(again.copy, |s| s["experience"].clone())
                .unwrap(),
            9,
            "{}: loaded what the newer owner saved",
            d.name()
        );
        a.stop().await;
        b.stop().await;
    }
}
