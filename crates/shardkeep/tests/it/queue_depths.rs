//! The depth report reads one total that every script moving processing entries keeps: it is
//! exact after every path in and out of a processing list, and a count gone wrong (a move no
//! script made, a list deleted by hand) is put right by the next script touching that list or
//! by recovery.

use std::time::Duration;

use redis::AsyncCommands;
use shardkeep::Ttl;
use shardkeep::queue::{WorkQueue, WorkQueueConfig};
use shardkeep_testkit::TestRedis;

fn queue(redis: &TestRedis) -> WorkQueue<u32> {
    let config = WorkQueueConfig {
        heartbeat_ttl: Ttl::from_millis(300).unwrap(),
        ..WorkQueueConfig::default()
    };
    WorkQueue::new(redis.backend(), "depths", config).unwrap()
}

/// What the processing lists really hold, read list by list.
async fn held_in_lists(redis: &TestRedis, consumers: &[&str]) -> u64 {
    let keys = redis.keys().queue("depths").unwrap();
    let mut raw = redis.raw().await;
    let mut total = 0;
    for id in consumers {
        let len: u64 = raw.llen(keys.processing(id).unwrap()).await.unwrap();
        total += len;
    }
    total
}

async fn assert_processing(queue: &WorkQueue<u32>, redis: &TestRedis, consumers: &[&str]) {
    let reported = queue.depths().await.unwrap().processing;
    assert_eq!(reported, held_in_lists(redis, consumers).await);
}

#[tokio::test]
async fn the_processing_depth_is_exact_after_every_path_in_and_out() {
    let redis = TestRedis::new().await;
    let queue = queue(&redis);
    for n in 0..20 {
        queue.append(n).await.unwrap();
    }
    let mut a = queue.consumer().await.unwrap();
    let mut b = queue.consumer().await.unwrap();
    let ids = [a.id().to_owned(), b.id().to_owned()];
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();

    let batch = a.lease_batch(6).await.unwrap();
    assert_eq!(queue.depths().await.unwrap().processing, 6);
    let blocked = b
        .lease_blocking(Duration::from_millis(100))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        queue.depths().await.unwrap().processing,
        7,
        "BLMOVE counted"
    );
    b.ack(&blocked).await.unwrap();
    assert_processing(&queue, &redis, &ids).await;
    a.ack_batch(&batch[..2]).await.unwrap();
    assert_eq!(queue.depths().await.unwrap().processing, 4);
    a.fail(&batch[2], "back to pending").await.unwrap();
    a.fail_held(&batch[3], "held through the pass")
        .await
        .unwrap();
    a.release(&batch[4]).await.unwrap();
    assert_eq!(queue.depths().await.unwrap().processing, 2);
    assert_processing(&queue, &redis, &ids).await;
    assert_eq!(a.requeue_held().await.unwrap(), 2);
    assert_eq!(queue.depths().await.unwrap().processing, 0);

    // A stale ack changes nothing; a clean shutdown hands held entries back.
    assert_eq!(
        a.ack(&batch[0]).await.unwrap(),
        shardkeep::queue::AckOutcome::Stale
    );
    b.lease_batch(5).await.unwrap();
    assert_eq!(queue.depths().await.unwrap().processing, 5);
    b.shutdown().await.unwrap();
    assert_eq!(queue.depths().await.unwrap().processing, 0);

    // A consumer that dies holding entries: recovery returns them and the count with them.
    let mut dying = queue.consumer().await.unwrap();
    dying.lease_batch(3).await.unwrap();
    assert_eq!(queue.depths().await.unwrap().processing, 3);
    dying.abandon();
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert_eq!(queue.recover().await.unwrap().returned, 3);
    let depths = queue.depths().await.unwrap();
    assert_eq!((depths.pending, depths.processing), (20 - 3, 0));
    let keys = redis.keys().queue("depths").unwrap();
    let held: std::collections::HashMap<String, i64> = redis
        .raw()
        .await
        .hgetall(&keys.processing_held)
        .await
        .unwrap();
    assert!(
        held.is_empty(),
        "no count is left for empty lists: {held:?}"
    );
}

#[tokio::test]
async fn a_count_gone_wrong_is_put_right_by_the_next_script_or_by_recovery() {
    let redis = TestRedis::new().await;
    let queue = queue(&redis);
    let keys = redis.keys().queue("depths").unwrap();
    let mut raw = redis.raw().await;
    for n in 0..4 {
        queue.append(n).await.unwrap();
    }
    let mut live = queue.consumer().await.unwrap();
    let live_id = live.id().to_owned();
    live.lease_batch(1).await.unwrap();
    // Two entries arrive in its list without any script (as a BLMOVE whose count never ran).
    for _ in 0..2 {
        let _: Option<Vec<u8>> = redis::cmd("LMOVE")
            .arg(&keys.pending)
            .arg(keys.processing(&live_id).unwrap())
            .arg("RIGHT")
            .arg("LEFT")
            .query_async(&mut raw)
            .await
            .unwrap();
    }
    assert_eq!(queue.depths().await.unwrap().processing, 1, "not yet seen");
    // Its next lease counts the list as it is.
    live.lease_batch(1).await.unwrap();
    assert_eq!(queue.depths().await.unwrap().processing, 4);

    // A consumer that is gone leaves a count behind, its list deleted by hand: recovery, which
    // walks the held counts too, puts the total right.
    let _: () = raw
        .hset(&keys.processing_held, "vanished", 7)
        .await
        .unwrap();
    let _: () = raw.incr(&keys.processing_total, 7).await.unwrap();
    assert_eq!(queue.depths().await.unwrap().processing, 11);
    queue.recover().await.unwrap();
    assert_eq!(queue.depths().await.unwrap().processing, 4);
    assert_processing(&queue, &redis, &[&live_id]).await;

    // The total itself lost (deleted by hand, or moved off the counts): recovery sums the
    // counts again.
    let _: () = raw.del(&keys.processing_total).await.unwrap();
    assert_eq!(queue.depths().await.unwrap().processing, 0, "drifted");
    queue.recover().await.unwrap();
    assert_eq!(queue.depths().await.unwrap().processing, 4);
    let _: () = raw.incr(&keys.processing_total, 5).await.unwrap();
    queue.recover().await.unwrap();
    assert_eq!(queue.depths().await.unwrap().processing, 4);
}

#[tokio::test]
async fn the_depth_report_reads_only_its_own_keys_however_many_consumers() {
    let redis = TestRedis::new().await;
    let queue = queue(&redis);
    let mut consumers = Vec::new();
    for n in 0..300 {
        queue.append(n).await.unwrap();
        let mut c = queue.consumer().await.unwrap();
        c.lease_batch(1).await.unwrap();
        consumers.push(c);
    }
    assert_eq!(queue.depths().await.unwrap().processing, 300);
    // The script names three keys and builds none: no walk over consumers is left in it.
    let script = include_str!("../../src/queue/lua/depths.lua");
    assert!(
        !script.contains("SSCAN") && !script.contains(".."),
        "{script}"
    );
    assert!(script.contains("KEYS[3]") && !script.contains("KEYS[4]"));
}
