//! The `shardkeep` binary, run as a process: its arguments, its errors, and `migrate`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::{Command, Output};

use sqlx::PgPool;

fn shardkeep(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shardkeep"));
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .env("RUST_BACKTRACE", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run shardkeep")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A failure is one clear line, with no panic and no backtrace.
fn assert_one_line_failure(out: &Output, needle: &str) {
    let err = stderr(out);
    assert!(
        !out.status.success(),
        "expected failure, got {:?}",
        out.status
    );
    assert!(err.contains(needle), "stderr lacks {needle:?}: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected: {err}"
    );
}

#[test]
fn help_lists_every_subcommand() {
    let out = shardkeep(&["--help"], &[]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "migrate",
        "DATABASE_URL",
        "REDIS_URL",
        "SHARDKEEP_NAMESPACE",
    ] {
        assert!(text.contains(needle), "--help lacks {needle}");
    }
}

#[test]
fn missing_database_url_names_the_variable() {
    let out = shardkeep(&["migrate"], &[]);
    assert_one_line_failure(&out, "DATABASE_URL is not set");
    let out = shardkeep(&["migrate"], &[("DATABASE_URL", "  ")]);
    assert_one_line_failure(&out, "DATABASE_URL is not set");
}

#[test]
fn unreachable_database_says_what_was_tried_without_the_password() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://app:hunter2@127.0.0.1:{port}/db");
    let out = shardkeep(
        &["migrate", "--connect-timeout", "2"],
        &[("DATABASE_URL", &url)],
    );
    assert_one_line_failure(
        &out,
        &format!("DATABASE_URL=postgres://app:***@127.0.0.1:{port}/db"),
    );
    assert!(!stderr(&out).contains("hunter2"));
}

#[test]
fn malformed_database_url_is_one_line() {
    let out = shardkeep(&["migrate"], &[("DATABASE_URL", "not a url")]);
    assert_one_line_failure(&out, "DATABASE_URL=not a url");
}

#[test]
fn malformed_arguments_are_rejected_by_the_parser() {
    for args in [
        &["migrate", "--connect-timeout", "0"][..],
        &["migrate", "--connect-timeout", "soon"],
        &["--log-format", "xml", "migrate"],
        &["no-such-command"],
    ] {
        let out = shardkeep(args, &[("DATABASE_URL", "postgres://x@127.0.0.1:1/x")]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("error:"), "{args:?}");
    }
}

fn database_url_of(pool: &PgPool) -> String {
    let base = std::env::var("DATABASE_URL").expect("tests run with DATABASE_URL set");
    let db = pool
        .connect_options()
        .get_database()
        .expect("test database name")
        .to_owned();
    let (server, _) = base.rsplit_once('/').expect("url with a database");
    format!("{server}/{db}")
}

#[sqlx::test(migrations = false)]
async fn migrate_applies_then_reports_up_to_date(pool: PgPool) {
    let url = database_url_of(&pool);
    let first = shardkeep(&["migrate"], &[("DATABASE_URL", &url)]);
    assert!(first.status.success(), "{}", stderr(&first));
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert!(stdout.contains("applied 0001 characters"), "{stdout}");
    let second = shardkeep(&["migrate"], &[("DATABASE_URL", &url)]);
    assert!(second.status.success());
    assert!(String::from_utf8_lossy(&second.stdout).contains("up to date"));
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(count >= 1);
}

#[test]
fn malformed_bench_arguments_are_rejected() {
    for args in [
        &["bench", "ladder", "--rows", "5"][..],
        &["bench", "ladder", "--batch", "0"],
        &["bench", "ladder", "--seconds", "-1"],
        &["bench", "nothing"],
        &["bench", "audit", "--events", "5"],
        &["bench", "audit", "--slowdown-ms", "0"],
        &["bench", "audit", "--burst", "many"],
    ] {
        let out = shardkeep(args, &[("DATABASE_URL", "postgres://x@127.0.0.1:1/x")]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
    let out = shardkeep(
        &["bench", "ladder"],
        &[("DATABASE_URL", "postgres://x@127.0.0.1:1/x")],
    );
    assert_one_line_failure(&out, "REDIS_URL is not set");
}
