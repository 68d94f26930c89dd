//! A Redis Cluster connection that heals itself. redis-rs's cluster connection reconnects on its
//! own after most failures, but once every node connection is gone (a network cut, all nodes
//! restarted) it can keep answering "no connections found" for good. Such a link is replaced
//! by a fresh connection from the same client, at most once a second, so workers never sit
//! running while every Redis call fails.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;

/// Least time between two rebuilds.
const REBUILD_EVERY: Duration = Duration::from_secs(1);

/// A cluster connection that replaces itself once it has no node connection left.
pub struct ClusterLink {
    client: Box<ClusterClient>,
    config: ClusterConfig,
    bound: Duration,
    current: Mutex<(u64, ClusterConnection)>,
    rebuilt: tokio::sync::Mutex<Instant>,
}

impl ClusterLink {
    /// Connects through `client` with `config` (each attempt bounded by `bound`).
    pub(super) async fn connect(
        client: Box<ClusterClient>,
        config: ClusterConfig,
        bound: Duration,
    ) -> redis::RedisResult<Self> {
        let conn = client
            .get_async_connection_with_config(config.clone())
            .await?;
        Ok(Self {
            client,
            config,
            bound,
            current: Mutex::new((0, conn)),
            rebuilt: tokio::sync::Mutex::new(Instant::now()),
        })
    }

    /// The connection in use and its generation.
    pub(super) fn get(&self) -> (u64, ClusterConnection) {
        match self.current.lock() {
            Ok(current) => (current.0, current.1.clone()),
            Err(poisoned) => {
                let current = poisoned.into_inner();
                (current.0, current.1.clone())
            }
        }
    }

    /// Called after a failed call on generation `seen`: replaces the connection when the
    /// failure says it has no node connection left (unless another call already did, or the
    /// last rebuild was under a second ago).
    pub(super) async fn after_error(&self, seen: u64, err: &redis::RedisError) {
        if err.kind() != redis::ErrorKind::ClusterConnectionNotFound {
            return;
        }
        let mut last = self.rebuilt.lock().await;
        if self.get().0 != seen || last.elapsed() < REBUILD_EVERY {
            return;
        }
        *last = Instant::now();
        let fresh = tokio::time::timeout(
            self.bound,
            self.client
                .get_async_connection_with_config(self.config.clone()),
        )
        .await;
        match fresh {
            Ok(Ok(conn)) => {
                if let Ok(mut current) = self.current.lock() {
                    *current = (seen + 1, conn);
                }
                metrics::counter!(crate::telemetry::REDIS_RECONNECTS_TOTAL).increment(1);
                tracing::warn!(
                    event = "redis_cluster_reconnected",
                    "replaced a cluster connection that had no node left"
                );
            }
            Ok(Err(err)) => {
                tracing::warn!(event = "redis_cluster_reconnect_failed", error = %err);
            }
            Err(_) => tracing::warn!(
                event = "redis_cluster_reconnect_failed",
                error = "timed out"
            ),
        }
    }
}
