//! The operator console at `/console`: a login of its own (an operator password opens a
//! server-side session held in a cookie), queue depths, both dead-letter lists, and requeue
//! behind a confirmation that shows what to check first. Console calls run on the server with
//! the server's own authority; no signing secret ever reaches the browser.

mod api;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

pub use api::{overview, preview_journal, preview_retry, requeue_journal, requeue_retry};

use crate::error::ApiError;
use crate::state::AppState;

/// Name of the session cookie.
pub const COOKIE: &str = "shardkeep_console";
/// Header every console POST must carry (a cross-site form cannot set it).
pub const CSRF_HEADER: &str = "x-shardkeep-console";
const PAGE: &str = include_str!("page.html");

/// Server-side console sessions. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ConsoleSessions {
    sessions: Arc<Mutex<HashMap<String, Instant>>>,
    ttl: Duration,
}

impl Default for ConsoleSessions {
    fn default() -> Self {
        Self {
            sessions: Arc::new(Mutex::new(HashMap::new())),
            ttl: Duration::from_secs(3600),
        }
    }
}

impl ConsoleSessions {
    fn open(&self) -> String {
        let id = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        if let Ok(mut sessions) = self.sessions.lock() {
            let now = Instant::now();
            sessions.retain(|_, expires| *expires > now);
            sessions.insert(id.clone(), now + self.ttl);
        }
        id
    }

    fn valid(&self, id: &str) -> bool {
        self.sessions
            .lock()
            .map(|s| s.get(id).is_some_and(|expires| *expires > Instant::now()))
            .unwrap_or(false)
    }

    fn close(&self, id: &str) {
        if let Ok(mut sessions) = self.sessions.lock() {
            sessions.remove(id);
        }
    }
}

fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
}

/// `GET /console`: the page.
pub async fn page() -> Html<&'static str> {
    Html(PAGE)
}

#[derive(serde::Deserialize)]
struct Login {
    password: String,
}

/// `POST /console/login` with `{"password"}`: opens a session (throttled after repeated
/// failures).
pub async fn login(State(state): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let Some(expected) = state.settings.console_password.as_deref() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "console_disabled",
            "the console is not enabled",
        ));
    };
    let login: Login = serde_json::from_slice(&body)
        .map_err(|_| ApiError::bad_request("expected {\"password\": …}"))?;
    let policy = shardkeep::coord::ThrottlePolicy {
        max_failures: 10,
        window: shardkeep::Ttl::from_static_secs(300),
    };
    if let Ok(shardkeep::coord::ThrottleStatus::Throttled { retry_after }) =
        state.coord.login_throttle_check("console", policy).await
    {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "throttled",
            format!(
                "too many failed logins; retry in {} s",
                retry_after.as_secs()
            ),
        ));
    }
    let matches: bool = Sha256::digest(login.password.as_bytes())
        .ct_eq(&Sha256::digest(expected.as_bytes()))
        .into();
    if !matches {
        let _ = state.coord.login_failure_record("console", policy).await;
        return Err(ApiError::unauthorized("bad_password", "wrong password"));
    }
    let id = state.console.open();
    let cookie = format!("{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/console; Max-Age=3600");
    Ok((
        [(header::SET_COOKIE, cookie)],
        Json(serde_json::json!({ "ok": true })),
    )
        .into_response())
}

/// `POST /console/logout`
pub async fn logout(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(id) = session_cookie(&headers) {
        state.console.close(&id);
    }
    let cookie = format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/console; Max-Age=0");
    (
        [(header::SET_COOKIE, cookie)],
        Json(serde_json::json!({ "ok": true })),
    )
        .into_response()
}

/// Guards `/console/api`: a live session, and the console header on writes.
pub async fn require_session(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let valid = session_cookie(request.headers()).is_some_and(|id| state.console.valid(&id));
    if !valid {
        return Err(ApiError::unauthorized("no_session", "log in first"));
    }
    if request.method() != axum::http::Method::GET && request.headers().get(CSRF_HEADER).is_none() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "missing_console_header",
            "console writes need the console header",
        ));
    }
    Ok(next.run(request).await)
}
