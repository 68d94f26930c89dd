//! An aged character, produced through the library: logins through the loader (claim, item-load
//! ledger), rewards granted in memory and issued (some also as durable retry jobs run by the
//! worker), item moves inside the carry tree, a checkpoint and a CAS flush per session, then the
//! maintenance pass. What is left in the row is what a veteran's document weighs now.

use std::sync::Arc;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::documents::{template_state, with_item_ids};
use super::progress::Progress;
use super::{BenchEnv, BenchError};
use shardkeep::character::{
    Bookkeeping, BookkeepingRetention, CharacterLoader, CharacterStore, CheckpointStore,
    NewCharacter, SaveOutcome,
};
use shardkeep::clock::{Clock, SystemClock};
use shardkeep::retry::{
    IdempotencyEnvelope, Origin, PersistenceRetryJob, PersistenceRetryPayload, RetryQueue,
    RetryWorker, RetryWorkerConfig,
};
use shardkeep_reference::game::ReferenceEffect;
use shardkeep_reference::game::items::Item;
use shardkeep_reference::game::{
    ApplyOptions, Catalog, LiveCharacter, apply_snapshot, dump_character,
};

/// How much life to put behind the character.
#[derive(Debug, Clone, Copy)]
pub struct AgingPlan {
    /// Rewards granted (spread evenly over the sessions).
    pub rewards: usize,
    /// Item moves inside the carry tree.
    pub item_moves: usize,
    /// Sessions (each a login through the loader and a flush).
    pub logins: usize,
    /// One reward in this many also goes through a durable retry job.
    pub job_every: usize,
}

impl Default for AgingPlan {
    fn default() -> Self {
        Self {
            rewards: 100_000,
            item_moves: 10_000,
            logins: 1_000,
            job_every: 100,
        }
    }
}

/// The aged character.
#[derive(Debug, Clone)]
pub struct AgedCharacter {
    /// Its stored state document after the aging.
    pub state: serde_json::Value,
    /// A fresh character's document holding the same items.
    pub fresh_state: serde_json::Value,
    /// Retry jobs the aging ran through the worker.
    pub jobs: usize,
    /// Bookkeeping rows left beside the row after the maintenance pass.
    pub bookkeeping_rows: i64,
    /// How long the aging took.
    pub took: Duration,
}

/// The ladder template with an identity on every item (as items carry in play).
pub fn template_with_ids() -> serde_json::Value {
    with_item_ids(template_state())
}

/// Moves one item between the inventory and the first container: out of it when it holds
/// something, into it otherwise.
fn move_item(character: &mut LiveCharacter) {
    let Some(bag) = character.inventory.iter().position(|i| i.proto.container) else {
        return;
    };
    if let Some(item) = character.inventory[bag].contents.pop() {
        character.inventory.push(item);
        return;
    }
    let loose = character
        .inventory
        .iter()
        .position(|i: &Item| !i.proto.container);
    if let Some(loose) = loose {
        let item = character.inventory.remove(loose);
        let bag = if loose < bag { bag - 1 } else { bag };
        character.inventory[bag].contents.push(item);
    }
}

/// The stores an aging runs on: one driver's (Postgres and Redis, or an embedded file).
pub struct AgingStores {
    /// The character rows.
    pub characters: CharacterStore,
    /// The checkpoint tier.
    pub checkpoints: CheckpointStore,
    /// The retry queue the reward jobs go to.
    pub queue: RetryQueue,
    /// The worker that runs them.
    pub worker: RetryWorker,
    /// The bookkeeping tables' maintenance.
    pub bookkeeping: Bookkeeping,
    /// The same storage, to count the bookkeeping rows left.
    pub rows: AgingRows,
}

/// The storage underneath an aging, for counting what it left.
pub enum AgingRows {
    /// Postgres.
    Postgres(sqlx::PgPool),
    /// An embedded file.
    Embedded(shardkeep::SqliteBackend),
}

impl AgingRows {
    /// The job-effect and item-load rows kept beside `id`'s row.
    async fn bookkeeping_of(&self, id: Uuid) -> Result<i64, BenchError> {
        let sql = "SELECT (SELECT count(*) FROM character_job_effects WHERE character_id = $1)
                        + (SELECT count(*) FROM item_loads WHERE character_id = $1)";
        Ok(match self {
            Self::Postgres(pool) => sqlx::query_scalar(sql).bind(id).fetch_one(pool).await?,
            Self::Embedded(db) => {
                sqlx::query_scalar(sqlx::AssertSqlSafe(sql.replace('$', "?")))
                    .bind(id)
                    .fetch_one(db.pool())
                    .await?
            }
        })
    }
}

impl AgingStores {
    /// The stores of the scratch database and namespace `env`.
    pub fn servers(env: &BenchEnv) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let (queue, signals) = RetryQueue::new(env.pg.clone(), 1024, Arc::clone(&clock));
        Self {
            characters: CharacterStore::new(env.pg.clone()),
            checkpoints: CheckpointStore::new(env.redis.clone()),
            queue,
            worker: RetryWorker::new(
                env.pg.clone(),
                shardkeep_reference::game::ReferenceModel::handle(),
                signals,
                RetryWorkerConfig::new("aging"),
                clock,
            ),
            bookkeeping: Bookkeeping::new(env.pg.clone()),
            rows: AgingRows::Postgres(env.pool.clone()),
        }
    }

    /// The stores of the embedded file `db` (rows, checkpoints and jobs all in it).
    pub fn embedded(db: &shardkeep::SqliteBackend) -> Self {
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let (queue, signals) = RetryQueue::embedded(db.clone(), 1024, Arc::clone(&clock));
        Self {
            characters: CharacterStore::embedded(db.clone()),
            checkpoints: CheckpointStore::embedded(db.clone()),
            queue,
            worker: RetryWorker::embedded(
                db.clone(),
                shardkeep_reference::game::ReferenceModel::handle(),
                signals,
                RetryWorkerConfig::new("aging"),
                clock,
            ),
            bookkeeping: Bookkeeping::embedded(db.clone()),
            rows: AgingRows::Embedded(db.clone()),
        }
    }
}

/// Ages one new character by `plan` on the scratch database and namespace `env` and returns
/// its document, with a status line on `progress` now and then.
pub async fn age_character(
    env: &BenchEnv,
    plan: AgingPlan,
    progress: &Progress,
) -> Result<AgedCharacter, BenchError> {
    age_on(AgingStores::servers(env), plan, progress).await
}

/// Ages one new character by `plan` on `stores` and returns its document.
pub async fn age_on(
    stores: AgingStores,
    plan: AgingPlan,
    progress: &Progress,
) -> Result<AgedCharacter, BenchError> {
    let started = Instant::now();
    let AgingStores {
        characters: store,
        checkpoints,
        queue,
        mut worker,
        bookkeeping,
        rows,
    } = stores;
    let loader = CharacterLoader::new(
        store.clone(),
        Some(checkpoints.clone()),
        shardkeep_reference::game::ReferenceModel::handle(),
        Duration::from_secs(10),
    );
    let catalog = Catalog::reference();
    let fresh_state = template_with_ids();
    let id = Uuid::now_v7();
    store
        .create(&NewCharacter {
            character_id: id,
            account_id: Uuid::now_v7(),
            name: format!("veteran-{}", id.simple()),
            zone_ref: Some("zone-0".into()),
            room_ref: Some("r0".into()),
            state: fresh_state.clone().into(),
            chargen: None,
            schema_version: 1,
        })
        .await?;
    let logins = plan.logins.max(1);
    let mut jobs = 0;
    let mut granted = 0;
    let mut moved = 0;
    for session in 0..logins {
        let loaded = loader
            .claim_and_load(id, 0)
            .await
            .map_err(|e| BenchError::Other(e.to_string()))?;
        let options = ApplyOptions {
            fresh_login: true,
            ..ApplyOptions::default()
        };
        let mut character = apply_snapshot(&loaded.snapshot, &catalog, options).character;
        let rewards_now = plan.rewards * (session + 1) / logins - granted;
        for n in 0..rewards_now {
            let (xp, gold) = (17 + (n % 23) as i64, (n % 3) as i64);
            character.experience += xp;
            character.currency += gold;
            let seq = character.issue();
            granted += 1;
            if plan.job_every > 0 && granted % plan.job_every == 0 {
                let job = reward_job(&character, seq, (xp, gold))?;
                queue
                    .enqueue(&job)
                    .await
                    .map_err(|e| BenchError::Other(e.to_string()))?;
                jobs += 1;
            }
        }
        let moves_now = plan.item_moves * (session + 1) / logins - moved;
        for _ in 0..moves_now {
            move_item(&mut character);
            moved += 1;
        }
        worker.run_until_idle().await?;
        flush(&store, &checkpoints, &character).await?;
        progress.tick("aging", || {
            format!(
                "{} of {logins} sessions: {granted} rewards ({jobs} as retry jobs), {moved} item moves",
                session + 1
            )
        });
    }
    worker.run_until_idle().await?;
    bookkeeping
        .prune_once(BookkeepingRetention::default())
        .await?;
    let state = store
        .load(id)
        .await?
        .ok_or_else(|| BenchError::Other("the aged character is gone".into()))?
        .state;
    let bookkeeping_rows = rows.bookkeeping_of(id).await?;
    let mut fresh_same_items = fresh_state;
    fresh_same_items["inventory"] = state["inventory"].clone();
    fresh_same_items["equipment"] = state["equipment"].clone();
    Ok(AgedCharacter {
        state: state.to_value(),
        fresh_state: fresh_same_items,
        jobs,
        bookkeeping_rows,
        took: started.elapsed(),
    })
}

fn reward_job(
    character: &LiveCharacter,
    seq: u64,
    (experience, currency): (i64, i64),
) -> Result<PersistenceRetryJob, BenchError> {
    let payload = PersistenceRetryPayload::effect(
        character.character_id,
        &ReferenceEffect::CombatRewards {
            experience,
            currency,
            items: Vec::new(),
        },
    )
    .map_err(BenchError::Other)?;
    PersistenceRetryJob::new(
        payload,
        IdempotencyEnvelope {
            idempotency_key: format!(
                "aging:{}:{}:{seq}",
                character.character_id, character.owner_epoch
            ),
            owner_epoch: character.owner_epoch,
            origin: Origin::CombatRewards,
            issued_at: chrono::Utc::now(),
            issue_seq: seq,
        },
        "bench-aging",
        None,
    )
    .map_err(|e| BenchError::Other(e.to_string()))
}

/// A checkpoint, then a CAS flush that adopts the row's version when jobs moved it.
async fn flush(
    store: &CharacterStore,
    checkpoints: &CheckpointStore,
    character: &LiveCharacter,
) -> Result<(), BenchError> {
    let mut snapshot = dump_character(character, Some("zone-0"), Some("r0"), Default::default())
        .map_err(|e| BenchError::Other(e.to_string()))?;
    checkpoints.write(&snapshot).await?;
    for _ in 0..3 {
        match store.save(&snapshot).await? {
            SaveOutcome::Saved(_) => return Ok(()),
            SaveOutcome::VersionConflict(current) => snapshot.state_version = current,
            other => return Err(BenchError::Other(format!("flush: {other:?}"))),
        }
    }
    Err(BenchError::Other("the flush kept conflicting".into()))
}
