use std::collections::HashMap;

use proptest::prelude::*;

use super::slot::key_slot;
use super::*;

/// Redis `stringmatchlen` semantics for the subset SCAN uses: `*`, `?`, `[...]` (ranges and
/// `^`), and `\` escapes.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.first() {
        None => text.is_empty(),
        Some(b'*') => (0..=text.len()).any(|skip| glob_match(&pattern[1..], &text[skip..])),
        Some(b'?') => !text.is_empty() && glob_match(&pattern[1..], &text[1..]),
        Some(b'[') => {
            let Some((&c, rest)) = text.split_first() else {
                return false;
            };
            let mut i = 1;
            let negate = pattern.get(i) == Some(&b'^');
            if negate {
                i += 1;
            }
            let mut matched = false;
            while i < pattern.len() && pattern[i] != b']' {
                if pattern[i] == b'\\' && i + 1 < pattern.len() {
                    matched |= pattern[i + 1] == c;
                    i += 2;
                } else if i + 2 < pattern.len() && pattern[i + 1] == b'-' && pattern[i + 2] != b']'
                {
                    let (lo, hi) = (
                        pattern[i].min(pattern[i + 2]),
                        pattern[i].max(pattern[i + 2]),
                    );
                    matched |= (lo..=hi).contains(&c);
                    i += 3;
                } else {
                    matched |= pattern[i] == c;
                    i += 1;
                }
            }
            matched != negate && glob_match(pattern.get(i + 1..).unwrap_or(&[]), rest)
        }
        Some(b'\\') if pattern.len() > 1 => {
            text.first() == Some(&pattern[1]) && glob_match(&pattern[2..], &text[1..])
        }
        Some(&p) => text.first() == Some(&p) && glob_match(&pattern[1..], &text[1..]),
    }
}

fn ks(ns: &str) -> Keyspace {
    Keyspace::new(ns).unwrap_or_else(|e| panic!("valid namespace: {e}"))
}

/// Every builder that takes caller input, applied to `(a, b)`; the label says which family.
fn all_keys(k: &Keyspace, a: &str, b: &str) -> Vec<(String, Result<String, KeyError>)> {
    let q = k.queue(a);
    vec![
        ("login_session".into(), k.login_session(a)),
        ("login_throttle".into(), k.login_throttle(a)),
        ("console_session".into(), k.console_session(a)),
        (
            "handoff_i".into(),
            k.handoff(a, &HandoffScope::Instance(b.into())),
        ),
        (
            "handoff_p".into(),
            k.handoff(a, &HandoffScope::Placement(b.into())),
        ),
        ("handoff_port".into(), k.handoff(a, &HandoffScope::Port(7))),
        ("handoff_consumed".into(), k.handoff_consumed(a)),
        ("transfer".into(), k.transfer_activated(a)),
        ("presence_account".into(), k.presence_account(a)),
        ("presence_character".into(), k.presence_character(a)),
        ("registry".into(), k.registry_instance(a)),
        ("nonce".into(), k.internal_nonce(a, b)),
        ("resume".into(), k.resume_ledger(a)),
        ("active".into(), k.active_session(a)),
        ("placement".into(), k.placement(a)),
        ("net".into(), k.net_counter(a)),
        ("q_pending".into(), q.clone().map(|q| q.pending)),
        ("q_dead".into(), q.clone().map(|q| q.dead)),
        ("q_dead_index".into(), q.clone().map(|q| q.dead_index)),
        ("q_consumers".into(), q.clone().map(|q| q.consumers)),
        ("q_lock".into(), q.clone().map(|q| q.recovery_lock)),
        ("q_held".into(), q.clone().map(|q| q.processing_held)),
        ("q_total".into(), q.clone().map(|q| q.processing_total)),
        (
            "q_processing".into(),
            q.clone().and_then(|q| q.processing(b)),
        ),
        ("q_consumer".into(), q.and_then(|q| q.consumer_heartbeat(b))),
    ]
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{1,6}",
        "[a-z:*?\\[\\]\\\\{}%. _-]{1,12}",
        any::<String>().prop_filter("non-empty, bounded", |s| !s.is_empty() && s.len() <= 64),
    ]
}

proptest! {
    #[test]
    fn distinct_inputs_never_share_a_key(inputs in proptest::collection::vec((segment(), segment()), 1..12)) {
        let k = ks("ns");
        let mut seen: HashMap<String, (String, String, String)> = HashMap::new();
        for (a, b) in &inputs {
            for (family, key) in all_keys(&k, a, b) {
                let key = key.map_err(|e| TestCaseError::fail(e.to_string()))?;
                // Builders that ignore `b` legitimately repeat for equal `a`.
                let uses_b = matches!(family.as_str(), "handoff_i" | "handoff_p" | "nonce" | "q_processing" | "q_consumer");
                let identity = (family.clone(), a.clone(), if uses_b { b.clone() } else { String::new() });
                if let Some(previous) = seen.insert(key.clone(), identity.clone()) {
                    prop_assert_eq!(previous, identity, "collision on {}", key);
                }
            }
        }
    }

    #[test]
    fn no_input_escapes_its_pattern(a in segment(), b in segment()) {
        let k = ks("ns");
        let other = ks("ns2");
        // An exact key used as a pattern matches only itself.
        for ((_, ka), (_, kb)) in all_keys(&k, &a, "x").into_iter().zip(all_keys(&k, &b, "x")) {
            let (ka, kb) = (ka.map_err(|e| TestCaseError::fail(e.to_string()))?, kb.map_err(|e| TestCaseError::fail(e.to_string()))?);
            prop_assert!(glob_match(ka.as_bytes(), ka.as_bytes()));
            prop_assert_eq!(glob_match(ka.as_bytes(), kb.as_bytes()), a == b);
        }
        // Family patterns match their own keys and nothing in another namespace or family.
        let marker = k.transfer_activated(&a).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(glob_match(k.transfer_activated_pattern().as_bytes(), marker.as_bytes()));
        prop_assert_eq!(k.transfer_token_of(&marker), Some(a.clone()));
        let pending = k.transfer_pending(&a).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(glob_match(k.transfer_pending_pattern().as_bytes(), pending.as_bytes()));
        prop_assert!(!glob_match(k.transfer_pending_pattern().as_bytes(), marker.as_bytes()));
        let q = k.queue("q").map_err(|e| TestCaseError::fail(e.to_string()))?;
        let list = q.processing(&a).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(glob_match(q.processing_pattern().as_bytes(), list.as_bytes()));
        prop_assert_eq!(q.consumer_of_processing(&list), Some(a.clone()));
        prop_assert_eq!(q.consumer_of_processing(&q.pending), None);
        // The held counts are no processing list: recovery's backstop never takes them for one.
        for counter in [&q.processing_held, &q.processing_total] {
            prop_assert!(!glob_match(q.processing_pattern().as_bytes(), counter.as_bytes()));
            prop_assert_eq!(q.consumer_of_processing(counter), None);
        }
        for (_, key) in all_keys(&other, &a, &b) {
            let key = key.map_err(|e| TestCaseError::fail(e.to_string()))?;
            for pattern in k.namespace_patterns() {
                prop_assert!(!glob_match(pattern.as_bytes(), key.as_bytes()), "{} matched {}", pattern, key);
            }
        }
        for (_, key) in all_keys(&k, &a, &b) {
            let key = key.map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(k.namespace_patterns().iter().any(|p| glob_match(p.as_bytes(), key.as_bytes())));
        }
        let consumed = k.handoff_consumed(&a).map_err(|e| TestCaseError::fail(e.to_string()))?;
        for target in k.cleanup_targets() {
            for pattern in &target.scan_patterns {
                prop_assert!(!glob_match(pattern.as_bytes(), consumed.as_bytes()), "cleanup would delete a consumed marker");
            }
        }
    }

    #[test]
    fn escaped_segments_hold_no_structure(a in segment()) {
        let escaped = segment::escape("x", &a).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(escaped.bytes().all(segment::is_escaped_byte));
        prop_assert_eq!(segment::unescape(&escaped), Some(a));
    }
}

#[test]
fn glob_matcher_follows_redis_semantics() {
    assert!(glob_match(b"a*c", b"abbbc"));
    assert!(glob_match(b"a?c", b"abc"));
    assert!(glob_match(b"a[bx]c", b"axc"));
    assert!(!glob_match(b"a[^bx]c", b"axc"));
    assert!(glob_match(b"a\\*c", b"a*c"));
    assert!(!glob_match(b"a\\*c", b"abc"));
}

#[test]
fn every_script_group_shares_one_slot() {
    let k = ks("shardkeep");
    let token = "tok-1";
    let handoff_group = [
        k.handoff(token, &HandoffScope::Instance("i-1".into())),
        k.handoff(token, &HandoffScope::Placement("p-9".into())),
        k.handoff(token, &HandoffScope::Port(7777)),
        k.handoff_consumed(token),
    ];
    let presence_group = [
        k.presence_account("acc"),
        k.presence_character("chr"),
        Ok(k.presence_account_index()),
        Ok(k.presence_character_index()),
    ];
    let registry_group = [k.registry_instance("inst"), Ok(k.registry_index())];
    let q = k.queue("journal").unwrap_or_else(|e| panic!("{e}"));
    let queue_group = [
        Ok(q.pending.clone()),
        Ok(q.dead.clone()),
        Ok(q.consumers.clone()),
        Ok(q.recovery_lock.clone()),
        Ok(q.processing_held.clone()),
        Ok(q.processing_total.clone()),
        q.processing("c-1"),
        q.processing("c-2"),
        q.consumer_heartbeat("c-1"),
    ];
    for group in [
        &handoff_group[..],
        &presence_group,
        &registry_group,
        &queue_group,
    ] {
        let slots: Vec<u16> = group
            .iter()
            .map(|k| key_slot(k.as_deref().unwrap_or_else(|e| panic!("{e}"))))
            .collect();
        assert!(
            slots.windows(2).all(|w| w[0] == w[1]),
            "{group:?} spans slots {slots:?}"
        );
    }
    // Different handoff tokens spread over slots rather than piling onto one.
    assert_ne!(
        key_slot(&k.handoff_consumed("a").unwrap_or_default()),
        key_slot(&k.handoff_consumed("b").unwrap_or_default())
    );
}

#[test]
fn queue_keys_have_the_documented_names() {
    let q = ks("sk").queue("journal").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(q.pending, "{sk:q:journal}:pending");
    assert_eq!(q.dead, "{sk:q:journal}:dead");
    assert_eq!(q.consumers, "{sk:q:journal}:consumers");
    assert_eq!(q.processing_held, "{sk:q:journal}:processing-held");
    assert_eq!(q.processing_total, "{sk:q:journal}:processing-total");
    assert_eq!(
        q.processing("c1").as_deref(),
        Ok("{sk:q:journal}:processing:c1")
    );
    assert_eq!(
        q.consumer_heartbeat("c1").as_deref(),
        Ok("{sk:q:journal}:consumer:c1")
    );
}

#[test]
fn bad_namespaces_and_segments_are_typed_errors() {
    for bad in ["", "a:b", "a*", "{x}", &"n".repeat(65)] {
        assert!(
            matches!(Keyspace::new(bad), Err(KeyError::InvalidNamespace(_))),
            "{bad:?}"
        );
    }
    let k = ks("ns");
    assert_eq!(
        k.placement(""),
        Err(KeyError::Empty {
            what: "character id"
        })
    );
}

#[test]
fn checkpoint_keys_name_the_character_id() {
    let k = ks("ns");
    let id = uuid::Uuid::from_u128(7);
    assert_eq!(
        k.checkpoint(id),
        "ns:checkpoint:00000000-0000-0000-0000-000000000007"
    );
    assert_ne!(k.checkpoint(id), k.checkpoint(uuid::Uuid::from_u128(8)));
}

#[test]
fn docs_table_matches_the_catalogue() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/keyspace.md");
    let docs = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert!(
        docs.contains(&families::markdown_table()),
        "docs/keyspace.md is out of date; paste in keyspace::families::markdown_table():\n{}",
        families::markdown_table()
    );
}

#[test]
fn every_cleanup_target_names_a_family_that_points_back() {
    let k = ks("ns");
    for target in k.cleanup_targets() {
        assert!(
            FAMILIES
                .iter()
                .any(|f| f.cleanup_target == Some(target.name))
        );
    }
    for family in FAMILIES {
        if let Some(name) = family.cleanup_target {
            assert!(k.cleanup_target(name).is_some(), "{name}");
        }
    }
}
