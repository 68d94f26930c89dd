use std::time::Duration;

use shardkeep::Ttl;
use shardkeep::keyspace::slot::key_slot;
use shardkeep::queue::{
    AckOutcome, FailOutcome, QueueDepths, QueueError, WorkQueue, WorkQueueConfig,
};
use shardkeep_testkit::{CoordDriver, TestRedis, coord_drivers};

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Job {
    n: u32,
    note: String,
}

fn job(n: u32) -> Job {
    Job {
        n,
        note: format!("job {n}"),
    }
}

fn config() -> WorkQueueConfig {
    WorkQueueConfig {
        heartbeat_ttl: Ttl::from_millis(300).unwrap(),
        ..WorkQueueConfig::default()
    }
}

fn queue(d: &CoordDriver) -> WorkQueue<Job> {
    d.queue("work", config()).unwrap()
}

#[tokio::test]
async fn entries_flow_append_lease_ack_in_order() {
    for d in coord_drivers().await {
        entries_flow_append_lease_ack_in_order_on(&d).await;
    }
}

async fn entries_flow_append_lease_ack_in_order_on(d: &CoordDriver) {
    let queue = queue(d);
    for n in 0..3 {
        queue.append(job(n)).await.unwrap();
    }
    let mut consumer = queue.consumer().await.unwrap();
    for n in 0..3 {
        let leased = consumer.lease().await.unwrap().unwrap();
        assert_eq!(leased.entry.item, job(n), "first in, first out");
        assert_eq!((leased.entry.attempts, leased.entry.crash_count), (0, 0));
        assert_eq!(consumer.ack(&leased).await.unwrap(), AckOutcome::Acked);
        assert_eq!(consumer.ack(&leased).await.unwrap(), AckOutcome::Stale);
    }
    assert!(consumer.lease().await.unwrap().is_none());
    assert_eq!(queue.depths().await.unwrap(), QueueDepths::default());
}

#[tokio::test]
async fn a_capped_queue_refuses_when_full_and_writes_nothing() {
    for d in coord_drivers().await {
        a_capped_queue_refuses_when_full_and_writes_nothing_on(&d).await;
    }
}

async fn a_capped_queue_refuses_when_full_and_writes_nothing_on(d: &CoordDriver) {
    let capped: WorkQueue<Job> = d
        .queue(
            "capped",
            WorkQueueConfig {
                max_pending: Some(2),
                ..config()
            },
        )
        .unwrap();
    capped.append(job(1)).await.unwrap();
    capped.append(job(2)).await.unwrap();
    assert!(matches!(
        capped.append(job(3)).await,
        Err(QueueError::Full(_))
    ));
    assert_eq!(capped.depths().await.unwrap().pending, 2);
}

#[tokio::test]
async fn failures_retry_then_dead_letter_after_eight_attempts_with_every_field() {
    for d in coord_drivers().await {
        failures_retry_then_dead_letter_after_eight_attempts_with_every_field_on(&d).await;
    }
}

async fn failures_retry_then_dead_letter_after_eight_attempts_with_every_field_on(d: &CoordDriver) {
    let queue = queue(d);
    let entry_id = queue.append(job(7)).await.unwrap();
    let mut consumer = queue.consumer().await.unwrap();
    for attempt in 1..8 {
        let leased = consumer.lease().await.unwrap().unwrap();
        assert_eq!(leased.entry.attempts, attempt - 1);
        assert_eq!(
            consumer.fail(&leased, "store down").await.unwrap(),
            FailOutcome::Retried { attempts: attempt }
        );
    }
    let leased = consumer.lease().await.unwrap().unwrap();
    let FailOutcome::DeadLettered { dead_letter_id } =
        consumer.fail(&leased, "store still down").await.unwrap()
    else {
        panic!("the eighth failure dead-letters");
    };
    let depths = queue.depths().await.unwrap();
    assert_eq!((depths.pending, depths.processing, depths.dead), (0, 0, 1));
    let dead = queue.dead_letters(10).await.unwrap().remove(0);
    assert_eq!(dead.record.dead_letter_id, dead_letter_id);
    assert_eq!(dead.record.entry_id, Some(entry_id));
    assert_eq!(dead.record.failed_attempts, 8);
    assert_eq!(dead.record.error, "store still down");
    assert!(dead.record.failed_at <= chrono::Utc::now());
    assert_eq!(dead.item, Some(job(7)));
}

#[tokio::test]
async fn requeue_twice_makes_one_pending_entry() {
    for d in coord_drivers().await {
        requeue_twice_makes_one_pending_entry_on(&d).await;
    }
}

async fn requeue_twice_makes_one_pending_entry_on(d: &CoordDriver) {
    let queue: WorkQueue<Job> = d
        .queue(
            "work",
            WorkQueueConfig {
                max_attempts: 1,
                ..config()
            },
        )
        .unwrap();
    let original = queue.append(job(1)).await.unwrap();
    let mut consumer = queue.consumer().await.unwrap();
    let leased = consumer.lease().await.unwrap().unwrap();
    let FailOutcome::DeadLettered { dead_letter_id } =
        consumer.fail(&leased, "boom").await.unwrap()
    else {
        panic!("one attempt allowed");
    };
    let (a, b) = tokio::join!(queue.requeue(dead_letter_id), queue.requeue(dead_letter_id));
    let requeued: Vec<_> = [a.unwrap(), b.unwrap()].into_iter().flatten().collect();
    assert_eq!(requeued.len(), 1);
    assert_ne!(requeued[0], original, "a requeue gets a new entry id");
    let depths = queue.depths().await.unwrap();
    assert_eq!((depths.pending, depths.dead), (1, 0));
    let fresh = consumer.lease().await.unwrap().unwrap();
    assert_eq!(
        (
            fresh.entry.entry_id,
            fresh.entry.attempts,
            fresh.entry.crash_count
        ),
        (requeued[0], 0, 0)
    );
    assert_eq!(
        queue.requeue(uuid::Uuid::now_v7()).await.unwrap(),
        None,
        "unknown id"
    );
}

#[tokio::test]
async fn dead_letter_listing_is_newest_first_and_clamped() {
    for d in coord_drivers().await {
        dead_letter_listing_is_newest_first_and_clamped_on(&d).await;
    }
}

async fn dead_letter_listing_is_newest_first_and_clamped_on(d: &CoordDriver) {
    let queue: WorkQueue<Job> = d
        .queue(
            "work",
            WorkQueueConfig {
                max_attempts: 1,
                ..config()
            },
        )
        .unwrap();
    let mut consumer = queue.consumer().await.unwrap();
    for n in 0..5 {
        queue.append(job(n)).await.unwrap();
        let leased = consumer.lease().await.unwrap().unwrap();
        consumer.fail(&leased, "x").await.unwrap();
    }
    let listed = queue.dead_letters(3).await.unwrap();
    let ns: Vec<u32> = listed.iter().map(|d| d.item.as_ref().unwrap().n).collect();
    assert_eq!(ns, vec![4, 3, 2]);
    assert_eq!(
        queue.dead_letters(0).await.unwrap().len(),
        1,
        "limit clamps up to 1"
    );
    assert_eq!(queue.dead_letters(100_000).await.unwrap().len(), 5);
}

#[tokio::test]
async fn an_undecodable_entry_is_dead_lettered_not_leased_forever() {
    for d in coord_drivers().await {
        an_undecodable_entry_is_dead_lettered_not_leased_forever_on(&d).await;
    }
}

async fn an_undecodable_entry_is_dead_lettered_not_leased_forever_on(d: &CoordDriver) {
    let queue = queue(d);
    d.push_raw_entry("work", None, b"{not an entry").await;
    queue.append(job(9)).await.unwrap();
    let mut consumer = queue.consumer().await.unwrap();
    let leased = consumer.lease().await.unwrap().unwrap();
    assert_eq!(
        leased.entry.item,
        job(9),
        "the lease skipped past the poison"
    );
    let dead = queue.dead_letters(10).await.unwrap().remove(0);
    assert!(
        dead.record.error.contains("does not decode"),
        "{}",
        dead.record.error
    );
    assert_eq!(dead.record.item, serde_json::json!("{not an entry"));
    assert!(dead.item.is_none());
    assert!(matches!(
        queue.requeue(dead.record.dead_letter_id).await,
        Err(QueueError::Undecodable(_))
    ));
}

#[tokio::test]
async fn a_restart_does_not_steal_a_live_consumers_entries() {
    for d in coord_drivers().await {
        a_restart_does_not_steal_a_live_consumers_entries_on(&d).await;
    }
}

async fn a_restart_does_not_steal_a_live_consumers_entries_on(d: &CoordDriver) {
    // A heartbeat long enough that the early recovery surely comes before it lapses on a
    // loaded machine (with 300 ms it sometimes did not, and found the crashed consumer dead).
    let queue = d
        .queue::<Job>(
            "work",
            WorkQueueConfig {
                heartbeat_ttl: Ttl::from_millis(2_000).unwrap(),
                ..WorkQueueConfig::default()
            },
        )
        .unwrap();
    for n in 0..2 {
        queue.append(job(n)).await.unwrap();
    }
    let mut live = queue.consumer().await.unwrap();
    let mut crashing = queue.consumer().await.unwrap();
    let held_by_live = live.lease().await.unwrap().unwrap();
    let held_by_crashing = crashing.lease().await.unwrap().unwrap();
    crashing.abandon();
    // The restarted instance recovers at start-up, before the crashed heartbeat lapses.
    let restarted = queue.consumer().await.unwrap();
    let early = queue.recover().await.unwrap();
    assert_eq!((early.dead_consumers, early.returned), (0, 0));
    assert_eq!(queue.depths().await.unwrap().processing, 2);
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    let report = queue.recover().await.unwrap();
    assert_eq!((report.dead_consumers, report.returned), (1, 1));
    assert_eq!(
        live.ack(&held_by_live).await.unwrap(),
        AckOutcome::Acked,
        "the live consumer's entry was untouched"
    );
    let depths = queue.depths().await.unwrap();
    assert_eq!((depths.pending, depths.processing), (1, 0));
    let mut restarted = restarted;
    let returned = restarted.lease().await.unwrap().unwrap();
    assert_eq!(returned.entry.entry_id, held_by_crashing.entry.entry_id);
    assert_eq!(
        (returned.entry.attempts, returned.entry.crash_count),
        (0, 1),
        "counted as a crash, not a failure"
    );
}

#[tokio::test]
async fn a_dead_consumers_entries_return_exactly_once() {
    for d in coord_drivers().await {
        a_dead_consumers_entries_return_exactly_once_on(&d).await;
    }
}

async fn a_dead_consumers_entries_return_exactly_once_on(d: &CoordDriver) {
    let queue = queue(d);
    for n in 0..50 {
        queue.append(job(n)).await.unwrap();
    }
    let mut dying = queue.consumer().await.unwrap();
    let dying_id = dying.id().to_owned();
    let mut held = Vec::new();
    while let Some(leased) = dying.lease().await.unwrap() {
        held.push(leased);
    }
    dying.abandon();
    tokio::time::sleep(Duration::from_millis(450)).await;
    let (a, b, c) = tokio::join!(queue.recover(), queue.recover(), queue.recover());
    let returned: usize = [a.unwrap(), b.unwrap(), c.unwrap()]
        .iter()
        .map(|r| r.returned)
        .sum();
    assert_eq!(returned, 50);
    assert_eq!(queue.recover().await.unwrap().returned, 0);
    let depths = queue.depths().await.unwrap();
    assert_eq!((depths.pending, depths.processing), (50, 0));
    let consumers = d.queue_consumers("work").await;
    assert!(
        !consumers.contains(&dying_id),
        "the dead consumer left the set"
    );
    assert_eq!(held.len(), 50);
}

#[tokio::test]
async fn an_entry_that_keeps_killing_consumers_becomes_a_poison_pill() {
    for d in coord_drivers().await {
        an_entry_that_keeps_killing_consumers_becomes_a_poison_pill_on(&d).await;
    }
}

async fn an_entry_that_keeps_killing_consumers_becomes_a_poison_pill_on(d: &CoordDriver) {
    let queue = queue(d);
    queue.append(job(13)).await.unwrap();
    for crash in 1..=3 {
        let mut victim = queue.consumer().await.unwrap();
        let leased = victim.lease().await.unwrap().unwrap();
        assert_eq!(leased.entry.crash_count, crash - 1);
        victim.abandon();
        tokio::time::sleep(Duration::from_millis(450)).await;
        queue.recover().await.unwrap();
    }
    let depths = queue.depths().await.unwrap();
    assert_eq!((depths.pending, depths.processing, depths.dead), (0, 0, 1));
    let dead = queue.dead_letters(1).await.unwrap().remove(0);
    assert!(
        dead.record.error.starts_with("poison pill"),
        "{}",
        dead.record.error
    );
    assert_eq!(dead.item, Some(job(13)));
}

#[tokio::test]
async fn a_clean_shutdown_returns_held_entries_and_leaves_the_set() {
    for d in coord_drivers().await {
        a_clean_shutdown_returns_held_entries_and_leaves_the_set_on(&d).await;
    }
}

async fn a_clean_shutdown_returns_held_entries_and_leaves_the_set_on(d: &CoordDriver) {
    let queue = queue(d);
    queue.append(job(1)).await.unwrap();
    let mut consumer = queue.consumer().await.unwrap();
    let _held = consumer.lease().await.unwrap().unwrap();
    consumer.shutdown().await.unwrap();
    let depths = queue.depths().await.unwrap();
    assert_eq!((depths.pending, depths.processing), (1, 0));
}

#[tokio::test]
async fn a_blocking_lease_wakes_when_work_arrives() {
    for d in coord_drivers().await {
        a_blocking_lease_wakes_when_work_arrives_on(&d).await;
    }
}

async fn a_blocking_lease_wakes_when_work_arrives_on(d: &CoordDriver) {
    let queue = queue(d);
    let mut consumer = queue.consumer().await.unwrap();
    assert!(
        consumer
            .lease_blocking(Duration::from_millis(100))
            .await
            .unwrap()
            .is_none()
    );
    let producer = queue.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        producer.append(job(5)).await.unwrap();
    });
    let leased = consumer
        .lease_blocking(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(leased.entry.item, job(5));
}

#[tokio::test]
async fn every_key_a_queue_script_touches_shares_one_slot() {
    let redis = TestRedis::new().await;
    let keys = redis.keys().queue("session-lifecycle").unwrap();
    let consumer = uuid::Uuid::now_v7().to_string();
    let touched = [
        keys.pending.clone(),
        keys.dead.clone(),
        keys.consumers.clone(),
        keys.recovery_lock.clone(),
        keys.dead_index.clone(),
        keys.processing_held.clone(),
        keys.processing_total.clone(),
        keys.processing(&consumer).unwrap(),
        keys.consumer_heartbeat(&consumer).unwrap(),
    ];
    let slot = key_slot(&touched[0]);
    for key in &touched {
        assert_eq!(key_slot(key), slot, "{key}");
    }
}

#[tokio::test]
async fn batch_leases_take_the_oldest_and_batch_acks_report_each() {
    for d in coord_drivers().await {
        batch_leases_take_the_oldest_and_batch_acks_report_each_on(&d).await;
    }
}

async fn batch_leases_take_the_oldest_and_batch_acks_report_each_on(d: &CoordDriver) {
    let queue = queue(d);
    for n in 0..10 {
        queue.append(job(n)).await.unwrap();
    }
    let mut consumer = queue.consumer().await.unwrap();
    let batch = consumer.lease_batch(4).await.unwrap();
    let ns: Vec<u32> = batch.iter().map(|l| l.entry.item.n).collect();
    assert_eq!(ns, vec![0, 1, 2, 3]);
    assert_eq!(queue.depths().await.unwrap().processing, 4);
    assert_eq!(
        consumer.ack_batch(&batch).await.unwrap(),
        vec![AckOutcome::Acked; 4]
    );
    assert_eq!(
        consumer.ack_batch(&batch[..1]).await.unwrap(),
        vec![AckOutcome::Stale]
    );
    let rest = consumer.lease_batch(100).await.unwrap();
    assert_eq!(rest.len(), 6);
    assert!(consumer.lease_batch(100).await.unwrap().is_empty());
}

/// Appends made at once go to Redis together: every entry is stored once, and each producer's
/// entries keep the order it appended them in.
#[tokio::test]
async fn concurrent_appends_are_each_stored_once_in_each_producers_order() {
    for d in coord_drivers().await {
        concurrent_appends_are_each_stored_once_in_each_producers_order_on(&d).await;
    }
}

async fn concurrent_appends_are_each_stored_once_in_each_producers_order_on(d: &CoordDriver) {
    let queue = queue(d);
    let mut producers = tokio::task::JoinSet::new();
    for p in 0..8u32 {
        let queue = queue.clone();
        producers.spawn(async move {
            for n in 0..200 {
                queue.append(job(p * 1000 + n)).await.unwrap();
            }
        });
    }
    while let Some(done) = producers.join_next().await {
        done.unwrap();
    }
    assert_eq!(queue.depths().await.unwrap().pending, 1600);
    let mut consumer = queue.consumer().await.unwrap();
    let mut seen: Vec<u32> = Vec::new();
    loop {
        let batch = consumer.lease_batch(512).await.unwrap();
        if batch.is_empty() {
            break;
        }
        seen.extend(batch.iter().map(|l| l.entry.item.n));
        consumer.ack_batch(&batch).await.unwrap();
    }
    assert_eq!(seen.len(), 1600);
    for p in 0..8u32 {
        let mine: Vec<u32> = seen.iter().copied().filter(|n| n / 1000 == p).collect();
        let expected: Vec<u32> = (0..200).map(|n| p * 1000 + n).collect();
        assert_eq!(mine, expected, "producer {p}'s entries in its order");
    }
}

/// A capped queue takes what fits of appends that arrive together and refuses the rest, each
/// told which.
#[tokio::test]
async fn a_capped_queue_takes_what_fits_of_a_burst_and_refuses_the_rest() {
    for d in coord_drivers().await {
        a_capped_queue_takes_what_fits_of_a_burst_and_refuses_the_rest_on(&d).await;
    }
}

async fn a_capped_queue_takes_what_fits_of_a_burst_and_refuses_the_rest_on(d: &CoordDriver) {
    let capped: WorkQueue<Job> = d
        .queue(
            "burst",
            WorkQueueConfig {
                max_pending: Some(10),
                ..config()
            },
        )
        .unwrap();
    let appends = (0..30).map(|n| {
        let capped = capped.clone();
        async move { capped.append(job(n)).await }
    });
    let outcomes = futures::future::join_all(appends).await;
    let stored = outcomes.iter().filter(|o| o.is_ok()).count();
    let full = outcomes
        .iter()
        .filter(|o| matches!(o, Err(QueueError::Full(_))))
        .count();
    assert_eq!((stored, full), (10, 20));
    assert_eq!(capped.depths().await.unwrap().pending, 10);
}

/// One call acks a finished batch and leases the next: the acked entries leave the processing
/// list, the new ones enter it, and acking an entry twice is stale.
#[tokio::test]
async fn ack_and_lease_acks_a_batch_and_leases_the_next_in_one_step() {
    for d in coord_drivers().await {
        ack_and_lease_acks_a_batch_and_leases_the_next_in_one_step_on(&d).await;
    }
}

async fn ack_and_lease_acks_a_batch_and_leases_the_next_in_one_step_on(d: &CoordDriver) {
    let queue = queue(d);
    for n in 0..5 {
        queue.append(job(n)).await.unwrap();
    }
    let mut consumer = queue.consumer().await.unwrap();
    let first = consumer.lease_batch(3).await.unwrap();
    let (acked, next) = consumer.ack_and_lease(&first, 10).await.unwrap();
    assert_eq!(acked, vec![AckOutcome::Acked; 3]);
    let ns: Vec<u32> = next.iter().map(|l| l.entry.item.n).collect();
    assert_eq!(ns, vec![3, 4], "the oldest pending, in order");
    let depths = queue.depths().await.unwrap();
    assert_eq!((depths.pending, depths.processing), (0, 2));
    let (again, none) = consumer.ack_and_lease(&first[..1], 10).await.unwrap();
    assert_eq!((again, none.len()), (vec![AckOutcome::Stale], 0));
    let (acked, _) = consumer.ack_and_lease(&next, 10).await.unwrap();
    assert_eq!(acked, vec![AckOutcome::Acked; 2]);
    assert_eq!(queue.depths().await.unwrap(), QueueDepths::default());
}

/// Queues of the same name in two namespaces on one engine (one Redis, one file) are apart: a
/// consumer of one never leases, recovers or counts the other's entries.
#[tokio::test]
async fn queues_of_two_namespaces_on_one_engine_never_mix() {
    for d in coord_drivers().await {
        let neighbour = d.neighbour().await;
        let (mine, theirs) = (queue(&d), queue(&neighbour));
        theirs.append(job(1)).await.unwrap();
        mine.append(job(2)).await.unwrap();
        let mut consumer = mine.consumer().await.unwrap();
        let leased = consumer.lease().await.unwrap().unwrap();
        assert_eq!(leased.entry.item, job(2), "{}", d.name());
        assert!(consumer.lease().await.unwrap().is_none(), "{}", d.name());
        assert_eq!(theirs.depths().await.unwrap().pending, 1, "{}", d.name());
        consumer.abandon();
        tokio::time::sleep(Duration::from_millis(450)).await;
        assert_eq!(theirs.recover().await.unwrap().returned, 0, "{}", d.name());
        assert_eq!(mine.recover().await.unwrap().returned, 1, "{}", d.name());
    }
}
