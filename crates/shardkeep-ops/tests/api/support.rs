//! Spawns the app on a free port over a fresh database and namespace, with a signing client.

use std::sync::{Arc, OnceLock};

use chrono::Utc;
use reqwest::Method;
use serde_json::Value;
use shardkeep::audit::{AuditReader, AuditStore, StaffReadLimit};
use shardkeep::clock::SystemClock;
use shardkeep::journal::SessionJournal;
use shardkeep::queue::WorkQueueConfig;
use shardkeep::retry::{
    IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload, RetryQueue,
    RetryWorkerConfig,
};
use shardkeep_ops::client::SignedClient;
use shardkeep_ops::signing::{
    InternalKeys, KEY_ID_HEADER, NONCE_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, canonical,
    new_nonce, sign,
};
use shardkeep_ops::{ApiSettings, AppState};
use shardkeep_testkit::{JobDriver, TestRedis, TestSqlite};
use sqlx::PgPool;
use uuid::Uuid;

pub(crate) const KEYS: &str = "ops:0123456789abcdef0123,old:fedcba9876543210fedc";
pub(crate) const SECRET: &[u8] = b"0123456789abcdef0123";
pub(crate) const PASSWORD: &str = "correct horse battery";

pub(crate) struct TestApp {
    pub(crate) base: String,
    pub(crate) client: SignedClient,
    pub(crate) http: reqwest::Client,
    pub(crate) state: AppState,
    /// The rows underneath the API (Postgres, or the embedded file), to read and write.
    pub(crate) rows: JobDriver,
    /// Kept alive so the namespace (or the file) is removed when the test ends.
    keep: Keep,
    pub(crate) signals: Option<shardkeep::retry::RetrySignals>,
    /// Stops the server when the test ends (see [`Served`]).
    _server: Served,
}

fn metrics_handle() -> metrics_exporter_prometheus::PrometheusHandle {
    static HANDLE: OnceLock<metrics_exporter_prometheus::PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| shardkeep_ops::telemetry::install().expect("one recorder per test process"))
        .clone()
}

/// Which stores an app serves.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Driver {
    /// Postgres and Redis.
    Servers,
    /// One embedded file.
    Embedded,
}

impl Driver {
    /// Every driver, in the order the tests run them.
    pub(crate) const ALL: [Driver; 2] = [Driver::Servers, Driver::Embedded];
}

/// What keeps an app's stores alive (the servers' handles are read by servers-only tests).
enum Keep {
    Servers {
        pg: shardkeep::PostgresBackend,
        redis: Box<TestRedis>,
    },
    File(TestSqlite),
}

impl TestApp {
    /// Postgres underneath a servers app (for tests that run on the servers only).
    pub(crate) fn pg(&self) -> &shardkeep::PostgresBackend {
        match &self.keep {
            Keep::Servers { pg, .. } => pg,
            Keep::File(_) => panic!("an embedded app has no Postgres"),
        }
    }

    /// The Redis namespace underneath a servers app (for tests that run on the servers only).
    pub(crate) fn redis(&self) -> &TestRedis {
        match &self.keep {
            Keep::Servers { redis, .. } => redis,
            Keep::File(_) => panic!("an embedded app has no Redis"),
        }
    }

    /// The embedded file's `DATABASE_URL` (`None` on the servers), to open it again as another
    /// connection would.
    pub(crate) fn file_url(&self) -> Option<&str> {
        match &self.keep {
            Keep::Servers { .. } => None,
            Keep::File(sqlite) => Some(sqlite.url()),
        }
    }

    /// The audit trail underneath the app.
    pub(crate) fn audit_store(&self) -> AuditStore {
        match &self.rows {
            JobDriver::Postgres(pool) => AuditStore::new(shardkeep_testkit::pg(pool)),
            JobDriver::Embedded(db) => AuditStore::embedded(db.clone()),
        }
    }

    /// The accounts underneath the app.
    pub(crate) fn accounts(&self) -> shardkeep::audit::AccountStore {
        match &self.rows {
            JobDriver::Postgres(pool) => {
                shardkeep::audit::AccountStore::new(shardkeep_testkit::pg(pool))
            }
            JobDriver::Embedded(db) => shardkeep::audit::AccountStore::embedded(db.clone()),
        }
    }

    /// The one number `sql` (Postgres's dialect, as [`JobDriver::fetch_one`] reads it) counts.
    pub(crate) async fn count(&self, sql: &str) -> i64 {
        self.rows.fetch_one::<(i64,)>(sql, None).await.0
    }
}

/// The settings every test app starts from: the console has a password.
fn default_settings() -> ApiSettings {
    ApiSettings {
        console_password: Some(PASSWORD.into()),
        ..ApiSettings::default()
    }
}

pub(crate) async fn spawn_app(pool: PgPool) -> TestApp {
    spawn_app_with(pool, default_settings()).await
}

/// An app over fresh stores of `driver` (Postgres: the test's database `pool`).
pub(crate) async fn spawn_app_on(pool: PgPool, driver: Driver) -> TestApp {
    spawn_app_of(pool, driver, default_settings()).await
}

/// An app served on a free port. Dropping it stops the accept loop, so the state it holds (and
/// with it the test's pool) is released when the test ends: sqlx's test pools borrow connection
/// permits from one shared parent pool and return them only when the last clone of the pool is
/// gone, and a server left running until its runtime shuts down keeps them past the test's
/// database cleanup, which needs a permit of that parent itself. Enough tests ending together
/// that way starved every other test of the binary until its pool timed out.
pub(crate) struct Served {
    pub(crate) base: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `state` on a free port (a second `serve` process over the same stores) until the
/// returned handle is dropped.
pub(crate) async fn serve(state: AppState) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app =
        shardkeep_ops::router(state).into_make_service_with_connect_info::<std::net::SocketAddr>();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Served { base, task }
}

pub(crate) async fn spawn_app_with(pool: PgPool, settings: ApiSettings) -> TestApp {
    spawn_app_of(pool, Driver::Servers, settings).await
}

/// An app over fresh stores of `driver` with `settings`: the journal allows one attempt, no
/// worker runs (the test drives them).
pub(crate) async fn spawn_app_of(pool: PgPool, driver: Driver, settings: ApiSettings) -> TestApp {
    let journal_config = WorkQueueConfig {
        max_attempts: 1,
        ..WorkQueueConfig::default()
    };
    let clock: Arc<dyn shardkeep::clock::Clock> = Arc::new(SystemClock);
    let (retry, signals, journal, coord, stores, rows, keep) = match driver {
        Driver::Servers => {
            let redis = TestRedis::new().await;
            let pg = shardkeep_testkit::pg(&pool);
            let (retry, signals) = RetryQueue::new(pg.clone(), 64, clock);
            let journal = SessionJournal::new(redis.backend(), journal_config).unwrap();
            let stores = shardkeep::Stores::Servers {
                pg: pg.clone(),
                redis: redis.backend(),
            };
            let coord = redis.coordination();
            let rows = JobDriver::Postgres(pool.clone());
            (
                retry,
                signals,
                journal,
                coord,
                stores,
                rows,
                Keep::Servers {
                    pg,
                    redis: Box::new(redis),
                },
            )
        }
        Driver::Embedded => {
            let sqlite = TestSqlite::new().await;
            let db = sqlite.backend();
            let keys = shardkeep::Keyspace::new(&format!("t-{}", Uuid::now_v7().simple()))
                .expect("a test namespace");
            let (retry, signals) = RetryQueue::embedded(db.clone(), 64, Arc::clone(&clock));
            let journal =
                SessionJournal::embedded(db.clone(), &keys, journal_config, Arc::clone(&clock))
                    .unwrap();
            let coord = shardkeep::coord::Coordination::embedded(
                db.clone(),
                keys,
                shardkeep::coord::CoordinationConfig::default(),
                clock,
            );
            let rows = JobDriver::Embedded(db.clone());
            let stores = shardkeep::Stores::Embedded(db);
            (
                retry,
                signals,
                journal,
                coord,
                stores,
                rows,
                Keep::File(sqlite),
            )
        }
    };
    let audit = match &rows {
        JobDriver::Postgres(pool) => AuditStore::new(shardkeep_testkit::pg(pool)),
        JobDriver::Embedded(db) => AuditStore::embedded(db.clone()),
    };
    let state = AppState {
        retry,
        journal,
        coord,
        audit: AuditReader::new(audit, StaffReadLimit::default()),
        stores,
        keys: Arc::new(InternalKeys::parse(KEYS).unwrap()),
        settings: Arc::new(settings),
        metrics: Some(metrics_handle()),
        workers: None,
    };
    let server = serve(state.clone()).await;
    TestApp {
        client: SignedClient::new(&server.base, "ops", SECRET).unwrap(),
        http: reqwest::Client::new(),
        base: server.base.clone(),
        state,
        rows,
        keep,
        signals: Some(signals),
        _server: server,
    }
}

/// A request signed by hand, so tests can break any part of it.
pub(crate) struct Raw {
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) body: Vec<u8>,
    pub(crate) key_id: String,
    pub(crate) secret: Vec<u8>,
    pub(crate) timestamp: i64,
    pub(crate) nonce: String,
    pub(crate) signed_body: Option<Vec<u8>>,
}

impl Raw {
    pub(crate) fn new(method: Method, path: &str, body: &[u8]) -> Self {
        Self {
            method,
            path: path.into(),
            body: body.to_vec(),
            key_id: "ops".into(),
            secret: SECRET.to_vec(),
            timestamp: Utc::now().timestamp(),
            nonce: new_nonce(),
            signed_body: None,
        }
    }

    pub(crate) async fn send(&self, app: &TestApp) -> (u16, Value) {
        let signed = self.signed_body.as_deref().unwrap_or(&self.body);
        let signature = sign(
            &self.secret,
            &canonical(
                self.method.as_str(),
                &self.path,
                self.timestamp,
                &self.nonce,
                signed,
            ),
        );
        let response = app
            .http
            .request(self.method.clone(), format!("{}{}", app.base, self.path))
            .header(KEY_ID_HEADER, &self.key_id)
            .header(TIMESTAMP_HEADER, self.timestamp.to_string())
            .header(NONCE_HEADER, &self.nonce)
            .header(SIGNATURE_HEADER, signature)
            .body(self.body.clone())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

/// Dead-letters one retry job (a character that does not exist, with one attempt allowed).
/// Enqueues one retry job that no worker runs.
pub(crate) async fn retry_job_pending(app: &TestApp) {
    app.state.retry.enqueue(&location_job()).await.unwrap();
}

fn location_job() -> PersistenceRetryJob {
    PersistenceRetryJob::new(
        PersistenceRetryPayload::effect(
            Uuid::now_v7(),
            &shardkeep_testkit::model::LedgerEffect::CharacterLocation {
                zone: "zone-0".into(),
                room: "r0".into(),
                position: None,
            },
        )
        .unwrap(),
        IdempotencyEnvelope {
            idempotency_key: Uuid::now_v7().to_string(),
            owner_epoch: shardkeep::retry::OFFLINE_EPOCH,
            origin: Origin::SessionCleanup,
            issued_at: Utc::now(),
            issue_seq: 0,
        },
        "test",
        Some("session-9".into()),
    )
    .unwrap()
}

pub(crate) async fn retry_dead_letter(app: &mut TestApp) -> Uuid {
    let job = location_job();
    app.state.retry.enqueue(&job).await.unwrap();
    let mut config = RetryWorkerConfig::new("t");
    config.retry_limit = 1;
    let signals = app
        .signals
        .take()
        .unwrap_or_else(|| app.rows.queue(1, Arc::new(SystemClock)).1);
    let mut worker = app.rows.worker_for(
        shardkeep_testkit::model::LedgerModel::handle(),
        signals,
        config,
        Arc::new(SystemClock),
    );
    worker.run_until_idle().await.unwrap();
    let letters = app
        .state
        .retry
        .dead_letters_inspect(500)
        .await
        .unwrap()
        .dead_letters;
    letters
        .iter()
        .find(|l| l.retry_job_id == job.retry_job_id())
        .unwrap()
        .dead_letter_id
}

/// A stream-close cleanup of a character named Aria for session `token`.
pub(crate) fn cleanup_item(token: &str) -> shardkeep::journal::RealtimeStreamCleanup {
    use shardkeep::journal::{
        PlayerSnapshot, RealtimeRuntimeProfile, RealtimeStreamCleanup, SessionLifecycleEffectPlan,
    };
    RealtimeStreamCleanup {
        session_token: token.into(),
        player: PlayerSnapshot {
            character_id: Uuid::now_v7(),
            account_id: Uuid::now_v7(),
            character_name: "Aria".into(),
            shard_id: "shard-1".into(),
            zone: "zone-0".into(),
            room: "r0".into(),
            owner_epoch: 1,
            state_version: Some(1),
        },
        runtime_profile: RealtimeRuntimeProfile {
            transport: "quic".into(),
            protocol_version: 1,
            tick_rate_hz: 4,
        },
        pending_resume: None,
        transfer_confirmed: false,
        plan: SessionLifecycleEffectPlan::PermanentRemoval,
        closed_at: Utc::now(),
    }
}

/// Dead-letters one journal entry (one attempt allowed).
pub(crate) async fn journal_dead_letter(app: &TestApp, token: &str) -> Uuid {
    let item = cleanup_item(token);
    app.state.journal.append(item).await.unwrap();
    let mut consumer = app.state.journal.queue().consumer().await.unwrap();
    let leased = consumer.lease().await.unwrap().unwrap();
    match consumer.fail(&leased, "store down").await.unwrap() {
        shardkeep::queue::FailOutcome::DeadLettered { dead_letter_id } => dead_letter_id,
        other => panic!("expected a dead letter, got {other:?}"),
    }
}

/// Runs a saver and an auditor briefly so their metrics exist: a flush that conflicts, a full
/// saver queue, and an audit batch.
pub(crate) async fn saver_and_auditor_workload(app: &TestApp) {
    use shardkeep::audit::{AuditEvent, Auditor, AuditorConfig};
    use shardkeep::character::{CharacterSnapshot, NewCharacter};
    use shardkeep::saver::{SaveFeedback, SaveReason, Saver, SaverConfig, SaverEvent, SaverSinks};
    struct Quiet;
    impl SaveFeedback for Quiet {
        fn deliver(&self, _event: SaverEvent) {}
        fn is_present(&self, _id: Uuid) -> bool {
            true
        }
    }
    let store = app.rows.characters();
    let id = Uuid::now_v7();
    store
        .create(&NewCharacter {
            character_id: id,
            account_id: Uuid::now_v7(),
            name: format!("M{}", &id.simple().to_string()[..6]),
            zone_ref: None,
            room_ref: None,
            state: serde_json::json!({}).into(),
            chargen: None,
            schema_version: 1,
        })
        .await
        .unwrap();
    let row = store.load(id).await.unwrap().unwrap();
    store.save(&row).await.unwrap(); // the row moves to version 1; the saver's version-0 flush conflicts
    let cancel = tokio_util::sync::CancellationToken::new();
    let saver = Saver::spawn(
        SaverSinks {
            rows: Some(store),
            ..SaverSinks::default()
        },
        Arc::new(Quiet),
        SaverConfig {
            queue_depth: 1,
            ..SaverConfig::default()
        },
        cancel.clone(),
    );
    let snapshot = CharacterSnapshot { ..row };
    for _ in 0..4 {
        saver.enqueue(SaveReason::Flush, snapshot.clone());
    }
    saver.barrier(std::time::Duration::from_secs(5)).await;
    // The crash-window gauge, as a shard exports it for its residents.
    saver.landed().export("metrics-shard", &[id]);
    let auditor = Auditor::spawn(app.audit_store(), AuditorConfig::default(), cancel.clone());
    auditor.emit(AuditEvent::track(id, "metrics", 1));
    auditor.barrier(std::time::Duration::from_secs(5)).await;
    cancel.cancel();
}

/// Logs in to the console with `password`: the status and the session cookie, if one was set.
pub(crate) async fn console_login(app: &TestApp, password: &str) -> (u16, Option<String>) {
    let response = app
        .http
        .post(format!("{}/console/login", app.base))
        .json(&serde_json::json!({ "password": password }))
        .send()
        .await
        .unwrap();
    let cookie = response
        .headers()
        .get(reqwest::header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or_default().to_owned());
    (response.status().as_u16(), cookie)
}
