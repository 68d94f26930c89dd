//! A client of the internal API that signs every request — what `shardkeep dead-letters` and
//! `shardkeep cleanup` use.

use reqwest::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::contract::ErrorBody;
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

    /// A signed `GET` answered with a `T`.
    pub async fn get<T: DeserializeOwned>(&self, path_and_query: &str) -> Result<T, ClientError> {
        self.send(Method::GET, path_and_query, None).await
    }

    /// A signed `POST` of `body` answered with a `T`.
    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let bytes = serde_json::to_vec(body).map_err(|e| ClientError::Transport {
            base: self.base.clone(),
            reason: format!("cannot encode the request: {e}"),
        })?;
        self.send(Method::POST, path, Some(bytes)).await
    }

    /// Sends a signed request with an optional JSON body, answered with any JSON.
    pub async fn call(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<&Value>,
    ) -> Result<Value, ClientError> {
        let bytes = body.map(|b| serde_json::to_vec(b).unwrap_or_default());
        self.send(method, path_and_query, bytes).await
    }

    async fn send<T: DeserializeOwned>(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ClientError> {
        let has_body = body.is_some();
        let bytes = body.unwrap_or_default();
        let timestamp = chrono::Utc::now().timestamp();
        let nonce = new_nonce();
        let signature = sign(
            &self.secret,
            &canonical(method.as_str(), path_and_query, timestamp, &nonce, &bytes),
        );
        let transport = |reason: String| ClientError::Transport {
            base: self.base.clone(),
            reason,
        };
        let mut request = self
            .http
            .request(method, format!("{}{path_and_query}", self.base))
            .header(KEY_ID_HEADER, &self.key_id)
            .header(TIMESTAMP_HEADER, timestamp.to_string())
            .header(NONCE_HEADER, &nonce)
            .header(SIGNATURE_HEADER, signature);
        if has_body {
            request = request
                .header("content-type", "application/json")
                .body(bytes);
        }
        let response = request.send().await.map_err(|e| transport(e.to_string()))?;
        let status = response.status().as_u16();
        let text = response
            .bytes()
            .await
            .map_err(|e| transport(e.to_string()))?;
        if (200..300).contains(&status) {
            return serde_json::from_slice(&text)
                .map_err(|e| transport(format!("unexpected answer: {e}")));
        }
        match serde_json::from_slice::<ErrorBody>(&text) {
            Ok(body) => Err(ClientError::Api {
                status,
                code: body.error.code,
                message: body.error.message,
            }),
            Err(_) => Err(ClientError::Api {
                status,
                code: "unknown".into(),
                message: String::from_utf8_lossy(&text).chars().take(200).collect(),
            }),
        }
    }
}
