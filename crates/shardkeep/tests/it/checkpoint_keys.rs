//! Checkpoints are keyed so that two character rows can never share one.

use serde_json::json;
use shardkeep::character::{
    CharacterLoader, CharacterSnapshot, CharacterStore, CheckpointStore, CheckpointWrite,
    LoadSource,
};
use shardkeep_testkit::TestRedis;
use sqlx::PgPool;

use super::ladder_store::created;

/// `ΟΔΟΣ` and `οδος` are two rows to Postgres (its `lower()` keeps the capital sigma's small
/// form, `σ`) but one name to Rust's `to_lowercase` (final `ς`). Each must keep its own
/// checkpoint, and each login must load its own.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn names_equal_only_to_rust_lowercasing_keep_separate_checkpoints(pool: PgPool) {
    let redis = TestRedis::new().await;
    let store = CharacterStore::new(shardkeep_testkit::pg(&pool));
    let checkpoints = CheckpointStore::new(redis.backend());
    let upper = created(&store, "ΟΔΟΣ").await;
    let lower = created(&store, "οδος").await;
    assert_ne!(upper.character_id, lower.character_id);
    let upper_epoch = store.claim(upper.character_id, 0).await.unwrap().new_epoch;
    store.claim(lower.character_id, 0).await.unwrap();
    let lower_epoch = store.claim(lower.character_id, 0).await.unwrap().new_epoch;
    assert!(lower_epoch > upper_epoch);
    let dump = |row: &CharacterSnapshot, epoch: i64, who: &str| CharacterSnapshot {
        state: json!({ "who": who }).into(),
        owner_epoch: epoch,
        ..row.clone()
    };
    assert_eq!(
        checkpoints
            .write(&dump(&lower, lower_epoch, "lower"))
            .await
            .unwrap(),
        CheckpointWrite::Written
    );
    assert_eq!(
        checkpoints
            .write(&dump(&upper, upper_epoch, "upper"))
            .await
            .unwrap(),
        CheckpointWrite::Written,
        "one character's checkpoint was refused as another's"
    );
    let loader = CharacterLoader::new(
        store.clone(),
        Some(checkpoints.clone()),
        shardkeep_testkit::model::LedgerModel::handle(),
        std::time::Duration::from_secs(5),
    );
    // Lookups by name resolve the name as Postgres does, then read that row's checkpoint.
    for (name, who) in [("ΟΔΟΣ", "upper"), (" οδος ", "lower")] {
        let found = loader.checkpoint_by_name(name).await.unwrap().unwrap();
        assert_eq!(found.state["who"], who, "{name}");
    }
    assert_eq!(loader.checkpoint_by_name("nobody").await.unwrap(), None);
    for (row, who) in [(&upper, "upper"), (&lower, "lower")] {
        let loaded = loader.claim_and_load(row.character_id, 0).await.unwrap();
        assert_eq!(loaded.source, LoadSource::Checkpoint, "{who}");
        assert_eq!(loaded.snapshot.state["who"], who);
        assert_eq!(loaded.snapshot.name, row.name);
    }
}
