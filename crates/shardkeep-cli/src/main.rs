//! The `shardkeep` binary: a thin layer of argument parsing over the library.
//!
//! Layout: `cli` declares the commands and shared options, `telemetry` sets up logging, and
//! `commands/` holds one file per subcommand.

mod cli;
mod commands;
mod telemetry;

use std::process::ExitCode;

use clap::Parser;

// Zones allocate snapshots that the saver frees on another thread; a thread-caching allocator
// keeps that hand-off from serialising on the system allocator's arena locks.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    // The simulator injects faults on purpose: their warnings would bury the progress display
    // and the report, so it logs errors only unless RUST_LOG says otherwise.
    let default_filter = match cli.command {
        cli::Command::Simulate(_) => "error",
        _ => "info,sqlx=warn",
    };
    telemetry::init(&cli.log, default_filter);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(commands::run(cli.command)) {
        Ok(code) => code,
        Err(err) => {
            // One line, no backtrace: the chain of causes joined with ": ".
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
