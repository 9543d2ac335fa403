//! Test 5: invalid objects are rejected by the API server or reported in status.

use super::*;

/// Test 5: invalid objects are rejected by validation or reported in status with a message
/// that says what to fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_objects_are_rejected_or_reported() -> anyhow::Result<()> {
    let (_, client, ns) = setup("op-invalid").await?;
    let operator = Operator::start(client.clone(), operator_config(&ns));
    let accounts = Api::<AgentAccount>::namespaced(client.clone(), &ns);

    // CEL: both kinds and omitKinds.
    let both: AgentAccount = serde_json::from_value(agent_account(
        "both",
        json!({ "agentRef": "prod", "kinds": ["Pod"], "omitKinds": ["Event"] }),
    ))?;
    let rejected = accounts.create(&PostParams::default(), &both).await;
    assert_eq!(api_code(&rejected), Some(422), "{rejected:?}");
    assert!(format!("{rejected:?}").contains("not both"), "{rejected:?}");
    // CEL: namespace scope without namespaces.
    let no_namespaces: ScaleAgent = serde_json::from_value(scale_agent(
        "bad",
        json!({ "scope": { "type": "Namespaces" } }),
    ))?;
    let rejected = Api::<ScaleAgent>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &no_namespaces)
        .await;
    assert_eq!(api_code(&rejected), Some(422), "{rejected:?}");

    // Unknown agent.
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "orphan",
            json!({ "agentRef": "nope", "accountName": format!("{ns}-orphan") }),
        ),
    )
    .await?;
    let condition = wait_for_accepted_condition(&client, &ns, "orphan", "AgentNotFound").await?;
    assert!(
        condition.contains(&format!("ScaleAgent nope not found in namespace {ns}")),
        "{condition}"
    );

    // The issuer Secret is missing: Degraded says what to create; creating it heals.
    apply_json::<ScaleAgent>(&client, &ns, scale_agent("prod", json!({}))).await?;
    let agent = wait_for("Degraded for the missing issuer", || async {
        let agent = get_agent(&client, &ns, "prod").await?;
        Ok(agent
            .status
            .as_ref()
            .is_some_and(|s| is_true(&s.conditions, DEGRADED))
            .then_some(agent))
    })
    .await?;
    let status = agent.status.expect("status");
    let degraded = find_condition(&status.conditions, DEGRADED).expect("Degraded");
    assert_eq!(degraded.reason, "IssuerSecretNotFound");
    assert!(
        degraded.message.contains(&format!(
            "issuer Secret agent-ca not found in namespace {ns}: create it"
        )),
        "{}",
        degraded.message
    );
    assert!(!is_true(&status.conditions, CERTIFICATE_READY));
    assert!(!is_true(&status.conditions, READY));

    // Duplicate account names: the older account keeps the name.
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "first",
            json!({ "agentRef": "prod", "accountName": format!("{ns}-dup") }),
        ),
    )
    .await?;
    wait_for("the first account accepted", || async {
        let a = get_account(&client, &ns, "first").await?;
        Ok(a.status.is_some_and(|s| s.accepted).then_some(()))
    })
    .await?;
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "second",
            json!({ "agentRef": "prod", "accountName": format!("{ns}-dup") }),
        ),
    )
    .await?;
    let condition =
        wait_for_accepted_condition(&client, &ns, "second", "DuplicateAccountName").await?;
    assert!(
        condition.contains(&format!("already used by AgentAccount {ns}/first")),
        "{condition}"
    );

    // Credentials that do not fit the mode, and a missing kubeconfig Secret.
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "remote",
            json!({ "agentRef": "prod", "accountName": format!("{ns}-remote"),
                    "credentials": { "type": "Kubeconfig", "kubeconfigSecretRef": { "name": "remote-kc" } } }),
        ),
    )
    .await?;
    wait_for_accepted_condition(&client, &ns, "remote", "CredentialsModeMismatch").await?;
    apply_json::<ScaleAgent>(
        &client,
        &ns,
        scale_agent("infra", json!({ "mode": "Infrastructure" })),
    )
    .await?;
    apply_json::<AgentAccount>(
        &client,
        &ns,
        agent_account(
            "remote",
            json!({ "agentRef": "infra", "accountName": format!("{ns}-remote"),
                    "credentials": { "type": "Kubeconfig", "kubeconfigSecretRef": { "name": "remote-kc" } } }),
        ),
    )
    .await?;
    let condition =
        wait_for_accepted_condition(&client, &ns, "remote", "KubeconfigSecretNotFound").await?;
    assert!(
        condition.contains("Secret remote-kc not found"),
        "{condition}"
    );
    create_secret(&client, &ns, "remote-kc", &[("other", "x")]).await?;
    wait_for_accepted_condition(&client, &ns, "remote", "KubeconfigKeyMissing").await?;

    // Fixing things heals them.
    create_ca_secret(&client, &ns).await?;
    wait_for("prod to recover", || async {
        let agent = get_agent(&client, &ns, "prod").await?;
        Ok(agent
            .status
            .as_ref()
            .is_some_and(|s| {
                is_true(&s.conditions, CERTIFICATE_READY) && !is_true(&s.conditions, DEGRADED)
            })
            .then_some(()))
    })
    .await?;
    let config = agent_config(&client, &ns, "prod").await?.expect("config");
    assert_eq!(
        account_names(&config),
        [format!("{ns}-dup")],
        "only the accepted account"
    );
    Api::<Secret>::namespaced(client.clone(), &ns)
        .delete("remote-kc", &DeleteParams::default())
        .await?;
    create_secret(
        &client,
        &ns,
        "remote-kc",
        &[("kubeconfig", "apiVersion: v1\nkind: Config\n")],
    )
    .await?;
    wait_for("remote accepted", || async {
        let a = get_account(&client, &ns, "remote").await?;
        Ok(a.status.is_some_and(|s| s.accepted).then_some(()))
    })
    .await?;
    let infra = wait_for("infra config with the kubeconfig account", || async {
        Ok(agent_config(&client, &ns, "infra")
            .await?
            .filter(|c| c.kubernetes.accounts.len() == 1))
    })
    .await?;
    assert_eq!(
        infra.kubernetes.accounts[0].kubeconfig_file.as_deref(),
        Some("/var/run/scale-agent/kubeconfigs/remote-kc/kubeconfig")
    );
    let deployment = wait_for("infra Deployment mounting the kubeconfig", || async {
        let d = Api::<Deployment>::namespaced(client.clone(), &ns)
            .get_opt("infra-agent")
            .await?;
        Ok(d.filter(|d| {
            d.spec.template.spec.as_ref().is_some_and(|p| {
                p.volumes.clone().unwrap_or_default().iter().any(|v| {
                    v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some("remote-kc")
                })
            })
        }))
    })
    .await?;
    assert_eq!(
        deployment
            .spec
            .template
            .spec
            .and_then(|p| p.automount_service_account_token),
        Some(false)
    );
    // Infrastructure mode grants no RBAC in this cluster.
    assert!(
        Api::<ClusterRole>::all(client.clone())
            .get_opt(&format!("scale-agent:{ns}:infra"))
            .await?
            .is_none()
    );
    operator.stop().await
}

/// Waits until AgentAccount `name` reports `Accepted=False` with `reason`; returns the message.
async fn wait_for_accepted_condition(
    client: &Client,
    namespace: &str,
    name: &str,
    reason: &str,
) -> anyhow::Result<String> {
    wait_for(
        &format!("AgentAccount {name} rejected with {reason}"),
        || async {
            let account = get_account(client, namespace, name).await?;
            Ok(account.status.and_then(|s| {
                find_condition(&s.conditions, ACCEPTED)
                    .filter(|c| c.reason == reason && c.status == "False" && !s.accepted)
                    .map(|c| c.message.clone())
            }))
        },
    )
    .await
}
