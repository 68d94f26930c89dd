//! Signed internal requests (pure): the canonical string, HMAC-SHA256 signatures, and the key
//! set, with verification in constant time.
//!
//! The signature is the lowercase hex HMAC-SHA256, under the key's secret, of
//! `METHOD \n PATH_AND_QUERY \n TIMESTAMP \n NONCE \n lowercase_hex(SHA256(body))`.

use std::collections::HashMap;

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

/// Header naming the key.
pub const KEY_ID_HEADER: &str = "x-shardkeep-key-id";
/// Header carrying unix seconds.
pub const TIMESTAMP_HEADER: &str = "x-shardkeep-timestamp";
/// Header carrying the nonce.
pub const NONCE_HEADER: &str = "x-shardkeep-nonce";
/// Header carrying the signature.
pub const SIGNATURE_HEADER: &str = "x-shardkeep-signature";

type HmacSha256 = Hmac<Sha256>;

/// The string a signature covers.
pub fn canonical(
    method: &str,
    path_and_query: &str,
    timestamp: i64,
    nonce: &str,
    body: &[u8],
) -> String {
    format!(
        "{}\n{}\n{}\n{}\n{}",
        method.to_ascii_uppercase(),
        path_and_query,
        timestamp,
        nonce,
        hex::encode(Sha256::digest(body))
    )
}

/// Signs `canonical` with `secret`: lowercase hex HMAC-SHA256.
pub fn sign(secret: &[u8], canonical: &str) -> String {
    match <HmacSha256 as KeyInit>::new_from_slice(secret) {
        Ok(mut mac) => {
            mac.update(canonical.as_bytes());
            hex::encode(mac.finalize().into_bytes())
        }
        // HMAC takes keys of any length, so this never happens; an empty signature never verifies.
        Err(_) => String::new(),
    }
}

/// True when `signature_hex` is the signature of `canonical` under `secret`, compared in
/// constant time.
pub fn verify(secret: &[u8], canonical: &str, signature_hex: &str) -> bool {
    let Ok(signature) = hex::decode(signature_hex) else {
        return false;
    };
    let Ok(mut mac) = <HmacSha256 as KeyInit>::new_from_slice(secret) else {
        return false;
    };
    mac.update(canonical.as_bytes());
    mac.verify_slice(&signature).is_ok()
}

/// True for a nonce of 16 to 64 characters of `[A-Za-z0-9_-]`.
pub fn nonce_is_valid(nonce: &str) -> bool {
    (16..=64).contains(&nonce.len())
        && nonce
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A fresh nonce.
pub fn new_nonce() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The signing keys, by id. Its `Debug` never shows a secret.
#[derive(Clone, Default)]
pub struct InternalKeys {
    keys: HashMap<String, Vec<u8>>,
}

impl std::fmt::Debug for InternalKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut ids: Vec<&String> = self.keys.keys().collect();
        ids.sort();
        f.debug_struct("InternalKeys")
            .field("key_ids", &ids)
            .finish_non_exhaustive()
    }
}

/// `SHARDKEEP_INTERNAL_KEYS` could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("SHARDKEEP_INTERNAL_KEYS: {0}")]
pub struct KeysError(String);

impl InternalKeys {
    /// Parses comma-separated `key_id:secret` pairs (several at once, for rotation).
    pub fn parse(spec: &str) -> Result<Self, KeysError> {
        let mut keys = HashMap::new();
        for (i, pair) in spec.split(',').map(str::trim).enumerate() {
            if pair.is_empty() {
                continue;
            }
            let (id, secret) = pair
                .split_once(':')
                .ok_or_else(|| KeysError(format!("entry {} is not key_id:secret", i + 1)))?;
            let (id, secret) = (id.trim(), secret.trim());
            if id.is_empty()
                || !id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
            {
                return Err(KeysError(format!("entry {} has an invalid key id", i + 1)));
            }
            if secret.len() < 16 {
                return Err(KeysError(format!(
                    "the secret of key {id:?} is shorter than 16 characters"
                )));
            }
            if keys
                .insert(id.to_owned(), secret.as_bytes().to_vec())
                .is_some()
            {
                return Err(KeysError(format!("key {id:?} appears twice")));
            }
        }
        if keys.is_empty() {
            return Err(KeysError("no keys given".into()));
        }
        Ok(Self { keys })
    }

    /// The secret of `key_id`.
    pub fn secret(&self, key_id: &str) -> Option<&[u8]> {
        self.keys.get(key_id).map(Vec::as_slice)
    }

    /// Any one key id and secret (the first by id), for a client signing with this set.
    pub fn first(&self) -> Option<(&str, &[u8])> {
        let mut ids: Vec<&String> = self.keys.keys().collect();
        ids.sort();
        ids.first()
            .and_then(|id| self.keys.get(*id).map(|s| (id.as_str(), s.as_slice())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_strings_are_exact() {
        let c = canonical(
            "post",
            "/v1/x?limit=2",
            1700000000,
            "n0nce-0123456789ab",
            b"{}",
        );
        assert_eq!(
            c,
            "POST\n/v1/x?limit=2\n1700000000\nn0nce-0123456789ab\n44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }

    #[test]
    fn a_signature_verifies_and_any_change_breaks_it() {
        let c = canonical("GET", "/v1/a", 1, "nonce-nonce-nonce", b"");
        let s = sign(b"0123456789abcdef", &c);
        assert_eq!(s.len(), 64);
        assert!(
            s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        assert!(verify(b"0123456789abcdef", &c, &s));
        assert!(!verify(b"0123456789abcdeX", &c, &s));
        assert!(!verify(
            b"0123456789abcdef",
            &c.replace("/v1/a", "/v1/b"),
            &s
        ));
        assert!(!verify(b"0123456789abcdef", &c, "zz"));
    }

    #[test]
    fn known_vector() {
        // RFC 4231 test case 2.
        assert_eq!(
            sign(b"Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn nonces_are_checked() {
        assert!(nonce_is_valid("abcdefghij-_0123"));
        assert!(!nonce_is_valid("short"));
        assert!(!nonce_is_valid(&"a".repeat(65)));
        assert!(!nonce_is_valid("has spaces in it!!"));
        assert!(nonce_is_valid(&new_nonce()));
    }

    #[test]
    fn key_sets_parse_for_rotation_and_reject_bad_input() {
        let keys = InternalKeys::parse("ops:0123456789abcdef, ci:fedcba9876543210").unwrap();
        assert_eq!(keys.secret("ci"), Some(&b"fedcba9876543210"[..]));
        assert!(
            !format!("{keys:?}").contains("0123456789abcdef"),
            "Debug never shows secrets"
        );
        for bad in [
            "",
            "ops",
            "ops:short",
            ":0123456789abcdef",
            "a:0123456789abcdef,a:0123456789abcdef",
            "sp ace:0123456789abcdef",
        ] {
            assert!(InternalKeys::parse(bad).is_err(), "{bad:?}");
        }
    }
}
