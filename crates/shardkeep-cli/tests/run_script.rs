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

/// Runs `script` in bash with the test scripts' service helpers sourced, from the project root.
fn with_services(script: &str, envs: &[(&str, String)]) -> std::process::Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -euo pipefail; source scripts/lib/services.sh; {script}"
        ))
        .current_dir(root)
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("run bash")
}

/// A private Postgres whose port is taken before it binds it: with every port taken, the start
/// fails and clean-up still stops and removes what it made (it died on an unset variable, so
/// `scripts/run` never reached its fallback); with one port taken, it starts on another.
#[test]
fn a_private_postgres_whose_port_is_taken_fails_cleanly_or_moves_to_another() {
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = held.local_addr().unwrap().port().to_string();

    let failed = with_services(
        r#"sk_free_port() { echo "$TAKEN"; }
           if sk_start_postgres; then echo "started on a taken port"; exit 9; fi
           dir=$SK_TMP
           sk_services_down
           [ ! -e "$dir" ] && echo "cleaned up""#,
        &[("TAKEN", taken.clone())],
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&failed.stdout),
        String::from_utf8_lossy(&failed.stderr),
    );
    assert!(failed.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("cleaned up"), "{stdout}\n{stderr}");
    assert_eq!(
        stderr.matches("starting a private Postgres").count(),
        3,
        "{stderr}"
    );

    let dir = std::env::temp_dir().join(format!("shardkeep-port-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let moved = with_services(
        r#"sk_free_port() {
             if [ -e "$MARK" ]; then echo "$FREE"; else : >"$MARK"; echo "$TAKEN"; fi
           }
           sk_start_postgres
           trap sk_services_down EXIT
           psql "$DATABASE_URL" -Atc 'SELECT 41 + 1'
           echo "$DATABASE_URL""#,
        &[
            ("TAKEN", taken),
            ("FREE", closed_port().to_string()),
            ("MARK", dir.join("asked").display().to_string()),
        ],
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&moved.stdout),
        String::from_utf8_lossy(&moved.stderr),
    );
    assert!(moved.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.lines().any(|l| l == "42"), "{stdout}\n{stderr}");
    drop(held);
    std::fs::remove_dir_all(&dir).unwrap();
}
