//! The Redis connection (standalone or Redis Cluster) and the keyspace it writes under.
//!
//! `REDIS_URL` holding one `redis://` URL selects a standalone server; a comma-separated list of
//! two or more selects Redis Cluster, those URLs being its seed nodes.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::NodeAddress;
use redis::cluster::{ClusterClient, ClusterConfig};

use super::cluster_link::ClusterLink;
pub use super::redis_conn::RedisConn;
use super::redis_conn::{Gate, Link};
pub use super::redis_nodes::{EvictionCheck, ScanCursor};
use super::redis_nodes::{MasterNodes, check_eviction_policy};
use super::{ConnectError, one_line, redact_url};
use crate::keyspace::Keyspace;

/// A cheap-to-clone handle on one Redis deployment, bound to a namespace.
#[derive(Clone)]
pub struct RedisBackend {
    topology: Topology,
    conn: RedisConn,
    /// Writes that must reach a replica before they count, and the `WAIT`s that confirm them
    /// (a second cluster connection, so a `WAIT` held up by a resyncing replica blocks only
    /// these; the shared one on a standalone server).
    durable: RedisConn,
    keys: Keyspace,
    timeouts: RedisTimeouts,
    pub(super) masters: Arc<MasterNodes>,
    /// Set by [`close`](RedisBackend::close); shared by every clone and connection.
    pub(super) closed: Arc<Gate>,
}

/// How the deployment is reached.
#[derive(Clone)]
enum Topology {
    Standalone(redis::Client),
    Cluster(Box<ClusterClient>),
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("cluster", &self.is_cluster())
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

/// Timeouts for the Redis connection.
#[derive(Debug, Clone, Copy)]
pub struct RedisTimeouts {
    /// Time allowed to establish a connection.
    pub connect: Duration,
    /// Time allowed for one command's answer.
    pub response: Duration,
}

impl Default for RedisTimeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(2),
            response: Duration::from_secs(5),
        }
    }
}

/// How a backend connects.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Connection and response timeouts.
    pub timeouts: RedisTimeouts,
    /// Whether a deployment that may evict keys is refused (the default) or accepted.
    pub eviction: EvictionCheck,
    /// Cluster only: `(host, port)` pairs the cluster reports for its nodes, mapped to the
    /// address to dial instead (a proxy or NAT in between). Empty: dial what is reported.
    pub node_map: std::collections::HashMap<(String, u16), (String, u16)>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            timeouts: RedisTimeouts::default(),
            eviction: EvictionCheck::Require,
            node_map: std::collections::HashMap::new(),
        }
    }
}

/// The seed URLs a `REDIS_URL` value names: one for a standalone server, two or more (comma
/// separated) for Redis Cluster. Empty entries and a blank value are errors.
pub fn redis_seeds(url: &str) -> Result<Vec<&str>, String> {
    let seeds: Vec<&str> = url.split(',').map(str::trim).collect();
    if seeds.iter().any(|s| s.is_empty()) {
        return Err("empty entry in the URL list (expected redis://host:port[,redis://…])".into());
    }
    Ok(seeds)
}

/// `url` with every password of its (possibly comma-separated) URLs redacted.
fn redact_urls(url: &str) -> String {
    url.split(',')
        .map(|u| redact_url(u.trim()))
        .collect::<Vec<_>>()
        .join(",")
}

impl RedisBackend {
    /// Connects to `url` (named by `setting` in errors), checks it answers `PING` and that every
    /// master evicts nothing (`maxmemory-policy noeviction`).
    pub async fn connect(
        setting: &'static str,
        url: &str,
        keys: Keyspace,
        timeouts: RedisTimeouts,
    ) -> Result<Self, ConnectError> {
        let options = RedisOptions {
            timeouts,
            ..RedisOptions::default()
        };
        Self::connect_with(setting, url, keys, options).await
    }

    /// [`connect`](Self::connect) with every option.
    pub async fn connect_with(
        setting: &'static str,
        url: &str,
        keys: Keyspace,
        options: RedisOptions,
    ) -> Result<Self, ConnectError> {
        let RedisOptions {
            timeouts,
            eviction,
            node_map,
        } = options;
        let fail = |reason: String| ConnectError {
            setting,
            target: redact_urls(url),
            reason,
        };
        let seeds = redis_seeds(url).map_err(fail)?;
        let closed = Arc::new(Gate::default());
        let connect = async {
            if let [single] = seeds.as_slice() {
                let client = redis::Client::open(*single)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeouts.connect))
                    .set_response_timeout(Some(timeouts.response))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(500));
                let conn = ConnectionManager::new_with_config(client.clone(), config).await?;
                let conn = RedisConn::new(Link::Standalone(conn), &closed);
                Ok((Topology::Standalone(client), conn.clone(), conn))
            } else {
                let map = node_map
                    .iter()
                    .map(|((h, p), (to_h, to_p))| {
                        (
                            NodeAddress::new(h.clone(), *p),
                            NodeAddress::new(to_h.clone(), *to_p),
                        )
                    })
                    .collect();
                let client = ClusterClient::builder(seeds.iter().copied())
                    .node_address_map(map)
                    .connection_timeout(timeouts.connect)
                    .response_timeout(timeouts.response)
                    .retries(3)
                    .max_retry_wait(500)
                    .build()?;
                let client = Box::new(client);
                let config = ClusterConfig::new()
                    .set_connection_timeout(timeouts.connect)
                    .set_response_timeout(timeouts.response);
                let bound = timeouts.connect + timeouts.response;
                let stuck = stuck_after(timeouts.response);
                let conn =
                    ClusterLink::connect(client.clone(), config.clone(), bound, stuck).await?;
                let durable = ClusterLink::connect(client.clone(), config, bound, stuck).await?;
                Ok::<_, redis::RedisError>((
                    Topology::Cluster(client),
                    RedisConn::new(Link::Cluster(Arc::new(conn)), &closed),
                    RedisConn::new(Link::Cluster(Arc::new(durable)), &closed),
                ))
            }
        };
        let (topology, conn, durable) =
            tokio::time::timeout(timeouts.connect + timeouts.response, connect)
                .await
                .map_err(|_| fail("timed out connecting".into()))?
                .map_err(|e| fail(one_line(&e)))?;
        let seed_info = redis::IntoConnectionInfo::into_connection_info(seeds[0])
            .map_err(|e| fail(one_line(&e)))?;
        let backend = Self {
            topology,
            conn,
            durable,
            keys,
            timeouts,
            masters: Arc::new(MasterNodes::new(seed_info, node_map)),
            closed,
        };
        backend.ping().await.map_err(|e| fail(one_line(&e)))?;
        if eviction == EvictionCheck::Require {
            check_eviction_policy(&backend).await.map_err(fail)?;
        }
        Ok(backend)
    }

    /// The keyspace every key of this backend is built from.
    pub fn keys(&self) -> &Keyspace {
        &self.keys
    }

    /// True when this backend speaks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.topology, Topology::Cluster(_))
    }

    /// The shared connection (a cheap clone of a multiplexed link). Commands, scripts and
    /// pipelines issued on it are routed by key on a cluster.
    pub fn conn(&self) -> RedisConn {
        self.conn.clone()
    }

    /// The connection for writes confirmed with [`query_confirmed`](Self::query_confirmed) (a
    /// second cluster connection, so a `WAIT` held up by a resyncing replica delays no other
    /// traffic).
    pub fn durable_conn(&self) -> RedisConn {
        self.durable.clone()
    }

    /// The timeouts this backend was built with.
    pub fn timeouts(&self) -> RedisTimeouts {
        self.timeouts
    }

    /// Closes this handle and every clone of it: each later command on any of their
    /// connections, those taken before the close included, fails at once without reaching the
    /// server, and no new connection is opened. For a process that ends its use of Redis at a
    /// known point (a test sweeping its namespace, a tool about to exit) so that nothing still
    /// running writes afterwards. Other handles on the same server are not affected.
    pub fn close(&self) {
        self.closed.close();
    }

    /// True once [`close`](Self::close) was called on this handle or a clone of it.
    pub fn is_closed(&self) -> bool {
        self.closed.is_closed()
    }

    /// Commands on this handle's connections sent and not yet answered (after a
    /// [`close`](Self::close), what may still land on the server).
    pub fn in_flight(&self) -> usize {
        self.closed.in_flight()
    }

    /// A dedicated connection whose answers may take up to `response` (blocking commands), so
    /// other traffic never waits behind it.
    pub async fn dedicated_conn(&self, response: Duration) -> redis::RedisResult<RedisConn> {
        if self.is_closed() {
            return Err(super::redis_conn::closed_error());
        }
        match &self.topology {
            Topology::Standalone(client) => {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.timeouts.connect))
                    .set_response_timeout(Some(response));
                let conn = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                Ok(RedisConn::new(Link::Node(conn), &self.closed))
            }
            Topology::Cluster(client) => {
                let config = ClusterConfig::new()
                    .set_connection_timeout(self.timeouts.connect)
                    .set_response_timeout(response);
                let bound = self.timeouts.connect + response;
                let link =
                    ClusterLink::connect(client.clone(), config, bound, stuck_after(response))
                        .await?;
                Ok(RedisConn::new(Link::Cluster(Arc::new(link)), &self.closed))
            }
        }
    }

    /// One connection per master node (the shared connection on a standalone server): SCAN and
    /// configuration reads, which a cluster answers per node, walk these.
    pub async fn master_conns(&self) -> redis::RedisResult<Vec<RedisConn>> {
        match &self.topology {
            Topology::Standalone(_) => Ok(vec![self.conn()]),
            Topology::Cluster(_) => Ok(self
                .masters
                .connections(self)
                .await?
                .into_iter()
                .map(|(_, conn)| conn)
                .collect()),
        }
    }

    /// Every node of a cluster (masters and replicas) that is not failing, as `host:port`;
    /// empty on a standalone server.
    pub async fn node_addresses(&self) -> redis::RedisResult<Vec<String>> {
        super::redis_nodes::node_addresses(self).await
    }

    /// One page of a SCAN for `pattern` over the whole deployment (every master in turn, in a
    /// stable order). Returns the cursor of the next page; [`ScanCursor::START`] when the walk is
    /// complete.
    pub async fn scan_page(
        &self,
        at: ScanCursor,
        pattern: &str,
        count: usize,
    ) -> redis::RedisResult<(ScanCursor, Vec<String>)> {
        super::redis_nodes::scan_page(self, at, pattern, count).await
    }

    /// Deletes every key of this backend's namespace (scratch namespaces of benchmarks and the
    /// simulator): SCAN pages of 1,000 on every master, each unlinked in one pipeline. Best
    /// effort: a failing page ends the sweep.
    pub async fn purge_namespace(&self) {
        let mut conn = self.conn();
        for pattern in self.keys.namespace_patterns() {
            let mut cursor = ScanCursor::START;
            loop {
                let Ok((next, keys)) = self.scan_page(cursor, &pattern, 1000).await else {
                    break;
                };
                if !keys.is_empty() {
                    let mut pipe = redis::pipe();
                    for key in &keys {
                        pipe.unlink(key).ignore();
                    }
                    let _: redis::RedisResult<()> = pipe.query_async(&mut conn).await;
                }
                cursor = next;
                if cursor.is_start() {
                    break;
                }
            }
        }
    }

    /// Sends `pipe` on [`durable_conn`](Self::durable_conn) and returns the replies of its
    /// commands. On a cluster the pipeline also carries `WAIT 1` (up to half the response
    /// timeout) after its writes — on the same node connection, so the wait covers exactly those
    /// writes; a pipeline split over several masters waits on each of them — and the writes
    /// count only once a replica of every master they reached holds them, so a failover cannot
    /// lose them. Unacknowledged, the call fails: the writes may still be on the master, so
    /// callers treat it as a failed write that is safe to repeat. A standalone server has no
    /// failover to survive and gets no `WAIT`.
    pub async fn query_confirmed<T: redis::FromRedisValue>(
        &self,
        mut pipe: redis::Pipeline,
    ) -> redis::RedisResult<T> {
        let mut conn = self.durable_conn();
        if !self.is_cluster() {
            return pipe.query_async(&mut conn).await;
        }
        if pipe.is_transaction() {
            // Inside MULTI, WAIT answers at once with what replicas hold already: it would
            // confirm writes no replica has.
            return Err((
                redis::ErrorKind::Client,
                "a confirmed write cannot be a MULTI transaction",
            )
                .into());
        }
        let wait_ms = u64::try_from(self.timeouts.response.as_millis() / 2)
            .unwrap_or(1000)
            .max(1);
        pipe.cmd("WAIT").arg(1).arg(wait_ms);
        let mut replies: Vec<redis::Value> = pipe.query_async(&mut conn).await?;
        let acks = match replies.pop() {
            Some(redis::Value::Int(acks)) => acks,
            other => {
                return Err((
                    redis::ErrorKind::Parse,
                    "WAIT answered oddly",
                    format!("{other:?}"),
                )
                    .into());
            }
        };
        if acks < 1 {
            metrics::counter!(crate::telemetry::REDIS_UNREPLICATED_TOTAL).increment(1);
            return Err((
                redis::ErrorKind::Io,
                "no replica acknowledged the writes",
                format!("WAIT 1 {wait_ms} answered {acks}"),
            )
                .into());
        }
        Ok(T::from_redis_value(redis::Value::Array(replies))?)
    }

    /// Runs `call` of `script` as [`query_confirmed`](Self::query_confirmed) does, loading the
    /// script and sending again when a node answers `NOSCRIPT` (a new master after a failover, a
    /// flushed script cache); the script's reply.
    pub async fn invoke_confirmed<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        call: &redis::ScriptInvocation<'_>,
    ) -> redis::RedisResult<T> {
        let mut pipe = redis::pipe();
        pipe.invoke_script(call);
        match self.query_confirmed::<(T,)>(pipe).await {
            Err(err) if err.code() == Some("NOSCRIPT") => {
                let mut pipe = redis::pipe();
                pipe.load_script(script).ignore();
                pipe.invoke_script(call);
                Ok(self.query_confirmed::<(T,)>(pipe).await?.0)
            }
            other => Ok(other?.0),
        }
    }

    /// Checks that the deployment answers.
    pub async fn ping(&self) -> redis::RedisResult<()> {
        let mut conn = self.conn();
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map(|_| ())
    }
}

/// How long a cluster link's calls may fail with no success before it is replaced: twice the
/// response timeout, and at least 3 s, so one slow answer never counts.
fn stuck_after(response: Duration) -> Duration {
    (response * 2).max(Duration::from_secs(3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_url_is_standalone_and_a_list_is_a_cluster() {
        assert_eq!(redis_seeds("redis://a:1"), Ok(vec!["redis://a:1"]));
        assert_eq!(
            redis_seeds("redis://a:1, redis://b:2"),
            Ok(vec!["redis://a:1", "redis://b:2"])
        );
        assert!(redis_seeds("redis://a:1,").is_err());
        assert!(redis_seeds("").is_err());
        assert!(redis_seeds(",,").is_err());
    }

    #[test]
    fn every_url_of_a_list_is_redacted() {
        assert_eq!(
            redact_urls("redis://:pw@a:1,redis://:pw2@b:2"),
            "redis://:***@a:1,redis://:***@b:2"
        );
    }
}
