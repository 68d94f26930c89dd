//! What the API's handlers share: the library handles, the signing keys and the settings.

use std::sync::Arc;

use shardkeep::Coordination;
use shardkeep::audit::AuditReader;
use shardkeep::journal::SessionJournal;
use shardkeep::retry::RetryQueue;

use crate::signing::InternalKeys;

/// Settings of the API.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    /// Accepted clock skew of signed requests, in seconds (±).
    pub skew_seconds: i64,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// The console's operator password (`None` disables the console).
    pub console_password: Option<String>,
    /// Login attempts one client may make per throttle window.
    pub console_login_client_limit: u32,
    /// Login attempts all clients together may make per throttle window.
    pub console_login_global_limit: u32,
    /// Where operators reach this server (`https://…` marks the session cookie `Secure`).
    pub public_url: Option<String>,
    /// Trust `X-Forwarded-For` and `X-Forwarded-Proto` from a proxy in front of this server.
    pub trust_forwarded_headers: bool,
    /// How long a worker may finish no pass, with work waiting, before readiness fails.
    pub stall_after: std::time::Duration,
}

impl Default for ApiSettings {
    fn default() -> Self {
        Self {
            skew_seconds: 300,
            max_body_bytes: 64 * 1024,
            console_password: None,
            console_login_client_limit: 10,
            console_login_global_limit: 100,
            public_url: None,
            trust_forwarded_headers: false,
            stall_after: std::time::Duration::from_secs(60),
        }
    }
}

/// Shared state of every handler. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// Persistence retry jobs.
    pub retry: RetryQueue,
    /// The session lifecycle journal.
    pub journal: SessionJournal,
    /// Redis coordination (nonces, cleanup, session markers).
    pub coord: Coordination,
    /// Audit reads.
    pub audit: AuditReader,
    /// The engines (Postgres and Redis, or the embedded store's file), for readiness.
    pub stores: shardkeep::Stores,
    /// Signing keys.
    pub keys: Arc<InternalKeys>,
    /// Settings.
    pub settings: Arc<ApiSettings>,
    /// Rendered metrics (Prometheus text), when an exporter is installed.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// The workers this process runs, when it runs them: readiness fails while one has
    /// finished no pass for [`ApiSettings::stall_after`] with work waiting.
    pub workers: Option<WorkerWatch>,
}

/// The workers readiness watches, and whether the retry worker is held on purpose.
#[derive(Debug, Clone)]
pub struct WorkerWatch {
    /// Their liveness.
    pub liveness: shardkeep::services::WorkerLiveness,
    /// The retry worker's hold (a held worker is drained on purpose, not stalled).
    pub retry_pause: shardkeep::retry::RetryPause,
}
