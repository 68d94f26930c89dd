//! The Redis connection (multiplexed, reconnecting) and the keyspace it writes under.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{ConnectError, one_line, redact_url};
use crate::keyspace::Keyspace;

/// A cheap-to-clone handle on one Redis server, bound to a namespace.
#[derive(Clone)]
pub struct RedisBackend {
    client: redis::Client,
    conn: ConnectionManager,
    keys: Keyspace,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
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

impl RedisBackend {
    /// Connects to `url` (named by `setting` in errors) and checks it answers `PING`.
    pub async fn connect(
        setting: &'static str,
        url: &str,
        keys: Keyspace,
        timeouts: RedisTimeouts,
    ) -> Result<Self, ConnectError> {
        let fail = |reason: String| ConnectError {
            setting,
            target: redact_url(url),
            reason,
        };
        let client = redis::Client::open(url).map_err(|e| fail(one_line(&e)))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.response))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let connect = ConnectionManager::new_with_config(client.clone(), config);
        let conn = tokio::time::timeout(timeouts.connect + timeouts.response, connect)
            .await
            .map_err(|_| fail("timed out connecting".into()))?
            .map_err(|e| fail(one_line(&e)))?;
        let backend = Self { client, conn, keys };
        backend.ping().await.map_err(|e| fail(one_line(&e)))?;
        Ok(backend)
    }

    /// The keyspace every key of this backend is built from.
    pub fn keys(&self) -> &Keyspace {
        &self.keys
    }

    /// A connection handle for adapters inside this crate (cheap clone of a multiplexed link).
    pub(crate) fn conn(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// The client, for adapters that need a dedicated connection (blocking commands).
    pub(crate) fn client(&self) -> &redis::Client {
        &self.client
    }

    /// Deletes every key of this backend's namespace (scratch namespaces of benchmarks and the
    /// simulator): SCAN pages of 1,000, each unlinked in one call. Best effort: a failing page
    /// ends the sweep.
    pub async fn purge_namespace(&self) {
        let mut conn = self.conn();
        for pattern in self.keys.namespace_patterns() {
            let mut cursor: u64 = 0;
            loop {
                let page: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(1000)
                    .query_async(&mut conn)
                    .await;
                let Ok((next, keys)) = page else { break };
                if !keys.is_empty() {
                    let _: redis::RedisResult<i64> =
                        redis::cmd("UNLINK").arg(&keys).query_async(&mut conn).await;
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
    }

    /// Checks that the server answers.
    pub async fn ping(&self) -> redis::RedisResult<()> {
        let mut conn = self.conn();
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map(|_| ())
    }
}
