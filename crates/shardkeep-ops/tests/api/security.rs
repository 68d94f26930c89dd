//! The attacker's view: replays after a nonce would have expired, login guessing (exact limit,
//! parallel, per client, global ceiling, Redis down), console cookies and sessions.

use std::time::Duration;

use reqwest::Method;
use reqwest::header::{COOKIE, SET_COOKIE};
use serde_json::json;
use shardkeep_ops::ApiSettings;
use sqlx::PgPool;

use crate::support::{
    Driver, PASSWORD, Raw, TestApp, serve, spawn_app, spawn_app_of, spawn_app_on, spawn_app_with,
};

const LIST: &str = "/v1/internal/persistence-retry/dead-letters?limit=1";

fn settings() -> ApiSettings {
    ApiSettings {
        console_password: Some(PASSWORD.into()),
        trust_forwarded_headers: true,
        ..ApiSettings::default()
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_request_cannot_be_replayed_while_its_timestamp_is_still_accepted(pool: PgPool) {
    for driver in Driver::ALL {
        let app = spawn_app_of(
            pool.clone(),
            driver,
            ApiSettings {
                skew_seconds: 1,
                ..settings()
            },
        )
        .await;
        // Signed one second ahead: accepted now, and still accepted for up to two seconds more.
        let mut raw = Raw::new(Method::GET, LIST, b"");
        raw.timestamp += 1;
        assert_eq!(raw.send(&app).await.0, 200);
        tokio::time::sleep(Duration::from_millis(1_300)).await;
        let (status, body) = raw.send(&app).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (401, Some("replayed_nonce")),
            "a replay inside the accepted span must find its nonce"
        );
    }
}

async fn login_from(app: &TestApp, client: &str, password: &str) -> (u16, String, String) {
    login_at(&app.http, &app.base, client, password).await
}

async fn login_at(
    http: &reqwest::Client,
    base: &str,
    client: &str,
    password: &str,
) -> (u16, String, String) {
    let response = http
        .post(format!("{base}/console/login"))
        .header("x-forwarded-for", client)
        .json(&json!({ "password": password }))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let cookie = response
        .headers()
        .get(SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    let code = body["error"]["code"].as_str().unwrap_or("").to_owned();
    (status, code, cookie)
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_client_gets_exactly_ten_login_attempts_in_a_window(pool: PgPool) {
    for driver in Driver::ALL {
        let app = spawn_app_of(pool.clone(), driver, settings()).await;
        for attempt in 1..=10 {
            let (status, code, _) = login_from(&app, "10.0.0.1", "guess").await;
            assert_eq!((status, code.as_str()), (401, "bad_password"), "{attempt}");
        }
        // The eleventh is refused before the password is looked at, even the right one.
        let (status, code, _) = login_from(&app, "10.0.0.1", PASSWORD).await;
        assert_eq!((status, code.as_str()), (429, "throttled"));
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn parallel_guesses_cannot_pass_the_limit(pool: PgPool) {
    for driver in Driver::ALL {
        let app = spawn_app_of(pool.clone(), driver, settings()).await;
        let guesses = (0..30).map(|_| login_from(&app, "10.0.0.2", "guess"));
        let answers = futures::future::join_all(guesses).await;
        let wrong = answers.iter().filter(|a| a.0 == 401).count();
        let throttled = answers.iter().filter(|a| a.0 == 429).count();
        assert_eq!((wrong, throttled), (10, 20));
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn one_client_guessing_does_not_lock_out_another(pool: PgPool) {
    for driver in Driver::ALL {
        let app = spawn_app_of(pool.clone(), driver, settings()).await;
        for _ in 0..11 {
            login_from(&app, "10.0.0.3", "guess").await;
        }
        assert_eq!(login_from(&app, "10.0.0.3", PASSWORD).await.0, 429);
        assert_eq!(login_from(&app, "10.0.0.4", PASSWORD).await.0, 200);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn many_clients_together_meet_a_global_ceiling(pool: PgPool) {
    for driver in Driver::ALL {
        let app = spawn_app_of(
            pool.clone(),
            driver,
            ApiSettings {
                console_login_global_limit: 20,
                ..settings()
            },
        )
        .await;
        for client in 0..20 {
            let (status, _, _) = login_from(&app, &format!("10.1.0.{client}"), "guess").await;
            assert_eq!(status, 401);
        }
        let (status, code, _) = login_from(&app, "10.1.1.1", PASSWORD).await;
        assert_eq!((status, code.as_str()), (429, "throttled"));
    }
}

/// The login throttle lives in the fast tier: with it out of reach (Redis cut by a proxy, or
/// the file failing every call on the app's own connection) a login is refused, never let
/// through unthrottled.
#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_login_fails_closed_when_redis_is_down(pool: PgPool) {
    use shardkeep::backend::redis::RedisTimeouts;
    use shardkeep_testkit::faults::{ProxyControl, ProxyMode};
    for driver in Driver::ALL {
        let app = spawn_app_of(pool.clone(), driver, settings()).await;
        let mut state = app.state.clone();
        let keys = app.state.coord.keys().clone();
        let outage: Box<dyn std::any::Any> = match app.file_url() {
            None => {
                let (proxy, cut) = shardkeep_testkit::faults::proxied_redis(
                    &shardkeep_testkit::redis_url(),
                    keys,
                    RedisTimeouts {
                        connect: Duration::from_millis(300),
                        response: Duration::from_millis(300),
                    },
                )
                .await
                .unwrap();
                state.coord =
                    shardkeep::Coordination::new(cut, shardkeep::CoordinationConfig::default());
                proxy.set_mode(ProxyMode::Cut);
                Box::new(proxy)
            }
            Some(url) => {
                let cut = shardkeep::SqliteBackend::connect("DATABASE_URL", url)
                    .await
                    .unwrap();
                cut.fail_for(Duration::from_secs(3_600));
                state.coord = shardkeep::Coordination::embedded(
                    cut.clone(),
                    keys,
                    shardkeep::CoordinationConfig::default(),
                    std::sync::Arc::new(shardkeep::clock::SystemClock),
                );
                Box::new(cut)
            }
        };
        let served = serve(state).await;
        let (status, code, cookie) = login_at(&app.http, &served.base, "10.0.0.5", PASSWORD).await;
        assert_eq!((status, code.as_str()), (503, "unavailable"), "{driver:?}");
        assert!(
            cookie.is_empty(),
            "{driver:?}: no session without the throttle"
        );
        drop(outage);
    }
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn the_session_cookie_is_secure_behind_tls(pool: PgPool) {
    let plain = spawn_app(pool.clone()).await;
    let (_, _, cookie) = login_from(&plain, "10.0.0.6", PASSWORD).await;
    assert!(
        cookie.contains("HttpOnly") && !cookie.contains("Secure"),
        "{cookie}"
    );

    let public = spawn_app_with(
        pool.clone(),
        ApiSettings {
            public_url: Some("https://ops.example.com".into()),
            ..settings()
        },
    )
    .await;
    let (_, _, cookie) = login_from(&public, "10.0.0.7", PASSWORD).await;
    assert!(cookie.contains("; Secure"), "{cookie}");

    // A trusted proxy that terminated TLS says so.
    let proxied = spawn_app_with(pool, settings()).await;
    let response = proxied
        .http
        .post(format!("{}/console/login", proxied.base))
        .header("x-forwarded-proto", "https")
        .json(&json!({ "password": PASSWORD }))
        .send()
        .await
        .unwrap();
    let cookie = response.headers()[SET_COOKIE].to_str().unwrap();
    assert!(cookie.contains("; Secure"), "{cookie}");
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn a_login_body_over_64_kib_is_refused(pool: PgPool) {
    let app = spawn_app(pool).await;
    let password = "x".repeat(70 * 1024);
    let (status, code, cookie) = login_from(&app, "10.0.0.8", &password).await;
    assert_eq!((status, code.as_str()), (413, "payload_too_large"));
    assert!(cookie.is_empty());
}

fn session(cookie: &str) -> String {
    cookie.split(';').next().unwrap_or_default().to_owned()
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn console_sessions_are_shared_and_logout_ends_them_everywhere(pool: PgPool) {
    for driver in Driver::ALL {
        let app = spawn_app_on(pool.clone(), driver).await;
        let second = serve(app.state.clone()).await;
        let (status, _, cookie) = login_from(&app, "10.0.0.9", PASSWORD).await;
        assert_eq!(status, 200);
        let cookie = session(&cookie);
        let depths = |base: String| {
            let http = app.http.clone();
            let cookie = cookie.clone();
            async move {
                http.get(format!("{base}/console/api/depths"))
                    .header(COOKIE, cookie)
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            }
        };
        assert_eq!(
            depths(second.base.clone()).await,
            200,
            "a session opened on one process"
        );
        let logout = app
            .http
            .post(format!("{}/console/logout", app.base))
            .header(COOKIE, &cookie)
            .header("x-shardkeep-console", "1")
            .send()
            .await
            .unwrap();
        assert_eq!(logout.status().as_u16(), 200);
        assert_eq!(
            depths(second.base.clone()).await,
            401,
            "logout ends the session on every process"
        );
        assert_eq!(depths(app.base.clone()).await, 401);
    }
}
