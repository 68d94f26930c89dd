//! The catalogue of key families: who owns each, what it holds, how it expires, and whether admin
//! cleanup may delete it. Also the admin cleanup descriptors built from it.

use super::Keyspace;

/// The service that writes a key family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyOwner {
    /// The login service.
    Login,
    /// The control plane (handoffs, registry, transfer status, admin).
    ControlPlane,
    /// The game server (presence repair, placement, checkpoints, journal processing).
    GameServer,
}

impl KeyOwner {
    /// Name used in tables and API answers.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Login => "login",
            Self::ControlPlane => "control plane",
            Self::GameServer => "game server",
        }
    }
}

/// How a family's keys expire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlRule {
    /// The writer passes the TTL on every write.
    CallerProvided,
    /// A named default, configurable where noted.
    Default(&'static str),
    /// Computed from the record's own `expires_at`.
    DerivedFromExpiresAt,
    /// The instance's registration TTL, refreshed by heartbeats.
    RegistrationTtl,
    /// The configured failed-login throttle window.
    ThrottleWindow,
    /// Twice the signed-request verifier's skew window plus one second.
    NonceLifetime,
    /// Never expires; bounded by its own cleanup.
    None,
}

impl TtlRule {
    /// Description used in the keyspace table.
    pub fn describe(self) -> String {
        match self {
            Self::CallerProvided => "caller-provided".into(),
            Self::Default(what) => format!("default ({what})"),
            Self::DerivedFromExpiresAt => "derived from `expires_at`".into(),
            Self::RegistrationTtl => "registration TTL".into(),
            Self::ThrottleWindow => "throttle window".into(),
            Self::NonceLifetime => "2 × skew window + 1 s".into(),
            Self::None => "none".into(),
        }
    }
}

/// One family of keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyFamily {
    /// Stable family name.
    pub name: &'static str,
    /// Shape of the key, with `<ns>` and placeholders for escaped segments.
    pub template: &'static str,
    /// Which service writes it.
    pub owner: KeyOwner,
    /// What it is for.
    pub purpose: &'static str,
    /// How it expires.
    pub ttl: TtlRule,
    /// The admin cleanup target that covers it, if any.
    pub cleanup_target: Option<&'static str>,
}

macro_rules! family {
    ($name:literal, $template:literal, $owner:ident, $ttl:expr, $cleanup:expr, $purpose:literal) => {
        KeyFamily {
            name: $name,
            template: $template,
            owner: KeyOwner::$owner,
            purpose: $purpose,
            ttl: $ttl,
            cleanup_target: $cleanup,
        }
    };
}

/// Every key family shardkeep writes.
pub const FAMILIES: &[KeyFamily] = &[
    family!(
        "login_session",
        "<ns>:login:session:<token>",
        Login,
        TtlRule::CallerProvided,
        None,
        "login session record"
    ),
    family!(
        "console_session",
        "<ns>:console:session:<token_sha256>",
        ControlPlane,
        TtlRule::Default("console session lifetime, 1 h"),
        None,
        "operator console session, shared by every serve process; deleted at logout"
    ),
    family!(
        "login_throttle",
        "<ns>:login:throttle:<subject>",
        Login,
        TtlRule::ThrottleWindow,
        None,
        "login attempt counter per account, client address, or global ceiling"
    ),
    family!(
        "handoff",
        "{<ns>:handoff:<token>}:<instance|placement|port>:<id>",
        ControlPlane,
        TtlRule::CallerProvided,
        Some("handoff"),
        "character-entry handoff payload under one scope"
    ),
    family!(
        "handoff_consumed",
        "{<ns>:handoff:<token>}:consumed",
        ControlPlane,
        TtlRule::Default("consumed-marker TTL, 24 h"),
        None,
        "proof a handoff token was taken; blocks replay after the payload expired"
    ),
    family!(
        "transfer_pending",
        "<ns>:transfer:pending:<token>",
        GameServer,
        TtlRule::CallerProvided,
        None,
        "a transfer the source game server started and has not completed; its marker lives while this does"
    ),
    family!(
        "transfer_activated",
        "<ns>:transfer:activated:<token>",
        ControlPlane,
        TtlRule::CallerProvided,
        None,
        "a target game server activated this transfer token; reconciled against pending transfers"
    ),
    family!(
        "presence_account",
        "{<ns>:presence}:account:<account_id>",
        GameServer,
        TtlRule::DerivedFromExpiresAt,
        Some("presence"),
        "presence record of an account"
    ),
    family!(
        "presence_character",
        "{<ns>:presence}:character:<character_id>",
        GameServer,
        TtlRule::DerivedFromExpiresAt,
        Some("presence"),
        "presence record of a character"
    ),
    family!(
        "presence_session_order",
        "{<ns>:presence}:order:<character_id>",
        GameServer,
        TtlRule::Default("session order TTL, 7 d, refreshed by each session event"),
        None,
        "the newest session event (start or cleanup) seen for a character; older cleanups skip their effects"
    ),
    family!(
        "presence_account_index",
        "{<ns>:presence}:accounts",
        GameServer,
        TtlRule::None,
        Some("presence"),
        "index set of accounts with presence; pruned on read"
    ),
    family!(
        "presence_character_index",
        "{<ns>:presence}:characters",
        GameServer,
        TtlRule::None,
        Some("presence"),
        "index set of characters with presence; pruned on read"
    ),
    family!(
        "registry_instance",
        "{<ns>:registry}:instance:<instance_id>",
        ControlPlane,
        TtlRule::RegistrationTtl,
        Some("registry"),
        "service instance registration record"
    ),
    family!(
        "registry_index",
        "{<ns>:registry}:instances",
        ControlPlane,
        TtlRule::None,
        Some("registry"),
        "index set of registered instances; pruned on listing"
    ),
    family!(
        "internal_nonce",
        "<ns>:nonce:<key_id>:<nonce>",
        ControlPlane,
        TtlRule::NonceLifetime,
        None,
        "signed internal request nonce, for replay rejection"
    ),
    family!(
        "resume_ledger",
        "<ns>:resume:<session_token>",
        GameServer,
        TtlRule::CallerProvided,
        None,
        "realtime session resume-ledger record"
    ),
    family!(
        "active_session",
        "<ns>:session:active:<session_token>",
        GameServer,
        TtlRule::CallerProvided,
        None,
        "a realtime session token that is currently attached"
    ),
    family!(
        "placement",
        "<ns>:placement:<character_id>",
        GameServer,
        TtlRule::Default("placement TTL, 30 d, refreshed on every residency change"),
        None,
        "shard and zone holding a character, or a fenced tombstone after logout"
    ),
    family!(
        "checkpoint",
        "<ns>:checkpoint:<character_id>",
        GameServer,
        TtlRule::Default("checkpoint TTL, 1 h"),
        None,
        "full character snapshot between Postgres flushes"
    ),
    family!(
        "net_counter",
        "<ns>:net:counter:<name>",
        GameServer,
        TtlRule::None,
        None,
        "shared networking counter"
    ),
    family!(
        "queue_pending",
        "{<ns>:q:<queue>}:pending",
        GameServer,
        TtlRule::None,
        None,
        "durable work queue entries waiting for a consumer"
    ),
    family!(
        "queue_processing",
        "{<ns>:q:<queue>}:processing:<consumer>",
        GameServer,
        TtlRule::None,
        None,
        "entries leased by one consumer incarnation"
    ),
    family!(
        "queue_processing_held",
        "{<ns>:q:<queue>}:processing-held",
        GameServer,
        TtlRule::None,
        None,
        "entries each consumer's processing list holds (hash: consumer id → count), set from the list's length by every script that moves its entries"
    ),
    family!(
        "queue_processing_total",
        "{<ns>:q:<queue>}:processing-total",
        GameServer,
        TtlRule::None,
        None,
        "the sum of the held counts, kept by the same scripts: the depth report reads it in O(1); each recovery pass sets it again from the held counts (one bounded script)"
    ),
    family!(
        "queue_dead",
        "{<ns>:q:<queue>}:dead",
        GameServer,
        TtlRule::None,
        None,
        "dead letters, newest first; bounded by dead-letter retention"
    ),
    family!(
        "queue_dead_index",
        "{<ns>:q:<queue>}:dead:index",
        GameServer,
        TtlRule::None,
        None,
        "dead letters by id, for lookup and requeue; pruned with the list"
    ),
    family!(
        "queue_consumers",
        "{<ns>:q:<queue>}:consumers",
        GameServer,
        TtlRule::None,
        None,
        "set of consumer incarnations"
    ),
    family!(
        "queue_consumer",
        "{<ns>:q:<queue>}:consumer:<consumer>",
        GameServer,
        TtlRule::RegistrationTtl,
        None,
        "consumer heartbeat; its absence marks the consumer dead"
    ),
    family!(
        "queue_recovery_lock",
        "{<ns>:q:<queue>}:recovery-lock",
        GameServer,
        TtlRule::Default("recovery lock TTL, 30 s"),
        None,
        "held while one instance recovers dead consumers' entries"
    ),
];

/// Renders [`FAMILIES`] as the markdown table kept in `docs/keyspace.md`.
pub fn markdown_table() -> String {
    let mut out = String::from(
        "| family | key | owner | TTL | cleanup target | purpose |\n| --- | --- | --- | --- | --- | --- |\n",
    );
    for f in FAMILIES {
        out.push_str(&format!(
            "| {} | `{}` | {} | {} | {} | {} |\n",
            f.name,
            f.template,
            f.owner.as_str(),
            f.ttl.describe(),
            f.cleanup_target.unwrap_or("—"),
            f.purpose
        ));
    }
    out
}

/// What an admin cleanup target covers: exact keys, SCAN patterns, or both.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CleanupTarget {
    /// Target name used by the API and CLI.
    pub name: &'static str,
    /// The owning service.
    pub owner: KeyOwner,
    /// What deleting it repairs.
    pub description: &'static str,
    /// Keys named exactly.
    pub exact_keys: Vec<String>,
    /// SCAN `MATCH` patterns.
    pub scan_patterns: Vec<String>,
}

impl Keyspace {
    /// The admin cleanup targets: presence, handoff and registry.
    ///
    /// Consumed-handoff markers are deliberately not covered: deleting one would let its token
    /// be taken again.
    pub fn cleanup_targets(&self) -> Vec<CleanupTarget> {
        let ns = self.namespace();
        vec![
            CleanupTarget {
                name: "presence",
                owner: KeyOwner::GameServer,
                description: "presence records and their index sets",
                exact_keys: vec![
                    self.presence_account_index(),
                    self.presence_character_index(),
                ],
                scan_patterns: vec![
                    format!("{{{ns}:presence}}:account:*"),
                    format!("{{{ns}:presence}}:character:*"),
                ],
            },
            CleanupTarget {
                name: "handoff",
                owner: KeyOwner::ControlPlane,
                description: "scoped handoff payloads (consumed markers are kept)",
                exact_keys: Vec::new(),
                scan_patterns: vec![
                    format!("{{{ns}:handoff:*}}:instance:*"),
                    format!("{{{ns}:handoff:*}}:placement:*"),
                    format!("{{{ns}:handoff:*}}:port:*"),
                ],
            },
            CleanupTarget {
                name: "registry",
                owner: KeyOwner::ControlPlane,
                description: "instance registrations and the instance index set",
                exact_keys: vec![self.registry_index()],
                scan_patterns: vec![format!("{{{ns}:registry}}:instance:*")],
            },
        ]
    }

    /// One cleanup target by name.
    pub fn cleanup_target(&self, name: &str) -> Option<CleanupTarget> {
        self.cleanup_targets().into_iter().find(|t| t.name == name)
    }
}
