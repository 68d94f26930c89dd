//! What the invalid requests aim at, planted before the load, and the fingerprint that shows
//! they changed nothing: retained retry and journal dead letters (the targets of forged
//! requeues), keys under every cleanup target's patterns (the targets of forged deletes), and
//! the operator-facts table.

use std::sync::Arc;

use anyhow::Context;
use chrono::Utc;
use shardkeep::clock::SystemClock;
use shardkeep::journal::{
    PlayerSnapshot, RealtimeRuntimeProfile, RealtimeStreamCleanup, SessionJournal,
    SessionLifecycleEffectPlan,
};
use shardkeep::queue::{FailOutcome, WorkQueueConfig};
use shardkeep::retry::{PersistenceRetryJob, RetryQueue, RetryWorker, RetryWorkerConfig};
use shardkeep_reference::game::ReferenceModel;
use shardkeep_sim::bench::BenchEnv;
use uuid::Uuid;

/// Dead letters of each kind planted.
const DEAD_LETTERS: usize = 8;
/// How long a planted key lives: past any load.
const KEY_TTL_SECS: u64 = 6 * 3600;

/// The planted targets.
pub(super) struct Sentinels {
    pub(super) retry: Vec<Uuid>,
    pub(super) journal: Vec<Uuid>,
    pub(super) keys: Vec<String>,
}

/// Everything of the targets a refused request could have changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Fingerprint {
    retry_rows: String,
    journal: Vec<String>,
    keys: Vec<Option<Vec<u8>>>,
    role_changes: String,
}

fn poison_job(n: usize) -> anyhow::Result<PersistenceRetryJob> {
    // A reward for a character that does not exist: it fails, and with one attempt allowed it
    // becomes a dead letter.
    super::workload::reward_job(
        Uuid::now_v7(),
        1,
        format!("hostile-sentinel:{n}"),
        format!("sentinel-{n}"),
    )
}

/// A stream-close cleanup for session `token` of character `character`.
pub(super) fn cleanup(character: Uuid, token: String) -> RealtimeStreamCleanup {
    RealtimeStreamCleanup {
        session_token: token,
        player: PlayerSnapshot {
            character_id: character,
            account_id: Uuid::now_v7(),
            character_name: "Hostile".into(),
            shard_id: "shard-h".into(),
            zone: "zone-0".into(),
            room: "r0".into(),
            owner_epoch: 0,
            state_version: None,
        },
        runtime_profile: RealtimeRuntimeProfile {
            transport: "quic".into(),
            protocol_version: 3,
            tick_rate_hz: 4,
        },
        pending_resume: None,
        transfer_confirmed: false,
        plan: SessionLifecycleEffectPlan::PermanentRemoval,
        closed_at: Utc::now(),
    }
}

/// Plants the targets (before `serve` starts, so no worker of its takes them).
pub(super) async fn plant(env: &BenchEnv) -> anyhow::Result<Sentinels> {
    let (queue, signals) = RetryQueue::new(env.pg.clone(), 64, Arc::new(SystemClock));
    for n in 0..DEAD_LETTERS {
        queue.enqueue(&poison_job(n)?).await?;
    }
    let mut config = RetryWorkerConfig::new("hostile-sentinels");
    config.retry_limit = 1;
    let mut worker = RetryWorker::new(
        env.pg.clone(),
        ReferenceModel::handle(),
        signals,
        config,
        Arc::new(SystemClock),
    );
    worker.run_until_idle().await?;
    let retry: Vec<Uuid> = queue
        .dead_letters_inspect(500)
        .await?
        .dead_letters
        .iter()
        .map(|l| l.dead_letter_id)
        .collect();
    anyhow::ensure!(
        retry.len() == DEAD_LETTERS,
        "planted {DEAD_LETTERS} retry dead letters, found {}",
        retry.len()
    );
    // One attempt allowed, so the one failure below dead-letters the entry.
    let planting = SessionJournal::new(
        env.redis.clone(),
        WorkQueueConfig {
            max_attempts: 1,
            ..WorkQueueConfig::default()
        },
    )?;
    let mut consumer = planting.queue().consumer().await?;
    let mut journal_letters = Vec::new();
    for n in 0..DEAD_LETTERS {
        planting
            .append(cleanup(Uuid::now_v7(), format!("sentinel-{n}")))
            .await?;
        let leased = consumer
            .lease()
            .await?
            .context("a planted journal entry was not there to lease")?;
        match consumer.fail(&leased, "planted dead letter").await? {
            FailOutcome::DeadLettered { dead_letter_id } => journal_letters.push(dead_letter_id),
            other => anyhow::bail!("a planted journal entry was not dead-lettered: {other:?}"),
        }
    }
    consumer.shutdown().await?;
    let mut keys = Vec::new();
    let mut conn = env.redis.conn();
    for target in env.redis.keys().cleanup_targets() {
        for pattern in target.scan_patterns {
            let key = pattern.replace('*', "hostile-sentinel");
            let _: () = redis::cmd("SET")
                .arg(&key)
                .arg("sentinel")
                .arg("EX")
                .arg(KEY_TTL_SECS)
                .query_async(&mut conn)
                .await?;
            keys.push(key);
        }
    }
    Ok(Sentinels {
        retry,
        journal: journal_letters,
        keys,
    })
}

/// The targets as the stores hold them now.
pub(super) async fn fingerprint(
    env: &BenchEnv,
    journal: &SessionJournal,
    sentinels: &Sentinels,
) -> anyhow::Result<Fingerprint> {
    let retry_rows: String = sqlx::query_scalar(
        "SELECT count(*)::text || ':' || coalesce(md5(string_agg(d::text, '|' ORDER BY d.dead_letter_id)), '')
           FROM persistence_job_dead_letters d WHERE d.dead_letter_id = ANY($1)",
    )
    .bind(&sentinels.retry)
    .fetch_one(&env.pool)
    .await?;
    let role_changes: String = sqlx::query_scalar(
        "SELECT count(*)::text || ':' || coalesce(md5(string_agg(r::text, '|' ORDER BY r::text)), '')
           FROM account_role_changes r",
    )
    .fetch_one(&env.pool)
    .await?;
    let mut journal_letters = Vec::new();
    for id in &sentinels.journal {
        journal_letters.push(format!("{:?}", journal.dead_letter(*id).await?));
    }
    let mut keys = Vec::new();
    let mut conn = env.redis.conn();
    for key in &sentinels.keys {
        let dump: Option<Vec<u8>> = redis::cmd("DUMP").arg(key).query_async(&mut conn).await?;
        keys.push(dump);
    }
    Ok(Fingerprint {
        retry_rows,
        journal: journal_letters,
        keys,
        role_changes,
    })
}

impl Fingerprint {
    /// The parts that differ from `other`.
    pub(super) fn changed(&self, other: &Fingerprint) -> Vec<&'static str> {
        let mut parts = Vec::new();
        if self.retry_rows != other.retry_rows {
            parts.push("retry dead letters");
        }
        if self.journal != other.journal {
            parts.push("journal dead letters");
        }
        if self.keys != other.keys {
            parts.push("keys");
        }
        if self.role_changes != other.role_changes {
            parts.push("role changes");
        }
        parts
    }

    /// Whether every planted target is still there (a fingerprint taken right after planting
    /// holds all of them).
    pub(super) fn complete(&self, sentinels: &Sentinels) -> bool {
        self.retry_rows
            .starts_with(&format!("{}:", sentinels.retry.len()))
            && self.journal.iter().all(|j| j.starts_with("Some("))
            && self.keys.iter().all(Option::is_some)
    }
}
