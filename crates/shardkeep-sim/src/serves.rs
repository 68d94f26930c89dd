//! `--serves N`: the workers `serve` runs (the retry and journal workers, maintenance,
//! bookkeeping pruning, dead-letter retention) run in N `shardkeep serve` processes beside the
//! run instead of inside it, sharing its scratch database and namespace; Postgres is reached
//! through the run's fault proxy, and standalone Redis too (a cluster is reached directly: its
//! node addresses cannot be mapped for another process). The `kill-serve` fault SIGKILLs one
//! mid-run and starts it again; `queue-full` freezes them all. Their counts come from their
//! `/metrics`, read every second (a killed process's counts are those of its last reading).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use shardkeep::journal::JournalStats;
use shardkeep::retry::RetryStats;

use super::SimError;

/// What one `serve` process's `/metrics` said.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct ServeCounts {
    /// `shardkeep_retry_outcomes_total` by outcome.
    pub(super) retry: BTreeMap<String, u64>,
    /// `shardkeep_journal_outcomes_total` by outcome.
    pub(super) journal: BTreeMap<String, u64>,
    /// `shardkeep_queue_consumer_restarts_total`: its journal consumer lost its identity (others
    /// recovered what it held) and started over.
    pub(super) consumer_restarts: u64,
}

impl ServeCounts {
    fn add(&mut self, other: &ServeCounts) {
        for (outcome, n) in &other.retry {
            *self.retry.entry(outcome.clone()).or_default() += n;
        }
        for (outcome, n) in &other.journal {
            *self.journal.entry(outcome.clone()).or_default() += n;
        }
        self.consumer_restarts += other.consumer_restarts;
    }
}

/// Reads the counters the simulator needs from a Prometheus text exposition.
pub(super) fn parse_counts(text: &str) -> ServeCounts {
    let mut counts = ServeCounts::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let value = value.max(0.0) as u64;
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let outcome = labels
            .split(',')
            .find_map(|l| l.trim().strip_prefix("outcome=\""))
            .and_then(|v| v.split('"').next())
            .unwrap_or_default()
            .to_owned();
        match name {
            "shardkeep_retry_outcomes_total" => {
                *counts.retry.entry(outcome).or_default() += value;
            }
            "shardkeep_journal_outcomes_total" => {
                *counts.journal.entry(outcome).or_default() += value;
            }
            "shardkeep_queue_consumer_restarts_total" => counts.consumer_restarts += value,
            _ => {}
        }
    }
    counts
}

/// How to start one `serve`.
#[derive(Debug, Clone)]
pub(super) struct ServeLaunch {
    /// The `shardkeep` binary.
    pub(super) binary: PathBuf,
    /// Postgres as the serves reach it (through the run's proxy).
    pub(super) database_url: String,
    /// Redis as the serves reach it.
    pub(super) redis_url: String,
    /// The run's namespace.
    pub(super) namespace: String,
    /// `SHARDKEEP_PG_POOLER`.
    pub(super) pg_pooler: String,
    /// Where each process's stderr goes (`serve-<n>.log`).
    pub(super) log_dir: PathBuf,
}

struct Slot {
    child: Child,
    port: u16,
    /// Its last reading.
    last: ServeCounts,
}

/// The run's `serve` processes.
pub(super) struct ServeFleet {
    launch: ServeLaunch,
    http: reqwest::Client,
    slots: Mutex<Vec<Slot>>,
    /// Counts of the incarnations that were killed, as last read.
    gone: Mutex<ServeCounts>,
}

/// How long a started `serve` may take to listen.
const START_BOUND: Duration = Duration::from_secs(20);

impl ServeFleet {
    /// Starts `count` processes and waits until each listens.
    pub(super) async fn start(launch: ServeLaunch, count: usize) -> Result<Self, SimError> {
        std::fs::create_dir_all(&launch.log_dir).map_err(|e| {
            SimError::Setup(format!("cannot create {}: {e}", launch.log_dir.display()))
        })?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()
            .map_err(|e| SimError::Setup(format!("an HTTP client for /metrics: {e}")))?;
        let fleet = Self {
            launch,
            http,
            slots: Mutex::new(Vec::new()),
            gone: Mutex::new(ServeCounts::default()),
        };
        for index in 0..count {
            let slot = fleet.spawn(index).await?;
            if let Ok(mut slots) = fleet.slots.lock() {
                slots.push(slot);
            }
        }
        Ok(fleet)
    }

    async fn spawn(&self, index: usize) -> Result<Slot, SimError> {
        let setup = |what: String| SimError::Setup(what);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| setup(format!("a free port for serve {index}: {e}")))?;
        let log_path = self.launch.log_dir.join(format!("serve-{index}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| setup(format!("cannot open {}: {e}", log_path.display())))?;
        let child = Command::new(&self.launch.binary)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--namespace", &self.launch.namespace])
            .args(["--reconcile-seconds", "5"])
            .env("DATABASE_URL", &self.launch.database_url)
            .env("REDIS_URL", &self.launch.redis_url)
            .env("SHARDKEEP_PG_POOLER", &self.launch.pg_pooler)
            .env("SHARDKEEP_INTERNAL_KEYS", "sim:0123456789abcdef0123")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| {
                setup(format!(
                    "cannot start {} serve: {e}",
                    self.launch.binary.display()
                ))
            })?;
        let mut slot = Slot {
            child,
            port,
            last: ServeCounts::default(),
        };
        let deadline = tokio::time::Instant::now() + START_BOUND;
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(status)) = slot.child.try_wait() {
                return Err(setup(format!(
                    "serve {index} exited at start ({status}); see {}",
                    log_path.display()
                )));
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(slot);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = slot.child.kill();
        let _ = slot.child.wait();
        Err(setup(format!(
            "serve {index} did not listen within {START_BOUND:?}; see {}",
            log_path.display()
        )))
    }

    /// How many processes run.
    pub(super) fn len(&self) -> usize {
        self.slots.lock().map_or(0, |s| s.len())
    }

    fn ports(&self) -> Vec<u16> {
        self.slots
            .lock()
            .map(|s| s.iter().map(|slot| slot.port).collect())
            .unwrap_or_default()
    }

    /// Reads every process's counters (a process that does not answer keeps its last reading).
    pub(super) async fn read_metrics(&self) {
        for (index, port) in self.ports().into_iter().enumerate() {
            let text = match self
                .http
                .get(format!("http://127.0.0.1:{port}/metrics"))
                .send()
                .await
            {
                Ok(response) => response.text().await.ok(),
                Err(_) => None,
            };
            if let Some(text) = text
                && let Ok(mut slots) = self.slots.lock()
                && let Some(slot) = slots.get_mut(index)
                && slot.port == port
            {
                slot.last = parse_counts(&text);
            }
        }
    }

    /// SIGKILLs process `pick` (modulo their number) — no shutdown, its leases and processing
    /// entries left behind — and starts it again after `down`. Returns its index.
    pub(super) async fn kill_and_restart(&self, pick: usize, down: Duration) -> Option<usize> {
        self.read_metrics().await;
        let index = {
            let mut slots = self.slots.lock().ok()?;
            if slots.is_empty() {
                return None;
            }
            let index = pick % slots.len();
            let slot = &mut slots[index];
            let _ = slot.child.kill();
            let _ = slot.child.wait();
            if let Ok(mut gone) = self.gone.lock() {
                gone.add(&slot.last);
            }
            slot.last = ServeCounts::default();
            index
        };
        tokio::time::sleep(down).await;
        match self.spawn(index).await {
            Ok(fresh) => {
                if let Ok(mut slots) = self.slots.lock()
                    && let Some(slot) = slots.get_mut(index)
                {
                    *slot = fresh;
                }
            }
            Err(err) => tracing::warn!(event = "sim_serve_restart_failed", error = %err),
        }
        Some(index)
    }

    /// Freezes (SIGSTOP) or resumes (SIGCONT) every process: stalled workers.
    pub(super) fn freeze(&self, frozen: bool) {
        let pids: Vec<u32> = self
            .slots
            .lock()
            .map(|s| s.iter().map(|slot| slot.child.id()).collect())
            .unwrap_or_default();
        let signal = if frozen { "-STOP" } else { "-CONT" };
        for pid in pids {
            let _ = Command::new("kill")
                .args([signal, &pid.to_string()])
                .status();
        }
    }

    /// Every incarnation's counts: the killed ones' last readings and the running ones'.
    pub(super) fn totals(&self) -> ServeCounts {
        let mut total = self.gone.lock().map(|g| g.clone()).unwrap_or_default();
        if let Ok(slots) = self.slots.lock() {
            for slot in slots.iter() {
                total.add(&slot.last);
            }
        }
        total
    }

    /// Journal consumer restarts in the processes running now (each a live process never
    /// killed since it started): work was taken from a live consumer.
    pub(super) fn live_consumer_restarts(&self) -> u64 {
        self.slots
            .lock()
            .map(|s| s.iter().map(|slot| slot.last.consumer_restarts).sum())
            .unwrap_or(0)
    }

    /// Reads the counters a last time, then stops every process (SIGTERM: a clean shutdown,
    /// SIGKILL after 10 s).
    pub(super) async fn stop(&self) {
        self.freeze(false);
        self.read_metrics().await;
        let pids: Vec<u32> = self
            .slots
            .lock()
            .map(|s| s.iter().map(|slot| slot.child.id()).collect())
            .unwrap_or_default();
        for pid in pids {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::time::Instant::now() < deadline {
            let running = self.slots.lock().map_or(0, |mut s| {
                s.iter_mut()
                    .map(|slot| matches!(slot.child.try_wait(), Ok(None)))
                    .filter(|running| *running)
                    .count()
            });
            if running == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if let Ok(mut slots) = self.slots.lock() {
            for slot in slots.iter_mut() {
                let _ = slot.child.kill();
                let _ = slot.child.wait();
            }
        }
    }

    /// Writes the totals into the stats the report reads.
    pub(super) fn fill(&self, retry: &RetryStats, journal: &JournalStats) {
        use std::sync::atomic::Ordering::Relaxed;
        let totals = self.totals();
        let r = |outcome: &str| totals.retry.get(outcome).copied().unwrap_or(0);
        let j = |outcome: &str| totals.journal.get(outcome).copied().unwrap_or(0);
        retry.applied.store(r("applied"), Relaxed);
        retry.already_applied.store(r("already_applied"), Relaxed);
        retry.superseded.store(r("superseded"), Relaxed);
        retry.retried.store(r("retrying"), Relaxed);
        retry.dead_lettered.store(r("dead_lettered"), Relaxed);
        journal.processed.store(j("applied"), Relaxed);
        journal
            .skipped_reconnected
            .store(j("skipped_reconnected"), Relaxed);
        journal.skipped_stale.store(j("skipped_stale"), Relaxed);
        journal.failures.store(j("failed"), Relaxed);
        journal.dead_lettered.store(j("dead_lettered"), Relaxed);
    }
}

impl Drop for ServeFleet {
    fn drop(&mut self) {
        if let Ok(mut slots) = self.slots.lock() {
            for slot in slots.iter_mut() {
                let _ = Command::new("kill")
                    .args(["-CONT", &slot.child.id().to_string()])
                    .status();
                let _ = slot.child.kill();
                let _ = slot.child.wait();
            }
        }
    }
}

/// No live `serve` lost its journal work: every process running at the end (never killed
/// since it started) kept its consumer identity for its whole life, so no entry it held was
/// taken by another's recovery.
pub(super) fn no_live_work_taken(fleet: &ServeFleet, killed: u64) -> super::report::Invariant {
    let restarts = fleet.live_consumer_restarts();
    let details = if restarts > 0 {
        vec![format!(
            "{restarts} journal consumer restarts in serve processes never killed \
             ({killed} others were killed and started again)"
        )]
    } else {
        Vec::new()
    };
    super::report::Invariant::new("no live serve's work taken", fleet.len() as u64, details)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counters_are_read_by_outcome_and_the_rest_is_ignored() {
        let text = "\
# HELP shardkeep_retry_outcomes_total Retry job outcomes.
# TYPE shardkeep_retry_outcomes_total counter
shardkeep_retry_outcomes_total{outcome=\"applied\"} 12
shardkeep_retry_outcomes_total{outcome=\"dead_lettered\"} 3
shardkeep_journal_outcomes_total{outcome=\"skipped_stale\",queue=\"x\"} 4
shardkeep_queue_consumer_restarts_total{queue=\"session-lifecycle\"} 1
shardkeep_retry_rows{state=\"pending\"} 99
garbage line
shardkeep_retry_outcomes_total{outcome=\"applied\"} not-a-number
";
        let counts = parse_counts(text);
        assert_eq!(counts.retry.get("applied"), Some(&12));
        assert_eq!(counts.retry.get("dead_lettered"), Some(&3));
        assert_eq!(counts.journal.get("skipped_stale"), Some(&4));
        assert_eq!(counts.consumer_restarts, 1);
        assert_eq!(counts.retry.len(), 2);
        let mut twice = counts.clone();
        twice.add(&counts);
        assert_eq!(twice.retry.get("applied"), Some(&24));
        assert_eq!(parse_counts(""), ServeCounts::default());
    }
}
