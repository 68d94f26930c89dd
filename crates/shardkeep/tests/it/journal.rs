use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use shardkeep::backend::redis::RedisTimeouts;
use shardkeep::character::{CharacterStore, NewCharacter};
use shardkeep::coord::ResumeLedgerRecord;
use shardkeep::journal::{
    ActiveSession, ActiveSessions, JournalWorker, JournalWorkerConfig, PlayerSnapshot, Processed,
    RealtimeRuntimeProfile, RealtimeStreamCleanup, SessionJournal, SessionLifecycleEffectPlan,
    cleanup_stream,
};
use shardkeep::queue::WorkQueueConfig;
use shardkeep::{Coordination, CoordinationConfig, PostgresBackend, Ttl};
use std::sync::Arc;

use shardkeep::clock::{Clock, SystemClock};
use shardkeep_testkit::faults::{FaultProxy, ProxyControl, ProxyMode};
use shardkeep_testkit::{TestRedis, TestSqlite};
use sqlx::PgPool;
use uuid::Uuid;

pub(crate) struct Env {
    pub(crate) redis: TestRedis,
    pub(crate) store: CharacterStore,
    pub(crate) coord: Coordination,
    pub(crate) journal: SessionJournal,
    /// The embedded store's file, when the journal, records and rows are kept there.
    pub(crate) file: Option<TestSqlite>,
}

impl Env {
    /// The journal on Redis, the rows in Postgres.
    pub(crate) async fn new(pool: &PgPool) -> Self {
        let redis = TestRedis::new().await;
        let journal = SessionJournal::new(redis.backend(), WorkQueueConfig::default()).unwrap();
        Self {
            store: CharacterStore::new(shardkeep_testkit::pg(pool)),
            coord: redis.coordination(),
            journal,
            redis,
            file: None,
        }
    }

    /// Everything in one fresh embedded store's file (named by a Redis namespace's keys).
    pub(crate) async fn embedded() -> Self {
        let redis = TestRedis::new().await;
        let file = TestSqlite::new().await;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let db = file.backend();
        Self {
            store: CharacterStore::embedded(db.clone()),
            coord: Coordination::embedded(
                db.clone(),
                redis.keys().clone(),
                CoordinationConfig::default(),
                Arc::clone(&clock),
            ),
            journal: SessionJournal::embedded(db, redis.keys(), WorkQueueConfig::default(), clock)
                .unwrap(),
            redis,
            file: Some(file),
        }
    }

    /// One environment per driver.
    pub(crate) async fn drivers(pool: &PgPool) -> Vec<Self> {
        vec![Self::new(pool).await, Self::embedded().await]
    }

    /// The embedded store's file URL (`None` on Postgres + Redis), to open it again.
    pub(crate) fn file_url(&self) -> Option<&str> {
        self.file.as_ref().map(TestSqlite::url)
    }

    /// The driver's name, for assertion messages.
    pub(crate) fn name(&self) -> &'static str {
        if self.file.is_some() {
            "sqlite"
        } else {
            "redis"
        }
    }

    pub(crate) fn worker(&self) -> JournalWorker {
        JournalWorker::new(
            self.journal.clone(),
            self.coord.clone(),
            self.store.clone(),
            config(),
        )
    }

    pub(crate) async fn character(&self) -> PlayerSnapshot {
        let id = Uuid::now_v7();
        let account = Uuid::now_v7();
        self.store
            .create(&NewCharacter {
                character_id: id,
                account_id: account,
                name: format!("P{}", &id.simple().to_string()[20..]),
                zone_ref: Some("zone-0".into()),
                room_ref: Some("r0".into()),
                state: json!({}).into(),
                chargen: None,
                schema_version: 1,
            })
            .await
            .unwrap();
        let epoch = self.store.claim(id, 0).await.unwrap().new_epoch;
        PlayerSnapshot {
            character_id: id,
            account_id: account,
            character_name: format!("P{}", &id.simple().to_string()[20..]),
            shard_id: "shard-1".into(),
            zone: "zone-2".into(),
            room: "r3".into(),
            owner_epoch: epoch,
            state_version: Some(0),
        }
    }
}

fn config() -> JournalWorkerConfig {
    JournalWorkerConfig {
        interval: Duration::from_millis(150),
        ..JournalWorkerConfig::default()
    }
}

pub(crate) fn cleanup(
    player: &PlayerSnapshot,
    token: &str,
    plan: SessionLifecycleEffectPlan,
) -> RealtimeStreamCleanup {
    RealtimeStreamCleanup {
        session_token: token.into(),
        player: player.clone(),
        runtime_profile: RealtimeRuntimeProfile {
            transport: "quic".into(),
            protocol_version: 3,
            tick_rate_hz: 4,
        },
        pending_resume: Some(ResumeLedgerRecord {
            session_token: token.into(),
            character_id: player.character_id.to_string(),
            last_applied_seq: 77,
            zone_id: player.zone.clone(),
            recorded_at: Utc::now(),
        }),
        transfer_confirmed: false,
        plan,
        closed_at: Utc::now(),
    }
}

pub(crate) async fn location(store: &CharacterStore, id: Uuid) -> (Option<String>, Option<String>) {
    let row = store.load(id).await.unwrap().unwrap();
    (row.zone_ref, row.room_ref)
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_reconnectable_cleanup_persists_ledger_location_and_presence(pool: PgPool) {
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        a_reconnectable_cleanup_persists_ledger_location_and_presence_on(&env).await;
    }
}

async fn a_reconnectable_cleanup_persists_ledger_location_and_presence_on(env: &Env) {
    let player = env.character().await;
    let item = cleanup(&player, "s-1", SessionLifecycleEffectPlan::Reconnectable);
    let worker = env.worker();
    assert_eq!(
        worker.process(&item, Uuid::now_v7()).await.unwrap(),
        Processed::Applied
    );
    assert_eq!(
        env.coord
            .resume_load("s-1")
            .await
            .unwrap()
            .unwrap()
            .last_applied_seq,
        77
    );
    assert_eq!(
        location(&env.store, player.character_id).await,
        (Some("zone-2".into()), Some("r3".into()))
    );
    let presence = env
        .coord
        .presence_by_character(&player.character_id.to_string())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (presence.session_token.as_str(), presence.zone_id.as_deref()),
        ("s-1", Some("zone-2"))
    );
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_permanent_removal_deletes_the_ledger_and_persists_location_only(pool: PgPool) {
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        a_permanent_removal_deletes_the_ledger_and_persists_location_only_on(&env).await;
    }
}

async fn a_permanent_removal_deletes_the_ledger_and_persists_location_only_on(env: &Env) {
    let player = env.character().await;
    let item = cleanup(&player, "s-2", SessionLifecycleEffectPlan::PermanentRemoval);
    env.coord
        .resume_store(
            item.pending_resume.as_ref().unwrap(),
            Ttl::from_secs(60).unwrap(),
        )
        .await
        .unwrap();
    env.worker().process(&item, Uuid::now_v7()).await.unwrap();
    assert!(env.coord.resume_load("s-2").await.unwrap().is_none());
    assert_eq!(
        location(&env.store, player.character_id).await.0.as_deref(),
        Some("zone-2")
    );
    assert!(
        env.coord
            .presence_by_character(&player.character_id.to_string())
            .await
            .unwrap()
            .is_none()
    );
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_confirmed_transfer_deletes_the_ledger_and_touches_nothing_else(pool: PgPool) {
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        a_confirmed_transfer_deletes_the_ledger_and_touches_nothing_else_on(&env).await;
    }
}

async fn a_confirmed_transfer_deletes_the_ledger_and_touches_nothing_else_on(env: &Env) {
    let player = env.character().await;
    let mut item = cleanup(&player, "s-3", SessionLifecycleEffectPlan::Reconnectable);
    item.transfer_confirmed = true;
    env.coord
        .resume_store(
            item.pending_resume.as_ref().unwrap(),
            Ttl::from_secs(60).unwrap(),
        )
        .await
        .unwrap();
    // Even an active token does not stop a transfer's ledger deletion.
    env.coord
        .session_activate("s-3", Ttl::from_secs(60).unwrap())
        .await
        .unwrap();
    env.worker().process(&item, Uuid::now_v7()).await.unwrap();
    assert!(env.coord.resume_load("s-3").await.unwrap().is_none());
    assert_eq!(
        location(&env.store, player.character_id).await.0.as_deref(),
        Some("zone-0"),
        "location untouched"
    );
    assert!(
        env.coord
            .presence_by_character(&player.character_id.to_string())
            .await
            .unwrap()
            .is_none()
    );
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn stale_cleanup_of_a_reconnected_session_is_skipped(pool: PgPool) {
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        stale_cleanup_of_a_reconnected_session_is_skipped_on(&env).await;
    }
}

async fn stale_cleanup_of_a_reconnected_session_is_skipped_on(env: &Env) {
    let player = env.character().await;
    let item = cleanup(&player, "s-4", SessionLifecycleEffectPlan::Reconnectable);
    env.coord
        .session_activate("s-4", Ttl::from_secs(60).unwrap())
        .await
        .unwrap();
    assert_eq!(
        env.worker().process(&item, Uuid::now_v7()).await.unwrap(),
        Processed::SkippedReconnected
    );
    assert!(env.coord.resume_load("s-4").await.unwrap().is_none());
    assert_eq!(
        location(&env.store, player.character_id).await.0.as_deref(),
        Some("zone-0")
    );
    assert!(
        env.coord
            .presence_by_character(&player.character_id.to_string())
            .await
            .unwrap()
            .is_none()
    );
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn cleanup_appends_before_removing_the_session(pool: PgPool) {
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        cleanup_appends_before_removing_the_session_on(&env).await;
    }
}

async fn cleanup_appends_before_removing_the_session_on(env: &Env) {
    let player = env.character().await;
    let sessions = ActiveSessions::default();
    sessions.insert(
        "s-5",
        ActiveSession {
            character_id: player.character_id,
        },
    );
    env.coord
        .session_activate("s-5", Ttl::from_secs(60).unwrap())
        .await
        .unwrap();
    let outcome = cleanup_stream(
        &env.journal,
        &sessions,
        &env.coord,
        cleanup(&player, "s-5", SessionLifecycleEffectPlan::PermanentRemoval),
    )
    .await;
    assert!(
        outcome.enqueue_error.is_none() && outcome.session_removed && outcome.entry_id.is_some()
    );
    assert!(!sessions.contains("s-5"));
    assert!(!env.coord.session_is_active("s-5").await.unwrap());
    assert_eq!(env.journal.queue().depths().await.unwrap().pending, 1);
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_append_failure_leaves_the_session_active_with_the_error(pool: PgPool) {
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        an_append_failure_leaves_the_session_active_with_the_error_on(&env).await;
    }
}

async fn an_append_failure_leaves_the_session_active_with_the_error_on(env: &Env) {
    let player = env.character().await;
    // The shard's own path to the journal, cut: a proxy before Redis, or a second connection
    // to the file with its outage hook on.
    let (journal, coord, _proxy) = match env.file_url() {
        None => {
            let timeouts = RedisTimeouts {
                connect: Duration::from_millis(300),
                response: Duration::from_millis(300),
            };
            let (proxy, cut) = shardkeep_testkit::faults::proxied_redis(
                &shardkeep_testkit::redis_url(),
                env.redis.keys().clone(),
                timeouts,
            )
            .await
            .unwrap();
            proxy.set_mode(ProxyMode::Cut);
            let journal = SessionJournal::new(cut.clone(), WorkQueueConfig::default()).unwrap();
            let coord = Coordination::new(cut, CoordinationConfig::default());
            (journal, coord, Some(proxy))
        }
        Some(url) => {
            let db = shardkeep::SqliteBackend::connect("DATABASE_URL", url)
                .await
                .unwrap();
            db.fail_for(Duration::from_secs(3_600));
            let clock: Arc<dyn Clock> = Arc::new(SystemClock);
            let keys = env.redis.keys().clone();
            let journal = SessionJournal::embedded(
                db.clone(),
                &keys,
                WorkQueueConfig::default(),
                Arc::clone(&clock),
            )
            .unwrap();
            let coord = Coordination::embedded(db, keys, CoordinationConfig::default(), clock);
            (journal, coord, None)
        }
    };
    let sessions = ActiveSessions::default();
    sessions.insert(
        "s-6",
        ActiveSession {
            character_id: player.character_id,
        },
    );
    let outcome = cleanup_stream(
        &journal,
        &sessions,
        &coord,
        cleanup(&player, "s-6", SessionLifecycleEffectPlan::Reconnectable),
    )
    .await;
    assert!(outcome.enqueue_error.is_some(), "{}", env.name());
    assert!(!outcome.session_removed && outcome.entry_id.is_none());
    assert!(sessions.contains("s-6"), "the session stays active");
    assert_eq!(env.journal.queue().depths().await.unwrap().pending, 0);
    // The stream's marker is cleared before its entry can be seen: with the journal cut and
    // the coordination records reachable, the append fails and the marker is gone all the same
    // (cleared after the append, a worker taking the entry at once read the closer's own
    // marker as a reconnect and skipped the cleanup).
    env.coord
        .session_activate("s-7", shardkeep::ttl::Ttl::from_static_secs(60))
        .await
        .unwrap();
    let outcome = cleanup_stream(
        &journal,
        &sessions,
        &env.coord,
        cleanup(&player, "s-7", SessionLifecycleEffectPlan::Reconnectable),
    )
    .await;
    assert!(outcome.enqueue_error.is_some(), "{}", env.name());
    assert!(
        !env.coord.session_is_active("s-7").await.unwrap(),
        "{}: the marker goes before the append",
        env.name()
    );
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_lost_wake_signal_is_covered_by_the_interval(pool: PgPool) {
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        a_lost_wake_signal_is_covered_by_the_interval_on(&env).await;
    }
}

async fn a_lost_wake_signal_is_covered_by_the_interval_on(env: &Env) {
    let player = env.character().await;
    let worker = env.worker();
    let stats = worker.stats();
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(worker.run(cancel.clone()));
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Appended straight to the queue: no wake signal is sent at all.
    env.journal
        .queue()
        .append(cleanup(
            &player,
            "s-7",
            SessionLifecycleEffectPlan::PermanentRemoval,
        ))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while stats.processed.load(Ordering::Relaxed) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the interval never drained the entry"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        location(&env.store, player.character_id).await.0.as_deref(),
        Some("zone-2")
    );
    cancel.cancel();
    task.await.unwrap();
    let depths = env.journal.queue().depths().await.unwrap();
    assert_eq!((depths.pending, depths.processing), (0, 0));
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_failing_effect_dead_letters_after_eight_attempts_with_its_summary(pool: PgPool) {
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        a_failing_effect_dead_letters_after_eight_attempts_with_its_summary_on(&env).await;
    }
}

async fn a_failing_effect_dead_letters_after_eight_attempts_with_its_summary_on(env: &Env) {
    let mut player = env.character().await;
    player.character_id = Uuid::now_v7(); // a character the store does not have
    let worker = env.worker();
    let entry = env
        .journal
        .append(cleanup(
            &player,
            "s-8",
            SessionLifecycleEffectPlan::PermanentRemoval,
        ))
        .await
        .unwrap();
    let mut consumer = env.journal.queue().consumer().await.unwrap();
    for _ in 0..8 {
        assert_eq!(worker.drain(&mut consumer).await.unwrap(), 1);
    }
    let (depths, summaries) = env.journal.inspect(50).await.unwrap();
    assert_eq!((depths.pending, depths.processing, depths.dead), (0, 0, 1));
    let s = &summaries[0];
    assert_eq!(s.entry_id, Some(entry));
    assert_eq!(s.attempts, 8);
    assert!(s.error.contains("not found"), "{}", s.error);
    assert_eq!(s.session_token.as_deref(), Some("s-8"));
    assert_eq!(s.character_id, Some(player.character_id));
    assert_eq!(
        s.character_name.as_deref(),
        Some(player.character_name.as_str())
    );
    assert_eq!(s.plan, Some(SessionLifecycleEffectPlan::PermanentRemoval));
    let (a, b) = tokio::join!(
        env.journal.requeue(s.dead_letter_id),
        env.journal.requeue(s.dead_letter_id)
    );
    assert_eq!(
        [a.unwrap(), b.unwrap()]
            .iter()
            .filter(|r| r.is_some())
            .count(),
        1
    );
    assert_eq!(env.journal.queue().depths().await.unwrap().pending, 1);
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_poison_journal_entry_is_dead_lettered_with_its_error(pool: PgPool) {
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        a_poison_journal_entry_is_dead_lettered_with_its_error_on(&env).await;
    }
}

async fn a_poison_journal_entry_is_dead_lettered_with_its_error_on(env: &Env) {
    use redis::AsyncCommands;
    // An entry whose item does not decode, put straight into the queue's storage.
    let poison = r#"{"entry_id":"x","item":{}}"#;
    match &env.file {
        None => {
            let pending = env.redis.keys().queue("session-lifecycle").unwrap().pending;
            let _: i64 = env.redis.raw().await.lpush(&pending, poison).await.unwrap();
        }
        Some(file) => {
            sqlx::query("INSERT INTO queue_entries (queue, body) VALUES (?1, ?2)")
                .bind(shardkeep::queue::embedded_queue_name(
                    env.redis.keys(),
                    shardkeep::journal::JOURNAL_QUEUE,
                ))
                .bind(poison.as_bytes())
                .execute(file.backend().pool())
                .await
                .unwrap();
        }
    }
    let mut consumer = env.journal.queue().consumer().await.unwrap();
    assert_eq!(env.worker().drain(&mut consumer).await.unwrap(), 0);
    let (depths, summaries) = env.journal.inspect(10).await.unwrap();
    assert_eq!(depths.dead, 1, "{}", env.name());
    assert!(
        summaries[0].error.contains("does not decode"),
        "{}",
        env.name()
    );
    assert_eq!(summaries[0].session_token, None);
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_failed_location_write_fails_the_entry_to_retry_in_order(pool: PgPool) {
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        a_failed_location_write_fails_the_entry_to_retry_in_order_on(&env, &pool).await;
    }
}

async fn a_failed_location_write_fails_the_entry_to_retry_in_order_on(env: &Env, pool: &PgPool) {
    let player = env.character().await;
    // The worker's path to the rows, cut: a proxy before Postgres, or a second connection to
    // the file with its outage hook on.
    let (rows, proxy, file) = match env.file_url() {
        None => {
            let proxy = FaultProxy::start(shardkeep_testkit::pg_addr())
                .await
                .unwrap();
            let (cut_options, pooler) = shardkeep_testkit::proxied_options(pool, &proxy);
            let cut_pool = sqlx::postgres::PgPoolOptions::new()
                .acquire_timeout(Duration::from_millis(500))
                .connect_with(cut_options)
                .await
                .unwrap();
            proxy.set_mode(ProxyMode::Cut);
            let rows = CharacterStore::new(PostgresBackend::from_pool_through(cut_pool, pooler));
            (rows, Some(proxy), None)
        }
        Some(url) => {
            let db = shardkeep::SqliteBackend::connect("DATABASE_URL", url)
                .await
                .unwrap();
            db.fail_for(Duration::from_secs(3_600));
            (CharacterStore::embedded(db.clone()), None, Some(db))
        }
    };
    let worker = JournalWorker::new(env.journal.clone(), env.coord.clone(), rows, config());
    let item = cleanup(&player, "s-9", SessionLifecycleEffectPlan::PermanentRemoval);
    let entry = Uuid::now_v7();
    let failed = worker.process(&item, entry).await;
    assert!(
        matches!(&failed, Err(e) if e.message.starts_with("location write") && e.unavailable),
        "{}: {failed:?}",
        env.name()
    );
    let jobs: i64 = match &env.file {
        None => sqlx::query_scalar("SELECT count(*) FROM persistence_retry_jobs")
            .fetch_one(pool)
            .await
            .unwrap(),
        Some(file) => sqlx::query_scalar("SELECT count(*) FROM persistence_retry_jobs")
            .fetch_one(file.backend().pool())
            .await
            .unwrap(),
    };
    assert_eq!(
        jobs,
        0,
        "{}: no retry job jumps the journal's order",
        env.name()
    );
    // The entry's retry (the same entry, at the front of the queue) lands once the store is back.
    if let Some(proxy) = &proxy {
        proxy.set_mode(ProxyMode::Pass);
    }
    if let Some(db) = &file {
        db.end_outage();
    }
    assert_eq!(
        worker.process(&item, entry).await.unwrap(),
        Processed::Applied
    );
    assert_eq!(
        location(&env.store, player.character_id).await,
        (Some("zone-2".into()), Some("r3".into()))
    );
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_entry_leased_by_a_call_whose_reply_was_lost_is_processed_next_pass(pool: PgPool) {
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        an_entry_leased_by_a_call_whose_reply_was_lost_is_processed_next_pass_on(&env).await;
    }
}

async fn an_entry_leased_by_a_call_whose_reply_was_lost_is_processed_next_pass_on(env: &Env) {
    let player = env.character().await;
    env.journal
        .append(cleanup(
            &player,
            "s-lost",
            SessionLifecycleEffectPlan::PermanentRemoval,
        ))
        .await
        .unwrap();
    let mut consumer = env.journal.queue().consumer().await.unwrap();
    // The lease moved the entry, but its reply never reached the worker.
    let lost = consumer.lease().await.unwrap();
    assert!(lost.is_some());
    drop(lost);
    let depths = env.journal.queue().depths().await.unwrap();
    assert_eq!((depths.pending, depths.processing), (0, 1));
    let pass = env.worker().drain_pass(&mut consumer).await.unwrap();
    assert_eq!((pass.handled, pass.failed), (1, 0));
    let depths = env.journal.queue().depths().await.unwrap();
    assert_eq!((depths.pending, depths.processing, depths.dead), (0, 0, 0));
}

/// A Redis failover or restart can lose a consumer's registration and let another incarnation
/// take its place: the running worker must not sit there processing nothing. It starts over as
/// a new incarnation and the next entry is applied within a few intervals.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_worker_whose_consumer_identity_is_lost_starts_over_and_keeps_processing(pool: PgPool) {
    for env in Env::drivers(&pool).await {
        eprintln!("driver: {}", env.name());
        identity_lost_on(&env).await;
    }
}

/// The consumers registered on `env`'s journal queue.
async fn registered_consumers(env: &Env) -> Vec<String> {
    use redis::AsyncCommands;
    let keys = env
        .redis
        .keys()
        .queue(shardkeep::journal::JOURNAL_QUEUE)
        .unwrap();
    match &env.file {
        None => env
            .redis
            .raw()
            .await
            .smembers(&keys.consumers)
            .await
            .unwrap(),
        Some(file) => sqlx::query_scalar("SELECT id FROM queue_consumers WHERE queue = ?1")
            .bind(shardkeep::queue::embedded_queue_name(
                env.redis.keys(),
                shardkeep::journal::JOURNAL_QUEUE,
            ))
            .fetch_all(file.backend().pool())
            .await
            .unwrap(),
    }
}

/// What a lost write plus a takeover leaves: consumer `id`'s heartbeat held by another
/// incarnation for a minute.
async fn take_over_consumer(env: &Env, id: &str) {
    use redis::AsyncCommands;
    match &env.file {
        None => {
            let keys = env
                .redis
                .keys()
                .queue(shardkeep::journal::JOURNAL_QUEUE)
                .unwrap();
            let () = env
                .redis
                .raw()
                .await
                .pset_ex(
                    keys.consumer_heartbeat(id).unwrap(),
                    "another-incarnation",
                    60_000,
                )
                .await
                .unwrap();
        }
        Some(file) => {
            let minute_on = (Utc::now() + chrono::Duration::minutes(1)).timestamp_micros();
            let taken = sqlx::query(
                "UPDATE queue_consumers SET token = 'another-incarnation', beat_until = ?3
                  WHERE queue = ?1 AND id = ?2",
            )
            .bind(shardkeep::queue::embedded_queue_name(
                env.redis.keys(),
                shardkeep::journal::JOURNAL_QUEUE,
            ))
            .bind(id)
            .bind(minute_on)
            .execute(file.backend().pool())
            .await
            .unwrap();
            assert_eq!(taken.rows_affected(), 1);
        }
    }
}

async fn identity_lost_on(env: &Env) {
    let worker = env.worker();
    let stats = worker.stats();
    let liveness = worker.liveness();
    let cancel = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let mut first: Vec<String> = Vec::new();
    for _ in 0..50 {
        first = registered_consumers(env).await;
        if !first.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(first.len(), 1, "{}: the worker registered", env.name());
    take_over_consumer(env, &first[0]).await;
    let player = env.character().await;
    env.journal
        .append(cleanup(
            &player,
            "s-lost",
            SessionLifecycleEffectPlan::PermanentRemoval,
        ))
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    while stats.processed.load(Ordering::Relaxed) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{}: processing resumes within 5 s",
            env.name()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        liveness.idle_for() < Duration::from_secs(1),
        "passes finish again"
    );
    let now = registered_consumers(env).await;
    assert!(
        now.iter().any(|id| *id != first[0]),
        "{}: a new incarnation registered: {now:?}",
        env.name()
    );
    cancel.cancel();
    running.await.unwrap();
}
