//! `scripts/run`, the README's first command, on a machine where neither Postgres nor Redis can
//! be reached or started: it says so in one line and runs the simulation in embedded mode.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Programs a machine with only Rust installed does not have: the Postgres and Redis clients,
/// servers and tools.
fn is_server_tool(name: &str) -> bool {
    [
        "psql",
        "initdb",
        "postgres",
        "createdb",
        "dropdb",
        "pgbouncer",
    ]
    .contains(&name)
        || name.starts_with("pg_")
        || name.starts_with("redis-")
}

/// A directory of links to every program on `PATH` except the server tools, to stand in for
/// `PATH` on a machine without them.
fn path_without_servers(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let path = std::env::var_os("PATH").unwrap_or_default();
    for entry_dir in std::env::split_paths(&path) {
        let Ok(entries) = std::fs::read_dir(&entry_dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(text) = name.to_str() else { continue };
            let link = bin.join(&name);
            if is_server_tool(text) || link.exists() {
                continue;
            }
            let _ = std::os::unix::fs::symlink(entry.path(), link);
        }
    }
    bin
}

/// A TCP port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[test]
fn scripts_run_falls_back_to_embedded_mode_when_no_server_can_be_found_or_started() {
    let dir = std::env::temp_dir().join(format!("shardkeep-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = path_without_servers(&dir);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (pg, redis) = (closed_port(), closed_port());
    let output = Command::new(root.join("scripts/run"))
        .args(["--duration", "3s", "--players", "60", "--seed", "3"])
        .env("PATH", &bin)
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .env(
            "SHARDKEEP_LOCAL_PG_URLS",
            format!("postgres://postgres@127.0.0.1:{pg}/postgres"),
        )
        .env(
            "SHARDKEEP_LOCAL_REDIS_URLS",
            format!("redis://127.0.0.1:{redis}"),
        )
        .env("SHARDKEEP_RUN_BIN", env!("CARGO_BIN_EXE_shardkeep"))
        .env("TMPDIR", &dir)
        .output()
        .expect("run scripts/run");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let said: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("running in embedded mode"))
        .collect();
    assert_eq!(
        said,
        vec![
            "Postgres and Redis could not be reached or started: running in embedded mode on a \
             temporary SQLite file (no servers)"
        ],
        "{stdout}"
    );
    assert!(stdout.contains("every invariant holds"), "{stdout}");
    assert!(
        stderr.contains("redis-server is not installed"),
        "it says what is missing: {stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
