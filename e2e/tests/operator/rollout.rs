//! Test 1: the owned objects a ScaleAgent makes, rolled out by kube-controller-manager, and
//! a second reconcile that writes nothing.

use super::*;

/// Test 1: every owned object appears with the expected content, the Deployment rolls out to
/// a ReplicaSet, conditions and printer columns are right, and reconciling again (a
/// restarted operator) writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_objects_roll_out_and_a_second_reconcile_writes_nothing() -> anyhow::Result<()> {
    let (control_plane, client, ns) = setup("op-objects").await?;
    create_ca_secret(&client, &ns).await?;
    let operator = Operator::start(client.clone(), operator_config(&ns));

    apply_json::<ScaleAgent>(
        &client,
        &ns,
        scale_agent(
            "prod",
            json!({ "defaults": { "kinds": ["Deployment", "ConfigMap"] } }),
        ),
    )
    .await?;
    let web = format!("{ns}-web");
    let api_name = format!("{ns}-api");
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account("web", json!({ "agentRef": "prod", "accountName": web })),
    )
    .await?;
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "api",
            json!({ "agentRef": "prod", "accountName": api_name, "kinds": ["Service"] }),
        ),
    )
    .await?;

    let agent = wait_for(
        "ScaleAgent status with 2 accounts and a certificate",
        || async {
            let agent = get_agent(&client, &ns, "prod").await?;
            let ok = agent.status.as_ref().is_some_and(|s| {
                s.accounts == 2 && is_true(&s.conditions, CERTIFICATE_READY) && s.replicas == 2
            });
            Ok(ok.then_some(agent))
        },
    )
    .await?;

    // ServiceAccount, ConfigMap, Secret, Deployment: labelled and owned.
    let sa = Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .get("prod-agent")
        .await?;
    assert_labels(&sa, "prod");
    assert_owned_by(&sa, &agent);
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get("prod-agent")
        .await?;
    assert_labels(&cm, "prod");
    assert_owned_by(&cm, &agent);
    let config = agent_config(&client, &ns, "prod").await?.expect("config");
    let mut expected = vec![api_name.clone(), web.clone()];
    expected.sort();
    assert_eq!(account_names(&config), expected);
    assert_eq!(config.clouddriver.grpc, "hub.spinnaker.example.com:9091");
    let web_config = config
        .kubernetes
        .accounts
        .iter()
        .find(|a| a.name == web)
        .expect("web");
    assert!(web_config.service_account);
    assert_eq!(
        web_config.kinds,
        ["Deployment", "ConfigMap"],
        "agent defaults"
    );
    let api_config = config
        .kubernetes
        .accounts
        .iter()
        .find(|a| a.name == api_name)
        .expect("api");
    assert_eq!(api_config.kinds, ["Service"]);
    let secret = Api::<Secret>::namespaced(client.clone(), &ns)
        .get("prod-agent-tls")
        .await?;
    assert_labels(&secret, "prod");
    assert_owned_by(&secret, &agent);
    let keys: Vec<_> = secret
        .data
        .clone()
        .unwrap_or_default()
        .into_keys()
        .collect();
    assert_eq!(keys, ["ca.crt", "tls.crt", "tls.key"]);
    let deployment = Api::<Deployment>::namespaced(client.clone(), &ns)
        .get("prod-agent")
        .await?;
    assert_labels(&deployment, "prod");
    assert_owned_by(&deployment, &agent);
    assert_eq!(deployment.spec.replicas, Some(2));
    let pod = deployment.spec.template.spec.clone().expect("pod spec");
    assert_eq!(pod.service_account_name.as_deref(), Some("prod-agent"));
    let container = &pod.containers[0];
    assert_eq!(
        container.args.clone().unwrap_or_default(),
        ["--config", "/etc/scale-agent/scale-agent.yaml"]
    );
    assert_eq!(
        container
            .security_context
            .as_ref()
            .and_then(|s| s.read_only_root_filesystem),
        Some(true)
    );

    // Cluster scope (the default): a ClusterRole with exactly the watched kinds and what the
    // read operations on them need (Events; a Deployment's ReplicaSets, pods and logs), bound.
    let rbac_name = format!("scale-agent:{ns}:prod");
    let cluster_role = Api::<ClusterRole>::all(client.clone())
        .get(&rbac_name)
        .await?;
    assert_labels(&cluster_role, "prod");
    let rules = cluster_role.rules.clone().unwrap_or_default();
    let granted: Vec<(String, Vec<String>)> = rules
        .iter()
        .map(|r| {
            (
                r.api_groups.clone().unwrap_or_default().join(","),
                r.resources.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        granted,
        [
            (
                String::new(),
                ["configmaps", "events", "pods", "services"]
                    .map(String::from)
                    .to_vec()
            ),
            (String::new(), vec!["pods/log".to_string()]),
            (
                "apps".to_string(),
                vec!["deployments".to_string(), "replicasets".to_string()]
            ),
        ]
    );
    assert!(rules.iter().all(|r| {
        r.verbs == ["get", "list", "watch"]
            || (r.resources == Some(vec!["pods/log".to_string()]) && r.verbs == ["get"])
    }));
    let binding = Api::<ClusterRoleBinding>::all(client.clone())
        .get(&rbac_name)
        .await?;
    let subject = &binding.subjects.clone().unwrap_or_default()[0];
    assert_eq!(
        (subject.name.as_str(), subject.namespace.as_deref()),
        ("prod-agent", Some(ns.as_str()))
    );

    // The Deployment rolls out to a ReplicaSet with the desired replicas (pods stay Pending:
    // there is no kubelet).
    let replica_set = wait_for("a ReplicaSet of the agent Deployment", || async {
        let sets = Api::<ReplicaSet>::namespaced(client.clone(), &ns)
            .list(&ListParams::default().labels(&format!("{LABEL_INSTANCE}=prod")))
            .await?;
        Ok(sets
            .items
            .into_iter()
            .find(|rs| rs.spec.replicas == Some(2)))
    })
    .await?;
    assert_owned_by_deployment(&replica_set, &deployment);

    // Conditions.
    let agent = wait_for("ScaleAgent status reflecting the rollout", || async {
        let agent = get_agent(&client, &ns, "prod").await?;
        Ok(agent
            .status
            .as_ref()
            .is_some_and(|s| find_condition(&s.conditions, PROGRESSING).is_some())
            .then_some(agent))
    })
    .await?;
    let status = agent.status.clone().expect("status");
    assert_eq!(status.observed_generation, agent.metadata.generation);
    assert!(is_true(&status.conditions, CERTIFICATE_READY));
    assert!(!is_true(&status.conditions, DEGRADED));
    assert!(
        !is_true(&status.conditions, READY),
        "no kubelet, no ready pod"
    );
    assert!(is_true(&status.conditions, PROGRESSING));
    let ready = find_condition(&status.conditions, READY).expect("Ready");
    assert_eq!(ready.reason, "AgentsNotReady");
    assert!(status.certificate_expiry.is_some());
    for account in ["web", "api"] {
        let account = wait_for("account accepted", || async {
            let a = get_account(&client, &ns, account).await?;
            Ok(a.status.as_ref().is_some_and(|s| s.accepted).then_some(a))
        })
        .await?;
        assert!(is_true(
            &account.status.expect("status").conditions,
            ACCEPTED
        ));
    }

    // Events on the ScaleAgent and an account.
    let events = wait_for("Events about the ScaleAgent", || async {
        let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns)
            .list(&ListParams::default())
            .await?
            .items;
        let reasons: Vec<(String, String)> = events
            .iter()
            .filter_map(|e| {
                let regarding = e.regarding.as_ref()?;
                Some((regarding.kind.clone()?, e.reason.clone()?))
            })
            .collect();
        let has = |kind: &str, reason: &str| reasons.iter().any(|(k, r)| k == kind && r == reason);
        Ok((has("ScaleAgent", "CertificateIssued")
            && has("ScaleAgent", "Applied")
            && has("AgentAccount", "Accepted"))
        .then_some(reasons))
    })
    .await?;
    assert!(!events.is_empty());

    // Printer columns, as kubectl shows them.
    let table = kubectl(control_plane, &["get", "scaleagents", "-n", &ns])?;
    let mut lines = table.lines();
    let header: Vec<_> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "READY", "REPLICAS", "ACCOUNTS", "CONNECTED", "AGE"],
        "{table}"
    );
    let row: Vec<_> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(&row[..4], ["prod", "0", "2", "2"], "{table}");
    let table = kubectl(control_plane, &["get", "agentaccounts", "-n", &ns])?;
    assert!(
        table
            .lines()
            .next()
            .unwrap_or_default()
            .contains("ACCEPTED"),
        "{table}"
    );
    let web_row = table
        .lines()
        .find(|l| l.starts_with("web "))
        .unwrap_or_default()
        .to_owned();
    let web_row: Vec<_> = web_row.split_whitespace().collect();
    assert_eq!(
        &web_row[..4],
        ["web", "prod", web.as_str(), "true"],
        "{table}"
    );

    // A second reconcile writes nothing: wait until nothing moves, restart the operator (which
    // reconciles everything on start) and compare resourceVersions.
    let accounts = ["web", "api"];
    let mut previous = resource_versions(&client, &ns, "prod", &accounts).await?;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = resource_versions(&client, &ns, "prod", &accounts).await?;
        if now == previous {
            break;
        }
        // The comparison below means nothing unless the objects came to rest first.
        let moving: Vec<&String> = now
            .iter()
            .filter(|(kind, version)| previous.get(*kind) != Some(*version))
            .map(|(kind, _)| kind)
            .collect();
        anyhow::ensure!(
            Instant::now() < deadline,
            "the objects never settled within {TIMEOUT:?}; still changing: {moving:?}"
        );
        previous = now;
    }
    operator.stop().await?;
    let before = resource_versions(&client, &ns, "prod", &accounts).await?;
    // Compared below: it means nothing for objects that do not exist (an empty version on
    // both sides). Cluster scope: no namespaced Role.
    let absent: Vec<&String> = before
        .iter()
        .filter(|(kind, version)| version.is_empty() && kind.as_str() != "Role")
        .map(|(kind, _)| kind)
        .collect();
    anyhow::ensure!(absent.is_empty(), "the premise: {absent:?} exist");
    let operator = Operator::start(client.clone(), operator_config(&ns));
    wait_for("the restarted operator to reconcile", || async {
        Ok(
            (operator.reconciles("scaleagent") >= 1 && operator.reconciles("agentaccount") >= 2)
                .then_some(()),
        )
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = resource_versions(&client, &ns, "prod", &accounts).await?;
    assert_eq!(
        before, after,
        "a reconcile of unchanged objects wrote something"
    );
    operator.stop().await
}

fn assert_owned_by_deployment(replica_set: &ReplicaSet, deployment: &Deployment) {
    let refs = replica_set
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default();
    assert!(
        refs.iter()
            .any(|r| Some(&r.uid) == deployment.metadata.uid.as_ref()),
        "{refs:?}"
    );
}
