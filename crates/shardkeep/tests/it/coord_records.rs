use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;
use redis::AsyncCommands;
use shardkeep::coord::maintain_once;
use shardkeep::coord::{
    CoordError, InstanceRecord, NonceRegistration, PresenceRecord, ResumeLedgerRecord,
    ThrottlePolicy, ThrottleStatus, TransferActivation,
};
use shardkeep::{Ttl, TtlError};
use shardkeep_testkit::{CoordDriver, coord_drivers};

fn presence(account: &str, character: &str, session: &str, ttl_ms: i64) -> PresenceRecord {
    PresenceRecord {
        account_id: account.into(),
        character_id: character.into(),
        session_token: session.into(),
        shard_id: "shard-1".into(),
        zone_id: Some("midgaard".into()),
        expires_at: Utc::now() + chrono::Duration::milliseconds(ttl_ms),
    }
}

#[tokio::test]
async fn presence_reads_by_account_and_character_with_derived_ttl() {
    for d in coord_drivers().await {
        let coord = d.coordination();
        let record = presence("acc-1", "chr-1", "s-1", 30_000);
        coord.presence_put(&record).await.unwrap();
        assert_eq!(
            coord.presence_by_account("acc-1").await.unwrap(),
            Some(record.clone()),
            "{}",
            d.name()
        );
        assert_eq!(
            coord.presence_by_character("chr-1").await.unwrap(),
            Some(record)
        );
        let pttl = d
            .pttl(&d.keys().presence_account("acc-1").unwrap())
            .await
            .unwrap();
        assert!((28_000..=30_000).contains(&pttl), "{} {pttl}", d.name());
    }
}

#[tokio::test]
async fn presence_in_the_past_is_rejected_and_nothing_written() {
    for d in coord_drivers().await {
        presence_in_the_past_on(&d).await;
    }
}

async fn presence_in_the_past_on(d: &CoordDriver) {
    let coord = d.coordination();
    let err = coord
        .presence_put(&presence("acc", "chr", "s", -1_000))
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        CoordError::InvalidTtl(TtlError::NotPositive { .. })
    ));
    let err = coord
        .presence_put(&presence("", "chr", "s", 1_000))
        .await
        .unwrap_err();
    assert!(matches!(err, CoordError::InvalidKey(_)));
    assert!(d.all_keys().await.is_empty(), "{}", d.name());
}

#[tokio::test]
async fn presence_reads_prune_expired_index_members() {
    for d in coord_drivers().await {
        presence_prune_on(&d).await;
    }
}

async fn presence_prune_on(d: &CoordDriver) {
    let coord = d.coordination();
    for (account, character, ttl) in [
        ("acc-1", "chr-1", 100),
        ("acc-2", "chr-2", 100),
        ("acc-3", "chr-3", 60_000),
    ] {
        let session = format!("s-{account}");
        coord
            .presence_put(&presence(account, character, &session, ttl))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let accounts = d.keys().presence_account_index();
    if let Some(redis) = d.redis() {
        let mut raw = redis.raw().await;
        assert_eq!(
            raw.scard::<_, usize>(&accounts).await.unwrap(),
            3,
            "members outlive records"
        );
    } else {
        assert_eq!(d.stored_rows().await, 6, "expired rows stay until swept");
    }

    assert_eq!(coord.presence_by_account("acc-1").await.unwrap(), None);
    if let Some(redis) = d.redis() {
        let mut raw = redis.raw().await;
        assert!(
            !raw.sismember::<_, _, bool>(&accounts, "acc-1")
                .await
                .unwrap()
        );
    }

    let pruned = coord.presence_prune(1000).await.unwrap();
    let stale = if d.redis().is_some() {
        "acc-2, chr-1 and chr-2 were stale (acc-1 went on read)"
    } else {
        "acc-1, acc-2, chr-1 and chr-2 had expired"
    };
    let expected = if d.redis().is_some() { 3 } else { 4 };
    assert_eq!(pruned.removed, expected, "{stale}");
    let mut left = vec![
        d.keys().presence_account("acc-3").unwrap(),
        d.keys().presence_character("chr-3").unwrap(),
    ];
    if d.redis().is_some() {
        left.extend([accounts.clone(), d.keys().presence_character_index()]);
    }
    left.sort();
    assert_eq!(d.all_keys().await, left, "{}", d.name());
    assert_eq!(
        d.stored_rows().await,
        d.all_keys().await.len(),
        "{}",
        d.name()
    );
    if let Some(redis) = d.redis() {
        let mut raw = redis.raw().await;
        let left: Vec<String> = raw.smembers(&accounts).await.unwrap();
        assert_eq!(left, vec!["acc-3".to_string()]);
        let characters: Vec<String> = raw
            .smembers(redis.keys().presence_character_index())
            .await
            .unwrap();
        assert_eq!(characters, vec!["chr-3".to_string()]);
    }
}

#[tokio::test]
async fn presence_reads_delete_mismatched_records() {
    for d in coord_drivers().await {
        presence_mismatch_on(&d).await;
    }
}

async fn presence_mismatch_on(d: &CoordDriver) {
    let coord = d.coordination();
    coord
        .presence_put(&presence("acc-1", "chr-1", "s-1", 60_000))
        .await
        .unwrap();
    // The account moves on to another character: chr-1's record is now stale.
    let newer = presence("acc-1", "chr-2", "s-2", 60_000);
    coord.presence_put(&newer).await.unwrap();
    assert_eq!(coord.presence_by_character("chr-1").await.unwrap(), None);
    assert!(
        !d.exists(&d.keys().presence_character("chr-1").unwrap())
            .await,
        "{}",
        d.name()
    );
    assert_eq!(
        coord.presence_by_account("acc-1").await.unwrap(),
        Some(newer.clone())
    );
    assert_eq!(
        coord.presence_by_character("chr-2").await.unwrap(),
        Some(newer)
    );

    // An account record whose character record names another session is deleted on read.
    coord
        .presence_put(&presence("acc-9", "chr-9", "s-old", 60_000))
        .await
        .unwrap();
    let mut drifted = presence("acc-9", "chr-9", "s-new", 60_000);
    drifted.account_id = "acc-other".into();
    coord.presence_put(&drifted).await.unwrap();
    assert_eq!(coord.presence_by_account("acc-9").await.unwrap(), None);
    assert!(
        !d.exists(&d.keys().presence_account("acc-9").unwrap()).await,
        "{}",
        d.name()
    );
}

fn instance(id: &str) -> InstanceRecord {
    InstanceRecord {
        instance_id: id.into(),
        service: "game_server".into(),
        address: "127.0.0.1:9000".into(),
        shard_id: Some("shard-1".into()),
        registered_at: Utc::now(),
    }
}

#[tokio::test]
async fn registry_listing_prunes_lapsed_instances() {
    for d in coord_drivers().await {
        registry_on(&d).await;
    }
}

async fn registry_on(d: &CoordDriver) {
    let coord = d.coordination();
    coord
        .registry_register(&instance("a"), Ttl::from_secs(60).unwrap())
        .await
        .unwrap();
    coord
        .registry_register(&instance("b"), Ttl::from_millis(100).unwrap())
        .await
        .unwrap();
    let listed = coord.registry_list().await.unwrap();
    assert_eq!(listed.instances.len(), 2, "{}", d.name());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !coord
            .registry_heartbeat("b", Ttl::from_secs(60).unwrap())
            .await
            .unwrap()
    );
    assert!(
        coord
            .registry_heartbeat("a", Ttl::from_secs(90).unwrap())
            .await
            .unwrap()
    );
    let listed = coord.registry_list().await.unwrap();
    assert_eq!(listed.pruned, 1, "{}", d.name());
    assert_eq!(
        listed.instances,
        vec![instance_with_time("a", &listed.instances[0])]
    );
    if let Some(redis) = d.redis() {
        let mut raw = redis.raw().await;
        let members: Vec<String> = raw.smembers(redis.keys().registry_index()).await.unwrap();
        assert_eq!(members, vec!["a".to_string()]);
    }
    assert_eq!(
        d.stored_rows().await,
        d.all_keys().await.len(),
        "{}",
        d.name()
    );
    let ttl = d
        .pttl(&d.keys().registry_instance("a").unwrap())
        .await
        .unwrap();
    assert!(ttl > 60_000, "heartbeat extended the registration: {ttl}");
    coord.registry_deregister("a").await.unwrap();
    assert!(coord.registry_list().await.unwrap().instances.is_empty());
}

fn instance_with_time(id: &str, listed: &InstanceRecord) -> InstanceRecord {
    InstanceRecord {
        registered_at: listed.registered_at,
        ..instance(id)
    }
}

#[tokio::test]
async fn a_nonce_registers_once_inside_the_skew_window() {
    for d in coord_drivers().await {
        let coord = d.coordination();
        let nonce = "n0nce-0123456789abcdef";
        let register = |key_id: &'static str| {
            let coord = coord.clone();
            async move {
                coord
                    .nonce_register(key_id, nonce, Duration::from_secs(300))
                    .await
                    .unwrap()
            }
        };
        assert_eq!(register("ops").await, NonceRegistration::Registered);
        assert_eq!(
            register("ops").await,
            NonceRegistration::Replayed,
            "{}",
            d.name()
        );
        // The same nonce under another key id is a different request.
        assert_eq!(register("ci").await, NonceRegistration::Registered);
        let ttl = d
            .pttl(&d.keys().internal_nonce("ops", nonce).unwrap())
            .await
            .unwrap();
        assert!(
            (596_000..=601_000).contains(&ttl),
            "a nonce lives twice the skew window plus a second: {} {ttl}",
            d.name()
        );
    }
}

#[tokio::test]
async fn a_nonce_registers_again_once_its_record_expired() {
    for d in coord_drivers().await {
        let coord = d.coordination();
        let key = d.keys().internal_nonce("ops", "n-1").unwrap();
        d.set_raw(&key, b"1").await;
        assert_eq!(
            coord
                .nonce_register("ops", "n-1", Duration::from_secs(1))
                .await
                .unwrap(),
            NonceRegistration::Replayed,
            "{}",
            d.name()
        );
        d.delete_raw(&key).await;
        assert_eq!(
            coord
                .nonce_register("ops", "n-1", Duration::from_secs(1))
                .await
                .unwrap(),
            NonceRegistration::Registered,
            "{}",
            d.name()
        );
    }
}

#[tokio::test]
async fn the_throttle_admits_exactly_max_attempts_in_a_window() {
    for d in coord_drivers().await {
        throttle_on(&d).await;
    }
}

async fn throttle_on(d: &CoordDriver) {
    let coord = d.coordination();
    let policy = ThrottlePolicy {
        max_attempts: 3,
        window: Ttl::from_millis(400).unwrap(),
    };
    for remaining in [2, 1, 0] {
        assert_eq!(
            coord.login_attempt("acc-1", policy).await.unwrap(),
            ThrottleStatus::Allowed { remaining },
            "{}",
            d.name()
        );
    }
    let ThrottleStatus::Throttled { retry_after } =
        coord.login_attempt("acc-1", policy).await.unwrap()
    else {
        panic!("the fourth attempt must throttle on {}", d.name());
    };
    assert!(retry_after <= Duration::from_millis(400) && retry_after > Duration::ZERO);
    assert!(matches!(
        coord.login_throttle_check("acc-1", policy).await.unwrap(),
        ThrottleStatus::Throttled { .. }
    ));
    // Another subject is unaffected.
    assert_eq!(
        coord.login_throttle_check("acc-2", policy).await.unwrap(),
        ThrottleStatus::Allowed { remaining: 2 }
    );
    tokio::time::sleep(retry_after + Duration::from_millis(50)).await;
    assert_eq!(
        coord.login_attempt("acc-1", policy).await.unwrap(),
        ThrottleStatus::Allowed { remaining: 2 },
        "a new window starts after the old one ends ({})",
        d.name()
    );
    coord.login_throttle_reset("acc-1").await.unwrap();
    assert_eq!(
        coord.login_throttle_check("acc-1", policy).await.unwrap(),
        ThrottleStatus::Allowed { remaining: 2 }
    );
    // Exactly at the limit, a check says the next attempt is refused.
    for _ in 0..3 {
        coord.login_attempt("acc-3", policy).await.unwrap();
    }
    assert!(matches!(
        coord.login_throttle_check("acc-3", policy).await.unwrap(),
        ThrottleStatus::Throttled { .. }
    ));
}

#[tokio::test]
async fn resume_ledger_store_load_delete() {
    for d in coord_drivers().await {
        let coord = d.coordination();
        let record = ResumeLedgerRecord {
            session_token: "s-1".into(),
            character_id: "chr-1".into(),
            last_applied_seq: 42,
            zone_id: "darkwood".into(),
            recorded_at: Utc::now(),
        };
        coord
            .resume_store(&record, Ttl::from_secs(120).unwrap())
            .await
            .unwrap();
        assert_eq!(
            coord.resume_load("s-1").await.unwrap(),
            Some(record),
            "{}",
            d.name()
        );
        assert!(coord.resume_delete("s-1").await.unwrap());
        assert!(!coord.resume_delete("s-1").await.unwrap());
        assert_eq!(coord.resume_load("s-1").await.unwrap(), None);
    }
}

#[tokio::test]
async fn a_corrupt_resume_record_is_a_decode_error() {
    for d in coord_drivers().await {
        let coord = d.coordination();
        d.set_raw(&d.keys().resume_ledger("s-1").unwrap(), b"{not json")
            .await;
        assert!(
            matches!(
                coord.resume_load("s-1").await.unwrap_err(),
                CoordError::Decode { .. }
            ),
            "{}",
            d.name()
        );
    }
}

fn activation(token: &str) -> TransferActivation {
    TransferActivation {
        transfer_token: token.into(),
        target_shard: "shard-2".into(),
        target_zone: "darkwood".into(),
        activated_at: Utc::now(),
    }
}

#[tokio::test]
async fn reconcile_removes_markers_without_a_live_pending_token() {
    for d in coord_drivers().await {
        reconcile_on(&d).await;
    }
}

async fn reconcile_on(d: &CoordDriver) {
    let neighbour = d.neighbour().await;
    let coord = d.coordination();
    let ttl = Ttl::from_secs(600).unwrap();
    for token in ["t-live", "t-stale-1", "t*stale"] {
        coord
            .transfer_marker_set(&activation(token), ttl)
            .await
            .unwrap();
    }
    neighbour
        .coordination()
        .transfer_marker_set(&activation("t-stale-1"), ttl)
        .await
        .unwrap();
    let live: HashSet<String> = ["t-live".to_string()].into();
    let report = coord
        .transfer_markers_reconcile(&live, 10_000)
        .await
        .unwrap();
    let mut removed = report.removed.clone();
    removed.sort();
    assert_eq!(
        removed,
        vec!["t*stale".to_string(), "t-stale-1".to_string()],
        "{}",
        d.name()
    );
    assert!(report.complete);
    assert!(coord.transfer_marker_get("t-live").await.unwrap().is_some());
    assert!(
        coord
            .transfer_marker_get("t-stale-1")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        neighbour
            .coordination()
            .transfer_marker_get("t-stale-1")
            .await
            .unwrap()
            .is_some(),
        "another namespace is never touched ({})",
        d.name()
    );
}

/// Markers for two transfers whose handoffs were both taken: "pending" (its source has not
/// completed it) and "done" (no longer pending: its record is gone).
async fn pending_and_done_markers(d: &CoordDriver) {
    use shardkeep::HandoffScope;
    let coord = d.coordination();
    let ttl = Ttl::from_secs(600).unwrap();
    for token in ["pending", "done"] {
        coord.transfer_begin(token, ttl).await.unwrap();
        coord
            .handoff_put(token, &HandoffScope::Instance("i".into()), b"x", ttl)
            .await
            .unwrap();
        coord
            .handoff_take(token, &[HandoffScope::Instance("i".into())])
            .await
            .unwrap();
        coord
            .transfer_marker_set(&activation(token), ttl)
            .await
            .unwrap();
    }
    d.delete_raw(&d.keys().transfer_pending("done").unwrap())
        .await;
}

#[tokio::test]
async fn reconcile_as_a_game_server_keeps_pending_transfers_only() {
    for d in coord_drivers().await {
        let coord = d.coordination();
        pending_and_done_markers(&d).await;
        let report = coord
            .transfer_markers_reconcile_pending(1000)
            .await
            .unwrap();
        assert_eq!(report.removed, vec!["done".to_string()], "{}", d.name());
        assert!(
            coord
                .transfer_marker_get("pending")
                .await
                .unwrap()
                .is_some()
        );
    }
}

#[tokio::test]
async fn a_maintenance_pass_registers_reconciles_and_prunes() {
    for d in coord_drivers().await {
        maintenance_on(&d).await;
    }
}

async fn maintenance_on(d: &CoordDriver) {
    let coord = d.coordination();
    pending_and_done_markers(d).await;
    coord
        .presence_put(&presence("acc-1", "chr-1", "s-1", 100))
        .await
        .unwrap();
    coord
        .registry_register(&instance("lapsed"), Ttl::from_millis(100).unwrap())
        .await
        .unwrap();
    coord
        .resume_store(
            &ResumeLedgerRecord {
                session_token: "s-gone".into(),
                character_id: "chr-1".into(),
                last_applied_seq: 1,
                zone_id: "darkwood".into(),
                recorded_at: Utc::now(),
            },
            Ttl::from_millis(100).unwrap(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let me = instance("me");
    let first = maintain_once(&coord, &me, Ttl::from_secs(30).unwrap()).await;
    assert!(first.registered, "not registered yet");
    assert_eq!(first.markers_removed, 1, "{}", d.name());
    assert_eq!(first.presence_pruned, 2, "account and character members");
    assert_eq!(first.registry_pruned, 1);
    assert_eq!(first.failed_steps, 0);
    let swept = if d.redis().is_some() { 0 } else { 1 };
    assert_eq!(
        first.expired_swept,
        swept,
        "the expired resume record is deleted from the file ({})",
        d.name()
    );
    assert_eq!(
        d.stored_rows().await,
        d.all_keys().await.len(),
        "{}",
        d.name()
    );
    assert!(
        coord
            .transfer_marker_get("pending")
            .await
            .unwrap()
            .is_some()
    );
    let listed = coord.registry_list().await.unwrap();
    assert_eq!(listed.instances, vec![me.clone()]);

    let second = maintain_once(&coord, &me, Ttl::from_secs(30).unwrap()).await;
    assert_eq!(
        second,
        shardkeep::coord::MaintenancePass::default(),
        "a heartbeat keeps it; nothing left to remove ({})",
        d.name()
    );
}

#[tokio::test]
async fn a_maintenance_pass_with_the_store_cut_off_reports_every_step_failed() {
    for d in coord_drivers().await {
        let (coord, _guard) = d.cut_off(Duration::from_secs(30)).await;
        let pass = maintain_once(&coord, &instance("me"), Ttl::from_secs(30).unwrap()).await;
        let steps = if d.redis().is_some() { 4 } else { 5 };
        assert_eq!(pass.failed_steps, steps, "{}", d.name());
        assert!(!pass.registered);
    }
}

#[tokio::test]
async fn sessions_and_console_sessions_live_until_deleted_or_expired() {
    for d in coord_drivers().await {
        let coord = d.coordination();
        let short = Ttl::from_millis(100).unwrap();
        coord
            .session_activate("s-1", Ttl::from_secs(60).unwrap())
            .await
            .unwrap();
        coord.session_activate("s-2", short).await.unwrap();
        coord
            .console_session_store("digest-1", short)
            .await
            .unwrap();
        coord
            .console_session_store("digest-2", Ttl::from_secs(60).unwrap())
            .await
            .unwrap();
        assert!(
            coord.session_is_active("s-1").await.unwrap(),
            "{}",
            d.name()
        );
        assert!(coord.console_session_exists("digest-1").await.unwrap());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !coord.session_is_active("s-2").await.unwrap(),
            "an expired session is inactive at once ({})",
            d.name()
        );
        assert!(!coord.console_session_exists("digest-1").await.unwrap());
        // A refresh extends a live marker, and never sets one that was cleared or expired.
        assert!(
            coord.session_refresh("s-1", short).await.unwrap(),
            "{}",
            d.name()
        );
        assert!(
            !coord.session_refresh("s-2", short).await.unwrap(),
            "{}",
            d.name()
        );
        assert!(
            !coord.session_is_active("s-2").await.unwrap(),
            "{}",
            d.name()
        );
        coord.session_deactivate("s-1").await.unwrap();
        assert!(
            !coord.session_refresh("s-1", short).await.unwrap(),
            "{}",
            d.name()
        );
        coord.console_session_delete("digest-2").await.unwrap();
        assert!(!coord.session_is_active("s-1").await.unwrap());
        assert!(!coord.console_session_exists("digest-2").await.unwrap());
        assert!(coord.session_activate("", short).await.is_err());
        assert!(d.all_keys().await.is_empty(), "{}", d.name());
    }
}

#[tokio::test]
async fn a_sessions_refresh_extends_what_is_there_and_writes_back_nothing_missing() {
    for d in coord_drivers().await {
        let coord = d.coordination();
        let short = Ttl::from_secs(2).unwrap();
        let long = Ttl::from_secs(60).unwrap();
        let session = |n: u8| shardkeep::coord::LiveSession {
            session_token: format!("s-{n}"),
            account_id: format!("acc-{n}"),
            character_id: format!("chr-{n}"),
        };
        // s-1: marker and presence; s-2: the marker only; s-3: nothing (its stream closed).
        coord.session_activate("s-1", short).await.unwrap();
        let written = presence("acc-1", "chr-1", "s-1", 2_000);
        coord.presence_put(&written).await.unwrap();
        coord.session_activate("s-2", short).await.unwrap();
        let found = coord
            .sessions_refresh(&[session(1), session(2), session(3)], long)
            .await
            .unwrap();
        let refreshed = |marker, presence| shardkeep::coord::SessionRefreshed { marker, presence };
        assert_eq!(
            found,
            vec![
                refreshed(true, true),
                refreshed(true, false),
                refreshed(false, false)
            ],
            "{}",
            d.name()
        );
        for key in [
            d.keys().active_session("s-1").unwrap(),
            d.keys().presence_account("acc-1").unwrap(),
            d.keys().presence_character("chr-1").unwrap(),
            d.keys().active_session("s-2").unwrap(),
        ] {
            let pttl = d.pttl(&key).await.unwrap();
            assert!(
                (58_000..=60_000).contains(&pttl),
                "{} {key}: {pttl}",
                d.name()
            );
        }
        assert!(
            !coord.session_is_active("s-3").await.unwrap(),
            "{}",
            d.name()
        );
        assert_eq!(coord.presence_by_character("chr-2").await.unwrap(), None);
        assert_eq!(coord.presence_by_character("chr-3").await.unwrap(), None);
        // The record reads back as written, with the lapse the refresh gave it.
        let read = coord.presence_by_character("chr-1").await.unwrap().unwrap();
        assert_eq!(read.session_token, "s-1", "{}", d.name());
        let left = read.expires_at - Utc::now();
        assert!(left > chrono::Duration::seconds(55), "{}: {left}", d.name());
        let by_account = coord.presence_by_account("acc-1").await.unwrap().unwrap();
        assert!(
            by_account.expires_at - Utc::now() > chrono::Duration::seconds(55),
            "{}",
            d.name()
        );
        // Nothing to refresh is no call; a malformed token refuses the whole batch before
        // anything is extended.
        assert_eq!(coord.sessions_refresh(&[], long).await.unwrap(), vec![]);
        let mut bad = session(1);
        bad.session_token = String::new();
        assert!(
            coord
                .sessions_refresh(&[session(2), bad], Ttl::from_secs(600).unwrap())
                .await
                .is_err(),
            "{}",
            d.name()
        );
        let pttl = d
            .pttl(&d.keys().active_session("s-2").unwrap())
            .await
            .unwrap();
        assert!(pttl <= 60_000, "{} extended: {pttl}", d.name());
    }
}
