//! `arena`: a small TCP game server built on shardkeep's public API, one process per shard.
//!
//! Players speak a line protocol (`nc 127.0.0.1 7001` works):
//!
//! ```text
//! login <name>       log in (created on first login), claimed and loaded from the freshest copy
//! fight              +10 xp, in memory (saved at the cadences)
//! loot <item>        +5 money and one item, durable before the reply ("saved" or "queued")
//! look               the fighter
//! save               flush now and wait for it
//! travel <shard>     hand the fighter to another shard: answers "travel <token> <address>"
//! arrive <token>     (on the other shard) take the handoff and play on
//! quit               final save, then the connection closes
//! ```
//!
//! The process builds [`shardkeep::Services`] with its model, runs the workers (retry jobs, the
//! journal, maintenance) and shardkeep's live-copy runtime, which keeps every fighter online
//! durable; the game only plays.

mod game;
mod model;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Parser;
use shardkeep::live::{Cadence, Launch, Runtime};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use game::Game;
use model::{Arena, Release};

/// Longest command line accepted.
const MAX_LINE: usize = 256;

/// An arena shard.
#[derive(Debug, Parser)]
#[command(name = "arena", version, about = "An arena shard built on shardkeep")]
struct Args {
    /// This shard's name.
    #[arg(long)]
    shard: String,
    /// Where players connect.
    #[arg(long, default_value = "127.0.0.1:7001")]
    listen: SocketAddr,
    /// Postgres.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// Redis.
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    redis_url: String,
    /// Redis key namespace shared by the shards of one game.
    #[arg(long, default_value = "arena")]
    namespace: String,
    /// The release to run: its character schema version (1 or 2).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=2))]
    schema_version: u32,
    /// Checkpoint cadence, milliseconds.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(50..))]
    checkpoint_ms: u64,
    /// Flush cadence, milliseconds.
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(100..))]
    flush_ms: u64,
    /// Another shard, as NAME=ADDRESS (repeatable), for `travel`.
    #[arg(long = "peer", value_parser = parse_peer)]
    peers: Vec<(String, String)>,
    /// Apply shardkeep's migrations first.
    #[arg(long)]
    migrate: bool,
}

fn parse_peer(text: &str) -> Result<(String, String), String> {
    let (name, address) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not NAME=ADDRESS"))?;
    address
        .parse::<SocketAddr>()
        .map_err(|e| format!("{address:?}: {e}"))?;
    Ok((name.to_owned(), address.to_owned()))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Args::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("arena: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let release = Release::of(args.schema_version)
        .ok_or_else(|| anyhow!("no release with schema version {}", args.schema_version))?;
    let mut launch = Launch::new(&args.database_url, Some(&args.redis_url), &args.shard);
    (launch.namespace, launch.migrate) = (args.namespace.clone(), args.migrate);
    launch.services.address = args.listen.to_string();
    launch.services.retry.poll_interval = Duration::from_millis(500);
    let ms = Duration::from_millis;
    launch.live.cadence = Cadence::new(ms(args.checkpoint_ms), ms(args.flush_ms));
    let launched = Runtime::launch(launch, Arena(release)).await?;
    let peers: HashMap<String, String> = args.peers.into_iter().collect();
    let game = Arc::new(Game::new(
        args.shard.clone(),
        launched.runtime.clone(),
        peers,
    ));

    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    println!(
        "arena: shard {} (schema {}) listening on {}",
        args.shard,
        release.version(),
        args.listen
    );
    let accept = {
        let game = Arc::clone(&game);
        async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        tokio::spawn(serve_player(Arc::clone(&game), stream));
                    }
                    Err(err) => tracing::warn!(event = "arena_accept_failed", error = %err),
                }
            }
        }
    };
    tokio::select! {
        () = accept => {}
        () = shutdown_signal() => {}
    }
    let report = launched.shutdown(Duration::from_secs(10)).await;
    let journaled = report.finalized.saturating_sub(report.unjournaled);
    println!("arena: journaled {journaled} closed streams at shutdown");
    if report.unjournaled > 0
        || report.unsettled_handoffs > 0
        || report.unsaved_finals.total() > 0
        || report.unfinished_writes > 0
    {
        eprintln!("arena: not durable at shutdown: {report:?}");
    }
    println!("arena: shard {} stopped", args.shard);
    Ok(())
}

async fn serve_player(game: Arc<Game>, stream: TcpStream) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut current = None;
    loop {
        let line = match next_line(&mut reader).await {
            Ok(Some(Ok(line))) => line,
            Ok(Some(Err(problem))) => {
                let _ = write
                    .write_all(format!("error {problem}\n").as_bytes())
                    .await;
                continue;
            }
            Ok(None) | Err(_) => break,
        };
        let reply = game.command(&mut current, line.trim()).await;
        if write
            .write_all(format!("{}\n", reply.line).as_bytes())
            .await
            .is_err()
            || reply.close
        {
            break;
        }
    }
    if let Some(playing) = &current {
        game.disconnected(playing);
    }
}

/// The next line, at most [`MAX_LINE`] bytes of UTF-8 (a longer one is skipped whole and
/// answered with an error); `None` at the end of the stream.
async fn next_line<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
) -> std::io::Result<Option<Result<String, &'static str>>> {
    let mut line = Vec::new();
    let limit = u64::try_from(MAX_LINE).unwrap_or(u64::MAX) + 1;
    let read = (&mut *reader)
        .take(limit)
        .read_until(b'\n', &mut line)
        .await?;
    if read == 0 {
        return Ok(None);
    }
    if !line.ends_with(b"\n") && line.len() > MAX_LINE {
        loop {
            let mut rest = Vec::new();
            let more = (&mut *reader)
                .take(4096)
                .read_until(b'\n', &mut rest)
                .await?;
            if more == 0 || rest.ends_with(b"\n") {
                break;
            }
        }
        return Ok(Some(Err("line too long")));
    }
    Ok(Some(
        String::from_utf8(line)
            .map(|text| text.trim().to_owned())
            .map_err(|_| "a line must be UTF-8"),
    ))
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = ctrl_c.await;
}
