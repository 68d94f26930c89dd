//! `shardkeep bench`: runs benchmarks in scratch databases and namespaces and prints one table
//! of every figure against what it is compared with in the same run. Progress goes to stderr.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use shardkeep_sim::bench::all::{self, AllConfig, Engines};
use shardkeep_sim::bench::documents::{self, DocumentKind};
use shardkeep_sim::bench::{
    Progress, Table, audit, backlog, capacity, depth, embedded_report, ladder, login, queue, retry,
};

use crate::cli::{BenchArgs, BenchCommand, BenchSize, LadderBenchArgs};

/// Exit status of `bench all --require-goals` when a goal was not met.
const GOALS_NOT_MET: u8 = 4;

/// Runs the chosen benchmark.
pub(crate) async fn run(args: &BenchArgs) -> anyhow::Result<ExitCode> {
    let url = super::database_url(&args.postgres)?;
    if shardkeep::backend::sqlite::is_sqlite_url(url) {
        return run_embedded(args).await;
    }
    let database_url = super::postgres_url(&args.postgres)?;
    let redis_url = super::redis_url(args.redis_url.as_deref())?;
    if shardkeep::backend::redis::redis_seeds(redis_url).is_ok_and(|s| s.len() > 1) {
        anyhow::bail!(
            "REDIS_URL names a cluster; the benchmarks' peers speak to one server: set REDIS_URL \
             to a standalone server and REDIS_CLUSTER_URL to the cluster"
        );
    }
    let cluster_url = args
        .redis_cluster_url
        .as_deref()
        .filter(|u| !u.trim().is_empty());
    let engines = Engines::new(database_url, redis_url).with_cluster(cluster_url);
    let progress = Progress::stderr();
    let mut table = Table::default();
    match &args.which {
        BenchCommand::All(all_args) => {
            let config = match all_args.size {
                BenchSize::Full => AllConfig::full(),
                BenchSize::Smoke => AllConfig::smoke(),
            };
            let report = all::run(&engines, config, &progress).await?;
            print!("{}", report.table.render());
            if let Some(path) = &all_args.json {
                let json = serde_json::to_vec_pretty(&report)?;
                std::fs::write(path, json)
                    .with_context(|| format!("writing the report to {}", path.display()))?;
            }
            let unmet = report.table.unmet().count();
            if all_args.require_goals && unmet > 0 {
                return Ok(ExitCode::from(GOALS_NOT_MET));
            }
            return Ok(ExitCode::SUCCESS);
        }
        BenchCommand::Ladder(a) => run_ladder(&engines, a, &progress, &mut table).await?,
        BenchCommand::Capacity(a) => {
            for (kind, online, embedded) in [
                (DocumentKind::Fresh, a.fresh, false),
                (DocumentKind::Realistic, a.realistic, false),
                (DocumentKind::Fresh, a.embedded, true),
            ] {
                if online == 0 {
                    continue;
                }
                let state = match kind {
                    DocumentKind::Realistic => documents::realistic_state(),
                    _ => documents::template_state(),
                };
                let config = capacity::CapacityConfig {
                    online: online as usize,
                    sustain: Duration::from_secs(a.seconds),
                    embedded,
                };
                let env = engines.env().await?;
                let r = capacity::run(Some(&env), config, kind, &state, &progress).await;
                env.teardown().await;
                table.rows.extend(capacity::rows(&r?));
            }
        }
        BenchCommand::Login(a) => {
            let config = login::LoginConfig {
                players: a.players as usize,
                pool: a.pool,
            };
            let mut report = all::AllReport::default();
            all::login_all(
                &engines,
                config,
                a.aging_logins as usize,
                &progress,
                &mut report,
            )
            .await?;
            table.extend(report.table);
        }
        BenchCommand::Queue(a) => {
            let config = queue::QueueBenchConfig {
                entries: a.entries as usize,
                producers: a.producers as usize,
                rounds: a.rounds as usize,
            };
            let rates = queue::run(redis_url, config, &progress).await?;
            table.rows.extend(queue::rows(&rates, ""));
            if let Some(cluster) = cluster_url {
                let on_cluster = queue::cluster_run(cluster, config, &progress).await?;
                table.rows.extend(queue::cluster_rows(&on_cluster, &rates));
            }
        }
        BenchCommand::Depth(a) => {
            let config = depth::DepthConfig {
                consumers: a.consumers as usize,
                reports: a.reports as usize,
            };
            let env = engines.env().await?;
            let r = depth::run(&env, config, &progress).await;
            env.teardown().await;
            table.rows.extend(depth::rows(&r?));
        }
        BenchCommand::Retry(a) => {
            let config = retry::RetryBenchConfig {
                jobs: a.jobs as usize,
                producers: a.producers as usize,
            };
            let env = engines.env().await?;
            let r = retry::run(&env, config, &progress).await;
            env.teardown().await;
            table.rows.extend(retry::rows(&r?));
        }
        BenchCommand::Backlog(a) => {
            let config = backlog::BacklogConfig {
                queued: a.queued as usize,
                jobs: a.jobs as usize,
                producers: a.producers as usize,
            };
            let env = engines.env().await?;
            let r = backlog::run(&env, config, &progress).await;
            env.teardown().await;
            table.rows.extend(backlog::rows(&r?));
        }
        BenchCommand::HostileApi(a) => {
            let config = super::hostile::HostileConfig {
                window: Duration::from_secs(a.seconds),
                connections: a.connections as usize,
            };
            let env = engines.env().await?;
            return super::hostile::run(env, config, a.json.as_deref(), &progress).await;
        }
        BenchCommand::Audit(a) => {
            let config = audit::AuditBenchConfig {
                events: a.events as usize,
                burst: a.burst as usize,
                slowdown: Duration::from_millis(a.slowdown_ms),
            };
            let env = engines.env().await?;
            let r = audit::run(&env, database_url, config, &progress).await;
            env.teardown().await;
            let r = r.map_err(anyhow::Error::msg)?;
            table.rows.extend(all::audit_rows(&r));
        }
    }
    print!("{}", table.render());
    Ok(ExitCode::SUCCESS)
}

async fn run_ladder(
    engines: &Engines,
    args: &LadderBenchArgs,
    progress: &Progress,
    table: &mut Table,
) -> anyhow::Result<()> {
    let config = ladder::LadderBenchConfig {
        rows: args.rows as usize,
        window: Duration::from_secs(args.seconds),
        batch: args.batch as usize,
        rounds: args.rounds as usize,
    };
    let mut report = all::AllReport::default();
    all::ladder_all(
        engines,
        config,
        args.aging_logins as usize,
        progress,
        &mut report,
    )
    .await?;
    table.extend(report.table);
    Ok(())
}

/// `bench all` in embedded mode (`DATABASE_URL=sqlite:…`, no Redis): the embedded report, on
/// scratch files beside nothing else. The other benchmarks compare against the servers and
/// need them.
async fn run_embedded(args: &BenchArgs) -> anyhow::Result<ExitCode> {
    super::refuse_mixed_stores()?;
    let BenchCommand::All(all_args) = &args.which else {
        anyhow::bail!(
            "DATABASE_URL names a SQLite file (embedded mode): only `bench all` runs on it (the \
             embedded report); the other benchmarks need postgres:// and REDIS_URL"
        );
    };
    let config = match all_args.size {
        BenchSize::Full => embedded_report::EmbeddedBenchConfig::full(),
        BenchSize::Smoke => embedded_report::EmbeddedBenchConfig::smoke(),
    };
    let progress = Progress::stderr();
    let table = embedded_report::run(config, &progress).await?;
    print!("{}", table.render());
    if let Some(path) = &all_args.json {
        let json = serde_json::to_vec_pretty(&serde_json::json!({
            "mode": "embedded",
            "rows": table.rows,
        }))?;
        std::fs::write(path, json)
            .with_context(|| format!("writing the report to {}", path.display()))?;
    }
    if all_args.require_goals && table.unmet().count() > 0 {
        return Ok(ExitCode::from(GOALS_NOT_MET));
    }
    Ok(ExitCode::SUCCESS)
}
