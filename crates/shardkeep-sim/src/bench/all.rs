//! `shardkeep bench all`: every benchmark in one process against the same Postgres and Redis,
//! each in a scratch database and namespace of its own, and one table of every figure against
//! what it is compared with in the same run.

use std::time::Duration;

use super::aging::{self, AgingPlan};
use super::audit::{self, AuditBenchConfig, AuditBenchReport};
use super::backlog::{self, BacklogConfig, BacklogReport};
use super::capacity::{self, CapacityConfig, CapacityReport};
use super::depth::{self, DepthConfig, DepthReport};
use super::documents::{self, DocumentKind};
use super::ladder::{self, LadderBenchConfig, LadderBenchReport};
use super::login::{self, LoginConfig, LoginReport};
use super::queue::{self, QueueBenchConfig, QueueRates};
use super::retry::{self, RetryBenchConfig, RetryReport};
use super::{BenchEnv, BenchError, Goal, Progress, Row, Table, Unit};

/// Sizes of every benchmark.
#[derive(Debug, Clone, Copy)]
pub struct AllConfig {
    /// The ladder's throughput steps.
    pub ladder: LadderBenchConfig,
    /// Sessions of the aged character (each a login, 100 rewards, 10 item moves, a flush).
    pub aging_logins: usize,
    /// Online characters with the fresh template document.
    pub capacity_fresh: usize,
    /// Online characters with the realistic 4 KB document.
    pub capacity_realistic: usize,
    /// Online characters with the fresh document on the embedded store (one SQLite file).
    pub capacity_embedded: usize,
    /// How long each capacity run goes at real pulse speed.
    pub sustain: Duration,
    /// The work queue.
    pub queue: QueueBenchConfig,
    /// Retry jobs end to end.
    pub retry: RetryBenchConfig,
    /// Retry jobs with a backlog.
    pub backlog: BacklogConfig,
    /// The login storm.
    pub login: LoginConfig,
    /// The journal depth report.
    pub depth: DepthConfig,
    /// The death storm.
    pub audit: AuditBenchConfig,
}

impl AllConfig {
    /// The sizes the goals are stated for.
    pub fn full() -> Self {
        Self {
            ladder: LadderBenchConfig {
                rows: 10_000,
                window: Duration::from_secs(2),
                batch: 1024,
                rounds: 3,
            },
            aging_logins: 1_000,
            capacity_fresh: 500_000,
            capacity_realistic: 100_000,
            capacity_embedded: 200_000,
            sustain: Duration::from_secs(70),
            queue: QueueBenchConfig {
                entries: 100_000,
                producers: 32,
                rounds: 3,
            },
            retry: RetryBenchConfig {
                jobs: 20_000,
                producers: 8,
            },
            backlog: BacklogConfig {
                queued: 1_000_000,
                jobs: 20_000,
                producers: 8,
            },
            login: LoginConfig {
                players: 10_000,
                pool: 16,
            },
            depth: DepthConfig {
                consumers: 10_000,
                reports: 2_000,
            },
            audit: AuditBenchConfig {
                events: 20_000,
                burst: 2_000,
                slowdown: Duration::from_millis(20),
            },
        }
    }

    /// Tiny sizes: every step runs, in seconds (the test suite's smoke run).
    pub fn smoke() -> Self {
        Self {
            ladder: LadderBenchConfig {
                rows: 200,
                window: Duration::from_millis(150),
                batch: 64,
                rounds: 1,
            },
            aging_logins: 5,
            // Enough characters that the 6 pulses of the run reach flushes (one per 240 pulses
            // each): 100 gave 2.5 expected and sometimes none.
            capacity_fresh: 960,
            capacity_realistic: 720,
            capacity_embedded: 960,
            sustain: Duration::from_millis(1_500),
            queue: QueueBenchConfig {
                entries: 300,
                producers: 2,
                rounds: 1,
            },
            retry: RetryBenchConfig {
                jobs: 400,
                producers: 2,
            },
            backlog: BacklogConfig {
                queued: 2_000,
                jobs: 200,
                producers: 2,
            },
            login: LoginConfig {
                players: 100,
                pool: 4,
            },
            depth: DepthConfig {
                consumers: 20,
                reports: 20,
            },
            audit: AuditBenchConfig {
                events: 200,
                burst: 50,
                slowdown: Duration::from_millis(2),
            },
        }
    }
}

/// Every benchmark's own findings, beside the table (the `--json` file holds both).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct AllReport {
    /// The table.
    pub table: Table,
    /// Ladder throughput, by document.
    pub ladder: Vec<(DocumentKind, LadderBenchReport)>,
    /// Aged document bytes against a fresh one holding the same items.
    pub aged_bytes: Option<(usize, usize)>,
    /// Capacity runs.
    pub capacity: Vec<CapacityReport>,
    /// Work queue, by consumers.
    pub queue: Vec<QueueRates>,
    /// Work queue on the Redis Cluster, by consumers (empty when none was named).
    pub queue_cluster: Vec<QueueRates>,
    /// Journal depth reports.
    pub depth: Option<DepthReport>,
    /// Retry jobs.
    pub retry: Option<RetryReport>,
    /// Retry jobs with a backlog.
    pub backlog: Option<BacklogReport>,
    /// Login storms, by document.
    pub login: Vec<LoginReport>,
    /// The death storm.
    pub audit: Option<AuditBenchReport>,
}

/// Where the engines are, and the scratch databases and namespaces used on them so far.
#[derive(Debug, Default)]
pub struct Engines {
    /// Postgres (the scratch databases are created beside its database).
    pub database_url: String,
    /// Redis (one server).
    pub redis_url: String,
    /// A Redis Cluster the queue benchmark also runs on, when named.
    pub redis_cluster_url: Option<String>,
    used: std::sync::Mutex<Vec<(String, String)>>,
}

impl Engines {
    /// The engines at these URLs.
    pub fn new(database_url: &str, redis_url: &str) -> Self {
        Self {
            database_url: database_url.to_owned(),
            redis_url: redis_url.to_owned(),
            redis_cluster_url: None,
            used: Default::default(),
        }
    }

    /// The same engines, the queue benchmark also running on the cluster at `url`.
    pub fn with_cluster(mut self, url: Option<&str>) -> Self {
        self.redis_cluster_url = url.map(str::to_owned);
        self
    }

    /// A fresh scratch database and namespace.
    pub async fn env(&self) -> Result<BenchEnv, BenchError> {
        let env = BenchEnv::setup(&self.database_url, &self.redis_url).await?;
        if let Ok(mut used) = self.used.lock() {
            used.push((
                env.database().to_owned(),
                env.redis.keys().namespace().to_owned(),
            ));
        }
        Ok(env)
    }

    /// Every scratch database and namespace created so far (each removed after its run).
    pub fn scratch(&self) -> Vec<(String, String)> {
        self.used.lock().map(|u| u.clone()).unwrap_or_default()
    }

    /// Runs `bench` in a scratch environment of its own, tearing it down whatever happens.
    async fn scoped<T, F>(&self, bench: F) -> Result<T, BenchError>
    where
        F: AsyncFnOnce(&BenchEnv) -> Result<T, BenchError>,
    {
        let env = self.env().await?;
        let result = bench(&env).await;
        env.teardown().await;
        result
    }
}

/// Runs every benchmark; the table holds every row.
pub async fn run(
    engines: &Engines,
    config: AllConfig,
    progress: &Progress,
) -> Result<AllReport, BenchError> {
    let mut report = AllReport::default();
    ladder_all(
        engines,
        config.ladder,
        config.aging_logins,
        progress,
        &mut report,
    )
    .await?;

    progress.step("queue", "standalone Redis, 1 and 4 consumers");
    let rates = queue::run(&engines.redis_url, config.queue, progress).await?;
    report.table.rows.extend(queue::rows(&rates, ""));
    if let Some(cluster) = &engines.redis_cluster_url {
        progress.step("queue", "Redis Cluster, 1 and 4 consumers");
        let on_cluster = queue::cluster_run(cluster, config.queue, progress).await?;
        report
            .table
            .rows
            .extend(queue::cluster_rows(&on_cluster, &rates));
        report.queue_cluster = on_cluster;
    }
    report.queue = rates;

    let d = engines
        .scoped(async |env| depth::run(env, config.depth, progress).await)
        .await?;
    report.table.rows.extend(depth::rows(&d));
    report.depth = Some(d);

    let r = engines
        .scoped(async |env| retry::run(env, config.retry, progress).await)
        .await?;
    report.table.rows.extend(retry::rows(&r));
    report.retry = Some(r);

    let b = engines
        .scoped(async |env| backlog::run(env, config.backlog, progress).await)
        .await?;
    report.table.rows.extend(backlog::rows(&b));
    report.backlog = Some(b);

    login_all(
        engines,
        config.login,
        config.aging_logins,
        progress,
        &mut report,
    )
    .await?;

    let a = engines
        .scoped(async |env| {
            audit::run(env, &engines.database_url, config.audit, progress)
                .await
                .map_err(BenchError::Other)
        })
        .await?;
    report.table.rows.extend(audit_rows(&a));
    report.audit = Some(a);

    for (kind, online, embedded) in [
        (DocumentKind::Fresh, config.capacity_fresh, false),
        (DocumentKind::Realistic, config.capacity_realistic, false),
        (DocumentKind::Fresh, config.capacity_embedded, true),
    ] {
        let state = match kind {
            DocumentKind::Realistic => documents::realistic_state(),
            _ => documents::template_state(),
        };
        let run = CapacityConfig {
            online,
            sustain: config.sustain,
            embedded,
        };
        let c = engines
            .scoped(async |env| capacity::run(Some(env), run, kind, &state, progress).await)
            .await?;
        report.table.rows.extend(capacity::rows(&c));
        report.capacity.push(c);
    }
    Ok(report)
}

/// The death storm's rows.
pub fn audit_rows(a: &AuditBenchReport) -> Vec<Row> {
    vec![
        Row::higher_is_better(
            "audit",
            "death storm, batched auditor (64 per round trip)",
            a.batched,
            "one INSERT per event",
            a.single_row,
            Unit::PerSecond,
            Goal::AtLeast(10.0),
        ),
        // Context: what a burst against a slowed store costs each (the auditor's bound drops
        // rather than stalls the shard; none is a durability record).
        Row::lower_is_better(
            "audit",
            format!(
                "deaths dropped of a burst of {}, slowed store, batched",
                a.burst
            ),
            a.batched_dropped as f64,
            "one-row auditor",
            a.single_row_dropped as f64,
            Unit::Count,
            Goal::None,
        ),
    ]
}

/// The ladder with the fresh, the aged (after `aging_logins` sessions; 0 skips it) and the
/// realistic document, each in a scratch database of its own so no run inherits another's
/// table.
pub async fn ladder_all(
    engines: &Engines,
    config: LadderBenchConfig,
    aging_logins: usize,
    progress: &Progress,
    report: &mut AllReport,
) -> Result<(), BenchError> {
    let mut documents = vec![(DocumentKind::Fresh, aging::template_with_ids())];
    if aging_logins > 0 {
        let aged = engines
            .scoped(async |env| {
                progress.step(
                    "aging",
                    format!("aging a character through {aging_logins} sessions of the library"),
                );
                let plan = AgingPlan {
                    rewards: aging_logins * 100,
                    item_moves: aging_logins * 10,
                    logins: aging_logins,
                    ..AgingPlan::default()
                };
                let aged = aging::age_character(env, plan, progress).await?;
                report.table.note(format!(
                    "aged character: {} rewards ({} also as retry jobs), {} item moves, {} logins, \
                     aged in {:.1} s; {} bookkeeping rows left beside it",
                    plan.rewards,
                    aged.jobs,
                    plan.item_moves,
                    plan.logins,
                    aged.took.as_secs_f64(),
                    aged.bookkeeping_rows
                ));
                Ok(aged)
            })
            .await?;
        let (aged_bytes, fresh_bytes) = (
            aged.state.to_string().len(),
            aged.fresh_state.to_string().len(),
        );
        report.table.push(Row::lower_is_better(
            "aging",
            "aged state document",
            aged_bytes as f64,
            "a fresh document holding the same items",
            fresh_bytes as f64,
            Unit::Bytes,
            Goal::AtLeast(1.0 / 1.1),
        ));
        report.aged_bytes = Some((aged_bytes, fresh_bytes));
        documents = vec![
            (DocumentKind::Fresh, aged.fresh_state),
            (DocumentKind::Aged, aged.state),
        ];
    }
    documents.push((DocumentKind::Realistic, documents::realistic_state()));
    let mut fresh = None;
    for (kind, state) in documents {
        progress.step(
            "ladder",
            format!("{} document, {} rows", kind.label(), config.rows),
        );
        let r = engines
            .scoped(async |env| ladder::run_with_state(env, config, &state, progress).await)
            .await?;
        report.table.rows.extend(ladder::rows(kind, &r));
        match (kind, &fresh) {
            (DocumentKind::Fresh, _) => fresh = Some(r),
            (DocumentKind::Aged, Some(f)) => report.table.rows.extend(ladder::aged_rows(&r, f)),
            _ => {}
        }
        report.ladder.push((kind, r));
    }
    Ok(())
}

/// Login storms with the fresh and with the aged document (after up to 100 of `aging_logins`
/// sessions; 0 skips it), each in a scratch database of its own.
pub async fn login_all(
    engines: &Engines,
    config: LoginConfig,
    aging_logins: usize,
    progress: &Progress,
    report: &mut AllReport,
) -> Result<(), BenchError> {
    let mut documents = vec![(DocumentKind::Fresh, documents::template_state())];
    if aging_logins > 0 {
        let logins = aging_logins.min(100);
        let aged = engines
            .scoped(async |env| {
                let plan = AgingPlan {
                    rewards: logins * 100,
                    item_moves: logins * 10,
                    logins,
                    ..AgingPlan::default()
                };
                progress.step(
                    "aging",
                    format!("a veteran for the login storm ({logins} sessions)"),
                );
                Ok(aging::age_character(env, plan, progress).await?.state)
            })
            .await?;
        documents.push((DocumentKind::Aged, aged));
    }
    for (kind, state) in documents {
        let l = engines
            .scoped(async |env| login::run(env, config, kind, &state, progress).await)
            .await?;
        report.table.rows.extend(login::rows(&l));
        report.login.push(l);
    }
    Ok(())
}
