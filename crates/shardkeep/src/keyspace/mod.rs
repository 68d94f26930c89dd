//! Every Redis key name in shardkeep, and nothing else: no other module formats a key.
//!
//! Layout of a key: a namespace first, then a fixed family path, then escaped caller segments
//! ([`segment::escape`]). Keys that one Lua script or `MULTI` touches together carry a shared hash
//! tag (`{…}`), so the whole keyspace runs unchanged on Redis Cluster:
//!
//! - ungrouped: `<ns>:<family path>:<segment>`
//! - grouped: `{<ns>:<group>}:<rest>`, e.g. `{<ns>:q:<queue>}:pending`
//!
//! [`families::FAMILIES`] describes every family (owner, purpose, TTL rule, cleanup target);
//! `docs/keyspace.md` carries the same table and a test keeps the two equal.

pub mod families;
pub mod segment;
pub mod slot;

pub use families::{FAMILIES, KeyFamily, KeyOwner, TtlRule};
pub use segment::MAX_SEGMENT_BYTES;

use crate::ttl::Ttl;

/// Longest namespace accepted.
pub const MAX_NAMESPACE_BYTES: usize = 64;
/// Default lifetime of a consumed-handoff marker.
pub const DEFAULT_CONSUMED_MARKER_TTL: Ttl = Ttl::from_static_secs(24 * 60 * 60);
/// Lifetime of a character checkpoint.
pub const CHECKPOINT_TTL: Ttl = Ttl::from_static_secs(60 * 60);
/// Lifetime of a placement record (refreshed on every residency change).
pub const PLACEMENT_TTL: Ttl = Ttl::from_static_secs(30 * 24 * 60 * 60);
/// Lifetime of a queue's recovery lock.
pub const QUEUE_RECOVERY_LOCK_TTL: Ttl = Ttl::from_static_secs(30);

/// A key could not be built from the caller's input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// A required segment was empty.
    #[error("{what} must not be empty")]
    Empty {
        /// Which segment.
        what: &'static str,
    },
    /// A segment exceeded [`MAX_SEGMENT_BYTES`].
    #[error("{what} is {len} bytes long; at most {max} are allowed")]
    TooLong {
        /// Which segment.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// The namespace held characters outside `[A-Za-z0-9_-]` or was too long.
    #[error("namespace {0:?} must be 1 to 64 characters of [A-Za-z0-9_-]")]
    InvalidNamespace(String),
}

/// The scopes a handoff can be stored under, in the order a take tries them.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(tag = "scope", content = "id", rename_all = "snake_case")]
pub enum HandoffScope {
    /// A specific game-server instance.
    Instance(String),
    /// A placement (shard and zone assignment).
    Placement(String),
    /// A listening port, kept for older clients.
    Port(u16),
}

impl HandoffScope {
    /// Position in the documented take order: instance, then placement, then port.
    pub fn rank(&self) -> u8 {
        match self {
            Self::Instance(_) => 0,
            Self::Placement(_) => 1,
            Self::Port(_) => 2,
        }
    }

    fn key_suffix(&self) -> Result<String, KeyError> {
        Ok(match self {
            Self::Instance(id) => format!("instance:{}", segment::escape("instance id", id)?),
            Self::Placement(id) => format!("placement:{}", segment::escape("placement id", id)?),
            Self::Port(port) => format!("port:{port}"),
        })
    }
}

/// Builds key names under one namespace. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyspace {
    ns: String,
}

/// The keys of one durable work queue; every one shares the queue's hash tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueKeys {
    tag: String,
    /// Entries waiting to be leased.
    pub pending: String,
    /// Dead letters, newest first.
    pub dead: String,
    /// Dead letters by id (hash: id → the dead letter as stored in `dead`).
    pub dead_index: String,
    /// Set of registered consumer ids.
    pub consumers: String,
    /// Entries each consumer's processing list holds (hash: consumer id → count); every script
    /// that moves a list's entries sets its field from the list's length.
    pub processing_held: String,
    /// The sum of `processing_held`, kept by the same scripts (the depth report reads it).
    pub processing_total: String,
    /// Lock held while recovering dead consumers' processing lists.
    pub recovery_lock: String,
}

impl QueueKeys {
    /// The processing list owned by one consumer incarnation.
    pub fn processing(&self, consumer: &str) -> Result<String, KeyError> {
        Ok(format!(
            "{}:processing:{}",
            self.tag,
            segment::escape("consumer id", consumer)?
        ))
    }

    /// The prefix of every processing list: a processing key is this prefix followed by the
    /// escaped consumer id.
    pub fn processing_prefix(&self) -> String {
        format!("{}:processing:", self.tag)
    }

    /// SCAN pattern over every processing list of this queue (recovery's backstop).
    pub fn processing_pattern(&self) -> String {
        format!("{}*", self.processing_prefix())
    }

    /// The consumer id a processing-list key names, if the key is one of this queue's.
    pub fn consumer_of_processing(&self, key: &str) -> Option<String> {
        key.strip_prefix(&self.processing_prefix())
            .and_then(segment::unescape)
    }

    /// The heartbeat key of one consumer incarnation.
    pub fn consumer_heartbeat(&self, consumer: &str) -> Result<String, KeyError> {
        Ok(format!(
            "{}:consumer:{}",
            self.tag,
            segment::escape("consumer id", consumer)?
        ))
    }
}

impl Keyspace {
    /// A keyspace under `namespace` (1 to 64 characters of `[A-Za-z0-9_-]`).
    pub fn new(namespace: &str) -> Result<Self, KeyError> {
        let valid = !namespace.is_empty()
            && namespace.len() <= MAX_NAMESPACE_BYTES
            && namespace
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(KeyError::InvalidNamespace(namespace.to_owned()));
        }
        Ok(Self {
            ns: namespace.to_owned(),
        })
    }

    /// The namespace every key starts with.
    pub fn namespace(&self) -> &str {
        &self.ns
    }

    /// SCAN patterns that together match every key of this namespace and nothing else.
    pub fn namespace_patterns(&self) -> [String; 2] {
        [format!("{}:*", self.ns), format!("{{{}:*", self.ns)]
    }

    fn plain(&self, path: &str, what: &'static str, raw: &str) -> Result<String, KeyError> {
        Ok(format!(
            "{}:{path}:{}",
            self.ns,
            segment::escape(what, raw)?
        ))
    }

    /// A login session record.
    pub fn login_session(&self, token: &str) -> Result<String, KeyError> {
        self.plain("login:session", "session token", token)
    }

    /// An operator-console session, named by the digest of its token (never the token itself).
    pub fn console_session(&self, token_digest: &str) -> Result<String, KeyError> {
        self.plain("console:session", "console session digest", token_digest)
    }

    /// A login throttle counter for one subject (account, address, or a global ceiling).
    pub fn login_throttle(&self, subject: &str) -> Result<String, KeyError> {
        self.plain("login:throttle", "throttle subject", subject)
    }

    fn handoff_tag(&self, token: &str) -> Result<String, KeyError> {
        Ok(format!(
            "{{{}:handoff:{}}}",
            self.ns,
            segment::escape("handoff token", token)?
        ))
    }

    /// A handoff payload stored under one scope.
    pub fn handoff(&self, token: &str, scope: &HandoffScope) -> Result<String, KeyError> {
        Ok(format!(
            "{}:{}",
            self.handoff_tag(token)?,
            scope.key_suffix()?
        ))
    }

    /// The marker that a handoff token was consumed (same hash tag as its payloads).
    pub fn handoff_consumed(&self, token: &str) -> Result<String, KeyError> {
        Ok(format!("{}:consumed", self.handoff_tag(token)?))
    }

    /// A transfer activation marker for one transfer token.
    pub fn transfer_activated(&self, token: &str) -> Result<String, KeyError> {
        self.plain("transfer:activated", "transfer token", token)
    }

    /// A transfer the source has started and not completed (what keeps its marker live).
    pub fn transfer_pending(&self, token: &str) -> Result<String, KeyError> {
        self.plain("transfer:pending", "transfer token", token)
    }

    /// SCAN pattern over every pending-transfer record.
    pub fn transfer_pending_pattern(&self) -> String {
        format!("{}:transfer:pending:*", self.ns)
    }

    /// SCAN pattern over every transfer activation marker.
    pub fn transfer_activated_pattern(&self) -> String {
        format!("{}:transfer:activated:*", self.ns)
    }

    /// The transfer token a marker key names, if the key is one.
    pub fn transfer_token_of(&self, key: &str) -> Option<String> {
        let prefix = format!("{}:transfer:activated:", self.ns);
        key.strip_prefix(&prefix).and_then(segment::unescape)
    }

    fn presence_tag(&self) -> String {
        format!("{{{}:presence}}", self.ns)
    }

    /// What every presence record's key (account, character and order mark) starts with.
    pub fn presence_prefix(&self) -> String {
        format!("{}:", self.presence_tag())
    }

    /// Presence record of one account.
    pub fn presence_account(&self, account_id: &str) -> Result<String, KeyError> {
        Ok(format!(
            "{}:account:{}",
            self.presence_tag(),
            segment::escape("account id", account_id)?
        ))
    }

    /// Presence record of one character.
    pub fn presence_character(&self, character_id: &str) -> Result<String, KeyError> {
        Ok(format!(
            "{}:character:{}",
            self.presence_tag(),
            segment::escape("character id", character_id)?
        ))
    }

    /// The order mark of one character's session cleanups (the newest seen); in the presence
    /// group so a presence refresh can check it in the same script.
    pub fn presence_session_order(&self, character_id: &str) -> Result<String, KeyError> {
        Ok(format!(
            "{}:order:{}",
            self.presence_tag(),
            segment::escape("character id", character_id)?
        ))
    }

    /// Index set of account ids with a presence record.
    pub fn presence_account_index(&self) -> String {
        format!("{}:accounts", self.presence_tag())
    }

    /// Index set of character ids with a presence record.
    pub fn presence_character_index(&self) -> String {
        format!("{}:characters", self.presence_tag())
    }

    fn registry_tag(&self) -> String {
        format!("{{{}:registry}}", self.ns)
    }

    /// What every registration record's key starts with.
    pub fn registry_instance_prefix(&self) -> String {
        format!("{}:instance:", self.registry_tag())
    }

    /// Registration record of one service instance.
    pub fn registry_instance(&self, instance_id: &str) -> Result<String, KeyError> {
        Ok(format!(
            "{}:instance:{}",
            self.registry_tag(),
            segment::escape("instance id", instance_id)?
        ))
    }

    /// Index set of registered instance ids.
    pub fn registry_index(&self) -> String {
        format!("{}:instances", self.registry_tag())
    }

    /// A registered internal-request nonce.
    pub fn internal_nonce(&self, key_id: &str, nonce: &str) -> Result<String, KeyError> {
        Ok(format!(
            "{}:nonce:{}:{}",
            self.ns,
            segment::escape("key id", key_id)?,
            segment::escape("nonce", nonce)?
        ))
    }

    /// A session's resume-ledger record.
    pub fn resume_ledger(&self, session_token: &str) -> Result<String, KeyError> {
        self.plain("resume", "session token", session_token)
    }

    /// Marker that a realtime session token is active.
    pub fn active_session(&self, session_token: &str) -> Result<String, KeyError> {
        self.plain("session:active", "session token", session_token)
    }

    /// A character's placement record (shard and zone, or a tombstone).
    pub fn placement(&self, character_id: &str) -> Result<String, KeyError> {
        self.plain("placement", "character id", character_id)
    }

    /// A character checkpoint, keyed by the character's id: two rows never share one, whatever
    /// their names (name uniqueness is Postgres's `lower()`, which no Rust lowercasing matches).
    pub fn checkpoint(&self, character_id: uuid::Uuid) -> String {
        format!("{}:checkpoint:{}", self.ns, character_id.as_hyphenated())
    }

    /// A shared networking counter.
    pub fn net_counter(&self, name: &str) -> Result<String, KeyError> {
        self.plain("net:counter", "counter name", name)
    }

    /// The keys of the durable work queue named `queue`.
    pub fn queue(&self, queue: &str) -> Result<QueueKeys, KeyError> {
        let tag = format!(
            "{{{}:q:{}}}",
            self.ns,
            segment::escape("queue name", queue)?
        );
        Ok(QueueKeys {
            pending: format!("{tag}:pending"),
            dead: format!("{tag}:dead"),
            dead_index: format!("{tag}:dead:index"),
            consumers: format!("{tag}:consumers"),
            processing_held: format!("{tag}:processing-held"),
            processing_total: format!("{tag}:processing-total"),
            recovery_lock: format!("{tag}:recovery-lock"),
            tag,
        })
    }
}

#[cfg(test)]
mod tests;
