//! A client of the internal API that signs every request — what `shardkeep dead-letters` and
//! `shardkeep cleanup` use.

use reqwest::Method;
use serde_json::Value;

use crate::signing::{
    KEY_ID_HEADER, NONCE_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, canonical, new_nonce, sign,
};

/// A call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error (its stable code and message).
    #[error("{code}: {message} (HTTP {status})")]
    Api {
        /// HTTP status.
        status: u16,
        /// The server's error code.
        code: String,
        /// The server's message.
        message: String,
    },
    /// The server could not be reached, or answered something that is not JSON.
    #[error("cannot reach the shardkeep API at {base}: {reason}")]
    Transport {
        /// The base URL.
        base: String,
        /// What went wrong.
        reason: String,
    },
}

/// A signing client. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SignedClient {
    http: reqwest::Client,
    base: String,
    key_id: String,
    secret: Vec<u8>,
}

impl SignedClient {
    /// A client of the API at `base` (e.g. `http://127.0.0.1:7400`) signing with `key_id`.
    pub fn new(base: &str, key_id: &str, secret: &[u8]) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|e| ClientError::Transport {
                base: base.to_owned(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            key_id: key_id.to_owned(),
            secret: secret.to_vec(),
        })
    }

    /// Sends a signed request; `path_and_query` starts with `/`.
    pub async fn call(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<&Value>,
    ) -> Result<Value, ClientError> {
        let bytes = match body {
            Some(body) => serde_json::to_vec(body).unwrap_or_default(),
            None => Vec::new(),
        };
        let timestamp = chrono::Utc::now().timestamp();
        let nonce = new_nonce();
        let signature = sign(
            &self.secret,
            &canonical(method.as_str(), path_and_query, timestamp, &nonce, &bytes),
        );
        let transport = |e: reqwest::Error| ClientError::Transport {
            base: self.base.clone(),
            reason: e.to_string(),
        };
        let mut request = self
            .http
            .request(method, format!("{}{path_and_query}", self.base))
            .header(KEY_ID_HEADER, &self.key_id)
            .header(TIMESTAMP_HEADER, timestamp.to_string())
            .header(NONCE_HEADER, &nonce)
            .header(SIGNATURE_HEADER, signature);
        if body.is_some() {
            request = request
                .header("content-type", "application/json")
                .body(bytes);
        }
        let response = request.send().await.map_err(transport)?;
        let status = response.status().as_u16();
        let value: Value = response.json().await.map_err(transport)?;
        if (200..300).contains(&status) {
            return Ok(value);
        }
        let error = value.get("error");
        Err(ClientError::Api {
            status,
            code: error
                .and_then(|e| e.get("code"))
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_owned(),
            message: error
                .and_then(|e| e.get("message"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
        })
    }
}
