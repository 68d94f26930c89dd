//! `shardkeep bench hostile-api`: drives a real `serve` process with a mix of valid and
//! invalid signed requests at the highest rate the machine sustains, alongside a steady retry
//! and journal workload, and checks that nothing crashed, no valid request was refused, no
//! invalid one was accepted or changed the stores, and memory stayed flat; prints the p99 of
//! valid requests under load next to an idle baseline measured in the same run.

mod requests;
mod sentinels;
mod serve_child;
mod workload;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::SeedableRng;
use rand::rngs::Xoshiro256PlusPlus;
use serde::Serialize;
use shardkeep::journal::SessionJournal;
use shardkeep::queue::WorkQueueConfig;
use shardkeep_sim::bench::{BenchEnv, Progress, percentile};
use shardkeep_sim::series::{self, Sample};
use tokio_util::sync::CancellationToken;

use requests::{Kind, Request, Targets};
use serve_child::ServeChild;

/// Exit status when a check failed.
const CHECK_FAILED: u8 = 4;
/// How long the idle baseline runs.
const IDLE_WINDOW: Duration = Duration::from_secs(10);
/// Samples of `serve`'s memory over the load (at most one every 2 s).
const RSS_SAMPLES: u32 = 30;

/// Settings of one run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostileConfig {
    /// How long the load runs.
    pub(crate) window: Duration,
    /// Requests in flight at once.
    pub(crate) connections: usize,
}

/// What requests of one kind got.
#[derive(Debug, Default, Clone, Serialize)]
struct KindOutcome {
    sent: u64,
    statuses: BTreeMap<u16, u64>,
    /// Sent but not answered (connection refused or reset, timeout).
    transport_errors: u64,
    /// The first few of those errors.
    transport_examples: Vec<String>,
    unexpected: u64,
    /// Milliseconds of each answered request (valid kinds only).
    #[serde(skip)]
    latencies_ms: Vec<f64>,
}

/// The run's findings.
#[derive(Debug, Default, Serialize)]
struct HostileReport {
    window_secs: f64,
    connections: usize,
    requests: u64,
    requests_per_sec: f64,
    kinds: BTreeMap<Kind, KindOutcome>,
    idle_p50_ms: f64,
    idle_p99_ms: f64,
    load_p50_ms: f64,
    load_p99_ms: f64,
    rss_mib: Vec<(f64, f64)>,
    rss_flat: bool,
    /// `flat`, `GREW` or `not judged`.
    rss_verdict: String,
    stores_unchanged: bool,
    serve_alive: bool,
    retry_jobs_enqueued: u64,
    journal_entries_enqueued: u64,
    retry_jobs_left: i64,
    failures: Vec<String>,
}

/// Runs the load and prints its findings; exit status 4 when a check failed.
pub(crate) async fn run(
    env: BenchEnv,
    config: HostileConfig,
    json: Option<&std::path::Path>,
    progress: &Progress,
) -> anyhow::Result<ExitCode> {
    let outcome = run_in(&env, config, progress).await;
    env.teardown().await;
    let report = outcome?;
    print!("{}", render(&report));
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    Ok(if report.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(CHECK_FAILED)
    })
}

async fn run_in(
    env: &BenchEnv,
    config: HostileConfig,
    progress: &Progress,
) -> anyhow::Result<HostileReport> {
    let journal = SessionJournal::new(env.redis.clone(), WorkQueueConfig::default())?;
    progress.step(
        "hostile",
        "planting dead letters and keys, creating characters",
    );
    let planted = sentinels::plant(env).await?;
    let characters = workload::characters(env).await?;
    let secret = format!("{}", uuid::Uuid::new_v4().simple()).into_bytes();
    let mut serve = ServeChild::start(env, "ops", &secret).await?;
    let before = sentinels::fingerprint(env, &journal, &planted).await?;
    anyhow::ensure!(
        before.complete(&planted),
        "the planted targets are not all there before the load: {before:?}"
    );
    let targets = Arc::new(Targets::new(
        "ops".into(),
        secret,
        planted.retry.clone(),
        planted.journal.clone(),
        characters.clone(),
        env.redis
            .keys()
            .cleanup_targets()
            .iter()
            .map(|t| t.name.to_owned())
            .collect(),
    ));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(config.connections)
        .build()?;

    progress.step(
        "hostile",
        "idle baseline (valid requests, one at a time, nothing else)",
    );
    let idle = drive(&http, &serve.base, &targets, 1, IDLE_WINDOW, true, 7).await;

    progress.step(
        "hostile",
        format!(
            "{} connections for {:?}, valid and invalid, beside a retry and journal workload",
            config.connections, config.window
        ),
    );
    let stop = CancellationToken::new();
    let enqueued = Arc::new(workload::Enqueued::default());
    let work = {
        let (stop, enqueued) = (stop.clone(), Arc::clone(&enqueued));
        let characters = characters.clone();
        let journal = journal.clone();
        async move { workload::run(env, &journal, &characters, &enqueued, stop).await }
    };
    let rss = async {
        let started = Instant::now();
        let mut samples = Vec::new();
        while started.elapsed() < config.window {
            samples.push(Sample {
                at_secs: started.elapsed().as_secs_f64(),
                rss_bytes: serve.rss_bytes(),
                ..Sample::default()
            });
            tokio::time::sleep((config.window / RSS_SAMPLES).min(Duration::from_secs(2))).await;
        }
        samples
    };
    let load = async {
        let outcome = drive(
            &http,
            &serve.base,
            &targets,
            config.connections,
            config.window,
            false,
            11,
        )
        .await;
        stop.cancel();
        outcome
    };
    let ((loaded, elapsed), samples, ()) = tokio::join!(load, rss, work);

    progress.step("hostile", "checking the stores and the server");
    let serve_alive = serve.alive() && serve.healthy(&http).await;
    let after = sentinels::fingerprint(env, &journal, &planted).await?;
    // The fingerprint must see real changes: correctly signed mutations after the load (a
    // retry requeue, a journal requeue, a cleanup that deletes) each show in their own part.
    let mut control_failures = Vec::new();
    let mut last = after.clone();
    let controls = [
        (
            "retry dead letters",
            planted
                .retry
                .first()
                .map(|id| targets.requeue(*id, chrono::Utc::now().timestamp())),
        ),
        (
            "journal dead letters",
            planted
                .journal
                .first()
                .map(|id| targets.journal_requeue(*id, chrono::Utc::now().timestamp())),
        ),
        (
            "keys",
            Some(targets.cleanup_delete("registry", chrono::Utc::now().timestamp())),
        ),
    ];
    for (part, request) in controls {
        let Some(request) = request else {
            control_failures.push(format!("no planted target for the {part} control"));
            continue;
        };
        let status = send(&http, &serve.base, &request).await;
        let now = sentinels::fingerprint(env, &journal, &planted).await?;
        let changed = last.changed(&now);
        if status != Ok(200) || changed != [part] {
            control_failures.push(format!(
                "the {part} control got {status:?} and changed {changed:?}"
            ));
        }
        last = now;
    }
    let retry_jobs_left: i64 = sqlx::query_scalar("SELECT count(*) FROM persistence_retry_jobs")
        .fetch_one(&env.pool)
        .await?;
    serve.stop();

    let mut report = HostileReport {
        window_secs: elapsed.as_secs_f64(),
        connections: config.connections,
        serve_alive,
        stores_unchanged: after == before,
        retry_jobs_enqueued: enqueued.retry_jobs.load(Ordering::Relaxed),
        journal_entries_enqueued: enqueued.journal_entries.load(Ordering::Relaxed),
        retry_jobs_left,
        ..HostileReport::default()
    };
    let valid_latencies = |outcomes: &BTreeMap<Kind, KindOutcome>| -> Vec<f64> {
        outcomes
            .iter()
            .filter(|(k, _)| k.valid())
            .flat_map(|(_, o)| o.latencies_ms.iter().copied())
            .collect()
    };
    let idle_ms = valid_latencies(&idle.0);
    let load_ms = valid_latencies(&loaded);
    report.idle_p50_ms = percentile(&idle_ms, 0.5);
    report.idle_p99_ms = percentile(&idle_ms, 0.99);
    report.load_p50_ms = percentile(&load_ms, 0.5);
    report.load_p99_ms = percentile(&load_ms, 0.99);
    report.requests = loaded.values().map(|o| o.sent).sum();
    report.requests_per_sec = report.requests as f64 / elapsed.as_secs_f64().max(1e-9);
    report.rss_mib = samples
        .iter()
        .filter_map(|s| Some((s.at_secs, s.rss_bytes? as f64 / (1024.0 * 1024.0))))
        .collect();
    let verdict = series::judge(&samples, config.window / 2);
    report.rss_flat = verdict.as_ref().is_some_and(|v| v.stable);
    report.rss_verdict = match &verdict {
        Some(v) if v.stable => "flat".into(),
        Some(_) => "GREW".into(),
        None => "not judged".into(),
    };
    for (phase, outcomes) in [("idle", &idle.0), ("load", &loaded)] {
        for (kind, o) in outcomes {
            if o.unexpected > 0 || o.transport_errors > 0 {
                report.failures.push(format!(
                    "{phase}: {kind:?}: {} answered outside {:?} (answers {:?}), {} unanswered {:?}",
                    o.unexpected,
                    kind.expected(),
                    o.statuses,
                    o.transport_errors,
                    o.transport_examples
                ));
            }
        }
    }
    if !report.stores_unchanged {
        report.failures.push(format!(
            "the targets changed: before {before:?}, after {after:?}"
        ));
    }
    report.failures.extend(control_failures);
    if !serve_alive {
        report
            .failures
            .push("serve died or stopped answering".into());
    }
    match &verdict {
        Some(v) if !v.stable => report
            .failures
            .push(format!("serve's memory grew: {:?}", v.grew)),
        None => report
            .failures
            .push("too few memory samples to judge".into()),
        Some(_) => {}
    }
    if enqueued.failures.load(Ordering::Relaxed) > 0 {
        report.failures.push(format!(
            "the workload could not enqueue {} items",
            enqueued.failures.load(Ordering::Relaxed)
        ));
    }
    report.kinds = loaded;
    Ok(report)
}

/// Sends requests from `connections` loops for `window`; returns what each kind got and the
/// time taken.
async fn drive(
    http: &reqwest::Client,
    base: &str,
    targets: &Arc<Targets>,
    connections: usize,
    window: Duration,
    valid_only: bool,
    seed: u64,
) -> (BTreeMap<Kind, KindOutcome>, Duration) {
    let started = Instant::now();
    let loops = (0..connections).map(|i| {
        let (http, targets, base) = (http.clone(), Arc::clone(targets), base.to_owned());
        async move {
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed * 1000 + i as u64);
            let mut outcomes: BTreeMap<Kind, KindOutcome> = BTreeMap::new();
            while started.elapsed() < window {
                let drawn = Kind::draw(&mut rng, valid_only);
                let now = chrono::Utc::now().timestamp();
                let (kind, request) = targets.build(drawn, &mut rng, now);
                let sent_at = Instant::now();
                let status = send(&http, &base, &request).await;
                let ms = sent_at.elapsed().as_secs_f64() * 1000.0;
                let outcome = outcomes.entry(kind).or_default();
                outcome.sent += 1;
                match status {
                    Ok(status) => {
                        *outcome.statuses.entry(status).or_default() += 1;
                        if !kind.expected().contains(&status) {
                            outcome.unexpected += 1;
                        }
                        if kind.valid() {
                            outcome.latencies_ms.push(ms);
                            if status == 200 {
                                targets.accepted(request);
                            }
                        }
                    }
                    Err(error) => {
                        outcome.transport_errors += 1;
                        if outcome.transport_examples.len() < 3 {
                            outcome.transport_examples.push(error);
                        }
                    }
                }
            }
            outcomes
        }
    });
    let mut merged: BTreeMap<Kind, KindOutcome> = BTreeMap::new();
    for outcomes in futures::future::join_all(loops).await {
        for (kind, o) in outcomes {
            let m = merged.entry(kind).or_default();
            m.sent += o.sent;
            m.transport_errors += o.transport_errors;
            m.transport_examples.extend(o.transport_examples);
            m.unexpected += o.unexpected;
            m.latencies_ms.extend(o.latencies_ms);
            for (status, n) in o.statuses {
                *m.statuses.entry(status).or_default() += n;
            }
        }
    }
    (merged, started.elapsed())
}

/// Sends `request`; the status, or why no answer came.
async fn send(http: &reqwest::Client, base: &str, request: &Request) -> Result<u16, String> {
    let mut builder = http
        .request(request.method.clone(), format!("{base}{}", request.path))
        .body(request.body.clone());
    if !request.body.is_empty() {
        builder = builder.header("content-type", "application/json");
    }
    for (name, value) in &request.headers {
        builder = builder.header(*name, value);
    }
    let response = builder.send().await.map_err(|e| {
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            text.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        text
    })?;
    let status = response.status().as_u16();
    // Read the body so the connection goes back to the pool.
    let _ = response.bytes().await;
    Ok(status)
}

fn render(r: &HostileReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "hostile load on serve: {:.0} s, {} connections, {} requests ({:.0}/s)",
        r.window_secs, r.connections, r.requests, r.requests_per_sec
    );
    let _ = writeln!(
        out,
        "{:<16} {:>8} {:>10} {:<28} {:>10}",
        "kind", "sent", "expected", "statuses", "unexpected"
    );
    for (kind, o) in &r.kinds {
        let statuses: Vec<String> = o.statuses.iter().map(|(s, n)| format!("{s}×{n}")).collect();
        let expected: Vec<String> = kind.expected().iter().map(u16::to_string).collect();
        let _ = writeln!(
            out,
            "{:<16} {:>8} {:>10} {:<28} {:>10}",
            format!("{kind:?}"),
            o.sent,
            expected.join(","),
            statuses.join(" "),
            o.unexpected + o.transport_errors
        );
    }
    let _ = writeln!(
        out,
        "valid requests   p50 {:.2} ms, p99 {:.2} ms under load; idle baseline p50 {:.2} ms, p99 {:.2} ms ({:.1}× idle p99)",
        r.load_p50_ms,
        r.load_p99_ms,
        r.idle_p50_ms,
        r.idle_p99_ms,
        r.load_p99_ms / r.idle_p99_ms.max(1e-9)
    );
    let first = r.rss_mib.first().map_or(0.0, |s| s.1);
    let last = r.rss_mib.last().map_or(0.0, |s| s.1);
    let peak = r.rss_mib.iter().map(|s| s.1).fold(0.0, f64::max);
    let _ = writeln!(
        out,
        "serve RSS        {first:.1} → {last:.1} MiB (peak {peak:.1}): {}",
        r.rss_verdict
    );
    let _ = writeln!(
        out,
        "stores           {} (correctly signed requeues and a delete afterwards show in them); serve {}",
        if r.stores_unchanged {
            "the targets of every forged request are unchanged"
        } else {
            "CHANGED"
        },
        if r.serve_alive {
            "alive and healthy"
        } else {
            "DOWN"
        }
    );
    let _ = writeln!(
        out,
        "workload         {} retry jobs and {} journal entries enqueued during the load; {} retry jobs left",
        r.retry_jobs_enqueued, r.journal_entries_enqueued, r.retry_jobs_left
    );
    if r.failures.is_empty() {
        let _ = writeln!(out, "verdict          every check holds");
    } else {
        for failure in &r.failures {
            let _ = writeln!(out, "FAILED           {failure}");
        }
    }
    out
}
