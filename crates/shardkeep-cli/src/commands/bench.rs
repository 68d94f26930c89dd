//! `shardkeep bench`: runs a benchmark in a scratch database and namespace and prints its rates
//! and the ratio lines against the raw engine rates and peers.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::anyhow;
use shardkeep_sim::bench::BenchEnv;
use shardkeep_sim::bench::aging::{self, AgingPlan};
use shardkeep_sim::bench::ladder::{self, LadderBenchConfig};

use crate::cli::{AuditBenchArgs, BenchArgs, BenchCommand, LadderBenchArgs};

/// Runs the chosen benchmark.
pub(crate) async fn run(args: &BenchArgs) -> anyhow::Result<ExitCode> {
    let database_url = super::database_url(&args.postgres)?;
    let redis_url = super::redis_url(args.redis_url.as_deref())?;
    let env = BenchEnv::setup(database_url, redis_url).await?;
    let result = match &args.which {
        BenchCommand::Ladder(ladder) => run_ladder(&env, ladder).await,
        BenchCommand::Audit(audit) => run_audit(&env, database_url, audit).await,
    };
    env.teardown().await;
    result
}

fn per_second(rate: f64) -> String {
    let whole = rate.round() as u64;
    let digits = whole.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    format!("{out:>10}/s")
}

async fn run_ladder(env: &BenchEnv, args: &LadderBenchArgs) -> anyhow::Result<ExitCode> {
    let config = LadderBenchConfig {
        rows: args.rows as usize,
        window: Duration::from_secs(args.seconds),
        batch: args.batch as usize,
        online: args.online as usize,
        sustain: Duration::from_secs(args.sustain_seconds),
    };
    let aged = if args.aging_logins > 0 {
        let logins = args.aging_logins as usize;
        let plan = AgingPlan {
            rewards: logins * 100,
            item_moves: logins * 10,
            logins,
            ..AgingPlan::default()
        };
        let aged = aging::age_character(env, plan).await?;
        println!(
            "aged: a character after {} rewards ({} also as retry jobs), {} item moves and {} \
             logins through the library, aged in {:.1} s; bookkeeping rows left beside it: {}",
            plan.rewards,
            aged.jobs,
            plan.item_moves,
            plan.logins,
            aged.took.as_secs_f64(),
            aged.bookkeeping_rows
        );
        Some(aged)
    } else {
        None
    };
    let fresh_state = aged
        .as_ref()
        .map_or_else(ladder::template_state, |a| a.fresh_state.clone());
    println!(
        "bench ladder: {} rows, {} s per step, batches of {}, state document {} bytes",
        config.rows,
        args.seconds,
        config.batch,
        fresh_state.to_string().len()
    );
    let r = ladder::run_with_state(env, config, &fresh_state).await?;
    print_ladder("", &r);
    if let Some(aged) = aged {
        let (aged_bytes, fresh_bytes) = (
            aged.state.to_string().len(),
            aged.fresh_state.to_string().len(),
        );
        println!(
            "aged: state document {aged_bytes} bytes; a fresh character holding the same items \
             {fresh_bytes} bytes = {:.2}x (goal <= 1.10x)",
            aged_bytes as f64 / fresh_bytes as f64
        );
        let a = ladder::run_with_state(env, config, &aged.state).await?;
        print_ladder("aged ", &a);
        // The aged/fresh ratios compare documents of nearly one size on a shared machine: the
        // throughput steps run three more times each, fresh and aged alternating, and the
        // ratios use each step's median.
        let steps_only = LadderBenchConfig {
            online: 0,
            ..config
        };
        let (mut fresh_runs, mut aged_runs) = (vec![r], vec![a]);
        for _ in 0..3 {
            fresh_runs.push(ladder::run_with_state(env, steps_only, &fresh_state).await?);
            aged_runs.push(ladder::run_with_state(env, steps_only, &aged.state).await?);
        }
        type Step = fn(&ladder::LadderBenchReport) -> f64;
        let steps: [(&str, Step); 4] = [
            ("raw UPDATE one at a time", |r| r.raw_update),
            ("CAS save, single row", |r| r.cas_single),
            ("CAS save, batched", |r| r.cas_batched),
            ("checkpoint write, pipelined", |r| r.checkpoint),
        ];
        for (step, rate) in steps {
            let (aged_rate, fresh_rate) = (median(&aged_runs, rate), median(&fresh_runs, rate));
            println!(
                "ratio: aged / fresh, {step} = {:.2}x (medians of {} runs each: {} vs {}; goal >= 0.90x)",
                aged_rate / fresh_rate,
                aged_runs.len(),
                per_second(aged_rate).trim(),
                per_second(fresh_rate).trim()
            );
        }
        if let (Some(sa), Some(sf)) = (a.sustain, r.sustain) {
            println!(
                "ratio: aged / fresh, sustain checkpoints = {:.2}x, flush rows = {:.2}x, \
                 slowest pulse {:.0} ms vs {:.0} ms (goal >= 0.90x)",
                sa.checkpoints_per_second / sf.checkpoints_per_second,
                sa.flush_rows_per_second / sf.flush_rows_per_second,
                sa.max_pulse_ms,
                sf.max_pulse_ms
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The median of one step's rate over `runs`.
fn median(runs: &[ladder::LadderBenchReport], rate: fn(&ladder::LadderBenchReport) -> f64) -> f64 {
    let mut rates: Vec<f64> = runs.iter().map(rate).collect();
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The rate lines of one ladder run; `label` prefixes them ("aged " for the aged document).
fn print_ladder(label: &str, r: &ladder::LadderBenchReport) {
    let line = |what: &str, rate: f64| println!("{label}{what:<33}{}", per_second(rate));
    line("raw UPDATE, one at a time", r.raw_update);
    line("CAS save, single row", r.cas_single);
    line("CAS save, batched", r.cas_batched);
    line("raw SET, one at a time", r.raw_set);
    line("raw SET, pipelined", r.raw_set_pipelined);
    line("checkpoint write, pipelined", r.checkpoint);
    println!(
        "{label}ratio: batched CAS / raw UPDATE one at a time = {:.1}x (goal >= 10x)",
        r.cas_batched / r.raw_update
    );
    println!(
        "{label}ratio: single-row CAS / raw UPDATE one at a time = {:.2}x",
        r.cas_single / r.raw_update
    );
    println!(
        "{label}ratio: checkpoint write / raw SET one at a time = {:.1}x",
        r.checkpoint / r.raw_set
    );
    println!(
        "{label}ratio: checkpoint write / raw SET pipelined = {:.2}x",
        r.checkpoint / r.raw_set_pipelined
    );
    if let Some(s) = r.sustain {
        println!(
            "{label}sustain: {} online for {:.0} s at 40/240 pulses of 250 ms: {} checkpoints \
             (cadence needs {}), {} flush rows (needs {}); dropped {}, failed {}, slowest pulse \
             {:.0} ms, overruns {}, max queue depth {}",
            s.online,
            s.seconds,
            per_second(s.checkpoints_per_second).trim(),
            per_second(s.checkpoints_needed).trim(),
            per_second(s.flush_rows_per_second).trim(),
            per_second(s.flushes_needed).trim(),
            s.dropped,
            s.failed,
            s.max_pulse_ms,
            s.overruns,
            s.max_queue_depth
        );
        println!(
            "{label}sustain: {} characters {} (goal >= 250,000 with no drops)",
            s.online,
            if s.sustained {
                "SUSTAINED"
            } else {
                "NOT sustained"
            }
        );
    }
}

async fn run_audit(
    env: &BenchEnv,
    database_url: &str,
    args: &AuditBenchArgs,
) -> anyhow::Result<ExitCode> {
    let config = shardkeep_sim::bench::audit::AuditBenchConfig {
        events: args.events as usize,
        burst: args.burst as usize,
        slowdown: Duration::from_millis(args.slowdown_ms),
    };
    println!(
        "bench audit: {} deaths per throughput step; a burst of {} deaths in 1 s against a store slowed by {} ms each way",
        config.events, config.burst, args.slowdown_ms
    );
    let r = shardkeep_sim::bench::audit::run(env, database_url, config)
        .await
        .map_err(|e| anyhow!(e))?;
    println!(
        "auditor, batched (64 per round trip)  {}",
        per_second(r.batched)
    );
    println!(
        "one INSERT per event                  {}",
        per_second(r.single_row)
    );
    println!(
        "ratio: batched auditor / one INSERT per event = {:.1}x (goal >= 10x)",
        r.batched / r.single_row
    );
    println!(
        "slowed store: batched auditor dropped {} of {}; one-row auditor dropped {} of {}",
        r.batched_dropped, r.burst, r.single_row_dropped, r.burst
    );
    Ok(ExitCode::SUCCESS)
}
