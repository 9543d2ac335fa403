use super::*;

#[test]
fn armory_agent_yaml_parses_as_is() {
    let armory = r#"
clouddriver:
  grpc: spin-clouddriver-grpc:9091
  insecure: false
  tls:
    serverName: clouddriver.example.com
    cacertFile: /opt/ca.pem
    clientCertFile: /opt/tls.crt
    clientKeyFile: /opt/tls.key
  keepAliveHeartbeatSeconds: 20
  auth:
    token: literal-token
  backoff:
    baseDelay: 1000000000
    multiplier: 1.6
    jitter: 0.2
    maxDelay: 120000000000
kubernetes:
  accounts:
    - name: prod
      serviceAccount: true
      kinds: [deployment, replicaSet]
      permissions:
        READ: [dev]
        WRITE: [ops]
    - name: staging
      kubeConfigFile: /kubeconfigfiles/staging
      context: admin@staging
      namespaces: [web]
      customResourceDefinitions:
        - kind: ServiceMonitor.monitoring.coreos.com
      oAuthScopes: [ignored]
tasks:
  totalBudget: 1000
  budgetPerAccount: 50
server:
  port: 8082
"#;
    let config = AgentConfig::from_yaml(armory).unwrap();
    assert_eq!(config.clouddriver.grpc, "spin-clouddriver-grpc:9091");
    assert_eq!(
        config.clouddriver.backoff.base_delay,
        Duration::from_secs(1)
    );
    assert_eq!(
        config.clouddriver.backoff.max_delay,
        Duration::from_secs(120)
    );
    assert_eq!(
        config.clouddriver.tls.cacert_file.as_deref(),
        Some("/opt/ca.pem")
    );
    let staging = &config.kubernetes.accounts[1];
    assert_eq!(
        staging.kubeconfig_file.as_deref(),
        Some("/kubeconfigfiles/staging")
    );
    assert_eq!(
        staging.custom_resource_definitions[0].scope,
        CustomResourceScope::Namespaced
    );
    assert_eq!(config.kubernetes.accounts[0].permissions["WRITE"], ["ops"]);
    assert_eq!(config.tasks.total_budget, 1000);
    assert_eq!(
        config.clouddriver.auth.token.as_deref(),
        Some("literal-token")
    );
    let ours = AgentConfig::from_yaml(
        "clouddriver:\n  auth:\n    tokenFile: /t\n    enrolmentTokenFile: /e\n",
    )
    .unwrap();
    assert_eq!(ours.clouddriver.auth.token_file.as_deref(), Some("/t"));
    assert_eq!(
        ours.clouddriver.auth.enrolment_token_file.as_deref(),
        Some("/e")
    );
}

#[test]
fn empty_file_is_the_default_and_rendering_round_trips() {
    assert_eq!(AgentConfig::from_yaml("").unwrap(), AgentConfig::default());
    let mut config = AgentConfig::default();
    config.clouddriver.backoff.base_delay = Duration::from_millis(250);
    config.kubernetes.accounts.push(AccountConfig {
        name: "prod".into(),
        service_account: true,
        omit_kinds: vec!["Event".into()],
        impersonate_service_account: Some(crate::v1alpha1::ServiceAccountRef {
            namespace: "team-a".into(),
            name: "deployer".into(),
        }),
        ..Default::default()
    });
    let yaml = config.to_yaml().unwrap();
    assert!(yaml.contains("baseDelay: 250ms"), "{yaml}");
    assert!(yaml.contains("impersonateServiceAccount:"), "{yaml}");
    assert_eq!(AgentConfig::from_yaml(&yaml).unwrap(), config);
}

#[test]
fn unknown_keys_are_reported_with_their_path_and_the_closest_known_key() {
    let text = "kubernets:\n  accounts: []\nhub:\n  grcp: h:1\n  tls:\n    cacertfil: /ca\nkubernetes:\n  accounts:\n    - name: a\n      kindz: [Deployment]\n      customResourceDefinitions:\n        - kind: X.example.com\n          scpoe: Cluster\n    - name: b\n      oAuthScopes: [x]\n";
    let (config, unknown) = AgentConfig::from_yaml_reporting_unknown(text).unwrap();
    assert_eq!(config.kubernetes.accounts.len(), 2);
    assert!(config.kubernetes.accounts[0].kinds.is_empty());
    let shown: Vec<String> = unknown.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "kubernets (did you mean `kubernetes`?)",
            "hub.grcp (did you mean `grpc`?)",
            "hub.tls.cacertfil (did you mean `cacertFile`?)",
            "kubernetes.accounts[0].kindz (did you mean `kinds`?)",
            "kubernetes.accounts[0].customResourceDefinitions[0].scpoe (did you mean `scope`?)",
            // An Armory key this agent does not support: reported, no far-fetched guess.
            "kubernetes.accounts[1].oAuthScopes",
        ]
    );
    let (_, none) = AgentConfig::from_yaml_reporting_unknown(
            "kubernetes:\n  accounts:\n    - name: a\n      kubeConfigFile: /k\n      permissions:\n        READ: [x]\n",
        )
        .unwrap();
    assert!(none.is_empty(), "{none:?}");
}

#[test]
fn closest_key_takes_small_edits_only() {
    assert_eq!(edit_distance("kindz", "kinds"), 1);
    assert_eq!(edit_distance("", "abc"), 3);
    assert_eq!(edit_distance("KubeConfigFile", "kubeconfigfile"), 0);
    assert_eq!(edit_distance("omitKind", "omitKinds"), 1);
    let known = known_keys("kubernetes.accounts[]");
    assert_eq!(closest_key("namespace", known), Some("namespaces"));
    assert_eq!(closest_key("omitnamespace", known), Some("omitNamespaces"));
    assert_eq!(closest_key("providerVersion", known), None);
    assert_eq!(closest_key("x", known), None);
    assert_eq!(closest_key("prot", known_keys("server")), Some("port"));
    assert_eq!(closest_key("grcp", known_keys("hub")), Some("grpc"));
    assert_eq!(closest_key("port", known_keys("no.such.section")), None);
}

/// Every key the types write is in [`KNOWN_KEYS`] for its section, so suggestions follow
/// the types.
#[test]
fn known_keys_cover_every_field() {
    fn walk(value: &serde_json::Value, section: &str, seen: &mut usize) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, child) in map {
                    assert!(
                        known_keys(section).contains(&key.as_str()),
                        "{section}.{key} is missing from KNOWN_KEYS"
                    );
                    *seen += 1;
                    // `permissions` is a map of role names, not keys of ours.
                    if key != "permissions" {
                        let child_section = if section.is_empty() {
                            key.clone()
                        } else {
                            format!("{section}.{key}")
                        };
                        walk(child, &child_section, seen);
                    }
                }
            }
            serde_json::Value::Array(items) => {
                for item in items {
                    walk(item, &format!("{section}[]"), seen);
                }
            }
            _ => {}
        }
    }
    let mut config = AgentConfig::default();
    config.clouddriver.insecure = Some(false);
    config.clouddriver.tls = HubTls {
        server_name: Some("s".into()),
        cacert_file: Some("c".into()),
        client_cert_file: Some("c".into()),
        client_key_file: Some("k".into()),
    };
    config.clouddriver.auth = HubAuth {
        token: Some("t".into()),
        token_file: Some("t".into()),
        enrolment_token_file: Some("e".into()),
    };
    config.clouddriver.keep_alive_heartbeat_seconds = Some(20);
    config.clouddriver.no_proxy = true;
    config.kubernetes.no_proxy = true;
    config.kubernetes.accounts.push(AccountConfig {
        name: "a".into(),
        service_account: true,
        kubeconfig_file: Some("k".into()),
        context: Some("c".into()),
        namespaces: vec!["n".into()],
        omit_namespaces: vec!["n".into()],
        kinds: vec!["k".into()],
        omit_kinds: vec!["k".into()],
        only_namespaced_resources: true,
        custom_resource_definitions: vec![CustomResourceConfig {
            kind: "K.g".into(),
            version: Some("v1".into()),
            scope: CustomResourceScope::Cluster,
        }],
        metrics: true,
        no_proxy: true,
        permissions: BTreeMap::from([("READ".into(), vec!["r".into()])]),
        impersonate_service_account: Some(crate::v1alpha1::ServiceAccountRef {
            namespace: "n".into(),
            name: "s".into(),
        }),
        allow_secret_data: true,
        callers: crate::v1alpha1::Callers::Impersonate,
        caller_prefix: Some("p:".into()),
        caller_users: vec!["u".into()],
        caller_groups: vec!["g".into()],
        agent_account: Some("aa".into()),
    });
    config.status = Some(StatusTarget {
        namespace: "n".into(),
        scale_agent: "s".into(),
    });
    let value = serde_json::to_value(&config).unwrap();
    let mut seen = 0;
    walk(&value, "", &mut seen);
    let listed: usize = KNOWN_KEYS.iter().map(|(_, keys)| keys.len()).sum();
    // Every listed key but the aliases (`hub`, `caCertFile`, `kubeConfigFile`) was written.
    assert_eq!(seen, listed - 3);
}

#[test]
fn permissions_are_read_as_a_map_or_as_armorys_list_of_maps() {
    let list = AgentConfig::from_yaml(
            "kubernetes:\n  accounts:\n    - name: a\n      permissions:\n        - READ: ['role1', 'role2']\n        - WRITE: ['role3', 'role4']\n        - READ: [role5]\n",
        )
        .unwrap();
    let permissions = &list.kubernetes.accounts[0].permissions;
    assert_eq!(permissions["READ"], ["role1", "role2", "role5"]);
    assert_eq!(permissions["WRITE"], ["role3", "role4"]);
    let err = AgentConfig::from_yaml(
        "kubernetes:\n  accounts:\n    - name: a\n      permissions: everyone\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("READ: [role1]"), "{err}");
}

#[test]
fn insecure_unset_is_plaintext_unless_tls_is_configured_as_in_armory() {
    let plaintext = |yaml: &str| {
        AgentConfig::from_yaml(yaml)
            .unwrap()
            .clouddriver
            .plaintext()
    };
    assert!(plaintext(""));
    assert!(plaintext(
        "clouddriver:\n  grpc: spin-clouddriver-grpc:9091\n"
    ));
    assert!(!plaintext(
        "clouddriver:\n  tls:\n    clientCertFile: /c\n    clientKeyFile: /k\n"
    ));
    assert!(!plaintext("clouddriver:\n  tls:\n    cacertFile: /ca\n"));
    assert!(!plaintext("clouddriver:\n  insecure: false\n"));
    assert!(plaintext(
        "clouddriver:\n  insecure: true\n  tls:\n    cacertFile: /ca\n"
    ));
    let tasks = AgentConfig::default().tasks;
    assert_eq!((tasks.total_budget, tasks.budget_per_account), (1000, 50));
    assert_eq!(
        (tasks.operations_per_account, tasks.operations_total),
        (16, 256)
    );
    let tasks = AgentConfig::from_yaml("tasks:\n  operationsPerAccount: 4\n  operationsTotal: 0\n")
        .unwrap()
        .tasks;
    assert_eq!(
        (tasks.operations_per_account, tasks.operations_total),
        (4, 0)
    );
}

#[test]
fn bad_durations_say_how_to_write_them() {
    let err = AgentConfig::from_yaml("clouddriver:\n  backoff:\n    baseDelay: soon\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("write it like 1s"), "{err}");
}
