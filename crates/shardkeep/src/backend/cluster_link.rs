//! A Redis Cluster connection that heals itself. redis-rs's cluster connection reconnects on its
//! own after most failures, but not after all: once every node was restarted at once (a
//! redeploy, a host reboot) its calls can keep timing out for good while a fresh connection to
//! the same nodes answers at once, and with every node connection gone it can keep answering
//! "no connections found". A link that answers so — no node connection left, or connection
//! failures with no success for a stretch — is replaced by a fresh connection from the same
//! client, so workers never sit running while every Redis call fails.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;

/// Least time between two replacements of a link.
const REBUILD_EVERY: Duration = Duration::from_secs(1);

/// A cluster connection that replaces itself when it stops working.
pub struct ClusterLink {
    client: Box<ClusterClient>,
    config: ClusterConfig,
    bound: Duration,
    /// How long connection failures may last with no success before the link is replaced.
    stuck_after: Duration,
    current: Mutex<(u64, ClusterConnection)>,
    /// When the link was made.
    born: Instant,
    /// Milliseconds after `born` of the last success (or replacement).
    last_ok_ms: AtomicU64,
    /// Held while one caller replaces the link; others carry on failing meanwhile.
    rebuilding: tokio::sync::Mutex<Instant>,
}

impl ClusterLink {
    /// Connects through `client` with `config` (each attempt bounded by `bound`); a link whose
    /// calls fail for `stuck_after` with no success is replaced.
    pub(super) async fn connect(
        client: Box<ClusterClient>,
        config: ClusterConfig,
        bound: Duration,
        stuck_after: Duration,
    ) -> redis::RedisResult<Self> {
        let conn = client
            .get_async_connection_with_config(config.clone())
            .await?;
        Ok(Self {
            client,
            config,
            bound,
            stuck_after,
            current: Mutex::new((0, conn)),
            born: Instant::now(),
            last_ok_ms: AtomicU64::new(0),
            rebuilding: tokio::sync::Mutex::new(Instant::now()),
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

    /// Called after a call answered (a server error is an answer too).
    pub(super) fn after_ok(&self) {
        self.last_ok_ms.store(self.now_ms(), Ordering::Relaxed);
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Called after a failed call on generation `seen`: replaces the connection when it has no
    /// node connection left, or when connection failures have lasted `stuck_after` with no
    /// success — unless another call is replacing it or already did, or the last replacement
    /// was under a second ago.
    pub(super) async fn after_error(&self, seen: u64, err: &redis::RedisError) {
        let no_node = err.kind() == redis::ErrorKind::ClusterConnectionNotFound;
        let failing = err.is_timeout() || err.is_connection_dropped() || err.is_io_error();
        let since_ok = Duration::from_millis(
            self.now_ms()
                .saturating_sub(self.last_ok_ms.load(Ordering::Relaxed)),
        );
        let stuck = failing && since_ok >= self.stuck_after;
        if !(no_node || stuck) {
            return;
        }
        let Ok(mut last) = self.rebuilding.try_lock() else {
            return;
        };
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
                // The new link gets a whole stretch of its own before it can be judged stuck.
                self.after_ok();
                metrics::counter!(crate::telemetry::REDIS_RECONNECTS_TOTAL).increment(1);
                tracing::warn!(
                    event = "redis_cluster_reconnected",
                    cause = if no_node { "no node connection" } else { "failing" },
                    error = %err,
                    "replaced a cluster connection that had stopped working"
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
