//! The steady work `serve` does while the hostile load runs: reward retry jobs for real
//! characters and stream-close cleanups through the journal, at a fixed rate.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::Utc;
use shardkeep::character::{CharacterStore, NewCharacter};
use shardkeep::clock::SystemClock;
use shardkeep::journal::SessionJournal;
use shardkeep::retry::{
    IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload, RetryQueue,
};
use shardkeep_reference::game::ReferenceEffect;
use shardkeep_sim::bench::BenchEnv;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Characters the work is for.
pub(super) const CHARACTERS: usize = 200;
/// Retry jobs and journal entries enqueued per tick.
const JOBS_PER_TICK: usize = 4;
const CLEANUPS_PER_TICK: usize = 2;
const TICK: Duration = Duration::from_millis(100);

/// What the workload enqueued.
#[derive(Debug, Default)]
pub(super) struct Enqueued {
    pub(super) retry_jobs: AtomicU64,
    pub(super) journal_entries: AtomicU64,
    pub(super) failures: AtomicU64,
}

/// Creates the characters the work is for.
pub(super) async fn characters(env: &BenchEnv) -> anyhow::Result<Vec<Uuid>> {
    let store = CharacterStore::new(env.pg.clone());
    let mut ids = Vec::with_capacity(CHARACTERS);
    for i in 0..CHARACTERS {
        let id = Uuid::now_v7();
        store
            .create(&NewCharacter {
                character_id: id,
                account_id: Uuid::now_v7(),
                name: format!("H{i}x{}", &id.simple().to_string()[24..]),
                zone_ref: Some("zone-0".into()),
                room_ref: Some("r0".into()),
                state: serde_json::json!({ "experience": 0, "currency": 0 }).into(),
                chargen: None,
                schema_version: 1,
            })
            .await?;
        ids.push(id);
    }
    Ok(ids)
}

/// A combat-reward retry job for `character` under the reward key `key`, from session `session`.
pub(super) fn reward_job(
    character: Uuid,
    experience: i64,
    key: String,
    session: String,
) -> anyhow::Result<PersistenceRetryJob> {
    let payload = PersistenceRetryPayload::effect(
        character,
        &ReferenceEffect::CombatRewards {
            experience,
            currency: 1,
            items: Vec::new(),
        },
    )
    .map_err(anyhow::Error::msg)?;
    let envelope = IdempotencyEnvelope {
        idempotency_key: key,
        owner_epoch: 0,
        origin: Origin::CombatRewards,
        issued_at: Utc::now(),
        issue_seq: 1,
    };
    Ok(PersistenceRetryJob::new(
        payload,
        envelope,
        "hostile",
        Some(session),
    )?)
}

/// Enqueues work until `stop`.
pub(super) async fn run(
    env: &BenchEnv,
    journal: &SessionJournal,
    characters: &[Uuid],
    enqueued: &Enqueued,
    stop: CancellationToken,
) {
    // A producer only: the signals go nowhere, `serve`'s polls find the rows.
    let (queue, _signals) = RetryQueue::new(env.pg.clone(), 64, Arc::new(SystemClock));
    let mut tick = tokio::time::interval(TICK);
    let mut n = 0u64;
    while !stop.is_cancelled() {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => break,
        }
        for _ in 0..JOBS_PER_TICK {
            n += 1;
            let character = characters[n as usize % characters.len()];
            let done = match reward_job(character, 5, format!("hostile-load:{n}"), format!("s-{n}"))
            {
                Ok(job) => queue.enqueue(&job).await.is_ok(),
                Err(_) => false,
            };
            let counter = if done {
                &enqueued.retry_jobs
            } else {
                &enqueued.failures
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        for _ in 0..CLEANUPS_PER_TICK {
            n += 1;
            let character = characters[n as usize % characters.len()];
            let entry = super::sentinels::cleanup(character, format!("s-{n}"));
            let counter = if journal.append(entry).await.is_ok() {
                &enqueued.journal_entries
            } else {
                &enqueued.failures
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }
}
