//! Faults of a Redis Cluster for the simulator and tests: a replica taking over its master,
//! and a private cluster of its own for a test that fails one over.

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

/// A private Redis Cluster of three masters with one replica each, on free ports in a
/// temporary directory, for a test whose faults would disturb the suite's shared cluster.
/// Every node is killed and the directory removed on drop.
pub struct PrivateCluster {
    nodes: Vec<std::process::Child>,
    ports: Vec<u16>,
    dir: std::path::PathBuf,
    /// Its six nodes as a seed list (`redis://…,redis://…`).
    pub url: String,
}

impl PrivateCluster {
    /// Starts the six nodes and joins them (`redis-cli --cluster create … --cluster-replicas 1`);
    /// returns once every node reports `cluster_state:ok`.
    pub async fn start() -> Self {
        let dir =
            std::env::temp_dir().join(format!("sk-cluster-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("a temporary directory for the cluster");
        let ports = free_cluster_ports(6);
        let nodes = ports.iter().map(|port| spawn_node(&dir, *port)).collect();
        let cluster = Self {
            nodes,
            ports: ports.clone(),
            dir,
            url: ports
                .iter()
                .map(|p| format!("redis://127.0.0.1:{p}"))
                .collect::<Vec<_>>()
                .join(","),
        };
        cluster.wait_listening().await;
        let created = std::process::Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(ports.iter().map(|p| format!("127.0.0.1:{p}")))
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli is installed");
        assert!(
            created.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        cluster.wait_ready().await;
        cluster
    }

    /// Kills every node at once and starts them again on the same ports with the same cluster
    /// configuration (all nodes restarted: the slots come back, the data does not); returns once
    /// the cluster is ready again.
    pub async fn restart_all(&mut self) {
        for node in &mut self.nodes {
            let _ = node.kill();
            let _ = node.wait();
        }
        self.nodes = self
            .ports
            .iter()
            .map(|port| spawn_node(&self.dir, *port))
            .collect();
        self.wait_listening().await;
        self.wait_ready().await;
    }

    /// Freezes every replica's process (SIGSTOP) for `pause` and then lets it go on (SIGCONT),
    /// returning at once: while frozen no replica acknowledges a write, as when the masters'
    /// writes have not reached them yet. Replicas are found by asking each node its role.
    pub fn freeze_replicas(&self, pause: Duration) {
        let replicas: Vec<u32> = self
            .ports
            .iter()
            .zip(&self.nodes)
            .filter(|(port, _)| {
                std::process::Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "ROLE"])
                    .output()
                    .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).starts_with("slave"))
            })
            .map(|(_, node)| node.id())
            .collect();
        assert!(!replicas.is_empty(), "the private cluster has no replica");
        signal_all(&replicas, "-STOP");
        std::thread::spawn(move || {
            std::thread::sleep(pause);
            signal_all(&replicas, "-CONT");
        });
    }

    async fn wait_listening(&self) {
        for port in &self.ports {
            for _ in 0..100 {
                if tokio::net::TcpStream::connect(("127.0.0.1", *port))
                    .await
                    .is_ok()
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    async fn wait_ready(&self) {
        for _ in 0..200 {
            let mut ok = 0;
            for port in &self.ports {
                let ask = |what: &[&str]| {
                    std::process::Command::new("redis-cli")
                        .args(["-p", &port.to_string()])
                        .args(what)
                        .output()
                        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                        .unwrap_or_default()
                };
                // Joined, and (a replica) in sync with its master, so it can take over.
                let replication = ask(&["INFO", "replication"]);
                let synced = replication.contains("role:master")
                    || replication.contains("master_link_status:up");
                if synced && ask(&["CLUSTER", "INFO"]).contains("cluster_state:ok") {
                    ok += 1;
                }
            }
            if ok == self.ports.len() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the private cluster did not reach cluster_state:ok");
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.kill();
            let _ = node.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sends `signal` (as `kill` takes it) to each process.
fn signal_all(pids: &[u32], signal: &str) {
    for pid in pids {
        let _ = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status();
    }
}

fn spawn_node(dir: &std::path::Path, port: u16) -> std::process::Child {
    std::process::Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args([
            "--save",
            "",
            "--appendonly",
            "no",
            "--cluster-enabled",
            "yes",
        ])
        .args(["--cluster-node-timeout", "2000"])
        .arg("--cluster-config-file")
        .arg(dir.join(format!("nodes-{port}.conf")))
        .arg("--dir")
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server is installed (scripts/test says how)")
}

/// `count` ports that are free, with their cluster bus ports (port + 10000) free too.
fn free_cluster_ports(count: usize) -> Vec<u16> {
    let mut ports = Vec::new();
    while ports.len() < count {
        let Ok(listener) = std::net::TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(addr) = listener.local_addr() else {
            continue;
        };
        let port = addr.port();
        let bus_free = port
            .checked_add(10_000)
            .is_some_and(|bus| std::net::TcpListener::bind(("127.0.0.1", bus)).is_ok());
        if bus_free && !ports.contains(&port) {
            ports.push(port);
        }
    }
    ports
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
