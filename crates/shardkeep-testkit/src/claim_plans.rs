//! What is wrong with the plans Postgres picks for the retry claim's statements
//! ([`shardkeep::retry::CLAIM_STATEMENTS`]): each is prepared with its parameter types and its
//! generic plan (the one a cached statement runs) explained. A poll must walk the claimable
//! index in its order (no sort), and no claim may scan the job table.

use serde_json::Value;
use shardkeep::retry::{CLAIM_STATEMENTS, ClaimStatement};
use sqlx::PgConnection;

const TABLE: &str = "persistence_retry_jobs";
const CLAIMABLE_INDEX: &str = "persistence_retry_jobs_claimable";

/// Each claim statement's faults, as `"<statement>: <fault>"`; empty when every plan is sound.
/// Runs on `conn` (prepared statements are per session) and leaves it as it found it.
pub async fn claim_plan_faults(conn: &mut PgConnection) -> Result<Vec<String>, sqlx::Error> {
    statement_plan_faults(conn, &CLAIM_STATEMENTS).await
}

/// [`claim_plan_faults`] of the given statements. A statement Postgres cannot explain is an
/// error, and it leaves nothing prepared on `conn` either.
pub async fn statement_plan_faults(
    conn: &mut PgConnection,
    statements: &[ClaimStatement],
) -> Result<Vec<String>, sqlx::Error> {
    let mut faults = Vec::new();
    for statement in statements {
        let plan = generic_plan(conn, statement).await?;
        faults.extend(
            plan_faults(&plan, statement.poll)
                .into_iter()
                .map(|fault| format!("{}: {fault}", statement.name)),
        );
    }
    Ok(faults)
}

/// The generic plan of `statement`, as Postgres's JSON. One transaction under a name of its
/// own, so a pooler in transaction mode keeps it on one server connection.
async fn generic_plan(
    conn: &mut PgConnection,
    statement: &ClaimStatement,
) -> Result<Value, sqlx::Error> {
    use sqlx::Connection;
    let name = format!("shardkeep_claim_check_{}", uuid::Uuid::new_v4().simple());
    let mut tx = conn.begin().await?;
    // The statement's own `$n` are PREPARE's parameters: it goes through the simple protocol.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SET LOCAL plan_cache_mode = force_generic_plan;
         PREPARE {name} ({}) AS {}",
        statement.param_types, statement.sql
    )))
    .execute(&mut *tx)
    .await?;
    let ids = if statement.poll {
        "NULL"
    } else {
        "ARRAY[gen_random_uuid()]"
    };
    let lease = if statement.param_types.contains("double precision") {
        ", gen_random_uuid(), 'plan-check', 30"
    } else {
        ""
    };
    // A prepared statement outlives a rolled-back transaction: the explain goes in a savepoint,
    // so the statement is deallocated whether or not Postgres could explain it.
    let mut savepoint = tx.begin().await?;
    let plan = sqlx::query_scalar::<_, Value>(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (FORMAT JSON) EXECUTE {name} (now(), {ids}, 128{lease})"
    )))
    // Its text names this check's statement: cached, it would stay prepared on `conn`.
    .persistent(false)
    .fetch_one(&mut *savepoint)
    .await;
    if plan.is_ok() {
        savepoint.commit().await?;
    } else {
        savepoint.rollback().await?;
    }
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DEALLOCATE {name}")))
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    plan
}

/// What is wrong with one explained plan: a sequential scan of the job table, and for a poll
/// any sort or a plan that never reads the claimable index.
pub fn plan_faults(explained: &Value, poll: bool) -> Vec<String> {
    let mut nodes = Vec::new();
    if let Some(root) = explained.get(0).and_then(|p| p.get("Plan")) {
        collect(root, &mut nodes);
    } else {
        return vec![format!("no plan in {explained}")];
    }
    let mut faults = Vec::new();
    for node in &nodes {
        let kind = node.get("Node Type").and_then(Value::as_str).unwrap_or("");
        let relation = node.get("Relation Name").and_then(Value::as_str);
        if kind == "Seq Scan" && relation == Some(TABLE) {
            faults.push(format!("a sequential scan of {TABLE}"));
        }
        if poll && kind.contains("Sort") {
            faults.push(format!("a {kind} node (the index must give the order)"));
        }
    }
    let walks_index = nodes.iter().any(|node| {
        node.get("Node Type").and_then(Value::as_str) == Some("Index Scan")
            && node.get("Index Name").and_then(Value::as_str) == Some(CLAIMABLE_INDEX)
    });
    if poll && !walks_index {
        faults.push(format!("no index scan of {CLAIMABLE_INDEX}"));
    }
    faults
}

fn collect<'a>(node: &'a Value, into: &mut Vec<&'a Value>) {
    into.push(node);
    if let Some(children) = node.get("Plans").and_then(Value::as_array) {
        for child in children {
            collect(child, into);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan(root: Value) -> Value {
        json!([{ "Plan": root }])
    }

    #[test]
    fn a_poll_walking_the_claimable_index_in_order_is_sound() {
        let explained = plan(
            json!({"Node Type": "Limit", "Plans": [{"Node Type": "LockRows",
            "Plans": [{"Node Type": "Index Scan", "Relation Name": TABLE,
                       "Index Name": CLAIMABLE_INDEX}]}]}),
        );
        assert!(plan_faults(&explained, true).is_empty());
    }

    #[test]
    fn a_sequential_scan_a_sort_or_another_index_is_a_fault() {
        let scanned = plan(json!({"Node Type": "Limit", "Plans": [{"Node Type": "Sort",
            "Plans": [{"Node Type": "Seq Scan", "Relation Name": TABLE}]}]}));
        let faults = plan_faults(&scanned, true);
        assert_eq!(faults.len(), 3, "{faults:?}");
        let sorted = plan(json!({"Node Type": "Incremental Sort", "Plans": [{
            "Node Type": "Index Scan", "Relation Name": TABLE, "Index Name": CLAIMABLE_INDEX}]}));
        assert_eq!(plan_faults(&sorted, true).len(), 1);
        let signaled = plan(
            json!({"Node Type": "Sort", "Plans": [{"Node Type": "Index Scan",
            "Relation Name": TABLE, "Index Name": "persistence_retry_jobs_pkey"}]}),
        );
        assert!(
            plan_faults(&signaled, false).is_empty(),
            "a sort of the signaled rows is fine"
        );
        assert_eq!(plan_faults(&json!({}), true).len(), 1, "no plan at all");
    }
}
