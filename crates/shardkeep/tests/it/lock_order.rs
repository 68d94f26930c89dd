//! Every statement that locks several character rows locks them in one global order (by id), so
//! crossed transfers and overlapping batches never deadlock. Each test also reads the rows back:
//! every write that reported landing moved its row's version, and some did land.

use std::future::Future;
use std::sync::Arc;

use serde_json::json;
use shardkeep::audit::AuditEvent;
use shardkeep::character::{
    CharacterSnapshot, CharacterStore, Releaser, SaveOutcome, TransferCommit,
};
use sqlx::PgPool;
use tokio::sync::Barrier;
use uuid::Uuid;

use super::ladder_store::created;

const ROUNDS: usize = 12;
const WRITERS: usize = 8;

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

/// Runs `ROUNDS` rounds of `WRITERS` writers released together by a barrier. A writer
/// (round, index, barrier) returns how many row versions its write moved, or its error (a
/// deadlock fails the test). Returns the versions moved in all.
async fn race<F, Fut>(writer: F) -> i64
where
    F: Fn(usize, usize, Arc<Barrier>) -> Fut,
    Fut: Future<Output = Result<i64, String>> + Send + 'static,
{
    let mut moved = 0;
    for round in 0..ROUNDS {
        let barrier = Arc::new(Barrier::new(WRITERS));
        let tasks: Vec<_> = (0..WRITERS)
            .map(|n| tokio::spawn(writer(round, n, Arc::clone(&barrier))))
            .collect();
        for task in tasks {
            match task.await.unwrap() {
                Ok(n) => moved += n,
                Err(err) => panic!("round {round}: {err}"),
            }
        }
    }
    moved
}

/// Sum of the rows' versions, read back (each starts at 0; a claim does not move it).
async fn versions(store: &CharacterStore, rows: &[CharacterSnapshot]) -> i64 {
    let mut sum = 0;
    for row in rows {
        sum += store
            .load(row.character_id)
            .await
            .unwrap()
            .unwrap()
            .state_version;
    }
    sum
}

/// A transfer of one round between `releaser` and `acquirer`; versions it moved.
async fn transfer(
    store: &CharacterStore,
    releaser: &CharacterSnapshot,
    acquirer: &CharacterSnapshot,
    round: usize,
) -> Result<i64, String> {
    let event = AuditEvent::item_transferred(
        acquirer.character_id,
        releaser.character_id,
        Uuid::now_v7(),
        json!({ "round": round }),
    );
    let commit = store
        .commit_transfer(
            &shardkeep_testkit::model::LedgerModel::handle(),
            Releaser::Held {
                snapshot: releaser,
                item_id: None,
                released_epoch: releaser.owner_epoch,
            },
            acquirer,
            &event,
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(if matches!(commit, TransferCommit::Committed { .. }) {
        2
    } else {
        0
    })
}

/// A batched save; versions it moved.
async fn batch(store: &CharacterStore, snapshots: &[CharacterSnapshot]) -> Result<i64, String> {
    let refs: Vec<&CharacterSnapshot> = snapshots.iter().collect();
    let outcomes = store.save_many(&refs).await.map_err(|e| e.to_string())?;
    Ok(outcomes
        .iter()
        .filter(|(_, o)| matches!(o, SaveOutcome::Saved(_)))
        .count() as i64)
}

/// A gives to B while B gives to A, many times at once: each commit locks both rows, in
/// opposite roles.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn crossed_transfers_never_deadlock(pool: PgPool) {
    let store = CharacterStore::new(shardkeep_testkit::pg(&pool));
    let rows = claimed_rows(&store, &["Aria", "Bran"]).await;
    let moved = race(|round, n, barrier| {
        let store = store.clone();
        let (mut releaser, mut acquirer) = (rows[n % 2].clone(), rows[1 - n % 2].clone());
        async move {
            releaser = current(&store, &releaser).await;
            acquirer = current(&store, &acquirer).await;
            acquirer.state = json!({ "round": round, "from": releaser.name }).into();
            barrier.wait().await;
            transfer(&store, &releaser, &acquirer, round).await
        }
    })
    .await;
    assert!(moved > 0, "no transfer committed");
    assert_eq!(versions(&store, &rows).await, moved);
}

/// Batched saves of overlapping characters, listed in opposite orders, at once.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn overlapping_batches_in_opposite_orders_never_deadlock(pool: PgPool) {
    let store = CharacterStore::new(shardkeep_testkit::pg(&pool));
    let names: Vec<String> = (0..16).map(|n| format!("Hero{n}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let rows = claimed_rows(&store, &names).await;
    let moved = race(|round, n, barrier| {
        let store = store.clone();
        let mut listed = rows.clone();
        if n % 2 == 1 {
            listed.reverse();
        }
        async move {
            let mut snapshots = Vec::new();
            for row in &listed {
                let mut snapshot = current(&store, row).await;
                snapshot.state = json!({ "round": round, "writer": n }).into();
                snapshots.push(snapshot);
            }
            barrier.wait().await;
            batch(&store, &snapshots).await
        }
    })
    .await;
    assert!(moved > 0, "no save landed");
    assert_eq!(versions(&store, &rows).await, moved);
}

/// A batched save and a transfer over the same two rows, at once; the batch lists the rows in
/// the order opposite to the transfer's lock order.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_batch_crossing_a_transfer_never_deadlocks(pool: PgPool) {
    let store = CharacterStore::new(shardkeep_testkit::pg(&pool));
    let rows = claimed_rows(&store, &["Aria", "Bran"]).await;
    let moved = race(|round, n, barrier| {
        let store = store.clone();
        let (first, second) = (rows[n % 2].clone(), rows[1 - n % 2].clone());
        async move {
            let first = current(&store, &first).await;
            let second = current(&store, &second).await;
            barrier.wait().await;
            if n % 2 == 0 {
                batch(&store, &[second, first]).await
            } else {
                transfer(&store, &first, &second, round).await
            }
        }
    })
    .await;
    assert!(moved > 0, "nothing landed");
    assert_eq!(versions(&store, &rows).await, moved);
}
