//! Coordination primitives: handoffs and consumed markers, transfer activation markers,
//! presence, the service registry, login throttles, internal-request nonces, resume-ledger
//! records and admin cleanup — on Redis, or in the embedded store's file (`embedded`).
//!
//! Every key comes from [`crate::keyspace`]; on Redis every multi-key write is one Lua script
//! (run through `EVALSHA`, reloaded on `NOSCRIPT`) or one `MULTI` over keys that share a hash
//! tag, and in the file one write transaction. Input is validated before anything is sent, so a
//! rejected call writes nothing.

pub mod cleanup;
pub mod console;
pub(crate) mod embedded;
pub mod handoff;
pub mod maintenance;
pub mod nonce;
pub mod presence;
pub mod registry;
pub mod resume;
pub mod session;
pub mod session_order;
pub mod throttle;
pub mod transfer;

use crate::backend::{RedisBackend, SqliteBackend};
use crate::keyspace::{DEFAULT_CONSUMED_MARKER_TTL, KeyError, Keyspace};
use crate::ttl::{Ttl, TtlError};

pub use cleanup::{CleanupMode, CleanupReport};
pub use handoff::{HandoffMove, HandoffTake};
pub use maintenance::{MaintenancePass, maintain_once, run_maintenance};
pub use nonce::{NonceRegistration, nonce_lifetime};
pub use presence::{PresencePrune, PresenceRecord};
pub use registry::{InstanceRecord, RegistryListing};
pub use resume::ResumeLedgerRecord;
pub use session::{LiveSession, SessionRefreshed};
pub use session_order::{OrderCheck, SESSION_ORDER_TTL, SessionOrder};
pub use throttle::{ThrottlePolicy, ThrottleStatus};
pub use transfer::{TransferActivation, TransferReconcile};

/// Largest opaque payload (handoff snapshot, record body) accepted, in bytes.
pub const MAX_PAYLOAD_BYTES: usize = 4 * 1024 * 1024;

/// A coordination call failed.
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    /// A key could not be built from the input; nothing was written.
    #[error("invalid key input: {0}")]
    InvalidKey(#[from] KeyError),
    /// A TTL was zero, negative or too long; nothing was written.
    #[error("invalid TTL: {0}")]
    InvalidTtl(#[from] TtlError),
    /// Other invalid input; nothing was written.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A stored record could not be decoded.
    #[error("stored record at {key} is not valid: {source}")]
    Decode {
        /// The key holding the bad record.
        key: String,
        /// The decode failure.
        source: serde_json::Error,
    },
    /// Redis failed or could not be reached.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The embedded store's file failed.
    #[error("embedded store: {0}")]
    Embedded(#[from] sqlx::Error),
    /// A script answered something this version does not understand.
    #[error("unexpected script reply: {0}")]
    Protocol(String),
}

/// Tunables of the coordination primitives.
#[derive(Debug, Clone, Copy)]
pub struct CoordinationConfig {
    /// Lifetime of a consumed-handoff marker.
    pub consumed_marker_ttl: Ttl,
    /// Keys examined per SCAN round trip (the `COUNT` hint).
    pub scan_count: usize,
}

impl Default for CoordinationConfig {
    fn default() -> Self {
        Self {
            consumed_marker_ttl: DEFAULT_CONSUMED_MARKER_TTL,
            scan_count: 256,
        }
    }
}

/// Handle on the coordination primitives. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Coordination {
    records: Records,
    keys: Keyspace,
    config: CoordinationConfig,
}

/// Where the records are kept.
#[derive(Debug, Clone)]
enum Records {
    Redis(std::sync::Arc<RedisBackend>),
    Embedded(embedded::RecordFile),
}

impl Coordination {
    /// Coordination over `redis` with the given tunables.
    pub fn new(redis: RedisBackend, config: CoordinationConfig) -> Self {
        Self {
            keys: redis.keys().clone(),
            records: Records::Redis(std::sync::Arc::new(redis)),
            config,
        }
    }

    /// Coordination in the embedded store's file `db`, its records named by `keys` and their
    /// expiries read from `clock`.
    pub fn embedded(
        db: SqliteBackend,
        keys: Keyspace,
        config: CoordinationConfig,
        clock: std::sync::Arc<dyn crate::clock::Clock>,
    ) -> Self {
        Self {
            records: Records::Embedded(embedded::RecordFile::new(db, clock)),
            keys,
            config,
        }
    }

    /// The keyspace in use.
    pub fn keys(&self) -> &Keyspace {
        &self.keys
    }

    /// The tunables in use.
    pub fn config(&self) -> &CoordinationConfig {
        &self.config
    }

    /// Checks that the store answers.
    pub async fn ping(&self) -> Result<(), CoordError> {
        match &self.records {
            Records::Redis(redis) => Ok(redis.ping().await?),
            Records::Embedded(file) => file.ping().await,
        }
    }

    /// Deletes up to `limit` expired records from the embedded store's file; how many went.
    /// Expired records are already invisible to every read; this reclaims their space. On Redis,
    /// which expires its own keys, it does nothing.
    pub async fn sweep_expired(&self, limit: usize) -> Result<u64, CoordError> {
        match &self.records {
            Records::Redis(_) => Ok(0),
            Records::Embedded(file) => file.sweep("", limit).await,
        }
    }

    /// The file, when the records are in the embedded store.
    fn file(&self) -> Option<&embedded::RecordFile> {
        match &self.records {
            Records::Embedded(file) => Some(file),
            Records::Redis(_) => None,
        }
    }

    /// Redis, for the calls that reach it (each embedded arm returns before asking).
    fn redis(&self) -> Result<&RedisBackend, CoordError> {
        match &self.records {
            Records::Redis(redis) => Ok(redis),
            Records::Embedded(_) => Err(CoordError::InvalidInput(
                "this coordination call has no embedded form".into(),
            )),
        }
    }

    fn conn(&self) -> Result<crate::backend::redis::RedisConn, CoordError> {
        Ok(self.redis()?.conn())
    }

    /// The Redis backend these primitives run on (none in the embedded store).
    pub fn redis_backend(&self) -> Option<&RedisBackend> {
        match &self.records {
            Records::Redis(redis) => Some(redis),
            Records::Embedded(_) => None,
        }
    }
}

pub(crate) fn check_payload(what: &str, bytes: usize) -> Result<(), CoordError> {
    if bytes == 0 {
        return Err(CoordError::InvalidInput(format!(
            "{what} must not be empty"
        )));
    }
    if bytes > MAX_PAYLOAD_BYTES {
        return Err(CoordError::InvalidInput(format!(
            "{what} is {bytes} bytes; at most {MAX_PAYLOAD_BYTES} are allowed"
        )));
    }
    Ok(())
}

pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    key: &str,
    raw: &[u8],
) -> Result<T, CoordError> {
    serde_json::from_slice(raw).map_err(|source| CoordError::Decode {
        key: key.to_owned(),
        source,
    })
}

pub(crate) fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, CoordError> {
    serde_json::to_vec(value).map_err(|e| CoordError::InvalidInput(e.to_string()))
}
