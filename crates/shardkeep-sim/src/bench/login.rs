//! A login storm: a killed shard's players (each with a row and the checkpoint the shard left)
//! all log in elsewhere at once — claim (mint the epoch), read the row and the checkpoint,
//! choose the fresher, record the item loads, apply it to a live character — against the raw
//! `SELECT` of the same rows and a raw read of the same checkpoint keys, issued with the same
//! concurrency over a pool of the same size.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;
use uuid::Uuid;

use super::documents::DocumentKind;
use super::ladder::{insert_rows, snapshot};
use super::{BenchEnv, BenchError, Goal, Progress, Row, Unit, percentile};
use shardkeep::character::{CharacterLoader, CharacterStore, CheckpointStore};
use shardkeep_reference::game::{ApplyOptions, Catalog, ReferenceModel, apply_snapshot};

const BENCH: &str = "login";

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct LoginConfig {
    /// Players logging in at once.
    pub players: usize,
    /// Connections of the game server's pool (the same for the raw reads).
    pub pool: u32,
}

/// One storm's figures.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct LoginReport {
    /// The document every character holds.
    pub document: DocumentKind,
    /// Players.
    pub players: usize,
    /// Logins per second through the library.
    pub logins_per_second: f64,
    /// p99 login latency, milliseconds.
    pub login_p99_ms: f64,
    /// Raw SELECT + checkpoint read per second.
    pub raw_per_second: f64,
    /// p99 of the raw reads, milliseconds.
    pub raw_p99_ms: f64,
    /// Logins that loaded the checkpoint (all should: the shard died after checkpointing).
    pub from_checkpoint: usize,
}

/// Waits for every task, collecting each one's latency; the first error wins.
async fn latencies(
    mut tasks: JoinSet<Result<(Duration, bool), BenchError>>,
) -> Result<(Vec<f64>, usize), BenchError> {
    let mut out = Vec::with_capacity(tasks.len());
    let mut flagged = 0;
    while let Some(joined) = tasks.join_next().await {
        let (took, flag) = joined.map_err(BenchError::other)??;
        out.push(took.as_secs_f64() * 1000.0);
        flagged += usize::from(flag);
    }
    Ok((out, flagged))
}

/// Runs one storm with every character holding `state`.
pub async fn run(
    env: &BenchEnv,
    config: LoginConfig,
    document: DocumentKind,
    state: &serde_json::Value,
    progress: &Progress,
) -> Result<LoginReport, BenchError> {
    progress.step(
        BENCH,
        format!(
            "{} characters ({} document), each with its shard's last checkpoint",
            config.players,
            document.label()
        ),
    );
    let prefix = format!("ls{}-", Uuid::now_v7().simple());
    let rows = insert_rows(&env.pool, config.players, &prefix, state).await?;
    let checkpoints = CheckpointStore::new(env.redis.clone());
    // The shard checkpointed after its last flush: the checkpoint is the fresher copy.
    let mut fresher = state.clone();
    fresher["experience"] = serde_json::json!(1_000_001);
    let fresher = shardkeep::character::StateJson::from(fresher);
    let snapshots: Vec<_> = rows
        .iter()
        .map(|(id, name)| snapshot(*id, name, &fresher))
        .collect();
    for chunk in snapshots.chunks(512) {
        let refs: Vec<_> = chunk.iter().collect();
        checkpoints.write_many(&refs).await?;
    }
    // A character that lived has loaded its items before: the ledger already holds them.
    let ids: Vec<Uuid> = rows.iter().map(|(id, _)| *id).collect();
    let items = ReferenceModel::handle().held_items(state);
    if !items.is_empty() {
        sqlx::query(
            "INSERT INTO item_loads (item_id, character_id, loaded_epoch)
             SELECT item, c, 1 FROM UNNEST($1::uuid[]) AS c, UNNEST($2::uuid[]) AS item",
        )
        .bind(&ids)
        .bind(&items)
        .execute(&env.pool)
        .await?;
    }
    sqlx::query("ANALYZE").execute(&env.pool).await?;
    let pool = env.pool_of(config.pool).await?;
    // Every connection open before either side's clock starts.
    let mut warm = Vec::new();
    for _ in 0..config.pool {
        warm.push(pool.acquire().await?);
    }
    drop(warm);

    progress.step(
        BENCH,
        format!("raw: {} SELECTs + checkpoint reads at once", ids.len()),
    );
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for id in &ids {
        let (pool, mut conn, id) = (pool.clone(), env.redis_conn.clone(), *id);
        let key = env.redis.keys().checkpoint(id);
        // A login's latency runs from the moment it is asked for (all at once), not from its
        // task's first turn on the scheduler: waiting for a turn is part of the storm's cost.
        let began = Instant::now();
        tasks.spawn(async move {
            // The document's text as the engine returns it (nothing decoded).
            let row: Option<(Uuid, String, i64, i64)> = sqlx::query_as(
                "SELECT id, state::text, state_version, owner_epoch FROM characters WHERE id = $1",
            )
            .bind(id)
            .fetch_optional(&pool)
            .await?;
            let (_, body): (Option<i64>, Option<Vec<u8>>) = redis::cmd("HMGET")
                .arg(&key)
                .arg("epoch")
                .arg("snapshot")
                .query_async(&mut conn)
                .await?;
            Ok((began.elapsed(), row.is_some() && body.is_some()))
        });
    }
    let (raw_ms, raw_found) = latencies(tasks).await?;
    let raw_seconds = started.elapsed().as_secs_f64();
    if raw_found != ids.len() {
        return Err(BenchError::Other(format!(
            "raw reads found {raw_found} of {} rows and checkpoints",
            ids.len()
        )));
    }

    progress.step(BENCH, format!("shardkeep: {} logins at once", ids.len()));
    let loader = CharacterLoader::new(
        CharacterStore::new(shardkeep::PostgresBackend::from_pool(pool.clone())),
        Some(checkpoints),
        ReferenceModel::handle(),
        Duration::from_secs(30),
    );
    let catalog = Arc::new(Catalog::reference());
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for id in &ids {
        let (loader, catalog, id) = (loader.clone(), Arc::clone(&catalog), *id);
        let began = Instant::now();
        tasks.spawn(async move {
            let loaded = loader
                .claim_and_load(id, 0)
                .await
                .map_err(BenchError::other)?;
            let options = ApplyOptions {
                fresh_login: true,
                ..ApplyOptions::default()
            };
            let applied = apply_snapshot(&loaded.snapshot, &catalog, options);
            let from_checkpoint = loaded.source == shardkeep::character::LoadSource::Checkpoint
                && applied.character.experience == 1_000_001;
            Ok((began.elapsed(), from_checkpoint))
        });
    }
    let (login_ms, from_checkpoint) = latencies(tasks).await?;
    let login_seconds = started.elapsed().as_secs_f64();
    pool.close().await;
    Ok(LoginReport {
        document,
        players: ids.len(),
        logins_per_second: ids.len() as f64 / login_seconds,
        login_p99_ms: percentile(&login_ms, 0.99),
        raw_per_second: ids.len() as f64 / raw_seconds,
        raw_p99_ms: percentile(&raw_ms, 0.99),
        from_checkpoint,
    })
}

/// The report's rows for one storm.
pub fn rows(r: &LoginReport) -> Vec<Row> {
    let who = format!(
        "{} at once, {} doc",
        super::table::thousands(r.players as f64),
        r.document.label()
    );
    vec![
        Row::higher_is_better(
            BENCH,
            format!("logins ({who})"),
            r.logins_per_second,
            "raw SELECT + checkpoint read, same concurrency",
            r.raw_per_second,
            Unit::PerSecond,
            Goal::AtLeast(0.5),
        ),
        Row::lower_is_better(
            BENCH,
            format!("login p99 ({who})"),
            r.login_p99_ms,
            "raw SELECT + checkpoint read p99",
            r.raw_p99_ms,
            Unit::Millis,
            Goal::None,
        ),
        Row::higher_is_better(
            BENCH,
            format!("logins that chose the fresher checkpoint ({who})"),
            r.from_checkpoint as f64,
            "logins",
            r.players as f64,
            Unit::Count,
            Goal::AtLeast(1.0),
        ),
    ]
}
