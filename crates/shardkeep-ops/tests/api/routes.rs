use reqwest::Method;
use serde_json::{Value, json};
use shardkeep::Ttl;
use shardkeep::audit::{AuditEvent, Tier};
use shardkeep::character::NewCharacter;
use shardkeep_ops::client::ClientError;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{Driver, journal_dead_letter, retry_dead_letter, spawn_app_on};

const RETRY: &str = "/v1/internal/persistence-retry/dead-letters";
const JOURNAL: &str = "/v1/internal/session-lifecycle-journal/dead-letters";

fn code(err: ClientError) -> (u16, String) {
    match err {
        ClientError::Api { status, code, .. } => (status, code),
        other => panic!("expected an API error, got {other}"),
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn retry_dead_letters_list_and_requeue(pool: PgPool) {
    for driver in Driver::ALL {
        let mut app = spawn_app_on(pool.clone(), driver).await;
        let id = retry_dead_letter(&mut app).await;
        let listed = app
            .client
            .call(Method::GET, &format!("{RETRY}?limit=10"), None)
            .await
            .unwrap();
        assert_eq!(
            (
                listed["pending_retry_jobs"].as_i64(),
                listed["active_dead_letters"].as_i64()
            ),
            (Some(0), Some(1))
        );
        let letter = &listed["dead_letters"][0];
        assert_eq!(letter["dead_letter_id"], json!(id));
        for field in [
            "retry_job_id",
            "job_kind",
            "character_id",
            "realm_id",
            "zone_id",
            "failed_attempts",
            "error",
            "failed_at",
            "session_token",
            "source",
            "session_impact",
        ] {
            assert!(letter.get(field).is_some(), "summary lacks {field}");
        }
        let body = json!({ "rpc_version": 1, "dead_letter_id": id });
        let requeued = app
            .client
            .call(Method::POST, &format!("{RETRY}/requeue"), Some(&body))
            .await
            .unwrap();
        assert_eq!(requeued["requeued"], true);
        let job_id: Uuid = serde_json::from_value(requeued["retry_job_id"].clone()).unwrap();
        let (stored,): (Uuid,) = app
            .rows
            .fetch_one("SELECT retry_job_id FROM persistence_retry_jobs", None)
            .await;
        assert_eq!(stored, job_id);
        let again = app
            .client
            .call(Method::POST, &format!("{RETRY}/requeue"), Some(&body))
            .await
            .unwrap();
        assert_eq!(again, json!({ "requeued": false }));
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn bad_requeue_input_changes_nothing(pool: PgPool) {
    for driver in Driver::ALL {
        let mut app = spawn_app_on(pool.clone(), driver).await;
        let id = retry_dead_letter(&mut app).await;
        let cases = [
            (
                json!({ "rpc_version": 2, "dead_letter_id": id }),
                409,
                "rpc_version_mismatch",
            ),
            (json!({ "dead_letter_id": id }), 409, "rpc_version_mismatch"),
            (json!({ "rpc_version": 1 }), 400, "invalid_dead_letter_id"),
            (
                json!({ "rpc_version": 1, "dead_letter_id": "" }),
                400,
                "invalid_dead_letter_id",
            ),
            (
                json!({ "rpc_version": 1, "dead_letter_id": "not-a-uuid" }),
                400,
                "invalid_dead_letter_id",
            ),
        ];
        for path in [format!("{RETRY}/requeue"), format!("{JOURNAL}/requeue")] {
            for (body, status, expected) in &cases {
                let err = app
                    .client
                    .call(Method::POST, &path, Some(body))
                    .await
                    .unwrap_err();
                assert_eq!(
                    code(err),
                    (*status, (*expected).to_owned()),
                    "{path} {body}"
                );
            }
        }
        assert_eq!(
            app.count(
                "SELECT count(*) FROM persistence_job_dead_letters WHERE requeued_at IS NULL"
            )
            .await,
            1
        );
        assert_eq!(
            app.count("SELECT count(*) FROM persistence_retry_jobs")
                .await,
            0
        );
        let unknown = json!({ "rpc_version": 1, "dead_letter_id": Uuid::now_v7() });
        assert_eq!(
            app.client
                .call(Method::POST, &format!("{RETRY}/requeue"), Some(&unknown))
                .await
                .unwrap(),
            json!({ "requeued": false })
        );
        let _ = id;
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn limits_are_clamped_and_malformed_limits_refused(pool: PgPool) {
    for driver in Driver::ALL {
        let app = spawn_app_on(pool.clone(), driver).await;
        for path in [RETRY, JOURNAL] {
            for good in ["?limit=0", "?limit=100000", ""] {
                app.client
                    .call(Method::GET, &format!("{path}{good}"), None)
                    .await
                    .unwrap();
            }
            for bad in ["?limit=abc", "?limit=", "?limit=1.5"] {
                let err = app
                    .client
                    .call(Method::GET, &format!("{path}{bad}"), None)
                    .await
                    .unwrap_err();
                assert_eq!(code(err), (400, "invalid_limit".to_owned()), "{path}{bad}");
            }
        }
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn racing_requeues_over_http_make_one_job(pool: PgPool) {
    for driver in Driver::ALL {
        let mut app = spawn_app_on(pool.clone(), driver).await;
        let id = retry_dead_letter(&mut app).await;
        let body = json!({ "rpc_version": 1, "dead_letter_id": id });
        let path = format!("{RETRY}/requeue");
        let (a, b, c) = tokio::join!(
            app.client.call(Method::POST, &path, Some(&body)),
            app.client.call(Method::POST, &path, Some(&body)),
            app.client.call(Method::POST, &path, Some(&body))
        );
        let wins = [a.unwrap(), b.unwrap(), c.unwrap()]
            .iter()
            .filter(|r| r["requeued"] == true)
            .count();
        assert_eq!(wins, 1);
        assert_eq!(
            app.count("SELECT count(*) FROM persistence_retry_jobs")
                .await,
            1
        );
        let journal_id = journal_dead_letter(&app, "s-race").await;
        let body = json!({ "rpc_version": 1, "dead_letter_id": journal_id });
        let path = format!("{JOURNAL}/requeue");
        let (a, b) = tokio::join!(
            app.client.call(Method::POST, &path, Some(&body)),
            app.client.call(Method::POST, &path, Some(&body))
        );
        let results = [a.unwrap(), b.unwrap()];
        assert_eq!(results.iter().filter(|r| r["requeued"] == true).count(), 1);
        assert!(results.iter().any(|r| r.get("entry_id").is_some()));
        assert_eq!(app.state.journal.queue().depths().await.unwrap().pending, 1);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn journal_dead_letters_list_with_their_summaries(pool: PgPool) {
    for driver in Driver::ALL {
        let app = spawn_app_on(pool.clone(), driver).await;
        let id = journal_dead_letter(&app, "s-77").await;
        let listed = app.client.call(Method::GET, JOURNAL, None).await.unwrap();
        assert_eq!(
            (
                listed["pending"].as_u64(),
                listed["processing"].as_u64(),
                listed["dead"].as_u64()
            ),
            (Some(0), Some(0), Some(1))
        );
        let letter = &listed["dead_letters"][0];
        assert_eq!(letter["dead_letter_id"], json!(id));
        assert_eq!(letter["session_token"], "s-77");
        assert_eq!(letter["character_name"], "Aria");
        assert_eq!(letter["attempts"], 1);
        assert_eq!(letter["error"], "store down");
        for field in ["entry_id", "failed_at", "character_id"] {
            assert!(letter.get(field).is_some(), "{field}");
        }
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn admin_cleanup_targets_dry_runs_and_deletes(pool: PgPool) {
    for driver in Driver::ALL {
        let app = spawn_app_on(pool.clone(), driver).await;
        let coord = &app.state.coord;
        coord
            .handoff_put(
                "tok",
                &shardkeep::HandoffScope::Instance("i".into()),
                b"x",
                Ttl::from_secs(60).unwrap(),
            )
            .await
            .unwrap();
        let targets = app
            .client
            .call(Method::GET, "/v1/internal/admin/cleanup-targets", None)
            .await
            .unwrap();
        let names: Vec<&str> = targets["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, vec!["presence", "handoff", "registry"]);
        assert!(targets["targets"][1]["scan_patterns"].is_array());
        assert_eq!(targets["targets"][0]["owner"], "game_server");
        let dry = app
            .client
            .call(
                Method::POST,
                "/v1/internal/admin/cleanup",
                Some(&json!({ "target": "handoff", "mode": "dry_run" })),
            )
            .await
            .unwrap();
        assert_eq!(
            (dry["matched"].as_u64(), dry["deleted"].as_u64()),
            (Some(1), Some(0))
        );
        let deleted = app
            .client
            .call(
                Method::POST,
                "/v1/internal/admin/cleanup",
                Some(&json!({ "target": "handoff", "mode": "delete" })),
            )
            .await
            .unwrap();
        assert_eq!(deleted["deleted"], 1);
        assert_eq!(deleted["deleted_keys"].as_array().unwrap().len(), 1);
        for (body, expected) in [
            (
                json!({ "target": "everything", "mode": "delete" }),
                "unknown_target",
            ),
            (
                json!({ "target": "handoff", "mode": "nuke" }),
                "invalid_body",
            ),
            (json!({ "mode": "delete" }), "invalid_body"),
        ] {
            let err = app
                .client
                .call(Method::POST, "/v1/internal/admin/cleanup", Some(&body))
                .await
                .unwrap_err();
            assert_eq!(code(err), (400, expected.to_owned()), "{body}");
        }
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn audit_views_over_http(pool: PgPool) {
    for driver in Driver::ALL {
        let app = spawn_app_on(pool.clone(), driver).await;
        let accounts = app.accounts();
        let account = Uuid::now_v7();
        accounts
            .create_account(account, Tier::Player)
            .await
            .unwrap();
        let character = Uuid::now_v7();
        accounts
            .create_character(
                &NewCharacter {
                    character_id: character,
                    account_id: account,
                    name: "Aria".into(),
                    zone_ref: None,
                    room_ref: None,
                    state: json!({}).into(),
                    chargen: None,
                    schema_version: 1,
                },
                None,
            )
            .await
            .unwrap();
        app.audit_store()
            .record(&[AuditEvent::track(character, "smithing", 1)])
            .await
            .unwrap();
        let own = app
            .client
            .call(
                Method::GET,
                &format!("/v1/internal/audit/characters/{character}?limit=1"),
                None,
            )
            .await
            .unwrap();
        assert_eq!(own["rows"].as_array().unwrap().len(), 1);
        assert_eq!(own["rows"][0]["event_kind"], "track");
        let next = &own["next"];
        let older = app
            .client
            .call(
                Method::GET,
                &format!(
                    "/v1/internal/audit/characters/{character}?before_at={}&before_seq={}",
                    next["at"].as_str().unwrap().replace('+', "%2B"),
                    next["seq"]
                ),
                None,
            )
            .await
            .unwrap();
        assert_eq!(older["rows"][0]["event_kind"], "created");
        let staff = app
            .client
            .call(
                Method::GET,
                &format!(
                    "/v1/internal/audit/staff?name=aria&viewer_account_id={}&viewer_tier=admin",
                    Uuid::now_v7()
                ),
                None,
            )
            .await
            .unwrap();
        assert_eq!(staff["rows"].as_array().unwrap().len(), 2);
        let refused = app
            .client
            .call(
                Method::GET,
                &format!(
                    "/v1/internal/audit/staff?name=aria&viewer_account_id={}&viewer_tier=player",
                    Uuid::now_v7()
                ),
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(code(refused), (403, "forbidden".to_owned()));
        for bad in [
            "/v1/internal/audit/characters/not-a-uuid".to_owned(),
            format!("/v1/internal/audit/characters/{character}?before_at=yesterday&before_seq=1"),
            format!("/v1/internal/audit/characters/{character}?before_seq=1"),
            "/v1/internal/audit/staff?name=aria&viewer_account_id=x&viewer_tier=admin".to_owned(),
            format!(
                "/v1/internal/audit/staff?name=aria&viewer_account_id={}&viewer_tier=king",
                Uuid::now_v7()
            ),
            format!(
                "/v1/internal/audit/staff?viewer_account_id={}&viewer_tier=admin",
                Uuid::now_v7()
            ),
        ] {
            let err = app.client.call(Method::GET, &bad, None).await.unwrap_err();
            assert_eq!(code(err).0, 400, "{bad}");
        }
        let missing = app
            .client
            .call(
                Method::GET,
                &format!(
                    "/v1/internal/audit/staff?name=nobody&viewer_account_id={}&viewer_tier=admin",
                    Uuid::now_v7()
                ),
                None,
            )
            .await
            .unwrap_err();
        assert_eq!(code(missing), (404, "not_found".to_owned()));
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn health_readiness_and_metrics(pool: PgPool) {
    for driver in Driver::ALL {
        let mut app = spawn_app_on(pool.clone(), driver).await;
        let health: Value = app
            .http
            .get(format!("{}/healthz", app.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(health["status"], "ok");
        let ready = app
            .http
            .get(format!("{}/readyz", app.base))
            .send()
            .await
            .unwrap();
        assert_eq!(ready.status().as_u16(), 200);
        let ready: Value = ready.json().await.unwrap();
        assert_eq!(
            (
                ready["postgres"].as_bool(),
                ready["redis"].as_bool(),
                ready["migrations_current"].as_bool()
            ),
            (Some(true), Some(true), Some(true))
        );

        // A workload touching every family. The recorder is one per test process, so what
        // this driver's workload adds is read as the counters' growth over it.
        let before = metrics_text(&app).await;
        retry_dead_letter(&mut app).await;
        journal_dead_letter(&app, "s-m").await;
        app.state.journal.queue().depths().await.unwrap();
        app.state.journal.queue().recover().await.unwrap();
        app.client
            .call(
                Method::POST,
                "/v1/internal/admin/cleanup",
                Some(&json!({ "target": "presence", "mode": "delete" })),
            )
            .await
            .unwrap();
        let _ = app
            .http
            .get(format!("{}{RETRY}", app.base))
            .send()
            .await
            .unwrap();
        crate::support::saver_and_auditor_workload(&app).await;
        let text = app
            .http
            .get(format!("{}/metrics", app.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        for counter in [
            "shardkeep_retry_enqueued_total",
            "shardkeep_retry_claimed_total",
            "shardkeep_retry_outcomes_total",
            "shardkeep_queue_dead_letters_total",
            "shardkeep_saver_conflicts_total",
            "shardkeep_saver_dropped_total",
            "shardkeep_audit_batch_size_count",
            "shardkeep_http_requests_total",
        ] {
            assert!(
                family_total(&text, counter) > family_total(&before, counter),
                "{driver:?}: the workload did not move {counter}"
            );
        }
        for family in [
            "shardkeep_retry_enqueued_total",
            "shardkeep_retry_claimed_total",
            "shardkeep_retry_outcomes_total",
            "shardkeep_queue_depth",
            "shardkeep_queue_dead_letters_total",
            "shardkeep_saver_queue_depth",
            "shardkeep_saver_dropped_total",
            "shardkeep_saver_conflicts_total",
            "shardkeep_saver_flush_seconds",
            "shardkeep_audit_queue_depth",
            "shardkeep_audit_batch_size",
            "shardkeep_cleanup_deleted_total",
            "shardkeep_auth_failures_total",
            "shardkeep_http_requests_total",
            "shardkeep_http_request_seconds",
            "shardkeep_retry_rows",
            "shardkeep_retry_durable_only_total",
            "shardkeep_saver_ownership_lost_total",
            "shardkeep_queue_recovered_total",
            "shardkeep_audit_dropped_total",
        ] {
            assert!(text.contains(family), "/metrics lacks {family}");
        }
        assert!(
            text.contains(r#"route="/v1/internal/persistence-retry/dead-letters""#),
            "routes are labelled by pattern"
        );
        assert!(
            !text.contains("not-a-uuid"),
            "raw paths never become labels"
        );
    }
}

/// A worker that finishes no pass while work waits turns readiness off, naming it; one
/// deliberately held does not; a pass turns it back on.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn readiness_fails_while_a_worker_makes_no_progress_with_work_waiting(pool: PgPool) {
    use shardkeep::services::WorkerLiveness;
    use shardkeep_ops::WorkerWatch;
    let settings = shardkeep_ops::ApiSettings {
        stall_after: std::time::Duration::from_secs(1),
        ..shardkeep_ops::ApiSettings::default()
    };
    let app = crate::support::spawn_app_with(pool, settings).await;
    let liveness = WorkerLiveness::default();
    let pause = shardkeep::retry::RetryPause::default();
    let mut state = app.state.clone();
    state.workers = Some(WorkerWatch {
        liveness: liveness.clone(),
        retry_pause: pause.clone(),
    });
    let served = crate::support::serve(state).await;
    let base = &served.base;
    let ready = async || {
        let response = app.http.get(format!("{base}/readyz")).send().await.unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap();
        (status, body["stalled_workers"].clone())
    };
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(ready().await, (200, json!([])), "quiet, but nothing waits");

    app.state
        .journal
        .append(crate::support::cleanup_item("s-stall"))
        .await
        .unwrap();
    assert_eq!(ready().await, (503, json!(["journal"])));
    liveness.journal.touch();
    assert_eq!(ready().await.0, 200, "a pass finished");

    crate::support::retry_job_pending(&app).await;
    liveness.journal.touch();
    let (status, stalled) = ready().await;
    assert_eq!((status, stalled), (503, json!(["retry"])));
    pause.set(true);
    liveness.journal.touch();
    assert_eq!(
        ready().await.0,
        200,
        "a held retry worker is drained on purpose"
    );
}

/// What `/metrics` shows now.
async fn metrics_text(app: &crate::support::TestApp) -> String {
    app.http
        .get(format!("{}/metrics", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The sum of every sample of `family` (all label sets) in a Prometheus text exposition.
fn family_total(text: &str, family: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
