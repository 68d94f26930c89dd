//! `shardkeep bench`: runs a benchmark in a scratch database and namespace and prints its rates
//! and the ratio lines against the raw engine rates and peers.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::anyhow;
use shardkeep::bench::BenchEnv;
use shardkeep::bench::ladder::{self, LadderBenchConfig};

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
    println!(
        "bench ladder: {} rows, {} s per step, batches of {}, state document {} bytes",
        config.rows,
        args.seconds,
        config.batch,
        ladder::template_state().to_string().len()
    );
    let r = ladder::run(env, config).await?;
    println!(
        "raw UPDATE, one at a time        {}",
        per_second(r.raw_update)
    );
    println!(
        "CAS save, single row             {}",
        per_second(r.cas_single)
    );
    println!(
        "CAS save, batched                {}",
        per_second(r.cas_batched)
    );
    println!("raw SET, one at a time           {}", per_second(r.raw_set));
    println!(
        "raw SET, pipelined               {}",
        per_second(r.raw_set_pipelined)
    );
    println!(
        "checkpoint write, pipelined      {}",
        per_second(r.checkpoint)
    );
    println!(
        "ratio: batched CAS / raw UPDATE one at a time = {:.1}x (goal >= 10x)",
        r.cas_batched / r.raw_update
    );
    println!(
        "ratio: single-row CAS / raw UPDATE one at a time = {:.2}x",
        r.cas_single / r.raw_update
    );
    println!(
        "ratio: checkpoint write / raw SET one at a time = {:.1}x",
        r.checkpoint / r.raw_set
    );
    println!(
        "ratio: checkpoint write / raw SET pipelined = {:.2}x",
        r.checkpoint / r.raw_set_pipelined
    );
    if let Some(s) = r.sustain {
        println!(
            "sustain: {} online for {:.0} s at 40/240 pulses of 250 ms: {} checkpoints (cadence needs {}), \
             {} flush rows (needs {}); dropped {}, failed {}, slowest pulse {:.0} ms, overruns {}, max queue depth {}",
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
            "sustain: {} characters {} (goal >= 250,000 with no drops)",
            s.online,
            if s.sustained {
                "SUSTAINED"
            } else {
                "NOT sustained"
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_audit(
    env: &BenchEnv,
    database_url: &str,
    args: &AuditBenchArgs,
) -> anyhow::Result<ExitCode> {
    let config = shardkeep::bench::audit::AuditBenchConfig {
        events: args.events as usize,
        burst: args.burst as usize,
        slowdown: Duration::from_millis(args.slowdown_ms),
    };
    println!(
        "bench audit: {} deaths per throughput step; a burst of {} deaths in 1 s against a store slowed by {} ms each way",
        config.events, config.burst, args.slowdown_ms
    );
    let r = shardkeep::bench::audit::run(env, database_url, config)
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
