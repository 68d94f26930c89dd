//! The character store's conformance beyond the ladder tests (`ladder_store`, which run on both
//! drivers too): handoff claims, schema refusals, ordered location writes and the item-load
//! ledger, each body run on Postgres and on the embedded store's file; then what only the
//! embedded store has to answer (a corrupt row, an outage, calls it does not offer yet).

use std::time::Duration;

use chrono::{Duration as ChronoDuration, Utc};
use serde_json::json;
use shardkeep::character::{
    CharacterSnapshot, CharacterStore, LocationOrder, LocationWrite, SaveOutcome, StoreError,
};
use shardkeep_testkit::CharacterDrivers;
use sqlx::PgPool;
use uuid::Uuid;

use super::ladder_store::created;

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_handoff_adopts_its_content_only_while_the_dumping_copy_owns_the_row(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let driver = store.driver();
        let row = created(&store, "Aria").await;
        let source = store.claim(row.character_id, 0).await.unwrap().new_epoch;
        let handed = store
            .claim_for_handoff(row.character_id, 0, source, "h-1")
            .await
            .unwrap();
        assert!(handed.adopted, "{driver}: the dumping copy owned the row");
        assert_eq!(handed.claimed.new_epoch, source + 1, "{driver}");
        // The reply was lost: the same handoff claims again and still adopts.
        let again = store
            .claim_for_handoff(row.character_id, 0, source, "h-1")
            .await
            .unwrap();
        assert!(again.adopted, "{driver}: the handoff's own earlier claim");
        // The adopted handoffs continued the source's lineage: a release by the source copy
        // is still one of the row's own (its departed side gives the item up).
        let gem = Uuid::now_v7();
        let holder = CharacterSnapshot {
            owner_epoch: again.claimed.new_epoch,
            state: json!({ "inventory": [{ "id": gem.to_string() }] }).into(),
            ..row.clone()
        };
        assert_eq!(store.save(&holder).await.unwrap(), SaveOutcome::Saved(1));
        let taker = holding(&store, "Bryn", &[gem]).await;
        let committed = transfer(&store, departed(&row, gem, source), &taker, gem).await;
        assert!(
            matches!(
                committed,
                shardkeep::character::TransferCommit::Committed { .. }
            ),
            "{driver}: {committed:?}"
        );
        // The release was the row's last live write only if its copy owned the row: it did
        // not (a later handoff did), so the next claim still sees the save's live version.
        // A login took the character since: a late handoff of the old copy must not adopt.
        store.claim(row.character_id, 0).await.unwrap();
        let late = store
            .claim_for_handoff(row.character_id, 0, source, "h-2")
            .await
            .unwrap();
        assert_eq!(late.claimed.live_version, 1, "{driver}: the save's version");
        assert_eq!(
            late.claimed.row.state_version, 2,
            "{driver}: the release moved it on"
        );
        assert!(!late.adopted, "{driver}: the dumping copy was superseded");
        assert!(late.claimed.new_epoch > source + 2, "{driver}");
        assert!(
            matches!(
                store
                    .claim_for_handoff(row.character_id, 0, source, "")
                    .await,
                Err(StoreError::InvalidInput(_))
            ),
            "{driver}: a handoff claim names its token"
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_newer_schema_is_refused_without_minting_and_an_older_save_is_fenced(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let driver = store.driver();
        let newer = store.clone().with_schema_ceiling(2);
        let older = store.clone().with_schema_ceiling(1);
        let row = created(&store, "Aria").await;
        let claimed = newer.claim(row.character_id, 0).await.unwrap();
        let upgraded = CharacterSnapshot {
            owner_epoch: claimed.new_epoch,
            schema_version: 2,
            state: json!({ "coins": 1 }).into(),
            ..row.clone()
        };
        assert_eq!(
            newer.save(&upgraded).await.unwrap(),
            SaveOutcome::Saved(1),
            "{driver}"
        );
        match older.claim(row.character_id, 0).await {
            Err(StoreError::SchemaNewer {
                stored: 2,
                supported: 1,
                ..
            }) => {}
            other => panic!("{driver}: expected a schema refusal, got {other:?}"),
        }
        let (_, epoch) = store.version_of(row.character_id).await.unwrap().unwrap();
        assert_eq!(epoch, claimed.new_epoch, "{driver}: no epoch was minted");
        let stale = CharacterSnapshot {
            owner_epoch: claimed.new_epoch,
            state_version: 1,
            schema_version: 1,
            ..row.clone()
        };
        assert_eq!(
            store.save(&stale).await.unwrap(),
            SaveOutcome::SchemaOutdated(2),
            "{driver}"
        );
        assert_eq!(
            store.save_many(&[&stale]).await.unwrap()[0].1,
            SaveOutcome::SchemaOutdated(2),
            "{driver}"
        );
        let kept = store.load(row.character_id).await.unwrap().unwrap();
        assert_eq!(
            (kept.schema_version, kept.state["coins"].clone()),
            (2, json!(1)),
            "{driver}"
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn ordered_location_writes_tell_a_newer_cleanup_from_a_newer_live_write(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let driver = store.driver();
        let row = created(&store, "Aria").await;
        let epoch = store.claim(row.character_id, 0).await.unwrap().new_epoch;
        let at = |secs_ago: i64| Utc::now() - ChronoDuration::seconds(secs_ago);
        let order = |closed_at, known_version| LocationOrder {
            owner_epoch: epoch,
            closed_at,
            known_version,
        };
        let write = |o: LocationOrder, room: &'static str| {
            let store = store.clone();
            async move {
                store
                    .write_location_ordered(row.character_id, o, "zone-1", room)
                    .await
                    .unwrap()
            }
        };
        let newer = order(at(1), Some(0));
        assert_eq!(write(newer, "r1").await, LocationWrite::Written, "{driver}");
        assert_eq!(
            write(order(at(9), Some(0)), "r2").await,
            LocationWrite::Stale {
                newer_cleanup: true
            },
            "{driver}"
        );
        assert_eq!(
            write(newer, "r1").await,
            LocationWrite::Stale {
                newer_cleanup: false
            },
            "{driver}: the same cleanup again"
        );
        let mut current = store.load(row.character_id).await.unwrap().unwrap();
        assert_eq!(
            (current.zone_ref.as_deref(), current.room_ref.as_deref()),
            (Some("zone-1"), Some("r1")),
            "{driver}"
        );
        // A live flush lands after a later close's copy last knew the row.
        current.owner_epoch = epoch;
        assert!(matches!(
            store.save(&current).await.unwrap(),
            SaveOutcome::Saved(_)
        ));
        assert_eq!(
            write(order(Utc::now(), Some(0)), "r3").await,
            LocationWrite::Stale {
                newer_cleanup: false
            },
            "{driver}"
        );
        // An unordered write: fenced by the epoch only.
        assert_eq!(
            store
                .write_location(row.character_id, epoch, "zone-2", "r4")
                .await
                .unwrap(),
            LocationWrite::Written,
            "{driver}"
        );
        let newer_epoch = store.claim(row.character_id, 0).await.unwrap().new_epoch;
        assert_eq!(
            store
                .write_location(row.character_id, epoch, "zone-3", "r5")
                .await
                .unwrap(),
            LocationWrite::Superseded {
                current_epoch: newer_epoch
            },
            "{driver}"
        );
        assert_eq!(
            store
                .write_location(Uuid::now_v7(), epoch, "zone-3", "r5")
                .await
                .unwrap(),
            LocationWrite::NotFound,
            "{driver}"
        );
        assert!(
            matches!(
                store
                    .write_location(row.character_id, newer_epoch, "", "r5")
                    .await,
                Err(StoreError::InvalidInput(_))
            ),
            "{driver}"
        );
        let last = store.load(row.character_id).await.unwrap().unwrap();
        assert_eq!(last.zone_ref.as_deref(), Some("zone-2"), "{driver}");
    }
}

/// The item-load ledger as the driver holds it: `(item, epoch)` of one character's entries.
async fn ledger(
    drivers: &CharacterDrivers,
    store: &CharacterStore,
    pool: &PgPool,
    id: Uuid,
) -> Vec<(Uuid, i64)> {
    let mut rows: Vec<(Uuid, i64)> = match store.driver() {
        "postgres" => {
            sqlx::query_as("SELECT item_id, loaded_epoch FROM item_loads WHERE character_id = $1")
                .bind(id)
                .fetch_all(pool)
                .await
                .unwrap()
        }
        _ => sqlx::query_as("SELECT item_id, loaded_epoch FROM item_loads WHERE character_id = ?1")
            .bind(id)
            .fetch_all(drivers.sqlite.backend().pool())
            .await
            .unwrap(),
    };
    rows.sort_unstable();
    rows
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn item_loads_keep_the_newest_copy_of_each_item(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let driver = store.driver();
        let row = created(&store, "Aria").await;
        let (gem, sword) = (Uuid::now_v7(), Uuid::now_v7());
        store
            .record_item_loads(row.character_id, 3, &[gem, sword, gem])
            .await
            .unwrap();
        store
            .record_item_loads(row.character_id, 2, &[gem])
            .await
            .unwrap();
        store
            .record_item_loads(row.character_id, 5, &[sword])
            .await
            .unwrap();
        let mut expected = vec![(gem, 3), (sword, 5)];
        expected.sort_unstable();
        assert_eq!(
            ledger(&drivers, &store, &pool, row.character_id).await,
            expected,
            "{driver}"
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn the_embedded_store_refuses_a_corrupt_row_and_answers_nothing_in_an_outage(_pool: PgPool) {
    let sqlite = shardkeep_testkit::TestSqlite::new().await;
    let store = CharacterStore::embedded(sqlite.backend());
    let row = created(&store, "Aria").await;
    sqlx::query("UPDATE characters SET state = '{broken' WHERE id = ?1")
        .bind(row.character_id)
        .execute(sqlite.backend().pool())
        .await
        .unwrap();
    let err = store.load(row.character_id).await.unwrap_err();
    assert!(
        err.to_string().contains("not JSON"),
        "a corrupt document is named: {err}"
    );
    assert!(store.claim(row.character_id, 0).await.is_err());
    assert_eq!(
        store.version_of(row.character_id).await.unwrap(),
        Some((0, 0)),
        "a claim that could not read its row minted nothing"
    );

    let other = created(&store, "Bryn").await;
    sqlite.backend().fail_for(Duration::from_secs(60));
    let snap = CharacterSnapshot {
        owner_epoch: 0,
        ..other.clone()
    };
    assert!(store.load(other.character_id).await.is_err());
    assert!(store.claim(other.character_id, 0).await.is_err());
    assert!(store.save(&snap).await.is_err());
    assert!(store.save_many(&[&snap]).await.is_err());
    assert!(
        store
            .write_location(other.character_id, 0, "z", "r")
            .await
            .is_err()
    );
    assert!(
        store
            .create(&shardkeep_testkit::fixtures::new_character("Cato"))
            .await
            .is_err()
    );
    sqlite.backend().end_outage();
    let after = store.load(other.character_id).await.unwrap().unwrap();
    assert_eq!(after, other, "nothing was written during the outage");
    assert!(store.load_by_name("cato").await.unwrap().is_none());
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_embedded_claim_for_a_model_dead_letters_a_queued_job_that_does_not_decode(
    _pool: PgPool,
) {
    let sqlite = shardkeep_testkit::TestSqlite::new().await;
    let plain = CharacterStore::embedded(sqlite.backend());
    let store = plain
        .clone()
        .for_model(shardkeep_testkit::model::LedgerModel::handle());
    let row = created(&store, "Aria").await;
    // A job queued for the character whose payload does not decode: the claim settles it first,
    // as a dead letter (after the claim it could never apply), and goes on.
    let now = Utc::now().timestamp_micros();
    sqlx::query(
        "INSERT INTO persistence_retry_jobs (retry_job_id, job_kind, character_id, payload,
             next_attempt_at, session_impact, source, idempotency_key, owner_epoch, origin,
             issued_at, created_at, updated_at)
         VALUES (?1, 'state', ?2, '{}', ?3, 'none', 'test', 'k-1', 0, 'test', ?3, ?3, ?3)",
    )
    .bind(Uuid::now_v7())
    .bind(row.character_id)
    .bind(now)
    .execute(sqlite.backend().pool())
    .await
    .unwrap();
    assert_eq!(store.claim(row.character_id, 0).await.unwrap().new_epoch, 1);
    let (queued, dead): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM persistence_retry_jobs),
                (SELECT count(*) FROM persistence_job_dead_letters WHERE idempotency_key = 'k-1')",
    )
    .fetch_one(sqlite.backend().pool())
    .await
    .unwrap();
    assert_eq!((queued, dead), (0, 1));
    // A claim that settles nothing goes on as well.
    assert_eq!(plain.claim(row.character_id, 0).await.unwrap().new_epoch, 2);
}

/// A live copy of a new character holding `items` (ids in the ledger model's inventory),
/// saved once, and the snapshot it would dump next.
async fn holding(store: &CharacterStore, name: &str, items: &[Uuid]) -> CharacterSnapshot {
    let row = created(store, name).await;
    let epoch = store.claim(row.character_id, 0).await.unwrap().new_epoch;
    let inventory: Vec<serde_json::Value> = items
        .iter()
        .map(|id| json!({ "id": id.to_string() }))
        .collect();
    let mut live = CharacterSnapshot {
        owner_epoch: epoch,
        state: json!({ "inventory": inventory }).into(),
        ..row
    };
    assert_eq!(store.save(&live).await.unwrap(), SaveOutcome::Saved(1));
    live.state_version = 1;
    live
}

fn with_items(snapshot: &CharacterSnapshot, items: &[Uuid]) -> CharacterSnapshot {
    let inventory: Vec<serde_json::Value> = items
        .iter()
        .map(|id| json!({ "id": id.to_string() }))
        .collect();
    CharacterSnapshot {
        state: json!({ "inventory": inventory }).into(),
        ..snapshot.clone()
    }
}

/// The audit row of a new pickup by `acquirer` of what `releaser` put down.
fn pickup(acquirer: Uuid, releaser: Uuid) -> shardkeep::audit::AuditEvent {
    shardkeep::audit::AuditEvent::item_transferred(acquirer, releaser, Uuid::now_v7(), json!({}))
}

/// The releasing copy `snapshot`, holding no longer the `item` it put down.
fn held(snapshot: &CharacterSnapshot, item: Uuid) -> shardkeep::character::Releaser<'_> {
    shardkeep::character::Releaser::Held {
        snapshot,
        item_id: Some(item),
        released_epoch: snapshot.owner_epoch,
    }
}

/// The character of `row`, gone from the shard, whose copy at `released_epoch` put `item` down.
fn departed(
    row: &CharacterSnapshot,
    item: Uuid,
    released_epoch: i64,
) -> shardkeep::character::Releaser<'static> {
    shardkeep::character::Releaser::Departed {
        character_id: row.character_id,
        item_id: item,
        released_epoch,
    }
}

/// Commits `item` from `releaser` to `taker` (its snapshot then holding just that item), under a
/// new pickup's audit row.
async fn transfer(
    store: &CharacterStore,
    releaser: shardkeep::character::Releaser<'_>,
    taker: &CharacterSnapshot,
    item: Uuid,
) -> shardkeep::character::TransferCommit {
    let releaser_id = match releaser {
        shardkeep::character::Releaser::Held { snapshot, .. } => snapshot.character_id,
        shardkeep::character::Releaser::Departed { character_id, .. } => character_id,
    };
    let audit = pickup(taker.character_id, releaser_id);
    store
        .commit_transfer(
            &shardkeep_testkit::model::LedgerModel::handle(),
            releaser,
            &with_items(taker, &[item]),
            &audit,
        )
        .await
        .unwrap()
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_transfer_commits_both_sides_once_and_refuses_a_phantom(pool: PgPool) {
    use shardkeep::character::TransferCommit;
    let model = shardkeep_testkit::model::LedgerModel::handle();
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let driver = store.driver();
        let gem = Uuid::now_v7();
        let giver = holding(&store, "Aria", &[gem]).await;
        let taker = holding(&store, "Bryn", &[]).await;
        let released = with_items(&giver, &[]);
        let picked = with_items(&taker, &[gem]);
        let audit = pickup(taker.character_id, giver.character_id);
        let release = held(&released, gem);
        assert_eq!(
            store
                .commit_transfer(&model, release, &picked, &audit)
                .await
                .unwrap(),
            TransferCommit::Committed {
                releaser_version: Some(2),
                acquirer_version: 2
            },
            "{driver}"
        );
        assert_eq!(
            store
                .commit_transfer(&model, release, &picked, &audit)
                .await
                .unwrap(),
            TransferCommit::AlreadyCommitted,
            "{driver}: the same transfer again"
        );
        let (giver_row, taker_row) = (
            store.load(giver.character_id).await.unwrap().unwrap(),
            store.load(taker.character_id).await.unwrap().unwrap(),
        );
        assert_eq!(
            (giver_row.state_version, taker_row.state_version),
            (2, 2),
            "{driver}: written once"
        );
        assert!(!model.holds_item(giver_row.state.value(), gem), "{driver}");
        assert!(model.holds_item(taker_row.state.value(), gem), "{driver}");

        // The giver's copy still holds what it says it released: a phantom.
        let ring = Uuid::now_v7();
        let liar = holding(&store, "Cato", &[ring]).await;
        let third = holding(&store, "Dara", &[]).await;
        let refused = transfer(&store, held(&liar, ring), &third, ring).await;
        assert!(
            matches!(refused, TransferCommit::ReleaserSuperseded { .. }),
            "{driver}: {refused:?}"
        );
        let untouched = store.load(third.character_id).await.unwrap().unwrap();
        assert_eq!(untouched.state_version, 1, "{driver}: nothing written");
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_transfer_whose_acquirer_raced_writes_neither_side(pool: PgPool) {
    use shardkeep::character::TransferCommit;
    let model = shardkeep_testkit::model::LedgerModel::handle();
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let driver = store.driver();
        let gem = Uuid::now_v7();
        let giver = holding(&store, "Aria", &[gem]).await;
        let taker = holding(&store, "Bryn", &[]).await;
        // Something wrote the acquirer's row since its snapshot was dumped.
        assert!(matches!(
            store.save(&taker).await.unwrap(),
            SaveOutcome::Saved(2)
        ));
        let released = with_items(&giver, &[]);
        let outcome = transfer(&store, held(&released, gem), &taker, gem).await;
        assert_eq!(
            outcome,
            TransferCommit::VersionRace {
                releaser_current: None,
                acquirer_current: Some(2)
            },
            "{driver}"
        );
        let giver_row = store.load(giver.character_id).await.unwrap().unwrap();
        assert_eq!(
            giver_row.state_version, 1,
            "{driver}: the releaser's save, made first, was rolled back"
        );
        assert!(model.holds_item(giver_row.state.value(), gem), "{driver}");
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_release_older_than_a_load_holding_the_item_is_a_phantom(pool: PgPool) {
    use shardkeep::character::TransferCommit;
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let driver = store.driver();
        let gem = Uuid::now_v7();
        let giver = holding(&store, "Aria", &[]).await;
        let taker = holding(&store, "Bryn", &[]).await;
        // A later copy of the giver started out holding the gem its older copy says it let go.
        store
            .record_item_loads(giver.character_id, giver.owner_epoch + 1, &[gem])
            .await
            .unwrap();
        let outcome = transfer(&store, held(&giver, gem), &taker, gem).await;
        assert!(
            matches!(outcome, TransferCommit::ReleaserSuperseded { .. }),
            "{driver}: {outcome:?}"
        );
        assert_eq!(
            store
                .load(taker.character_id)
                .await
                .unwrap()
                .unwrap()
                .state_version,
            1,
            "{driver}: nothing written"
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_departed_releaser_gives_the_item_up_only_within_its_lineage(pool: PgPool) {
    use shardkeep::character::TransferCommit;
    let model = shardkeep_testkit::model::LedgerModel::handle();
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let driver = store.driver();
        // The giver dropped the gem and left before a save recorded the drop: its row still
        // holds it, and its copy (the row's owner) released it.
        let gem = Uuid::now_v7();
        let giver = holding(&store, "Aria", &[gem]).await;
        let taker = holding(&store, "Bryn", &[]).await;
        let committed = transfer(
            &store,
            departed(&giver, gem, giver.owner_epoch),
            &taker,
            gem,
        )
        .await;
        assert_eq!(
            committed,
            TransferCommit::Committed {
                releaser_version: Some(2),
                acquirer_version: 2
            },
            "{driver}"
        );
        let giver_row = store.load(giver.character_id).await.unwrap().unwrap();
        assert!(!model.holds_item(giver_row.state.value(), gem), "{driver}");
        // The departed copy owned the row, so the release is its last live write: a checkpoint
        // dumped before it loses to the row at the next claim.
        let next = store.claim(giver.character_id, 0).await.unwrap();
        assert_eq!(next.live_version, 2, "{driver}");
        let taker_row = store.load(taker.character_id).await.unwrap().unwrap();
        assert!(model.holds_item(taker_row.state.value(), gem), "{driver}");

        // A later login of another character's giver started a new lineage holding the ring:
        // the old copy's release of it may be a zombie's phantom.
        let ring = Uuid::now_v7();
        let old = holding(&store, "Cato", &[ring]).await;
        let relogin = store.claim(old.character_id, 0).await.unwrap().new_epoch;
        assert!(relogin > old.owner_epoch);
        let third = holding(&store, "Dara", &[]).await;
        let refused = transfer(&store, departed(&old, ring, old.owner_epoch), &third, ring).await;
        assert_eq!(
            refused,
            TransferCommit::ReleaserSuperseded {
                current_epoch: relogin
            },
            "{driver}"
        );
        let kept = store.load(old.character_id).await.unwrap().unwrap();
        assert!(
            model.holds_item(kept.state.value(), ring),
            "{driver}: the row keeps it"
        );
        assert_eq!(
            store
                .load(third.character_id)
                .await
                .unwrap()
                .unwrap()
                .state_version,
            1,
            "{driver}: nothing written"
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_batch_larger_than_one_statement_keeps_each_outcome_in_order(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let driver = store.driver();
        let mut snaps = Vec::new();
        for n in 0..300 {
            let row = created(&store, &format!("Many{n}")).await;
            snaps.push(CharacterSnapshot {
                owner_epoch: 1,
                state: json!({ "n": n }).into(),
                ..row
            });
        }
        // Every seventh was dumped from a version the row never had.
        for (n, snap) in snaps.iter_mut().enumerate() {
            if n % 7 == 3 {
                snap.state_version = 5;
            }
        }
        let refs: Vec<&CharacterSnapshot> = snaps.iter().collect();
        let outcomes = store.save_many(&refs).await.unwrap();
        assert_eq!(outcomes.len(), 300, "{driver}");
        for (n, (id, outcome)) in outcomes.iter().enumerate() {
            assert_eq!(*id, snaps[n].character_id, "{driver}: in input order");
            let expected = if n % 7 == 3 {
                SaveOutcome::VersionConflict(0)
            } else {
                SaveOutcome::Saved(1)
            };
            assert_eq!(*outcome, expected, "{driver}: snapshot {n}");
        }
        let landed = store.load(snaps[200].character_id).await.unwrap().unwrap();
        assert_eq!(landed.state["n"], 200, "{driver}");
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_batched_instance_save_keeps_the_zone_anchor_and_a_zoned_one_moves_it(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let driver = store.driver();
        let mut snaps = Vec::new();
        for (n, zone_ref) in [None, Some(String::new()), Some("darkwood".to_owned())]
            .into_iter()
            .enumerate()
        {
            let row = created(&store, &format!("Inst{n}")).await;
            snaps.push(CharacterSnapshot {
                owner_epoch: 1,
                zone_ref,
                room_ref: Some(format!("room-{n}")),
                chargen: None,
                ..row
            });
        }
        let refs: Vec<&CharacterSnapshot> = snaps.iter().collect();
        for (_, outcome) in store.save_many(&refs).await.unwrap() {
            assert_eq!(outcome, SaveOutcome::Saved(1), "{driver}");
        }
        let mut places = Vec::new();
        for snap in &snaps {
            let row = store.load(snap.character_id).await.unwrap().unwrap();
            assert_eq!(row.chargen, None, "{driver}: chargen cleared");
            places.push((row.zone_ref, row.room_ref));
        }
        assert_eq!(
            places,
            vec![
                (Some("midgaard".into()), Some("market".into())),
                (Some("midgaard".into()), Some("market".into())),
                (Some("darkwood".into()), Some("room-2".into())),
            ],
            "{driver}"
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_batched_save_writes_every_field_and_refuses_an_older_schema(pool: PgPool) {
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let driver = store.driver();
        let kept = created(&store, "Full").await;
        let epoch = store.claim(kept.character_id, 0).await.unwrap().new_epoch;
        let full = CharacterSnapshot {
            zone_ref: Some("darkwood".into()),
            room_ref: Some("clearing".into()),
            state: json!({ "attributes": { "str": 14 } }).into(),
            chargen: Some(json!({ "pending": true })),
            owner_epoch: epoch,
            issue_mark: 7,
            schema_version: 3,
            ..kept.clone()
        };
        let newer = created(&store, "Newer").await;
        let upgraded = CharacterSnapshot {
            owner_epoch: 1,
            schema_version: 2,
            ..newer.clone()
        };
        assert_eq!(store.save(&upgraded).await.unwrap(), SaveOutcome::Saved(1));
        let older = CharacterSnapshot {
            owner_epoch: 1,
            state_version: 1,
            schema_version: 1,
            ..newer.clone()
        };
        let outcomes = store.save_many(&[&full, &older]).await.unwrap();
        assert_eq!(
            outcomes.iter().map(|(_, o)| *o).collect::<Vec<_>>(),
            vec![SaveOutcome::Saved(1), SaveOutcome::SchemaOutdated(2)],
            "{driver}"
        );
        let back = store.load(kept.character_id).await.unwrap().unwrap();
        assert_eq!(
            back,
            CharacterSnapshot {
                state_version: 1,
                ..full.clone()
            },
            "{driver}: every field, the issue mark of the row's owner included"
        );
        let claimed = store.claim(kept.character_id, 0).await.unwrap();
        assert_eq!(claimed.live_version, 1, "{driver}: the live version moved");
        assert_eq!(
            (claimed.content_mark.epoch, claimed.content_mark.seq),
            (epoch, 7),
            "{driver}"
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn the_bookkeeping_prune_takes_only_what_is_past_its_retention(pool: PgPool) {
    use shardkeep::character::{Bookkeeping, BookkeepingRetention, TransferCommit};
    let drivers = CharacterDrivers::new(&pool).await;
    for store in drivers.stores() {
        let driver = store.driver();
        let bookkeeping = match driver {
            "postgres" => Bookkeeping::new(shardkeep_testkit::pg(&pool)),
            _ => Bookkeeping::embedded(drivers.sqlite.backend()),
        };
        let (gem, ring) = (Uuid::now_v7(), Uuid::now_v7());
        let giver = holding(&store, "Aria", &[gem]).await;
        let taker = holding(&store, "Bryn", &[]).await;
        let released = with_items(&giver, &[]);
        let committed = transfer(&store, held(&released, gem), &taker, gem).await;
        assert!(
            matches!(committed, TransferCommit::Committed { .. }),
            "{driver}"
        );
        store
            .record_item_loads(taker.character_id, taker.owner_epoch, &[gem, ring])
            .await
            .unwrap();
        let before = bookkeeping.sizes().await.unwrap();
        assert_eq!(
            (before.item_loads, before.item_releases),
            (2, 1),
            "{driver}"
        );
        let kept = bookkeeping
            .prune_once(BookkeepingRetention::default())
            .await
            .unwrap();
        assert_eq!((kept.item_loads, kept.item_releases), (0, 0), "{driver}");
        tokio::time::sleep(Duration::from_millis(5)).await;
        let none = BookkeepingRetention {
            unsequenced_effects: Duration::ZERO,
            item_loads: Duration::ZERO,
            transfer_activations: Duration::ZERO,
        };
        let pruned = bookkeeping.prune_once(none).await.unwrap();
        assert_eq!(
            (pruned.item_loads, pruned.item_releases),
            (2, 1),
            "{driver}"
        );
        let after = bookkeeping.sizes().await.unwrap();
        assert_eq!((after.item_loads, after.item_releases), (0, 0), "{driver}");
    }
}

/// A copy checkpoints holding a gem and a sword (a mark past its row's content); an offline gift
/// lands on its row; it puts the gem down and dies; another player takes the gem, which writes
/// the departed copy's row as a live write without it. The next load prefers the checkpoint on
/// its mark (it was dumped after the row's content), leaves the gem out and plays the gift on it:
/// the sword it won since stays, the gem is in one row, the gift is kept.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_checkpoint_that_wins_on_its_mark_leaves_out_what_its_departed_copy_gave_up(
    pool: PgPool,
) {
    use shardkeep::character::{CharacterLoader, CheckpointWrite, LoadSource, TransferCommit};
    use shardkeep::retry::{
        IdempotencyEnvelope, OFFLINE_EPOCH, Origin, PersistenceRetryJob, PersistenceRetryPayload,
        RetryWorkerConfig,
    };
    let model = shardkeep_testkit::model::LedgerModel::handle();
    let drivers = shardkeep_testkit::JobDrivers::new(&pool).await;
    let redis = shardkeep_testkit::TestRedis::new().await;
    for d in drivers.drivers() {
        let driver = d.name();
        let store = d.characters();
        let checkpoints = d.checkpoints(&redis);
        let (gem, sword) = (Uuid::now_v7(), Uuid::now_v7());
        let giver = holding(&store, "Aria", &[gem]).await;
        let taker = holding(&store, "Bryn", &[]).await;
        let checkpoint = CharacterSnapshot {
            issue_mark: 1,
            ..with_items(&giver, &[gem, sword])
        };
        assert_eq!(
            checkpoints.write(&checkpoint).await.unwrap(),
            CheckpointWrite::Written,
            "{driver}"
        );
        let clock: std::sync::Arc<dyn shardkeep::clock::Clock> =
            std::sync::Arc::new(shardkeep::clock::SystemClock);
        let (queue, signals) = d.queue(8, clock.clone());
        let mut worker = d.worker(signals, RetryWorkerConfig::new("w"), clock);
        let gift = PersistenceRetryJob::new(
            PersistenceRetryPayload::effect(
                giver.character_id,
                &shardkeep_testkit::model::LedgerEffect::CombatRewards {
                    experience: 7,
                    currency: 0,
                    items: vec![],
                },
            )
            .unwrap(),
            IdempotencyEnvelope {
                idempotency_key: "gift".into(),
                owner_epoch: OFFLINE_EPOCH,
                origin: Origin::CombatRewards,
                issued_at: Utc::now(),
                issue_seq: 0,
            },
            "test",
            None,
        )
        .unwrap();
        queue.enqueue(&gift).await.unwrap();
        assert_eq!(worker.run_until_idle().await.unwrap(), 1, "{driver}");
        let committed = transfer(
            &store,
            departed(&giver, gem, giver.owner_epoch),
            &taker,
            gem,
        )
        .await;
        assert!(
            matches!(committed, TransferCommit::Committed { .. }),
            "{driver}: {committed:?}"
        );
        let loader = CharacterLoader::new(
            store.clone(),
            Some(checkpoints.clone()),
            model.clone(),
            Duration::from_secs(5),
        );
        let loaded = loader.claim_and_load(giver.character_id, 0).await.unwrap();
        let state = loaded.snapshot.state.value();
        assert_eq!(loaded.source, LoadSource::Checkpoint, "{driver}");
        assert!(model.holds_item(state, sword), "{driver}: {state}");
        assert!(
            !model.holds_item(state, gem),
            "{driver}: the gem is Bryn's: {state}"
        );
        assert_eq!(state["experience"], 7, "{driver}: the gift: {state}");
    }
}
