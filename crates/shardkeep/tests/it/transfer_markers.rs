//! Transfer activation markers live while their transfer is pending: from the source's start
//! until it completes the transfer (having seen the activation) or the pending record expires.
//! Consuming the handoff does not end a transfer.

use std::time::Duration;

use chrono::Utc;
use shardkeep::HandoffScope;
use shardkeep::coord::{HandoffTake, InstanceRecord, TransferActivation, maintain_once};
use shardkeep::{Coordination, Ttl};
use shardkeep_testkit::{CoordDriver, coord_drivers};

fn activation(token: &str) -> TransferActivation {
    TransferActivation {
        transfer_token: token.into(),
        target_shard: "shard-2".into(),
        target_zone: "zone-1".into(),
        activated_at: Utc::now(),
    }
}

fn upkeeper() -> InstanceRecord {
    InstanceRecord {
        instance_id: "serve-1".into(),
        service: "game_server".into(),
        address: "127.0.0.1:9000".into(),
        shard_id: None,
        registered_at: Utc::now(),
    }
}

async fn upkeep(coord: &Coordination) -> usize {
    let pass = maintain_once(coord, &upkeeper(), Ttl::from_secs(30).unwrap()).await;
    assert_eq!(pass.failed_steps, 0);
    pass.markers_removed
}

#[tokio::test]
async fn a_marker_outlives_its_taken_handoff_until_the_transfer_completes() {
    for d in coord_drivers().await {
        a_marker_outlives_its_taken_handoff_until_the_transfer_completes_on(&d).await;
    }
}

async fn a_marker_outlives_its_taken_handoff_until_the_transfer_completes_on(d: &CoordDriver) {
    let coord = d.coordination();
    let ttl = Ttl::from_secs(600).unwrap();
    let scope = HandoffScope::Placement("shard-2".into());
    // The source starts the transfer and stores the handoff; the destination takes it and
    // activates.
    coord.transfer_begin("t-1", ttl).await.unwrap();
    coord.handoff_put("t-1", &scope, b"x", ttl).await.unwrap();
    let taken = coord
        .handoff_take("t-1", std::slice::from_ref(&scope))
        .await
        .unwrap();
    assert!(matches!(taken, HandoffTake::Taken { .. }));
    coord
        .transfer_marker_set(&activation("t-1"), ttl)
        .await
        .unwrap();
    // Upkeep runs before the source has looked for the activation.
    assert_eq!(upkeep(&coord).await, 0);
    assert!(
        coord.transfer_marker_get("t-1").await.unwrap().is_some(),
        "the marker of a pending transfer was removed once its handoff was taken"
    );
    // The source sees the activation and completes the transfer.
    assert!(coord.transfer_is_pending("t-1").await.unwrap());
    coord.transfer_complete("t-1").await.unwrap();
    assert!(!coord.transfer_is_pending("t-1").await.unwrap());
    assert!(coord.transfer_marker_get("t-1").await.unwrap().is_none());
}

#[tokio::test]
async fn markers_of_transfers_no_longer_pending_are_reconciled_away() {
    for d in coord_drivers().await {
        markers_of_transfers_no_longer_pending_are_reconciled_away_on(&d).await;
    }
}

async fn markers_of_transfers_no_longer_pending_are_reconciled_away_on(d: &CoordDriver) {
    let coord = d.coordination();
    let long = Ttl::from_secs(600).unwrap();
    coord.transfer_begin("t-live", long).await.unwrap();
    coord
        .transfer_begin("t-expiring", Ttl::from_millis(100).unwrap())
        .await
        .unwrap();
    for token in ["t-live", "t-expiring", "t-never-started"] {
        coord
            .transfer_marker_set(&activation(token), long)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(upkeep(&coord).await, 2);
    assert!(coord.transfer_marker_get("t-live").await.unwrap().is_some());
    for gone in ["t-expiring", "t-never-started"] {
        assert!(coord.transfer_marker_get(gone).await.unwrap().is_none());
    }
}

#[tokio::test]
async fn bad_transfer_tokens_are_typed_errors() {
    for d in coord_drivers().await {
        bad_transfer_tokens_are_typed_errors_on(&d).await;
    }
}

async fn bad_transfer_tokens_are_typed_errors_on(d: &CoordDriver) {
    let coord = d.coordination();
    let ttl = Ttl::from_secs(60).unwrap();
    assert!(coord.transfer_begin("", ttl).await.is_err());
    assert!(coord.transfer_complete("").await.is_err());
    let long = "t".repeat(300);
    assert!(coord.transfer_begin(&long, ttl).await.is_err());
    assert!(coord.transfer_is_pending(&long).await.is_err());
    let written = d.all_keys().await;
    assert!(written.is_empty(), "{} {written:?}", d.name());
}

/// Transfers begun and activated while a reconciliation pass walks the markers keep their
/// markers: each is judged by its own pending record.
#[tokio::test]
async fn markers_written_during_a_reconciliation_pass_survive_it() {
    for d in coord_drivers().await {
        markers_written_during_a_reconciliation_pass_survive_it_on(&d).await;
    }
}

async fn markers_written_during_a_reconciliation_pass_survive_it_on(d: &CoordDriver) {
    let coord = d.coordination();
    let long = Ttl::from_secs(600).unwrap();
    // Plenty of stale markers, so the pass takes many SCAN pages.
    for n in 0..3000 {
        let key = coord
            .keys()
            .transfer_activated(&format!("stale-{n}"))
            .unwrap();
        d.set_raw(&key, b"{}").await;
    }
    let writer = {
        let coord = d.coordination();
        tokio::spawn(async move {
            let mut tokens = Vec::new();
            for n in 0..200 {
                let token = format!("live-{n}");
                coord.transfer_begin(&token, long).await.unwrap();
                coord
                    .transfer_marker_set(&activation(&token), long)
                    .await
                    .unwrap();
                tokens.push(token);
            }
            tokens
        })
    };
    let mut removed = 0;
    while !writer.is_finished() {
        removed += coord
            .transfer_markers_reconcile_pending(100_000)
            .await
            .unwrap()
            .removed
            .len();
    }
    let tokens = writer.await.unwrap();
    removed += coord
        .transfer_markers_reconcile_pending(100_000)
        .await
        .unwrap()
        .removed
        .len();
    assert_eq!(removed, 3000, "exactly the stale markers go ({})", d.name());
    for token in tokens {
        assert!(
            coord.transfer_marker_get(&token).await.unwrap().is_some(),
            "{token}: a pending transfer's marker was removed"
        );
    }
}
