//! Connections to the two engines. Only this module and the store adapters name a pool or a Redis
//! connection type; everything else holds the handles built on top of these.

pub mod postgres;
pub mod redis;

pub use self::postgres::PostgresBackend;
pub use self::redis::RedisBackend;

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

/// Replaces the password of a `scheme://user:password@host/…` URL with `***`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            if userinfo.contains(':') {
                format!("{scheme}://{user}:***@{host}{tail}")
            } else {
                format!("{scheme}://{user}@{host}{tail}")
            }
        }
        None => url.to_owned(),
    }
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
}
