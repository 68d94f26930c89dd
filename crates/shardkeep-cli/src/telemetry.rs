//! Logging setup: `RUST_LOG` filters (by default `info,sqlx=warn`; `error` for the simulator), text or JSON lines on stderr.

use tracing_subscriber::EnvFilter;

use crate::cli::{LogArgs, LogFormat};

/// Installs the global subscriber; `default_filter` applies when `RUST_LOG` is unset.
pub(crate) fn init(args: &LogArgs, default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    if let Err(err) = result {
        eprintln!("warning: logging was already initialised: {err}");
    }
}
