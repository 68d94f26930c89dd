//! The schema matches the scaling plan (docs/scaling.md): every primary key and unique index of
//! a table includes the column the table would be distributed by.

use std::collections::HashMap;

use sqlx::PgPool;

/// Each table's distribution column in the plan.
const PLAN: &[(&str, &str)] = &[
    ("characters", "id"),
    ("character_job_effects", "character_id"),
    ("item_loads", "character_id"),
    ("item_releases", "character_id"),
    ("persistence_retry_jobs", "character_id"),
    ("persistence_job_dead_letters", "character_id"),
    ("transfer_activations", "character_id"),
    ("character_audit", "subject_id"),
    ("accounts", "id"),
    ("account_role_changes", "account_id"),
];

/// Unique indexes the plan moves elsewhere on a distributed database: a character's name is
/// unique across characters (a names table keyed by name, written in the creating transaction).
const CROSS_CHARACTER: &[&str] = &["characters_name_ci"];

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn every_key_includes_its_tables_distribution_column(pool: PgPool) {
    let plan: HashMap<&str, &str> = PLAN.iter().copied().collect();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables
          WHERE schemaname = 'public' AND tablename <> '_sqlx_migrations' ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let unplanned: Vec<&String> = tables
        .iter()
        .filter(|t| !plan.contains_key(t.as_str()))
        .collect();
    assert!(
        unplanned.is_empty(),
        "tables missing from the scaling plan: {unplanned:?}"
    );
    let keys: Vec<(String, String, Vec<String>)> = sqlx::query_as(
        "SELECT t.relname::text, i.relname::text,
                ARRAY(SELECT a.attname::text FROM unnest(ix.indkey) k
                        JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k)
           FROM pg_index ix
           JOIN pg_class t ON t.oid = ix.indrelid
           JOIN pg_class i ON i.oid = ix.indexrelid
           JOIN pg_namespace n ON n.oid = t.relnamespace
          WHERE n.nspname = 'public' AND ix.indisunique AND t.relname <> '_sqlx_migrations'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(keys.len() >= PLAN.len(), "every table has a primary key");
    let offending: Vec<String> = keys
        .iter()
        .filter(|(table, index, columns)| {
            !CROSS_CHARACTER.contains(&index.as_str())
                && !columns
                    .iter()
                    .any(|c| Some(&c.as_str()) == plan.get(table.as_str()))
        })
        .map(|(table, index, columns)| format!("{table}.{index} {columns:?}"))
        .collect();
    assert!(
        offending.is_empty(),
        "keys without their table's distribution column: {offending:?}"
    );
}
