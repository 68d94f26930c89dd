use std::time::Duration;

use serde_json::json;
use shardkeep::audit::{
    AccountStore, AuditEvent, AuditReadError, AuditReader, AuditStore, Auditor, AuditorConfig,
    StaffReadLimit, Tier, Viewer,
};
use shardkeep::character::{NewCharacter, StoreError};
use shardkeep::drain::BarrierOutcome;
use shardkeep_testkit::{AuditDrivers, JobDriver};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::scene::{Driver, Scene};

/// The account store over the scene's driver.
fn accounts(scene: &Scene) -> AccountStore {
    match &scene.rows {
        JobDriver::Postgres(pool) => AccountStore::new(shardkeep_testkit::pg(pool)),
        JobDriver::Embedded(db) => AccountStore::embedded(db.clone()),
    }
}

/// An auditor with the default settings over `store`.
fn spawned(store: &AuditStore) -> Auditor {
    Auditor::spawn(
        store.clone(),
        AuditorConfig::default(),
        CancellationToken::new(),
    )
}

/// A subject's event kinds, oldest first, read through the trail's own API.
async fn kinds_in(store: &AuditStore, subject: Uuid) -> Vec<String> {
    let page = store.character_page(subject, None, 200).await.unwrap();
    page.rows.into_iter().rev().map(|r| r.event_kind).collect()
}

/// Every event kind of `subject` (a character or an account), in insertion order, read from
/// the rows underneath.
async fn kinds(rows: &JobDriver, subject: Uuid) -> Vec<String> {
    rows.fetch_all::<(String,)>(
        "SELECT event_kind FROM character_audit WHERE subject_id = $1 ORDER BY seq",
        Some(subject),
    )
    .await
    .into_iter()
    .map(|(kind,)| kind)
    .collect()
}

// The trail's conformance: each body below runs against every driver (Postgres, and the
// embedded store's file).

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_retried_enqueue_records_once(pool: PgPool) {
    let drivers = AuditDrivers::new(&pool).await;
    for store in drivers.stores() {
        let driver = store.driver();
        let auditor = spawned(&store);
        let c = Uuid::now_v7();
        let event = AuditEvent::track(c, "smithing", 1);
        auditor.emit(event.clone());
        auditor.emit(AuditEvent {
            id: Uuid::now_v7(),
            ..event
        });
        assert_eq!(
            auditor.barrier(Duration::from_secs(5)).await,
            BarrierOutcome::Drained
        );
        assert_eq!(kinds_in(&store, c).await, vec!["track"], "{driver}");
        let stats = auditor.stats();
        assert_eq!((stats.recorded, stats.duplicates), (1, 1), "{driver}");
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn one_poison_row_costs_only_itself(pool: PgPool) {
    let drivers = AuditDrivers::new(&pool).await;
    for store in drivers.stores() {
        let driver = store.driver();
        let auditor = spawned(&store);
        let c = Uuid::now_v7();
        for step in 1..=5 {
            auditor.emit(AuditEvent::track(c, "mining", step));
        }
        let mut poison = AuditEvent::track(c, "mining", 99);
        poison.dedup_key = String::new(); // violates the table's CHECK
        auditor.emit(poison);
        for step in 6..=9 {
            auditor.emit(AuditEvent::track(c, "mining", step));
        }
        assert_eq!(
            auditor.barrier(Duration::from_secs(5)).await,
            BarrierOutcome::Drained
        );
        assert_eq!(kinds_in(&store, c).await.len(), 9, "{driver}");
        let stats = auditor.stats();
        assert_eq!((stats.failed, stats.recorded), (1, 9), "{driver}");
        assert!(stats.fallbacks >= 1, "{driver}");
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn shutdown_drains_every_queued_event(pool: PgPool) {
    let drivers = AuditDrivers::new(&pool).await;
    for store in drivers.stores() {
        let driver = store.driver();
        let auditor = spawned(&store);
        let c = Uuid::now_v7();
        let mut accepted = 0;
        for n in 0..200 {
            if auditor.emit(AuditEvent::died(c, Uuid::now_v7(), None, json!({ "n": n }))) {
                accepted += 1;
            }
        }
        assert_eq!(
            auditor.barrier(Duration::from_secs(10)).await,
            BarrierOutcome::Drained
        );
        let mut recorded = 0;
        let mut before = None;
        loop {
            let page = store.character_page(c, before, 200).await.unwrap();
            recorded += page.rows.len();
            match page.next {
                Some(next) => before = Some(next),
                None => break,
            }
        }
        assert_eq!(recorded, accepted, "{driver}");
        assert_eq!(accepted as u64 + auditor.stats().dropped, 200, "{driver}");
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn rows_of_one_batch_read_back_in_insertion_order(pool: PgPool) {
    let drivers = AuditDrivers::new(&pool).await;
    for audit in drivers.stores() {
        let driver = audit.driver();
        let c = Uuid::now_v7();
        let batch: Vec<AuditEvent> = (1..=10)
            .map(|s| AuditEvent::track(c, "fishing", s))
            .collect();
        assert_eq!(audit.record(&batch).await.unwrap(), 10, "{driver}");
        assert_eq!(audit.record(&batch[..3]).await.unwrap(), 0, "{driver}");
        let page = audit.character_page(c, None, 4).await.unwrap();
        let steps: Vec<i64> = page
            .rows
            .iter()
            .map(|r| r.payload["step"].as_i64().unwrap())
            .collect();
        assert_eq!(
            steps,
            vec![10, 9, 8, 7],
            "{driver}: one transaction's instant: seq decides"
        );
        let next = audit.character_page(c, page.next, 4).await.unwrap();
        let steps: Vec<i64> = next
            .rows
            .iter()
            .map(|r| r.payload["step"].as_i64().unwrap())
            .collect();
        assert_eq!(steps, vec![6, 5, 4, 3], "{driver}");
        let last = audit.character_page(c, next.next, 4).await.unwrap();
        assert_eq!(last.rows.len(), 2, "{driver}");
        assert_eq!(last.next, None, "{driver}");
        assert_eq!(
            audit
                .character_page(c, None, 10_000)
                .await
                .unwrap()
                .rows
                .len(),
            10,
            "{driver}: limit clamps"
        );
        assert_eq!(
            audit.character_page(c, None, -3).await.unwrap().rows.len(),
            1,
            "{driver}"
        );
        // A later batch reads before the earlier one, across transactions too.
        audit
            .record(&[AuditEvent::track(c, "fishing", 11)])
            .await
            .unwrap();
        let newest = audit.character_page(c, None, 1).await.unwrap();
        assert_eq!(newest.rows[0].payload["step"], 11, "{driver}");
        // Pages of one cross from the later batch's instant to the earlier one's, and walk every
        // row once, newest first.
        let mut walked = Vec::new();
        let mut before = None;
        loop {
            let page = audit.character_page(c, before, 1).await.unwrap();
            walked.extend(
                page.rows
                    .iter()
                    .map(|r| r.payload["step"].as_i64().unwrap()),
            );
            match page.next {
                Some(next) => before = Some(next),
                None => break,
            }
        }
        assert_eq!(walked, (1..=11).rev().collect::<Vec<i64>>(), "{driver}");
    }
}

/// The staff view, by name in any case, folds in the owning account's tier changes and nothing
/// of another account, on each driver.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn each_driver_folds_only_the_owning_accounts_tier_changes_into_the_staff_view(pool: PgPool) {
    let drivers = AuditDrivers::new(&pool).await;
    for store in drivers.stores() {
        let driver = store.driver();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let name = format!("ΟΔΟΣ {driver}");
        let a_char = drivers.character(&store, a, &name).await;
        drivers
            .character(&store, b, &format!("οδος {driver}"))
            .await;
        store
            .record(&[AuditEvent::track(a_char, "smithing", 1)])
            .await
            .unwrap();
        store
            .record(&[
                AuditEvent::tier_changed(a, Uuid::now_v7(), None, json!({ "to": "moderator" })),
                AuditEvent::tier_changed(b, Uuid::now_v7(), None, json!({ "to": "admin" })),
            ])
            .await
            .unwrap();
        let reader = AuditReader::new(store.clone(), StaffReadLimit::default());
        let staff = Viewer {
            account_id: Uuid::now_v7(),
            tier: Tier::Admin,
        };
        let page = reader
            .staff_view(staff, &format!(" οδοσ {driver} "), None, 50)
            .await
            .unwrap();
        let subjects: Vec<(Uuid, String)> = page
            .rows
            .iter()
            .map(|r| (r.subject_id, r.event_kind.clone()))
            .collect();
        assert_eq!(
            subjects,
            vec![
                (a, "tier_changed".to_string()),
                (a_char, "track".to_string()),
            ],
            "{driver}"
        );
        let own = reader.self_view(a_char, None, 50).await.unwrap();
        assert!(own.rows.iter().all(|r| r.subject_type == "character"));
        assert!(matches!(
            reader.staff_view(staff, "nobody", None, 10).await,
            Err(AuditReadError::NotFound(_))
        ));
    }
}

async fn account_with_character(accounts: &AccountStore, name: &str) -> (Uuid, Uuid) {
    let account = Uuid::now_v7();
    accounts
        .create_account(account, Tier::Player)
        .await
        .unwrap();
    let character = Uuid::now_v7();
    accounts
        .create_character(
            &NewCharacter {
                character_id: character,
                account_id: account,
                name: name.into(),
                zone_ref: None,
                room_ref: None,
                state: json!({}).into(),
                chargen: None,
                schema_version: 1,
            },
            None,
        )
        .await
        .unwrap();
    (account, character)
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn account_changes_are_recorded_in_the_same_transaction(pool: PgPool) {
    for driver in Driver::ALL {
        let scene = Scene::new(&pool, driver).await;
        let accounts = accounts(&scene);
        let (account, character) = account_with_character(&accounts, "Aria").await;
        assert_eq!(kinds(&scene.rows, account).await, vec!["created"]);
        assert_eq!(kinds(&scene.rows, character).await, vec!["created"]);
        let change = accounts
            .change_tier(account, Tier::Moderator, None)
            .await
            .unwrap();
        let (key,): (String,) = scene
            .rows
            .fetch_one(
                "SELECT dedup_key FROM character_audit WHERE event_kind = 'tier_changed'",
                None,
            )
            .await;
        assert_eq!(key, change.to_string(), "keyed by the role-change row");
        let (tier,): (String,) = scene
            .rows
            .fetch_one("SELECT tier FROM accounts WHERE id = $1", Some(account))
            .await;
        assert_eq!(tier, "moderator");
        // A failed change writes neither the change nor its audit row.
        let missing = accounts
            .change_tier(Uuid::now_v7(), Tier::Admin, None)
            .await;
        assert!(
            matches!(missing, Err(StoreError::NotFound(_))),
            "{driver:?}: {missing:?}"
        );
        let (count,): (i64,) = scene
            .rows
            .fetch_one(
                "SELECT count(*) FROM character_audit WHERE event_kind = 'tier_changed'",
                None,
            )
            .await;
        assert_eq!(count, 1);
        // A taken name rolls back the character and its audit row together.
        let err = accounts
            .create_character(
                &NewCharacter {
                    character_id: Uuid::now_v7(),
                    account_id: account,
                    name: "ARIA".into(),
                    zone_ref: None,
                    room_ref: None,
                    state: json!({}).into(),
                    chargen: None,
                    schema_version: 1,
                },
                None,
            )
            .await;
        assert!(
            matches!(&err, Err(StoreError::NameTaken(name)) if name == "ARIA"),
            "{driver:?}: {err:?}"
        );
        let (created,): (i64,) = scene
            .rows
            .fetch_one(
                "SELECT count(*) FROM character_audit WHERE event_kind = 'created'",
                None,
            )
            .await;
        assert_eq!(created, 2);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn the_staff_view_folds_in_only_the_owning_accounts_tier_changes(pool: PgPool) {
    for driver in Driver::ALL {
        let scene = Scene::new(&pool, driver).await;
        let accounts = accounts(&scene);
        let (a, a_char) = account_with_character(&accounts, "Aria").await;
        let (b, _) = account_with_character(&accounts, "Bran").await;
        accounts
            .change_tier(a, Tier::Moderator, None)
            .await
            .unwrap();
        accounts.change_tier(b, Tier::Admin, None).await.unwrap();
        scene
            .stores
            .audit
            .record(&[AuditEvent::track(a_char, "smithing", 1)])
            .await
            .unwrap();
        let reader = AuditReader::new(scene.stores.audit.clone(), StaffReadLimit::default());
        let staff = Viewer {
            account_id: Uuid::now_v7(),
            tier: Tier::Admin,
        };
        let page = reader.staff_view(staff, "aria", None, 50).await.unwrap();
        let subjects: Vec<(Uuid, String)> = page
            .rows
            .iter()
            .map(|r| (r.subject_id, r.event_kind.clone()))
            .collect();
        assert_eq!(
            subjects,
            vec![
                (a_char, "track".to_string()),
                (a, "tier_changed".to_string()),
                (a_char, "created".to_string())
            ]
        );
        assert!(
            page.rows.iter().all(|r| r.subject_id != b),
            "nothing of another account"
        );
        // The self view never includes account rows.
        let own = reader.self_view(a_char, None, 50).await.unwrap();
        assert!(own.rows.iter().all(|r| r.subject_type == "character"));
        assert!(matches!(
            reader.staff_view(staff, "nobody", None, 10).await,
            Err(AuditReadError::NotFound(_))
        ));
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn non_staff_are_refused_before_any_store_call(pool: PgPool) {
    for driver in Driver::ALL {
        let scene = Scene::new(&pool, driver).await;
        let closed = match &scene.rows {
            JobDriver::Postgres(pool) => {
                let pg = shardkeep_testkit::pg(pool);
                pg.close().await;
                AuditStore::new(pg)
            }
            JobDriver::Embedded(db) => {
                db.close().await;
                AuditStore::embedded(db.clone())
            }
        };
        let reader = AuditReader::new(closed, StaffReadLimit::default());
        let player = Viewer {
            account_id: Uuid::now_v7(),
            tier: Tier::Player,
        };
        assert!(matches!(
            reader.staff_view(player, "aria", None, 10).await,
            Err(AuditReadError::Forbidden)
        ));
        // The same call by staff does reach the (closed) store: the refusal came first.
        let staff = Viewer {
            account_id: Uuid::now_v7(),
            tier: Tier::Moderator,
        };
        assert!(matches!(
            reader.staff_view(staff, "aria", None, 10).await,
            Err(AuditReadError::Database(_))
        ));
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn staff_reads_are_rate_limited(pool: PgPool) {
    for driver in Driver::ALL {
        let scene = Scene::new(&pool, driver).await;
        let accounts = accounts(&scene);
        account_with_character(&accounts, "Aria").await;
        let reader = AuditReader::new(
            scene.stores.audit.clone(),
            StaffReadLimit::new(2, Duration::from_secs(60)),
        );
        let staff = Viewer {
            account_id: Uuid::now_v7(),
            tier: Tier::Admin,
        };
        reader.staff_view(staff, "Aria", None, 10).await.unwrap();
        reader.staff_view(staff, "Aria", None, 10).await.unwrap();
        assert!(matches!(
            reader.staff_view(staff, "Aria", None, 10).await,
            Err(AuditReadError::RateLimited { .. })
        ));
    }
}
