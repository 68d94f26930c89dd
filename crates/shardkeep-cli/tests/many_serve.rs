//! Three `serve` processes share one Postgres and one Redis (standalone or cluster, whichever the
//! suite runs on) while retry jobs and journal entries arrive at a steady rate; one is
//! SIGKILLed mid-run and started again. Every job and entry is applied exactly once in effect,
//! the killed process's leases and processing entries are recovered, and no live consumer's
//! work is taken from it.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use shardkeep::Ttl;
use shardkeep::character::{CharacterStore, NewCharacter};
use shardkeep::clock::SystemClock;
use shardkeep::coord::ResumeLedgerRecord;
use shardkeep::journal::{
    PlayerSnapshot, RealtimeRuntimeProfile, RealtimeStreamCleanup, SessionJournal,
    SessionLifecycleEffectPlan,
};
use shardkeep::queue::WorkQueueConfig;
use shardkeep::retry::{
    IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload, RetryQueue,
};
use shardkeep_reference::game::ReferenceEffect;
use sqlx::PgPool;
use uuid::Uuid;

const KEYS: &str = "ops:0123456789abcdef0123";
/// Reward jobs, one per character (so no job's effect depends on another's order).
const REWARDS: usize = 300;
/// Journal entries, one per character.
const CLEANUPS: usize = 200;

/// The test database's URL for `serve` in this pass (through PgBouncer in the PgBouncer pass).
fn database_url_of(pool: &PgPool) -> String {
    shardkeep_testkit::pgbouncer::pass_database_url(&shardkeep_testkit::pgbouncer::database_of(
        pool,
    ))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One `serve` process.
struct Serve {
    child: Child,
    port: u16,
}

impl Serve {
    async fn start(database_url: &str, namespace: &str, name: &str) -> Self {
        let port = free_port();
        #[allow(clippy::zombie_processes)] // killed and waited for on drop
        let child = Command::new(env!("CARGO_BIN_EXE_shardkeep"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--namespace", namespace])
            .env("DATABASE_URL", database_url)
            .env(
                "SHARDKEEP_PG_POOLER",
                shardkeep_testkit::pgbouncer::pass_pooler().as_str(),
            )
            .env("REDIS_URL", shardkeep_testkit::redis_url())
            .env("SHARDKEEP_INTERNAL_KEYS", KEYS)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        for _ in 0..150 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Self { child, port };
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("serve {name} never listened");
    }

    /// SIGKILL: no shutdown, leases and processing entries left behind.
    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// One counter of its /metrics (summed over label sets).
    async fn counter(&self, name: &str) -> f64 {
        let text = reqwest::get(format!("http://127.0.0.1:{}/metrics", self.port))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .filter(|l| l.starts_with(name) && !l.starts_with('#'))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn create(store: &CharacterStore, n: usize) -> Vec<Uuid> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let id = Uuid::now_v7();
        store
            .create(&NewCharacter {
                character_id: id,
                account_id: Uuid::now_v7(),
                name: format!("M{i}x{}", &id.simple().to_string()[24..]),
                zone_ref: Some("zone-0".into()),
                room_ref: Some("r0".into()),
                state: json!({ "experience": 0, "currency": 0 }).into(),
                chargen: None,
                schema_version: 1,
            })
            .await
            .unwrap();
        ids.push(id);
    }
    ids
}

fn reward(character: Uuid, n: usize) -> PersistenceRetryJob {
    let payload = PersistenceRetryPayload::effect(
        character,
        &ReferenceEffect::CombatRewards {
            experience: 7,
            currency: 3,
            items: Vec::new(),
        },
    )
    .unwrap();
    let envelope = IdempotencyEnvelope {
        idempotency_key: format!("many-serve:{n}"),
        owner_epoch: 0,
        origin: Origin::CombatRewards,
        issued_at: Utc::now(),
        issue_seq: 1,
    };
    PersistenceRetryJob::new(payload, envelope, "shard-m", Some(format!("s-r{n}"))).unwrap()
}

fn cleanup(character: Uuid, n: usize) -> RealtimeStreamCleanup {
    let token = format!("s-c{n}");
    RealtimeStreamCleanup {
        session_token: token.clone(),
        player: PlayerSnapshot {
            character_id: character,
            account_id: Uuid::now_v7(),
            character_name: format!("C{n}"),
            shard_id: "shard-m".into(),
            zone: format!("zone-{n}"),
            room: "r1".into(),
            owner_epoch: 0,
            state_version: None,
        },
        runtime_profile: RealtimeRuntimeProfile {
            transport: "quic".into(),
            protocol_version: 3,
            tick_rate_hz: 4,
        },
        pending_resume: Some(ResumeLedgerRecord {
            session_token: token,
            character_id: character.to_string(),
            last_applied_seq: 1,
            zone_id: format!("zone-{n}"),
            recorded_at: Utc::now(),
        }),
        transfer_confirmed: false,
        plan: SessionLifecycleEffectPlan::PermanentRemoval,
        closed_at: Utc::now(),
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn three_serves_share_the_work_and_one_killed_mid_run_loses_nothing(pool: PgPool) {
    let database_url = database_url_of(&pool);
    let redis = shardkeep_testkit::TestRedis::new().await;
    let namespace = redis.keys().namespace().to_owned();
    let pg = shardkeep_testkit::pg(&pool);
    let store = CharacterStore::new(pg.clone());
    let rewarded = create(&store, REWARDS).await;
    let cleaned = create(&store, CLEANUPS).await;
    // Producers only: the signals go nowhere, the serves' polls find the rows.
    let (retry, _signals) = RetryQueue::new(pg.clone(), 1, std::sync::Arc::new(SystemClock));
    let journal = SessionJournal::new(redis.backend(), WorkQueueConfig::default()).unwrap();
    let coord = redis.coordination();

    let mut serves = [
        Serve::start(&database_url, &namespace, "serve-a").await,
        Serve::start(&database_url, &namespace, "serve-b").await,
        Serve::start(&database_url, &namespace, "serve-c").await,
    ];

    // A steady stream over about 10 s; serve-b dies a third of the way in and comes back.
    let steps = 50;
    let mut killed_at = None;
    for step in 0..steps {
        let rewards = (step * REWARDS / steps)..((step + 1) * REWARDS / steps);
        for (n, character) in rewarded
            .iter()
            .enumerate()
            .take(rewards.end)
            .skip(rewards.start)
        {
            retry.enqueue(&reward(*character, n)).await.unwrap();
        }
        let cleanups = (step * CLEANUPS / steps)..((step + 1) * CLEANUPS / steps);
        for (n, character) in cleaned
            .iter()
            .enumerate()
            .take(cleanups.end)
            .skip(cleanups.start)
        {
            let entry = cleanup(*character, n);
            coord
                .resume_store(
                    entry.pending_resume.as_ref().unwrap(),
                    Ttl::from_secs(600).unwrap(),
                )
                .await
                .unwrap();
            journal.append(entry).await.unwrap();
        }
        if step == steps / 3 {
            serves[1].kill();
            killed_at = Some(tokio::time::Instant::now());
        }
        if step == steps / 2 {
            serves[1] = Serve::start(&database_url, &namespace, "serve-b").await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(killed_at.is_some());

    // Everything drains: the killed process's leased jobs once their lease runs out (30 s), its
    // journal entries once its heartbeat lapses (15 s) and a recovery pass finds it.
    let started = tokio::time::Instant::now();
    loop {
        let (rows, dead_rows) = retry.depths().await.unwrap();
        let depths = journal.queue().depths().await.unwrap();
        if rows == 0 && depths.pending == 0 && depths.processing == 0 {
            assert_eq!((dead_rows, depths.dead), (0, 0), "nothing dead-lettered");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "drained within 90 s: {rows} retry rows, {depths:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Every reward applied exactly once.
    let amounts: Vec<(Uuid, serde_json::Value)> =
        sqlx::query_as("SELECT id, state FROM characters WHERE id = ANY($1)")
            .bind(&rewarded)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(amounts.len(), REWARDS);
    for (id, state) in &amounts {
        assert_eq!(
            (state["experience"].as_i64(), state["currency"].as_i64()),
            (Some(7), Some(3)),
            "character {id}: one reward, applied once"
        );
    }
    // Every cleanup applied: its ledger gone, its location written.
    for (n, id) in cleaned.iter().enumerate() {
        assert!(
            coord
                .resume_load(&format!("s-c{n}"))
                .await
                .unwrap()
                .is_none(),
            "cleanup {n} deleted its ledger"
        );
        let row = store.load(*id).await.unwrap().unwrap();
        assert_eq!(row.zone_ref.as_deref(), Some(format!("zone-{n}").as_str()));
    }
    // No live consumer lost its identity: nothing was taken from a process still running.
    for serve in [&serves[0], &serves[2]] {
        assert_eq!(
            serve
                .counter("shardkeep_queue_consumer_restarts_total")
                .await,
            0.0,
            "a live consumer's work was taken"
        );
    }
}
