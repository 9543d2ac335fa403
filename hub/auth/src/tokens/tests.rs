use super::*;

fn tokens() -> Tokens {
    Tokens::load(Vec::new(), None).unwrap().0
}

#[test]
fn tokens_carry_their_expiry_and_records_without_one_never_expire() {
    let mut t = tokens();
    let (token, record, _) = t.issue("prod", "alice", 100, Some(200)).unwrap();
    assert_eq!(record.expires, Some(200));
    let found = t.verify(&token).unwrap();
    assert!(!found.expired_at(199) && found.expired_at(200));
    let message = expired_message(found, "get a new kubeconfig");
    assert!(
        message.contains("\"alice\" expired at 1970-01-01T00:03:20Z")
            && message.contains("get a new kubeconfig"),
        "{message}"
    );
    // A record stored before tokens had an expiry reads back without one.
    let old: TokenRecord = serde_json::from_str(
        r#"{"id":"1","account":"prod","name":"old","sha256":"00","created":1}"#,
    )
    .unwrap();
    assert_eq!((old.expires, old.accounts.len()), (None, 0));
    assert!(!old.expired_at(i64::MAX));
}

#[test]
fn session_tokens_sit_beside_each_other_and_expired_ones_are_dropped() {
    let mut t = tokens();
    t.issue_session("prod", "bob", 100, 150).unwrap();
    let (first, _, _) = t.issue_session("prod", "alice", 100, 150).unwrap();
    let (second, _, ops) = t.issue_session("prod", "alice", 120, 170).unwrap();
    assert_eq!(ops.len(), 1, "nothing expired yet: {ops:?}");
    assert!(t.verify(&first).is_some() && t.verify(&second).is_some());
    let (_, _, ops) = t.issue_session("prod", "alice", 160, 260).unwrap();
    assert!(
        matches!(
            &ops[..],
            [StoreOp::DeleteToken { .. }, StoreOp::PutToken { .. }]
        ),
        "the first, expired at 150, is dropped: {ops:?}"
    );
    assert!(t.verify(&first).is_none() && t.verify(&second).is_some());
    // Bob's expired token is not Alice's to drop: listed until the retention ends.
    assert!(t.list().iter().any(|r| r.name == "bob"));
    assert_eq!(t.prune_expired(160, 0).len(), 1, "bob's, at the retention");
}

#[test]
fn expired_tokens_are_pruned_after_the_retention_only() {
    let mut t = tokens();
    let (_, old, _) = t.issue("prod", "old", 0, Some(100)).unwrap();
    let (_, recent, _) = t.issue("prod", "recent", 0, Some(150)).unwrap();
    let (_, forever, _) = t.issue("prod", "forever", 0, None).unwrap();
    let (_, api, _) = t
        .issue_api(
            "ci",
            Role::Operator,
            0,
            Limits {
                expires: Some(90),
                accounts: vec![],
            },
        )
        .unwrap();
    // At 160 with a retention of 60: old (100) and the API token (90) expired at or before
    // 100; recent (150) stays listed, expired but within the retention.
    let ops = t.prune_expired(160, 60);
    let mut deleted: Vec<&str> = ops
        .iter()
        .map(|op| match op {
            StoreOp::DeleteToken { id } => id.as_str(),
            other => panic!("only deletions: {other:?}"),
        })
        .collect();
    deleted.sort();
    let mut expected = vec![old.id.as_str(), api.id.as_str()];
    expected.sort();
    assert_eq!(deleted, expected);
    let listed: Vec<String> = t.list().into_iter().map(|r| r.id).collect();
    assert!(
        listed.contains(&recent.id) && listed.contains(&forever.id),
        "{listed:?}"
    );
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(t.find("prod", "old").is_none());
    // Nothing left to prune: no ops (every tick runs it).
    assert!(t.prune_expired(160, 60).is_empty());
    assert_eq!(t.prune_expired(210, 60).len(), 1, "recent, once 60 s past");
}

#[test]
fn issued_tokens_verify_by_hash_and_rotate_by_name() {
    let mut t = tokens();
    let (prod, record, ops) = t.issue("prod", "alice", 1, None).unwrap();
    assert!(prod.starts_with(TOKEN_PREFIX) && prod.len() > 40, "{prod}");
    assert_eq!(ops.len(), 1);
    assert!(
        !format!("{ops:?}").contains(&prod),
        "the token itself is never stored"
    );
    assert_eq!(t.verify(&prod).map(|r| r.account.as_str()), Some("prod"));
    assert_eq!(record.sha256, hex(&hash(&prod)));
    assert!(t.verify("sat_wrong").is_none());
    assert!(
        t.verify(&prod[4..]).is_none(),
        "the prefix is part of the token"
    );

    let (bob, _, _) = t.issue("prod", "bob", 2, None).unwrap();
    let (rotated, _, ops) = t.issue("prod", "alice", 3, None).unwrap();
    assert_eq!(
        ops.len(),
        2,
        "old alice token deleted, new one stored: {ops:?}"
    );
    assert!(t.verify(&prod).is_none(), "rotation revokes the old token");
    assert!(t.verify(&rotated).is_some() && t.verify(&bob).is_some());
    assert_eq!(t.list().len(), 2);

    let id = t.verify(&bob).map(|r| r.id.clone()).unwrap();
    let (revoked, ops) = t.revoke(&id).unwrap();
    assert_eq!(revoked.name, "bob");
    assert!(matches!(&ops[..], [StoreOp::DeleteToken { id: x }] if *x == id));
    assert!(t.verify(&bob).is_none());
    assert!(t.revoke(&id).is_none());
}

#[test]
fn api_tokens_have_a_role_rotate_by_name_and_never_open_the_proxy() {
    let mut t = tokens();
    let (proxy, _, _) = t.issue("prod", "ci", 1, None).unwrap();
    let (api, record, ops) = t
        .issue_api("ci", Role::Operator, 2, Limits::default())
        .unwrap();
    assert_eq!((record.kind(), record.role), ("api", Some(Role::Operator)));
    assert!(record.account.is_empty());
    assert!(
        !format!("{ops:?}").contains(&api),
        "the token itself is never stored"
    );
    assert!(
        t.verify(&api).is_none(),
        "an API token opens no proxy route"
    );
    assert!(
        t.verify_api(&proxy).is_none(),
        "a proxy token opens no API route"
    );
    assert_eq!(t.verify_api(&api).map(|r| r.name.as_str()), Some("ci"));
    assert!(
        t.verify(&proxy).is_some(),
        "same name, other kind: both kept"
    );

    let (rotated, _, ops) = t
        .issue_api("ci", Role::Reader, 3, Limits::default())
        .unwrap();
    assert_eq!(ops.len(), 2, "old deleted, new stored: {ops:?}");
    assert!(t.verify_api(&api).is_none());
    assert_eq!(
        t.verify_api(&rotated).and_then(|r| r.role),
        Some(Role::Reader)
    );
    assert_eq!(t.list().len(), 2);

    let json = serde_json::to_string(&t.verify_api(&rotated).unwrap()).unwrap();
    assert!(
        json.contains("\"role\":\"reader\"") && !json.contains("account"),
        "{json}"
    );
    let proxy_record = serde_json::to_string(&t.verify(&proxy).unwrap()).unwrap();
    assert!(
        !proxy_record.contains("role"),
        "stored proxy tokens are unchanged: {proxy_record}"
    );
    assert_eq!(
        parse_sha256(&sha256_hex("x").to_uppercase()),
        Some(sha256("x"))
    );
    assert_eq!(parse_sha256("abc"), None);
}

#[test]
fn derived_tokens_survive_a_reload_and_rotate_by_generation() {
    let (mut t, key_ops) = Tokens::load(Vec::new(), None).unwrap();
    let key = match &key_ops[..] {
        [StoreOp::PutMeta { key, value }] if key == DERIVATION_KEY => value.clone(),
        other => panic!("a new store gets a derivation key: {other:?}"),
    };
    let (first, _, ops) = t.derived("prod", CLOUDDRIVER_TOKEN, 1).unwrap();
    assert_eq!(ops.len(), 1);
    let (again, record, ops) = t.derived("prod", CLOUDDRIVER_TOKEN, 2).unwrap();
    assert_eq!(record.generation, Some(1));
    assert_eq!(first, again);
    assert!(ops.is_empty(), "nothing to store the second time");

    // A restart: the records and the key come back from the store.
    let (mut reloaded, ops) = Tokens::load(t.list(), Some(&key)).unwrap();
    assert!(ops.is_empty());
    let (after_restart, _, ops) = reloaded.derived("prod", CLOUDDRIVER_TOKEN, 3).unwrap();
    assert_eq!(after_restart, first, "same token after a restart");
    assert!(ops.is_empty());
    assert!(reloaded.verify(&first).is_some());

    let (rotated, record, _) = reloaded
        .rotate_derived("prod", CLOUDDRIVER_TOKEN, 4)
        .unwrap();
    assert_eq!(record.generation, Some(2));
    assert_ne!(rotated, first);
    assert!(reloaded.verify(&first).is_none());
    assert_eq!(
        reloaded.verify(&rotated).and_then(|r| r.generation),
        Some(2)
    );
    // Another account's derived token differs, and another key derives other tokens.
    let (staging, _, _) = reloaded.derived("staging", CLOUDDRIVER_TOKEN, 5).unwrap();
    assert_ne!(staging, rotated);
    let (mut other_hub, _) = Tokens::load(Vec::new(), None).unwrap();
    assert_ne!(
        other_hub.derived("prod", CLOUDDRIVER_TOKEN, 1).unwrap().0,
        first
    );
}

/// What a store holds after `ops`, as records (a restart or another replica reads these).
fn apply(store: &mut BTreeMap<String, TokenRecord>, ops: Vec<StoreOp>) {
    for op in ops {
        match op {
            StoreOp::PutToken { record } => {
                store.insert(record.id.clone(), record);
            }
            StoreOp::DeleteToken { id } => {
                store.remove(&id);
            }
            _ => {}
        }
    }
}

#[test]
fn a_revoked_derived_token_never_comes_back() {
    let mut store = BTreeMap::new();
    let (mut t, key_ops) = Tokens::load(Vec::new(), None).unwrap();
    let key = match &key_ops[..] {
        [StoreOp::PutMeta { value, .. }] => value.clone(),
        other => panic!("{other:?}"),
    };
    let (first, record, ops) = t.derived("prod", CLOUDDRIVER_TOKEN, 1).unwrap();
    apply(&mut store, ops);
    let (_, ops) = t.revoke(&record.id).unwrap();
    apply(&mut store, ops);
    assert!(t.verify(&first).is_none());
    assert!(t.list().is_empty(), "a tombstone is not a token to list");
    assert!(t.find("prod", CLOUDDRIVER_TOKEN).is_none());

    // The registrar derives again at once: a new generation, never the revoked one.
    let (second, record, ops) = t.derived("prod", CLOUDDRIVER_TOKEN, 2).unwrap();
    apply(&mut store, ops);
    assert_eq!(record.generation, Some(2));
    assert_ne!(second, first);
    assert!(t.verify(&first).is_none());

    // Rotate, then revoke the rotated one: neither earlier generation returns.
    let (third, record, ops) = t.rotate_derived("prod", CLOUDDRIVER_TOKEN, 3).unwrap();
    apply(&mut store, ops);
    assert_eq!(record.generation, Some(3));
    let (_, ops) = t.revoke(&record.id).unwrap();
    apply(&mut store, ops);
    let (fourth, record, ops) = t.derived("prod", CLOUDDRIVER_TOKEN, 4).unwrap();
    apply(&mut store, ops);
    assert_eq!(record.generation, Some(4));
    for old in [&first, &second, &third] {
        assert!(t.verify(old).is_none());
        assert_ne!(old, &fourth);
    }

    // A restart (or another replica) reads the tombstone from the store.
    let records: Vec<TokenRecord> = store.values().cloned().collect();
    assert_eq!(
        records.iter().filter(|r| r.revoked).count(),
        1,
        "one tombstone per account and name: {records:?}"
    );
    let (mut reloaded, _) = Tokens::load(records.clone(), Some(&key)).unwrap();
    assert_eq!(reloaded.revoked_generation("prod", CLOUDDRIVER_TOKEN), 3);
    assert_eq!(
        reloaded.derived("prod", CLOUDDRIVER_TOKEN, 5).unwrap().0,
        fourth
    );
    // A replica that had not seen the revocation wrote generation 3 back: still refused.
    let mut stale = records;
    stale.push(TokenRecord {
        id: "stale".into(),
        account: "prod".into(),
        name: CLOUDDRIVER_TOKEN.into(),
        sha256: sha256_hex(&third),
        created: 3,
        generation: Some(3),
        role: None,
        revoked: false,
        expires: None,
        accounts: Vec::new(),
    });
    reloaded.replace_records(stale);
    assert!(reloaded.verify(&third).is_none());
    // Revoking everything and a new store record: the floor holds on a fresh load too.
    let (mut fresh, _) = Tokens::load(store.values().cloned().collect(), Some(&key)).unwrap();
    let id = fresh.find("prod", CLOUDDRIVER_TOKEN).unwrap().id.clone();
    let (_, ops) = fresh.revoke(&id).unwrap();
    apply(&mut store, ops);
    let (mut after, _) = Tokens::load(store.values().cloned().collect(), Some(&key)).unwrap();
    let (fifth, record, _) = after.derived("prod", CLOUDDRIVER_TOKEN, 6).unwrap();
    assert_eq!(record.generation, Some(5));
    assert!(after.verify(&fourth).is_none());
    assert!(after.verify(&fifth).is_some());
}

#[test]
fn admin_token_file_is_created_private_and_read_back() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = std::env::temp_dir().join(format!("hub-admin-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("sub").join("admin-token");
    let (token, created) = AdminToken::read_or_create(&path).unwrap();
    assert!(created);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let (again, created) = AdminToken::read_or_create(&path).unwrap();
    assert!(!created);
    assert_eq!(token, again);
    let admin = AdminToken::new(&token);
    assert!(admin.matches(&token) && admin.matches(&format!("{token}\n")));
    assert!(!admin.matches("sat_other"));
    assert!(!format!("{admin:?}").contains(&token));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bearer_headers() {
    assert_eq!(bearer("Bearer abc"), Some("abc"));
    assert_eq!(bearer("bearer  abc "), Some("abc"));
    assert_eq!(bearer("Basic abc"), None);
    assert_eq!(bearer("Bearer "), None);
    assert_eq!(bearer("abc"), None);
}
