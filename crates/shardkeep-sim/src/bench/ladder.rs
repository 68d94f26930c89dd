//! The ladder benchmark: batched CAS saves, single-row CAS saves and raw one-at-a-time UPDATEs
//! of the same rows; checkpoint writes against raw SETs; and how many online characters one
//! shard's saver sustains at the default cadences without dropping.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use uuid::Uuid;

use super::{BenchEnv, measure, rate};
use shardkeep::character::{
    CharacterSnapshot, CharacterStore, CheckpointStore, LoadSource, LoadedCharacter, SaveOutcome,
};
use shardkeep_reference::game::{
    ApplyOptions, Catalog, apply_snapshot, dump_character, reference_world,
};
use shardkeep_reference::shard::{Arrival, Shard, ShardConfig, ShardStores, ZoneDirectory};

/// A benchmark step failed.
#[derive(Debug, thiserror::Error)]
pub enum LadderBenchError {
    /// Postgres failed.
    #[error("postgres: {0}")]
    Postgres(#[from] sqlx::Error),
    /// The character store failed.
    #[error(transparent)]
    Store(#[from] shardkeep::character::StoreError),
    /// Redis failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The checkpoint tier failed.
    #[error(transparent)]
    Checkpoint(#[from] shardkeep::character::CheckpointError),
    /// Something else went wrong.
    #[error("{0}")]
    Other(String),
}

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct LadderBenchConfig {
    /// Rows cycled through by the throughput steps.
    pub rows: usize,
    /// Length of each throughput step.
    pub window: Duration,
    /// Rows per batched CAS statement and per Redis pipeline.
    pub batch: usize,
    /// Online characters in the sustain step (0 skips it).
    pub online: usize,
    /// Length of the sustain step.
    pub sustain: Duration,
}

/// The sustain step's findings.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct SustainReport {
    /// Characters online in one shard.
    pub online: usize,
    /// Seconds run at real pulse speed.
    pub seconds: f64,
    /// Checkpoint writes per second reached.
    pub checkpoints_per_second: f64,
    /// Flushed rows per second reached.
    pub flush_rows_per_second: f64,
    /// Saves dropped at enqueue.
    pub dropped: u64,
    /// Failed writes.
    pub failed: u64,
    /// Slowest pulse, in milliseconds (the budget is 250).
    pub max_pulse_ms: f64,
    /// Pulses that overran the 250 ms budget.
    pub overruns: u64,
    /// Largest saver queue depth seen (entries; one entry is one pulse's slice).
    pub max_queue_depth: usize,
    /// Checkpoint rate the cadence asks for (online / 10 s).
    pub checkpoints_needed: f64,
    /// Flush rate the cadence asks for (online / 60 s).
    pub flushes_needed: f64,
    /// True when nothing was dropped or failed, both rates reached 95 % of what the cadence
    /// asks, and the queue never held more than two seconds of pulses (so the crash window stays
    /// the ~10 s checkpoint cadence).
    pub sustained: bool,
}

/// Every rate measured, in operations per second.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct LadderBenchReport {
    /// Raw single-statement UPDATEs, one at a time.
    pub raw_update: f64,
    /// Single-row CAS saves.
    pub cas_single: f64,
    /// Batched CAS saves (rows per second).
    pub cas_batched: f64,
    /// Raw SETs of the checkpoint payload, one at a time.
    pub raw_set: f64,
    /// Raw SETs, pipelined in batches.
    pub raw_set_pipelined: f64,
    /// Checkpoint writes (Lua-guarded), pipelined in batches.
    pub checkpoint: f64,
    /// Size of one state document, in bytes.
    pub state_bytes: usize,
    /// The sustain step, when run.
    pub sustain: Option<SustainReport>,
}

/// A representative state document: a kitted-out adventurer with a bag of loot.
pub fn template_state() -> serde_json::Value {
    json!({
        "attributes": { "str": 14, "dex": 12, "con": 13 },
        "resources": { "hp": 80, "mana": 30, "stamina": 40 },
        "affects": [{ "name": "blessed", "remaining_pulses": 400, "attribute_mods": { "wis": 1 } }],
        "cooldowns": { "bash": 12, "kick": 3 },
        "equipment": {
            "wield": { "proto": "sword", "delta": { "quality": 2 } },
            "body": { "proto": "mail" },
            "head": { "proto": "helm" }
        },
        "inventory": [
            { "proto": "bag", "contents": [{ "proto": "gem" }, { "proto": "gem" }, { "proto": "herb", "delta": { "stack": 7 } }] },
            { "proto": "ore", "delta": { "stack": 23 } }
        ],
        "experience": 48211, "level": 12, "currency": 1907,
        "appearance": { "hair": "braided", "skin": "tan", "outfit": "ranger" },
        "position": [4, 9], "applied_seq": 0, "tracks": { "smithing": 3 }
    })
}

async fn insert_rows(
    pool: &sqlx::PgPool,
    count: usize,
    prefix: &str,
    state: &serde_json::Value,
) -> Result<Vec<(Uuid, String)>, LadderBenchError> {
    sqlx::query(
        "INSERT INTO characters (id, account_id, name, zone_ref, room_ref, state, state_version, owner_epoch)
         SELECT gen_random_uuid(), gen_random_uuid(), $1 || g, 'zone-0', 'r0', $2, 0, 1
           FROM generate_series(1, $3) AS g",
    )
    .bind(prefix)
    .bind(state)
    .bind(i64::try_from(count).unwrap_or(i64::MAX))
    .execute(pool)
    .await?;
    Ok(
        sqlx::query_as("SELECT id, name FROM characters WHERE name LIKE $1 || '%' ORDER BY id")
            .bind(prefix)
            .fetch_all(pool)
            .await?,
    )
}

fn snapshot(id: Uuid, name: &str, state: &serde_json::Value) -> CharacterSnapshot {
    CharacterSnapshot {
        character_id: id,
        account_id: Uuid::nil(),
        name: name.to_owned(),
        zone_ref: Some("zone-0".into()),
        room_ref: Some("r0".into()),
        state: state.clone(),
        chargen: None,
        state_version: 0,
        issue_mark: 0,
        owner_epoch: 1,
        schema_version: 1,
    }
}

/// Runs every step with the template document.
pub async fn run(
    env: &BenchEnv,
    config: LadderBenchConfig,
) -> Result<LadderBenchReport, LadderBenchError> {
    run_with_state(env, config, &template_state()).await
}

/// Runs every step with every character holding `state` (a fresh or an aged document).
pub async fn run_with_state(
    env: &BenchEnv,
    config: LadderBenchConfig,
    state: &serde_json::Value,
) -> Result<LadderBenchReport, LadderBenchError> {
    let store = CharacterStore::new(env.pg.clone());
    let checkpoints = CheckpointStore::new(env.redis.clone());
    let prefix = format!("tp{}-", Uuid::now_v7().simple());
    let rows = insert_rows(&env.pool, config.rows, &prefix, state).await?;
    let mut snapshots: Vec<CharacterSnapshot> = rows
        .iter()
        .map(|(id, name)| snapshot(*id, name, state))
        .collect();
    let state = state.clone();
    let state_bytes = serde_json::to_vec(&state).map(|v| v.len()).unwrap_or(0);
    let batch = config
        .batch
        .clamp(1, shardkeep::character::store::MAX_SAVE_BATCH);

    let pool = env.pool.clone();
    let mut next = 0usize;
    let (n, t) = measure(config.window, || {
        let (id, _) = rows[next % rows.len()];
        next += 1;
        let pool = pool.clone();
        let state = &state;
        async move {
            sqlx::query("UPDATE characters SET state = $2, state_version = state_version + 1, updated_at = now() WHERE id = $1")
                .bind(id)
                .bind(state)
                .execute(&pool)
                .await
                .map(|_| 1)
        }
    })
    .await?;
    let raw_update = rate(n, t);
    resync_versions(&store, &mut snapshots).await?;

    let mut cursor = 0usize;
    let mut done = 0u64;
    let started = Instant::now();
    while started.elapsed() < config.window {
        let i = cursor % snapshots.len();
        cursor += 1;
        if let SaveOutcome::Saved(v) = store.save(&snapshots[i]).await? {
            snapshots[i].state_version = v;
            done += 1;
        }
    }
    let cas_single = rate(done, started.elapsed());

    let mut cursor = 0usize;
    let mut done = 0u64;
    let started = Instant::now();
    while started.elapsed() < config.window {
        let start = (cursor * batch) % snapshots.len();
        cursor += 1;
        let end = (start + batch).min(snapshots.len());
        let refs: Vec<&CharacterSnapshot> = snapshots[start..end].iter().collect();
        let outcomes = store.save_many(&refs).await?;
        for (offset, (_, outcome)) in outcomes.into_iter().enumerate() {
            if let SaveOutcome::Saved(v) = outcome {
                snapshots[start + offset].state_version = v;
                done += 1;
            }
        }
    }
    let cas_batched = rate(done, started.elapsed());

    let payload =
        serde_json::to_vec(&snapshots[0]).map_err(|e| LadderBenchError::Other(e.to_string()))?;
    let keys: Vec<String> = snapshots
        .iter()
        .map(|s| {
            env.redis
                .keys()
                .net_counter(&format!("bench-set-{}", s.character_id))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| LadderBenchError::Other(e.to_string()))?;
    let mut conn = env.redis_conn.clone();
    let mut next = 0usize;
    let started = Instant::now();
    let mut done = 0u64;
    while started.elapsed() < config.window {
        let key = &keys[next % keys.len()];
        next += 1;
        let () = redis::cmd("SET")
            .arg(key)
            .arg(&payload)
            .query_async(&mut conn)
            .await?;
        done += 1;
    }
    let raw_set = rate(done, started.elapsed());

    let started = Instant::now();
    let mut done = 0u64;
    let mut cursor = 0usize;
    while started.elapsed() < config.window {
        let start = (cursor * batch) % keys.len();
        cursor += 1;
        let mut pipe = redis::pipe();
        for key in &keys[start..(start + batch).min(keys.len())] {
            pipe.set(key, &payload).ignore();
        }
        let () = pipe.query_async(&mut conn).await?;
        done += (batch.min(keys.len() - start)) as u64;
    }
    let raw_set_pipelined = rate(done, started.elapsed());

    let started = Instant::now();
    let mut done = 0u64;
    let mut cursor = 0usize;
    while started.elapsed() < config.window {
        let start = (cursor * batch) % snapshots.len();
        cursor += 1;
        let refs: Vec<&CharacterSnapshot> = snapshots[start..(start + batch).min(snapshots.len())]
            .iter()
            .collect();
        done += checkpoints.write_many(&refs).await?.len() as u64;
    }
    let checkpoint = rate(done, started.elapsed());

    let sustain = if config.online > 0 {
        Some(sustain(env, config, &state).await?)
    } else {
        None
    };
    Ok(LadderBenchReport {
        raw_update,
        cas_single,
        cas_batched,
        raw_set,
        raw_set_pipelined,
        checkpoint,
        state_bytes,
        sustain,
    })
}

async fn resync_versions(
    store: &CharacterStore,
    snapshots: &mut [CharacterSnapshot],
) -> Result<(), LadderBenchError> {
    for s in snapshots.iter_mut() {
        if let Some((version, _)) = store.version_of(s.character_id).await? {
            s.state_version = version;
        }
    }
    Ok(())
}

/// Boots one shard with `online` characters at the default cadences and runs it at real pulse
/// speed, watching for drops, failures and overrunning pulses.
async fn sustain(
    env: &BenchEnv,
    config: LadderBenchConfig,
    state: &serde_json::Value,
) -> Result<SustainReport, LadderBenchError> {
    let prefix = format!("on{}-", Uuid::now_v7().simple());
    let rows = insert_rows(&env.pool, config.online, &prefix, state).await?;
    let catalog = Arc::new(Catalog::reference());
    let stores = ShardStores {
        characters: Some(CharacterStore::new(env.pg.clone())),
        checkpoints: Some(CheckpointStore::new(env.redis.clone())),
        placement: None,
        audit: None,
        retry: None,
    };
    let shard_config = ShardConfig::new("bench", "zone-0");
    let pulse = shardkeep_reference::shard::PULSE;
    let mut shard = Shard::boot(
        shard_config,
        reference_world(1),
        Arc::clone(&catalog),
        stores,
        ZoneDirectory::new(),
    );
    // Check the template applies cleanly once, then admit everyone from it.
    let probe = apply_snapshot(
        &snapshot(Uuid::nil(), "probe", state),
        &catalog,
        ApplyOptions::default(),
    );
    if !probe.warnings.is_empty() {
        return Err(LadderBenchError::Other(format!(
            "template does not apply: {:?}",
            probe.warnings
        )));
    }
    dump_character(
        &probe.character,
        Some("zone-0"),
        Some("r0"),
        Default::default(),
    )
    .map_err(|e| LadderBenchError::Other(e.to_string()))?;
    for (id, name) in &rows {
        let loaded = LoadedCharacter {
            snapshot: snapshot(*id, name, state),
            source: LoadSource::Row,
            brand_new: false,
            origin: Default::default(),
        };
        shard
            .admit(
                loaded,
                Arrival::Login {
                    session_token: id.to_string(),
                },
            )
            .map_err(|e| LadderBenchError::Other(e.to_string()))?;
    }
    let before = shard.saver().stats();
    let started = Instant::now();
    let mut ticker = tokio::time::interval(pulse);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut max_pulse = Duration::ZERO;
    let mut overruns = 0;
    let mut max_depth = 0;
    while started.elapsed() < config.sustain {
        ticker.tick().await;
        let tick_started = Instant::now();
        shard.tick();
        let took = tick_started.elapsed();
        max_pulse = max_pulse.max(took);
        if took > pulse {
            overruns += 1;
        }
        max_depth = max_depth.max(shard.saver().depth());
    }
    let seconds = started.elapsed().as_secs_f64();
    let barrier = shard.saver().barrier(Duration::from_secs(30)).await;
    let after = shard.saver().stats();
    shard.kill();
    let dropped = (after.dropped_checkpoint + after.dropped_row)
        - (before.dropped_checkpoint + before.dropped_row);
    let failed = (after.checkpoint_failed + after.row_failed)
        - (before.checkpoint_failed + before.row_failed);
    let checkpoints_per_second =
        (after.checkpoint_attempted - before.checkpoint_attempted) as f64 / seconds;
    let flush_rows_per_second = (after.row_attempted - before.row_attempted) as f64 / seconds;
    let pulse_s = pulse.as_secs_f64();
    let checkpoints_needed = config.online as f64 / (40.0 * pulse_s);
    let flushes_needed = config.online as f64 / (240.0 * pulse_s);
    let sustained = dropped == 0
        && failed == 0
        && barrier == shardkeep::drain::BarrierOutcome::Drained
        && checkpoints_per_second >= 0.95 * checkpoints_needed
        && flush_rows_per_second >= 0.95 * flushes_needed
        && max_depth <= 8;
    Ok(SustainReport {
        online: config.online,
        seconds,
        checkpoints_per_second,
        flush_rows_per_second,
        dropped,
        failed,
        max_pulse_ms: max_pulse.as_secs_f64() * 1000.0,
        overruns,
        max_queue_depth: max_depth,
        checkpoints_needed,
        flushes_needed,
        sustained,
    })
}
