use serde_json::json;

use super::*;

const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: hub\n  cluster:\n    server: https://hub.example/clusters/prod\nusers:\n- name: prod\n  user:\n    token: \"secret-token-123\"\ncontexts:\n- name: prod\n  context:\n    cluster: hub\n    user: prod\ncurrent-context: prod\n";

fn account(properties: Value) -> DesiredAccount {
    DesiredAccount {
        name: "prod".into(),
        kubeconfig: KUBECONFIG.into(),
        properties,
    }
}

fn defaults(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap()
}

#[test]
fn body_takes_only_what_means_the_same() {
    let a = account(json!({
        "name": "prod",
        "permissions": {"read": ["a"], "WRITE": ["b"]},
        "namespaces": ["web", "db"],
        "omitNamespaces": [],
        "kinds": ["deployments"],
        "omitKinds": [],
        "serviceAccount": true,
        "kubeconfigFile": "/etc/k",
        "context": "c",
        "onlyNamespacedResources": true,
        "metrics": false,
    }));
    let body = api_body(&a, &Map::new()).unwrap();
    assert_eq!(
        Value::Object(body.clone()),
        json!({
            "type": "kubernetes",
            "@type": "kubernetes",
            "name": "prod",
            "kubeconfigContents": KUBECONFIG,
            "permissions": {"READ": ["a"], "WRITE": ["b"]},
            "namespaces": ["web", "db"],
        })
    );
    for (k, v) in &body {
        if k != "type" && k != "@type" {
            check_field(k, v).unwrap();
        }
    }
}

#[test]
fn defaults_fill_in_and_the_account_wins() {
    let d = defaults(json!({
        "kubectlExecutable": "kubectl-1.29",
        "cacheIntervalSeconds": 30,
        "onlySpinnakerManaged": true,
        "permissions": {"READ": ["everyone"]},
        "omitNamespaces": ["kube-system"],
        "omitKinds": ["event"],
    }));
    check_defaults(&d).unwrap();
    let body = managed_account(
        &account(json!({"namespaces": ["web"], "permissions": {"WRITE": ["ops"]}})),
        &d,
    )
    .unwrap();
    assert_eq!(body["kubectlExecutable"], "kubectl-1.29");
    assert_eq!(body["cacheIntervalSeconds"], 30);
    assert_eq!(body["permissions"], json!({"WRITE": ["ops"]}));
    assert_eq!(body["namespaces"], json!(["web"]));
    assert!(!body.contains_key("omitNamespaces"));
    assert_eq!(body["omitKinds"], json!(["event"]));

    // Without account settings, the defaults stand.
    let body = managed_account(&account(Value::Null), &d).unwrap();
    assert_eq!(body["permissions"], json!({"READ": ["everyone"]}));
    assert_eq!(body["omitNamespaces"], json!(["kube-system"]));
}

#[test]
fn invalid_settings_are_errors() {
    let bad_perm = managed_account(
        &account(json!({"permissions": {"ADMIN": ["x"]}})),
        &Map::new(),
    );
    assert!(
        matches!(bad_perm, Err(BodyError::Invalid { .. })),
        "{bad_perm:?}"
    );
    let both = managed_account(
        &account(json!({"namespaces": ["a"], "omitNamespaces": ["b"]})),
        &Map::new(),
    );
    assert!(matches!(both, Err(BodyError::Conflict(_))), "{both:?}");
    let mut empty = account(Value::Null);
    empty.name.clear();
    assert_eq!(
        managed_account(&empty, &Map::new()),
        Err(BodyError::EmptyName)
    );
    let mut no_kubeconfig = account(Value::Null);
    no_kubeconfig.kubeconfig = " ".into();
    assert_eq!(
        managed_account(&no_kubeconfig, &Map::new()),
        Err(BodyError::EmptyKubeconfig)
    );
    assert!(managed_account(&account(json!({"namespaces": "web"})), &Map::new()).is_err());
    assert!(managed_account(&account(json!([1])), &Map::new()).is_err());
}

#[test]
fn defaults_are_checked() {
    let problems = check_defaults(&defaults(json!({
        "serviceAccount": true,
        "kubeconfigFile": "/x",
        "type": "kubernetes",
        "cacheIntervalSecs": 30,
        "cacheThreads": "2",
        "permissions": {"OWNER": []},
        "kinds": ["deployment"],
        "omitKinds": ["pod"],
    })))
    .unwrap_err();
    assert_eq!(problems.len(), 7, "{problems:#?}");
    assert!(check_defaults(&defaults(json!({"debug": false, "cacheThreads": 2}))).is_ok());
}

#[test]
fn hash_ignores_key_order_and_sees_the_token() {
    let a = defaults(json!({"name": "a", "permissions": {"READ": ["x"], "WRITE": ["y"]}}));
    let b = defaults(json!({"permissions": {"WRITE": ["y"], "READ": ["x"]}, "name": "a"}));
    assert_eq!(body_hash(&a), body_hash(&b));
    assert_eq!(body_hash(&a).len(), 64);
    let c = defaults(json!({"name": "a", "permissions": {"READ": ["x"], "WRITE": ["z"]}}));
    assert_ne!(body_hash(&a), body_hash(&c));
}

#[test]
fn file_round_trips() {
    let one = managed_account(
        &account(json!({"permissions": {"READ": ["a"]}})),
        &Map::new(),
    )
    .unwrap();
    let mut two_account = account(Value::Null);
    two_account.name = "dev".into();
    two_account.kubeconfig = KUBECONFIG.trim_end().into();
    let two = managed_account(&two_account, &Map::new()).unwrap();
    let text = accounts_file(&[one.clone(), two.clone()]).unwrap();
    assert!(text.starts_with(FILE_HEADER));
    assert!(text.contains("kubeconfigContents: |"), "{text}");
    let parsed: Value = serde_saphyr::from_str(&text).unwrap();
    assert_eq!(
        parsed,
        json!({"kubernetes": {"accounts": [Value::Object(one), Value::Object(two)]}})
    );
    let empty: Value = serde_saphyr::from_str(&accounts_file(&[]).unwrap()).unwrap();
    assert_eq!(empty, json!({"kubernetes": {"accounts": []}}));
}

#[test]
fn answers() {
    let kork = br#"{"error":"Bad Request","message":"Cannot save account without granting permissions for current user (name: prod)","status":400}"#;
    assert_eq!(classify(Method::Put, 200, b"{}"), Outcome::Done);
    assert_eq!(classify(Method::Delete, 404, b""), Outcome::Done);
    assert_eq!(
        classify(
            Method::Delete,
            400,
            br#"{"message":"Cannot delete an account which does not exist (name: x)"}"#
        ),
        Outcome::Done
    );
    for status in [500, 502, 503, 429, 409] {
        assert!(
            matches!(
                classify(Method::Put, status, b"oops"),
                Outcome::Retry { .. }
            ),
            "{status}"
        );
    }
    match classify(Method::Put, 400, kork) {
        Outcome::Rejected { message, hint, .. } => {
            assert!(message.starts_with("Cannot save account"));
            assert!(hint.contains("--clouddriver-user"));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        classify(
            Method::Put,
            500,
            br#"{"message":"Cannot use AccountDefinitionService endpoints without enabling AccountDefinitionService bean"}"#
        ),
        Outcome::Rejected { hint, .. } if hint.contains("account.storage.enabled")
    ));
    for status in [401, 403, 404, 405, 415] {
        assert!(
            matches!(classify(Method::Put, status, b""), Outcome::Rejected { .. }),
            "{status}"
        );
    }
    assert!(error_message(&[b'x'; 1000]).chars().count() <= 301);
}

#[test]
fn backoff_grows_to_the_cap_with_jitter() {
    let b = Backoff {
        initial: Duration::from_secs(1),
        factor: 2,
        max: Duration::from_secs(300),
    };
    assert_eq!(backoff_delay(&b, 1, 0.5), Duration::from_secs(1));
    assert_eq!(backoff_delay(&b, 4, 0.5), Duration::from_secs(8));
    assert_eq!(backoff_delay(&b, 30, 0.5), Duration::from_secs(300));
    assert_eq!(backoff_delay(&b, 1000, 0.5), Duration::from_secs(300));
    assert_eq!(backoff_delay(&b, 1, 0.0), Duration::from_millis(800));
    assert_eq!(backoff_delay(&b, 1, 1.0), Duration::from_millis(1200));
    for _ in 0..100 {
        let u = jitter_unit();
        assert!((0.0..1.0).contains(&u));
    }
}

#[test]
fn secrets_are_scrubbed() {
    let secrets = kubeconfig_secrets(KUBECONFIG);
    assert_eq!(secrets, ["secret-token-123"]);
    assert_eq!(
        redact("bad value secret-token-123 here", &secrets),
        "bad value <redacted> here"
    );
    assert_eq!(path_segment("prod-eu_1.x"), "prod-eu_1.x");
    assert_eq!(path_segment("a/b c"), "a%2Fb%20c");
}
