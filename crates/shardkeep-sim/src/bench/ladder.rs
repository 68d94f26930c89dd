//! The ladder's writes against the engines' limits, on the same rows in one run: batched CAS
//! saves against a plain `UPDATE … FROM UNNEST` of the same rows and columns with no fence (and
//! against raw one-at-a-time UPDATEs); checkpoint writes against the same guard script issued
//! raw and pipelined, with the body encoded beforehand (and against raw SETs).

use std::time::{Duration, Instant};

use redis::Script;
use uuid::Uuid;

use super::documents::DocumentKind;
use super::{BenchEnv, BenchError, Goal, Progress, Row, Unit, measure, rate};
use shardkeep::character::checkpoint::{CHECKPOINTS_PER_CALL, WRITE_SCRIPT, call_groups};
use shardkeep::character::{
    CharacterSnapshot, CharacterStore, CheckpointStore, SaveOutcome, StateJson,
};
use shardkeep::keyspace::CHECKPOINT_TTL;

const BENCH: &str = "ladder";

/// What to measure.
#[derive(Debug, Clone, Copy)]
pub struct LadderBenchConfig {
    /// Rows cycled through by the throughput steps.
    pub rows: usize,
    /// Length of each throughput step.
    pub window: Duration,
    /// Rows per batched CAS statement and per Redis pipeline.
    pub batch: usize,
    /// Times the whole sequence of steps runs; each figure is its median.
    pub rounds: usize,
}

/// Every rate measured, in operations per second (medians over the rounds).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct LadderBenchReport {
    /// Raw single-statement UPDATEs, one at a time.
    pub raw_update: f64,
    /// Single-row CAS saves.
    pub cas_single: f64,
    /// A plain `UPDATE … FROM UNNEST` of the batch's rows and columns, no fence (rows/s).
    pub raw_unnest: f64,
    /// Batched CAS saves (rows per second).
    pub cas_batched: f64,
    /// The same batched CAS saves on the embedded store's SQLite file (rows per second; one
    /// window after the rounds).
    pub cas_batched_embedded: f64,
    /// Raw SETs of the checkpoint payload, one at a time.
    pub raw_set: f64,
    /// Raw SETs, pipelined in batches.
    pub raw_set_pipelined: f64,
    /// The checkpoint guard script, EVALSHA pipelined in batches with pre-encoded bodies, as
    /// many checkpoints to a call as the library writes.
    pub raw_guard_pipelined: f64,
    /// The same, one checkpoint to a call.
    pub raw_guard_single_calls: f64,
    /// Checkpoint writes through the library, pipelined in batches.
    pub checkpoint: f64,
    /// Size of one state document, in bytes.
    pub state_bytes: usize,
}

/// Inserts `count` characters holding `state`; returns their ids and names in id order.
pub async fn insert_rows(
    pool: &sqlx::PgPool,
    count: usize,
    prefix: &str,
    state: &serde_json::Value,
) -> Result<Vec<(Uuid, String)>, BenchError> {
    // In slices, so a large population neither holds one huge transaction nor goes silent.
    let mut left = count;
    while left > 0 {
        let n = left.min(50_000);
        sqlx::query(
            "INSERT INTO characters (id, account_id, name, zone_ref, room_ref, state, state_version, owner_epoch)
             SELECT gen_random_uuid(), gen_random_uuid(), $1 || ($4 + g), 'zone-0', 'r0', $2, 0, 1
               FROM generate_series(1, $3) AS g",
        )
        .bind(prefix)
        .bind(state)
        .bind(i64::try_from(n).unwrap_or(i64::MAX))
        .bind(i64::try_from(count - left).unwrap_or(i64::MAX))
        .execute(pool)
        .await?;
        left -= n;
    }
    Ok(
        sqlx::query_as("SELECT id, name FROM characters WHERE name LIKE $1 || '%' ORDER BY id")
            .bind(prefix)
            .fetch_all(pool)
            .await?,
    )
}

/// A snapshot of a row [`insert_rows`] made, at version 0 under epoch 1, holding `state`
/// (encoded once, shared by every snapshot made from it).
pub fn snapshot(id: Uuid, name: &str, state: &StateJson) -> CharacterSnapshot {
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

/// Runs every step `config.rounds` times with every character holding `state`.
pub async fn run_with_state(
    env: &BenchEnv,
    config: LadderBenchConfig,
    state: &serde_json::Value,
    progress: &Progress,
) -> Result<LadderBenchReport, BenchError> {
    let prefix = format!("tp{}-", Uuid::now_v7().simple());
    let rows = insert_rows(&env.pool, config.rows, &prefix, state).await?;
    let encoded = StateJson::from(state);
    let mut steps = Steps {
        env,
        config,
        store: CharacterStore::new(env.pg.clone()),
        checkpoints: CheckpointStore::new(env.redis.clone()),
        snapshots: rows
            .iter()
            .map(|(id, name)| snapshot(*id, name, &encoded))
            .collect(),
        batch: config
            .batch
            .clamp(1, shardkeep::character::store::MAX_SAVE_BATCH),
        progress,
    };
    let mut rounds = Vec::new();
    for round in 0..config.rounds.max(1) {
        progress.step(
            BENCH,
            format!(
                "round {} of {}: eight steps of {:.1} s each",
                round + 1,
                config.rounds.max(1),
                config.window.as_secs_f64()
            ),
        );
        rounds.push(steps.round().await?);
    }
    let cas_batched_embedded =
        super::embedded_cas::cas_batched(&steps.snapshots, steps.batch, config.window, progress)
            .await?;
    let median = |pick: fn(&LadderBenchReport) -> f64| {
        let mut v: Vec<f64> = rounds.iter().map(pick).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(LadderBenchReport {
        raw_update: median(|r| r.raw_update),
        cas_single: median(|r| r.cas_single),
        raw_unnest: median(|r| r.raw_unnest),
        cas_batched: median(|r| r.cas_batched),
        cas_batched_embedded,
        raw_set: median(|r| r.raw_set),
        raw_set_pipelined: median(|r| r.raw_set_pipelined),
        raw_guard_pipelined: median(|r| r.raw_guard_pipelined),
        raw_guard_single_calls: median(|r| r.raw_guard_single_calls),
        checkpoint: median(|r| r.checkpoint),
        state_bytes: serde_json::to_vec(state).map(|v| v.len()).unwrap_or(0),
    })
}

/// The report's rows for one document.
pub fn rows(kind: DocumentKind, r: &LadderBenchReport) -> Vec<Row> {
    let doc = format!("{} doc, {} B", kind.label(), r.state_bytes);
    vec![
        Row::higher_is_better(
            BENCH,
            format!("batched CAS saves, rows ({doc})"),
            r.cas_batched,
            "UPDATE … FROM UNNEST, same rows, no fence",
            r.raw_unnest,
            Unit::PerSecond,
            Goal::AtLeast(0.5),
        ),
        Row::higher_is_better(
            BENCH,
            format!("batched CAS saves, rows ({doc})"),
            r.cas_batched,
            "raw UPDATE, one at a time",
            r.raw_update,
            Unit::PerSecond,
            Goal::AtLeast(10.0),
        ),
        Row::higher_is_better(
            BENCH,
            format!("batched CAS saves, rows, embedded SQLite ({doc})"),
            r.cas_batched_embedded,
            "the same on Postgres",
            r.cas_batched,
            Unit::PerSecond,
            Goal::None,
        ),
        Row::higher_is_better(
            BENCH,
            format!("single-row CAS saves ({doc})"),
            r.cas_single,
            "raw UPDATE, one at a time",
            r.raw_update,
            Unit::PerSecond,
            Goal::None,
        ),
        Row::higher_is_better(
            BENCH,
            format!("checkpoint writes, pipelined ({doc})"),
            r.checkpoint,
            "guard script raw, pipelined, body pre-encoded",
            r.raw_guard_pipelined,
            Unit::PerSecond,
            Goal::AtLeast(0.7),
        ),
        Row::higher_is_better(
            BENCH,
            format!("checkpoint writes, pipelined ({doc})"),
            r.checkpoint,
            "guard script raw, pipelined, one checkpoint a call",
            r.raw_guard_single_calls,
            Unit::PerSecond,
            Goal::None,
        ),
        Row::higher_is_better(
            BENCH,
            format!("checkpoint writes, pipelined ({doc})"),
            r.checkpoint,
            "raw SET, pipelined (no guard)",
            r.raw_set_pipelined,
            Unit::PerSecond,
            Goal::None,
        ),
    ]
}

/// Aged against fresh, step by step: a veteran's writes cost what a new character's do.
pub fn aged_rows(aged: &LadderBenchReport, fresh: &LadderBenchReport) -> Vec<Row> {
    type Step = fn(&LadderBenchReport) -> f64;
    let steps: [(&str, Step); 3] = [
        ("single-row CAS saves", |r| r.cas_single),
        ("batched CAS saves, rows", |r| r.cas_batched),
        ("checkpoint writes, pipelined", |r| r.checkpoint),
    ];
    steps
        .into_iter()
        .map(|(step, pick)| {
            Row::higher_is_better(
                BENCH,
                format!("{step} (aged doc)"),
                pick(aged),
                "the same, fresh doc",
                pick(fresh),
                Unit::PerSecond,
                Goal::AtLeast(0.9),
            )
        })
        .collect()
}

struct Steps<'a> {
    env: &'a BenchEnv,
    config: LadderBenchConfig,
    store: CharacterStore,
    checkpoints: CheckpointStore,
    snapshots: Vec<CharacterSnapshot>,
    batch: usize,
    progress: &'a Progress,
}

impl Steps<'_> {
    async fn round(&mut self) -> Result<LadderBenchReport, BenchError> {
        let raw_update = self.raw_update().await?;
        let cas_single = self.cas_single().await?;
        let raw_unnest = self.raw_unnest().await?;
        let cas_batched = self.cas_batched().await?;
        let (raw_set, raw_set_pipelined) = self.raw_redis().await?;
        let raw_guard_pipelined = self.raw_guard(CHECKPOINTS_PER_CALL).await?;
        let raw_guard_single_calls = self.raw_guard(1).await?;
        let checkpoint = self.checkpoint().await?;
        Ok(LadderBenchReport {
            raw_update,
            cas_single,
            raw_unnest,
            cas_batched,
            cas_batched_embedded: 0.0,
            raw_set,
            raw_set_pipelined,
            raw_guard_pipelined,
            raw_guard_single_calls,
            checkpoint,
            state_bytes: 0,
        })
    }

    fn chunk(&self, cursor: usize) -> std::ops::Range<usize> {
        let start = (cursor * self.batch) % self.snapshots.len();
        start..(start + self.batch).min(self.snapshots.len())
    }

    async fn raw_update(&mut self) -> Result<f64, BenchError> {
        self.progress.step(BENCH, "raw UPDATE, one at a time");
        let pool = self.env.pool.clone();
        let mut next = 0usize;
        let snapshots = &self.snapshots;
        let (n, t) = measure(self.config.window, || {
            let s = &snapshots[next % snapshots.len()];
            next += 1;
            let pool = pool.clone();
            async move {
                sqlx::query(
                    "UPDATE characters SET state = $2, state_version = state_version + 1, updated_at = now() WHERE id = $1",
                )
                .bind(s.character_id)
                .bind(&s.state)
                .execute(&pool)
                .await
                .map(|_| 1)
            }
        })
        .await?;
        self.resync_versions().await?;
        Ok(rate(n, t))
    }

    async fn cas_single(&mut self) -> Result<f64, BenchError> {
        self.progress
            .step(BENCH, "CAS saves, one row per statement");
        let (mut cursor, mut done) = (0usize, 0u64);
        let started = Instant::now();
        while started.elapsed() < self.config.window {
            let i = cursor % self.snapshots.len();
            cursor += 1;
            if let SaveOutcome::Saved(v) = self.store.save(&self.snapshots[i]).await? {
                self.snapshots[i].state_version = v;
                done += 1;
            }
        }
        Ok(rate(done, started.elapsed()))
    }

    /// The same rows and columns as the batched CAS save, in one plain UPDATE: no version
    /// check, no epoch or schema fence, no lock ordering, no per-row outcome.
    async fn raw_unnest(&mut self) -> Result<f64, BenchError> {
        self.progress
            .step(BENCH, "UPDATE … FROM UNNEST, batched, no fence");
        let (mut cursor, mut done) = (0usize, 0u64);
        let started = Instant::now();
        while started.elapsed() < self.config.window {
            let range = self.chunk(cursor);
            cursor += 1;
            let batch = &self.snapshots[range];
            let ids: Vec<Uuid> = batch.iter().map(|s| s.character_id).collect();
            let epochs: Vec<i64> = batch.iter().map(|s| s.owner_epoch).collect();
            let states: Vec<&StateJson> = batch.iter().map(|s| &s.state).collect();
            let chargens: Vec<Option<&serde_json::Value>> =
                batch.iter().map(|s| s.chargen.as_ref()).collect();
            let zones: Vec<Option<&str>> = batch.iter().map(|s| s.zone_ref.as_deref()).collect();
            let rooms: Vec<Option<&str>> = batch.iter().map(|s| s.room_ref.as_deref()).collect();
            let marks: Vec<i64> = batch.iter().map(|s| s.issue_mark as i64).collect();
            let schemas: Vec<i32> = batch.iter().map(|s| s.schema_version as i32).collect();
            let updated = sqlx::query(
                "UPDATE characters c
                    SET state = t.state, chargen = t.chargen, zone_ref = t.zone_ref,
                        room_ref = t.room_ref, state_version = c.state_version + 1,
                        live_version = c.state_version + 1, live_issue_epoch = t.epoch,
                        live_issue_mark = t.issue_mark, schema_version = t.schema_version,
                        updated_at = now()
                   FROM UNNEST($1::uuid[], $2::int8[], $3::jsonb[], $4::jsonb[], $5::text[],
                               $6::text[], $7::int8[], $8::int4[])
                        AS t(id, epoch, state, chargen, zone_ref, room_ref, issue_mark, schema_version)
                  WHERE c.id = t.id",
            )
            .bind(&ids)
            .bind(&epochs)
            .bind(&states)
            .bind(&chargens)
            .bind(&zones)
            .bind(&rooms)
            .bind(&marks)
            .bind(&schemas)
            .execute(&self.env.pool)
            .await?;
            done += updated.rows_affected();
        }
        let rate = rate(done, started.elapsed());
        self.resync_versions().await?;
        Ok(rate)
    }

    async fn cas_batched(&mut self) -> Result<f64, BenchError> {
        self.progress.step(BENCH, "CAS saves, batched");
        let (mut cursor, mut done) = (0usize, 0u64);
        let started = Instant::now();
        while started.elapsed() < self.config.window {
            let range = self.chunk(cursor);
            cursor += 1;
            let start = range.start;
            let refs: Vec<&CharacterSnapshot> = self.snapshots[range].iter().collect();
            let outcomes = self.store.save_many(&refs).await?;
            for (offset, (_, outcome)) in outcomes.into_iter().enumerate() {
                if let SaveOutcome::Saved(v) = outcome {
                    self.snapshots[start + offset].state_version = v;
                    done += 1;
                }
            }
        }
        Ok(rate(done, started.elapsed()))
    }

    /// Each snapshot's checkpoint key and encoded body, made before a raw step's clock starts.
    fn checkpoint_bodies(&self) -> Result<Vec<(String, Vec<u8>)>, BenchError> {
        let keys = self.env.redis.keys();
        self.snapshots
            .iter()
            .map(|s| {
                let body = serde_json::to_vec(s).map_err(BenchError::other)?;
                Ok((keys.checkpoint(s.character_id), body))
            })
            .collect()
    }

    /// Raw SET one at a time and raw SET pipelined, with the checkpoint body encoded before the
    /// clock starts.
    async fn raw_redis(&mut self) -> Result<(f64, f64), BenchError> {
        let keys = self.env.redis.keys();
        let bodies = self.checkpoint_bodies()?;
        let set_keys: Vec<String> = self
            .snapshots
            .iter()
            .map(|s| keys.net_counter(&format!("bench-set-{}", s.character_id)))
            .collect::<Result<_, _>>()
            .map_err(BenchError::other)?;
        let mut conn = self.env.redis_conn.clone();
        let window = self.config.window;

        self.progress.step(BENCH, "raw SET, one at a time");
        let (mut next, mut done) = (0usize, 0u64);
        let started = Instant::now();
        while started.elapsed() < window {
            let i = next % bodies.len();
            next += 1;
            let () = redis::cmd("SET")
                .arg(&set_keys[i])
                .arg(&bodies[i].1)
                .query_async(&mut conn)
                .await?;
            done += 1;
        }
        let raw_set = rate(done, started.elapsed());

        self.progress.step(BENCH, "raw SET, pipelined");
        let (mut cursor, mut done) = (0usize, 0u64);
        let started = Instant::now();
        while started.elapsed() < window {
            let range = self.chunk(cursor);
            cursor += 1;
            let mut pipe = redis::pipe();
            for i in range.clone() {
                pipe.set(&set_keys[i], &bodies[i].1).ignore();
            }
            let () = pipe.query_async(&mut conn).await?;
            done += range.len() as u64;
        }
        let raw_set_pipelined = rate(done, started.elapsed());

        Ok((raw_set, raw_set_pipelined))
    }

    /// The checkpoint guard script issued raw, EVALSHA pipelined with the bodies encoded before
    /// the clock starts, `per_call` checkpoints to a call (grouped by slot on a cluster, as the
    /// library groups them), in pipelines of the library's size with as many in flight at once.
    async fn raw_guard(&mut self, per_call: usize) -> Result<f64, BenchError> {
        use futures::{StreamExt, TryStreamExt};
        use shardkeep::character::checkpoint::{PIPELINE_SNAPSHOTS, PIPELINES_IN_FLIGHT};
        let bodies = self.checkpoint_bodies()?;
        let mut conn = self.env.redis_conn.clone();
        let cluster = self.env.redis.is_cluster();
        self.progress.step(
            BENCH,
            format!("checkpoint guard script raw, pipelined, {per_call} a call"),
        );
        let script = Script::new(WRITE_SCRIPT);
        let () = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(WRITE_SCRIPT)
            .query_async::<String>(&mut conn)
            .await
            .map(|_| ())?;
        let ttl = CHECKPOINT_TTL.as_millis();
        let (mut cursor, mut done) = (0usize, 0u64);
        let started = Instant::now();
        while started.elapsed() < self.config.window {
            let range = self.chunk(cursor);
            cursor += 1;
            let mut pipes = Vec::new();
            let mut start = range.start;
            while start < range.end {
                let part = start..(start + PIPELINE_SNAPSHOTS).min(range.end);
                start = part.end;
                let part_keys: Vec<String> = part.clone().map(|i| bodies[i].0.clone()).collect();
                let sizes: Vec<usize> = part.clone().map(|i| bodies[i].1.len()).collect();
                let mut pipe = redis::pipe();
                for group in call_groups(&part_keys, &sizes, cluster) {
                    for call in group.chunks(per_call) {
                        let cmd = pipe.cmd("EVALSHA").arg(script.get_hash()).arg(call.len());
                        for &k in call {
                            cmd.arg(&part_keys[k]);
                        }
                        cmd.arg(ttl);
                        for &k in call {
                            let (s, body) =
                                (&self.snapshots[part.start + k], &bodies[part.start + k].1);
                            cmd.arg(s.owner_epoch).arg(body).arg(s.schema_version);
                        }
                    }
                }
                pipes.push(pipe);
            }
            let sent = futures::stream::iter(pipes)
                .map(|pipe| {
                    let mut conn = conn.clone();
                    async move { pipe.query_async::<Vec<redis::Value>>(&mut conn).await }
                })
                .buffer_unordered(PIPELINES_IN_FLIGHT)
                .try_collect::<Vec<_>>()
                .await?;
            drop(sent);
            done += range.len() as u64;
        }
        Ok(rate(done, started.elapsed()))
    }

    async fn checkpoint(&mut self) -> Result<f64, BenchError> {
        self.progress
            .step(BENCH, "checkpoint writes through the library, pipelined");
        let (mut cursor, mut done) = (0usize, 0u64);
        let started = Instant::now();
        while started.elapsed() < self.config.window {
            let range = self.chunk(cursor);
            cursor += 1;
            let refs: Vec<&CharacterSnapshot> = self.snapshots[range].iter().collect();
            done += self.checkpoints.write_many(&refs).await?.len() as u64;
        }
        Ok(rate(done, started.elapsed()))
    }

    async fn resync_versions(&mut self) -> Result<(), BenchError> {
        let ids: Vec<Uuid> = self.snapshots.iter().map(|s| s.character_id).collect();
        let versions: Vec<(Uuid, i64)> =
            sqlx::query_as("SELECT id, state_version FROM characters WHERE id = ANY($1)")
                .bind(&ids)
                .fetch_all(&self.env.pool)
                .await?;
        let by_id: std::collections::HashMap<Uuid, i64> = versions.into_iter().collect();
        for s in &mut self.snapshots {
            if let Some(v) = by_id.get(&s.character_id) {
                s.state_version = *v;
            }
        }
        Ok(())
    }
}
