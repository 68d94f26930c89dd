//! Console login, logout and the session guard. Sessions live in Redis (shared by every `serve`
//! process, ended everywhere at logout); logins are throttled per client address with a global
//! ceiling, every attempt counted before it is judged, and refused outright when the throttle
//! cannot be consulted.

use std::net::SocketAddr;

use axum::Json;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use shardkeep::Ttl;
use shardkeep::coord::{ThrottlePolicy, ThrottleStatus};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::state::{ApiSettings, AppState};

/// Name of the session cookie.
pub const COOKIE: &str = "shardkeep_console";
/// Header every console POST must carry (a cross-site form cannot set it).
pub const CSRF_HEADER: &str = "x-shardkeep-console";
/// How long a console session lasts.
pub const SESSION_TTL: Ttl = Ttl::from_static_secs(3600);
/// The login throttle window.
pub const LOGIN_WINDOW: Ttl = Ttl::from_static_secs(300);
const GLOBAL_SUBJECT: &str = "console:all";

fn unavailable(what: &str, err: &dyn std::fmt::Display) -> ApiError {
    tracing::error!(event = "console_store_unavailable", what, error = %err);
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        format!("{what} is unavailable; try again shortly"),
    )
}

fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, value)| *name == COOKIE && !value.is_empty())
        .map(|(_, value)| value.to_owned())
}

/// The address a login comes from: the last `X-Forwarded-For` hop (the one our own proxy
/// appended) when forwarded headers are trusted, otherwise the peer address. A trusted header
/// whose last hop is not an IP address is refused: falling back to the peer (the proxy) would
/// let one client spend everyone's attempts.
fn client_address(parts: &Parts, settings: &ApiSettings) -> Result<String, ApiError> {
    let peer = || {
        parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map_or_else(|| "unknown".to_owned(), |info| info.0.ip().to_string())
    };
    if !settings.trust_forwarded_headers {
        return Ok(peer());
    }
    let Some(last) = parts.headers.get_all("x-forwarded-for").iter().next_back() else {
        return Ok(peer());
    };
    let hop = last
        .as_bytes()
        .rsplit(|b| *b == b',')
        .map(|hop| hop.trim_ascii())
        .find(|hop| !hop.is_empty());
    match hop.and_then(|hop| {
        std::str::from_utf8(hop)
            .ok()?
            .parse::<std::net::IpAddr>()
            .ok()
    }) {
        Some(ip) => Ok(ip.to_string()),
        None if hop.is_none() => Ok(peer()),
        None => Err(ApiError::bad_request(
            "X-Forwarded-For must end with the client's IP address",
        )),
    }
}

/// What a client's attempts are counted under: its IPv4 address, or its IPv6 /64 (one host
/// commonly holds a whole /64, so counting single IPv6 addresses would give it millions of
/// tries).
fn throttle_subject(address: &str) -> String {
    match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        },
        _ => address.to_owned(),
    }
}

/// Whether the browser reached us over TLS: the public URL says so, or a trusted proxy does.
fn over_tls(parts: &Parts, settings: &ApiSettings) -> bool {
    let public = settings.public_url.as_deref().is_some_and(|url| {
        url.get(..8)
            .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
    });
    let proxied = settings.trust_forwarded_headers
        && parts
            .headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https"));
    public || proxied
}

fn cookie(value: &str, max_age: u64, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    format!("{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/console; Max-Age={max_age}{secure}")
}

fn throttled(status: ThrottleStatus) -> Result<(), ApiError> {
    match status {
        ThrottleStatus::Allowed { .. } => Ok(()),
        ThrottleStatus::Throttled { retry_after } => Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "throttled",
            format!(
                "too many login attempts; retry in {} s",
                retry_after.as_secs().max(1)
            ),
        )),
    }
}

#[derive(serde::Deserialize)]
struct Login {
    password: String,
}

/// `POST /console/login` with `{"password"}` (at most the API's body cap): opens a session.
pub async fn login(State(state): State<AppState>, request: Request) -> Result<Response, ApiError> {
    let Some(expected) = state.settings.console_password.as_deref() else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "console_disabled",
            "the console is not enabled",
        ));
    };
    let (parts, body) = request.into_parts();
    let body = crate::auth::read_body(body, state.settings.max_body_bytes).await?;
    let login: Login = serde_json::from_slice(&body)
        .map_err(|_| ApiError::bad_request("expected {\"password\": …}"))?;
    let client = format!(
        "console:client:{}",
        throttle_subject(&client_address(&parts, &state.settings)?)
    );
    let per_client = ThrottlePolicy {
        max_attempts: state.settings.console_login_client_limit,
        window: LOGIN_WINDOW,
    };
    let global = ThrottlePolicy {
        max_attempts: state.settings.console_login_global_limit,
        window: LOGIN_WINDOW,
    };
    // Counted before the password is looked at; a client already over its own limit does not
    // use up the global ceiling.
    let status = state
        .coord
        .login_attempt(&client, per_client)
        .await
        .map_err(|e| unavailable("the login throttle", &e))?;
    throttled(status)?;
    let status = state
        .coord
        .login_attempt(GLOBAL_SUBJECT, global)
        .await
        .map_err(|e| unavailable("the login throttle", &e))?;
    throttled(status)?;
    let matches: bool = Sha256::digest(login.password.as_bytes())
        .ct_eq(&Sha256::digest(expected.as_bytes()))
        .into();
    if !matches {
        return Err(ApiError::unauthorized("bad_password", "wrong password"));
    }
    if let Err(err) = state.coord.login_throttle_reset(&client).await {
        tracing::warn!(event = "console_throttle_reset_failed", error = %err);
    }
    let token = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    state
        .coord
        .console_session_store(&digest(&token), SESSION_TTL)
        .await
        .map_err(|e| unavailable("the session store", &e))?;
    let set = cookie(
        &token,
        SESSION_TTL.as_millis() / 1000,
        over_tls(&parts, &state.settings),
    );
    Ok((
        [(header::SET_COOKIE, set)],
        Json(serde_json::json!({ "ok": true })),
    )
        .into_response())
}

/// `POST /console/logout`: ends the session on every process and clears the cookie.
pub async fn logout(State(state): State<AppState>, request: Request) -> Result<Response, ApiError> {
    let (parts, _) = request.into_parts();
    let ended = match session_cookie(&parts.headers) {
        Some(token) => state
            .coord
            .console_session_delete(&digest(&token))
            .await
            .map_err(|e| unavailable("the session store", &e)),
        None => Ok(()),
    };
    // The browser forgets the cookie either way; a 503 says the server may still know it.
    let set = cookie("", 0, over_tls(&parts, &state.settings));
    let mut response = match ended {
        Ok(()) => Json(serde_json::json!({ "ok": true })).into_response(),
        Err(err) => err.into_response(),
    };
    if let Ok(value) = HeaderValue::from_str(&set) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    Ok(response)
}

/// Guards `/console/api`: a live session, and the console header on writes.
pub async fn require_session(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let Some(token) = session_cookie(request.headers()) else {
        return Err(ApiError::unauthorized("no_session", "log in first"));
    };
    let live = state
        .coord
        .console_session_exists(&digest(&token))
        .await
        .map_err(|e| unavailable("the session store", &e))?;
    if !live {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(headers: &[(&str, &str)]) -> Parts {
        let mut builder = axum::http::Request::builder();
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let (mut parts, ()) = builder.body(()).unwrap_or_default().into_parts();
        parts
            .extensions
            .insert(ConnectInfo(SocketAddr::from(([192, 0, 2, 7], 5555))));
        parts
    }

    #[test]
    fn the_client_is_the_peer_unless_a_trusted_proxy_says_otherwise() {
        let direct = ApiSettings::default();
        let proxied = ApiSettings {
            trust_forwarded_headers: true,
            ..ApiSettings::default()
        };
        let address = |headers: &[(&str, &str)], settings: &ApiSettings| {
            client_address(&parts(headers), settings).map_err(|e| e.code)
        };
        let spoofed = [("x-forwarded-for", "1.1.1.1")];
        assert_eq!(address(&spoofed, &direct), Ok("192.0.2.7".into()));
        let chain = [("x-forwarded-for", "1.1.1.1, 10.0.0.9")];
        assert_eq!(address(&chain, &proxied), Ok("10.0.0.9".into()));
        assert_eq!(
            address(&[("x-forwarded-for", "2001:db8::1")], &proxied),
            Ok("2001:db8::1".into())
        );
        assert_eq!(address(&[], &proxied), Ok("192.0.2.7".into()));
        assert_eq!(
            address(&[("x-forwarded-for", " , ")], &proxied),
            Ok("192.0.2.7".into())
        );
        let mut raw = parts(&[]);
        raw.headers.insert(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"10.0.0.1, \xff").unwrap_or(HeaderValue::from_static("x")),
        );
        assert_eq!(
            client_address(&raw, &proxied).map_err(|e| e.code),
            Err("bad_request")
        );
        // Not an address: refused rather than charged to the proxy.
        assert_eq!(
            address(&[("x-forwarded-for", "1.1.1.1, attacker")], &proxied),
            Err("bad_request")
        );
    }

    #[test]
    fn ipv6_clients_are_counted_by_their_64() {
        assert_eq!(
            throttle_subject("2001:db8:1:2:aaaa::1"),
            throttle_subject("2001:db8:1:2:bbbb::9")
        );
        assert_eq!(throttle_subject("2001:db8:1:2::1"), "2001:db8:1:2::/64");
        assert_ne!(
            throttle_subject("2001:db8:1:2::1"),
            throttle_subject("2001:db8:1:3::1")
        );
        assert_eq!(throttle_subject("::ffff:10.0.0.1"), "10.0.0.1");
        assert_eq!(throttle_subject("10.0.0.1"), "10.0.0.1");
        assert_eq!(throttle_subject("unknown"), "unknown");
    }

    #[test]
    fn tls_is_taken_from_the_public_url_or_a_trusted_proxy() {
        let public = ApiSettings {
            public_url: Some("HTTPS://ops.example".into()),
            ..ApiSettings::default()
        };
        assert!(over_tls(&parts(&[]), &public));
        let forwarded = parts(&[("x-forwarded-proto", "https")]);
        assert!(!over_tls(&forwarded, &ApiSettings::default()));
        let trusted = ApiSettings {
            trust_forwarded_headers: true,
            ..ApiSettings::default()
        };
        assert!(over_tls(&forwarded, &trusted));
        assert!(!over_tls(
            &parts(&[("x-forwarded-proto", "http")]),
            &trusted
        ));
        assert!(cookie("t", 60, true).ends_with("; Secure"));
        assert!(!cookie("t", 60, false).contains("Secure"));
    }
}
