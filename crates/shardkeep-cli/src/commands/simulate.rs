//! `shardkeep simulate`: runs the simulator with a live progress display, prints the report
//! table, writes the JSON report when asked, and exits 3 when an invariant failed.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use shardkeep_sim::{self as sim, SimConfig, SimProgress};

use crate::cli::SimulateArgs;

/// Exit status of a run whose invariants failed.
const INVARIANTS_FAILED: u8 = 3;
/// Exit status of a run that held its invariants but grew where `--require-stable` forbids.
const UNSTABLE: u8 = 4;

/// Runs the simulation.
pub(crate) async fn run(args: &SimulateArgs) -> anyhow::Result<ExitCode> {
    let sqlite_url = args
        .postgres
        .database_url
        .as_deref()
        .is_some_and(shardkeep::backend::sqlite::is_sqlite_url);
    if sqlite_url {
        super::refuse_mixed_stores()?;
    }
    let embedded = args.embedded || sqlite_url;
    let servers = if embedded {
        None
    } else {
        let database_url = super::postgres_url(&args.postgres)?;
        let redis_url = super::redis_url(args.redis_url.as_deref())?;
        Some((database_url, redis_url))
    };
    // Fail before a long run rather than after it (an aborted run leaves valid empty files).
    for (path, placeholder) in [(&args.report, &b"{}"[..]), (&args.plot, &b""[..])] {
        if let Some(path) = path {
            std::fs::write(path, placeholder)
                .with_context(|| format!("cannot write to {}", path.display()))?;
        }
    }
    let config = SimConfig {
        duration: args.duration,
        shards: args.shards as usize,
        players: args.players as usize,
        seed: args.seed,
        faults: args.faults.clone(),
        keep: args.keep,
        pg_pooler: args.postgres.pg_pooler,
        serves: args.serves as usize,
        serve_binary: if args.serves > 0 {
            Some(std::env::current_exe().context("finding this binary to run serve processes")?)
        } else {
            None
        },
        embedded,
        ..SimConfig::default()
    };
    // A run that cannot start says so on one line, before anything else.
    config.validate()?;
    eprintln!(
        "simulating {} players on {} shards for {:?} (seed {}, faults: {})",
        config.players, config.shards, config.duration, config.seed, config.faults
    );
    let display = Display::new();
    let report = match servers {
        Some((database_url, redis_url)) => {
            sim::run(config, database_url, redis_url, move |p| display.show(p)).await?
        }
        None => {
            eprintln!("embedded mode: everything in a scratch SQLite file, no Postgres or Redis");
            sim::run_embedded(config, move |p| display.show(p)).await?
        }
    };
    println!("{report}");
    if let Some(path) = &args.report {
        let json = serde_json::to_vec_pretty(&report)?;
        std::fs::write(path, json)
            .with_context(|| format!("cannot write the report to {}", path.display()))?;
        eprintln!("report written to {}", path.display());
    }
    if let Some(path) = &args.plot {
        let title = format!(
            "shardkeep simulate: {} players, {:?}, seed {}",
            args.players, args.duration, args.seed
        );
        // A plot that cannot be drawn is reported; the run's own verdict still sets the status.
        match sim::plot::draw(&report.series, &title, path) {
            Ok(()) => eprintln!("plot written to {}", path.display()),
            Err(err) => {
                eprintln!("error: {err}");
                if report.passed {
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
    }
    // A run too short to judge passes `--require-stable` on its invariants alone.
    let unstable = match &report.series.stability {
        Some(verdict) => !verdict.stable,
        None => args.duration >= sim::series::MIN_JUDGED_RUN,
    };
    Ok(if !report.passed {
        ExitCode::from(INVARIANTS_FAILED)
    } else if args.require_stable && unstable {
        eprintln!("the run held its invariants but is not stable (see the stability lines)");
        ExitCode::from(UNSTABLE)
    } else {
        ExitCode::SUCCESS
    })
}

/// A progress bar on a terminal; a line every few seconds otherwise (CI logs).
struct Display {
    bar: Option<ProgressBar>,
    last_line: Mutex<Option<Instant>>,
}

impl Display {
    fn new() -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(0);
            let style = ProgressStyle::with_template("{spinner} [{bar:30}] {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Self {
            bar,
            last_line: Mutex::new(None),
        }
    }

    fn show(&self, p: &SimProgress) {
        let line = format!(
            "{:<6} {:>5.1}/{:.0}s  online {:>6}  saves {:>6}/s  retry depth {:>5}  journal depth {:>5}  faults {}",
            p.phase,
            p.elapsed.as_secs_f64(),
            p.duration.as_secs_f64(),
            p.online,
            p.saves_per_sec,
            p.retry_depth,
            p.journal_depth,
            p.faults_injected
        );
        if let Some(bar) = &self.bar {
            bar.set_length(p.duration.as_millis() as u64);
            bar.set_position(p.elapsed.as_millis() as u64);
            bar.set_message(line);
            if p.phase == "check" {
                bar.finish_and_clear();
            }
            return;
        }
        let Ok(mut last) = self.last_line.lock() else {
            return;
        };
        let due = last.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) || p.phase != "play";
        if due {
            eprintln!("{line}");
            *last = Some(Instant::now());
        }
    }
}
