//! Placement records on every coordination driver: the owner-epoch fence, tombstones, batches
//! with mixed outcomes, the record's lifetime, and a stored record no writer wrote replaced.

use chrono::Utc;
use shardkeep::keyspace::PLACEMENT_TTL;
use shardkeep::placement::{PlacementRecord, PlacementWrite};
use shardkeep_testkit::coord_drivers;
use uuid::Uuid;

fn record(character: Uuid, epoch: i64, zone: Option<&str>) -> PlacementRecord {
    PlacementRecord {
        character_id: character,
        shard_id: zone.map(|_| "shard-a".to_owned()),
        zone_id: zone.map(str::to_owned),
        owner_epoch: epoch,
        updated_at: Utc::now(),
    }
}

#[tokio::test]
async fn a_newer_owner_fences_an_older_writer() {
    for d in coord_drivers().await {
        let store = d.placement();
        let character = Uuid::now_v7();
        assert_eq!(
            store
                .write(&record(character, 3, Some("z-1")))
                .await
                .unwrap(),
            PlacementWrite::Written
        );
        assert_eq!(
            store
                .write(&record(character, 2, Some("z-old")))
                .await
                .unwrap(),
            PlacementWrite::Stale { stored_epoch: 3 },
            "{}",
            d.name()
        );
        let same = record(character, 3, Some("z-2"));
        assert_eq!(store.write(&same).await.unwrap(), PlacementWrite::Written);
        assert_eq!(store.read(character).await.unwrap(), Some(same));
        // A clean logout's tombstone keeps the epoch as the floor.
        let tombstone = record(character, 3, None);
        store.write(&tombstone).await.unwrap();
        let read = store.read(character).await.unwrap().unwrap();
        assert!(read.is_tombstone(), "{}", d.name());
        assert_eq!(
            store
                .write(&record(character, 2, Some("z-1")))
                .await
                .unwrap(),
            PlacementWrite::Stale { stored_epoch: 3 }
        );
        assert_eq!(store.read(Uuid::now_v7()).await.unwrap(), None);
        let key = d.keys().placement(&character.to_string()).unwrap();
        let ttl = d.pttl(&key).await.unwrap();
        let full = i64::try_from(PLACEMENT_TTL.as_millis()).unwrap();
        assert!((full - 5_000..=full).contains(&ttl), "{} {ttl}", d.name());
    }
}

/// A copy's tombstone is the last word of its epoch: a live placement of that copy queued
/// before its logout and landing after it (a resume's, queued outside the copy's lock) is
/// refused, alone and in a batch, and a writer handed both keeps the tombstone; the copy's own
/// tombstone may be written again, and the next copy places over it.
#[tokio::test]
async fn a_copys_tombstone_is_the_last_word_of_its_epoch() {
    use shardkeep::drain::BarrierOutcome;
    use shardkeep::placement::PlacementWriter;
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;

    for d in coord_drivers().await {
        let store = d.placement();
        let character = Uuid::now_v7();
        let tombstone = |epoch| record(character, epoch, None);
        store
            .write(&record(character, 3, Some("z-1")))
            .await
            .unwrap();
        store.write(&tombstone(3)).await.unwrap();
        assert_eq!(
            store
                .write(&record(character, 3, Some("z-1")))
                .await
                .unwrap(),
            PlacementWrite::Left { epoch: 3 },
            "{}",
            d.name()
        );
        let read = store.read(character).await.unwrap().unwrap();
        assert!(read.is_tombstone(), "{}: {read:?}", d.name());
        assert_eq!(
            store.write(&tombstone(3)).await.unwrap(),
            PlacementWrite::Written,
            "{}: a tombstone written again",
            d.name()
        );
        let writes = store
            .write_many(&[
                record(character, 4, Some("z-2")),
                tombstone(4),
                record(character, 4, Some("z-2")),
            ])
            .await
            .unwrap();
        assert_eq!(
            writes,
            vec![
                PlacementWrite::Written,
                PlacementWrite::Written,
                PlacementWrite::Left { epoch: 4 }
            ],
            "{}",
            d.name()
        );
        assert!(
            store.read(character).await.unwrap().unwrap().is_tombstone(),
            "{}",
            d.name()
        );
        // The writer: the late placement queued after the tombstone (one batch or two).
        let other = Uuid::now_v7();
        let cancel = CancellationToken::new();
        let writer = PlacementWriter::spawn(
            Some(d.placement()),
            16,
            Duration::from_secs(10),
            cancel.child_token(),
        );
        assert!(writer.enqueue(record(other, 2, Some("z-1"))));
        assert!(writer.enqueue(record(other, 2, None)));
        assert!(writer.enqueue(record(other, 2, Some("z-1"))));
        assert_eq!(
            writer.barrier(Duration::from_secs(10)).await,
            BarrierOutcome::Drained
        );
        let read = store.read(other).await.unwrap().unwrap();
        assert!(read.is_tombstone(), "{}: {read:?}", d.name());
        cancel.cancel();
    }
}

#[tokio::test]
async fn a_batch_answers_each_record_in_order() {
    for d in coord_drivers().await {
        let store = d.placement();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        store.write(&record(a, 5, Some("z"))).await.unwrap();
        let writes = store
            .write_many(&[
                record(a, 4, Some("z")),
                record(b, 1, Some("z")),
                record(a, 6, Some("z-6")),
            ])
            .await
            .unwrap();
        assert_eq!(
            writes,
            vec![
                PlacementWrite::Stale { stored_epoch: 5 },
                PlacementWrite::Written,
                PlacementWrite::Written
            ],
            "{}",
            d.name()
        );
        let read = store.read(a).await.unwrap().unwrap();
        assert_eq!(read.zone_id.as_deref(), Some("z-6"));
        assert!(store.write_many(&[]).await.unwrap().is_empty());
    }
}

#[tokio::test]
async fn a_record_no_writer_wrote_is_replaced_and_fences_after() {
    for d in coord_drivers().await {
        if d.redis().is_some() {
            // The Redis form (a hash with a corrupt epoch) is covered in `corrupt_fences`.
            continue;
        }
        let store = d.placement();
        for junk in [&b"not json"[..], br#"{"owner_epoch": "inf"}"#, b"[]"] {
            let character = Uuid::now_v7();
            let key = d.keys().placement(&character.to_string()).unwrap();
            d.set_raw(&key, junk).await;
            assert!(store.read(character).await.is_err(), "a corrupt read fails");
            assert_eq!(
                store.write(&record(character, 2, Some("z"))).await.unwrap(),
                PlacementWrite::Written,
                "over {junk:?}"
            );
            assert_eq!(
                store.write(&record(character, 1, Some("z"))).await.unwrap(),
                PlacementWrite::Stale { stored_epoch: 2 }
            );
        }
    }
}

/// A writer names the characters whose placement updates it dropped (here: a writer already
/// stopped), with the latest update of each, so their owner can write them again, and forgets
/// them once taken; writes that land name nobody. A write that fails in its batch names its characters the same way
/// (`live_records::a_placement_write_that_failed_is_written_again_at_the_next_refresh`).
#[tokio::test]
async fn a_writer_names_the_characters_whose_updates_it_dropped() {
    use shardkeep::placement::PlacementWriter;
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;

    for d in coord_drivers().await {
        let cancel = CancellationToken::new();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let landing = PlacementWriter::spawn(
            Some(d.placement()),
            16,
            Duration::from_secs(10),
            cancel.child_token(),
        );
        assert!(landing.enqueue(record(a, 1, Some("z-2"))));
        landing.barrier(Duration::from_secs(10)).await;
        assert!(landing.take_failed().is_empty(), "{}", d.name());
        assert_eq!(
            d.placement().read(a).await.unwrap().and_then(|r| r.zone_id),
            Some("z-2".to_owned()),
            "{}",
            d.name()
        );
        // Stopped: its queue refuses what comes after.
        cancel.cancel();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while landing.enqueue(record(b, 1, Some("z-1"))) {
            assert!(tokio::time::Instant::now() < deadline, "{}", d.name());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!landing.enqueue(record(a, 2, Some("z-3"))));
        // An older copy's update dropped after a newer one's does not replace it.
        assert!(!landing.enqueue(record(a, 1, None)));
        let failed = landing.take_failed();
        let kept = |failed: &[PlacementRecord], id| {
            failed
                .iter()
                .find(|r| r.character_id == id)
                .map(|r| (r.owner_epoch, r.zone_id.clone()))
        };
        assert_eq!(failed.len(), 2, "{}: {failed:?}", d.name());
        assert_eq!(
            kept(&failed, a),
            Some((2, Some("z-3".to_owned()))),
            "{}",
            d.name()
        );
        assert_eq!(
            kept(&failed, b),
            Some((1, Some("z-1".to_owned()))),
            "{}",
            d.name()
        );
        assert!(landing.take_failed().is_empty(), "{}: taken once", d.name());
        // Owed again without a write: taken at the next call. Within one epoch the copy's
        // tombstone is kept, whichever failure was reported last (a dropped tombstone is
        // reported before the failed batch of the placement it follows).
        landing.owe(failed);
        landing.owe([record(b, 1, None)]);
        landing.owe([record(b, 1, Some("z-1"))]);
        let again = landing.take_failed();
        assert_eq!(
            kept(&again, a),
            Some((2, Some("z-3".to_owned()))),
            "{}",
            d.name()
        );
        assert_eq!(kept(&again, b), Some((1, None)), "{}", d.name());
        // A retry the stopped writer cannot queue is kept among the failed ones.
        landing.retry([record(a, 3, None)]);
        assert_eq!(
            kept(&landing.take_failed(), a),
            Some((3, None)),
            "{}",
            d.name()
        );
    }
}
