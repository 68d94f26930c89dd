//! Work a Redis Cluster answers per node: SCAN walks and configuration reads go to every master
//! in turn. On a standalone server the one server is the only "master".

use std::collections::HashMap;

use redis::ConnectionAddr;
use tokio::sync::Mutex;

use super::redis::{RedisBackend, RedisConn};
use super::redis_conn::Link;

/// Whether connecting refuses a server that may evict keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionCheck {
    /// Refuse unless every master runs `maxmemory-policy noeviction` (the default).
    Require,
    /// Run whatever the policy (an operator's explicit override).
    Skip,
}

/// Where a SCAN walk over every master stands: which master (in address order), that
/// master's own cursor, and a fingerprint of the master list the walk is going through.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanCursor {
    node: usize,
    cursor: u64,
    layout: u64,
}

impl ScanCursor {
    /// The start of a walk, and what a completed walk returns.
    pub const START: Self = Self {
        node: 0,
        cursor: 0,
        layout: 0,
    };

    /// True at the start of a walk (or once one completed).
    pub fn is_start(&self) -> bool {
        self.node == 0 && self.cursor == 0
    }

    /// Where a page of the walk starts when the masters now are `layout`: where it stood, or,
    /// when the masters changed since its last page (a failover), over again on the new list —
    /// an index into the old one would name another master, and a master's cursor means
    /// nothing on another. Keys may then come twice, which every SCAN caller allows.
    fn resume(self, layout: u64) -> Self {
        if self.is_start() || self.layout != layout {
            Self {
                layout,
                ..Self::START
            }
        } else {
            self
        }
    }
}

/// A fingerprint of a master list (each master's node id and address, in order): a node
/// restarted empty at the same address has a new id, and its cursors mean nothing.
fn layout_of(addresses: &[String]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    addresses.hash(&mut hasher);
    hasher.finish()
}

/// The cluster's masters, discovered from `CLUSTER NODES` at the start of each walk and
/// connected to directly, in address order. Each is named `address id`.
pub(super) struct MasterNodes {
    seed: redis::ConnectionInfo,
    node_map: HashMap<(String, u16), (String, u16)>,
    known: Mutex<Vec<(String, RedisConn)>>,
}

impl MasterNodes {
    pub(super) fn new(
        seed: redis::ConnectionInfo,
        node_map: HashMap<(String, u16), (String, u16)>,
    ) -> Self {
        Self {
            seed,
            node_map,
            known: Mutex::new(Vec::new()),
        }
    }

    /// The masters as last discovered, by address (discovering them when none are known).
    pub(super) async fn connections(
        &self,
        backend: &RedisBackend,
    ) -> redis::RedisResult<Vec<(String, RedisConn)>> {
        let known = self.known.lock().await;
        if !known.is_empty() {
            return Ok(known.clone());
        }
        drop(known);
        self.refresh(backend).await
    }

    /// Reads the current masters; connections to addresses already known are kept.
    pub(super) async fn refresh(
        &self,
        backend: &RedisBackend,
    ) -> redis::RedisResult<Vec<(String, RedisConn)>> {
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut backend.conn())
            .await?;
        let masters = masters_of(&text);
        let mut known = self.known.lock().await;
        let mut next = Vec::with_capacity(masters.len());
        for master in masters {
            let reuse = known
                .iter()
                .find(|(m, _)| *m == master)
                .map(|(_, c)| c.clone());
            let conn = match reuse {
                Some(conn) => conn,
                None => {
                    let address = master.split(' ').next().unwrap_or_default();
                    self.connect(address, backend).await?
                }
            };
            next.push((master, conn));
        }
        *known = next;
        Ok(known.clone())
    }

    async fn forget(&self) {
        self.known.lock().await.clear();
    }

    async fn connect(
        &self,
        address: &str,
        backend: &RedisBackend,
    ) -> redis::RedisResult<RedisConn> {
        let invalid = || -> redis::RedisError {
            (
                redis::ErrorKind::Client,
                "unusable node address in CLUSTER NODES",
                address.to_owned(),
            )
                .into()
        };
        let (host, port) = address.rsplit_once(':').ok_or_else(invalid)?;
        let port: u16 = port.parse().map_err(|_| invalid())?;
        let host = host.trim_matches(['[', ']']);
        let (host, port) = self
            .node_map
            .get(&(host.to_owned(), port))
            .map_or((host, port), |(h, p)| (h.as_str(), *p));
        let mut addr = self.seed.addr().clone();
        match &mut addr {
            ConnectionAddr::Tcp(h, p)
            | ConnectionAddr::TcpTls {
                host: h, port: p, ..
            } => {
                *h = host.to_owned();
                *p = port;
            }
            _ => return Err(invalid()),
        }
        let client = redis::Client::open(self.seed.clone().set_addr(addr))?;
        let timeouts = backend.timeouts();
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.response));
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok(RedisConn::new(Link::Node(conn), &backend.closed))
    }
}

/// Every node of the cluster (masters and replicas) that is not failing, as `host:port`,
/// sorted; empty on a standalone server.
pub(super) async fn node_addresses(backend: &RedisBackend) -> redis::RedisResult<Vec<String>> {
    if !backend.is_cluster() {
        return Ok(Vec::new());
    }
    let text: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut backend.conn())
        .await?;
    Ok(nodes_of(&text))
}

/// Every reachable master holding slots in a `CLUSTER NODES` reply, as `host:port id`, sorted by
/// address. A master marked failing (`fail`, `fail?`, `noaddr`) is left out, so a failover
/// stops no walk, no connect and no eviction check; its keys are walked by the next walk,
/// once its replica serves them (every SCAN-based job runs again on its own cadence).
fn masters_of(text: &str) -> Vec<String> {
    let mut masters: Vec<String> = text
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (id, address, flags) = (fields.first()?, fields.get(1)?, fields.get(2)?);
            let is_master = flags.split(',').any(|f| f == "master");
            let has_slots = fields.len() > 8;
            if !is_master || !has_slots || is_failing(flags) {
                return None;
            }
            Some(format!("{} {id}", address_of(address)?))
        })
        .collect();
    masters.sort();
    masters.dedup();
    masters
}

/// True for the flags of a node that is failing or not yet part of the cluster.
fn is_failing(flags: &str) -> bool {
    flags
        .split(',')
        .any(|f| matches!(f, "fail" | "fail?" | "noaddr" | "handshake"))
}

/// `host:port` of a `CLUSTER NODES` address field (`ip:port@cport[,hostname]`), when it names a
/// host and a port other than 0 (a node without an address shows `:0`).
fn address_of(field: &str) -> Option<&str> {
    let address = field.split(['@', ',']).next()?;
    let (host, port) = address.rsplit_once(':')?;
    (!host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0)).then_some(address)
}

/// The `host:port` of the nodes of a `CLUSTER NODES` reply that are not failing, sorted.
fn nodes_of(text: &str) -> Vec<String> {
    let mut nodes: Vec<String> = text
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (address, flags) = (fields.get(1)?, fields.get(2)?);
            if is_failing(flags) {
                return None;
            }
            Some(address_of(address)?.to_owned())
        })
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// One page of a SCAN over every master; see [`RedisBackend::scan_page`]. A walk re-reads the
/// cluster's masters as it starts, so a failover is followed by the next walk.
pub(super) async fn scan_page(
    backend: &RedisBackend,
    at: ScanCursor,
    pattern: &str,
    count: usize,
) -> redis::RedisResult<(ScanCursor, Vec<String>)> {
    let nodes: Vec<(String, RedisConn)> = if !backend.is_cluster() {
        vec![(String::new(), backend.conn())]
    } else if at.is_start() {
        backend.masters.refresh(backend).await?
    } else {
        backend.masters.connections(backend).await?
    };
    let addresses: Vec<String> = nodes.iter().map(|(a, _)| a.clone()).collect();
    let at = at.resume(layout_of(&addresses));
    let Some((_, node)) = nodes.get(at.node) else {
        return Ok((ScanCursor::START, Vec::new()));
    };
    let page: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
        .arg(at.cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(count)
        .query_async(&mut node.clone())
        .await;
    let (next, keys) = match page {
        Ok(page) => page,
        Err(err) => {
            backend.masters.forget().await;
            return Err(err);
        }
    };
    let next = match (next, at.node + 1 < nodes.len()) {
        (0, true) => ScanCursor {
            node: at.node + 1,
            cursor: 0,
            ..at
        },
        (0, false) => ScanCursor::START,
        (cursor, _) => ScanCursor { cursor, ..at },
    };
    Ok((next, keys))
}

/// Refuses a deployment whose masters may evict keys: under a `volatile-*` policy Redis drops
/// keys with a TTL first — every coordination record, checkpoint and nonce shardkeep writes —
/// and under `allkeys-*` any key, journal entries included.
pub(super) async fn check_eviction_policy(backend: &RedisBackend) -> Result<(), String> {
    let nodes = backend
        .master_conns()
        .await
        .map_err(|e| super::one_line(&e))?;
    for mut node in nodes {
        let reply: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async(&mut node)
            .await;
        let policy = match reply {
            Ok(pair) => pair.get(1).cloned().unwrap_or_default(),
            Err(err) => {
                return Err(format!(
                    "cannot read maxmemory-policy ({}); shardkeep needs noeviction — \
                     set SHARDKEEP_ALLOW_EVICTION=true to run without the check",
                    super::one_line(&err)
                ));
            }
        };
        if policy != "noeviction" {
            return Err(format!(
                "maxmemory-policy is {policy}: Redis may evict shardkeep's keys (TTL-bearing \
                 records first); set `maxmemory-policy noeviction` on every master, or \
                 SHARDKEEP_ALLOW_EVICTION=true to run anyway"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_starts_over_when_the_masters_change_under_it() {
        let before = layout_of(&["127.0.0.1:7001".into(), "127.0.0.1:7002".into()]);
        let after = layout_of(&["127.0.0.1:7002".into(), "127.0.0.1:7004".into()]);
        assert_ne!(before, after);
        let midway = ScanCursor {
            node: 1,
            cursor: 42,
            layout: before,
        };
        assert_eq!(midway.resume(before), midway, "same masters: carry on");
        let restarted = midway.resume(after);
        assert!(restarted.is_start());
        assert_eq!(restarted.layout, after);
        let fresh = ScanCursor::START.resume(after);
        assert_eq!((fresh.node, fresh.cursor, fresh.layout), (0, 0, after));
    }

    const NODES: &str = "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7002@17002 master - 0 1 2 connected 5461-10922
c3 127.0.0.1:7003@17003,host-c master - 0 1 3 connected 10923-16383
d4 127.0.0.1:7004@17004 slave a1 0 1 1 connected
e5 127.0.0.1:7005@17005 master,fail - 0 1 5 connected
f6 127.0.0.1:7006@17006 master - 0 1 6 connected
g7 127.0.0.1:7007@17007 master,fail? - 0 1 7 connected 16000
";

    #[test]
    fn masters_are_the_healthy_ones_holding_slots() {
        assert_eq!(
            masters_of(NODES),
            vec![
                "127.0.0.1:7001 a1",
                "127.0.0.1:7002 b2",
                "127.0.0.1:7003 c3"
            ]
        );
        assert!(masters_of("").is_empty());
        assert_eq!(nodes_of(NODES).len(), 5);
        assert!(masters_of("garbage\n\n one").is_empty());
        assert!(
            masters_of("z9 nowhere master - 0 0 1 connected 0-10").is_empty(),
            "an address without a port is no master to reach"
        );
        assert!(
            masters_of("z9 :0@0 master,noaddr - 0 0 1 connected 0-10").is_empty(),
            "nor one without an address"
        );
    }

    #[test]
    fn a_master_restarted_empty_at_its_address_is_a_new_layout() {
        let before = masters_of(NODES);
        let after = masters_of(&NODES.replace("b2 127.0.0.1:7002", "x9 127.0.0.1:7002"));
        assert_ne!(layout_of(&before), layout_of(&after));
    }
}
