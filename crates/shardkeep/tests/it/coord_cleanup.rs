use chrono::Utc;
use redis::AsyncCommands;
use shardkeep::backend::redis::RedisTimeouts;
use shardkeep::coord::{CleanupMode, Coordination, InstanceRecord, PresenceRecord};
use shardkeep::{CoordinationConfig, HandoffScope, RedisBackend, Ttl};
use shardkeep_testkit::{CoordDriver, TestRedis, coord_drivers};

/// Writes one of everything: the three cleanup targets and keys no target may touch.
async fn populate(coord: &Coordination) {
    let ttl = Ttl::from_secs(600).unwrap();
    for i in 0..30 {
        let record = PresenceRecord {
            account_id: format!("acc-{i}"),
            character_id: format!("chr-{i}"),
            session_token: format!("s-{i}"),
            shard_id: "shard-1".into(),
            zone_id: None,
            expires_at: Utc::now() + chrono::Duration::minutes(10),
        };
        coord.presence_put(&record).await.unwrap();
        coord
            .handoff_put(
                &format!("h-{i}"),
                &HandoffScope::Instance("i-1".into()),
                b"x",
                ttl,
            )
            .await
            .unwrap();
    }
    coord
        .handoff_put("h-0", &HandoffScope::Port(7000), b"x", ttl)
        .await
        .unwrap();
    coord
        .handoff_put("taken", &HandoffScope::Instance("i-1".into()), b"x", ttl)
        .await
        .unwrap();
    coord
        .handoff_take("taken", &[HandoffScope::Instance("i-1".into())])
        .await
        .unwrap();
    for i in 0..5 {
        let record = InstanceRecord {
            instance_id: format!("inst-{i}"),
            service: "serve".into(),
            address: "127.0.0.1:7400".into(),
            shard_id: None,
            registered_at: Utc::now(),
        };
        coord.registry_register(&record, ttl).await.unwrap();
    }
    coord
        .nonce_register(
            "ops",
            "nonce-0123456789abcdef",
            std::time::Duration::from_secs(300),
        )
        .await
        .unwrap();
}

/// Index sets the target holds beside its records: Redis keeps `on_redis`, the embedded store
/// none (it finds records by key range).
fn index_sets(d: &CoordDriver, on_redis: u64) -> u64 {
    if d.redis().is_some() { on_redis } else { 0 }
}

#[tokio::test]
async fn dry_run_counts_and_changes_nothing() {
    for d in coord_drivers().await {
        let coord = d.coordination();
        populate(&coord).await;
        let before = d.all_keys().await;
        let presence = coord
            .cleanup_run("presence", CleanupMode::DryRun, 10)
            .await
            .unwrap();
        assert_eq!(
            presence.matched,
            60 + index_sets(&d, 2),
            "30 account + 30 character records and the index sets ({})",
            d.name()
        );
        assert_eq!(presence.deleted, 0);
        assert!(presence.complete);
        let handoff = coord
            .cleanup_run("handoff", CleanupMode::DryRun, 10)
            .await
            .unwrap();
        assert_eq!(handoff.matched, 31, "{}", d.name());
        let registry = coord
            .cleanup_run("registry", CleanupMode::DryRun, 10)
            .await
            .unwrap();
        assert_eq!(registry.matched, 5 + index_sets(&d, 1), "{}", d.name());
        assert_eq!(d.all_keys().await, before, "{}", d.name());
    }
}

#[tokio::test]
async fn a_dry_run_over_more_than_one_page_counts_every_key() {
    for d in coord_drivers().await {
        let coord = d.coordination_with(CoordinationConfig {
            scan_count: 7,
            ..CoordinationConfig::default()
        });
        populate(&coord).await;
        let presence = coord
            .cleanup_run("presence", CleanupMode::DryRun, 10)
            .await
            .unwrap();
        assert_eq!(presence.matched, 60 + index_sets(&d, 2), "{}", d.name());
        assert!(presence.complete);
    }
}

#[tokio::test]
async fn delete_removes_exactly_the_matching_keys() {
    for d in coord_drivers().await {
        delete_exactly_on(&d).await;
    }
}

async fn delete_exactly_on(d: &CoordDriver) {
    let neighbour = d.neighbour().await;
    let coord = d.coordination();
    populate(&coord).await;
    populate(&neighbour.coordination()).await;
    let neighbour_before = neighbour.all_keys().await;
    let before = d.all_keys().await;

    let report = coord
        .cleanup_run("handoff", CleanupMode::Delete, 10_000)
        .await
        .unwrap();
    assert!(report.complete);
    assert_eq!(report.deleted, 31, "{}", d.name());
    let after = d.all_keys().await;
    let mut expected: Vec<String> = before
        .iter()
        .filter(|k| !report.deleted_keys.contains(k))
        .cloned()
        .collect();
    expected.sort();
    assert_eq!(after, expected, "{}", d.name());
    assert!(
        report
            .deleted_keys
            .iter()
            .all(|k| k.contains(":handoff:") && !k.ends_with(":consumed"))
    );
    assert!(
        after.contains(&d.keys().handoff_consumed("taken").unwrap()),
        "consumed markers stay ({})",
        d.name()
    );
    assert_eq!(
        neighbour.all_keys().await,
        neighbour_before,
        "another namespace is untouched ({})",
        d.name()
    );
}

#[tokio::test]
async fn delete_is_bounded_per_call_and_resumable() {
    for d in coord_drivers().await {
        let coord = d.coordination();
        populate(&coord).await;
        let first = coord
            .cleanup_run("presence", CleanupMode::Delete, 25)
            .await
            .unwrap();
        assert_eq!(first.deleted, 25, "{}", d.name());
        assert!(!first.complete);
        let mut total = first.deleted;
        for _ in 0..10 {
            let next = coord
                .cleanup_run("presence", CleanupMode::Delete, 25)
                .await
                .unwrap();
            total += next.deleted;
            if next.complete {
                break;
            }
        }
        assert_eq!(total, 60 + index_sets(&d, 2), "{}", d.name());
        let left = d.all_keys().await;
        assert!(left.iter().all(|k| !k.contains(":presence}")), "{left:?}");
        assert_eq!(coord.registry_list().await.unwrap().instances.len(), 5);
    }
}

#[tokio::test]
async fn cleanup_runs_as_a_user_denied_keys() {
    let admin = TestRedis::new().await;
    let mut raw = admin.raw().await;
    let user = format!("nokeys-{}", uuid::Uuid::new_v4().simple());
    // The user is made on every master (the test may run on a cluster).
    for mut node in admin.backend().master_conns().await.unwrap() {
        let () = redis::cmd("ACL")
            .arg(&["SETUSER", &user, "on", ">pw", "~*", "&*", "+@all", "-keys"][..])
            .query_async(&mut node)
            .await
            .unwrap();
    }
    let url = admin
        .url()
        .replace("redis://", &format!("redis://{user}:pw@"));
    let restricted = RedisBackend::connect(
        "REDIS_URL",
        &url,
        admin.keys().clone(),
        RedisTimeouts::default(),
    )
    .await
    .unwrap();
    let mut as_user = restricted.master_conns().await.unwrap().remove(0);
    let coord = Coordination::new(restricted, CoordinationConfig::default());

    // The ACL really refuses KEYS for this user.
    let denied: redis::RedisResult<Vec<String>> =
        redis::cmd("KEYS").arg("*").query_async(&mut as_user).await;
    assert!(denied.is_err(), "KEYS must be denied for {user}");

    populate(&coord).await;
    let dry = coord
        .cleanup_run("registry", CleanupMode::DryRun, 100)
        .await
        .unwrap();
    assert_eq!(dry.matched, 6);
    let deleted = coord
        .cleanup_run("registry", CleanupMode::Delete, 100)
        .await
        .unwrap();
    assert_eq!(deleted.deleted, 6);
    assert!(coord.registry_list().await.unwrap().instances.is_empty());

    let _: redis::RedisResult<i64> = redis::cmd("ACL")
        .arg(&["DELUSER", &user][..])
        .query_async(&mut raw)
        .await;
    let left: bool = raw.exists(admin.keys().registry_index()).await.unwrap();
    assert!(!left);
}

#[tokio::test]
async fn an_unknown_target_is_rejected() {
    for d in coord_drivers().await {
        let err = d
            .coordination()
            .cleanup_run("everything", CleanupMode::Delete, 10)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("unknown cleanup target"));
        assert!(d.all_keys().await.is_empty(), "{}", d.name());
    }
}
