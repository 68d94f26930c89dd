//! The run's time series (saves, save latency, depths, memory and table sizes, sampled at a
//! fixed interval) and the stability verdict over its last stretch. The verdict is pure and
//! tested on its own; the sampler does the reading.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use shardkeep::saver::LatencyCounts;

/// One sample of the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds of play when it was taken.
    pub at_secs: f64,
    /// Saves landed (checkpoints and rows) per second since the previous sample.
    pub saves_per_sec: f64,
    /// 99th percentile of store-call latency (checkpoint pipelines and CAS statements) since the
    /// previous sample, in milliseconds; `None` when no call was made.
    pub p99_save_ms: Option<f64>,
    /// Retry jobs stored.
    pub retry_depth: u64,
    /// Journal entries pending or in processing.
    pub journal_depth: u64,
    /// Resident memory of this process, in bytes (`None` where it cannot be read).
    pub rss_bytes: Option<u64>,
    /// About how much of it the simulator's own checker ledger holds (every reward, claim and
    /// session event of the run, kept to be checked at the end): it grows with the run by
    /// design and is left out of the `rss` the verdict judges.
    pub checker_bytes: Option<u64>,
    /// Memory Redis reports in use (`used_memory`, summed over the masters).
    pub redis_memory_bytes: Option<u64>,
    /// Size of each table of the run's database, indexes and TOAST included, in bytes.
    pub table_bytes: BTreeMap<String, u64>,
}

/// Tables of shardkeep's own bookkeeping beside the rows.
pub const BOOKKEEPING_TABLES: [&str; 4] = [
    "character_job_effects",
    "item_loads",
    "item_releases",
    "transfer_activations",
];

impl Sample {
    /// The resident memory less the checker's ledger: the library's and the shards' own.
    pub fn rss_less_checker(&self) -> Option<u64> {
        self.rss_bytes
            .map(|rss| rss.saturating_sub(self.checker_bytes.unwrap_or(0)))
    }

    /// Bytes of the named tables, or of every table when `names` is `None`.
    pub fn tables_bytes(&self, names: Option<&[&str]>) -> u64 {
        self.table_bytes
            .iter()
            .filter(|(name, _)| names.is_none_or(|names| names.contains(&name.as_str())))
            .map(|(_, bytes)| *bytes)
            .sum()
    }
}

/// A series that rose over the verdict's window by more than its noise.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Growth {
    /// The series (`rss` — less the checker's ledger —, `redis memory`, `retry depth`, `journal depth`, `table <name>`).
    pub series: String,
    /// Its fitted value at the window's start and end.
    pub from: f64,
    /// See `from`.
    pub to: f64,
    /// Why it grows when that is by design (an append-only record), else `None`.
    pub by_design: Option<String>,
}

/// The verdict over the last stretch of the series.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Stability {
    /// True when nothing but by-design records grew.
    pub stable: bool,
    /// The stretch judged, in seconds of play (start, end).
    pub window_secs: (f64, f64),
    /// Samples in it.
    pub samples: usize,
    /// What grew.
    pub grew: Vec<Growth>,
}

/// The series of a run and its verdict.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Series {
    /// Seconds between samples.
    pub interval_secs: f64,
    /// The samples, in time order.
    pub samples: Vec<Sample>,
    /// The verdict; `None` when the run is too short to judge.
    pub stability: Option<Stability>,
}

/// The shortest run whose verdict means something: in a shorter one the tables, the
/// bookkeeping retention and the allocator are still filling (a 2-minute run doubles its tables
/// in its second minute), so it gets a series but no verdict.
pub const MIN_JUDGED_RUN: Duration = Duration::from_secs(600);

/// The verdict of a run of `duration`: `None` for runs under [`MIN_JUDGED_RUN`] or with too
/// few samples.
pub fn verdict_for(samples: &[Sample], duration: Duration) -> Option<Stability> {
    if duration < MIN_JUDGED_RUN {
        return None;
    }
    judge(samples, window_for(duration))
}

/// Samples a verdict needs in its window.
pub const MIN_WINDOW_SAMPLES: usize = 4;

/// Time between samples: a minute for runs of ten minutes or more (a soak), else a twelfth of
/// the run (at least 5 s), so a short run still has a series.
pub fn interval_for(duration: Duration) -> Duration {
    if duration >= Duration::from_secs(600) {
        return Duration::from_secs(60);
    }
    (duration / 12).max(Duration::from_secs(5))
}

/// The stretch a verdict judges: the last ten minutes of a run of twenty minutes or more, else
/// its second half (the first half holds the warm-up: tables and memory filling).
pub fn window_for(duration: Duration) -> Duration {
    if duration >= Duration::from_secs(1200) {
        Duration::from_secs(600)
    } else {
        duration / 2
    }
}

/// Tables that grow with what happens to characters, by design, with why.
const GROWS_BY_DESIGN: [(&str, &str); 2] = [
    (
        "character_audit",
        "the append-only audit trail (retention by time partition, docs/scaling.md)",
    ),
    (
        "persistence_job_dead_letters",
        "dead letters stay until an operator requeues or purges them (the run plants poison)",
    ),
];

/// How a series' rise is told from noise.
#[derive(Debug, Clone, Copy)]
struct Tolerance {
    /// A rise below this fraction of the window's mean is noise.
    relative: f64,
    /// A rise below this absolute amount is noise.
    absolute: f64,
}

/// Memory and table sizes: 5 % (allocator and page reuse move in steps), and 1 MiB.
const SIZE_TOLERANCE: Tolerance = Tolerance {
    relative: 0.05,
    absolute: 1024.0 * 1024.0,
};
/// Queue depths swing with the faults: a rise under 100 entries or half the mean is noise.
const DEPTH_TOLERANCE: Tolerance = Tolerance {
    relative: 0.5,
    absolute: 100.0,
};

/// Judges the samples taken within `window` of the last one: a series grew when the rise of its
/// least-squares line across the window exceeds three standard deviations of the points around
/// that line and the series' tolerance.
pub fn judge(samples: &[Sample], window: Duration) -> Option<Stability> {
    let last = samples.last()?.at_secs;
    let start = last - window.as_secs_f64();
    let inside: Vec<&Sample> = samples.iter().filter(|s| s.at_secs >= start).collect();
    if inside.len() < MIN_WINDOW_SAMPLES {
        return None;
    }
    let mut named: BTreeMap<String, (Vec<(f64, f64)>, Tolerance)> = BTreeMap::new();
    let mut push = |name: String, at: f64, value: Option<f64>, tolerance: Tolerance| {
        if let Some(value) = value {
            named
                .entry(name)
                .or_insert_with(|| (Vec::new(), tolerance))
                .0
                .push((at, value));
        }
    };
    for s in &inside {
        push(
            "rss".into(),
            s.at_secs,
            s.rss_less_checker().map(|b| b as f64),
            SIZE_TOLERANCE,
        );
        push(
            "redis memory".into(),
            s.at_secs,
            s.redis_memory_bytes.map(|b| b as f64),
            SIZE_TOLERANCE,
        );
        push(
            "retry depth".into(),
            s.at_secs,
            Some(s.retry_depth as f64),
            DEPTH_TOLERANCE,
        );
        push(
            "journal depth".into(),
            s.at_secs,
            Some(s.journal_depth as f64),
            DEPTH_TOLERANCE,
        );
        for (table, bytes) in &s.table_bytes {
            push(
                format!("table {table}"),
                s.at_secs,
                Some(*bytes as f64),
                SIZE_TOLERANCE,
            );
        }
    }
    let mut grew = Vec::new();
    for (name, (points, tolerance)) in named {
        let Some((from, to, noise, mean)) = fit(&points) else {
            continue;
        };
        let rise = to - from;
        let floor = (tolerance.relative * mean.abs()).max(tolerance.absolute);
        if rise > 3.0 * noise && rise > floor {
            let by_design = GROWS_BY_DESIGN
                .iter()
                .find(|(table, _)| name == format!("table {table}"))
                .map(|(_, why)| (*why).to_owned());
            grew.push(Growth {
                series: name,
                from,
                to,
                by_design,
            });
        }
    }
    Some(Stability {
        stable: grew.iter().all(|g| g.by_design.is_some()),
        window_secs: (inside[0].at_secs, last),
        samples: inside.len(),
        grew,
    })
}

/// The least-squares line through `points`: its values at the first and last x, the standard
/// deviation of the points around it, and the points' mean.
fn fit(points: &[(f64, f64)]) -> Option<(f64, f64, f64, f64)> {
    if points.len() < MIN_WINDOW_SAMPLES {
        return None;
    }
    let n = points.len() as f64;
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let slope = sxy / sxx;
    let at = |x: f64| mean_y + slope * (x - mean_x);
    let residual: f64 = points.iter().map(|p| (p.1 - at(p.0)).powi(2)).sum();
    let noise = (residual / (n - 2.0)).sqrt();
    Some((
        at(points[0].0),
        at(points[points.len() - 1].0),
        noise,
        mean_y,
    ))
}

/// What the sampler remembers between samples.
#[derive(Debug, Default)]
pub(super) struct Sampler {
    last_at: f64,
    last_saves: u64,
    last_latency: LatencyCounts,
}

impl Sampler {
    /// A sample at `at_secs` of play, from the saver totals and what [`read_stores`] found.
    pub(super) fn sample(
        &mut self,
        at_secs: f64,
        saves: u64,
        latency: LatencyCounts,
        stores: StoreReadings,
        checker_bytes: Option<u64>,
    ) -> Sample {
        let span = (at_secs - self.last_at).max(0.001);
        let saves_per_sec = saves.saturating_sub(self.last_saves) as f64 / span;
        let p99 = latency
            .since(&self.last_latency)
            .quantile(0.99)
            .map(|d| d.as_secs_f64() * 1000.0);
        self.last_at = at_secs;
        self.last_saves = saves;
        self.last_latency = latency;
        Sample {
            at_secs,
            saves_per_sec,
            p99_save_ms: p99,
            retry_depth: stores.retry_depth,
            journal_depth: stores.journal_depth,
            rss_bytes: resident_bytes(),
            checker_bytes,
            redis_memory_bytes: stores.redis_memory_bytes,
            table_bytes: stores.table_bytes,
        }
    }
}

/// What a sample reads from the stores.
#[derive(Debug, Default)]
pub(super) struct StoreReadings {
    pub(super) retry_depth: u64,
    pub(super) journal_depth: u64,
    pub(super) redis_memory_bytes: Option<u64>,
    pub(super) table_bytes: BTreeMap<String, u64>,
}

/// Reads the table sizes of the run's durable store and Redis's memory (every master of a
/// cluster; none in embedded mode, where the file's tables hold everything).
pub(super) async fn read_store_sizes(
    env: &super::env::SimEnv,
) -> (BTreeMap<String, u64>, Option<u64>) {
    let tables = env.probe().table_bytes().await;
    let memory = match env.servers() {
        Some(s) => redis_used_memory(&s.redis_direct).await,
        None => None,
    };
    (tables, memory)
}

async fn redis_used_memory(redis: &shardkeep::backend::redis::RedisBackend) -> Option<u64> {
    let masters = redis.master_conns().await.ok()?;
    let mut total = 0;
    for mut conn in masters {
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut conn)
            .await
            .ok()?;
        total += used_memory(&info)?;
    }
    Some(total)
}

/// `used_memory:<bytes>` of an `INFO memory` reply.
fn used_memory(info: &str) -> Option<u64> {
    info.lines()
        .find_map(|line| line.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
}

/// This process's resident set, from `/proc/self/status` (Linux).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(values: impl Fn(usize) -> (u64, u64)) -> Vec<Sample> {
        (0..20)
            .map(|n| {
                let (rss, audit) = values(n);
                Sample {
                    at_secs: 60.0 * (n + 1) as f64,
                    rss_bytes: Some(rss),
                    redis_memory_bytes: Some(50 << 20),
                    retry_depth: (n % 3) as u64 * 40,
                    table_bytes: [("character_audit".to_owned(), audit)].into(),
                    ..Sample::default()
                }
            })
            .collect()
    }

    #[test]
    fn flat_noisy_series_are_stable_and_by_design_growth_is_named_not_counted() {
        let wobble = [0i64, 3, -2, 4, -3, 1, -1, 2, -4, 3];
        let samples = run(|n| {
            (
                (200i64 * 1024 * 1024 + wobble[n % 10] * 1024 * 1024) as u64,
                ((n as u64 + 1) * 10) << 20,
            )
        });
        let verdict = judge(&samples, window_for(Duration::from_secs(1200))).unwrap();
        assert!(verdict.stable, "{verdict:?}");
        assert_eq!(verdict.samples, 11);
        assert_eq!(verdict.grew.len(), 1, "{verdict:?}");
        assert_eq!(verdict.grew[0].series, "table character_audit");
        assert!(verdict.grew[0].by_design.is_some());
    }

    #[test]
    fn a_steady_climb_is_named() {
        let samples = run(|n| ((200 + 4 * n as u64) << 20, 1 << 20));
        let verdict = judge(&samples, Duration::from_secs(600)).unwrap();
        assert!(!verdict.stable);
        assert_eq!(verdict.grew[0].series, "rss");
        assert!(verdict.grew[0].to > verdict.grew[0].from);
    }

    #[test]
    fn the_checkers_own_ledger_is_left_out_of_the_rss_judged() {
        let mut samples = run(|n| ((200 + 4 * n as u64) << 20, 1 << 20));
        for (n, sample) in samples.iter_mut().enumerate() {
            sample.checker_bytes = Some((4 * n as u64) << 20);
        }
        let verdict = judge(&samples, Duration::from_secs(600)).unwrap();
        assert!(verdict.stable, "{verdict:?}");
        samples[19].checker_bytes = None;
        assert_eq!(samples[19].rss_less_checker(), samples[19].rss_bytes);
    }

    #[test]
    fn a_rise_inside_the_tolerance_is_noise_and_a_short_run_is_not_judged() {
        // 2 % over the window: under the 5 % tolerance.
        let samples = run(|n| ((1000 << 20) + n as u64 * (2 << 20), 1 << 20));
        assert!(judge(&samples, Duration::from_secs(600)).unwrap().stable);
        assert_eq!(judge(&samples[..3], Duration::from_secs(600)), None);
        assert_eq!(judge(&[], Duration::from_secs(600)), None);
        // A run under ten minutes gets its series but no verdict, however its samples look.
        assert_eq!(verdict_for(&samples, Duration::from_secs(120)), None);
        assert!(verdict_for(&samples, Duration::from_secs(1800)).is_some());
    }

    #[test]
    fn the_interval_and_window_follow_the_run_length() {
        assert_eq!(
            interval_for(Duration::from_secs(1800)),
            Duration::from_secs(60)
        );
        assert_eq!(
            interval_for(Duration::from_secs(120)),
            Duration::from_secs(10)
        );
        assert_eq!(
            interval_for(Duration::from_secs(30)),
            Duration::from_secs(5)
        );
        assert_eq!(
            window_for(Duration::from_secs(1800)),
            Duration::from_secs(600)
        );
        assert_eq!(
            window_for(Duration::from_secs(120)),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn info_memory_is_read_and_garbage_is_none() {
        assert_eq!(
            used_memory("# Memory\r\nused_memory:1024\r\nused_memory_human:1K\r\n"),
            Some(1024)
        );
        assert_eq!(used_memory("used_memory:lots"), None);
        assert_eq!(used_memory(""), None);
    }

    #[test]
    fn the_sampler_rates_saves_and_reads_latency_since_the_last_sample() {
        let mut sampler = Sampler::default();
        let mut latency = LatencyCounts::default();
        latency.0[LatencyCounts::bucket(Duration::from_millis(3))] = 100;
        let first = sampler.sample(10.0, 500, latency, StoreReadings::default(), None);
        assert_eq!(first.saves_per_sec, 50.0);
        assert!(first.p99_save_ms.unwrap() >= 3.0);
        let second = sampler.sample(20.0, 500, latency, StoreReadings::default(), None);
        assert_eq!(second.saves_per_sec, 0.0);
        assert_eq!(second.p99_save_ms, None);
    }
}
