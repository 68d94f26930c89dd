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

/// `failing_since_ms` while the link works.
const NOT_FAILING: u64 = u64::MAX;

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
    /// Milliseconds after `born` of the first connection failure since the last success (or
    /// replacement); `NOT_FAILING` while calls succeed.
    failing_since_ms: AtomicU64,
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
            failing_since_ms: AtomicU64::new(NOT_FAILING),
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
        if self.failing_since_ms.load(Ordering::Relaxed) != NOT_FAILING {
            self.failing_since_ms.store(NOT_FAILING, Ordering::Relaxed);
        }
    }

    /// How long connection failures have lasted with no success in between, counting this one.
    fn failing_for(&self) -> Duration {
        let now = self.now_ms();
        let since = match self.failing_since_ms.compare_exchange(
            NOT_FAILING,
            now,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => now,
            Err(since) => since,
        };
        Duration::from_millis(now.saturating_sub(since))
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.born.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Called after a failed call on generation `seen`: replaces the connection when it has no
    /// node connection left, or when connection failures have gone on for `stuck_after` with no
    /// success in between (a link idle for long is not judged by its first failure) — unless another call is replacing it or already did, or the last replacement
    /// was under a second ago.
    pub(super) async fn after_error(&self, seen: u64, err: &redis::RedisError) {
        let no_node = err.kind() == redis::ErrorKind::ClusterConnectionNotFound;
        let failing = err.is_timeout() || err.is_connection_dropped() || err.is_io_error();
        let stuck = failing && self.failing_for() >= self.stuck_after;
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
                self.failing_since_ms.store(NOT_FAILING, Ordering::Relaxed);
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
