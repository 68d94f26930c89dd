//! The request mix of the hostile load: valid signed reads, and invalid requests of every kind
//! an attacker or a broken client sends (bad signatures, replays, stale timestamps, unknown
//! keys, unsigned, oversized and malformed bodies, unknown routes, forged mutations), each with
//! the statuses it must get.

use std::collections::VecDeque;
use std::sync::Mutex;

use rand::RngExt;
use rand::rngs::Xoshiro256PlusPlus;
use reqwest::Method;
use serde::Serialize;
use shardkeep_ops::signing::{
    KEY_ID_HEADER, NONCE_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, canonical, new_nonce, sign,
};
use uuid::Uuid;

/// What one request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Kind {
    /// Valid: a page of retry dead letters.
    ListRetry,
    /// Valid: a page of journal dead letters.
    ListJournal,
    /// Valid: one retry dead letter.
    DetailRetry,
    /// Valid: one journal dead letter.
    DetailJournal,
    /// Valid: a character's audit trail.
    Audit,
    /// Valid: a cleanup dry run.
    CleanupDryRun,
    /// A valid request whose signature does not match.
    BadSignature,
    /// An accepted request sent again, headers and all.
    Replay,
    /// Correctly signed an hour ago.
    Stale,
    /// Signed under a key id the server does not know.
    UnknownKey,
    /// No signature headers at all.
    Unsigned,
    /// Correctly signed, with a 1 MiB body.
    Oversized,
    /// Correctly signed, with a body that is not the route's JSON.
    Malformed,
    /// Correctly signed, to a route that does not exist.
    UnknownRoute,
    /// A requeue of a retained dead letter with a forged signature.
    ForgedRequeue,
    /// A cleanup that deletes, signed an hour ago or with a wrong signature.
    ForgedCleanup,
}

impl Kind {
    /// Every kind, with its share of the mix (out of 100).
    pub(super) const MIX: [(Kind, u32); 16] = [
        (Kind::ListRetry, 8),
        (Kind::ListJournal, 8),
        (Kind::DetailRetry, 7),
        (Kind::DetailJournal, 7),
        (Kind::Audit, 5),
        (Kind::CleanupDryRun, 5),
        (Kind::BadSignature, 8),
        (Kind::Replay, 8),
        (Kind::Stale, 6),
        (Kind::UnknownKey, 5),
        (Kind::Unsigned, 5),
        (Kind::Oversized, 4),
        (Kind::Malformed, 6),
        (Kind::UnknownRoute, 4),
        (Kind::ForgedRequeue, 7),
        (Kind::ForgedCleanup, 7),
    ];

    /// Whether the server must accept it.
    pub(super) fn valid(self) -> bool {
        matches!(
            self,
            Kind::ListRetry
                | Kind::ListJournal
                | Kind::DetailRetry
                | Kind::DetailJournal
                | Kind::Audit
                | Kind::CleanupDryRun
        )
    }

    /// The statuses it must get.
    pub(super) fn expected(self) -> &'static [u16] {
        match self {
            k if k.valid() => &[200],
            Kind::Oversized => &[413],
            Kind::Malformed => &[400],
            Kind::UnknownRoute => &[404],
            _ => &[401],
        }
    }

    /// A kind drawn by its share of the mix; `valid_only` draws among the valid ones.
    pub(super) fn draw(rng: &mut Xoshiro256PlusPlus, valid_only: bool) -> Kind {
        let pool = Self::MIX.iter().filter(|(k, _)| !valid_only || k.valid());
        let total: u32 = pool.clone().map(|(_, w)| w).sum();
        let mut pick = rng.random_range(0..total);
        for (kind, weight) in pool {
            if pick < *weight {
                return *kind;
            }
            pick -= weight;
        }
        Kind::ListRetry
    }
}

/// One request ready to send.
#[derive(Debug, Clone)]
pub(super) struct Request {
    pub(super) method: Method,
    pub(super) path: String,
    pub(super) body: Vec<u8>,
    pub(super) headers: Vec<(&'static str, String)>,
}

/// What requests are built against: the server, its key, and the retained dead letters,
/// characters and cleanup targets they name.
pub(super) struct Targets {
    pub(super) key_id: String,
    pub(super) secret: Vec<u8>,
    pub(super) retry: Vec<Uuid>,
    pub(super) journal: Vec<Uuid>,
    pub(super) characters: Vec<Uuid>,
    pub(super) cleanup_targets: Vec<String>,
    /// Requests the server accepted, for replays.
    accepted: Mutex<VecDeque<Request>>,
}

/// Accepted requests kept for replays.
const REPLAY_POOL: usize = 256;

/// Seconds an hour-old request is behind.
const STALE_SECS: i64 = 3600;

fn pick<T: Copy>(rng: &mut Xoshiro256PlusPlus, items: &[T], or: T) -> T {
    if items.is_empty() {
        return or;
    }
    items[rng.random_range(0..items.len())]
}

impl Targets {
    /// Targets over these names.
    pub(super) fn new(
        key_id: String,
        secret: Vec<u8>,
        retry: Vec<Uuid>,
        journal: Vec<Uuid>,
        characters: Vec<Uuid>,
        cleanup_targets: Vec<String>,
    ) -> Self {
        Self {
            key_id,
            secret,
            retry,
            journal,
            characters,
            cleanup_targets,
            accepted: Mutex::new(VecDeque::new()),
        }
    }

    /// Keeps an accepted request for later replays.
    pub(super) fn accepted(&self, request: Request) {
        if let Ok(mut pool) = self.accepted.lock() {
            if pool.len() >= REPLAY_POOL {
                pool.pop_front();
            }
            pool.push_back(request);
        }
    }

    fn signed(&self, method: Method, path: String, body: Vec<u8>, at: i64, key: &str) -> Request {
        let nonce = new_nonce();
        let signature = sign(
            &self.secret,
            &canonical(method.as_str(), &path, at, &nonce, &body),
        );
        Request {
            method,
            path,
            body,
            headers: vec![
                (KEY_ID_HEADER, key.to_owned()),
                (TIMESTAMP_HEADER, at.to_string()),
                (NONCE_HEADER, nonce),
                (SIGNATURE_HEADER, signature),
            ],
        }
    }

    /// A POST of `body` to `path`, signed at `now`.
    fn post(&self, path: &str, body: &serde_json::Value, now: i64) -> Request {
        let body = body.to_string().into_bytes();
        self.signed(Method::POST, path.to_owned(), body, now, &self.key_id)
    }

    /// A correctly signed requeue of the retry dead letter `id` (what the checker uses to show
    /// its fingerprint sees a real change).
    pub(super) fn requeue(&self, id: Uuid, now: i64) -> Request {
        let body = serde_json::json!({ "rpc_version": 1, "dead_letter_id": id });
        self.post(
            "/v1/internal/persistence-retry/dead-letters/requeue",
            &body,
            now,
        )
    }

    /// A correctly signed requeue of the journal dead letter `id`.
    pub(super) fn journal_requeue(&self, id: Uuid, now: i64) -> Request {
        let body = serde_json::json!({ "rpc_version": 1, "dead_letter_id": id });
        self.post(
            "/v1/internal/session-lifecycle-journal/dead-letters/requeue",
            &body,
            now,
        )
    }

    /// A correctly signed cleanup that deletes the keys of `target`.
    pub(super) fn cleanup_delete(&self, target: &str, now: i64) -> Request {
        let body = serde_json::json!({ "target": target, "mode": "delete", "limit": 500 });
        self.post("/v1/internal/admin/cleanup", &body, now)
    }

    /// The valid request of `kind` (a valid kind), signed now.
    fn valid(&self, kind: Kind, rng: &mut Xoshiro256PlusPlus, now: i64) -> Request {
        let (method, path, body) = match kind {
            Kind::ListJournal => (
                Method::GET,
                "/v1/internal/session-lifecycle-journal/dead-letters?limit=20".to_owned(),
                Vec::new(),
            ),
            Kind::DetailRetry => (
                Method::GET,
                format!(
                    "/v1/internal/persistence-retry/dead-letters/{}",
                    pick(rng, &self.retry, Uuid::nil())
                ),
                Vec::new(),
            ),
            Kind::DetailJournal => (
                Method::GET,
                format!(
                    "/v1/internal/session-lifecycle-journal/dead-letters/{}",
                    pick(rng, &self.journal, Uuid::nil())
                ),
                Vec::new(),
            ),
            Kind::Audit => (
                Method::GET,
                format!(
                    "/v1/internal/audit/characters/{}?limit=20",
                    pick(rng, &self.characters, Uuid::nil())
                ),
                Vec::new(),
            ),
            Kind::CleanupDryRun => {
                let target = self
                    .cleanup_targets
                    .get(rng.random_range(0..self.cleanup_targets.len().max(1)))
                    .cloned()
                    .unwrap_or_else(|| "presence".to_owned());
                let body = serde_json::json!({ "target": target, "mode": "dry_run", "limit": 50 });
                (
                    Method::POST,
                    "/v1/internal/admin/cleanup".to_owned(),
                    body.to_string().into_bytes(),
                )
            }
            _ => (
                Method::GET,
                "/v1/internal/persistence-retry/dead-letters?limit=20".to_owned(),
                Vec::new(),
            ),
        };
        self.signed(method, path, body, now, &self.key_id)
    }

    /// A request of `kind`, built at unix second `now`. A replay with nothing yet accepted
    /// is sent as a stale request (and counted as one).
    pub(super) fn build(
        &self,
        kind: Kind,
        rng: &mut Xoshiro256PlusPlus,
        now: i64,
    ) -> (Kind, Request) {
        if kind.valid() {
            return (kind, self.valid(kind, rng, now));
        }
        let requeue_body = |id: Uuid| {
            serde_json::json!({ "rpc_version": 1, "dead_letter_id": id })
                .to_string()
                .into_bytes()
        };
        let request = match kind {
            Kind::BadSignature => {
                let valid_kind = Kind::draw(rng, true);
                let mut request = self.valid(valid_kind, rng, now);
                if let Some((_, signature)) = request
                    .headers
                    .iter_mut()
                    .find(|(name, _)| *name == SIGNATURE_HEADER)
                {
                    // One hex digit changed: as close to right as a forgery gets.
                    let flipped = if signature.starts_with('0') { "1" } else { "0" };
                    signature.replace_range(0..1, flipped);
                }
                request
            }
            Kind::Replay => {
                let replay = self.accepted.lock().ok().and_then(|pool| {
                    (!pool.is_empty()).then(|| pool[rng.random_range(0..pool.len())].clone())
                });
                match replay {
                    Some(request) => request,
                    None => return self.build(Kind::Stale, rng, now),
                }
            }
            Kind::Stale => {
                let valid_kind = Kind::draw(rng, true);
                let fresh = self.valid(valid_kind, rng, now);
                self.signed(
                    fresh.method,
                    fresh.path,
                    fresh.body,
                    now - STALE_SECS,
                    &self.key_id,
                )
            }
            Kind::UnknownKey => {
                let fresh = self.valid(Kind::ListRetry, rng, now);
                self.signed(fresh.method, fresh.path, fresh.body, now, "intruder")
            }
            Kind::Unsigned => {
                let mut request = self.valid(Kind::draw(rng, true), rng, now);
                request.headers.clear();
                request
            }
            Kind::Oversized => self.signed(
                Method::POST,
                "/v1/internal/admin/cleanup".to_owned(),
                vec![b'x'; 1 << 20],
                now,
                &self.key_id,
            ),
            Kind::Malformed => {
                let bodies: [&[u8]; 4] = [
                    b"{\"target\": 12",
                    b"not json at all",
                    b"{\"rpc_version\": 1, \"dead_letter_id\": \"nope\"}",
                    b"[]",
                ];
                let body = bodies[rng.random_range(0..bodies.len())].to_vec();
                let path = if rng.random_bool(0.5) {
                    "/v1/internal/admin/cleanup"
                } else {
                    "/v1/internal/persistence-retry/dead-letters/requeue"
                };
                self.signed(Method::POST, path.to_owned(), body, now, &self.key_id)
            }
            Kind::UnknownRoute => self.signed(
                Method::GET,
                format!(
                    "/v1/internal/no-such-route/{}",
                    rng.random_range(0..1000u32)
                ),
                Vec::new(),
                now,
                &self.key_id,
            ),
            Kind::ForgedRequeue => {
                let (path, id) = if rng.random_bool(0.5) {
                    (
                        "/v1/internal/persistence-retry/dead-letters/requeue",
                        pick(rng, &self.retry, Uuid::nil()),
                    )
                } else {
                    (
                        "/v1/internal/session-lifecycle-journal/dead-letters/requeue",
                        pick(rng, &self.journal, Uuid::nil()),
                    )
                };
                let mut request = self.signed(
                    Method::POST,
                    path.to_owned(),
                    requeue_body(id),
                    now,
                    &self.key_id,
                );
                for (name, value) in &mut request.headers {
                    if *name == SIGNATURE_HEADER {
                        *value = "f".repeat(64);
                    }
                }
                request
            }
            _ => {
                // A delete signed an hour ago, or signed now under a wrong signature.
                let target = pick(rng, &["presence", "handoff", "registry"], "presence");
                if rng.random_bool(0.5) {
                    self.cleanup_delete(target, now - STALE_SECS)
                } else {
                    let mut request = self.cleanup_delete(target, now);
                    for (name, value) in &mut request.headers {
                        if *name == SIGNATURE_HEADER {
                            *value = "0".repeat(64);
                        }
                    }
                    request
                }
            }
        };
        (kind, request)
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn targets() -> Targets {
        Targets::new(
            "ops".into(),
            b"0123456789abcdef0123".to_vec(),
            vec![Uuid::now_v7()],
            vec![Uuid::now_v7()],
            vec![Uuid::now_v7()],
            vec!["presence".into()],
        )
    }

    #[test]
    fn the_mix_covers_every_kind_and_sums_to_a_hundred() {
        assert_eq!(Kind::MIX.iter().map(|(_, w)| w).sum::<u32>(), 100);
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(1);
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..5_000 {
            seen.insert(Kind::draw(&mut rng, false));
            assert!(Kind::draw(&mut rng, true).valid());
        }
        assert_eq!(seen.len(), Kind::MIX.len());
    }

    #[test]
    fn invalid_requests_break_exactly_what_they_say() {
        let t = targets();
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(2);
        let now = 1_800_000_000;
        let header = |r: &Request, name: &str| {
            r.headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        };
        let (_, stale) = t.build(Kind::Stale, &mut rng, now);
        assert_eq!(
            header(&stale, TIMESTAMP_HEADER),
            Some((now - STALE_SECS).to_string())
        );
        let (_, unsigned) = t.build(Kind::Unsigned, &mut rng, now);
        assert!(unsigned.headers.is_empty());
        let (_, big) = t.build(Kind::Oversized, &mut rng, now);
        assert_eq!(big.body.len(), 1 << 20);
        let (_, unknown) = t.build(Kind::UnknownKey, &mut rng, now);
        assert_eq!(header(&unknown, KEY_ID_HEADER).as_deref(), Some("intruder"));
        // Nothing accepted yet: a replay goes out as a stale request.
        assert_eq!(t.build(Kind::Replay, &mut rng, now).0, Kind::Stale);
        let (_, valid) = t.build(Kind::ListRetry, &mut rng, now);
        t.accepted(valid.clone());
        let (kind, replay) = t.build(Kind::Replay, &mut rng, now);
        assert_eq!(kind, Kind::Replay);
        assert_eq!(replay.headers, valid.headers);
        let (_, forged) = t.build(Kind::BadSignature, &mut rng, now);
        let signature = header(&forged, SIGNATURE_HEADER).unwrap();
        let nonce = header(&forged, NONCE_HEADER).unwrap();
        let right = sign(
            &t.secret,
            &canonical(
                forged.method.as_str(),
                &forged.path,
                now,
                &nonce,
                &forged.body,
            ),
        );
        assert_ne!(signature, right);
        assert_eq!(signature.len(), right.len());
    }
}
