//! Every fact an operator checks before a requeue, over signed HTTP; the typed contract and its
//! OpenAPI document; dead-letter retention and requeue of any retained letter; the signing
//! examples in another language.

use std::process::Command;

use shardkeep::queue::DeadLetterRetention;
use shardkeep_ops::contract::{
    JournalDeadLetterDetail, JournalDeadLetterList, RetryDeadLetterDetail, RetryDeadLetterList,
};
use sqlx::PgPool;

use crate::support::{
    Driver, SECRET, journal_dead_letter, retry_dead_letter, spawn_app, spawn_app_on,
};

const RETRY: &str = "/v1/internal/persistence-retry/dead-letters";
const JOURNAL: &str = "/v1/internal/session-lifecycle-journal/dead-letters";

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_dead_letter_shows_its_payload_and_every_check(pool: PgPool) {
    for driver in Driver::ALL {
        let mut app = spawn_app_on(pool.clone(), driver).await;
        let retry_id = retry_dead_letter(&mut app).await;
        let journal_id = journal_dead_letter(&app, "s-op").await;
        app.state
            .coord
            .session_activate("s-op", shardkeep::Ttl::from_secs(60).unwrap())
            .await
            .unwrap();

        let retry: RetryDeadLetterDetail = app
            .client
            .get(&format!("{RETRY}/{retry_id}"))
            .await
            .unwrap();
        assert_eq!(retry.dead_letter.dead_letter_id, retry_id);
        assert_eq!(retry.payload["room"], "r0");
        assert_eq!(retry.checks.session_impact, "none");
        assert_eq!(retry.checks.session_token.as_deref(), Some("session-9"));
        assert!(!retry.checks.session_active_again);
        assert_eq!(retry.checks.deletes_resume_ledger, Some(false));
        assert_eq!(retry.checks.transfer_already_confirmed, Some(false));

        let journal: JournalDeadLetterDetail = app
            .client
            .get(&format!("{JOURNAL}/{journal_id}"))
            .await
            .unwrap();
        assert_eq!(journal.payload["player"]["character_name"], "Aria");
        assert!(journal.checks.session_active_again);
        assert_eq!(journal.checks.deletes_resume_ledger, Some(true));
        assert_eq!(journal.checks.transfer_already_confirmed, Some(false));
        let list: JournalDeadLetterList = app.client.get(JOURNAL).await.unwrap();
        assert_eq!(
            list.dead_letters[0].plan.as_deref(),
            Some("permanent_removal")
        );
        assert_eq!(list.dead_letters[0].transfer_confirmed, Some(false));

        let by_name: JournalDeadLetterList = app
            .client
            .get(&format!("{JOURNAL}?character=ARIA"))
            .await
            .unwrap();
        assert_eq!(by_name.dead_letters.len(), 1);
        let none: RetryDeadLetterList = app
            .client
            .get(&format!("{RETRY}?character={}", uuid::Uuid::now_v7()))
            .await
            .unwrap();
        assert!(none.dead_letters.is_empty());
        let skipped: RetryDeadLetterList =
            app.client.get(&format!("{RETRY}?offset=1")).await.unwrap();
        assert!(skipped.dead_letters.is_empty());

        for (path, code) in [
            (format!("{RETRY}/not-a-uuid"), "invalid_dead_letter_id"),
            (format!("{JOURNAL}/{}", uuid::Uuid::now_v7()), "not_found"),
            (format!("{RETRY}/{}", uuid::Uuid::now_v7()), "not_found"),
            (format!("{RETRY}?offset=-1"), "invalid_offset"),
        ] {
            let err = app
                .client
                .get::<serde_json::Value>(&path)
                .await
                .unwrap_err();
            assert!(err.to_string().starts_with(code), "{path}: {err}");
        }
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_journal_dead_letter_deep_in_the_list_is_found_and_requeued(pool: PgPool) {
    for driver in Driver::ALL {
        let app = spawn_app_on(pool.clone(), driver).await;
        let oldest = journal_dead_letter(&app, "s-deep").await;
        // Push it far below the newest 10,000 the old requeue searched.
        let keys = app.state.coord.keys();
        match &app.rows {
            shardkeep_testkit::JobDriver::Postgres(_) => {
                let dead = keys.queue(shardkeep::journal::JOURNAL_QUEUE).unwrap().dead;
                let mut raw = app.redis().raw().await;
                let filler: Vec<String> =
                    (0..10_500).map(|i| format!("{{\"filler\":{i}}}")).collect();
                let _: () = redis::cmd("LPUSH")
                    .arg(&dead)
                    .arg(&filler)
                    .query_async(&mut raw)
                    .await
                    .unwrap();
            }
            shardkeep_testkit::JobDriver::Embedded(db) => {
                let queue =
                    shardkeep::queue::embedded_queue_name(keys, shardkeep::journal::JOURNAL_QUEUE);
                sqlx::query(
                    "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 10500)
                     INSERT INTO queue_dead_letters (queue, dead_letter_id, body, failed_at)
                     SELECT ?1, randomblob(16), '{\"filler\":' || n || '}', ?2 FROM g",
                )
                .bind(queue)
                .bind(chrono::Utc::now().timestamp_micros())
                .execute(db.pool())
                .await
                .unwrap();
            }
        }
        let listed = app.state.journal.inspect(1).await.unwrap().0;
        assert!(listed.dead > 10_000, "{driver:?}: {listed:?}");
        let detail: JournalDeadLetterDetail = app
            .client
            .get(&format!("{JOURNAL}/{oldest}"))
            .await
            .unwrap();
        assert_eq!(detail.dead_letter.dead_letter_id, oldest);
        assert!(
            app.state.journal.requeue(oldest).await.unwrap().is_some(),
            "any retained dead letter can be requeued"
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn retention_bounds_both_kinds_of_dead_letters(pool: PgPool) {
    for driver in Driver::ALL {
        let mut app = spawn_app_on(pool.clone(), driver).await;
        retry_dead_letter(&mut app).await;
        let first = journal_dead_letter(&app, "s-r1").await;
        let second = journal_dead_letter(&app, "s-r2").await;
        let keep_one = DeadLetterRetention {
            max_age: std::time::Duration::from_secs(86_400),
            max_count: 1,
        };
        assert_eq!(
            app.state
                .journal
                .dead_letters_prune(keep_one)
                .await
                .unwrap(),
            1
        );
        assert!(
            app.state
                .journal
                .queue()
                .dead_letter(first)
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            app.state
                .journal
                .queue()
                .dead_letter(second)
                .await
                .unwrap()
                .is_some()
        );
        if let Driver::Servers = driver {
            // Redis keeps an index hash beside the list (the file's table is its own index).
            let index_len: i64 = redis::cmd("HLEN")
                .arg(
                    &app.state
                        .coord
                        .keys()
                        .queue(shardkeep::journal::JOURNAL_QUEUE)
                        .unwrap()
                        .dead_index,
                )
                .query_async(&mut shardkeep_testkit::redis_backend("raw").await.conn())
                .await
                .unwrap();
            assert_eq!(index_len, 1, "the index is pruned with the list");
        }
        // By age: a retry dead letter a day and more old goes, the fresh one stays.
        let two_days_ago = match driver {
            Driver::Servers => "now() - interval '2 days'",
            Driver::Embedded => "now() - 172800000000",
        };
        app.rows
            .execute(
                &format!("UPDATE persistence_job_dead_letters SET failed_at = {two_days_ago}"),
                None,
            )
            .await
            .unwrap();
        retry_dead_letter(&mut app).await;
        let pruned = app
            .state
            .retry
            .dead_letters_prune(DeadLetterRetention {
                max_age: std::time::Duration::from_secs(86_400),
                max_count: 100,
            })
            .await
            .unwrap();
        assert_eq!(pruned, 1);
        let left: RetryDeadLetterList = app.client.get(RETRY).await.unwrap();
        assert_eq!(left.active_dead_letters, 1);
    }
}

#[test]
fn the_committed_openapi_document_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let generated = shardkeep_ops::openapi::document();
    if committed.trim() != generated.trim() {
        if std::env::var_os("SHARDKEEP_WRITE_OPENAPI").is_some() {
            std::fs::write(path, format!("{generated}\n")).unwrap();
        }
        panic!(
            "docs/openapi.json is out of date; rerun with SHARDKEEP_WRITE_OPENAPI=1 to rewrite it"
        );
    }
}

#[test]
fn the_openapi_document_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
    let output = Command::new("python3")
        .args(["-m", "openapi_spec_validator", path])
        .output()
        .expect("python3 with openapi-spec-validator (scripts/test installs it)");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn the_openapi_document_is_served_signed(pool: PgPool) {
    let app = spawn_app(pool).await;
    let served: serde_json::Value = app.client.get("/v1/internal/openapi.json").await.unwrap();
    assert_eq!(served["openapi"], "3.1.0");
    assert!(served["paths"][format!("{RETRY}/{{id}}")].is_object());
    let unsigned = app
        .http
        .get(format!("{}/v1/internal/openapi.json", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(unsigned.status().as_u16(), 401);
}

/// Runs a signing example off the runtime thread (the server under test shares it).
async fn script(
    program: &str,
    file: &str,
    base: &str,
    secret: &str,
    args: &[&str],
) -> (i32, String, String) {
    let (program, file, base, secret) = (
        program.to_owned(),
        file.to_owned(),
        base.to_owned(),
        secret.to_owned(),
    );
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || run_script(&program, &file, &base, &secret, &args))
        .await
        .unwrap()
}

fn run_script(
    program: &str,
    file: &str,
    base: &str,
    secret: &str,
    args: &[String],
) -> (i32, String, String) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/signing");
    let output = Command::new(program)
        .arg(format!("{dir}/{file}"))
        .args(["--base", base, "--key-id", "ops"])
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("SHARDKEEP_SECRET", secret)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn the_signing_examples_call_the_api(pool: PgPool) {
    let mut app = spawn_app(pool).await;
    let id = retry_dead_letter(&mut app).await;
    let secret = std::str::from_utf8(SECRET).unwrap();
    let list = format!("{RETRY}?limit=5");
    for (program, file) in [
        ("python3", "shardkeep_sign.py"),
        ("bash", "shardkeep_sign.sh"),
    ] {
        let (code, out, err) = script(program, file, &app.base, secret, &["GET", &list]).await;
        assert_eq!(code, 0, "{file}: {err}");
        let body: RetryDeadLetterList = serde_json::from_str(&out).unwrap();
        assert_eq!(body.active_dead_letters, 1, "{file}");
        let (code, _, err) = script(
            program,
            file,
            &app.base,
            "not-the-right-secret-at-all",
            &["GET", &list],
        )
        .await;
        assert_eq!(code, 1, "{file}");
        assert!(err.contains("bad_signature"), "{file}: {err}");
    }
    let body = format!(r#"{{"rpc_version":1,"dead_letter_id":"{id}"}}"#);
    let requeue = format!("{RETRY}/requeue");
    let (code, out, err) = script(
        "python3",
        "shardkeep_sign.py",
        &app.base,
        secret,
        &["POST", &requeue, "--body", &body],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"requeued\": true"), "{out}");
}

/// Metric names an alert rule or a dashboard panel uses.
fn names_in(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("shardkeep_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let base = ["_sum", "_count", "_bucket"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        names.insert(base.to_owned());
        rest = &tail[end..];
    }
    names
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn every_metric_an_alert_or_panel_names_is_exported(pool: PgPool) {
    let mut app = spawn_app(pool).await;
    retry_dead_letter(&mut app).await;
    crate::support::saver_and_auditor_workload(&app).await;
    app.http
        .get(format!("{}/readyz", app.base))
        .send()
        .await
        .unwrap();
    // An unsigned call: an auth failure.
    app.http
        .get(format!("{}{RETRY}", app.base))
        .send()
        .await
        .unwrap();
    let exported = app
        .http
        .get(format!("{}/metrics", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let alerts = std::fs::read_to_string(format!("{root}/deploy/prometheus/alerts.yml")).unwrap();
    let dashboard =
        std::fs::read_to_string(format!("{root}/deploy/grafana/shardkeep.json")).unwrap();
    let mut wanted = names_in(&alerts);
    wanted.extend(names_in(&dashboard));
    let missing: Vec<&String> = wanted
        .iter()
        .filter(|name| {
            !exported.contains(&format!("\n{name}")) && !exported.starts_with(name.as_str())
        })
        .collect();
    assert!(
        missing.is_empty(),
        "named in deploy/ but not exported: {missing:?}"
    );
}

/// The value of the series `name` whose labels contain `labels` in `/metrics`, or 0.
async fn metric(app: &crate::support::TestApp, name: &str, labels: &str) -> f64 {
    let text = app
        .http
        .get(format!("{}/metrics", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|line| line.starts_with(name) && line.contains(labels))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn the_operator_signals_count_what_happened(pool: PgPool) {
    use shardkeep::journal::{ActiveSessions, cleanup_stream};
    let app = spawn_app(pool).await;
    let journal = shardkeep::journal::JOURNAL_QUEUE;
    let queue_label = format!("queue=\"{journal}\"");
    let keys = app.state.coord.keys().queue(journal).unwrap();
    let mut raw = shardkeep_testkit::redis_backend("raw").await.conn();

    // A consumer that dropped out of the registered set is registered again by its heartbeat.
    let before = metric(
        &app,
        "shardkeep_queue_consumers_reregistered_total",
        &queue_label,
    )
    .await;
    let consumer = app.state.journal.queue().consumer().await.unwrap();
    let _: i64 = redis::cmd("SREM")
        .arg(&keys.consumers)
        .arg(consumer.id())
        .query_async(&mut raw)
        .await
        .unwrap();
    consumer.heartbeat().await.unwrap();
    let after = metric(
        &app,
        "shardkeep_queue_consumers_reregistered_total",
        &queue_label,
    )
    .await;
    // At least: the recorder is shared with tests running beside this one.
    assert!(after - before >= 1.0, "{before} → {after}");
    consumer.shutdown().await.unwrap();

    // A crashed consumer nobody has registered: only the backstop finds its entry.
    let before = metric(
        &app,
        "shardkeep_queue_backstop_recovered_total",
        &queue_label,
    )
    .await;
    let dead = journal_dead_letter(&app, "s-backstop").await;
    app.state.journal.requeue(dead).await.unwrap();
    let mut lost = app.state.journal.queue().consumer().await.unwrap();
    assert!(lost.lease().await.unwrap().is_some());
    let id = lost.id().to_owned();
    lost.abandon();
    let _: i64 = redis::cmd("SREM")
        .arg(&keys.consumers)
        .arg(&id)
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(keys.consumer_heartbeat(&id).unwrap())
        .query_async(&mut raw)
        .await
        .unwrap();
    // The backstop walks the keyspace a bounded slice per pass (the test server is shared).
    let mut returned = 0;
    for _ in 0..500 {
        returned += app.state.journal.queue().recover().await.unwrap().returned;
        if returned > 0 {
            break;
        }
    }
    assert_eq!(returned, 1);
    let after = metric(
        &app,
        "shardkeep_queue_backstop_recovered_total",
        &queue_label,
    )
    .await;
    // At least: the recorder is shared with tests running beside this one.
    assert!(after - before >= 1.0, "{before} → {after}");
    let depths = app.state.journal.queue().depths().await.unwrap();
    assert_eq!(depths.pending, 1, "the entry is back in pending");

    // A stream-close cleanup that cannot reach the journal is counted (and the session stays).
    use shardkeep::backend::redis::RedisTimeouts;
    use shardkeep_testkit::faults::{ProxyControl, ProxyMode};
    let (proxy, cut) = shardkeep_testkit::faults::proxied_redis(
        &shardkeep_testkit::redis_url(),
        app.state.coord.keys().clone(),
        RedisTimeouts {
            connect: std::time::Duration::from_millis(300),
            response: std::time::Duration::from_millis(300),
        },
    )
    .await
    .unwrap();
    let cut_journal = shardkeep::journal::SessionJournal::new(
        cut.clone(),
        shardkeep::queue::WorkQueueConfig::default(),
    )
    .unwrap();
    let cut_coord = shardkeep::Coordination::new(cut, shardkeep::CoordinationConfig::default());
    proxy.set_mode(ProxyMode::Cut);
    let before = metric(&app, "shardkeep_cleanup_enqueue_failures_total", "").await;
    let cleanup = crate::support::cleanup_item("s-cut");
    let outcome = cleanup_stream(
        &cut_journal,
        &ActiveSessions::default(),
        &cut_coord,
        cleanup,
    )
    .await;
    assert!(outcome.enqueue_error.is_some());
    let after = metric(&app, "shardkeep_cleanup_enqueue_failures_total", "").await;
    // At least: the recorder is shared with tests running beside this one.
    assert!(after - before >= 1.0, "{before} → {after}");
}
