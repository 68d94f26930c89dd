//! Consumer identity and restart recovery. By default each consumer is a fresh incarnation: a
//! crashed one's entries come back through any worker's recovery once its heartbeat lapses. With
//! a stable id, a restarted process takes its predecessor's entries back itself, and a second
//! live process asking for an id in use is refused.

use std::time::{Duration, Instant};

use shardkeep::Ttl;
use shardkeep::queue::{QueueError, WorkQueue, WorkQueueConfig};
use shardkeep_testkit::{CoordDriver, coord_drivers};

const HEARTBEAT: Duration = Duration::from_millis(600);

fn queue(d: &CoordDriver) -> WorkQueue<u32> {
    let config = WorkQueueConfig {
        heartbeat_ttl: Ttl::try_from(HEARTBEAT).unwrap(),
        ..WorkQueueConfig::default()
    };
    d.queue("identity", config).unwrap()
}

async fn append_all(queue: &WorkQueue<u32>, n: u32) {
    for i in 0..n {
        queue.append(i).await.unwrap();
    }
}

#[tokio::test]
async fn fresh_identities_are_unique_and_a_crash_is_recovered_after_the_heartbeat_lapses() {
    for d in coord_drivers().await {
        fresh_identities_are_unique_and_a_crash_is_recovered_after_the_heartbeat_lapses_on(&d)
            .await;
    }
}

async fn fresh_identities_are_unique_and_a_crash_is_recovered_after_the_heartbeat_lapses_on(
    d: &CoordDriver,
) {
    let queue = queue(d);
    append_all(&queue, 3).await;
    let mut crashed = queue.consumer().await.unwrap();
    let other = queue.consumer().await.unwrap();
    assert_ne!(crashed.id(), other.id());
    crashed.lease_batch(3).await.unwrap();
    crashed.abandon();
    // Bound in this mode: heartbeat TTL, then the next recovery pass of any worker.
    assert_eq!(
        queue.recover().await.unwrap().returned,
        0,
        "not before the lapse"
    );
    tokio::time::sleep(HEARTBEAT + Duration::from_millis(150)).await;
    assert_eq!(queue.recover().await.unwrap().returned, 3);
}

#[tokio::test]
async fn a_clean_restart_under_a_stable_id_claims_it_at_once() {
    for d in coord_drivers().await {
        a_clean_restart_under_a_stable_id_claims_it_at_once_on(&d).await;
    }
}

async fn a_clean_restart_under_a_stable_id_claims_it_at_once_on(d: &CoordDriver) {
    let queue = queue(d);
    append_all(&queue, 2).await;
    let mut first = queue.consumer_with_id("serve-0").await.unwrap();
    assert_eq!(first.id(), "serve-0");
    first.lease_batch(2).await.unwrap();
    first.shutdown().await.unwrap();
    assert_eq!(
        queue.depths().await.unwrap().pending,
        2,
        "handed back at shutdown"
    );
    let started = Instant::now();
    let mut second = queue.consumer_with_id("serve-0").await.unwrap();
    assert!(started.elapsed() < HEARTBEAT / 2, "{:?}", started.elapsed());
    let leased = second.lease().await.unwrap().unwrap();
    assert_eq!((leased.entry.item, leased.entry.crash_count), (0, 0));
}

#[tokio::test]
async fn a_restart_after_a_crash_takes_the_predecessors_entries_back_itself() {
    for d in coord_drivers().await {
        a_restart_after_a_crash_takes_the_predecessors_entries_back_itself_on(&d).await;
    }
}

async fn a_restart_after_a_crash_takes_the_predecessors_entries_back_itself_on(d: &CoordDriver) {
    let queue = queue(d);
    append_all(&queue, 5).await;
    let mut crashed = queue.consumer_with_id("serve-0").await.unwrap();
    crashed.lease_batch(3).await.unwrap();
    crashed.abandon();
    let started = Instant::now();
    let mut restarted = queue.consumer_with_id("serve-0").await.unwrap();
    // Bound in this mode: the predecessor's heartbeat TTL, no recovery pass needed.
    let waited = started.elapsed();
    assert!(
        waited <= HEARTBEAT + Duration::from_millis(200),
        "{waited:?}"
    );
    let depths = queue.depths().await.unwrap();
    assert_eq!((depths.pending, depths.processing), (5, 0));
    let mut order = Vec::new();
    while let Some(leased) = restarted.lease().await.unwrap() {
        order.push((leased.entry.item, leased.entry.crash_count));
        restarted.ack(&leased).await.unwrap();
    }
    assert_eq!(
        order,
        vec![(0, 1), (1, 1), (2, 1), (3, 0), (4, 0)],
        "the predecessor's entries first, in order, counted as a crash"
    );
}

#[tokio::test]
async fn a_second_live_process_with_an_id_in_use_is_refused() {
    for d in coord_drivers().await {
        a_second_live_process_with_an_id_in_use_is_refused_on(&d).await;
    }
}

async fn a_second_live_process_with_an_id_in_use_is_refused_on(d: &CoordDriver) {
    let queue = queue(d);
    append_all(&queue, 2).await;
    let mut live = queue.consumer_with_id("serve-0").await.unwrap();
    let held = live.lease().await.unwrap().unwrap();
    let started = Instant::now();
    let refused = queue.consumer_with_id("serve-0").await;
    assert!(
        matches!(&refused, Err(QueueError::IdentityInUse(id)) if id == "serve-0"),
        "{refused:?}"
    );
    assert!(started.elapsed() < HEARTBEAT, "{:?}", started.elapsed());
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("in use by a live process"), "{message}");
    // The live one goes on untouched.
    assert_eq!(
        live.ack(&held).await.unwrap(),
        shardkeep::queue::AckOutcome::Acked
    );
    assert!(live.lease().await.unwrap().is_some());
}

#[tokio::test]
async fn two_processes_started_together_with_one_id_get_one_consumer() {
    for d in coord_drivers().await {
        two_processes_started_together_with_one_id_get_one_consumer_on(&d).await;
    }
}

async fn two_processes_started_together_with_one_id_get_one_consumer_on(d: &CoordDriver) {
    let queue = queue(d);
    let (a, b) = tokio::join!(
        queue.consumer_with_id("serve-1"),
        queue.consumer_with_id("serve-1")
    );
    let oks = [a.is_ok(), b.is_ok()].iter().filter(|ok| **ok).count();
    assert_eq!(oks, 1, "exactly one wins");
    let refused = if a.is_err() { a.err() } else { b.err() };
    assert!(matches!(refused, Some(QueueError::IdentityInUse(_))));
}

#[tokio::test]
async fn an_incarnation_whose_id_was_taken_over_stops_and_touches_nothing() {
    for d in coord_drivers().await {
        an_incarnation_whose_id_was_taken_over_stops_and_touches_nothing_on(&d).await;
    }
}

async fn an_incarnation_whose_id_was_taken_over_stops_and_touches_nothing_on(d: &CoordDriver) {
    let queue = queue(d);
    append_all(&queue, 3).await;
    let mut stalled = queue.consumer_with_id("serve-0").await.unwrap();
    stalled.lease().await.unwrap().unwrap();
    // It stalls past its heartbeat; a restart under its id takes over.
    d.lapse_consumer("identity", "serve-0").await;
    let mut successor = queue.consumer_with_id("serve-0").await.unwrap();
    let taken = successor.lease().await.unwrap().unwrap();
    assert_eq!((taken.entry.item, taken.entry.crash_count), (0, 1));
    // The stalled one wakes up: it may neither hand back nor lease the successor's entries.
    assert!(matches!(
        stalled.requeue_held().await,
        Err(QueueError::IdentityLost(_))
    ));
    assert_eq!(queue.depths().await.unwrap().processing, 1, "untouched");
    assert!(matches!(
        stalled.lease().await,
        Err(QueueError::IdentityLost(_))
    ));
    assert!(matches!(
        stalled.heartbeat().await,
        Err(QueueError::IdentityLost(_))
    ));
    assert!(matches!(
        stalled.shutdown().await,
        Err(QueueError::IdentityLost(_))
    ));
    assert_eq!(queue.depths().await.unwrap().processing, 1);
    assert_eq!(
        successor.ack(&taken).await.unwrap(),
        shardkeep::queue::AckOutcome::Acked
    );
}

#[tokio::test]
async fn malformed_consumer_ids_are_refused_before_touching_the_store() {
    for d in coord_drivers().await {
        malformed_consumer_ids_are_refused_before_touching_the_store_on(&d).await;
    }
}

async fn malformed_consumer_ids_are_refused_before_touching_the_store_on(d: &CoordDriver) {
    let queue = queue(d);
    let long = "x".repeat(129);
    for bad in ["", "has space", "a:b", "{tag}", "é", long.as_str()] {
        assert!(
            matches!(
                queue.consumer_with_id(bad).await,
                Err(QueueError::InvalidConsumerId(_))
            ),
            "{bad:?}"
        );
    }
    assert!(
        d.queue_consumers("identity").await.is_empty(),
        "{}",
        d.name()
    );
    assert!(d.all_keys().await.is_empty(), "{}", d.name());
}
