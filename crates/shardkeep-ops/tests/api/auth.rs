use reqwest::Method;
use serde_json::json;
use sqlx::PgPool;

use crate::support::{Driver, Raw, TestApp, retry_dead_letter, spawn_app, spawn_app_on};

const REQUEUE: &str = "/v1/internal/persistence-retry/dead-letters/requeue";

fn requeue_body(id: uuid::Uuid) -> Vec<u8> {
    serde_json::to_vec(&json!({ "rpc_version": 1, "dead_letter_id": id })).unwrap()
}

async fn still_dead(app: &TestApp) -> bool {
    app.count("SELECT count(*) FROM persistence_job_dead_letters WHERE requeued_at IS NULL")
        .await
        == 1
        && app
            .count("SELECT count(*) FROM persistence_retry_jobs")
            .await
            == 0
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_missing_header_is_refused_and_nothing_changes(pool: PgPool) {
    for driver in Driver::ALL {
        let mut app = spawn_app_on(pool.clone(), driver).await;
        let id = retry_dead_letter(&mut app).await;
        let response = app
            .http
            .post(format!("{}{REQUEUE}", app.base))
            .body(requeue_body(id))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 401);
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "missing_header");
        assert!(body["error"]["message"].is_string());
        assert!(still_dead(&app).await);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_tampered_body_is_a_bad_signature_and_nothing_changes(pool: PgPool) {
    for driver in Driver::ALL {
        let mut app = spawn_app_on(pool.clone(), driver).await;
        let id = retry_dead_letter(&mut app).await;
        let mut raw = Raw::new(Method::POST, REQUEUE, &requeue_body(id));
        raw.signed_body = Some(requeue_body(uuid::Uuid::now_v7()));
        let (status, body) = raw.send(&app).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (401, Some("bad_signature"))
        );
        assert!(still_dead(&app).await);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_wrong_key_is_refused_and_nothing_changes(pool: PgPool) {
    for driver in Driver::ALL {
        let mut app = spawn_app_on(pool.clone(), driver).await;
        let id = retry_dead_letter(&mut app).await;
        let mut unknown = Raw::new(Method::POST, REQUEUE, &requeue_body(id));
        unknown.key_id = "stranger".into();
        let (status, body) = unknown.send(&app).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (401, Some("unknown_key"))
        );
        // A known key id with the wrong secret is a bad signature.
        let mut wrong_secret = Raw::new(Method::POST, REQUEUE, &requeue_body(id));
        wrong_secret.secret = b"not-the-secret-at-all".to_vec();
        let (status, body) = wrong_secret.send(&app).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (401, Some("bad_signature"))
        );
        assert!(still_dead(&app).await);
        // The rotated-in second key works.
        let mut rotated = Raw::new(Method::POST, REQUEUE, &requeue_body(id));
        rotated.key_id = "old".into();
        rotated.secret = b"fedcba9876543210fedc".to_vec();
        let (status, body) = rotated.send(&app).await;
        assert_eq!((status, body["requeued"].as_bool()), (200, Some(true)));
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_old_timestamp_is_stale_and_nothing_changes(pool: PgPool) {
    for driver in Driver::ALL {
        let mut app = spawn_app_on(pool.clone(), driver).await;
        let id = retry_dead_letter(&mut app).await;
        for skew in [-301, 301] {
            let mut raw = Raw::new(Method::POST, REQUEUE, &requeue_body(id));
            raw.timestamp += skew;
            let (status, body) = raw.send(&app).await;
            assert_eq!(
                (status, body["error"]["code"].as_str()),
                (401, Some("stale_timestamp")),
                "skew {skew}"
            );
        }
        assert!(still_dead(&app).await);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_replayed_nonce_is_refused_before_the_handler_runs(pool: PgPool) {
    for driver in Driver::ALL {
        use shardkeep::coord::PresenceRecord;
        let app = spawn_app_on(pool.clone(), driver).await;
        let coord = &app.state.coord;
        let put = |n: u32| PresenceRecord {
            account_id: format!("a{n}"),
            character_id: format!("c{n}"),
            session_token: format!("s{n}"),
            shard_id: "s".into(),
            zone_id: None,
            expires_at: chrono::Utc::now() + chrono::Duration::minutes(5),
        };
        coord.presence_put(&put(1)).await.unwrap();
        let body = serde_json::to_vec(&json!({ "target": "presence", "mode": "delete" })).unwrap();
        let raw = Raw::new(Method::POST, "/v1/internal/admin/cleanup", &body);
        let (status, first) = raw.send(&app).await;
        assert_eq!(status, 200);
        // The two presence records; Redis also holds the two index sets that list them (the
        // file indexes its records in their table).
        let records_and_indexes = match driver {
            Driver::Servers => 4,
            Driver::Embedded => 2,
        };
        assert_eq!(first["deleted"], records_and_indexes, "{driver:?}");
        // New presence arrives; the replayed request must not get to delete it.
        coord.presence_put(&put(2)).await.unwrap();
        let (status, replay) = raw.send(&app).await;
        assert_eq!(
            (status, replay["error"]["code"].as_str()),
            (401, Some("replayed_nonce"))
        );
        assert!(
            coord.presence_by_account("a2").await.unwrap().is_some(),
            "the replay changed nothing"
        );
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn malformed_headers_and_oversized_bodies_are_refused(pool: PgPool) {
    for driver in Driver::ALL {
        let mut app = spawn_app_on(pool.clone(), driver).await;
        let id = retry_dead_letter(&mut app).await;
        let mut short_nonce = Raw::new(Method::POST, REQUEUE, &requeue_body(id));
        short_nonce.nonce = "short".into();
        let (status, body) = short_nonce.send(&app).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (401, Some("malformed_header"))
        );
        let bad_time = app
            .http
            .post(format!("{}{REQUEUE}", app.base))
            .header("x-shardkeep-key-id", "ops")
            .header("x-shardkeep-timestamp", "yesterday")
            .header("x-shardkeep-nonce", "0123456789abcdefghij")
            .header("x-shardkeep-signature", "00")
            .send()
            .await
            .unwrap();
        assert_eq!(bad_time.status().as_u16(), 401);
        let huge = vec![b'x'; 64 * 1024 + 1];
        let (status, body) = Raw::new(Method::POST, REQUEUE, &huge).send(&app).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (413, Some("payload_too_large"))
        );
        assert!(still_dead(&app).await);
    }
}

/// An oversized body (3 MiB against the 64 KiB limit) is read and dropped before the 413 goes
/// out, so the client still sending it gets the answer rather than a reset; the 413 says
/// `connection: close`, and the client's next request goes out on a fresh connection instead of
/// failing on the abandoned one.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn an_oversized_body_closes_its_connection_and_the_next_request_is_answered(pool: PgPool) {
    let app = spawn_app(pool).await;
    let huge = vec![b'x'; 3 << 20];
    for round in 0..20 {
        let response = app
            .http
            .post(format!("{}/v1/internal/admin/cleanup", app.base))
            .header("content-type", "application/json")
            .body(huge.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 413);
        let connection = response
            .headers()
            .get(reqwest::header::CONNECTION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_ascii_lowercase);
        assert_eq!(connection.as_deref(), Some("close"), "round {round}");
        let _ = response.bytes().await;
        let next = app.http.get(format!("{}/healthz", app.base)).send().await;
        assert!(
            next.is_ok(),
            "round {round}: the next request was lost: {next:?}"
        );
    }
}

/// A client that sends its oversized body at its own pace (3 MiB in 64 KiB chunks) is read to
/// the end and then answered 413; the server does not close on it halfway, which would reset
/// the connection under the client's writes and lose the answer.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_slowly_sent_oversized_body_is_answered_not_reset(pool: PgPool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = spawn_app(pool).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let length = 3 << 20;
    let head = format!(
        "POST /v1/internal/admin/cleanup HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b'x'; 64 << 10];
    for sent in 0..(length / chunk.len()) {
        if let Err(err) = socket.write_all(&chunk).await {
            panic!("the server dropped the connection after {sent} chunks: {err}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let mut answer = Vec::new();
    let _ = socket.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
}
