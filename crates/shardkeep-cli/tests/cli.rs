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

/// True once something accepts connections on `port` (waiting up to 10 s).
async fn listening(port: u16) -> bool {
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    false
}

/// Sends SIGTERM to a running `serve` and waits for it: its exit status and what it printed.
async fn terminate(mut serve: std::process::Child) -> (std::process::ExitStatus, String) {
    let status = Command::new("kill")
        .args(["-TERM", &serve.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    tokio::task::spawn_blocking(move || {
        let status = serve.wait().unwrap();
        let mut out = String::new();
        use std::io::Read;
        serve
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        (status, out)
    })
    .await
    .unwrap()
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

#[test]
fn an_unknown_pooler_mode_is_refused_naming_the_setting() {
    for bad in ["statement", "transactions", "1"] {
        let out = shardkeep(
            &["migrate"],
            &[
                ("DATABASE_URL", "postgres://x@127.0.0.1:1/x"),
                ("SHARDKEEP_PG_POOLER", bad),
            ],
        );
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("none, session or transaction"),
            "{bad}: {}",
            stderr(&out)
        );
    }
    let out = shardkeep(&["migrate", "--pg-pooler", "pgbouncer"], &[]);
    assert_eq!(out.status.code(), Some(2));
}

/// The test database's URL for a `shardkeep` process of this pass (through PgBouncer in the
/// PgBouncer pass), with [`POOLER`] the setting that goes with it.
fn database_url_of(pool: &PgPool) -> String {
    shardkeep_testkit::pgbouncer::pass_database_url(&shardkeep_testkit::pgbouncer::database_of(
        pool,
    ))
}

/// `SHARDKEEP_PG_POOLER` for this pass.
const POOLER: &str = "SHARDKEEP_PG_POOLER";

fn pooler() -> &'static str {
    shardkeep_testkit::pgbouncer::pass_pooler().as_str()
}

#[sqlx::test(migrations = false)]
async fn migrate_applies_then_reports_up_to_date(pool: PgPool) {
    let url = database_url_of(&pool);
    let first = shardkeep(&["migrate"], &[("DATABASE_URL", &url), (POOLER, pooler())]);
    assert!(first.status.success(), "{}", stderr(&first));
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert!(stdout.contains("applied 0001 characters"), "{stdout}");
    let second = shardkeep(&["migrate"], &[("DATABASE_URL", &url), (POOLER, pooler())]);
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
        &["bench", "ladder", "--aging-logins", "many"],
        &["bench", "ladder", "--aging-logins", "100001"],
        &["bench", "nothing"],
        &["bench", "audit", "--events", "5"],
        &["bench", "audit", "--slowdown-ms", "0"],
        &["bench", "audit", "--burst", "many"],
        &["bench", "all", "--size", "huge"],
        &["bench", "hostile-api", "--seconds", "5"],
        &["bench", "hostile-api", "--connections", "0"],
        &["bench", "hostile-api", "--connections", "lots"],
        &["bench", "all", "--json"],
        &["bench", "capacity", "--fresh", "-1"],
        &["bench", "capacity", "--seconds", "0"],
        &["bench", "login", "--players", "0"],
        &["bench", "login", "--pool", "1000"],
        &["bench", "queue", "--entries", "1"],
        &["bench", "depth", "--consumers", "zero"],
        &["bench", "retry", "--producers", "0"],
        &["bench", "backlog", "--queued", "0"],
        &["bench", "ladder", "--rounds", "0"],
    ] {
        let out = shardkeep(args, &[("DATABASE_URL", "postgres://x@127.0.0.1:1/x")]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
    for which in ["ladder", "all"] {
        let out = shardkeep(
            &["bench", which],
            &[("DATABASE_URL", "postgres://x@127.0.0.1:1/x")],
        );
        assert_one_line_failure(&out, "REDIS_URL is not set");
    }
}

#[test]
fn malformed_operator_arguments_are_rejected() {
    for args in [
        &["serve", "--listen", "nowhere"][..],
        &["serve", "--skew-seconds", "0"],
        &["serve", "--retry-backoff-millis", "fast"],
        &["serve", "--consumer-id", ""],
        &["serve", "--consumer-id", "has space"],
        &["serve", "--consumer-id", "a:b"],
        &["serve", "--console-login-client-limit", "0"],
        &["serve", "--public-url", "ftp://ops.example"],
        &["dead-letters", "list", "--kind", "mail"],
        &["dead-letters", "list", "--kind", "retry", "--limit", "0"],
        &[
            "dead-letters",
            "requeue",
            "--kind",
            "retry",
            "--id",
            "not-a-uuid",
        ],
        &["dead-letters", "requeue", "--kind", "journal"],
        &["dead-letters", "show", "--kind", "retry", "--id", "x"],
        &[
            "dead-letters",
            "show",
            "--id",
            "01938f00-0000-7000-8000-000000000000",
        ],
        &["dead-letters", "list", "--kind", "retry", "--offset", "-1"],
        &["cleanup", "--target", "presence"],
        &["cleanup", "--target", "presence", "--dry-run", "--delete"],
        &[
            "cleanup", "--target", "presence", "--delete", "--batch", "0",
        ],
    ] {
        let out = shardkeep(args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn operator_commands_need_keys_and_a_reachable_api() {
    let out = shardkeep(&["dead-letters", "list", "--kind", "retry"], &[]);
    assert_one_line_failure(&out, "SHARDKEEP_INTERNAL_KEYS is not set");
    let out = shardkeep(
        &["dead-letters", "list", "--kind", "retry"],
        &[("SHARDKEEP_INTERNAL_KEYS", "ops:short")],
    );
    assert_one_line_failure(&out, "shorter than 16");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = shardkeep(
        &[
            "cleanup",
            "--target",
            "presence",
            "--dry-run",
            "--api-url",
            &format!("http://127.0.0.1:{port}"),
        ],
        &[("SHARDKEEP_INTERNAL_KEYS", "ops:0123456789abcdef")],
    );
    assert_one_line_failure(&out, "cannot reach the shardkeep API");
    let out = shardkeep(
        &["serve"],
        &[("DATABASE_URL", "postgres://x@127.0.0.1:1/x")],
    );
    assert_one_line_failure(&out, "SHARDKEEP_INTERNAL_KEYS is not set");
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn serve_answers_the_cli_and_stops_gracefully_on_sigterm(pool: PgPool) {
    let url = database_url_of(&pool);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let api = format!("http://127.0.0.1:{port}");
    let test_redis = shardkeep_testkit::TestRedis::new().await;
    let namespace = test_redis.keys().namespace().to_owned();
    let keys = "ops:0123456789abcdef0123";
    let redis = test_redis.url().to_owned();
    let serve = Command::new(env!("CARGO_BIN_EXE_shardkeep"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--namespace",
            &namespace,
        ])
        .env("DATABASE_URL", &url)
        .env(POOLER, pooler())
        .env("REDIS_URL", &redis)
        .env("SHARDKEEP_INTERNAL_KEYS", keys)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let up = listening(port).await;
    assert!(up, "serve never listened");
    let env = [
        ("SHARDKEEP_INTERNAL_KEYS", keys),
        ("SHARDKEEP_API_URL", api.as_str()),
    ];
    let list = shardkeep(&["dead-letters", "list", "--kind", "retry"], &env);
    assert!(list.status.success(), "{}", stderr(&list));
    assert!(String::from_utf8_lossy(&list.stdout).contains("pending retry jobs: 0"));
    let journal = shardkeep(&["dead-letters", "list", "--kind", "journal"], &env);
    assert!(String::from_utf8_lossy(&journal.stdout).contains("pending: 0"));
    let unknown = shardkeep(
        &[
            "dead-letters",
            "requeue",
            "--kind",
            "journal",
            "--id",
            "01938f00-0000-7000-8000-000000000000",
        ],
        &env,
    );
    assert_eq!(unknown.status.code(), Some(4));
    assert!(stderr(&unknown).contains("not_requeued"));
    // `show`: the whole dead letter, its payload and the checks, read back from the store.
    let dead_letter_id = uuid::Uuid::now_v7();
    sqlx::query(
        "INSERT INTO persistence_job_dead_letters (dead_letter_id, retry_job_id, job_kind,
             character_id, zone_id, payload, failed_attempts, last_error, failed_at, session_token,
             source, session_impact, idempotency_key, owner_epoch, origin, issued_at)
         VALUES ($1, $2, 'character_location', $3, 'zone-7',
             '{\"room\": \"vault\"}'::jsonb, 8, 'store down', now(), 'sess-show',
             'test', 'none', 'show-1', 0, 'session_cleanup', now())",
    )
    .bind(dead_letter_id)
    .bind(uuid::Uuid::now_v7())
    .bind(uuid::Uuid::now_v7())
    .execute(&pool)
    .await
    .unwrap();
    let id = dead_letter_id.to_string();
    let show = shardkeep(
        &["dead-letters", "show", "--kind", "retry", "--id", &id],
        &env,
    );
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(show.status.success(), "{}", stderr(&show));
    for needle in [
        id.as_str(),
        "store down",
        "session active again:       no",
        "transfer already confirmed: no",
        "\"room\": \"vault\"",
    ] {
        assert!(text.contains(needle), "show lacks {needle:?}: {text}");
    }
    let missing = shardkeep(
        &[
            "dead-letters",
            "show",
            "--kind",
            "journal",
            "--id",
            "01938f00-0000-7000-8000-000000000000",
        ],
        &env,
    );
    assert_eq!(missing.status.code(), Some(3));
    assert!(stderr(&missing).contains("not_found"));
    let dry = shardkeep(&["cleanup", "--target", "registry", "--dry-run"], &env);
    assert!(dry.status.success());
    assert!(String::from_utf8_lossy(&dry.stdout).contains("registry"));
    let wrong_key = shardkeep(
        &["cleanup", "--target", "registry", "--dry-run"],
        &[
            ("SHARDKEEP_INTERNAL_KEYS", "ops:not-the-right-secret-at-all"),
            ("SHARDKEEP_API_URL", api.as_str()),
        ],
    );
    assert_eq!(wrong_key.status.code(), Some(3));
    assert!(stderr(&wrong_key).contains("bad_signature"));
    let bad_target = shardkeep(&["cleanup", "--target", "everything", "--delete"], &env);
    assert_eq!(bad_target.status.code(), Some(3));
    assert!(stderr(&bad_target).contains("unknown_target"));
    let output = terminate(serve).await;
    assert!(output.0.success(), "serve exits cleanly on SIGTERM");
    assert!(output.1.contains("serve: stopped"), "{}", output.1);
}

/// `serve` on a SQLite file (embedded mode, no Redis): it migrates nothing itself, answers
/// readiness, the dead-letter listings and cleanup through the signed API, and stops cleanly.
#[tokio::test]
async fn serve_runs_in_embedded_mode_on_a_sqlite_file() {
    let dir = std::env::temp_dir().join(format!("shardkeep-serve-sqlite-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite:{}", dir.join("store.db").display());
    let out = shardkeep(&["migrate"], &[("DATABASE_URL", &url)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let api = format!("http://127.0.0.1:{port}");
    let keys = "ops:0123456789abcdef0123";
    let serve = Command::new(env!("CARGO_BIN_EXE_shardkeep"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .env("DATABASE_URL", &url)
        .env_remove("REDIS_URL")
        .env("SHARDKEEP_INTERNAL_KEYS", keys)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(listening(port).await, "serve never listened");
    let ready = reqwest::get(format!("{api}/readyz")).await.unwrap();
    assert!(ready.status().is_success());
    let body: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(body["ready"], true, "{body}");
    let env = [
        ("SHARDKEEP_INTERNAL_KEYS", keys),
        ("SHARDKEEP_API_URL", api.as_str()),
    ];
    for kind in ["retry", "journal"] {
        let list = shardkeep(&["dead-letters", "list", "--kind", kind], &env);
        assert!(list.status.success(), "{kind}: {}", stderr(&list));
    }
    let cleanup = shardkeep(&["cleanup", "--target", "registry", "--delete"], &env);
    assert!(cleanup.status.success(), "{}", stderr(&cleanup));
    let table = String::from_utf8_lossy(&cleanup.stdout).into_owned();
    assert!(table.contains("registry"), "{table}");
    let output = terminate(serve).await;
    assert!(output.0.success(), "serve exits cleanly on SIGTERM");
    assert!(output.1.contains("embedded mode"), "{}", output.1);
    assert!(output.1.contains("serve: stopped"), "{}", output.1);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `bench all` on a SQLite file runs the embedded report (scratch files, no servers) and prints
/// its rows against the engine's own batched update; the benchmarks that compare against the
/// servers are refused with one line.
#[test]
fn bench_all_in_embedded_mode_prints_the_embedded_report() {
    let dir = std::env::temp_dir().join(format!("shardkeep-bench-sqlite-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite:{}", dir.join("store.db").display());
    let json = dir.join("report.json");
    let out = shardkeep(
        &[
            "bench",
            "all",
            "--size",
            "smoke",
            "--json",
            &json.display().to_string(),
        ],
        &[("DATABASE_URL", &url)],
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}{}", stderr(&out));
    for row in [
        "batched CAS saves, rows, embedded SQLite (fresh doc",
        "batched CAS saves, rows, embedded SQLite (aged doc,",
        "batched CAS saves, rows, embedded SQLite (aged doc) ",
        "aged state document, embedded",
        "aged character (embedded): 500 rewards",
    ] {
        assert!(stdout.contains(row), "{row}: {stdout}");
    }
    assert!(
        stdout.contains("UPDATE … FROM (VALUES …) on SQLite"),
        "{stdout}"
    );
    assert!(
        stdout.contains("capacity  embedded, 960 online"),
        "{stdout}"
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(report["mode"], "embedded");
    let out = shardkeep(&["bench", "ladder"], &[("DATABASE_URL", &url)]);
    assert_one_line_failure(&out, "only `bench all` runs on it");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn malformed_simulate_arguments_are_rejected() {
    for args in [
        &["simulate", "--faults", "meteor"][..],
        &["simulate", "--faults", "zombie,,poison"],
        &["simulate", "--duration", "10x"],
        &["simulate", "--duration", "0"],
        &["simulate", "--duration", "25h"],
        &["simulate", "--shards", "0"],
        &["simulate", "--shards", "17"],
        &["simulate", "--players", "0"],
        &["simulate", "--players", "lots"],
        &["simulate", "--seed", "-1"],
        &["simulate", "--serves", "9"],
        &["simulate", "--serves", "some"],
    ] {
        let out = shardkeep(args, &[("DATABASE_URL", "postgres://x@127.0.0.1:1/x")]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("error:"), "{args:?}");
    }
    let out = shardkeep(&["simulate", "--faults", "meteor"], &[]);
    assert!(
        stderr(&out).contains("unknown fault \"meteor\""),
        "{}",
        stderr(&out)
    );
    let out = shardkeep(
        &["simulate", "--faults", "kill-serve"],
        &[
            ("DATABASE_URL", "postgres://x@127.0.0.1:1/x"),
            ("REDIS_URL", "redis://127.0.0.1:1"),
        ],
    );
    assert_one_line_failure(&out, "the kill-serve fault needs serve processes");
    let out = shardkeep(&["simulate"], &[]);
    assert_one_line_failure(&out, "DATABASE_URL is not set");
    let out = shardkeep(
        &["simulate"],
        &[("DATABASE_URL", "postgres://x@127.0.0.1:1/x")],
    );
    assert_one_line_failure(&out, "REDIS_URL is not set");
    let out = shardkeep(
        &["simulate", "--report", "/nonexistent-dir/report.json"],
        &[
            ("DATABASE_URL", "postgres://x@127.0.0.1:1/x"),
            ("REDIS_URL", "redis://127.0.0.1:1"),
        ],
    );
    assert!(
        stderr(&out).contains("cannot write to /nonexistent-dir/report.json"),
        "the report path is checked before the run: {}",
        stderr(&out)
    );
    let out = shardkeep(
        &["simulate", "--plot", "/nonexistent-dir/series.svg"],
        &[
            ("DATABASE_URL", "postgres://x@127.0.0.1:1/x"),
            ("REDIS_URL", "redis://127.0.0.1:1"),
        ],
    );
    assert!(
        stderr(&out).contains("cannot write to /nonexistent-dir/series.svg"),
        "the plot path is checked before the run: {}",
        stderr(&out)
    );
}

#[test]
fn simulate_runs_prints_the_table_and_writes_the_json_report() {
    let database_url = std::env::var("DATABASE_URL").expect("tests run with DATABASE_URL set");
    let redis_url = shardkeep_testkit::redis_url();
    let dir = std::env::temp_dir().join(format!("shardkeep-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("report.json");
    let out = shardkeep(
        &[
            "simulate",
            "--duration",
            "3s",
            "--players",
            "30",
            "--shards",
            "2",
            "--faults",
            "zombie,poison",
            "--report",
            report.to_str().unwrap(),
        ],
        &[("DATABASE_URL", &database_url), ("REDIS_URL", &redis_url)],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", stderr(&out));
    for needle in [
        "checkpoint (Redis)",
        "row (Postgres CAS)",
        "item conservation",
        "every invariant holds",
    ] {
        assert!(stdout.contains(needle), "table lacks {needle}: {stdout}");
    }
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(json["passed"], true);
    assert_eq!(json["run"]["players"], 30);
    assert_eq!(json["invariants"].as_array().unwrap().len(), 8);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `simulate --embedded` runs the whole simulation on a scratch SQLite file with no Postgres or
/// Redis (neither variable set), its store outages failing every call of the file: every
/// invariant holds and the report says where the stores were.
#[test]
fn simulate_runs_in_embedded_mode_without_servers() {
    let dir = std::env::temp_dir().join(format!("shardkeep-sim-embedded-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("report.json");
    let out = shardkeep(
        &[
            "simulate",
            "--embedded",
            "--duration",
            "8s",
            "--players",
            "60",
            "--shards",
            "2",
            "--faults",
            "postgres-outage,redis-outage,zombie,poison",
            "--report",
            report.to_str().unwrap(),
        ],
        &[],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", stderr(&out));
    for needle in [
        "checkpoint (file)",
        "row (file CAS)",
        "every invariant holds",
    ] {
        assert!(stdout.contains(needle), "table lacks {needle}: {stdout}");
    }
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(json["passed"], true);
    assert!(
        json["run"]["stores"]
            .as_str()
            .unwrap()
            .starts_with("embedded"),
        "{}",
        json["run"]
    );
    // The outage faults reached the system under test: writes failed while they lasted.
    let planned = json["faults"]["planned"].to_string();
    assert!(planned.contains("outage"), "{planned}");
    let failed: u64 = json["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["failed"].as_u64().unwrap())
        .sum();
    assert!(
        failed > 0,
        "no write failed during the outages: {}",
        json["tiers"]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--serves 2` runs the workers in two `serve` processes beside the run; `kill-serve` SIGKILLs
/// one mid-run and starts it again; every invariant holds, the live one's work included, and
/// the report's counts come from their /metrics.
#[test]
fn simulate_with_serve_processes_survives_one_killed() {
    let database_url = std::env::var("DATABASE_URL").expect("tests run with DATABASE_URL set");
    let redis_url = shardkeep_testkit::redis_url();
    let dir = std::env::temp_dir().join(format!("shardkeep-sim-serves-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("report.json");
    let out = shardkeep(
        &[
            "simulate",
            "--duration",
            "8s",
            "--players",
            "40",
            "--shards",
            "2",
            "--serves",
            "2",
            "--faults",
            "kill-serve,poison",
            "--report",
            report.to_str().unwrap(),
        ],
        &[("DATABASE_URL", &database_url), ("REDIS_URL", &redis_url)],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", stderr(&out));
    assert!(stdout.contains("no live serve's work taken"), "{stdout}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(json["passed"], true);
    assert_eq!(json["faults"]["serves_killed"], 1, "{}", json["faults"]);
    assert!(
        json["retry"]["applied"].as_u64().unwrap() > 0,
        "counted from the serves' /metrics: {}",
        json["retry"]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Two `serve` processes started with one `--consumer-id`: the second is refused at start-up
/// with a clear error while the first keeps its journal consumer.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_second_serve_with_a_consumer_id_in_use_is_refused(pool: PgPool) {
    let url = database_url_of(&pool);
    let test_redis = shardkeep_testkit::TestRedis::new().await;
    let namespace = test_redis.keys().namespace().to_owned();
    let redis = test_redis.url().to_owned();
    let spawn = |port: u16| {
        Command::new(env!("CARGO_BIN_EXE_shardkeep"))
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--namespace",
                &namespace,
                "--consumer-id",
                "serve-0",
            ])
            .env("DATABASE_URL", &url)
            .env(POOLER, pooler())
            .env("REDIS_URL", &redis)
            .env("SHARDKEEP_INTERNAL_KEYS", "ops:0123456789abcdef0123")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let first_port = free();
    let mut first = spawn(first_port);
    let mut up = false;
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", first_port)).is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(up, "the first serve never listened");
    let second = spawn(free());
    let out = tokio::task::spawn_blocking(move || second.wait_with_output().unwrap())
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("in use by a live process"),
        "{}",
        stderr(&out)
    );
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", first_port)).is_ok(),
        "the first serve goes on"
    );
    let status = Command::new("kill")
        .args(["-TERM", &first.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let status = tokio::task::spawn_blocking(move || first.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn serve_refuses_a_redis_that_may_evict_keys_unless_told_to_allow_it() {
    let database_url = std::env::var("DATABASE_URL").expect("tests run with DATABASE_URL set");
    let evicting = shardkeep_testkit::PrivateRedis::start("allkeys-lru").await;
    let keys = "ops:0123456789abcdef0123";
    let env = [
        ("DATABASE_URL", database_url.as_str()),
        ("REDIS_URL", evicting.url.as_str()),
        ("SHARDKEEP_INTERNAL_KEYS", keys),
    ];
    let out = shardkeep(&["serve", "--listen", "127.0.0.1:0"], &env);
    // (The database of this test is not migrated: serve warns about that first.)
    let err = stderr(&out);
    assert!(!out.status.success() && !err.contains("panicked"), "{err}");
    let refusal: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("maxmemory-policy"))
        .collect();
    assert_eq!(refusal.len(), 1, "{err}");
    assert!(
        refusal[0].contains("maxmemory-policy is allkeys-lru")
            && refusal[0].contains("SHARDKEEP_ALLOW_EVICTION"),
        "{err}"
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut serve = Command::new(env!("CARGO_BIN_EXE_shardkeep"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .envs(env)
        .env("SHARDKEEP_ALLOW_EVICTION", "true")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let up = listening(port).await;
    let _ = serve.kill();
    let _ = serve.wait();
    assert!(up, "serve runs once eviction is allowed");
}

/// `migrate` on `DATABASE_URL=sqlite:<path>` creates the embedded store's file and applies its
/// schema once; a path that cannot be created, a file that is not a database and a file written
/// by a newer shardkeep are each refused with one line and a non-zero exit, leaving the file as
/// it was.
#[tokio::test]
async fn migrate_on_a_sqlite_file_creates_it_and_refuses_bad_files() {
    let dir = std::env::temp_dir().join(format!("shardkeep-sqlite-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("store.db");
    let url = format!("sqlite:{}", file.display());
    let out = shardkeep(&["migrate"], &[("DATABASE_URL", &url)]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}{}", stderr(&out));
    assert!(stdout.contains("applied 0001 schema"), "{stdout}");
    assert!(file.exists());
    let out = shardkeep(&["migrate"], &[("DATABASE_URL", &url)]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("up to date"),
        "{}",
        stderr(&out)
    );

    let missing = format!("sqlite:{}", dir.join("no-such-dir/store.db").display());
    let out = shardkeep(&["migrate"], &[("DATABASE_URL", &missing)]);
    assert_one_line_failure(&out, "cannot open or create");
    assert!(stderr(&out).contains("DATABASE_URL"), "{}", stderr(&out));

    let corrupt = dir.join("corrupt.db");
    let garbage =
        b"this is not a database, only text that happens to sit in a .db file\n".repeat(64);
    std::fs::write(&corrupt, &garbage).unwrap();
    let corrupt_url = format!("sqlite:{}", corrupt.display());
    let out = shardkeep(&["migrate"], &[("DATABASE_URL", &corrupt_url)]);
    assert_one_line_failure(&out, "is not a SQLite database");
    assert_eq!(std::fs::read(&corrupt).unwrap(), garbage, "left as it was");

    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (9999, 'from the future', 1, x'00', 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let out = shardkeep(&["migrate"], &[("DATABASE_URL", &url)]);
    assert_one_line_failure(&out, "written by a newer shardkeep (schema version 9999");

    let out = shardkeep(&["migrate"], &[("DATABASE_URL", "sqlite::memory:")]);
    assert_one_line_failure(&out, "name a file");
    // A SQLite file beside a Redis is refused before anything is opened or created.
    let mixed = dir.join("mixed.db");
    let out = shardkeep(
        &["migrate"],
        &[
            ("DATABASE_URL", &format!("sqlite:{}", mixed.display())),
            ("REDIS_URL", "redis://127.0.0.1:6379"),
        ],
    );
    assert_one_line_failure(&out, "but REDIS_URL is set");
    assert!(!mixed.exists(), "nothing created");
    // serve on a SQLite file beside a Redis is refused like migrate.
    let out = shardkeep(
        &["serve", "--internal-keys", "ops:0123456789abcdef0123"],
        &[("DATABASE_URL", &url), ("REDIS_URL", "redis://127.0.0.1:1")],
    );
    assert_one_line_failure(&out, "but REDIS_URL is set");
    // What embedded mode cannot run says so, rather than failing on the URL's form.
    let out = shardkeep(&["simulate", "--serves", "1"], &[("DATABASE_URL", &url)]);
    assert_one_line_failure(&out, "serve processes need Postgres and Redis");
    let out = shardkeep(
        &["simulate", "--faults", "redis-failover"],
        &[("DATABASE_URL", &url)],
    );
    assert_one_line_failure(&out, "needs a Redis Cluster, not embedded mode");

    std::fs::remove_dir_all(&dir).unwrap();
}
