//! Tests 3 and 4: scope changes, account removal and deletion clean up; the certificate is
//! issued by the CA and renewed before it expires.

use super::*;

/// Test 3: scope namespaces → cluster → namespaces swaps Roles and ClusterRoles; removing an
/// account drops it from the config; deleting the ScaleAgent removes everything it made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_changes_account_removal_and_deletion_clean_up() -> anyhow::Result<()> {
    let (control_plane, client, ns) = setup("op-scope").await?;
    let other = control_plane.namespace(&client, "op-scope-other").await?;
    create_ca_secret(&client, &ns).await?;
    let operator = Operator::start(client.clone(), operator_config(&ns));
    let namespaces_scope = json!({ "scope": { "type": "Namespaces", "namespaces": [ns, other] } });
    apply_json::<ScaleAgent>(&client, &ns, scale_agent("prod", namespaces_scope.clone())).await?;
    for name in ["one", "two"] {
        apply_json::<AgentAccount>(
            &client,
            &ns,
            agent_account(name, json!({ "agentRef": "prod", "accountName": format!("{ns}-{name}"), "kinds": ["Pod"] })),
        )
        .await?;
    }
    let rbac_name = format!("scale-agent:{ns}:prod");
    let roles_in = |client: Client, namespaces: Vec<String>, rbac_name: String| async move {
        let mut present = Vec::new();
        for namespace in namespaces {
            if Api::<Role>::namespaced(client.clone(), &namespace)
                .get_opt(&rbac_name)
                .await?
                .is_some()
                && Api::<RoleBinding>::namespaced(client.clone(), &namespace)
                    .get_opt(&rbac_name)
                    .await?
                    .is_some()
            {
                present.push(namespace);
            }
        }
        anyhow::Ok(present)
    };
    let cluster_rbac = |client: Client, rbac_name: String| async move {
        let role = Api::<ClusterRole>::all(client.clone())
            .get_opt(&rbac_name)
            .await?;
        let binding = Api::<ClusterRoleBinding>::all(client.clone())
            .get_opt(&rbac_name)
            .await?;
        anyhow::Ok((role.is_some(), binding.is_some()))
    };
    let both = vec![ns.clone(), other.clone()];
    wait_for("Roles in both namespaces", || {
        let f = roles_in(client.clone(), both.clone(), rbac_name.clone());
        let expected = both.clone();
        async move { Ok((f.await? == expected).then_some(())) }
    })
    .await?;
    assert_eq!(
        cluster_rbac(client.clone(), rbac_name.clone()).await?,
        (false, false)
    );

    // → Cluster.
    apply_json::<ScaleAgent>(
        &client,
        &ns,
        scale_agent("prod", json!({ "scope": { "type": "Cluster" } })),
    )
    .await?;
    wait_for("ClusterRole instead of Roles", || {
        let roles = roles_in(client.clone(), both.clone(), rbac_name.clone());
        let cluster = cluster_rbac(client.clone(), rbac_name.clone());
        async move { Ok((roles.await?.is_empty() && cluster.await? == (true, true)).then_some(())) }
    })
    .await?;

    // → Namespaces again, only the other namespace.
    apply_json::<ScaleAgent>(
        &client,
        &ns,
        scale_agent(
            "prod",
            json!({ "scope": { "type": "Namespaces", "namespaces": [other] } }),
        ),
    )
    .await?;
    wait_for("Roles instead of the ClusterRole", || {
        let roles = roles_in(client.clone(), both.clone(), rbac_name.clone());
        let cluster = cluster_rbac(client.clone(), rbac_name.clone());
        let other = other.clone();
        async move { Ok((roles.await? == [other] && cluster.await? == (false, false)).then_some(())) }
    })
    .await?;
    let config = agent_config(&client, &ns, "prod").await?.expect("config");
    assert!(
        config
            .kubernetes
            .accounts
            .iter()
            .all(|a| a.namespaces == [other.clone()])
    );

    // Remove an account: the config drops it.
    let two = format!("{ns}-two");
    wait_for("both accounts in the config", || async {
        let names = agent_config(&client, &ns, "prod")
            .await?
            .map(|c| account_names(&c))
            .unwrap_or_default();
        Ok((names.len() == 2).then_some(()))
    })
    .await?;
    Api::<AgentAccount>::namespaced(client.clone(), &ns)
        .delete("one", &DeleteParams::default())
        .await?;
    wait_for("the config without the removed account", || async {
        let names = agent_config(&client, &ns, "prod")
            .await?
            .map(|c| account_names(&c))
            .unwrap_or_default();
        Ok((names == [two.clone()]).then_some(()))
    })
    .await?;
    wait_for("accounts count 1", || async {
        let agent = get_agent(&client, &ns, "prod").await?;
        Ok(agent.status.is_some_and(|s| s.accounts == 1).then_some(()))
    })
    .await?;

    // Delete the ScaleAgent: the finalizer removes the RBAC, the garbage collector the rest.
    Api::<ScaleAgent>::namespaced(client.clone(), &ns)
        .delete("prod", &DeleteParams::default())
        .await?;
    wait_for("everything the ScaleAgent made to be gone", || async {
        let agent_gone = Api::<ScaleAgent>::namespaced(client.clone(), &ns)
            .get_opt("prod")
            .await?
            .is_none();
        let roles = roles_in(client.clone(), both.clone(), rbac_name.clone()).await?;
        let cluster = cluster_rbac(client.clone(), rbac_name.clone()).await?;
        let sa = Api::<ServiceAccount>::namespaced(client.clone(), &ns)
            .get_opt("prod-agent")
            .await?;
        let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .get_opt("prod-agent")
            .await?;
        let secret = Api::<Secret>::namespaced(client.clone(), &ns)
            .get_opt("prod-agent-tls")
            .await?;
        let deployment = Api::<Deployment>::namespaced(client.clone(), &ns)
            .get_opt("prod-agent")
            .await?;
        let replica_sets = Api::<ReplicaSet>::namespaced(client.clone(), &ns)
            .list(&ListParams::default().labels(&format!("{LABEL_INSTANCE}=prod")))
            .await?
            .items;
        Ok((agent_gone
            && roles.is_empty()
            && cluster == (false, false)
            && sa.is_none()
            && cm.is_none()
            && secret.is_none()
            && deployment.is_none()
            && replica_sets.is_empty())
        .then_some(()))
    })
    .await?;
    operator.stop().await
}

/// Test 4: the certificate is issued by the CA for the agent's identity with a PKCS#8 key,
/// and, with a short lifetime, re-issued before it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_is_issued_by_the_ca_and_renewed_before_expiry() -> anyhow::Result<()> {
    let (_, client, ns) = setup("op-cert").await?;
    let (ca_cert, ca_key) = create_ca_secret(&client, &ns).await?;
    let ca = pki::Ca::from_pem(&ca_cert, &ca_key).map_err(anyhow::Error::msg)?;
    let mut config = operator_config(&ns);
    config.certificate_lifetime_override = Some(Duration::from_secs(15));
    let operator = Operator::start(client.clone(), config);
    apply_json::<ScaleAgent>(&client, &ns, scale_agent("prod", json!({}))).await?;
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    let read = |secret: &Secret, key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
            .unwrap_or_default()
    };
    let first = wait_for("the certificate Secret", || async {
        Ok(secrets.get_opt("prod-agent-tls").await?)
    })
    .await?;
    assert_eq!(first.type_.as_deref(), Some("kubernetes.io/tls"));
    let cert = read(&first, "tls.crt");
    let info = pki::parse(&cert).expect("a PEM certificate");
    let identity = format!("prod.{ns}");
    assert!(info.has_identity(&identity), "{info:?}");
    assert!(ca.signed(&cert), "signed by the issuer CA");
    assert!(pki::is_pkcs8_pem(&read(&first, "tls.key")), "PKCS#8 key");
    assert_eq!(read(&first, "ca.crt"), ca_cert);
    assert_eq!(info.not_after - info.not_before, 15);

    let agent = wait_for("CertificateReady", || async {
        let agent = get_agent(&client, &ns, "prod").await?;
        Ok(agent
            .status
            .as_ref()
            .is_some_and(|s| is_true(&s.conditions, CERTIFICATE_READY))
            .then_some(agent))
    })
    .await?;
    let status = agent.status.expect("status");
    let condition = find_condition(&status.conditions, CERTIFICATE_READY).expect("condition");
    assert!(
        condition.message.contains("valid until"),
        "{}",
        condition.message
    );
    assert!(status.certificate_expiry.is_some());

    // Renewed when a third of the lifetime remains, before expiry.
    let renewed = wait_for("a renewed certificate", || async {
        let secret = secrets.get("prod-agent-tls").await?;
        let cert = read(&secret, "tls.crt");
        Ok((cert != read(&first, "tls.crt")).then_some(cert))
    })
    .await?;
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let renewed_info = pki::parse(&renewed).expect("renewed certificate");
    assert!(
        renewed_info.not_before >= info.renew_at() - 1,
        "{renewed_info:?} vs {info:?}"
    );
    assert!(
        renewed_info.not_before < info.not_after,
        "renewed before the old one expired"
    );
    assert!(now <= renewed_info.not_after);
    assert!(renewed_info.has_identity(&identity));
    assert!(ca.signed(&renewed));
    wait_for("status with the new expiry", || async {
        let agent = get_agent(&client, &ns, "prod").await?;
        let expiry = agent.status.and_then(|s| s.certificate_expiry);
        Ok((expiry.as_deref()
            >= Some(scale_agent_operator::status::rfc3339(renewed_info.not_after).as_str()))
        .then_some(()))
    })
    .await?;
    operator.stop().await
}
