//! Fuzzed requests through the real app over HTTP, against real Postgres and Redis: signature
//! headers with arbitrary values, correctly signed requests with arbitrary and mutated bodies,
//! paths and queries on every route, and console posts. No request gets a 5xx or kills the
//! server, and every refused request leaves the stores as they were (rows fingerprinted, Redis
//! values dumped); only what a refusal writes by design is set aside (nonces of accepted
//! signatures, login throttle counters). On Postgres and Redis only: what is fuzzed is the
//! HTTP and signing layer above the stores, the same on either driver; the stored parts of it
//! (nonces, throttles, requeues) are covered on both drivers by the auth, security and routes
//! tests.

use std::collections::BTreeMap;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use reqwest::Method;
use reqwest::header::COOKIE;
use serde_json::{Value, json};
use shardkeep_ops::console::CSRF_HEADER;
use shardkeep_ops::signing::{KEY_ID_HEADER, NONCE_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use sqlx::PgPool;

use crate::support::{
    PASSWORD, Raw, TestApp, console_login, journal_dead_letter, retry_dead_letter, spawn_app,
};

/// The status recorded for a request the client refused to send (a header value it cannot
/// encode): nothing reached the server.
const NOT_SENT: u16 = 0;

/// Cases per property (the closing note of the fuzzing issue counts them).
const CASES: usize = 256;

/// What the stores hold: a fingerprint of every table, and every Redis value of the namespace
/// with whether it expires, that a refused request must not touch.
#[derive(Debug, PartialEq, Eq)]
struct Stores {
    tables: BTreeMap<String, String>,
    redis: BTreeMap<String, (Vec<u8>, bool)>,
}

/// What a refusal may write by design: the nonce of a signature that checked out (so a replay
/// is refused too) and console login throttle counters. Requests that never pass the signature
/// check must not write even those.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Allowed {
    Nothing,
    NoncesAndThrottles,
}

async fn stores(app: &TestApp, allowed: Allowed) -> Stores {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
          WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1",
    )
    .fetch_all(app.pg().exec())
    .await
    .unwrap();
    let mut tables = BTreeMap::new();
    for table in names {
        let sql = format!(
            "SELECT count(*)::text || ':' || coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '')
               FROM \"{table}\" t"
        );
        let print: String = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(app.pg().exec())
            .await
            .unwrap();
        tables.insert(table, print);
    }
    let mut redis = BTreeMap::new();
    let mut conn = app.redis().raw().await;
    for key in app.redis().all_keys().await {
        let by_design = key.contains(":nonce:") || key.contains(":login:throttle:");
        if by_design && allowed == Allowed::NoncesAndThrottles {
            continue;
        }
        // The set-up's journal consumer's liveness records lapse by their TTL on their own,
        // whatever the requests do.
        if key.contains(":consumer:") || key.ends_with(":consumers") {
            continue;
        }
        let dump: Option<Vec<u8>> = redis::cmd("DUMP")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        redis.insert(key, (dump.unwrap_or_default(), ttl >= 0));
    }
    Stores { tables, redis }
}

/// Sends one request and checks the answer: never a 5xx, JSON when it is an error, and a
/// refusal changes nothing. Returns the status.
async fn check(
    app: &TestApp,
    what: &str,
    allowed: Allowed,
    send: impl AsyncFnOnce() -> (u16, Value),
) -> u16 {
    let before = stores(app, allowed).await;
    let (status, body) = send().await;
    assert!(status < 500, "{what}: {status} {body}");
    if status >= 400 || status == NOT_SENT {
        assert!(
            status == NOT_SENT || body.get("error").is_some() || body.get("code").is_some(),
            "{what}: a refusal names its error: {status} {body}"
        );
        assert_eq!(
            stores(app, allowed).await,
            before,
            "{what}: refused ({status}) but changed the stores"
        );
    }
    status
}

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: CASES as u32,
        ..Config::default()
    })
}

/// Draws one value of `strategy`.
fn draw<S: Strategy>(runner: &mut TestRunner, strategy: &S) -> S::Value {
    strategy.new_tree(runner).unwrap().current()
}

/// Every route of the app, with the methods it answers and a few it does not.
fn routes(retry: &str, journal: &str) -> Vec<(Method, String)> {
    vec![
        (
            Method::GET,
            "/v1/internal/persistence-retry/dead-letters?limit=5".into(),
        ),
        (
            Method::POST,
            "/v1/internal/persistence-retry/dead-letters/requeue".into(),
        ),
        (
            Method::GET,
            format!("/v1/internal/persistence-retry/dead-letters/{retry}"),
        ),
        (
            Method::GET,
            "/v1/internal/session-lifecycle-journal/dead-letters".into(),
        ),
        (
            Method::POST,
            "/v1/internal/session-lifecycle-journal/dead-letters/requeue".into(),
        ),
        (
            Method::GET,
            format!("/v1/internal/session-lifecycle-journal/dead-letters/{journal}"),
        ),
        (Method::GET, "/v1/internal/admin/cleanup-targets".into()),
        (Method::POST, "/v1/internal/admin/cleanup".into()),
        (
            Method::GET,
            format!("/v1/internal/audit/characters/{retry}"),
        ),
        (
            Method::GET,
            format!(
                "/v1/internal/audit/staff?name=aria&viewer_account_id={retry}&viewer_tier=admin"
            ),
        ),
        (
            Method::DELETE,
            "/v1/internal/persistence-retry/dead-letters".into(),
        ),
        (Method::GET, "/v1/internal/no-such-route".into()),
    ]
}

/// Valid bodies of the routes that take one (what the mutations start from).
fn bodies(retry: &str, journal: &str) -> Vec<Value> {
    vec![
        json!({ "rpc_version": 1, "dead_letter_id": retry }),
        json!({ "rpc_version": 1, "dead_letter_id": journal }),
        json!({ "target": "presence", "mode": "dry_run", "limit": 5 }),
        json!({ "target": "handoff", "mode": "delete", "limit": 5 }),
        json!({ "password": PASSWORD }),
        json!({}),
    ]
}

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,40}".prop_map(Value::String),
        Just(json!("00000000-0000-0000-0000-000000000000")),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,16}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A body: arbitrary bytes, or a valid body with one field replaced, removed or added, or cut.
fn body(valid: Vec<Value>) -> impl Strategy<Value = Vec<u8>> {
    let count = valid.len();
    let fields = valid.clone();
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        (0..count, "[a-z_]{1,16}", any_json(), any::<bool>()).prop_map(
            move |(pick, field, value, replace)| {
                let mut doc = fields[pick].clone();
                if let Some(map) = doc.as_object_mut() {
                    let key = if replace {
                        map.keys().next().cloned().unwrap_or(field)
                    } else {
                        field
                    };
                    map.insert(key, value);
                }
                serde_json::to_vec(&doc).unwrap()
            }
        ),
        (0..count, any::<usize>()).prop_map(move |(pick, cut)| {
            let bytes = serde_json::to_vec(&valid[pick]).unwrap();
            bytes[..cut % bytes.len().max(1)].to_vec()
        }),
    ]
}

/// A header value that is anything a client could send.
fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,80}",
        "[0-9a-f]{64}",
        "-?[0-9]{1,20}",
        "[A-Za-z0-9_-]{16,64}",
        Just(String::new()),
    ]
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn fuzzed_signature_headers_are_refused_and_change_nothing(pool: PgPool) {
    let mut app = spawn_app(pool).await;
    let retry = retry_dead_letter(&mut app).await.to_string();
    let journal = journal_dead_letter(&app, "fuzz-1").await.to_string();
    let routes = routes(&retry, &journal);
    let mut runner = runner();
    let strategy = (
        0..routes.len(),
        prop::collection::vec(header_value(), 4),
        prop::collection::vec(any::<bool>(), 4),
    );
    for case in 0..CASES {
        let (route, values, present) = draw(&mut runner, &strategy);
        let (method, path) = routes[route].clone();
        let names = [
            KEY_ID_HEADER,
            TIMESTAMP_HEADER,
            NONCE_HEADER,
            SIGNATURE_HEADER,
        ];
        let what = format!("case {case}: {method} {path} {values:?} {present:?}");
        // Nothing unsigned may get past the gate, nor write anything (not even a nonce).
        let status = check(&app, &what, Allowed::Nothing, async || {
            let mut request = app
                .http
                .request(method.clone(), format!("{}{path}", app.base))
                .body(serde_json::to_vec(&bodies(&retry, &journal)[0]).unwrap());
            for ((name, value), on) in names.iter().zip(&values).zip(&present) {
                if *on {
                    request = request.header(*name, value);
                }
            }
            let Ok(response) = request.send().await else {
                // reqwest refuses header values it cannot send; nothing reached the server.
                return (NOT_SENT, Value::Null);
            };
            let status = response.status().as_u16();
            (status, response.json().await.unwrap_or(Value::Null))
        })
        .await;
        let expected: &[u16] = if path.contains("no-such-route") {
            &[404]
        } else if method == Method::DELETE {
            &[401, 405]
        } else {
            &[401]
        };
        assert!(
            status == NOT_SENT || expected.contains(&status),
            "{what}: a forged request got {status}, not one of {expected:?}"
        );
    }
    // The server still serves a correctly signed request after all of them.
    let after: Result<Value, _> = app
        .client
        .get("/v1/internal/persistence-retry/dead-letters?limit=1")
        .await;
    assert!(after.is_ok(), "{after:?}");
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn correctly_signed_fuzzed_bodies_and_paths_are_typed_refusals(pool: PgPool) {
    let mut app = spawn_app(pool).await;
    let retry = retry_dead_letter(&mut app).await.to_string();
    let journal = journal_dead_letter(&app, "fuzz-2").await.to_string();
    let routes = routes(&retry, &journal);
    let mut runner = runner();
    let strategy = (
        0..routes.len(),
        body(bodies(&retry, &journal)),
        prop::option::of("[ -~]{0,40}"),
    );
    let mut answered: BTreeMap<u16, usize> = BTreeMap::new();
    for case in 0..CASES {
        let (route, body, tail) = draw(&mut runner, &strategy);
        let (method, mut path) = routes[route].clone();
        if let Some(tail) = tail {
            // Query and path garbage, percent-encoded where a URL needs it.
            let sep = if path.contains('?') { '&' } else { '?' };
            let encoded: String = url_escape(&tail);
            path = format!("{path}{sep}limit={encoded}&offset={encoded}&character={encoded}");
        }
        let what = format!(
            "case {case}: {method} {path} {:?}",
            String::from_utf8_lossy(&body)
        );
        let raw = Raw::new(method, &path, &body);
        let status = check(&app, &what, Allowed::NoncesAndThrottles, async || {
            raw.send(&app).await
        })
        .await;
        *answered.entry(status).or_default() += 1;
    }
    // The fuzzing reached the handlers: some requests were accepted, some refused by them.
    assert!(answered.contains_key(&200), "{answered:?}");
    assert!(
        answered.keys().any(|s| [400, 404, 409, 422].contains(s)),
        "{answered:?}"
    );
    println!("signed fuzz answers: {answered:?}");
}

#[sqlx::test(migrator = "shardkeep::backend::postgres::MIGRATOR")]
async fn fuzzed_console_posts_are_typed_refusals(pool: PgPool) {
    let mut app = spawn_app(pool).await;
    let retry = retry_dead_letter(&mut app).await.to_string();
    let journal = journal_dead_letter(&app, "fuzz-3").await.to_string();
    let (_, cookie) = console_login(&app, PASSWORD).await;
    let cookie = cookie.unwrap();
    let posts = [
        "/console/login".to_owned(),
        "/console/logout".to_owned(),
        format!("/console/api/retry/{retry}/requeue"),
        format!("/console/api/journal/{journal}/requeue"),
        "/console/api/retry/not-a-uuid/requeue".to_owned(),
        "/console/api/nothing/requeue".to_owned(),
    ];
    let mut runner = runner();
    let strategy = (
        0..posts.len(),
        body(bodies(&retry, &journal)),
        prop::option::of("[ -~]{0,60}"),
        any::<bool>(),
    );
    let mut answered: BTreeMap<u16, usize> = BTreeMap::new();
    for case in 0..CASES {
        let (post, body, content_type, csrf) = draw(&mut runner, &strategy);
        let path = &posts[post];
        // Logging out with the real cookie would end the session the other cases use.
        let with_cookie = path != "/console/logout";
        let what = format!(
            "case {case}: POST {path} {:?}",
            String::from_utf8_lossy(&body)
        );
        let status = check(&app, &what, Allowed::NoncesAndThrottles, async || {
            let mut request = app
                .http
                .post(format!("{}{path}", app.base))
                .body(body.clone());
            if with_cookie {
                request = request.header(COOKIE, &cookie);
            }
            if csrf {
                request = request.header(CSRF_HEADER, "1");
            }
            if let Some(content_type) = &content_type {
                request = request.header("content-type", content_type);
            }
            let Ok(response) = request.send().await else {
                return (NOT_SENT, Value::Null);
            };
            let status = response.status().as_u16();
            (status, response.json().await.unwrap_or(Value::Null))
        })
        .await;
        *answered.entry(status).or_default() += 1;
    }
    // Past the CSRF gate the handlers answered: a requeue, a login, or their own refusals.
    assert!(
        answered.keys().any(|s| ![401, 403, NOT_SENT].contains(s)),
        "{answered:?}"
    );
    println!("console fuzz answers: {answered:?}");
}

/// Percent-encodes everything but unreserved characters.
fn url_escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}
