//! Every statement that locks several character rows locks them in one global order (by id), so
//! crossed transfers and overlapping batches never deadlock.

use std::sync::Arc;

use serde_json::json;
use shardkeep::PostgresBackend;
use shardkeep::audit::AuditEvent;
use shardkeep::character::{CharacterSnapshot, CharacterStore, Releaser};
use sqlx::PgPool;
use tokio::sync::Barrier;
use uuid::Uuid;

use super::ladder_store::created;

const ROUNDS: usize = 12;
const PAIRS: usize = 4;

async fn claimed_rows(store: &CharacterStore, names: &[&str]) -> Vec<CharacterSnapshot> {
    let mut rows = Vec::new();
    for name in names {
        let row = created(store, name).await;
        let epoch = store.claim(row.character_id, 0).await.unwrap().new_epoch;
        rows.push(CharacterSnapshot {
            owner_epoch: epoch,
            ..row
        });
    }
    rows
}

/// The live copy of `row` as stored now (current version, its epoch).
async fn current(store: &CharacterStore, row: &CharacterSnapshot) -> CharacterSnapshot {
    let stored = store.load(row.character_id).await.unwrap().unwrap();
    CharacterSnapshot {
        owner_epoch: row.owner_epoch,
        ..stored
    }
}

/// A gives to B while B gives to A, many times at once: each commit locks both rows, in
/// opposite roles. Any error (Postgres aborts one side of a deadlock) fails the test.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn crossed_transfers_never_deadlock(pool: PgPool) {
    let store = CharacterStore::new(PostgresBackend::from_pool(pool.clone()));
    let rows = claimed_rows(&store, &["Aria", "Bran"]).await;
    let (a, b) = (rows[0].clone(), rows[1].clone());
    for round in 0..ROUNDS {
        let barrier = Arc::new(Barrier::new(PAIRS * 2));
        let mut tasks = Vec::new();
        for n in 0..PAIRS * 2 {
            let (releaser, acquirer) = if n % 2 == 0 {
                (a.clone(), b.clone())
            } else {
                (b.clone(), a.clone())
            };
            let (store, barrier) = (store.clone(), Arc::clone(&barrier));
            tasks.push(tokio::spawn(async move {
                let releaser = current(&store, &releaser).await;
                let mut acquirer = current(&store, &acquirer).await;
                acquirer.state = json!({ "round": round, "from": releaser.name });
                let event = AuditEvent::item_transferred(
                    acquirer.character_id,
                    releaser.character_id,
                    Uuid::now_v7(),
                    json!({ "round": round }),
                );
                barrier.wait().await;
                store
                    .commit_transfer(
                        Releaser::Held {
                            snapshot: &releaser,
                            item_id: None,
                            released_epoch: releaser.owner_epoch,
                        },
                        &acquirer,
                        &event,
                    )
                    .await
            }));
        }
        for task in tasks {
            if let Err(err) = task.await.unwrap() {
                panic!("round {round}: a transfer failed: {err}");
            }
        }
    }
}

/// Batched saves of overlapping characters, listed in opposite orders, at once.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn overlapping_batches_in_opposite_orders_never_deadlock(pool: PgPool) {
    let store = CharacterStore::new(PostgresBackend::from_pool(pool.clone()));
    let names: Vec<String> = (0..16).map(|n| format!("Hero{n}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let rows = claimed_rows(&store, &names).await;
    for round in 0..ROUNDS {
        let barrier = Arc::new(Barrier::new(PAIRS * 2));
        let mut tasks = Vec::new();
        for n in 0..PAIRS * 2 {
            let mut batch = rows.clone();
            if n % 2 == 1 {
                batch.reverse();
            }
            let (store, barrier) = (store.clone(), Arc::clone(&barrier));
            tasks.push(tokio::spawn(async move {
                let mut snapshots = Vec::new();
                for row in &batch {
                    let mut snapshot = current(&store, row).await;
                    snapshot.state = json!({ "round": round, "writer": n });
                    snapshots.push(snapshot);
                }
                barrier.wait().await;
                let refs: Vec<&CharacterSnapshot> = snapshots.iter().collect();
                store.save_many(&refs).await
            }));
        }
        for task in tasks {
            if let Err(err) = task.await.unwrap() {
                panic!("round {round}: a batch failed: {err}");
            }
        }
    }
}

/// A batched save and a transfer over the same two rows, at once.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_batch_crossing_a_transfer_never_deadlocks(pool: PgPool) {
    let store = CharacterStore::new(PostgresBackend::from_pool(pool.clone()));
    let rows = claimed_rows(&store, &["Aria", "Bran"]).await;
    let (a, b) = (rows[0].clone(), rows[1].clone());
    for round in 0..ROUNDS {
        let barrier = Arc::new(Barrier::new(PAIRS * 2));
        let mut tasks = Vec::new();
        for n in 0..PAIRS * 2 {
            let (store, barrier, a, b) =
                (store.clone(), Arc::clone(&barrier), a.clone(), b.clone());
            tasks.push(tokio::spawn(async move {
                let (first, second) = if n % 2 == 0 { (a, b) } else { (b, a) };
                let first = current(&store, &first).await;
                let second = current(&store, &second).await;
                barrier.wait().await;
                if n % 2 == 0 {
                    // The batch lists the acquirer's counterpart first.
                    store
                        .save_many(&[&second, &first])
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                } else {
                    let event = AuditEvent::item_transferred(
                        second.character_id,
                        first.character_id,
                        Uuid::now_v7(),
                        json!({ "round": round }),
                    );
                    store
                        .commit_transfer(
                            Releaser::Held {
                                snapshot: &first,
                                item_id: None,
                                released_epoch: first.owner_epoch,
                            },
                            &second,
                            &event,
                        )
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
            }));
        }
        for task in tasks {
            if let Err(err) = task.await.unwrap() {
                panic!("round {round}: {err}");
            }
        }
    }
}
