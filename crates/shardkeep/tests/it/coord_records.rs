use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;
use redis::AsyncCommands;
use shardkeep::coord::{
    CoordError, InstanceRecord, NonceRegistration, PresenceRecord, ResumeLedgerRecord,
    ThrottlePolicy, ThrottleStatus, TransferActivation,
};
use shardkeep::{Ttl, TtlError};
use shardkeep_testkit::TestRedis;

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
    let redis = TestRedis::new().await;
    let coord = redis.coordination();
    let record = presence("acc-1", "chr-1", "s-1", 30_000);
    coord.presence_put(&record).await.unwrap();
    assert_eq!(
        coord.presence_by_account("acc-1").await.unwrap(),
        Some(record.clone())
    );
    assert_eq!(
        coord.presence_by_character("chr-1").await.unwrap(),
        Some(record)
    );
    let mut raw = redis.raw().await;
    let pttl: i64 = raw
        .pttl(redis.keys().presence_account("acc-1").unwrap())
        .await
        .unwrap();
    assert!((28_000..=30_000).contains(&pttl), "{pttl}");
}

#[tokio::test]
async fn presence_in_the_past_is_rejected_and_nothing_written() {
    let redis = TestRedis::new().await;
    let coord = redis.coordination();
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
    assert!(redis.all_keys().await.is_empty());
}

#[tokio::test]
async fn presence_reads_prune_expired_index_members() {
    let redis = TestRedis::new().await;
    let coord = redis.coordination();
    coord
        .presence_put(&presence("acc-1", "chr-1", "s-1", 100))
        .await
        .unwrap();
    coord
        .presence_put(&presence("acc-2", "chr-2", "s-2", 100))
        .await
        .unwrap();
    coord
        .presence_put(&presence("acc-3", "chr-3", "s-3", 60_000))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut raw = redis.raw().await;
    let accounts = redis.keys().presence_account_index();
    assert_eq!(
        raw.scard::<_, usize>(&accounts).await.unwrap(),
        3,
        "members outlive records"
    );

    assert_eq!(coord.presence_by_account("acc-1").await.unwrap(), None);
    assert!(
        !raw.sismember::<_, _, bool>(&accounts, "acc-1")
            .await
            .unwrap()
    );

    let pruned = coord.presence_prune(1000).await.unwrap();
    assert_eq!(pruned.removed, 3, "acc-2, chr-1 and chr-2 were stale");
    let mut left: Vec<String> = raw.smembers(&accounts).await.unwrap();
    left.sort();
    assert_eq!(left, vec!["acc-3".to_string()]);
    let characters: Vec<String> = raw
        .smembers(redis.keys().presence_character_index())
        .await
        .unwrap();
    assert_eq!(characters, vec!["chr-3".to_string()]);
}

#[tokio::test]
async fn presence_reads_delete_mismatched_records() {
    let redis = TestRedis::new().await;
    let coord = redis.coordination();
    coord
        .presence_put(&presence("acc-1", "chr-1", "s-1", 60_000))
        .await
        .unwrap();
    // The account moves on to another character: chr-1's record is now stale.
    let newer = presence("acc-1", "chr-2", "s-2", 60_000);
    coord.presence_put(&newer).await.unwrap();
    assert_eq!(coord.presence_by_character("chr-1").await.unwrap(), None);
    let mut raw = redis.raw().await;
    assert!(
        !raw.exists::<_, bool>(redis.keys().presence_character("chr-1").unwrap())
            .await
            .unwrap()
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
        !raw.exists::<_, bool>(redis.keys().presence_account("acc-9").unwrap())
            .await
            .unwrap()
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
    let redis = TestRedis::new().await;
    let coord = redis.coordination();
    coord
        .registry_register(&instance("a"), Ttl::from_secs(60).unwrap())
        .await
        .unwrap();
    coord
        .registry_register(&instance("b"), Ttl::from_millis(100).unwrap())
        .await
        .unwrap();
    let listed = coord.registry_list().await.unwrap();
    assert_eq!(listed.instances.len(), 2);
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
    assert_eq!(listed.pruned, 1);
    assert_eq!(
        listed.instances,
        vec![instance_with_time("a", &listed.instances[0])]
    );
    let mut raw = redis.raw().await;
    let members: Vec<String> = raw.smembers(redis.keys().registry_index()).await.unwrap();
    assert_eq!(members, vec!["a".to_string()]);
    let ttl: i64 = raw
        .ttl(redis.keys().registry_instance("a").unwrap())
        .await
        .unwrap();
    assert!(ttl > 60, "heartbeat extended the registration: {ttl}");
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
    let redis = TestRedis::new().await;
    let coord = redis.coordination();
    let nonce = "n0nce-0123456789abcdef";
    assert_eq!(
        coord
            .nonce_register("ops", nonce, Duration::from_secs(300))
            .await
            .unwrap(),
        NonceRegistration::Registered
    );
    assert_eq!(
        coord
            .nonce_register("ops", nonce, Duration::from_secs(300))
            .await
            .unwrap(),
        NonceRegistration::Replayed
    );
    // The same nonce under another key id is a different request.
    assert_eq!(
        coord
            .nonce_register("ci", nonce, Duration::from_secs(300))
            .await
            .unwrap(),
        NonceRegistration::Registered
    );
    let mut raw = redis.raw().await;
    let ttl: i64 = raw
        .ttl(redis.keys().internal_nonce("ops", nonce).unwrap())
        .await
        .unwrap();
    assert!(
        (596..=601).contains(&ttl),
        "a nonce lives twice the skew window plus a second: {ttl}"
    );
}

#[tokio::test]
async fn the_throttle_admits_exactly_max_attempts_in_a_window() {
    let redis = TestRedis::new().await;
    let coord = redis.coordination();
    let policy = ThrottlePolicy {
        max_attempts: 3,
        window: Ttl::from_millis(400).unwrap(),
    };
    for remaining in [2, 1, 0] {
        assert_eq!(
            coord.login_attempt("acc-1", policy).await.unwrap(),
            ThrottleStatus::Allowed { remaining }
        );
    }
    let ThrottleStatus::Throttled { retry_after } =
        coord.login_attempt("acc-1", policy).await.unwrap()
    else {
        panic!("the fourth attempt must throttle");
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
        "a new window starts after the old one ends"
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
    let redis = TestRedis::new().await;
    let coord = redis.coordination();
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
    assert_eq!(coord.resume_load("s-1").await.unwrap(), Some(record));
    assert!(coord.resume_delete("s-1").await.unwrap());
    assert!(!coord.resume_delete("s-1").await.unwrap());
    assert_eq!(coord.resume_load("s-1").await.unwrap(), None);
}

#[tokio::test]
async fn a_corrupt_resume_record_is_a_decode_error() {
    let redis = TestRedis::new().await;
    let coord = redis.coordination();
    let mut raw = redis.raw().await;
    let () = raw
        .set(redis.keys().resume_ledger("s-1").unwrap(), "{not json")
        .await
        .unwrap();
    assert!(matches!(
        coord.resume_load("s-1").await.unwrap_err(),
        CoordError::Decode { .. }
    ));
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
    let redis = TestRedis::new().await;
    let neighbour = TestRedis::new().await;
    let coord = redis.coordination();
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
        vec!["t*stale".to_string(), "t-stale-1".to_string()]
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
        "another namespace is never touched"
    );
}

/// Markers for two transfers whose handoffs were both taken: "pending" (its source has not
/// completed it) and "done" (no longer pending: its record is gone).
async fn pending_and_done_markers(redis: &TestRedis) {
    use shardkeep::HandoffScope;
    let coord = redis.coordination();
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
    let mut raw = redis.raw().await;
    let _: i64 = raw
        .del(redis.keys().transfer_pending("done").unwrap())
        .await
        .unwrap();
}

#[tokio::test]
async fn reconcile_as_a_game_server_keeps_pending_transfers_only() {
    let redis = TestRedis::new().await;
    let coord = redis.coordination();
    pending_and_done_markers(&redis).await;
    let report = coord
        .transfer_markers_reconcile_pending(1000)
        .await
        .unwrap();
    assert_eq!(report.removed, vec!["done".to_string()]);
    assert!(
        coord
            .transfer_marker_get("pending")
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn a_maintenance_pass_registers_reconciles_and_prunes() {
    use shardkeep::coord::maintain_once;
    let redis = TestRedis::new().await;
    let coord = redis.coordination();
    pending_and_done_markers(&redis).await;
    coord
        .presence_put(&presence("acc-1", "chr-1", "s-1", 100))
        .await
        .unwrap();
    coord
        .registry_register(&instance("lapsed"), Ttl::from_millis(100).unwrap())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let me = instance("me");
    let first = maintain_once(&coord, &me, Ttl::from_secs(30).unwrap()).await;
    assert!(first.registered, "not registered yet");
    assert_eq!(first.markers_removed, 1);
    assert_eq!(first.presence_pruned, 2, "account and character members");
    assert_eq!(first.registry_pruned, 1);
    assert_eq!(first.failed_steps, 0);
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
        "a heartbeat keeps it; nothing left to remove"
    );
}

#[tokio::test]
async fn a_maintenance_pass_with_redis_cut_off_reports_every_step_failed() {
    use shardkeep::backend::redis::RedisTimeouts;
    use shardkeep::coord::maintain_once;
    use shardkeep_testkit::faults::{ProxyControl, ProxyMode};
    let redis = TestRedis::new().await;
    let timeouts = RedisTimeouts {
        connect: Duration::from_millis(300),
        response: Duration::from_millis(300),
    };
    let (proxy, cut) = shardkeep_testkit::faults::proxied_redis(
        &shardkeep_testkit::redis_url(),
        redis.keys().clone(),
        timeouts,
    )
    .await
    .unwrap();
    let coord = shardkeep::Coordination::new(cut, shardkeep::CoordinationConfig::default());
    proxy.set_mode(ProxyMode::Cut);
    let pass = maintain_once(&coord, &instance("me"), Ttl::from_secs(30).unwrap()).await;
    assert_eq!(pass.failed_steps, 4);
    assert!(!pass.registered);
}
