//! Faults of a Redis Cluster for the simulator and tests: a replica taking over its master.

use std::time::Duration;

use shardkeep::RedisBackend;

/// The replicas of a `CLUSTER NODES` reply that are not failing, as `host:port`, sorted.
fn replicas_of(text: &str) -> Vec<String> {
    let mut replicas: Vec<String> = text
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            let replica = flags.split(',').any(|f| f == "slave" || f == "replica");
            let failing = flags.split(',').any(|f| f.starts_with("fail"));
            (replica && !failing)
                .then(|| fields.get(1)?.split(['@', ',']).next().map(str::to_owned))?
        })
        .collect();
    replicas.sort();
    replicas
}

/// Makes the `pick`-th replica (modulo their number) take over its master with
/// `CLUSTER FAILOVER FORCE` — at once, without the master's handover, so writes the replica had
/// not received are lost — and waits (up to 10 s) until it serves as a master. Returns its
/// address.
pub async fn fail_over(backend: &RedisBackend, pick: usize) -> Result<String, String> {
    let text: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut backend.conn())
        .await
        .map_err(|e| format!("CLUSTER NODES: {e}"))?;
    let replicas = replicas_of(&text);
    if replicas.is_empty() {
        return Err("the cluster has no replica to fail over to".into());
    }
    let address = replicas[pick % replicas.len()].clone();
    let client = redis::Client::open(format!("redis://{address}")).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("connecting to {address}: {e}"))?;
    let () = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .arg("FORCE")
        .query_async(&mut conn)
        .await
        .map_err(|e| format!("CLUSTER FAILOVER on {address}: {e}"))?;
    for _ in 0..100 {
        let role: Vec<redis::Value> = redis::cmd("ROLE")
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("ROLE on {address}: {e}"))?;
        if matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master") {
            return Ok(address);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("{address} did not become a master within 10 s"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_are_the_healthy_slaves() {
        let nodes = "\
a 127.0.0.1:1@11 myself,master - 0 0 1 connected 0-100
b 127.0.0.1:2@12 slave a 0 0 1 connected
c 127.0.0.1:3@13 slave,fail a 0 0 1 connected
";
        assert_eq!(replicas_of(nodes), vec!["127.0.0.1:2"]);
        assert!(replicas_of("").is_empty());
    }
}
