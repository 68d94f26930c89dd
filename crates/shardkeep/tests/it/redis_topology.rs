//! The connection layer on whichever topology the suite runs on (standalone, or the cluster
//! `scripts/test` starts): pipelines that span slots, SCAN over every master, the URL list, and
//! the refusal of a server that may evict keys.

use std::time::Duration;

use redis::AsyncCommands;
use shardkeep::backend::redis::{EvictionCheck, RedisOptions, RedisTimeouts, ScanCursor};
use shardkeep::keyspace::slot::key_slot;
use shardkeep::{Keyspace, RedisBackend};
use shardkeep_testkit::{PrivateRedis, TestRedis};

#[tokio::test]
async fn a_pipeline_spanning_many_slots_answers_in_order() {
    let redis = TestRedis::new().await;
    let ns = redis.keys().namespace().to_owned();
    let keys: Vec<String> = (0..300).map(|i| format!("{ns}:pipe:{i}")).collect();
    let slots: std::collections::HashSet<u16> = keys.iter().map(|k| key_slot(k)).collect();
    assert!(slots.len() > 100, "the keys spread over slots");
    let mut pipe = redis::pipe();
    for (i, key) in keys.iter().enumerate() {
        pipe.set(key, i).ignore();
        pipe.incr(key, 1000);
    }
    let counts: Vec<i64> = pipe.query_async(&mut redis.raw().await).await.unwrap();
    assert_eq!(counts, (0..300).map(|i| i + 1000).collect::<Vec<i64>>());
    let mut conn = redis.raw().await;
    for (i, key) in keys.iter().enumerate().step_by(37) {
        let stored: i64 = conn.get(key).await.unwrap();
        assert_eq!(stored, i as i64 + 1000);
    }
}

#[tokio::test]
async fn scan_pages_walk_every_master_and_end_at_the_start() {
    let redis = TestRedis::new().await;
    let backend = redis.backend();
    let ns = redis.keys().namespace().to_owned();
    let mut pipe = redis::pipe();
    for i in 0..500 {
        pipe.set(format!("{ns}:scan:{i}"), 1).ignore();
    }
    let () = pipe.query_async(&mut redis.raw().await).await.unwrap();
    let masters = backend.master_conns().await.unwrap().len();
    assert_eq!(masters, if backend.is_cluster() { 3 } else { 1 });

    let mut found = std::collections::BTreeSet::new();
    let mut cursor = ScanCursor::START;
    let mut pages = 0;
    loop {
        let (next, page) = backend
            .scan_page(cursor, &format!("{ns}:scan:*"), 50)
            .await
            .unwrap();
        found.extend(page);
        pages += 1;
        cursor = next;
        if cursor.is_start() {
            break;
        }
        assert!(pages < 10_000, "the walk ends");
    }
    assert_eq!(found.len(), 500, "every key on every master, each once");
}

#[tokio::test]
async fn a_malformed_url_list_is_one_clear_error() {
    for url in ["redis://127.0.0.1:6379,", ",redis://127.0.0.1:6379", " , "] {
        let err = RedisBackend::connect(
            "REDIS_URL",
            url,
            Keyspace::new("t").unwrap(),
            RedisTimeouts::default(),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("REDIS_URL") && err.contains("empty entry"),
            "{err}"
        );
        assert!(!err.contains('\n'), "{err}");
    }
    let err = RedisBackend::connect(
        "REDIS_URL",
        "redis://127.0.0.1:1,redis://:secret@127.0.0.1:2",
        Keyspace::new("t").unwrap(),
        RedisTimeouts {
            connect: Duration::from_millis(300),
            response: Duration::from_millis(300),
        },
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(!err.contains("secret"), "passwords are redacted: {err}");
}

#[tokio::test]
async fn a_server_that_may_evict_keys_is_refused_unless_overridden() {
    let evicting = PrivateRedis::start("volatile-lru").await;
    let keys = Keyspace::new("evict").unwrap();
    let err = RedisBackend::connect(
        "REDIS_URL",
        &evicting.url,
        keys.clone(),
        RedisTimeouts::default(),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("maxmemory-policy is volatile-lru") && err.contains("noeviction"),
        "{err}"
    );
    assert!(
        err.contains("SHARDKEEP_ALLOW_EVICTION"),
        "names the override: {err}"
    );
    let options = RedisOptions {
        eviction: EvictionCheck::Skip,
        ..RedisOptions::default()
    };
    let allowed = RedisBackend::connect_with("REDIS_URL", &evicting.url, keys, options)
        .await
        .unwrap();
    allowed.ping().await.unwrap();

    let strict = PrivateRedis::start("noeviction").await;
    RedisBackend::connect(
        "REDIS_URL",
        &strict.url,
        Keyspace::new("evict").unwrap(),
        RedisTimeouts::default(),
    )
    .await
    .unwrap();
}

/// Every connection to every node cut (nodes restarted, connections refused), or black-holed
/// (a network partition: bytes held, connections open), for several seconds, then restored: the
/// shared and the durable connections answer again within seconds, so workers resume instead
/// of failing every call for good. On a cluster this rests on redis-rs reconnecting from the
/// seed nodes once it has no node connection left.
#[tokio::test]
async fn after_every_connection_was_cut_both_connections_answer_again_within_seconds() {
    use shardkeep_testkit::faults::ProxyMode;
    for fault in [ProxyMode::Cut, ProxyMode::Stall] {
        answers_again_after(fault).await;
    }
}

async fn answers_again_after(fault: shardkeep_testkit::faults::ProxyMode) {
    use shardkeep_testkit::faults::{ProxyControl, ProxyMode};
    let redis = TestRedis::new().await;
    let timeouts = RedisTimeouts {
        connect: Duration::from_millis(300),
        response: Duration::from_millis(300),
    };
    let (proxy, backend) = shardkeep_testkit::faults::proxied_redis(
        &shardkeep_testkit::redis_url(),
        redis.keys().clone(),
        timeouts,
    )
    .await
    .unwrap();
    let key = format!("{}:heal", redis.keys().namespace());
    let () = backend.durable_conn().set(&key, 1).await.unwrap();
    proxy.set_mode(fault);
    let cut_for = tokio::time::Instant::now();
    while cut_for.elapsed() < Duration::from_secs(4) {
        assert!(backend.ping().await.is_err(), "{fault:?}");
        let cut: redis::RedisResult<i64> = backend.durable_conn().incr(&key, 1).await;
        assert!(cut.is_err(), "{fault:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    proxy.set_mode(ProxyMode::Pass);
    let started = tokio::time::Instant::now();
    loop {
        let shared = backend.ping().await.is_ok();
        let durable: redis::RedisResult<i64> = backend.durable_conn().incr(&key, 1).await;
        if shared && durable.is_ok() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "answering again within 10 s after {fault:?} (shared {shared}, durable {durable:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// On a cluster a confirmed write waits for a replica; inside MULTI that wait would answer at
/// once, so a transaction is refused there and nothing is written. Standalone has no wait.
#[tokio::test]
async fn a_confirmed_write_is_never_a_transaction_on_a_cluster() {
    let redis = TestRedis::new().await;
    let backend = redis.backend();
    let key = format!("{}:confirmed", redis.keys().namespace());
    let mut pipe = redis::pipe();
    pipe.atomic().set(&key, 1).ignore();
    let result: redis::RedisResult<()> = backend.query_confirmed(pipe).await;
    let stored: Option<i64> = redis.raw().await.get(&key).await.unwrap();
    if backend.is_cluster() {
        let err = result.unwrap_err().to_string();
        assert!(err.contains("MULTI"), "{err}");
        assert_eq!(stored, None, "nothing written");
    } else {
        result.unwrap();
        assert_eq!(stored, Some(1));
    }
    let mut pipe = redis::pipe();
    pipe.set(&key, 2).ignore();
    let () = backend.query_confirmed(pipe).await.unwrap();
    let stored: Option<i64> = redis.raw().await.get(&key).await.unwrap();
    assert_eq!(
        stored,
        Some(2),
        "a plain pipeline is confirmed on both topologies"
    );
}

/// A forced failover (what the simulator's `redis-failover` does) with writes in flight, on a
/// private cluster of its own: the shared and the confirmed connections write again within
/// 15 s, whether they reach the nodes directly or through fault proxies (as the simulator's
/// shards do). Twice in a row, as a run's faults recur.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_forced_failover_both_connections_write_again_within_seconds() {
    use shardkeep_testkit::cluster::{PrivateCluster, fail_over};
    let cluster = PrivateCluster::start().await;
    let keys = Keyspace::new("failover").unwrap();
    let timeouts = RedisTimeouts {
        connect: Duration::from_millis(500),
        response: Duration::from_millis(1000),
    };
    let direct = RedisBackend::connect("REDIS_URL", &cluster.url, keys.clone(), timeouts)
        .await
        .unwrap();
    let (_proxies, proxied) =
        shardkeep_testkit::faults::proxied_redis(&cluster.url, keys, timeouts)
            .await
            .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let mut writers = Vec::new();
    // Many writers at once, as a shard's saver, journal appender and sessions write together:
    // confirmed writes queue behind each other's WAIT on a master's connection.
    for backend in [direct.clone(), proxied.clone()] {
        for _ in 0..8 {
            let stop = stop.clone();
            let backend = backend.clone();
            writers.push(tokio::spawn(async move {
                while !stop.is_cancelled() {
                    let _ = write_round(&backend).await;
                }
            }));
        }
    }
    // Under this load, before any failover: both write within the bound.
    for (name, backend) in [("direct", &direct), ("proxied", &proxied)] {
        writes_within(
            backend,
            Duration::from_secs(15),
            &format!("{name}, before a failover"),
        )
        .await;
    }
    for pick in 0..2 {
        let promoted = fail_over(&direct, pick).await.unwrap();
        for (name, backend) in [("direct", &direct), ("proxied", &proxied)] {
            let what = format!("{name}, after promoting {promoted}");
            writes_within(backend, Duration::from_secs(15), &what).await;
        }
    }
    stop.cancel();
    for writer in writers {
        writer.await.unwrap();
    }
}

/// Waits until one [`write_round`] succeeds, failing the test after `bound`.
async fn writes_within(backend: &RedisBackend, bound: Duration, what: &str) {
    let started = tokio::time::Instant::now();
    loop {
        match write_round(backend).await {
            Ok(()) => return,
            Err(err) => assert!(
                started.elapsed() < bound,
                "{what}: no write round succeeded within {bound:?}: {err}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One plain pipeline over keys of every master, and one confirmed write per master.
async fn write_round(backend: &RedisBackend) -> Result<(), String> {
    let keys: Vec<String> = (0..30).map(|i| format!("failover:k{i}")).collect();
    let mut pipe = redis::pipe();
    for key in &keys {
        pipe.incr(key, 1).ignore();
    }
    let () = pipe
        .query_async(&mut backend.conn())
        .await
        .map_err(|e| format!("shared: {e}"))?;
    for tag in ["a", "b", "c"] {
        let mut pipe = redis::pipe();
        pipe.incr(format!("failover:{{{tag}}}:confirmed"), 1)
            .ignore();
        let () = backend
            .query_confirmed(pipe)
            .await
            .map_err(|e| format!("confirmed: {e}"))?;
    }
    Ok(())
}

/// Every node of a cluster killed at once and started again (a host reboot, a redeploy) while
/// writers run: every connection the client held is gone, and both the shared and the
/// confirmed connection write again within 15 s of the cluster being ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_every_node_restarted_both_connections_write_again_within_seconds() {
    let mut cluster = shardkeep_testkit::cluster::PrivateCluster::start().await;
    let timeouts = RedisTimeouts {
        connect: Duration::from_millis(500),
        response: Duration::from_millis(1000),
    };
    let backend = RedisBackend::connect(
        "REDIS_URL",
        &cluster.url,
        Keyspace::new("restart").unwrap(),
        timeouts,
    )
    .await
    .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let mut writers = Vec::new();
    for _ in 0..4 {
        let (stop, backend) = (stop.clone(), backend.clone());
        writers.push(tokio::spawn(async move {
            while !stop.is_cancelled() {
                let _ = write_round(&backend).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    writes_within(&backend, Duration::from_secs(15), "before the restart").await;
    cluster.restart_all().await;
    writes_within(
        &backend,
        Duration::from_secs(15),
        "after every node restarted",
    )
    .await;
    stop.cancel();
    for writer in writers {
        writer.await.unwrap();
    }
}

/// A closed handle refuses every later command on every clone of it, connections taken before
/// the close included, and writes nothing; another handle on the same server is unaffected.
#[tokio::test]
async fn a_closed_handle_refuses_every_later_command_on_every_clone() {
    let redis = TestRedis::new().await;
    let backend = redis.backend();
    let ns = redis.keys().namespace().to_owned();
    let key = format!("{ns}:closed:probe");
    let mut taken = backend.conn();
    let mut durable = backend.durable_conn();
    let clone = backend.clone();
    let _: () = taken.set(&key, 1).await.unwrap();
    backend.close();
    assert!(clone.is_closed());
    let refused: redis::RedisResult<()> = taken.set(&key, 2).await;
    let err = refused.expect_err("a connection taken before the close is refused");
    assert!(err.to_string().contains("closed"), "{err}");
    let refused: redis::RedisResult<()> = durable.set(&key, 3).await;
    assert!(refused.is_err());
    let refused: redis::RedisResult<()> = clone.conn().set(&key, 4).await;
    assert!(refused.is_err());
    let piped: redis::RedisResult<(i64,)> = redis::pipe()
        .incr(&key, 10)
        .query_async(&mut clone.conn())
        .await;
    assert!(piped.is_err(), "a pipeline is refused too");
    assert!(clone.dedicated_conn(Duration::from_secs(1)).await.is_err());
    let other = shardkeep_testkit::redis_backend(&ns).await;
    let stored: i64 = other.conn().get(&key).await.unwrap();
    assert_eq!(stored, 1, "nothing after the close reached the server");
    let _: () = other.conn().del(&key).await.unwrap();
}

/// A writer a test leaves running (a clone of its namespace's handle) writes nothing after
/// the namespace is swept.
#[tokio::test]
async fn a_swept_test_namespace_takes_no_write_from_a_handle_left_running() {
    let redis = TestRedis::new().await;
    let left_running = redis.backend();
    let ns = redis.keys().namespace().to_owned();
    drop(redis);
    let key = format!("{ns}:late:write");
    let late: redis::RedisResult<()> = left_running.conn().set(&key, 1).await;
    assert!(late.is_err(), "a write after the sweep is refused");
    let other = shardkeep_testkit::redis_backend(&ns).await;
    let found = shardkeep_testkit::keys_matching(&other, &format!("*{ns}*")).await;
    assert!(
        found.is_empty(),
        "the swept namespace stays empty: {found:?}"
    );
}
