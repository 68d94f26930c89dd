//! Session records whose writes fail are written again by the runtime: a live copy's placement
//! at its session's next refresh, a logout's tombstone until it lands, a full write a failed
//! refresh owed at the refresh after. The embedded file is where a test can refuse one kind of
//! record write alone (SQLite triggers on its records); the mechanism above the stores is the
//! same on every driver (`placement_records::a_writer_names_…` covers the writer on both).

use std::time::Duration;

use shardkeep::live::{LiveConfig, SessionStart};
use shardkeep_testkit::{JobDriver, JobDrivers, TestRedis};
use sqlx::PgPool;

use super::live_runtime::Live;

const REFUSE: [&str; 2] = [
    "CREATE TRIGGER refuse_placement_insert BEFORE INSERT ON coord_records \
     WHEN NEW.key LIKE '%:placement:%' \
     BEGIN SELECT RAISE(ABORT, 'placement refused by the test'); END",
    "CREATE TRIGGER refuse_placement_update BEFORE UPDATE ON coord_records \
     WHEN NEW.key LIKE '%:placement:%' \
     BEGIN SELECT RAISE(ABORT, 'placement refused by the test'); END",
];

const ALLOW: [&str; 2] = [
    "DROP TRIGGER refuse_placement_insert",
    "DROP TRIGGER refuse_placement_update",
];

/// Presence writes refused (a refresh's extension of them still goes through).
const REFUSE_PRESENCE: [&str; 2] = [
    "CREATE TRIGGER refuse_presence_insert BEFORE INSERT ON coord_records \
     WHEN NEW.key LIKE '%presence}:character:%' \
     BEGIN SELECT RAISE(ABORT, 'presence refused by the test'); END",
    "CREATE TRIGGER refuse_presence_update BEFORE UPDATE ON coord_records \
     WHEN NEW.key LIKE '%presence}:character:%' AND NEW.value IS NOT OLD.value \
     BEGIN SELECT RAISE(ABORT, 'presence refused by the test'); END",
];

const ALLOW_PRESENCE: [&str; 2] = [
    "DROP TRIGGER refuse_presence_insert",
    "DROP TRIGGER refuse_presence_update",
];

/// A refresh's extension of session markers refused: the refresh's one transaction fails.
const REFUSE_REFRESH: [&str; 1] = [
    "CREATE TRIGGER refuse_refresh BEFORE UPDATE ON coord_records \
     WHEN NEW.key LIKE '%session:active%' AND NEW.value IS OLD.value \
     BEGIN SELECT RAISE(ABORT, 'refresh refused by the test'); END",
];

const ALLOW_REFRESH: [&str; 1] = ["DROP TRIGGER refuse_refresh"];

async fn run_all<const N: usize>(d: &JobDriver, statements: [&'static str; N]) {
    let JobDriver::Embedded(file) = d else {
        unreachable!("placement writes are refused on the embedded file")
    };
    for statement in statements {
        sqlx::query(statement).execute(file.pool()).await.unwrap();
    }
}

/// A placement write that fails is written again at the session's next refresh, not only at the
/// periodic full write: a refresh that only extends records finds a placement that is there but
/// wrong, or never written, right.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_placement_write_that_failed_is_written_again_at_the_next_refresh(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    let d = JobDriver::Embedded(drivers.sqlite.backend());
    let mut config = LiveConfig::new("shard-a");
    // Refreshed every 3 s; written in full only every 96 s otherwise.
    config.session_ttl = shardkeep::Ttl::from_secs(9).unwrap();
    let live = Live::with(&d, &redis, config).await;
    run_all(&d, REFUSE).await;
    let (id, _copy) = live.player("Orla").await;
    let placement = live.services.placement.clone();
    // The login's placement write fails (the writer's bound is the runtime's I/O bound).
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(placement.read(id).await.unwrap(), None, "the refusal held");
    run_all(&d, ALLOW).await;
    // Within one refresh (3 s) and its write. Without the repair the placement waits for the
    // periodic full write, which falls in this window for about one character in sixteen (its
    // phase is the character's own): the test then passes for that reason.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    while placement.read(id).await.unwrap().is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the failed placement was not written again by the next refresh"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let placed = placement.read(id).await.unwrap().unwrap();
    assert_eq!(placed.shard_id.as_deref(), Some("shard-a"));
    live.stop().await;
}

/// A logout's tombstone whose write fails is written again until it lands, its copy gone from
/// the runtime: the live placement it replaces would otherwise name this shard for a month
/// (the record's TTL), routing the player's next login here.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_logout_tombstone_that_failed_is_written_again_until_it_lands(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    let d = JobDriver::Embedded(drivers.sqlite.backend());
    let mut config = LiveConfig::new("shard-a");
    // Failed tombstones are written again once an I/O bound at most.
    config.io_timeout = Duration::from_millis(500);
    let live = Live::with(&d, &redis, config).await;
    let (id, copy) = live.player("Orla").await;
    let placement = live.services.placement.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while placement.read(id).await.unwrap().is_none() {
        assert!(tokio::time::Instant::now() < deadline, "never placed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    run_all(&d, REFUSE).await;
    live.runtime.logout(copy).await.unwrap();
    // The tombstone's write is refused, and again at each retry while the refusal holds.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let held = placement.read(id).await.unwrap().unwrap();
    assert!(!held.is_tombstone(), "the refusal held: {held:?}");
    run_all(&d, ALLOW).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let record = placement.read(id).await.unwrap().unwrap();
        if record.is_tombstone() {
            assert_eq!(record.owner_epoch, copy.owner_epoch);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the failed tombstone was not written again: {record:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    live.stop().await;
}

/// A refresh owing a full write whose round trip fails owes it again: here a resume's presence
/// write failed (presence still names the closed session's token, a record that is there but
/// wrong, which an extension does not repair), the next refresh's round trip fails, and the
/// refresh after it writes presence for the resumed session — without the periodic full write
/// (every 32nd refresh), which falls on that refresh for about one character in 32.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_full_write_a_failed_refresh_owed_is_made_by_the_next_refresh(pool: PgPool) {
    let drivers = JobDrivers::new(&pool).await;
    let redis = TestRedis::new().await;
    let d = JobDriver::Embedded(drivers.sqlite.backend());
    let mut config = LiveConfig::new("shard-a");
    // Refreshed every 3 s; written in full only every 96 s otherwise.
    config.session_ttl = shardkeep::Ttl::from_secs(9).unwrap();
    config.link_dead_for = Duration::from_secs(120);
    let live = Live::with(&d, &redis, config).await;
    let (id, first) = live.admitted("Dara").await;
    let coord = live.services.coord.clone();
    let named = || async {
        coord
            .presence_by_character(&id.to_string())
            .await
            .unwrap()
            .map(|p| p.session_token)
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while named().await.as_deref() != Some(first.session_token.as_str()) {
        assert!(tokio::time::Instant::now() < deadline, "never present");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    live.runtime
        .detach(first.copy, &first.session_token, 1)
        .unwrap();
    // The journal worker writes the resume ledger from the closed stream's entry.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while coord
        .resume_load(&first.session_token)
        .await
        .unwrap()
        .is_none()
    {
        assert!(tokio::time::Instant::now() < deadline, "no resume ledger");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    run_all(&d, REFUSE_PRESENCE).await;
    let again = live
        .runtime
        .login(id, SessionStart::default())
        .await
        .unwrap();
    assert!(again.resumed.is_some(), "resumed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Refreshes refused before presence writes are allowed again, so no refresh repairs
    // presence in between (one already past its round trip meets the presence refusal).
    run_all(&d, REFUSE_REFRESH).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    run_all(&d, ALLOW_PRESENCE).await;
    assert_eq!(
        named().await.as_deref(),
        Some(first.session_token.as_str()),
        "the resume's presence write was refused"
    );
    // A refresh (3 s apart) comes and its round trip is refused: half a period more than one,
    // so a pulse running late still brings one.
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    assert_eq!(
        named().await.as_deref(),
        Some(first.session_token.as_str()),
        "nothing wrote presence while refreshes were refused"
    );
    run_all(&d, ALLOW_REFRESH).await;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(4_500);
    while named().await.as_deref() != Some(again.session_token.as_str()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "presence still names the closed session: {:?}",
            named().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    live.stop().await;
}
