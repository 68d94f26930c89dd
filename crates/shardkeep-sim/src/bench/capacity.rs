//! How many online characters one shard process sustains at the default cadences (a checkpoint
//! every 40 pulses, a flush every 240, pulses of 250 ms), with Postgres and Redis on the same
//! machine: the reference shard on the live-copy runtime (`LiveShard`, every character logged
//! in through the runtime's claim and load, with its session records) runs at real pulse speed,
//! and the run counts drops, failures, pulses over budget and the rates reached against what
//! the cadences ask for. Each player's session records (marker, presence, placement) are
//! written and refreshed as in production, so the Redis the checkpoints go to also carries
//! their upkeep. It also reports the memory the process holds per online character.

use std::sync::Arc;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::documents::DocumentKind;
use super::embedded_cas::ScratchFile;
use super::ladder::{insert_rows, snapshot};
use super::{BenchEnv, BenchError, Goal, Progress, Row, Unit};
use shardkeep::character::StateJson;
use shardkeep::clock::SystemClock;
use shardkeep::live::{Cadence, LiveConfig, Runtime, SessionStart};
use shardkeep::{Keyspace, Services, ServicesConfig};
use shardkeep_reference::game::{
    ApplyOptions, Catalog, ReferenceModel, apply_snapshot, reference_world,
};
use shardkeep_reference::live_shard::{LiveShard, LiveShardConfig};
use shardkeep_reference::shard::{ReferenceGame, ZoneDirectory};

const BENCH: &str = "capacity";
/// Distinct timer offsets among the characters of a run.
const TIMER_VARIANTS: u32 = 97;

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct CapacityConfig {
    /// Characters online in the shard.
    pub online: usize,
    /// Time run at real pulse speed (a flush period is 60 s).
    pub sustain: Duration,
    /// Run on the embedded store (one scratch SQLite file holding the rows and the
    /// checkpoints) instead of Postgres and Redis.
    pub embedded: bool,
}

/// The run's findings.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct CapacityReport {
    /// The document every character holds.
    pub document: DocumentKind,
    /// Where the shard's stores were: `servers` (Postgres and Redis) or `embedded`.
    pub stores: &'static str,
    /// Its size in bytes.
    pub state_bytes: usize,
    /// Characters online.
    pub online: usize,
    /// Seconds run at real pulse speed.
    pub seconds: f64,
    /// Checkpoint writes per second reached.
    pub checkpoints_per_second: f64,
    /// Flushed rows per second reached.
    pub flush_rows_per_second: f64,
    /// Checkpoint rate the cadence asks for (online / 10 s).
    pub checkpoints_needed: f64,
    /// Flush rate the cadence asks for (online / 60 s).
    pub flushes_needed: f64,
    /// Saves attempted (checkpoints and rows).
    pub attempted: u64,
    /// Saves dropped at enqueue.
    pub dropped: u64,
    /// Failed writes.
    pub failed: u64,
    /// Slowest pulse, in milliseconds (the budget is 250).
    pub max_pulse_ms: f64,
    /// Pulses that overran the budget.
    pub overruns: u64,
    /// Largest saver queue depth seen (entries; one entry is one pulse's slice).
    pub max_queue_depth: usize,
    /// Resident memory the process gained from booting the shard to the end of the run, per
    /// online character: the live character and everything the runtime and the shard keep for
    /// it (its copy's bookkeeping, session, saver and timer entries, where it stands), and what
    /// the allocator kept from the logins (`None` where the platform does not say).
    pub bytes_per_character: Option<f64>,
}

/// Resident memory of this process, in bytes (Linux).
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Logins in flight at once while the shard fills.
pub const LOGINS_AT_ONCE: usize = 256;

/// Boots one reference shard on the live-copy runtime, logs `config.online` characters holding
/// `state` in through it (each claimed and loaded, as a real login is) and runs it at real pulse
/// speed.
pub async fn run(
    env: Option<&BenchEnv>,
    config: CapacityConfig,
    document: DocumentKind,
    state: &serde_json::Value,
    progress: &Progress,
) -> Result<CapacityReport, BenchError> {
    progress.step(
        BENCH,
        format!(
            "inserting {} characters ({} document)",
            config.online,
            document.label()
        ),
    );
    let prefix = format!("on{}-", Uuid::now_v7().simple());
    let catalog = Arc::new(Catalog::reference());
    let encoded = StateJson::from(state);
    let probe = apply_snapshot(
        &snapshot(Uuid::nil(), "probe", &encoded),
        &catalog,
        ApplyOptions::default(),
    );
    if !probe.warnings.is_empty() {
        return Err(BenchError::Other(format!(
            "the document does not apply: {:?}",
            probe.warnings
        )));
    }
    // Players' buffs and cooldowns started at different times: the same document with its
    // timers shifted, a variant per character in turn, so they do not all run out on one pulse.
    let variants: Vec<serde_json::Value> = (0..TIMER_VARIANTS)
        .map(|k| super::documents::with_timers_shifted(state, k))
        .collect();
    let services_config = ServicesConfig::new("bench-capacity", "game_server");
    let (ids, services, _scratch) = if config.embedded {
        let (scratch, ids) = embedded_population(config.online, &prefix, &variants).await?;
        let keys = Keyspace::new(&format!("bench-{}", Uuid::now_v7().simple()))
            .map_err(BenchError::other)?;
        let services = Services::embedded(
            scratch.db.clone(),
            &keys,
            ReferenceModel::handle(),
            services_config,
            Arc::new(SystemClock),
        )
        .map_err(BenchError::other)?;
        (ids, services, Some(scratch))
    } else {
        let env = env.ok_or_else(|| {
            BenchError::other("a capacity run on the servers needs Postgres and Redis")
        })?;
        let rows = insert_rows(&env.pool, config.online, &prefix, state).await?;
        let ids: Vec<Uuid> = rows.into_iter().map(|(id, _)| id).collect();
        for (k, variant) in variants.iter().enumerate() {
            let group: Vec<Uuid> = ids
                .iter()
                .skip(k)
                .step_by(variants.len())
                .copied()
                .collect();
            sqlx::query("UPDATE characters SET state = $1 WHERE id = ANY($2)")
                .bind(variant)
                .bind(&group)
                .execute(&env.pool)
                .await?;
        }
        let services = Services::build(
            env.pg.clone(),
            env.redis.clone(),
            ReferenceModel::handle(),
            services_config,
        )
        .map_err(BenchError::other)?;
        (ids, services, None)
    };
    let pulse = Cadence::default().pulse();
    let resident_before = resident_bytes();
    let mut live = LiveShardConfig::new("bench", "zone-0");
    // The runtime's own bound on a store call, as in production.
    live.live = LiveConfig::new("bench");
    let mut shard = LiveShard::boot(
        &services,
        live,
        reference_world(1),
        Arc::clone(&catalog),
        ZoneDirectory::new(),
    )
    .map_err(BenchError::other)?;
    progress.step(BENCH, format!("logging {} characters in", ids.len()));
    log_everyone_in(&mut shard, &ids, pulse, progress).await?;
    drop(ids);
    progress.step(
        BENCH,
        format!(
            "{} online: running at real pulse speed for {:.0} s",
            config.online,
            config.sustain.as_secs_f64()
        ),
    );
    let saver = shard.runtime().saver().clone();
    let before = saver.stats();
    let started = Instant::now();
    let mut ticker = tokio::time::interval(pulse);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut max_pulse, mut overruns, mut max_depth) = (Duration::ZERO, 0, 0);
    let mut pulses = 0u64;
    let mut first_and_last_due = None;
    while started.elapsed() < config.sustain {
        // A pulse is timed from when it was due, so a pulse that started late (its thread not
        // scheduled, or the one before it overran) counts its wait too.
        let due = ticker.tick().await;
        first_and_last_due = Some(first_and_last_due.map_or((due, due), |(first, _)| (first, due)));
        shard.tick();
        let took = due.elapsed();
        pulses += 1;
        max_pulse = max_pulse.max(took);
        if took > pulse {
            overruns += 1;
        }
        max_depth = max_depth.max(saver.depth());
        progress.tick(BENCH, || {
            let now = saver.stats();
            let secs = started.elapsed().as_secs_f64();
            format!(
                "{secs:.0} s of {:.0}: {:.0} checkpoints/s, {:.0} flush rows/s, slowest pulse {:.0} ms, overruns {overruns}, queue depth {}",
                config.sustain.as_secs_f64(),
                (now.checkpoint_landed - before.checkpoint_landed) as f64 / secs,
                (now.row_landed - before.row_landed) as f64 / secs,
                max_pulse.as_secs_f64() * 1000.0,
                saver.depth()
            )
        });
    }
    let seconds = started.elapsed().as_secs_f64();
    // Pulses were due until the run's end, even when the last one ran past it.
    let run_end =
        tokio::time::Instant::from_std(started + config.sustain).min(tokio::time::Instant::now());
    // Rates count what was written while the shard ran, not what a queue that fell behind
    // writes after it (the drain below); drops and failures count both.
    let at_end = saver.stats();
    let barrier = saver.barrier(Duration::from_secs(30)).await;
    let after = saver.stats();
    let resident_after = resident_bytes();
    shard.kill();
    let dropped = (after.dropped_checkpoint + after.dropped_row)
        - (before.dropped_checkpoint + before.dropped_row);
    // A refused write (a newer owner or schema, a version conflict) is a save that did not
    // land: no copy here is stale, so any refusal is a fault of the run.
    let mut failed = (after.checkpoint_failed
        + after.row_failed
        + after.checkpoint_refused
        + after.row_conflicts
        + after.row_ownership_lost)
        - (before.checkpoint_failed
            + before.row_failed
            + before.checkpoint_refused
            + before.row_conflicts
            + before.row_ownership_lost);
    // Pulses that never ran (the schedule slips past an overrun) count as overruns.
    if let Some((first, last)) = first_and_last_due {
        overruns += pulses_never_run(
            last.duration_since(first),
            run_end.saturating_duration_since(first),
            pulse,
            pulses,
        );
    }
    if barrier != shardkeep::drain::BarrierOutcome::Drained {
        failed += 1;
    }
    let checkpoints = at_end.checkpoint_landed - before.checkpoint_landed;
    let flushes = at_end.row_landed - before.row_landed;
    let (checkpoint_pulses, flush_pulses) = Cadence::default().periods();
    let pulse_s = pulse.as_secs_f64();
    Ok(CapacityReport {
        document,
        stores: if config.embedded {
            "embedded"
        } else {
            "servers"
        },
        state_bytes: serde_json::to_vec(state).map(|v| v.len()).unwrap_or(0),
        online: config.online,
        seconds,
        checkpoints_per_second: checkpoints as f64 / seconds,
        flush_rows_per_second: flushes as f64 / seconds,
        checkpoints_needed: config.online as f64 / (checkpoint_pulses as f64 * pulse_s),
        flushes_needed: config.online as f64 / (flush_pulses as f64 * pulse_s),
        attempted: (after.checkpoint_attempted - before.checkpoint_attempted)
            + (after.row_attempted - before.row_attempted),
        dropped,
        failed,
        max_pulse_ms: max_pulse.as_secs_f64() * 1000.0,
        overruns,
        max_queue_depth: max_depth,
        bytes_per_character: resident_before
            .zip(resident_after)
            .map(|(b, a)| a.saturating_sub(b) as f64 / config.online.max(1) as f64),
    })
}

/// A scratch embedded file holding `online` characters named `prefix` and a number, each with
/// the next of `variants` as its document (version 0, epoch 1), and their ids in order.
pub async fn embedded_population(
    online: usize,
    prefix: &str,
    variants: &[serde_json::Value],
) -> Result<(ScratchFile, Vec<Uuid>), BenchError> {
    let scratch = ScratchFile::new().await?;
    let encoded: Vec<StateJson> = variants.iter().map(StateJson::from).collect();
    let ids: Vec<Uuid> = (0..online).map(|_| Uuid::now_v7()).collect();
    for (slice, chunk) in ids.chunks(50_000).enumerate() {
        let snapshots: Vec<_> = chunk
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let n = slice * 50_000 + i;
                snapshot(*id, &format!("{prefix}{n}"), &encoded[n % encoded.len()])
            })
            .collect();
        scratch.insert(&snapshots).await?;
    }
    Ok((scratch, ids))
}

/// Logs every one of `ids` in through the shard's runtime (claim, load, land), at most
/// [`LOGINS_AT_ONCE`] at a time, and puts each on the map, the shard ticking at its pulse
/// meanwhile as a running shard does (so the first players' sessions and saves run while the
/// last log in). A login refused by a passing store error is tried again, up to three times;
/// one refused after that fails the run.
pub async fn log_everyone_in(
    shard: &mut LiveShard,
    ids: &[Uuid],
    pulse: Duration,
    progress: &Progress,
) -> Result<(), BenchError> {
    const TRIES: u32 = 3;
    let mut next = ids.iter().copied();
    let mut logins = tokio::task::JoinSet::new();
    let mut entered = 0usize;
    let mut ticker = tokio::time::interval(pulse);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let login = |runtime: Runtime<ReferenceGame>, id: Uuid, tries: u32| async move {
        (id, tries, runtime.login(id, SessionStart::default()).await)
    };
    loop {
        while logins.len() < LOGINS_AT_ONCE {
            let Some(id) = next.next() else { break };
            logins.spawn(login(shard.runtime().clone(), id, 1));
        }
        let joined = tokio::select! {
            _ = ticker.tick() => {
                shard.tick();
                continue;
            }
            joined = logins.join_next() => joined,
        };
        let Some(joined) = joined else {
            return Ok(());
        };
        let (id, tries, result) = joined.map_err(BenchError::other)?;
        match result {
            Ok(admitted) => {
                shard.enter(admitted).map_err(BenchError::other)?;
                entered += 1;
            }
            Err(err) if tries < TRIES => {
                tracing::warn!(character = %id, error = %err, "a login failed; trying again");
                logins.spawn(login(shard.runtime().clone(), id, tries + 1));
            }
            Err(err) => return Err(BenchError::other(err)),
        }
        progress.tick(BENCH, || format!("{entered} of {} logged in", ids.len()));
    }
}

/// The report's rows for one run.
pub fn rows(r: &CapacityReport) -> Vec<Row> {
    let who = format!(
        "{}{} online, {} doc ({} B)",
        if r.stores == "embedded" {
            "embedded, "
        } else {
            ""
        },
        super::table::thousands(r.online as f64),
        r.document.label(),
        r.state_bytes
    );
    let mut rows = vec![
        Row::higher_is_better(
            BENCH,
            format!("{who}: checkpoints written"),
            r.checkpoints_per_second,
            "what the 10 s cadence asks",
            r.checkpoints_needed,
            Unit::PerSecond,
            Goal::AtLeast(0.95),
        ),
        Row::higher_is_better(
            BENCH,
            format!("{who}: rows flushed"),
            r.flush_rows_per_second,
            "what the 60 s cadence asks",
            r.flushes_needed,
            Unit::PerSecond,
            Goal::AtLeast(0.95),
        ),
        Row::lower_is_better(
            BENCH,
            format!("{who}: slowest pulse, due to done"),
            r.max_pulse_ms,
            "the pulse (250 ms)",
            250.0,
            Unit::Millis,
            Goal::AtLeast(1.0),
        ),
        Row::higher_is_better(
            BENCH,
            format!("{who}: saves dropped, failed or refused"),
            (r.dropped + r.failed) as f64,
            "saves attempted",
            r.attempted as f64,
            Unit::Count,
            Goal::AtMost(0.0),
        ),
    ];
    if let Some(bytes) = r.bytes_per_character {
        rows.push(Row::higher_is_better(
            BENCH,
            format!("{who}: memory held per character"),
            bytes,
            "its state document",
            r.state_bytes as f64,
            Unit::Bytes,
            Goal::None,
        ));
    }
    rows
}

/// Pulses a schedule of one every `pulse` had due that did not run, when `ran` pulses ran: one
/// due at the first pulse's due time and one each period until the last pulse's due time
/// (`to_last` after it), or until the run's end (`to_end`) when that is later (the pulses a long
/// last pulse kept from running).
fn pulses_never_run(to_last: Duration, to_end: Duration, pulse: Duration, ran: u64) -> u64 {
    let period = pulse.as_nanos().max(1);
    let through_last = to_last.as_nanos() / period + 1;
    let through_end = to_end.as_nanos().div_ceil(period);
    let due = u64::try_from(through_last.max(through_end)).unwrap_or(u64::MAX);
    due.saturating_sub(ran)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PULSE: Duration = Duration::from_millis(250);

    const RUN: Duration = Duration::from_secs(70);

    #[test]
    fn a_schedule_kept_misses_no_pulse() {
        // 281 pulses due at 0, 250 ms, …, 70 s, however long the last one took.
        assert_eq!(pulses_never_run(RUN, RUN, PULSE, 281), 0);
        assert_eq!(
            pulses_never_run(Duration::ZERO, Duration::ZERO, PULSE, 1),
            0
        );
    }

    #[test]
    fn a_slip_of_whole_periods_counts_each_pulse_it_skipped() {
        // The schedule slipped 600 ms in all: two pulses' worth never ran.
        let to_last = Duration::from_millis(70_000 + 600);
        assert_eq!(pulses_never_run(to_last, RUN, PULSE, 281), 2);
        // A slip under a period loses none.
        assert_eq!(
            pulses_never_run(Duration::from_millis(70_200), RUN, PULSE, 281),
            0
        );
    }

    #[test]
    fn a_last_pulse_running_past_the_end_counts_the_pulses_it_kept_from_running() {
        // 277 pulses ran on time up to the one due at 69 s, which took 1.05 s: the pulses due at
        // 69.25, 69.5 and 69.75 s never ran.
        assert_eq!(
            pulses_never_run(Duration::from_secs(69), RUN, PULSE, 277),
            3
        );
    }
}
