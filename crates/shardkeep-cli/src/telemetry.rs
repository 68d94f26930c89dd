//! Logging setup: `RUST_LOG` filters (default `info,sqlx=warn`), text or JSON lines on stderr.

use tracing_subscriber::EnvFilter;

use crate::cli::{LogArgs, LogFormat};

/// Installs the global subscriber.
pub(crate) fn init(args: &LogArgs) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
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
