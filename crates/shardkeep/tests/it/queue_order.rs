//! The work queue keeps first-in-first-out order through retries, recoveries and lost leases,
//! and never loses a consumer's entries, even one that fell out of the consumer set.

use std::time::Duration;

use shardkeep::Ttl;
use shardkeep::queue::{DurableWorkQueueEntry, WorkQueue, WorkQueueConfig};
use shardkeep_testkit::{CoordDriver, coord_drivers};
use uuid::Uuid;

fn config(heartbeat: Ttl) -> WorkQueueConfig {
    WorkQueueConfig {
        heartbeat_ttl: heartbeat,
        ..WorkQueueConfig::default()
    }
}

fn queue(d: &CoordDriver, heartbeat: Ttl) -> WorkQueue<u32> {
    d.queue("ordered", config(heartbeat)).unwrap()
}

async fn append_all(queue: &WorkQueue<u32>, items: std::ops::Range<u32>) {
    for n in items {
        queue.append(n).await.unwrap();
    }
}

/// Leases everything pending, one at a time, acking each; returns the items in lease order.
async fn drain_order(queue: &WorkQueue<u32>) -> Vec<u32> {
    let mut consumer = queue.consumer().await.unwrap();
    let mut order = Vec::new();
    while let Some(leased) = consumer.lease().await.unwrap() {
        order.push(leased.entry.item);
        consumer.ack(&leased).await.unwrap();
    }
    consumer.shutdown().await.unwrap();
    order
}

#[tokio::test]
async fn a_failed_entry_is_retried_before_later_entries() {
    for d in coord_drivers().await {
        a_failed_entry_is_retried_before_later_entries_on(&d).await;
    }
}

async fn a_failed_entry_is_retried_before_later_entries_on(d: &CoordDriver) {
    let queue = queue(d, Ttl::from_secs(15).unwrap());
    append_all(&queue, 0..5).await;
    let mut consumer = queue.consumer().await.unwrap();
    let first = consumer.lease().await.unwrap().unwrap();
    consumer.fail(&first, "store down").await.unwrap();
    let again = consumer.lease().await.unwrap().unwrap();
    assert_eq!(
        again.entry.item, 0,
        "the retry keeps its place at the front"
    );
    assert_eq!(again.entry.attempts, 1);
    consumer.release(&again).await.unwrap();
    consumer.shutdown().await.unwrap();
    assert_eq!(drain_order(&queue).await, vec![0, 1, 2, 3, 4]);
}

#[tokio::test]
async fn a_dead_consumers_entries_return_in_order_ahead_of_later_work() {
    for d in coord_drivers().await {
        a_dead_consumers_entries_return_in_order_ahead_of_later_work_on(&d).await;
    }
}

async fn a_dead_consumers_entries_return_in_order_ahead_of_later_work_on(d: &CoordDriver) {
    let queue = queue(d, Ttl::from_millis(300).unwrap());
    append_all(&queue, 0..600).await;
    let mut dying = queue.consumer().await.unwrap();
    // More than one recovery chunk (256), leased one by one and in batches.
    let mut held = Vec::new();
    for _ in 0..10 {
        held.push(dying.lease().await.unwrap().unwrap());
    }
    held.extend(dying.lease_batch(500).await.unwrap());
    assert_eq!(held.len(), 510);
    dying.abandon();
    tokio::time::sleep(Duration::from_millis(450)).await;
    let report = queue.recover().await.unwrap();
    assert_eq!(report.returned, 510);
    assert_eq!(drain_order(&queue).await, (0..600).collect::<Vec<_>>());
}

#[tokio::test]
async fn entries_of_lost_lease_replies_go_back_in_order() {
    for d in coord_drivers().await {
        entries_of_lost_lease_replies_go_back_in_order_on(&d).await;
    }
}

async fn entries_of_lost_lease_replies_go_back_in_order_on(d: &CoordDriver) {
    let queue = queue(d, Ttl::from_secs(15).unwrap());
    append_all(&queue, 0..6).await;
    let mut consumer = queue.consumer().await.unwrap();
    // Three leases whose replies were "lost": the consumer does not know it holds them.
    for _ in 0..3 {
        consumer.lease().await.unwrap().unwrap();
    }
    assert_eq!(consumer.requeue_held().await.unwrap(), 3);
    consumer.shutdown().await.unwrap();
    assert_eq!(drain_order(&queue).await, vec![0, 1, 2, 3, 4, 5]);
}

#[tokio::test]
async fn a_clean_shutdown_hands_held_entries_back_in_order() {
    for d in coord_drivers().await {
        a_clean_shutdown_hands_held_entries_back_in_order_on(&d).await;
    }
}

async fn a_clean_shutdown_hands_held_entries_back_in_order_on(d: &CoordDriver) {
    let queue = queue(d, Ttl::from_secs(15).unwrap());
    append_all(&queue, 0..6).await;
    let mut consumer = queue.consumer().await.unwrap();
    consumer.lease_batch(4).await.unwrap();
    consumer.shutdown().await.unwrap();
    assert_eq!(drain_order(&queue).await, vec![0, 1, 2, 3, 4, 5]);
}

/// A consumer stalls past its heartbeat, recovery drops it from the consumer set (it held
/// nothing), it comes back, leases, and dies: its entry must still be recovered.
#[tokio::test]
async fn a_consumer_that_fell_out_of_the_set_and_came_back_is_still_recovered() {
    for d in coord_drivers().await {
        a_consumer_that_fell_out_of_the_set_and_came_back_is_still_recovered_on(&d).await;
    }
}

async fn a_consumer_that_fell_out_of_the_set_and_came_back_is_still_recovered_on(d: &CoordDriver) {
    let heartbeat = Ttl::from_secs(3).unwrap();
    let queue = queue(d, heartbeat);
    let mut stalled = queue.consumer().await.unwrap();
    let id = stalled.id().to_owned();
    // The stall: its heartbeat lapses and a recovery pass removes it from the set.
    d.lapse_consumer("ordered", &id).await;
    let report = queue.recover().await.unwrap();
    assert_eq!(report.dead_consumers, 1, "{}", d.name());
    let members = d.queue_consumers("ordered").await;
    assert!(!members.contains(&id));
    // It comes back, leases an entry, and dies before anything else happens.
    append_all(&queue, 0..1).await;
    let held = stalled.lease().await.unwrap().unwrap();
    stalled.abandon();
    tokio::time::sleep(heartbeat.duration() + Duration::from_millis(300)).await;
    let report = queue.recover().await.unwrap();
    assert_eq!(
        report.returned, 1,
        "the entry of a re-appeared consumer was lost"
    );
    let depths = queue.depths().await.unwrap();
    assert_eq!((depths.pending, depths.processing), (1, 0));
    assert_eq!(drain_order(&queue).await, vec![held.entry.item]);
}

/// A processing list whose consumer is in no set and has no heartbeat (however it got there)
/// is found by the recovery backstop.
#[tokio::test]
async fn a_processing_list_with_no_registered_owner_is_recovered() {
    for d in coord_drivers().await {
        a_processing_list_with_no_registered_owner_is_recovered_on(&d).await;
    }
}

async fn a_processing_list_with_no_registered_owner_is_recovered_on(d: &CoordDriver) {
    let queue = queue(d, Ttl::from_secs(15).unwrap());
    let entry = DurableWorkQueueEntry {
        entry_id: Uuid::now_v7(),
        attempts: 0,
        crash_count: 0,
        enqueued_at: chrono::Utc::now(),
        item: 42u32,
    };
    let body = serde_json::to_vec(&entry).unwrap();
    d.push_raw_entry("ordered", Some("vanished-consumer"), &body)
        .await;
    let report = queue.recover().await.unwrap();
    assert_eq!(
        report.returned, 1,
        "an unregistered processing list was never walked"
    );
    assert_eq!(drain_order(&queue).await, vec![42]);
    assert_eq!(d.held_by("ordered", "vanished-consumer").await, 0);
}
