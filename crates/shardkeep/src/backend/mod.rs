//! Connections to the engines (Postgres and Redis, or one SQLite file in embedded mode). Only this module and the store adapters name a pool or a Redis
//! connection type; everything else holds the handles built on top of these.

pub mod cluster_link;
mod pg_exec;
pub mod postgres;
pub mod redis;
mod redis_conn;
mod redis_nodes;
pub mod sqlite;

pub use self::postgres::PostgresBackend;
pub use self::redis::RedisBackend;
pub use self::sqlite::SqliteBackend;

/// A store could not be reached or configured. Displays as one line that names the setting and
/// what was tried, with any password redacted.
#[derive(Debug, thiserror::Error)]
#[error("cannot use {setting}={target}: {reason}")]
pub struct ConnectError {
    /// The setting that named the store, e.g. `DATABASE_URL`.
    pub setting: &'static str,
    /// The address that was tried, password redacted.
    pub target: String,
    /// Why it failed, in one line.
    pub reason: String,
}

/// Query parameters whose values are secrets (compared case-insensitively).
const SECRET_PARAMS: &[&str] = &[
    "password",
    "pass",
    "pwd",
    "sslpassword",
    "secret",
    "token",
    "auth",
    "access_token",
    "api_key",
    "apikey",
];

/// A URL safe to log: the password of `scheme://user:password@host/…` and the values of secret
/// query parameters (`?password=…`) become `***`. The user part ends at the last `@` before the
/// query, so a password holding an unencoded `/` is still found; the rest is parsed as a URL.
/// Text that does not parse as a URL after that is not echoed at all.
pub fn redact_url(raw: &str) -> String {
    let Some((scheme, rest)) = raw.split_once("://") else {
        return raw.to_owned();
    };
    let query_at = rest.find(['?', '#']).unwrap_or(rest.len());
    // A password may also hold `?` or `#`: with no `@` before them, the user part runs to the
    // last `@` of all (over-redacting a query that holds one is the safe mistake).
    let at = rest
        .get(..query_at)
        .and_then(|head| head.rfind('@'))
        .or_else(|| rest.rfind('@'));
    let normalized = match at {
        Some(at) => {
            let (userinfo, host_and_rest) = (&rest[..at], &rest[at + 1..]);
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{scheme}://{user}:***@{host_and_rest}"),
                None => raw.to_owned(),
            }
        }
        None => raw.to_owned(),
    };
    let Ok(mut url) = url::Url::parse(&normalized) else {
        return format!("{scheme}://<unparseable URL redacted>");
    };
    if let Some(query) = url.query() {
        let redacted: Vec<String> = query
            .split('&')
            .map(|pair| {
                let name = pair.split_once('=').map_or(pair, |(name, _)| name);
                // Compared decoded, as the drivers read it (`pass%77ord` is `password`).
                let decoded = url::form_urlencoded::parse(name.as_bytes())
                    .next()
                    .map(|(decoded, _)| decoded.into_owned())
                    .unwrap_or_default();
                let secret = SECRET_PARAMS
                    .iter()
                    .any(|p| p.eq_ignore_ascii_case(&decoded));
                if secret {
                    format!("{name}=***")
                } else {
                    pair.to_owned()
                }
            })
            .collect();
        url.set_query(Some(&redacted.join("&")));
    }
    url.to_string()
}

/// Flattens an error and its sources into one line.
pub(crate) fn one_line(err: &dyn std::error::Error) -> String {
    let mut line = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = inner.source();
    }
    line.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/x"),
            "postgres://app:***@db:5432/x"
        );
        assert_eq!(
            redact_url("redis://:pw@127.0.0.1:6379"),
            "redis://:***@127.0.0.1:6379"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379/0"),
            "redis://127.0.0.1:6379/0"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn a_password_with_an_unencoded_slash_is_redacted() {
        for url in [
            "postgres://app:pa/ss@db:5432/x",
            "postgres://app:123/ss@db/x",
            "redis://:a/b/c@cache:6379/0",
        ] {
            let redacted = redact_url(url);
            assert!(
                !redacted.contains("ss@")
                    && !redacted.contains("/b/c")
                    && !redacted.contains("123/"),
                "{url} → {redacted}"
            );
            assert!(redacted.contains(":***@"), "{url} → {redacted}");
        }
        assert_eq!(
            redact_url("postgres://app:pa/ss@db:5432/x"),
            "postgres://app:***@db:5432/x"
        );
    }

    #[test]
    fn secrets_in_the_query_are_redacted() {
        assert_eq!(
            redact_url("redis://127.0.0.1:6379/?password=hunter2"),
            "redis://127.0.0.1:6379/?password=***"
        );
        assert_eq!(
            redact_url("postgres://u@h/db?sslmode=require&password=x%26y&PassWord=z"),
            "postgres://u@h/db?sslmode=require&password=***&PassWord=***"
        );
        assert_eq!(
            redact_url("postgres://u@h/db?sslmode=require"),
            "postgres://u@h/db?sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://u@h/db?pass%77ord=hunter2"),
            "postgres://u@h/db?pass%77ord=***"
        );
    }

    #[test]
    fn a_password_with_a_question_mark_or_hash_is_redacted() {
        for url in [
            "postgres://app:2024#Secret@db/x",
            "postgres://app:12?ab@db/x",
        ] {
            let redacted = redact_url(url);
            assert!(
                !redacted.contains("Secret")
                    && !redacted.contains("ab@")
                    && !redacted.contains("2024"),
                "{url} → {redacted}"
            );
        }
    }
}
